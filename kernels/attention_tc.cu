// Chunk-pair attention on tensor cores (sm_80+): the FlashAttention-2 forward and backward on mma.sync
// m16n8k16 (bf16 in, fp32 accumulation). Same contract as the CUDA-core kernels in attention.cu, which stay as a
// second, independent implementation for the tests.
//
// Forward: a block of 4 warps owns 64 queries of one head, 16 per warp; Q stays in registers, K and V^T tiles of
// 64 keys go through shared memory, and the scores never leave registers (the C fragments of S are the A
// fragments of P for P.V). Softmax in base 2 with the scale folded in.
// Backward: a block owns 64 keys of one head (16 per warp) and walks the visible query tiles of 32: S^T = K Q^T
// and dP^T = V dO^T per warp, dV += P^T dO and dK += dS^T Q in registers, dS through shared memory for
// dQ += dS K, added to the fp32 dq with atomics (and dk, dv at the end: the heads of a GQA group add up).
// Not done: cp.async double buffering and the Hopper-only wgmma/TMA path. Measured on one H100 (2026-11-27): 65-97
// TFLOP/s, 0.22-0.43 of PyTorch's SDPA on the same shapes (benchmarks/results/gpu.md).
#include <cuda_bf16.h>

#include <cmath>
#include <string>

#include "common/error.hpp"
#include "kernels/device_common.cuh"
#include "kernels/kernels.hpp"

namespace trainyard::kernels {

namespace {

using namespace detail;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kForwardQueries = 16 * kWarps;  // per block
constexpr int kKeysPerTile = 64;              // forward: keys per tile; backward: keys per block
constexpr int kBackwardQueries = 32;          // backward: queries per tile
constexpr int kPad = 8;                       // bf16 of padding per shared row: fragment reads hit 32 banks
constexpr float kLog2e = 1.4426950408889634f;

// 64 rows of K or V [key][d] (zero beyond kv_len) into a shared tile [64][D + kPad]; with `transpose_into`, V
// goes in as V^T [d][64 + kPad] instead.
template <int D>
__device__ void load_kv_rows(const Geometry& g, int kv_head, int first_key, const bf16_bits* src, bf16_bits* tile, bool transpose_into) {
  constexpr int kVectors = D / 8;  // 16-byte vectors per row
  for (int t = static_cast<int>(threadIdx.x); t < kKeysPerTile * kVectors; t += kThreads) {
    const int j = t / kVectors, c = (t % kVectors) * 8, key = first_key + j;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key < g.kv_len) x = *reinterpret_cast<const uint4*>(src + (static_cast<long long>(key) * g.kv_heads + kv_head) * D + c);
    if (!transpose_into) {
      *reinterpret_cast<uint4*>(tile + j * (D + kPad) + c) = x;
    } else {
      const bf16_bits* e = reinterpret_cast<const bf16_bits*>(&x);
      for (int i = 0; i < 8; ++i) tile[(c + i) * (kKeysPerTile + kPad) + j] = e[i];
    }
  }
}

// `rows` query rows of q or dO [row][head][d] (zero beyond q_len) into a shared tile [rows][D + kPad].
template <int D>
__device__ void load_query_rows(const Geometry& g, int head, int first_row, int rows, const bf16_bits* src, bf16_bits* tile) {
  constexpr int kVectors = D / 8;
  for (int t = static_cast<int>(threadIdx.x); t < rows * kVectors; t += kThreads) {
    const int r = t / kVectors, c = (t % kVectors) * 8, row = first_row + r;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row < g.q_len) x = *reinterpret_cast<const uint4*>(src + (static_cast<long long>(row) * g.heads + head) * D + c);
    *reinterpret_cast<uint4*>(tile + r * (D + kPad) + c) = x;
  }
}

