// The CPU references of kernels/ checked on their own (they run everywhere): chunked attention with the
// log-sum-exp merge equals unchunked attention forward and backward, every backward matches finite differences
// of its forward, and the naive bf16 attention (the GPU tests' error yardstick) is close but not exact.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "kernels/reference.hpp"

namespace trainyard::kernels {

namespace {

std::vector<float> random_vector(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// Central differences of a scalar function of `x` at the given indices.
std::vector<double> numeric_gradient(std::vector<float>& x, const std::vector<std::size_t>& indices, const std::function<double()>& f) {
  std::vector<double> out;
  for (std::size_t i : indices) {
    const float keep = x[i];
    const float h = 1e-2f * std::max(1.0f, std::abs(keep));
    x[i] = keep + h;
    const double up = f();
    x[i] = keep - h;
    const double down = f();
    x[i] = keep;
    out.push_back((up - down) / (2.0 * static_cast<double>(h)));
  }
  return out;
}

double dot(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

struct Chunked {
  int chunks = 3, chunk = 16, heads = 4, kv_heads = 2, dim = 8;
  int seq() const { return chunks * chunk; }
  std::size_t q_size(int len) const { return static_cast<std::size_t>(len * heads * dim); }
  std::size_t kv_size(int len) const { return static_cast<std::size_t>(len * kv_heads * dim); }
};

}  // namespace

TEST(KernelReference, Bf16RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(from_bf16(0x3F80), 1.0f);
  EXPECT_EQ(to_bf16(1.0f + 1.0f / 256), 0x3F80);  // halfway: ties to the even 1.0
  EXPECT_EQ(to_bf16(1.0f + 3.0f / 256), 0x3F82);  // halfway between 0x3F81 and 0x3F82: to even
  EXPECT_EQ(round_bf16(-2.5f), -2.5f);            // exactly representable
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(round_bf16(std::numeric_limits<float>::infinity())));
}

TEST(KernelReference, ChunkedAttentionWithMergeEqualsUnchunked) {
  const Chunked c;
  const int S = c.seq();
  const auto q = random_vector(c.q_size(S), 1), k = random_vector(c.kv_size(S), 2), v = random_vector(c.kv_size(S), 3);
  // Unchunked causal attention of the whole sequence.
  AttentionShape whole{S, S, c.heads, c.kv_heads, c.dim, true, 0, 0};
  std::vector<float> o_full(c.q_size(S)), lse_full(static_cast<std::size_t>(c.heads * S));
  attention_forward_ref(whole, q, k, v, o_full, lse_full);
  for (int qi = 0; qi < c.chunks; ++qi) {
    const auto q_chunk = std::span(q).subspan(c.q_size(qi * c.chunk), c.q_size(c.chunk));
    std::vector<float> o_acc(c.q_size(c.chunk), 0.0f);
    std::vector<float> lse_acc(static_cast<std::size_t>(c.heads * c.chunk), -std::numeric_limits<float>::infinity());
    for (int kj = qi; kj >= 0; --kj) {  // the diagonal block first, then the earlier chunks, as the builders do
      AttentionShape pair{c.chunk, c.chunk, c.heads, c.kv_heads, c.dim, kj == qi, std::int64_t{qi} * c.chunk, std::int64_t{kj} * c.chunk};
      std::vector<float> o_part(c.q_size(c.chunk)), lse_part(static_cast<std::size_t>(c.heads * c.chunk));
      attention_forward_ref(pair, q_chunk, std::span(k).subspan(c.kv_size(kj * c.chunk), c.kv_size(c.chunk)),
                            std::span(v).subspan(c.kv_size(kj * c.chunk), c.kv_size(c.chunk)), o_part, lse_part);
      attention_merge_ref(c.chunk, c.heads, c.dim, o_acc, lse_acc, o_part, lse_part);
    }
    EXPECT_LT(max_abs_diff(o_acc, std::span<const float>(o_full).subspan(c.q_size(qi * c.chunk), c.q_size(c.chunk))), 1e-5) << qi;
    for (int h = 0; h < c.heads; ++h) {
      for (int i = 0; i < c.chunk; ++i) {
        EXPECT_NEAR(lse_acc[h * c.chunk + i], lse_full[h * S + qi * c.chunk + i], 1e-5);
      }
    }
  }
}

TEST(KernelReference, AttentionBackwardMatchesFiniteDifferences) {
  AttentionShape s{6, 9, 2, 1, 4, true, 3, 0};  // queries at positions 3..8 over keys 0..8, GQA 2:1
  auto q = random_vector(static_cast<std::size_t>(6 * 2 * 4), 4), k = random_vector(static_cast<std::size_t>(9 * 4), 5),
       v = random_vector(static_cast<std::size_t>(9 * 4), 6);
  const auto w = random_vector(q.size(), 7);  // the loss is sum(o * w), so dO = w
  auto loss = [&] {
    std::vector<float> o(q.size()), lse(static_cast<std::size_t>(2 * 6));
    attention_forward_ref(s, q, k, v, o, lse);
    return dot(o, w);
  };
  std::vector<float> o(q.size()), lse(static_cast<std::size_t>(2 * 6)), delta(lse.size());
  attention_forward_ref(s, q, k, v, o, lse);
  attention_backward_prep_ref(6, 2, 4, o, w, delta);
  std::vector<float> dq(q.size(), 0), dk(k.size(), 0), dv(v.size(), 0);
  attention_backward_ref(s, q, k, v, w, lse, delta, dq, dk, dv);
  const std::vector<std::size_t> some{0, 5, 13, 22, 31};
  for (auto [x, grad] : {std::pair{&q, &dq}, std::pair{&k, &dk}, std::pair{&v, &dv}}) {
    const auto numeric = numeric_gradient(*x, some, loss);
    for (std::size_t i = 0; i < some.size(); ++i) EXPECT_NEAR((*grad)[some[i]], numeric[i], 2e-3 + 2e-2 * std::abs(numeric[i])) << some[i];
  }
}

TEST(KernelReference, ChunkedAttentionBackwardEqualsUnchunked) {
  const Chunked c;
  const int S = c.seq();
  const auto q = random_vector(c.q_size(S), 11), k = random_vector(c.kv_size(S), 12), v = random_vector(c.kv_size(S), 13);
  const auto d_o = random_vector(c.q_size(S), 14);
  AttentionShape whole{S, S, c.heads, c.kv_heads, c.dim, true, 0, 0};
  std::vector<float> o(c.q_size(S)), lse(static_cast<std::size_t>(c.heads * S)), delta(lse.size());
  attention_forward_ref(whole, q, k, v, o, lse);
  attention_backward_prep_ref(S, c.heads, c.dim, o, d_o, delta);
  std::vector<float> dq(q.size(), 0), dk(k.size(), 0), dv(v.size(), 0);
  attention_backward_ref(whole, q, k, v, d_o, lse, delta, dq, dk, dv);
  // Chunk pairs, query chunk outer and descending (ring-track's order), with each query chunk's lse and D.
  std::vector<float> dq_c(q.size(), 0), dk_c(k.size(), 0), dv_c(v.size(), 0);
  for (int qi = c.chunks - 1; qi >= 0; --qi) {
    std::vector<float> lse_chunk(static_cast<std::size_t>(c.heads * c.chunk)), delta_chunk(lse_chunk.size());
    for (int h = 0; h < c.heads; ++h) {
      for (int i = 0; i < c.chunk; ++i) {
        lse_chunk[h * c.chunk + i] = lse[h * S + qi * c.chunk + i];
        delta_chunk[h * c.chunk + i] = delta[h * S + qi * c.chunk + i];
      }
    }
    for (int kj = qi; kj >= 0; --kj) {
      AttentionShape pair{c.chunk, c.chunk, c.heads, c.kv_heads, c.dim, kj == qi, std::int64_t{qi} * c.chunk, std::int64_t{kj} * c.chunk};
      auto sub_q = [&](auto& x) { return std::span(x).subspan(c.q_size(qi * c.chunk), c.q_size(c.chunk)); };
      auto sub_kv = [&](auto& x) { return std::span(x).subspan(c.kv_size(kj * c.chunk), c.kv_size(c.chunk)); };
      attention_backward_ref(pair, sub_q(q), sub_kv(k), sub_kv(v), sub_q(d_o), lse_chunk, delta_chunk, sub_q(dq_c), sub_kv(dk_c), sub_kv(dv_c));
    }
  }
  EXPECT_LT(max_abs_diff(dq_c, dq), 1e-4);
  EXPECT_LT(max_abs_diff(dk_c, dk), 1e-4);
  EXPECT_LT(max_abs_diff(dv_c, dv), 1e-4);
}

// The naive bf16 attention sets the GPU tests' tolerance, so it must be a real yardstick: close to the exact
// result (a few bf16 ulps of the largest value), not equal to it, and masking like the reference.
TEST(KernelReference, NaiveBf16AttentionIsCloseButNotExact) {
  const AttentionShape s{40, 56, 4, 2, 64, true, 16, 0};
  const auto round_all = [](std::vector<float> x) {
    for (auto& v : x) v = round_bf16(v);
    return x;
  };
  const auto q = round_all(random_vector(static_cast<std::size_t>(40 * 4 * 64), 31));
  const auto k = round_all(random_vector(static_cast<std::size_t>(56 * 2 * 64), 32)), v = round_all(random_vector(k.size(), 33));
  const auto d_o = round_all(random_vector(q.size(), 34));
  std::vector<float> o(q.size()), lse(static_cast<std::size_t>(4 * 40)), o_naive(o.size()), lse_naive(lse.size()), delta(lse.size());
  attention_forward_ref(s, q, k, v, o, lse);
  attention_forward_naive_bf16(s, q, k, v, o_naive, lse_naive);
  const auto largest = [](const std::vector<float>& x) {
    double m = 0;
    for (float e : x) m = std::max(m, static_cast<double>(std::abs(e)));
    return m;
  };
  const double forward_error = max_abs_diff(o_naive, o);
  EXPECT_GT(forward_error, 0.0);
  EXPECT_LT(forward_error, largest(o) / 32);
  EXPECT_LT(max_abs_diff(lse_naive, lse), 1e-2);

  attention_backward_prep_ref(40, 4, 64, o, d_o, delta);
  std::vector<float> dq(q.size(), 0), dk(k.size(), 0), dv(v.size(), 0), dq_naive(q.size()), dk_naive(k.size()), dv_naive(v.size());
  attention_backward_ref(s, q, k, v, d_o, lse, delta, dq, dk, dv);
  attention_backward_naive_bf16(s, q, k, v, d_o, lse, delta, dq_naive, dk_naive, dv_naive);
  for (auto [naive, exact] : {std::pair{&dq_naive, &dq}, std::pair{&dk_naive, &dk}, std::pair{&dv_naive, &dv}}) {
    const double error = max_abs_diff(*naive, *exact);
    EXPECT_GT(error, 0.0);
    EXPECT_LT(error, largest(*exact) / 32);
  }
}

TEST(KernelReference, NormActivationAndLossBackwardsMatchFiniteDifferences) {
  const int rows = 3, cols = 7;
  // RMSNorm.
  auto x = random_vector(static_cast<std::size_t>(rows * cols), 21), w = random_vector(static_cast<std::size_t>(cols), 22);
  const auto g = random_vector(x.size(), 23);
  auto norm_loss = [&] {
    std::vector<float> y(x.size());
    rmsnorm_forward_ref(rows, cols, 1e-5f, x, w, y);
    return dot(y, g);
  };
  std::vector<float> dx(x.size()), dw(w.size(), 0);
  rmsnorm_backward_ref(rows, cols, 1e-5f, x, w, g, dx, dw);
  const std::vector<std::size_t> some{0, 4, 9, 20};
  auto n = numeric_gradient(x, some, norm_loss);
  for (std::size_t i = 0; i < some.size(); ++i) EXPECT_NEAR(dx[some[i]], n[i], 2e-3 + 2e-2 * std::abs(n[i]));
  const std::vector<std::size_t> columns{0, 3, 6};
  n = numeric_gradient(w, columns, norm_loss);
  for (std::size_t i = 0; i < columns.size(); ++i) EXPECT_NEAR(dw[columns[i]], n[i], 2e-3 + 2e-2 * std::abs(n[i]));
  // SwiGLU.
  auto gate = random_vector(x.size(), 24), up = random_vector(x.size(), 25);
  auto act_loss = [&] {
    std::vector<float> y(x.size());
    swiglu_forward_ref(gate, up, y);
    return dot(y, g);
  };
  std::vector<float> dgate(x.size()), dup(x.size());
  swiglu_backward_ref(gate, up, g, dgate, dup);
  n = numeric_gradient(gate, some, act_loss);
  for (std::size_t i = 0; i < some.size(); ++i) EXPECT_NEAR(dgate[some[i]], n[i], 2e-3 + 2e-2 * std::abs(n[i]));
  n = numeric_gradient(up, some, act_loss);
  for (std::size_t i = 0; i < some.size(); ++i) EXPECT_NEAR(dup[some[i]], n[i], 2e-3 + 2e-2 * std::abs(n[i]));
  // Cross-entropy (the loss is sum(loss * dloss)).
  const int vocab = 11;
  auto logits = random_vector(static_cast<std::size_t>(rows * vocab), 26, 2.0f);
  const std::vector<std::int32_t> targets{3, 0, 10};
  const std::vector<float> dloss{0.5f, 1.0f, -0.25f};
  auto ce_loss = [&] {
    std::vector<float> loss(rows), lse(rows);
    cross_entropy_forward_ref(rows, vocab, logits, targets, loss, lse);
    return dot(loss, dloss);
  };
  std::vector<float> loss(rows), lse(rows), dlogits(logits.size());
  cross_entropy_forward_ref(rows, vocab, logits, targets, loss, lse);
  cross_entropy_backward_ref(rows, vocab, logits, targets, lse, dloss, dlogits);
  const std::vector<std::size_t> cells{3, 5, 11, 32};
  n = numeric_gradient(logits, cells, ce_loss);
  for (std::size_t i = 0; i < cells.size(); ++i) EXPECT_NEAR(dlogits[cells[i]], n[i], 2e-3 + 2e-2 * std::abs(n[i]));
  EXPECT_GT(loss[0], 0.0f);
}

// Tensor parallelism's vocab-parallel loss: the vocabulary cut into shards, each shard's cross-entropy with its own
// ids (-1 where the target is another shard's), merged, equals the whole vocabulary's loss and lse; each shard's
// dlogits with the merged lse are the whole one's columns; the embedding's rows of other shards are zero.
TEST(KernelReference, VocabShardsMergeToTheWholeVocabularysLoss) {
  const int rows = 4, vocab = 12, shards = 3, part = vocab / shards;
  const auto logits = random_vector(static_cast<std::size_t>(rows * vocab), 41, 3.0f);
  const std::vector<std::int32_t> targets{0, 5, 11, 7};
  const std::vector<float> dloss(rows, 0.25f);
  std::vector<float> loss(rows), lse(rows), dlogits(logits.size());
  cross_entropy_forward_ref(rows, vocab, logits, targets, loss, lse);
  cross_entropy_backward_ref(rows, vocab, logits, targets, lse, dloss, dlogits);
  std::vector<float> stats(static_cast<std::size_t>(shards * 2 * rows));
  std::vector<std::vector<float>> shard_logits(shards);
  std::vector<std::vector<std::int32_t>> shard_targets(shards);
  for (int s = 0; s < shards; ++s) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < part; ++c) shard_logits[s].push_back(logits[static_cast<std::size_t>(r * vocab + s * part + c)]);
      shard_targets[s].push_back(targets[r] / part == s ? targets[r] % part : -1);
    }
    const auto block = std::span(stats).subspan(static_cast<std::size_t>(s * 2 * rows), static_cast<std::size_t>(2 * rows));
    cross_entropy_forward_ref(rows, part, shard_logits[s], shard_targets[s], block.subspan(rows), block.first(rows));
  }
  std::vector<float> merged_loss(rows), merged_lse(rows);
  vocab_parallel_merge_ref(rows, shards, stats, merged_loss, merged_lse);
  for (int r = 0; r < rows; ++r) {
    EXPECT_NEAR(merged_loss[r], loss[r], 1e-5) << r;
    EXPECT_NEAR(merged_lse[r], lse[r], 1e-5) << r;
  }
  for (int s = 0; s < shards; ++s) {
    std::vector<float> d(static_cast<std::size_t>(rows * part));
    cross_entropy_backward_ref(rows, part, shard_logits[s], shard_targets[s], merged_lse, dloss, d);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < part; ++c) EXPECT_NEAR(d[r * part + c], dlogits[r * vocab + s * part + c], 1e-6) << s << " " << r << " " << c;
    }
  }
  std::vector<float> y(4, 9.0f), dtable(4, 0.0f);
  embedding_forward_ref(2, 2, std::vector<float>{1, 2, 3, 4}, std::vector<std::int32_t>{-1, 1}, y);
  EXPECT_EQ(y, (std::vector<float>{0, 0, 3, 4})) << "another shard's token: a zero row";
  embedding_backward_ref(2, 2, std::vector<std::int32_t>{-1, 1}, std::vector<float>{5, 5, 1, 2}, dtable);
  EXPECT_EQ(dtable, (std::vector<float>{0, 0, 1, 2}));
}

