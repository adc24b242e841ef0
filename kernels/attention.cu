// Chunk-pair attention: forward with the log-sum-exp, the merge of partial results, and the backward.
//
// The chunk-pair forward and backward here run on CUDA cores (fp32 math): the forward a warp per query row over
// K/V tiles in shared memory with an online softmax, the backward a warp per (key, head) keeping dK/dV in
// registers and adding dQ with atomics. They are simple enough to check by eye and serve as a second
// implementation beside the tensor-core kernels (attention_tc.cu), which AttentionPath::tensor_cores (the
// default) selects. The merge and the backward prep are memory-bound and have one version.
#include <cuda_bf16.h>

#include <cmath>

#include "common/error.hpp"
#include "kernels/device_common.cuh"
#include "kernels/kernels.hpp"

namespace trainyard::kernels {

namespace {

using namespace detail;

constexpr int kWarps = 4;         // warps per block
constexpr int kRowsPerWarp = 4;   // forward: query rows per warp
constexpr int kKeysPerTile = 32;  // forward: keys per shared-memory tile (one per lane)

// grid (ceil(q_len / 16), heads), block 128 threads.
template <int D>
__global__ void attention_forward_kernel(Geometry g, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o, float* lse) {
  constexpr int kPerLane = D / 32;
  __shared__ float q_tile[kWarps * kRowsPerWarp][D];
  __shared__ float k_tile[kKeysPerTile][D + 1];  // +1: lane j reads row j without bank conflicts
  __shared__ float v_tile[kKeysPerTile][D];
  const int head = static_cast<int>(blockIdx.y);
  const int kv_head = head / (g.heads / g.kv_heads);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int first_row = static_cast<int>(blockIdx.x) * kWarps * kRowsPerWarp;

  for (int t = static_cast<int>(threadIdx.x); t < kWarps * kRowsPerWarp * D; t += kWarps * 32) {
    const int r = t / D, d = t % D, row = first_row + r;
    q_tile[r][d] = row < g.q_len ? load(q, (static_cast<long long>(row) * g.heads + head) * D + d) * g.scale : 0.0f;
  }
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kPerLane];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    for (int e = 0; e < kPerLane; ++e) acc[r][e] = 0.0f;
  }
  const int last_row = min(first_row + kWarps * kRowsPerWarp, g.q_len) - 1;
  for (int tile = 0; tile < g.kv_len; tile += kKeysPerTile) {
    // With causal masking, later tiles are invisible to every row of this block.
    if (g.causal && g.kv_offset + tile > g.q_offset + last_row) break;
    __syncthreads();  // the previous tile is no longer read
    for (int t = static_cast<int>(threadIdx.x); t < kKeysPerTile * D; t += kWarps * 32) {
      const int j = t / D, d = t % D, key = tile + j;
      const bool in = key < g.kv_len;
      const long long at = (static_cast<long long>(key) * g.kv_heads + kv_head) * D + d;
      k_tile[j][d] = in ? load(k, at) : 0.0f;
      v_tile[j][d] = in ? load(v, at) : 0.0f;
    }
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int local = warp * kRowsPerWarp + r, row = first_row + local;
      if (row >= g.q_len) break;
      const int key = tile + lane;
      const bool seen = key < g.kv_len && (!g.causal || g.kv_offset + key <= g.q_offset + row);
      float s = -INFINITY;
      if (seen) {
        s = 0.0f;
        for (int d = 0; d < D; ++d) s += q_tile[local][d] * k_tile[lane][d];
      }
      const float m_new = fmaxf(m[r], warp_max(s));
      if (m_new == -INFINITY) continue;  // nothing visible yet for this row
      const float correction = __expf(m[r] - m_new);
      const float p = seen ? __expf(s - m_new) : 0.0f;
      l[r] = l[r] * correction + warp_sum(p);
      for (int e = 0; e < kPerLane; ++e) acc[r][e] *= correction;
      for (int j = 0; j < kKeysPerTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        for (int e = 0; e < kPerLane; ++e) acc[r][e] += pj * v_tile[j][lane + 32 * e];
      }
      m[r] = m_new;
    }
  }
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = first_row + warp * kRowsPerWarp + r;
    if (row >= g.q_len) break;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int e = 0; e < kPerLane; ++e) store(o, (static_cast<long long>(row) * g.heads + head) * D + lane + 32 * e, acc[r][e] * inv);
    if (lane == 0) lse[static_cast<long long>(head) * g.q_len + row] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// A warp per (query, head).
