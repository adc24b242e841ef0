#pragma once
// Device helpers shared by the kernels: bf16 loads and stores, warp reductions, the launch geometry of a
// chunk pair, and (sm_80+) the bf16 tensor-core MMA m16n8k16 with fp32 accumulation.
#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/kernels.hpp"

namespace trainyard::kernels::detail {

__device__ __forceinline__ float load(const bf16_bits* p, std::int64_t i) { return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]); }
__device__ __forceinline__ void store(bf16_bits* p, std::int64_t i, float x) { reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); }
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// What a chunk-pair kernel needs of AttentionShape, by value.
struct Geometry {
  int q_len, kv_len, heads, kv_heads;
  bool causal;
  long long q_offset, kv_offset;
  float scale;
  // Key j of the chunk is visible to query i of the chunk.
  __device__ __forceinline__ bool visible(int i, int j) const { return !causal || kv_offset + j <= q_offset + i; }
};

inline Geometry geometry(const AttentionShape& s) {
  return {s.q_len, s.kv_len, s.heads, s.kv_heads, s.causal, static_cast<long long>(s.q_offset), static_cast<long long>(s.kv_offset), s.scale()};
}

// --- tensor cores -------------------------------------------------------------------------------------------
// mma.sync m16n8k16, bf16 inputs, fp32 accumulators. Fragment layouts (PTX ISA, "Matrix fragments for
// mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16x16, row-major), 4 registers of two bf16: a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
//                                                   a3 = A[g+8][2t+8..]
//   B (16x8, column-major), 2 registers:            b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16x8, fp32), 4 floats:                       c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// The lower-indexed element of a pair sits in the low 16 bits.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 and packed: lo in the low half.
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
// Two adjacent bf16 (element i even) as one 32-bit word.
__device__ __forceinline__ std::uint32_t pair(const bf16_bits* p, long long i) { return *reinterpret_cast<const std::uint32_t*>(p + i); }
// Two bf16 from consecutive rows of a row-major tile (the transposed operand): p[i] low, p[i + stride] high.
__device__ __forceinline__ std::uint32_t column_pair(const bf16_bits* p, int i, int stride) {
  return static_cast<std::uint32_t>(p[i]) | (static_cast<std::uint32_t>(p[i + stride]) << 16);
}

// The C fragments of two adjacent 16x8 tiles (columns 16k..16k+15) as the A fragment of a 16x16 k-slice: the
// register-level reuse of P that FlashAttention-2 relies on, rounded to bf16.
__device__ __forceinline__ void c_to_a(const float (&left)[4], const float (&right)[4], std::uint32_t (&a)[4]) {
  a[0] = pack_bf16(left[0], left[1]);
  a[1] = pack_bf16(left[2], left[3]);
  a[2] = pack_bf16(right[0], right[1]);
  a[3] = pack_bf16(right[2], right[3]);
}

// Every pointer 16-byte aligned: what one uint4 access per eight bf16 needs.
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// The tensor-core launches (attention_tc.cu), behind attention_forward/attention_backward's AttentionPath.
void attention_forward_tensor_cores(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o, float* lse,
                                    cudaStream_t stream);
void attention_backward_tensor_cores(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const bf16_bits* d_o,
                                     const float* lse, const float* delta, float* dq, float* dk, float* dv, cudaStream_t stream);

}  // namespace trainyard::kernels::detail
