// The elementwise CUDA kernels against their CPU references (kernels/reference.hpp), on fresh random inputs of
// several sizes (including sizes that are not multiples of the block), with outputs poisoned before each run.
// Tolerances: bf16 outputs are compared with the fp64 reference of the same bf16 inputs within 2^-7 relative
// (one bf16 rounding is 2^-9 relative; the kernels round once) plus a small absolute term.
#include "tests/gpu_support.hpp"

namespace trainyard::kernels {

using test::DeviceBuffer;

namespace {
constexpr double kBf16Rel = 1.0 / 128;
}

TEST(GpuElementwise, RmsNormForwardAndBackward) {
  TRAINYARD_REQUIRE_GPU();
  for (auto [rows, cols] : {std::pair{3, 7}, std::pair{17, 4096}, std::pair{5, 1000}, std::pair{1000, 300}}) {  // 1000 rows: many row slabs
    const auto x = test::random_bf16_values(static_cast<std::size_t>(rows * cols), 1),
               w = test::random_bf16_values(static_cast<std::size_t>(cols), 2);
    const auto dy = test::random_bf16_values(x.size(), 3);
    std::vector<float> y_ref(x.size()), dx_ref(x.size()), dw_ref(w.size(), 0.0f);
    rmsnorm_forward_ref(rows, cols, 1e-5f, x, w, y_ref);
    rmsnorm_backward_ref(rows, cols, 1e-5f, x, w, dy, dx_ref, dw_ref);
    DeviceBuffer<bf16_bits> dx_in(test::bits(x)), dw_in(test::bits(w)), dy_in(test::bits(dy)), y(x.size()), dx(x.size());
    DeviceBuffer<float> dw(std::vector<float>(w.size(), 0.0f));
    rmsnorm_forward(rows, cols, 1e-5f, dx_in.get(), dw_in.get(), y.get(), nullptr);
    rmsnorm_backward(rows, cols, 1e-5f, dx_in.get(), dw_in.get(), dy_in.get(), dx.get(), dw.get(), nullptr);
    EXPECT_TRUE(test::close_to(test::floats(y.download()), y_ref, 1e-3, kBf16Rel)) << rows << "x" << cols;
    EXPECT_TRUE(test::close_to(test::floats(dx.download()), dx_ref, 1e-3, kBf16Rel)) << rows << "x" << cols;
    EXPECT_TRUE(test::close_to(dw.download(), dw_ref, 1e-3, 1e-4)) << rows << "x" << cols;
  }
}

TEST(GpuElementwise, SwiGluForwardAndBackward) {
  TRAINYARD_REQUIRE_GPU();
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1003}, std::size_t{1} << 20}) {  // 1003: 16-byte path and tail
    const auto gate = test::random_bf16_values(n, 4), up = test::random_bf16_values(n, 5), dy = test::random_bf16_values(n, 6);
    std::vector<float> y_ref(n), dg_ref(n), du_ref(n);
    swiglu_forward_ref(gate, up, y_ref);
    swiglu_backward_ref(gate, up, dy, dg_ref, du_ref);
    DeviceBuffer<bf16_bits> g(test::bits(gate)), u(test::bits(up)), d(test::bits(dy)), y(n), dg(n), du(n);
    swiglu_forward(static_cast<std::int64_t>(n), g.get(), u.get(), y.get(), nullptr);
    swiglu_backward(static_cast<std::int64_t>(n), g.get(), u.get(), d.get(), dg.get(), du.get(), nullptr);
    EXPECT_TRUE(test::close_to(test::floats(y.download()), y_ref, 1e-3, kBf16Rel)) << n;
    EXPECT_TRUE(test::close_to(test::floats(dg.download()), dg_ref, 1e-3, kBf16Rel)) << n;
    EXPECT_TRUE(test::close_to(test::floats(du.download()), du_ref, 1e-3, kBf16Rel)) << n;
  }
}