__global__ void attention_merge_kernel(int q_len, int heads, int head_dim, float* o_acc, float* lse_acc, const bf16_bits* o_part,
                                       const float* lse_part) {
  const long long w = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (w >= static_cast<long long>(q_len) * heads) return;
  const int row = static_cast<int>(w / heads), head = static_cast<int>(w % heads);
  const long long li = static_cast<long long>(head) * q_len + row;
  const float a = lse_acc[li], b = lse_part[li];
  const float top = fmaxf(a, b);
  if (top == -INFINITY) return;
  const float wa = a == -INFINITY ? 0.0f : __expf(a - top), wb = b == -INFINITY ? 0.0f : __expf(b - top);
  const float total = wa + wb;
  for (int d = lane; d < head_dim; d += 32) {
    const long long oi = (static_cast<long long>(row) * heads + head) * head_dim + d;
    o_acc[oi] = (wa * o_acc[oi] + wb * load(o_part, oi)) / total;
  }
  __syncwarp();
  if (lane == 0) lse_acc[li] = top + logf(total);
}

__global__ void attention_backward_prep_kernel(int q_len, int heads, int head_dim, const bf16_bits* o, const bf16_bits* d_o, float* delta) {
  const long long w = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (w >= static_cast<long long>(q_len) * heads) return;
  const int row = static_cast<int>(w / heads), head = static_cast<int>(w % heads);
  float sum = 0.0f;
  for (int d = lane; d < head_dim; d += 32) {
    const long long oi = (static_cast<long long>(row) * heads + head) * head_dim + d;
    sum += load(o, oi) * load(d_o, oi);
  }
  sum = warp_sum(sum);
  if (lane == 0) delta[static_cast<long long>(head) * q_len + row] = sum;
}

// A warp per (key, query head): dK, dV of that key for that head in registers, dQ added with atomics.
template <int D>
__global__ void attention_backward_kernel(Geometry g, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const bf16_bits* d_o,
                                          const float* lse, const float* delta, float* dq, float* dk, float* dv) {
  constexpr int kPerLane = D / 32;
  const long long w = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (w >= static_cast<long long>(g.kv_len) * g.heads) return;
  const int key = static_cast<int>(w / g.heads), head = static_cast<int>(w % g.heads);
  const int kv_head = head / (g.heads / g.kv_heads);
  float kj[kPerLane], vj[kPerLane], dk_acc[kPerLane], dv_acc[kPerLane];
  for (int e = 0; e < kPerLane; ++e) {
    const long long at = (static_cast<long long>(key) * g.kv_heads + kv_head) * D + lane + 32 * e;
    kj[e] = load(k, at);
    vj[e] = load(v, at);
    dk_acc[e] = 0.0f;
    dv_acc[e] = 0.0f;
  }
  // With causal masking only queries at or after the key's position see it.
  int first = 0;
  if (g.causal) first = static_cast<int>(max(0LL, g.kv_offset + key - g.q_offset));
  for (int row = first; row < g.q_len; ++row) {
    const long long li = static_cast<long long>(head) * g.q_len + row;
    const float l = lse[li];
    if (l == -INFINITY) continue;
    float qi[kPerLane], doi[kPerLane];
    float s = 0.0f, dp = 0.0f;
    for (int e = 0; e < kPerLane; ++e) {
      const long long at = (static_cast<long long>(row) * g.heads + head) * D + lane + 32 * e;
      qi[e] = load(q, at);
      doi[e] = load(d_o, at);
      s += qi[e] * kj[e];
      dp += doi[e] * vj[e];
    }
    s = warp_sum(s) * g.scale;
    dp = warp_sum(dp);
    const float p = __expf(s - l);
    const float ds = p * (dp - delta[li]) * g.scale;
    for (int e = 0; e < kPerLane; ++e) {
      dv_acc[e] += p * doi[e];
      dk_acc[e] += ds * qi[e];
      atomicAdd(&dq[(static_cast<long long>(row) * g.heads + head) * D + lane + 32 * e], ds * kj[e]);
    }
  }
  for (int e = 0; e < kPerLane; ++e) {
    const long long at = (static_cast<long long>(key) * g.kv_heads + kv_head) * D + lane + 32 * e;
    atomicAdd(&dk[at], dk_acc[e]);  // the heads of a K/V head add up (GQA)
    atomicAdd(&dv[at], dv_acc[e]);
  }
}