// grid (ceil(q_len / 64), heads), 128 threads.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tc_kernel(Geometry g, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o, float* lse) {
  __shared__ __align__(16) bf16_bits k_tile[kKeysPerTile * (D + kPad)];
  __shared__ __align__(16) bf16_bits vt_tile[D * (kKeysPerTile + kPad)];
  const int head = static_cast<int>(blockIdx.y), kv_head = head / (g.heads / g.kv_heads);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, gr = lane / 4, t4 = lane % 4;
  const int block_row = static_cast<int>(blockIdx.x) * kForwardQueries, warp_row = block_row + warp * 16;
  const int rows[2] = {warp_row + gr, warp_row + gr + 8};

  std::uint32_t qf[D / 16][4];
  for (int kk = 0; kk < D / 16; ++kk) {
    for (int i = 0; i < 4; ++i) {
      const int row = rows[i % 2], col = kk * 16 + 2 * t4 + (i / 2) * 8;
      qf[kk][i] = row < g.q_len ? pair(q, (static_cast<long long>(row) * g.heads + head) * D + col) : 0u;
    }
  }
  float acc[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale_log2 = g.scale * kLog2e;

  const int last_row = min(block_row + kForwardQueries, g.q_len) - 1;
  long long kv_end = g.kv_len;  // keys past this are invisible to every row of the block
  if (g.causal) kv_end = min(kv_end, g.q_offset + last_row - g.kv_offset + 1);
  const bool warp_active = warp_row < g.q_len;
  for (int tile = 0; tile < kv_end; tile += kKeysPerTile) {
    __syncthreads();  // the previous tile is no longer read
    load_kv_rows<D>(g, kv_head, tile, k, k_tile, false);
    load_kv_rows<D>(g, kv_head, tile, v, vt_tile, true);
    __syncthreads();
    if (!warp_active || (g.causal && g.kv_offset + tile > g.q_offset + warp_row + 15)) continue;

    float s[kKeysPerTile / 8][4] = {};
    for (int kk = 0; kk < D / 16; ++kk) {
      for (int n = 0; n < kKeysPerTile / 8; ++n) {
        const bf16_bits* key_row = k_tile + (n * 8 + gr) * (D + kPad) + kk * 16 + 2 * t4;
        mma_bf16(s[n], qf[kk], pair(key_row, 0), pair(key_row, 8));
      }
    }
    float top[2] = {m[0], m[1]};
    for (int n = 0; n < kKeysPerTile / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int key = tile + n * 8 + 2 * t4 + e % 2, row = rows[e / 2];
        s[n][e] = key < g.kv_len && g.visible(row, key) ? s[n][e] * scale_log2 : -INFINITY;
        top[e / 2] = fmaxf(top[e / 2], s[n][e]);
      }
    }
    float correction[2];
    for (int r = 0; r < 2; ++r) {
      top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 1));
      top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffffu, top[r], 2));
      const float base = top[r] == -INFINITY ? 0.0f : top[r];  // a row that has seen nothing keeps p = 0
      correction[r] = exp2f(m[r] - base);
      l[r] *= correction[r];
      m[r] = top[r];
    }
    for (int n = 0; n < kKeysPerTile / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const float base = m[e / 2] == -INFINITY ? 0.0f : m[e / 2];
        s[n][e] = exp2f(s[n][e] - base);
        l[e / 2] += s[n][e];
      }
    }
    for (int n = 0; n < D / 8; ++n) {
      for (int e = 0; e < 4; ++e) acc[n][e] *= correction[e / 2];
    }
    for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
      std::uint32_t p[4];
      c_to_a(s[2 * ks], s[2 * ks + 1], p);
      for (int n = 0; n < D / 8; ++n) {
        const bf16_bits* vt_row = vt_tile + (n * 8 + gr) * (kKeysPerTile + kPad) + ks * 16 + 2 * t4;
        mma_bf16(acc[n], p, pair(vt_row, 0), pair(vt_row, 8));
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  for (int r = 0; r < 2; ++r) {
    const int row = rows[r];
    if (row >= g.q_len) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int n = 0; n < D / 8; ++n) {
      const long long at = (static_cast<long long>(row) * g.heads + head) * D + n * 8 + 2 * t4;
      *reinterpret_cast<std::uint32_t*>(o + at) = pack_bf16(acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
    }
    if (t4 == 0) lse[static_cast<long long>(head) * g.q_len + row] = l[r] > 0.0f ? (m[r] + log2f(l[r])) / kLog2e : -INFINITY;
  }
}

template <int D>
struct BackwardTiles {
  bf16_bits k[kKeysPerTile * (D + kPad)];
  bf16_bits v[kKeysPerTile * (D + kPad)];
  bf16_bits q[kBackwardQueries * (D + kPad)];
  bf16_bits d_o[kBackwardQueries * (D + kPad)];
  bf16_bits ds[kBackwardQueries * (kKeysPerTile + kPad)];  // dS [query][key]
  float lse_log2[kBackwardQueries];
  float delta[kBackwardQueries];
};

