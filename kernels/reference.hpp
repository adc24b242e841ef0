#pragma once
// CPU references for the kernels in kernels/*.cu: plain loops in double precision on float inputs, written for
// clarity, not speed. The GPU tests compare each kernel with its reference; the CPU tests check the references
// themselves (finite differences, chunked == unchunked).
//
// Layouts (row-major, all dense):
//   attention q, o, dq: [q_len][heads][d]; k, v, dk, dv: [kv_len][kv_heads][d]; lse, D: [heads][q_len]
//   rows x features for norms, activations, RoPE and the loss; RoPE rotates the two halves of each head
//   (Llama's "rotate_half" convention).
#include <cstdint>
#include <span>
#include <vector>

namespace trainyard::kernels {

// bf16 as its 16 bits, rounded to nearest even (NaN kept NaN), and back.
std::uint16_t to_bf16(float x);
float from_bf16(std::uint16_t x);
inline float round_bf16(float x) { return from_bf16(to_bf16(x)); }

struct AttentionShape {
  int q_len = 0, kv_len = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  // Absolute positions of the first query and key: with `causal`, key j is visible to query i when
  // kv_offset + j <= q_offset + i. A chunk pair on the diagonal has equal offsets; earlier chunks are not causal.
  std::int64_t q_offset = 0, kv_offset = 0;
  float scale() const;  // 1 / sqrt(head_dim)
};

// Forward of one (query chunk, key/value chunk) pair: o and the natural-log log-sum-exp of the scaled scores per
// (head, query). A query that sees no key gets o = 0 and lse = -infinity.
void attention_forward_ref(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v, std::span<float> o,
                           std::span<float> lse);

// Merges a partial result (o_part, lse_part) over other keys into the running (o_acc, lse_acc) of the same queries:
// the exact softmax over the union of the keys. The running pair starts at o = 0, lse = -infinity.
void attention_merge_ref(int q_len, int heads, int head_dim, std::span<float> o_acc, std::span<float> lse_acc, std::span<const float> o_part,
                         std::span<const float> lse_part);

// D = rowsum(dO * O) per (head, query), needed once per query chunk by every backward pair.
void attention_backward_prep_ref(int q_len, int heads, int head_dim, std::span<const float> o, std::span<const float> d_o, std::span<float> delta);

// Backward of one chunk pair given the final o's log-sum-exp and D of the query chunk: adds this pair's share to
// dq, dk and dv (accumulators, summed over pairs; dk/dv summed over the heads of each K/V head).
void attention_backward_ref(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                            std::span<const float> d_o, std::span<const float> lse, std::span<const float> delta, std::span<float> dq,
                            std::span<float> dk, std::span<float> dv);

// What a naive bf16 implementation of the same chunk pair computes (PyTorch's unfused math path in bf16): every
// matmul's output, the scaled scores and the softmax rounded to bf16, sums in fp32. Its error against the fp64
// references above is the yardstick for the kernels' tolerance: a fused kernel should be within a small multiple
// of it. The backward writes (not adds) bf16-rounded dq, dk, dv.
void attention_forward_naive_bf16(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                                  std::span<float> o, std::span<float> lse);
void attention_backward_naive_bf16(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                                   std::span<const float> d_o, std::span<const float> lse, std::span<const float> delta, std::span<float> dq,
                                   std::span<float> dk, std::span<float> dv);

// y = x / sqrt(mean(x^2) + eps) * w over each row; backward gives dx and adds to dw.
void rmsnorm_forward_ref(int rows, int cols, float eps, std::span<const float> x, std::span<const float> w, std::span<float> y);
void rmsnorm_backward_ref(int rows, int cols, float eps, std::span<const float> x, std::span<const float> w, std::span<const float> dy,
                          std::span<float> dx, std::span<float> dw);

// y = silu(gate) * up, elementwise; backward gives d_gate and d_up.
void swiglu_forward_ref(std::span<const float> gate, std::span<const float> up, std::span<float> y);
void swiglu_backward_ref(std::span<const float> gate, std::span<const float> up, std::span<const float> dy, std::span<float> d_gate,
                         std::span<float> d_up);

// y = a + b, elementwise (the residual adds; y may be a).
void add_ref(std::span<const float> a, std::span<const float> b, std::span<float> y);
// y += alpha * x, elementwise, in fp32.
void axpy_ref(float alpha, std::span<const float> x, std::span<float> y);

// Embedding rows: y[r] = table[tokens[r]] ([rows][hidden]); backward adds dy[r] into dtable[tokens[r]]. A negative
// token is another vocabulary shard's (tensor parallelism): a zero row, and nothing added.
void embedding_forward_ref(int rows, int hidden, std::span<const float> table, std::span<const std::int32_t> tokens, std::span<float> y);
void embedding_backward_ref(int rows, int hidden, std::span<const std::int32_t> tokens, std::span<const float> dy, std::span<float> dtable);

// Rotary positions on x [rows][heads][head_dim]: row r has position `position_offset + r`, frequency
// base^(-2i/head_dim) for pair i = (x[i], x[i + head_dim/2]). `inverse` rotates back (the backward).
void rope_ref(int rows, int heads, int head_dim, std::int64_t position_offset, float base, bool inverse, std::span<float> x);

// Cross-entropy over logits [rows][vocab] with integer targets: loss[r] = lse(logits[r]) - logits[r][target[r]]
// (the mean is the caller's business); backward: dlogits = (softmax - onehot(target)) * dloss[r]. A negative
// target is in another vocabulary shard (tensor parallelism): its logit counts as 0 here (loss = lse) and no onehot.
// vocab_parallel_merge: from every shard's (lse_s, loss_s) ([shards][2][rows], as head_xent_shard writes them),
// the whole vocabulary's lse = log sum_s exp(lse_s) and loss = lse - sum_s (lse_s - loss_s) (the target logit,
// which one shard holds).
void cross_entropy_forward_ref(int rows, int vocab, std::span<const float> logits, std::span<const std::int32_t> targets, std::span<float> loss,
                               std::span<float> lse);
void vocab_parallel_merge_ref(int rows, int shards, std::span<const float> stats, std::span<float> loss, std::span<float> lse);
void cross_entropy_backward_ref(int rows, int vocab, std::span<const float> logits, std::span<const std::int32_t> targets, std::span<const float> lse,
                                std::span<const float> dloss, std::span<float> dlogits);

// Row-major C[m][n] = alpha * op(A) * op(B) + beta * C, where A is [m][k] ([k][m] when transpose_a) and B is
// [k][n] ([n][k] when transpose_b): what the cuBLASLt wrapper computes.
void gemm_ref(int m, int n, int k, std::span<const float> a, bool transpose_a, std::span<const float> b, bool transpose_b, std::span<float> c,
              float alpha, float beta);

// One AdamW step (decoupled weight decay, bias-corrected moments, step t >= 1) on fp32 master weights and
// moments; `weights_bf16` receives the rounded copy the forward pass uses.
struct AdamW {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};
void adamw_ref(const AdamW& opt, int step, std::span<float> master, std::span<float> m, std::span<float> v, std::span<const float> grad,
               std::span<float> weights_bf16);
// The host's optimizer step (ZeRO-Offload's, ring-track's with states in DRAM): adamw_ref over n parameters in
// blocks spread over `threads` host threads (0: every core), the bf16 weights written as bits. The same values as
// adamw_ref, element by element; spread over the cores it is bound by DRAM bandwidth, as the simulator predicts it.
void adamw_host(const AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad, std::uint16_t* weights_bf16,
                int threads = 0);

}  // namespace trainyard::kernels