TEST(GpuElementwise, AddAndEmbeddingRows) {
  TRAINYARD_REQUIRE_GPU();
  for (std::size_t n : {std::size_t{1}, std::size_t{1003}, std::size_t{1} << 20}) {
    const auto a = test::random_bf16_values(n, 7), b = test::random_bf16_values(n, 8);
    std::vector<float> y_ref(n);
    add_ref(a, b, y_ref);
    DeviceBuffer<bf16_bits> da(test::bits(a)), db(test::bits(b)), y(n);
    add(static_cast<std::int64_t>(n), da.get(), db.get(), y.get(), nullptr);
    EXPECT_TRUE(test::close_to(test::floats(y.download()), y_ref, 1e-3, kBf16Rel)) << n;
    add(static_cast<std::int64_t>(n), da.get(), db.get(), da.get(), nullptr);  // in place
    EXPECT_TRUE(test::close_to(test::floats(da.download()), y_ref, 1e-3, kBf16Rel)) << n;
    DeviceBuffer<float> fa(a), fb(b);  // fp32: ring attention's dK | dV accumulators
    axpy_f32(static_cast<std::int64_t>(n), 1.0f, fb.get(), fa.get(), nullptr);
    EXPECT_TRUE(test::close_to(fa.download(), y_ref, 1e-6, 1e-6)) << n;
    std::vector<float> twice_less = y_ref;
    axpy_ref(-2.0f, b, twice_less);  // a + b - 2b
    axpy_f32(static_cast<std::int64_t>(n), -2.0f, fb.get(), fa.get(), nullptr);
    EXPECT_TRUE(test::close_to(fa.download(), twice_less, 1e-6, 1e-6)) << n;
  }
  const int rows = 300, hidden = 200, vocab = 50;  // tokens repeat: the backward's atomics add into shared rows
  const auto table = test::random_bf16_values(static_cast<std::size_t>(vocab * hidden), 9);
  const auto dy = test::random_bf16_values(static_cast<std::size_t>(rows * hidden), 10);
  std::vector<std::int32_t> tokens(rows);
  for (int r = 0; r < rows; ++r) tokens[r] = (r * 7 + 3) % vocab;
  std::vector<float> y_ref(dy.size()), dtable_ref(table.size(), 0.0f);
  embedding_forward_ref(rows, hidden, table, tokens, y_ref);
  embedding_backward_ref(rows, hidden, tokens, dy, dtable_ref);
  DeviceBuffer<bf16_bits> t(test::bits(table)), d(test::bits(dy)), y(dy.size());
  DeviceBuffer<std::int32_t> tok(tokens);
  DeviceBuffer<float> dtable(std::vector<float>(table.size(), 0.0f));
  embedding_forward(rows, hidden, t.get(), tok.get(), y.get(), nullptr);
  embedding_backward(rows, hidden, tok.get(), d.get(), dtable.get(), nullptr);
  EXPECT_TRUE(test::close_to(test::floats(y.download()), y_ref, 0, 0)) << "a gather is exact";
  EXPECT_TRUE(test::close_to(dtable.download(), dtable_ref, 1e-5, 1e-5));
}

TEST(GpuElementwise, RopeForwardAndInverseAtLargeOffsets) {
  TRAINYARD_REQUIRE_GPU();
  for (auto [rows, offset] : {std::pair{5, std::int64_t{0}}, std::pair{333, std::int64_t{1} << 21}}) {
    for (int dim : {64, 128}) {
      const int heads = 3;
      const auto x = test::random_bf16_values(static_cast<std::size_t>(rows * heads * dim), 7);
      auto ref = x;
      rope_ref(rows, heads, dim, offset, 500000.0f, false, ref);
      DeviceBuffer<bf16_bits> dx(test::bits(x));
      rope(rows, heads, dim, offset, 500000.0f, false, dx.get(), nullptr);
      EXPECT_TRUE(test::close_to(test::floats(dx.download()), ref, 1e-2, kBf16Rel)) << rows << " rows at " << offset;
      rope(rows, heads, dim, offset, 500000.0f, true, dx.get(), nullptr);
      EXPECT_TRUE(test::close_to(test::floats(dx.download()), x, 2e-2, 2 * kBf16Rel)) << "inverse, " << rows << " rows";
    }
  }
}