unsigned warps_to_blocks(long long warps) { return static_cast<unsigned>((warps + kWarps - 1) / kWarps); }

void check_shape(const AttentionShape& s) {
  if (!attention_supports_head_dim(s.head_dim)) {
    throw InternalError("attention kernels support head_dim 64 and 128, got " + std::to_string(s.head_dim), __FILE__, __LINE__);
  }
  TRAINYARD_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "attention: heads must be a multiple of kv_heads");
}

}  // namespace

void attention_forward(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o, float* lse,
                       cudaStream_t stream, AttentionPath path) {
  check_shape(s);
  if (s.q_len == 0) return;
  if (path == AttentionPath::tensor_cores) return detail::attention_forward_tensor_cores(s, q, k, v, o, lse, stream);
  const dim3 grid(static_cast<unsigned>((s.q_len + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)), static_cast<unsigned>(s.heads));
  if (s.head_dim == 64) {
    attention_forward_kernel<64><<<grid, kWarps * 32, 0, stream>>>(geometry(s), q, k, v, o, lse);
  } else {
    attention_forward_kernel<128><<<grid, kWarps * 32, 0, stream>>>(geometry(s), q, k, v, o, lse);
  }
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void attention_merge(int q_len, int heads, int head_dim, float* o_acc, float* lse_acc, const bf16_bits* o_part, const float* lse_part,
                     cudaStream_t stream) {
  const long long warps = static_cast<long long>(q_len) * heads;
  if (warps == 0) return;
  attention_merge_kernel<<<warps_to_blocks(warps), kWarps * 32, 0, stream>>>(q_len, heads, head_dim, o_acc, lse_acc, o_part, lse_part);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void attention_backward_prep(int q_len, int heads, int head_dim, const bf16_bits* o, const bf16_bits* d_o, float* delta, cudaStream_t stream) {
  const long long warps = static_cast<long long>(q_len) * heads;
  if (warps == 0) return;
  attention_backward_prep_kernel<<<warps_to_blocks(warps), kWarps * 32, 0, stream>>>(q_len, heads, head_dim, o, d_o, delta);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void attention_backward(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const bf16_bits* d_o, const float* lse,
                        const float* delta, float* dq, float* dk, float* dv, cudaStream_t stream, AttentionPath path) {
  check_shape(s);
  const long long warps = static_cast<long long>(s.kv_len) * s.heads;
  if (warps == 0 || s.q_len == 0) return;
  if (path == AttentionPath::tensor_cores) return detail::attention_backward_tensor_cores(s, q, k, v, d_o, lse, delta, dq, dk, dv, stream);
  if (s.head_dim == 64) {
    attention_backward_kernel<64><<<warps_to_blocks(warps), kWarps * 32, 0, stream>>>(geometry(s), q, k, v, d_o, lse, delta, dq, dk, dv);
  } else {
    attention_backward_kernel<128><<<warps_to_blocks(warps), kWarps * 32, 0, stream>>>(geometry(s), q, k, v, d_o, lse, delta, dq, dk, dv);
  }
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

}  // namespace trainyard::kernels
