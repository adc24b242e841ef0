// Memory-bound kernels: conversion, adds, embedding rows, RMSNorm, SwiGLU, RoPE, cross-entropy, AdamW. Math in fp32, bf16 in and out.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/device_common.cuh"
#include "kernels/kernels.hpp"

namespace trainyard::kernels {

namespace {

constexpr int kThreads = 256;

using detail::load;
using detail::store;

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// The bandwidth-bound kernels move eight bf16 per thread with one 16-byte access where they can (`vec`: every
// pointer 16-byte aligned and the eight in range); otherwise, and for the tail, element by element.
constexpr int kVec = 8;
struct Eight {
  float v[kVec];
};
__device__ __forceinline__ Eight load8(const bf16_bits* p, std::int64_t i, std::int64_t n, bool vec) {
  Eight x;
  if (vec && i + kVec <= n) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p + i);
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    for (int e = 0; e < kVec / 2; ++e) {
      const float2 f = __bfloat1622float2(pairs[e]);
      x.v[2 * e] = f.x;
      x.v[2 * e + 1] = f.y;
    }
  } else {
    for (int e = 0; e < kVec; ++e) x.v[e] = i + e < n ? load(p, i + e) : 0.0f;
  }
  return x;
}
__device__ __forceinline__ void store8(bf16_bits* p, std::int64_t i, std::int64_t n, bool vec, const Eight& x) {
  if (vec && i + kVec <= n) {
    uint4 raw;
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
    for (int e = 0; e < kVec / 2; ++e) pairs[e] = __floats2bfloat162_rn(x.v[2 * e], x.v[2 * e + 1]);
    *reinterpret_cast<uint4*>(p + i) = raw;
  } else {
    for (int e = 0; e < kVec && i + e < n; ++e) store(p, i + e, x.v[e]);
  }
}
using detail::aligned16;
unsigned blocks_for_eights(std::int64_t n) { return blocks_for((n + kVec - 1) / kVec); }

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float x) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x) / 32;
  float total = lane < warps ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return total;
}
__device__ float block_max(float x) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x) / 32;
  float top = lane < warps ? partial[lane] : -INFINITY;
  for (int offset = 16; offset > 0; offset /= 2) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
  return top;
}

__global__ void to_bf16_kernel(const float* x, bf16_bits* y, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store(y, i, x[i]);
}

// One block per row, eight columns per thread and step; the second pass re-reads the row from cache.
__global__ void rmsnorm_forward_kernel(int cols, float eps, bool vec, const bf16_bits* x, const bf16_bits* w, bf16_bits* y) {
  const bf16_bits* xr = x + static_cast<std::int64_t>(blockIdx.x) * cols;
  bf16_bits* yr = y + static_cast<std::int64_t>(blockIdx.x) * cols;
  float ss = 0;
  for (int c = kVec * static_cast<int>(threadIdx.x); c < cols; c += kVec * static_cast<int>(blockDim.x)) {
    const Eight xv = load8(xr, c, cols, vec);
    for (float e : xv.v) ss += e * e;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
  for (int c = kVec * static_cast<int>(threadIdx.x); c < cols; c += kVec * static_cast<int>(blockDim.x)) {
    Eight out = load8(xr, c, cols, vec);
    const Eight wv = load8(w, c, cols, vec);
    for (int e = 0; e < kVec; ++e) out.v[e] *= inv * wv.v[e];
    store8(yr, c, cols, vec, out);
  }
}

// dx = inv * (dy*w - x * inv^2 * mean(dy*w*x)); also records inv per row for the dw pass.
__global__ void rmsnorm_backward_dx_kernel(int cols, float eps, const bf16_bits* x, const bf16_bits* w, const bf16_bits* dy, bf16_bits* dx,
                                           float* inv_rows) {
  const std::int64_t row = blockIdx.x;
  float ss = 0, dot = 0;
  for (int c = static_cast<int>(threadIdx.x); c < cols; c += static_cast<int>(blockDim.x)) {
    const float xv = load(x, row * cols + c);
    ss += xv * xv;
    dot += load(dy, row * cols + c) * load(w, c) * xv;
  }
  const float total_ss = block_sum(ss);
  const float total_dot = block_sum(dot);
  const float inv = rsqrtf(total_ss / static_cast<float>(cols) + eps);
  for (int c = static_cast<int>(threadIdx.x); c < cols; c += static_cast<int>(blockDim.x)) {
    const float xv = load(x, row * cols + c);
    store(dx, row * cols + c, inv * (load(dy, row * cols + c) * load(w, c) - xv * inv * inv * total_dot / static_cast<float>(cols)));
  }
  if (threadIdx.x == 0) inv_rows[row] = inv;
}

// dw[c] += sum over rows of dy * x * inv. One thread per column of a slab of kDwRowsPerBlock rows (a grid of
// column tiles by row slabs, so a 4K-row chunk fills the GPU rather than 8 blocks); slabs add their partial sums
// atomically. Reads stay coalesced: neighbouring threads read neighbouring columns of one row.
constexpr int kDwRowsPerBlock = 32;
__global__ void rmsnorm_backward_dw_kernel(int rows, int cols, const bf16_bits* x, const bf16_bits* dy, const float* inv_rows, float* dw) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  const int first = static_cast<int>(blockIdx.y) * kDwRowsPerBlock;
  const int last = min(rows, first + kDwRowsPerBlock);
  float sum = 0;
  for (int r = first; r < last; ++r) {
    const std::int64_t i = static_cast<std::int64_t>(r) * cols + c;
    sum += load(dy, i) * load(x, i) * inv_rows[r];
  }
  atomicAdd(dw + c, sum);
}