TEST(KernelReference, RopeInverseUndoesItAndChunksCompose) {
  const int rows = 10, heads = 2, dim = 8;
  const auto x = random_vector(static_cast<std::size_t>(rows * heads * dim), 31);
  auto y = x;
  rope_ref(rows, heads, dim, 100, 500000.0f, false, y);
  EXPECT_GT(max_abs_diff(x, y), 1e-2);  // it did rotate
  auto back = y;
  rope_ref(rows, heads, dim, 100, 500000.0f, true, back);
  EXPECT_LT(max_abs_diff(back, x), 1e-5);
  // Rows 100..109 in two chunks with their own position offsets equal the whole.
  auto a = std::vector<float>(x.begin(), x.begin() + 4 * heads * dim), b = std::vector<float>(x.begin() + 4 * heads * dim, x.end());
  rope_ref(4, heads, dim, 100, 500000.0f, false, a);
  rope_ref(6, heads, dim, 104, 500000.0f, false, b);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_LT(max_abs_diff(a, y), 1e-6);
}

TEST(KernelReference, GemmWithTransposesByHand) {
  const std::vector<float> a{1, 2, 3, 4, 5, 6};  // [2][3]
  const std::vector<float> b{1, 0, 0, 1, 1, 1};  // [3][2]
  std::vector<float> c{10, 20, 30, 40};
  gemm_ref(2, 2, 3, a, false, b, false, c, 1.0f, 0.5f);  // [[4, 5], [10, 11]] + c / 2
  EXPECT_EQ(c, (std::vector<float>{9, 15, 25, 31}));
  // The same product from A stored transposed ([3][2]) and B stored transposed ([2][3]).
  const std::vector<float> at{1, 4, 2, 5, 3, 6}, bt{1, 0, 1, 0, 1, 1};
  std::vector<float> d(4, 0.0f);
  gemm_ref(2, 2, 3, at, true, bt, true, d, 1.0f, 0.0f);
  EXPECT_EQ(d, (std::vector<float>{4, 5, 10, 11}));
}

