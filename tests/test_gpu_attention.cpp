// The attention kernels against the CPU references: chunk pairs (causal diagonal blocks, earlier blocks, GQA,
// head_dim 64 and 128, lengths that are not multiples of the tiles), the merge over several kv chunks, and the
// backward. Outputs are poisoned before each run. Tolerance: o is bf16, so within 2^-7 of the largest |o| plus
// the fp64 reference's difference from fp32 accumulation; lse and the fp32 gradients within 1e-3 relative to
// their largest magnitude.
#include <algorithm>

#include "common/error.hpp"
#include "tests/gpu_support.hpp"

namespace trainyard::kernels {

using test::DeviceBuffer;

namespace {

double largest(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

}  // namespace

TEST(GpuAttention, ChunkPairForwardMatchesTheReference) {
  TRAINYARD_REQUIRE_GPU();
  struct Case {
    AttentionShape s;
    const char* what;
  };
  const Case cases[] = {
      {{37, 37, 4, 4, 64, true, 100, 100}, "diagonal causal block, 37 rows"},
      {{50, 70, 8, 2, 128, false, 200, 0}, "earlier block, GQA 4:1"},
      {{129, 129, 2, 1, 128, true, 0, 0}, "causal, one K/V head"},
      {{16, 200, 4, 2, 64, true, 184, 0}, "the last 16 queries of 200 keys"},
  };
  for (const auto& c : cases) {
    const auto& s = c.s;
    const auto q = test::random_bf16_values(static_cast<std::size_t>(s.q_len * s.heads * s.head_dim), 1);
    const auto k = test::random_bf16_values(static_cast<std::size_t>(s.kv_len * s.kv_heads * s.head_dim), 2);
    const auto v = test::random_bf16_values(k.size(), 3);
    std::vector<float> o_ref(q.size()), lse_ref(static_cast<std::size_t>(s.heads * s.q_len));
    attention_forward_ref(s, q, k, v, o_ref, lse_ref);
    DeviceBuffer<bf16_bits> dq(test::bits(q)), dk(test::bits(k)), dv(test::bits(v)), o(q.size());
    DeviceBuffer<float> lse(lse_ref.size());
    attention_forward(s, dq.get(), dk.get(), dv.get(), o.get(), lse.get(), nullptr);
    EXPECT_TRUE(test::close_to(test::floats(o.download()), o_ref, largest(o_ref) / 128, 0)) << c.what;
    EXPECT_TRUE(test::close_to(lse.download(), lse_ref, 1e-3, 1e-4)) << c.what;
  }
}

TEST(GpuAttention, ChunkedWithMergeEqualsUnchunked) {
  TRAINYARD_REQUIRE_GPU();
  const int chunks = 3, chunk = 96, heads = 4, kv_heads = 2, dim = 128, S = chunks * chunk;
  const auto q = test::random_bf16_values(static_cast<std::size_t>(S * heads * dim), 4);
  const auto k = test::random_bf16_values(static_cast<std::size_t>(S * kv_heads * dim), 5), v = test::random_bf16_values(k.size(), 6);
  std::vector<float> o_ref(q.size()), lse_ref(static_cast<std::size_t>(heads * S));
  attention_forward_ref({S, S, heads, kv_heads, dim, true, 0, 0}, q, k, v, o_ref, lse_ref);
  DeviceBuffer<bf16_bits> dq(test::bits(q)), dk(test::bits(k)), dv(test::bits(v));
  const std::size_t chunk_q = static_cast<std::size_t>(chunk * heads * dim), chunk_kv = static_cast<std::size_t>(chunk * kv_heads * dim);
  for (int qi = 0; qi < chunks; ++qi) {
    DeviceBuffer<float> o_acc(std::vector<float>(chunk_q, 0.0f));
    DeviceBuffer<float> lse_acc(std::vector<float>(static_cast<std::size_t>(heads * chunk), -INFINITY));
    DeviceBuffer<bf16_bits> o_part(chunk_q);
    DeviceBuffer<float> lse_part(static_cast<std::size_t>(heads * chunk));
    for (int kj = qi; kj >= 0; --kj) {
      const AttentionShape pair{chunk, chunk, heads, kv_heads, dim, kj == qi, std::int64_t{qi} * chunk, std::int64_t{kj} * chunk};
      attention_forward(pair, dq.get() + qi * chunk_q, dk.get() + kj * chunk_kv, dv.get() + kj * chunk_kv, o_part.get(), lse_part.get(),
                        nullptr);
      attention_merge(chunk, heads, dim, o_acc.get(), lse_acc.get(), o_part.get(), lse_part.get(), nullptr);
    }
    const std::vector<float> expected(o_ref.begin() + static_cast<std::ptrdiff_t>(qi * chunk_q),
                                      o_ref.begin() + static_cast<std::ptrdiff_t>((qi + 1) * chunk_q));
    // Each partial was rounded to bf16 once before the merge: a few bf16 roundings at most.
    EXPECT_TRUE(test::close_to(o_acc.download(), expected, 3 * largest(o_ref) / 128, 0)) << "query chunk " << qi;
    const auto lse = lse_acc.download();
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < chunk; ++i) {
        EXPECT_NEAR(lse[static_cast<std::size_t>(h * chunk + i)], lse_ref[static_cast<std::size_t>(h * S + qi * chunk + i)], 1e-3);
      }
    }
  }
}