// grid (ceil(kv_len / 64), heads), 128 threads, sizeof(BackwardTiles<D>) bytes of dynamic shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_tc_kernel(Geometry g, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const bf16_bits* d_o, const float* lse,
                                 const float* delta, float* dq, float* dk, float* dv) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto& sm = *reinterpret_cast<BackwardTiles<D>*>(shared_bytes);
  constexpr int kRow = D + kPad;
  const int head = static_cast<int>(blockIdx.y), kv_head = head / (g.heads / g.kv_heads);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, gr = lane / 4, t4 = lane % 4;
  const int first_key = static_cast<int>(blockIdx.x) * kKeysPerTile, warp_key = warp * 16;  // warp_key: within the block
  const float scale_log2 = g.scale * kLog2e;

  load_kv_rows<D>(g, kv_head, first_key, k, sm.k, false);
  load_kv_rows<D>(g, kv_head, first_key, v, sm.v, false);
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};

  // With causal masking, queries before the block's first key see none of its keys.
  int first_query = 0;
  if (g.causal) {
    const long long first_seen = min(static_cast<long long>(g.q_len), max(0LL, g.kv_offset + first_key - g.q_offset));
    first_query = static_cast<int>(first_seen) / kBackwardQueries * kBackwardQueries;
  }
  for (int tile = first_query; tile < g.q_len; tile += kBackwardQueries) {
    __syncthreads();  // the previous tile's q, dO and dS are no longer read (and K, V are loaded on the first pass)
    load_query_rows<D>(g, head, tile, kBackwardQueries, q, sm.q);
    load_query_rows<D>(g, head, tile, kBackwardQueries, d_o, sm.d_o);
    if (threadIdx.x < kBackwardQueries) {
      const int row = tile + static_cast<int>(threadIdx.x);
      sm.lse_log2[threadIdx.x] = row < g.q_len ? lse[static_cast<long long>(head) * g.q_len + row] * kLog2e : -INFINITY;
      sm.delta[threadIdx.x] = row < g.q_len ? delta[static_cast<long long>(head) * g.q_len + row] : 0.0f;
    }
    __syncthreads();

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys and the tile's 32 queries.
    float st[kBackwardQueries / 8][4] = {}, dpt[kBackwardQueries / 8][4] = {};
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t ka[4], va[4];
      for (int i = 0; i < 4; ++i) {
        const int at = (warp_key + gr + (i % 2) * 8) * kRow + kk * 16 + 2 * t4 + (i / 2) * 8;
        ka[i] = pair(sm.k, at);
        va[i] = pair(sm.v, at);
      }
      for (int n = 0; n < kBackwardQueries / 8; ++n) {
        const int at = (n * 8 + gr) * kRow + kk * 16 + 2 * t4;
        mma_bf16(st[n], ka, pair(sm.q, at), pair(sm.q, at + 8));
        mma_bf16(dpt[n], va, pair(sm.d_o, at), pair(sm.d_o, at + 8));
      }
    }
    // P^T = exp(S^T * scale - lse) and dS^T = P^T (dP^T - D) * scale, in place.
    for (int n = 0; n < kBackwardQueries / 8; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int local_key = warp_key + gr + (e / 2) * 8, key = first_key + local_key;
        const int local_query = n * 8 + 2 * t4 + e % 2, query = tile + local_query;
        const float l2 = sm.lse_log2[local_query];
        const bool seen = key < g.kv_len && query < g.q_len && l2 != -INFINITY && g.visible(query, key);
        const float p = seen ? exp2f(st[n][e] * scale_log2 - l2) : 0.0f;
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - sm.delta[local_query]) * g.scale;
        sm.ds[local_query * (kKeysPerTile + kPad) + local_key] = __bfloat16_as_ushort(__float2bfloat16_rn(dpt[n][e]));
      }
    }
    // dV += P^T dO and dK += dS^T Q (k = the tile's queries).
    for (int ks = 0; ks < kBackwardQueries / 16; ++ks) {
      std::uint32_t pa[4], dsa[4];
      c_to_a(st[2 * ks], st[2 * ks + 1], pa);
      c_to_a(dpt[2 * ks], dpt[2 * ks + 1], dsa);
      for (int n = 0; n < D / 8; ++n) {
        const int at = (ks * 16 + 2 * t4) * kRow + n * 8 + gr;
        mma_bf16(dv_acc[n], pa, column_pair(sm.d_o, at, kRow), column_pair(sm.d_o, at + 8 * kRow, kRow));
        mma_bf16(dk_acc[n], dsa, column_pair(sm.q, at, kRow), column_pair(sm.q, at + 8 * kRow, kRow));
      }
    }
    __syncthreads();  // dS complete

    // dQ [32][D] += dS [32][64] K [64][D]: warp w takes query rows (w % 2) * 16 and columns (w / 2) * D / 2.
    const int q_rows = (warp % 2) * 16, first_col = (warp / 2) * (D / 2);
    float dq_acc[D / 16][4] = {};
    for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
      std::uint32_t a[4];
      for (int i = 0; i < 4; ++i) a[i] = pair(sm.ds, (q_rows + gr + (i % 2) * 8) * (kKeysPerTile + kPad) + ks * 16 + 2 * t4 + (i / 2) * 8);
      for (int n = 0; n < D / 16; ++n) {
        const int at = (ks * 16 + 2 * t4) * kRow + first_col + n * 8 + gr;
        mma_bf16(dq_acc[n], a, column_pair(sm.k, at, kRow), column_pair(sm.k, at + 8 * kRow, kRow));
      }
    }
    for (int n = 0; n < D / 16; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int row = tile + q_rows + gr + (e / 2) * 8;
        if (row < g.q_len) atomicAdd(&dq[(static_cast<long long>(row) * g.heads + head) * D + first_col + n * 8 + 2 * t4 + e % 2], dq_acc[n][e]);
      }
    }
  }
  for (int n = 0; n < D / 8; ++n) {
    for (int e = 0; e < 4; ++e) {
      const int key = first_key + warp_key + gr + (e / 2) * 8;
      if (key >= g.kv_len) continue;
      const long long at = (static_cast<long long>(key) * g.kv_heads + kv_head) * D + n * 8 + 2 * t4 + e % 2;
      atomicAdd(&dk[at], dk_acc[n][e]);
      atomicAdd(&dv[at], dv_acc[n][e]);
    }
  }
}