TEST(KernelReference, EmbeddingRowsAndAddsByHand) {
  const std::vector<float> table = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  const std::vector<std::int32_t> tokens = {2, 0, 2};
  std::vector<float> y(6);
  embedding_forward_ref(3, 2, table, tokens, y);
  EXPECT_EQ(y, (std::vector<float>{5, 6, 1, 2, 5, 6}));
  std::vector<float> dtable(6, 0.0f);
  embedding_backward_ref(3, 2, tokens, std::vector<float>{1, 1, 2, 2, 3, 3}, dtable);
  EXPECT_EQ(dtable, (std::vector<float>{2, 2, 0, 0, 4, 4})) << "token 2 appears twice: its row gets both gradients";
  std::vector<float> sum(3);
  add_ref(std::vector<float>{1, 2, 3}, std::vector<float>{0.5f, -2, 4}, sum);
  EXPECT_EQ(sum, (std::vector<float>{1.5f, 0, 7}));
  axpy_ref(-2.0f, std::vector<float>{1, 0.5f, 2}, sum);
  EXPECT_EQ(sum, (std::vector<float>{-0.5f, -1, 3}));
}

TEST(KernelReference, AdamWStepByHand) {
  AdamW opt;
  std::vector<float> master{1.0f, -2.0f}, m{0.0f, 0.1f}, v{0.0f, 0.01f}, bf16(2);
  const std::vector<float> grad{0.5f, -1.0f};
  adamw_ref(opt, 1, master, m, v, grad, bf16);
  // Step 1: m = 0.1 * g, v = 0.05 * g^2, bias-corrected m/(1-b1) = g, v/(1-b2) = g^2: the update is lr * sign(g).
  EXPECT_NEAR(m[0], 0.05f, 1e-7);
  EXPECT_NEAR(v[0], 0.05f * 0.25f, 1e-7);
  EXPECT_NEAR(master[0], 1.0f - 1e-4f * 0.1f * 1.0f - 1e-4f * (0.5f / (0.5f + 1e-8f)), 1e-6);
  EXPECT_EQ(bf16[0], round_bf16(master[0]));
  EXPECT_NEAR(m[1], 0.9f * 0.1f + 0.1f * -1.0f, 1e-7);
}