// Eight elements per thread.
__global__ void swiglu_forward_kernel(std::int64_t n, bool vec, const bf16_bits* gate, const bf16_bits* up, bf16_bits* y) {
  const std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i >= n) return;
  const Eight g = load8(gate, i, n, vec), u = load8(up, i, n, vec);
  Eight out;
  for (int e = 0; e < kVec; ++e) out.v[e] = g.v[e] / (1.0f + __expf(-g.v[e])) * u.v[e];
  store8(y, i, n, vec, out);
}

__global__ void swiglu_backward_kernel(std::int64_t n, bool vec, const bf16_bits* gate, const bf16_bits* up, const bf16_bits* dy, bf16_bits* d_gate,
                                       bf16_bits* d_up) {
  const std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i >= n) return;
  const Eight g = load8(gate, i, n, vec), u = load8(up, i, n, vec), d = load8(dy, i, n, vec);
  Eight dg, du;
  for (int e = 0; e < kVec; ++e) {
    const float sig = 1.0f / (1.0f + __expf(-g.v[e]));
    du.v[e] = d.v[e] * g.v[e] * sig;
    dg.v[e] = d.v[e] * u.v[e] * sig * (1.0f + g.v[e] * (1.0f - sig));
  }
  store8(d_up, i, n, vec, du);
  store8(d_gate, i, n, vec, dg);
}

__global__ void add_kernel(std::int64_t n, bool vec, const bf16_bits* a, const bf16_bits* b, bf16_bits* y) {
  const std::int64_t i = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i >= n) return;
  const Eight x = load8(a, i, n, vec), z = load8(b, i, n, vec);
  Eight out;
  for (int e = 0; e < kVec; ++e) out.v[e] = x.v[e] + z.v[e];
  store8(y, i, n, vec, out);
}

__global__ void axpy_f32_kernel(std::int64_t n, float alpha, const float* x, float* y) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += alpha * x[i];
}

// One block per row.
__global__ void embedding_forward_kernel(int hidden, const bf16_bits* table, const std::int32_t* tokens, bf16_bits* y) {
  const std::int64_t row = blockIdx.x, src = static_cast<std::int64_t>(tokens[row]) * hidden;
  const bool here = tokens[row] >= 0;  // else another vocabulary shard's: a zero row
  for (int i = static_cast<int>(threadIdx.x); i < hidden; i += static_cast<int>(blockDim.x))
    y[row * hidden + i] = here ? table[src + i] : bf16_bits{0};
}

__global__ void embedding_backward_kernel(int hidden, const std::int32_t* tokens, const bf16_bits* dy, float* dtable) {
  const std::int64_t row = blockIdx.x, dst = static_cast<std::int64_t>(tokens[row]) * hidden;
  if (tokens[row] < 0) return;  // another vocabulary shard's
  for (int i = static_cast<int>(threadIdx.x); i < hidden; i += static_cast<int>(blockDim.x)) atomicAdd(dtable + dst + i, load(dy, row * hidden + i));
}