void check_aligned(const void* p, const char* what) {
  if (!aligned16({p})) {
    throw InternalError(std::string("tensor-core attention: ") + what + " must be 16-byte aligned", __FILE__, __LINE__);
  }
}

template <int D>
void launch_backward(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const bf16_bits* d_o, const float* lse,
                     const float* delta, float* dq, float* dk, float* dv, cudaStream_t stream) {
  constexpr int kBytes = sizeof(BackwardTiles<D>);
  // Above the 48 KiB default for D = 128. The opt-in is per device, so it is set before every launch (cheap).
  TRAINYARD_CUDA_CHECK(cudaFuncSetAttribute(attention_backward_tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  const dim3 grid(static_cast<unsigned>((s.kv_len + kKeysPerTile - 1) / kKeysPerTile), static_cast<unsigned>(s.heads));
  attention_backward_tc_kernel<D><<<grid, kThreads, kBytes, stream>>>(geometry(s), q, k, v, d_o, lse, delta, dq, dk, dv);
}

}  // namespace

void detail::attention_forward_tensor_cores(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o,
                                            float* lse, cudaStream_t stream) {
  for (const auto& [p, what] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}}) check_aligned(p, what);
  const dim3 grid(static_cast<unsigned>((s.q_len + kForwardQueries - 1) / kForwardQueries), static_cast<unsigned>(s.heads));
  if (s.head_dim == 64) {
    attention_forward_tc_kernel<64><<<grid, kThreads, 0, stream>>>(geometry(s), q, k, v, o, lse);
  } else {
    attention_forward_tc_kernel<128><<<grid, kThreads, 0, stream>>>(geometry(s), q, k, v, o, lse);
  }
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void detail::attention_backward_tensor_cores(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                                             const bf16_bits* d_o, const float* lse, const float* delta, float* dq, float* dk, float* dv,
                                             cudaStream_t stream) {
  for (const auto& [p, what] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {d_o, "dO"}}) check_aligned(p, what);
  if (s.head_dim == 64) {
    launch_backward<64>(s, q, k, v, d_o, lse, delta, dq, dk, dv, stream);
  } else {
    launch_backward<128>(s, q, k, v, d_o, lse, delta, dq, dk, dv, stream);
  }
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

}  // namespace trainyard::kernels