TEST(GpuAttention, ChunkPairBackwardMatchesTheReference) {
  TRAINYARD_REQUIRE_GPU();
  for (const AttentionShape& s : {AttentionShape{45, 45, 4, 2, 64, true, 10, 10}, AttentionShape{33, 70, 2, 2, 128, false, 100, 0}}) {
    const auto q = test::random_bf16_values(static_cast<std::size_t>(s.q_len * s.heads * s.head_dim), 7);
    const auto k = test::random_bf16_values(static_cast<std::size_t>(s.kv_len * s.kv_heads * s.head_dim), 8);
    const auto v = test::random_bf16_values(k.size(), 9), d_o = test::random_bf16_values(q.size(), 10);
    std::vector<float> o(q.size()), lse(static_cast<std::size_t>(s.heads * s.q_len)), delta(lse.size());
    attention_forward_ref(s, q, k, v, o, lse);
    // The kernel reads O in bf16: give the reference the same rounded O.
    for (auto& x : o) x = round_bf16(x);
    attention_backward_prep_ref(s.q_len, s.heads, s.head_dim, o, d_o, delta);
    std::vector<float> dq_ref(q.size(), 0), dk_ref(k.size(), 0), dv_ref(v.size(), 0);
    attention_backward_ref(s, q, k, v, d_o, lse, delta, dq_ref, dk_ref, dv_ref);
    DeviceBuffer<bf16_bits> bq(test::bits(q)), bk(test::bits(k)), bv(test::bits(v)), bdo(test::bits(d_o)), bo(test::bits(o));
    DeviceBuffer<float> blse(lse), bdelta(delta.size());
    DeviceBuffer<float> dq(std::vector<float>(q.size(), 0)), dk(std::vector<float>(k.size(), 0)), dv(std::vector<float>(v.size(), 0));
    attention_backward_prep(s.q_len, s.heads, s.head_dim, bo.get(), bdo.get(), bdelta.get(), nullptr);
    attention_backward(s, bq.get(), bk.get(), bv.get(), bdo.get(), blse.get(), bdelta.get(), dq.get(), dk.get(), dv.get(), nullptr);
    EXPECT_TRUE(test::close_to(bdelta.download(), delta, 1e-3 * largest(delta) + 1e-5, 0));
    EXPECT_TRUE(test::close_to(dq.download(), dq_ref, 1e-3 * largest(dq_ref) + 1e-5, 0));
    EXPECT_TRUE(test::close_to(dk.download(), dk_ref, 1e-3 * largest(dk_ref) + 1e-5, 0));
    EXPECT_TRUE(test::close_to(dv.download(), dv_ref, 1e-3 * largest(dv_ref) + 1e-5, 0));
  }
}

TEST(GpuAttention, UnsupportedHeadDimIsAnError) {
  TRAINYARD_REQUIRE_GPU();
  const AttentionShape s{8, 8, 2, 2, 96, true, 0, 0};
  EXPECT_THROW(attention_forward(s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), ::trainyard::InternalError);
}

}  // namespace trainyard::kernels