// One thread per (row, pair i < head_dim / 2), looping over the row's heads: the angle depends on the row and i
// alone, so it is formed once for every head. It is formed and reduced to [0, 2*pi) in double (positions reach
// millions, where fp32 loses the phase), then sin and cos of the reduced angle in fp32: double pow and sincos per
// element made this kernel 7x slower than its bytes on an H100 (benchmarks/results/gpu.md).
__global__ void rope_kernel(int rows, int heads, int head_dim, std::int64_t offset, double log2_base, float sign, bf16_bits* x) {
  const int half = head_dim / 2;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= static_cast<std::int64_t>(rows) * half) return;
  const int i = static_cast<int>(t % half);
  const std::int64_t row = t / half;
  constexpr double kTwoPi = 6.283185307179586;
  double angle = static_cast<double>(offset + row) * exp2(-2.0 * i / head_dim * log2_base);
  angle -= floor(angle / kTwoPi) * kTwoPi;
  float sf, cf;
  sincosf(static_cast<float>(angle), &sf, &cf);
  sf *= sign;
  for (int h = 0; h < heads; ++h) {
    const std::int64_t base_index = (row * heads + h) * head_dim;
    const float a = load(x, base_index + i), b = load(x, base_index + i + half);
    store(x, base_index + i, a * cf - b * sf);
    store(x, base_index + i + half, b * cf + a * sf);
  }
}

// One block per row: max, then sum of exponentials, over up to the whole vocabulary.
__global__ void cross_entropy_forward_kernel(int vocab, const bf16_bits* logits, const std::int32_t* targets, float* loss, float* lse) {
  const std::int64_t row = blockIdx.x;
  const bf16_bits* z = logits + row * vocab;
  float top = -INFINITY;
  for (int c = static_cast<int>(threadIdx.x); c < vocab; c += static_cast<int>(blockDim.x)) top = fmaxf(top, load(z, c));
  top = block_max(top);
  float sum = 0;
  for (int c = static_cast<int>(threadIdx.x); c < vocab; c += static_cast<int>(blockDim.x)) sum += __expf(load(z, c) - top);
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    const float l = top + logf(sum);
    lse[row] = l;
    loss[row] = targets[row] < 0 ? l : l - load(z, targets[row]);  // a negative target: another shard's
  }
}

// One thread per row.
__global__ void vocab_parallel_merge_kernel(int rows, int shards, const float* stats, float* loss, float* lse) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows) return;
  const std::int64_t stride = 2 * static_cast<std::int64_t>(rows);
  float top = -INFINITY;
  for (int s = 0; s < shards; ++s) top = fmaxf(top, stats[s * stride + r]);
  float sum = 0, target = 0;
  for (int s = 0; s < shards; ++s) {
    sum += __expf(stats[s * stride + r] - top);
    target += stats[s * stride + r] - stats[s * stride + rows + r];
  }
  const float l = top + logf(sum);
  lse[r] = l;
  loss[r] = l - target;
}

__global__ void cross_entropy_backward_kernel(int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, const float* lse,
                                              const float* dloss, bf16_bits* dlogits) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(rows) * vocab) return;
  const std::int64_t row = i / vocab;
  const int c = static_cast<int>(i % vocab);
  const float p = __expf(load(logits, i) - lse[row]);
  store(dlogits, i, (p - (c == targets[row] ? 1.0f : 0.0f)) * dloss[row]);
}

__global__ void adamw_kernel(AdamW opt, float c1, float c2, std::int64_t n, float* master, float* m, float* v, const float* grad,
                             bf16_bits* weights) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i];
  const float mi = opt.beta1 * m[i] + (1.0f - opt.beta1) * g;
  const float vi = opt.beta2 * v[i] + (1.0f - opt.beta2) * g * g;
  float w = master[i];
  w -= opt.lr * opt.weight_decay * w;
  w -= opt.lr * (mi / c1) / (sqrtf(vi / c2) + opt.eps);
  m[i] = mi;
  v[i] = vi;
  master[i] = w;
  store(weights, i, w);
}

