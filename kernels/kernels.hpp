#pragma once
// CUDA kernels for chunked training. Device pointers; bf16 tensors are passed as their 16-bit patterns
// (std::uint16_t) so that this header needs no CUDA type beyond the stream. Layouts and semantics are those of
// the CPU references in kernels/reference.hpp, which the GPU tests compare against.
//
// Every launch is checked; errors carry file:line (CUDA_CHECK below) and go up as InternalError.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/reference.hpp"

namespace trainyard::kernels {

// Throws InternalError("<call> failed: <cudaGetErrorString> ...", file, line) when `status` is not cudaSuccess.
void cuda_check(cudaError_t status, const char* call, const char* file, int line);
#define TRAINYARD_CUDA_CHECK(call) ::trainyard::kernels::cuda_check((call), #call, __FILE__, __LINE__)

using bf16_bits = std::uint16_t;

// --- attention (attention.cu, attention_tc.cu) -----------------------------------------------------------
// Two implementations of the chunk pair: FlashAttention-2 style on tensor cores (the default; bf16 pointers
// 16-byte aligned) and a plain one on CUDA cores, kept as an independent cross-check.
enum class AttentionPath { tensor_cores, cuda_cores };

// The head widths the attention kernels are written for.
constexpr bool attention_supports_head_dim(std::int64_t head_dim) { return head_dim == 64 || head_dim == 128; }
// One chunk pair: o (bf16) and lse (fp32, [heads][q_len]); head_dim 64 or 128.
void attention_forward(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, bf16_bits* o, float* lse,
                       cudaStream_t stream, AttentionPath path = AttentionPath::tensor_cores);
// Folds a partial (o_part bf16, lse_part) into running fp32 accumulators (o_acc, lse_acc), exactly.
void attention_merge(int q_len, int heads, int head_dim, float* o_acc, float* lse_acc, const bf16_bits* o_part, const float* lse_part,
                     cudaStream_t stream);
// D = rowsum(dO * O) per (head, query).
void attention_backward_prep(int q_len, int heads, int head_dim, const bf16_bits* o, const bf16_bits* d_o, float* delta, cudaStream_t stream);
// Adds one chunk pair's share to the fp32 accumulators dq, dk, dv.
void attention_backward(const AttentionShape& s, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const bf16_bits* d_o, const float* lse,
                        const float* delta, float* dq, float* dk, float* dv, cudaStream_t stream, AttentionPath path = AttentionPath::tensor_cores);

// --- elementwise (elementwise.cu) --------------------------------------------------------------------------
void to_bf16(const float* x, bf16_bits* y, std::int64_t n, cudaStream_t stream);
void rmsnorm_forward(int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, bf16_bits* y, cudaStream_t stream);
// dx (bf16) per row; dw accumulates into fp32 (deterministic: one thread per column sums the rows in order).
void rmsnorm_backward(int rows, int cols, float eps, const bf16_bits* x, const bf16_bits* w, const bf16_bits* dy, bf16_bits* dx, float* dw,
                      cudaStream_t stream);
void swiglu_forward(std::int64_t n, const bf16_bits* gate, const bf16_bits* up, bf16_bits* y, cudaStream_t stream);
void swiglu_backward(std::int64_t n, const bf16_bits* gate, const bf16_bits* up, const bf16_bits* dy, bf16_bits* d_gate, bf16_bits* d_up,
                     cudaStream_t stream);
// y = a + b (y may alias a or b).
void add(std::int64_t n, const bf16_bits* a, const bf16_bits* b, bf16_bits* y, cudaStream_t stream);
// y += alpha * x in fp32 (ring attention's dK | dV accumulators; ZeRO's gradients reduced every micro-batch; CPU
// reference: axpy_ref).
void axpy_f32(std::int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
// y[r] = table[tokens[r]]; the backward adds dy[r] into the fp32 dtable[tokens[r]] (atomics: the order of the
// additions into a row that several tokens share is not fixed). A negative token: a zero row, nothing added
// (another vocabulary shard's; reference.hpp).
void embedding_forward(int rows, int hidden, const bf16_bits* table, const std::int32_t* tokens, bf16_bits* y, cudaStream_t stream);
void embedding_backward(int rows, int hidden, const std::int32_t* tokens, const bf16_bits* dy, float* dtable, cudaStream_t stream);
// In place on x [rows][heads][head_dim]; `inverse` for the backward.
void rope(int rows, int heads, int head_dim, std::int64_t position_offset, float base, bool inverse, bf16_bits* x, cudaStream_t stream);
void cross_entropy_forward(int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, float* loss, float* lse, cudaStream_t stream);
// reference.hpp's vocab_parallel_merge_ref: stats [shards][2][rows] -> loss, lse [rows].
void vocab_parallel_merge(int rows, int shards, const float* stats, float* loss, float* lse, cudaStream_t stream);
void cross_entropy_backward(int rows, int vocab, const bf16_bits* logits, const std::int32_t* targets, const float* lse, const float* dloss,
                            bf16_bits* dlogits, cudaStream_t stream);
void adamw(const AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad, bf16_bits* weights, cudaStream_t stream);

}  // namespace trainyard::kernels