TEST(GpuElementwise, CrossEntropyUpToLlamaVocabulary) {
  TRAINYARD_REQUIRE_GPU();
  for (auto [rows, vocab] : {std::pair{3, 11}, std::pair{4, 128256}}) {
    const auto logits = test::random_bf16_values(static_cast<std::size_t>(rows * vocab), 8, 3.0f);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) targets[r] = (r * 7919 + 13) % vocab;
    std::vector<float> dloss(static_cast<std::size_t>(rows), 1.0f / static_cast<float>(rows));
    std::vector<float> loss_ref(targets.size()), lse_ref(targets.size()), dlogits_ref(logits.size());
    cross_entropy_forward_ref(rows, vocab, logits, targets, loss_ref, lse_ref);
    cross_entropy_backward_ref(rows, vocab, logits, targets, lse_ref, dloss, dlogits_ref);
    DeviceBuffer<bf16_bits> z(test::bits(logits)), dz(logits.size());
    DeviceBuffer<std::int32_t> t(targets);
    DeviceBuffer<float> loss(targets.size()), lse(targets.size()), dl(dloss);
    cross_entropy_forward(rows, vocab, z.get(), t.get(), loss.get(), lse.get(), nullptr);
    cross_entropy_backward(rows, vocab, z.get(), t.get(), lse.get(), dl.get(), dz.get(), nullptr);
    EXPECT_TRUE(test::close_to(loss.download(), loss_ref, 1e-4, 1e-5)) << vocab;
    EXPECT_TRUE(test::close_to(lse.download(), lse_ref, 1e-4, 1e-5)) << vocab;
    EXPECT_TRUE(test::close_to(test::floats(dz.download()), dlogits_ref, 1e-6, kBf16Rel)) << vocab;
  }
}

// The vocab-parallel loss's pieces: a negative target (another shard's) and the merge of shards' statistics.
TEST(GpuElementwise, VocabParallelCrossEntropyMatchesTheReference) {
  TRAINYARD_REQUIRE_GPU();
  const int rows = 5, vocab = 300, shards = 4;
  const auto logits = test::random_bf16_values(static_cast<std::size_t>(rows * vocab), 12, 3.0f);
  const std::vector<std::int32_t> targets{-1, 7, -1, 299, 0};
  std::vector<float> loss_ref(rows), lse_ref(rows);
  cross_entropy_forward_ref(rows, vocab, logits, targets, loss_ref, lse_ref);
  DeviceBuffer<bf16_bits> z(test::bits(logits));
  DeviceBuffer<std::int32_t> t(targets);
  DeviceBuffer<float> loss(targets.size()), lse(targets.size());
  cross_entropy_forward(rows, vocab, z.get(), t.get(), loss.get(), lse.get(), nullptr);
  EXPECT_TRUE(test::close_to(loss.download(), loss_ref, 1e-4, 1e-5));
  const auto stats = test::random_bf16_values(static_cast<std::size_t>(shards * 2 * rows), 13, 4.0f);
  std::vector<float> merged_loss_ref(rows), merged_lse_ref(rows);
  vocab_parallel_merge_ref(rows, shards, stats, merged_loss_ref, merged_lse_ref);
  DeviceBuffer<float> s(stats), merged_loss(rows), merged_lse(rows);
  vocab_parallel_merge(rows, shards, s.get(), merged_loss.get(), merged_lse.get(), nullptr);
  EXPECT_TRUE(test::close_to(merged_loss.download(), merged_loss_ref, 1e-4, 1e-5));
  EXPECT_TRUE(test::close_to(merged_lse.download(), merged_lse_ref, 1e-4, 1e-5));
}

TEST(GpuElementwise, AdamWMatchesTheReference) {
  TRAINYARD_REQUIRE_GPU();
  const std::size_t n = 100003;
  auto master = test::random_bf16_values(n, 9), m = test::random_bf16_values(n, 10, 0.01f), grad = test::random_bf16_values(n, 12);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = m[i] * m[i];
  DeviceBuffer<float> dmaster(master), dm(m), dv(v), dgrad(grad);
  DeviceBuffer<bf16_bits> weights(n);
  AdamW opt;
  std::vector<float> weights_ref(n);
  adamw_ref(opt, 3, master, m, v, grad, weights_ref);
  adamw(opt, 3, static_cast<std::int64_t>(n), dmaster.get(), dm.get(), dv.get(), dgrad.get(), weights.get(), nullptr);
  EXPECT_TRUE(test::close_to(dmaster.download(), master, 1e-7, 1e-6));
  EXPECT_TRUE(test::close_to(dm.download(), m, 1e-8, 1e-5));
  EXPECT_TRUE(test::close_to(dv.download(), v, 1e-10, 1e-5));
  EXPECT_TRUE(test::close_to(test::floats(weights.download()), weights_ref, 0, kBf16Rel));
}

}  // namespace trainyard::kernels