// Threads per row for the row-wise kernels: enough to cover short rows, at most 1024.
unsigned row_threads(int cols) {
  int t = 32;
  while (t < cols && t < 1024) t *= 2;
  return static_cast<unsigned>(t);
}

}  // namespace

void to_bf16(const float* x, bf16_bits* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_forward(int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, bf16_bits* y, cudaStream_t stream) {
  if (rows == 0) return;
  const bool vec = cols % kVec == 0 && aligned16({x, w, y});
  rmsnorm_forward_kernel<<<static_cast<unsigned>(rows), row_threads((cols + kVec - 1) / kVec), 0, stream>>>(cols, eps, vec, x, w, y);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, const bf16_bits* dy, bf16_bits* dx, float* dw,
                      cudaStream_t stream) {
  if (rows == 0) return;
  float* inv_rows = nullptr;
  TRAINYARD_CUDA_CHECK(cudaMallocAsync(&inv_rows, sizeof(float) * static_cast<std::size_t>(rows), stream));
  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>(rows), row_threads(cols), 0, stream>>>(cols, eps, x, w, dy, dx, inv_rows);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
  const dim3 dw_grid(blocks_for(cols), static_cast<unsigned>((rows + kDwRowsPerBlock - 1) / kDwRowsPerBlock));
  rmsnorm_backward_dw_kernel<<<dw_grid, kThreads, 0, stream>>>(rows, cols, x, dy, inv_rows, dw);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
  TRAINYARD_CUDA_CHECK(cudaFreeAsync(inv_rows, stream));
}

void swiglu_forward(std::int64_t n, const bf16_bits* gate, const bf16_bits* up, bf16_bits* y, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for_eights(n), kThreads, 0, stream>>>(n, aligned16({gate, up, y}), gate, up, y);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(std::int64_t n, const bf16_bits* gate, const bf16_bits* up, const bf16_bits* dy, bf16_bits* d_gate, bf16_bits* d_up,
                     cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for_eights(n), kThreads, 0, stream>>>(n, aligned16({gate, up, dy, d_gate, d_up}), gate, up, dy, d_gate, d_up);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void add(std::int64_t n, const bf16_bits* a, const bf16_bits* b, bf16_bits* y, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for_eights(n), kThreads, 0, stream>>>(n, aligned16({a, b, y}), a, b, y);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void axpy_f32(std::int64_t n, float alpha, const float* x, float* y, cudaStream_t stream) {
  if (n == 0) return;
  axpy_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, alpha, x, y);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void embedding_forward(int rows, int hidden, const bf16_bits* table, const std::int32_t* tokens, bf16_bits* y, cudaStream_t stream) {
  if (rows == 0) return;
  embedding_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(hidden, table, tokens, y);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(int rows, int hidden, const std::int32_t* tokens, const bf16_bits* dy, float* dtable, cudaStream_t stream) {
  if (rows == 0) return;
  embedding_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(hidden, tokens, dy, dtable);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void rope(int rows, int heads, int head_dim, std::int64_t position_offset, float base, bool inverse, bf16_bits* x, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * (head_dim / 2);  // threads: one per (row, pair)
  if (n == 0 || heads == 0) return;
  rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(rows, heads, head_dim, position_offset, std::log2(static_cast<double>(base)),
                                                      inverse ? -1.0f : 1.0f, x);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_forward(int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, float* loss, float* lse, cudaStream_t stream) {
  if (rows == 0) return;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(vocab, logits, targets, loss, lse);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void vocab_parallel_merge(int rows, int shards, const float* stats, float* loss, float* lse, cudaStream_t stream) {
  if (rows == 0) return;
  vocab_parallel_merge_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(rows, shards, stats, loss, lse);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_backward(int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, const float* lse, const float* dloss,
                            bf16_bits* dlogits, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * vocab;
  if (n == 0) return;
  cross_entropy_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(rows, vocab, logits, targets, lse, dloss, dlogits);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

void adamw(const AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad, bf16_bits* weights,
           cudaStream_t stream) {
  if (n == 0) return;
  const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(opt.beta1), step));
  const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(opt.beta2), step));
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream>>>(opt, c1, c2, n, master, m, v, grad, weights);
  TRAINYARD_CUDA_CHECK(cudaGetLastError());
}

}  // namespace trainyard::kernels