// The host's step spread over threads: the same values as adamw_ref, block by block (200000 parameters: 3 whole
// blocks and a part), whatever the threads.
TEST(KernelReference, TheHostAdamWOnSeveralThreadsEqualsTheReference) {
  const std::size_t n = 200000;
  std::vector<float> grad(n), master(n), m(n), v(n), rounded(n);
  for (std::size_t i = 0; i < n; ++i) {
    grad[i] = std::sin(0.37f * static_cast<float>(i));
    master[i] = std::cos(0.11f * static_cast<float>(i));
    m[i] = 0.01f * grad[i];
    v[i] = 0.001f * grad[i] * grad[i];
  }
  AdamW opt;
  opt.lr = 1e-2f;
  std::vector<float> ref_master = master, ref_m = m, ref_v = v;
  adamw_ref(opt, 3, ref_master, ref_m, ref_v, grad, rounded);
  for (int threads : {1, 3}) {
    std::vector<float> host_master = master, host_m = m, host_v = v;
    std::vector<std::uint16_t> weights(n);
    adamw_host(opt, 3, static_cast<std::int64_t>(n), host_master.data(), host_m.data(), host_v.data(), grad.data(), weights.data(), threads);
    EXPECT_EQ(host_master, ref_master) << threads << " threads";
    EXPECT_EQ(host_m, ref_m);
    EXPECT_EQ(host_v, ref_v);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(from_bf16(weights[i]), rounded[i]) << i;
  }
}

}  // namespace trainyard::kernels
