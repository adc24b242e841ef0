// The attention kernels, both implementations (tensor cores and CUDA cores), against the fp64 CPU references:
// chunk pairs (causal diagonal blocks, earlier blocks, GQA, head_dim 64 and 128, lengths that are not multiples
// of the tiles, several seeds), the merge over several kv chunks, and the backward, chunk by chunk included.
// Outputs are poisoned before each run and NaN never passes.
//
// Tolerance: the largest error of a naive bf16 implementation (attention_*_naive_bf16: each matmul and the
// softmax rounded to bf16) on the same inputs, times a small factor: 2 for one chunk pair, 3 when bf16 partials
// are merged. On the CPU, an emulation of the tensor-core kernels' rounding stayed within 1.05x (forward) and 0.43x
// (backward) of the naive error over these shapes and seeds, so 2x leaves room without being loose.
#include <algorithm>

#include "common/error.hpp"
#include "tests/gpu_support.hpp"

namespace trainyard::kernels {

using test::DeviceBuffer;

namespace {

constexpr AttentionPath kPaths[] = {AttentionPath::tensor_cores, AttentionPath::cuda_cores};
const char* name(AttentionPath p) { return p == AttentionPath::tensor_cores ? "tensor cores" : "CUDA cores"; }

double max_error(const std::vector<float>& got, const std::vector<float>& expected) {
  double m = 0;
  for (std::size_t i = 0; i < got.size(); ++i) m = std::max(m, static_cast<double>(std::abs(got[i] - expected[i])));
  return m;
}

std::size_t q_elems(const AttentionShape& s) { return static_cast<std::size_t>(s.q_len) * static_cast<std::size_t>(s.heads * s.head_dim); }
std::size_t kv_elems(const AttentionShape& s) { return static_cast<std::size_t>(s.kv_len) * static_cast<std::size_t>(s.kv_heads * s.head_dim); }
std::size_t row_stats(const AttentionShape& s) { return static_cast<std::size_t>(s.heads) * static_cast<std::size_t>(s.q_len); }

struct Inputs {
  std::vector<float> q, k, v, d_o;
  Inputs(const AttentionShape& s, std::uint32_t seed)
      : q(test::random_bf16_values(q_elems(s), seed)),
        k(test::random_bf16_values(kv_elems(s), seed + 100)),
        v(test::random_bf16_values(kv_elems(s), seed + 200)),
        d_o(test::random_bf16_values(q_elems(s), seed + 300)) {}
};

// The exact forward (and its lse), the naive bf16 forward's error bound, and the backward's inputs: O rounded to
// bf16 as the kernels read it, and D from it.
struct Expected {
  std::vector<float> o, lse, o_bf16, delta, dq, dk, dv;
  double o_tolerance = 0, dq_tolerance = 0, dk_tolerance = 0, dv_tolerance = 0;
  Expected(const AttentionShape& s, const Inputs& in, double factor) : o(q_elems(s)), lse(row_stats(s)), delta(row_stats(s)) {
    attention_forward_ref(s, in.q, in.k, in.v, o, lse);
    std::vector<float> o_naive(o.size()), lse_naive(lse.size());
    attention_forward_naive_bf16(s, in.q, in.k, in.v, o_naive, lse_naive);
    o_tolerance = factor * max_error(o_naive, o);
    o_bf16 = o;
    for (auto& x : o_bf16) x = round_bf16(x);
    attention_backward_prep_ref(s.q_len, s.heads, s.head_dim, o_bf16, in.d_o, delta);
    dq.assign(o.size(), 0.0f);
    dk.assign(kv_elems(s), 0.0f);
    dv.assign(kv_elems(s), 0.0f);
    attention_backward_ref(s, in.q, in.k, in.v, in.d_o, lse, delta, dq, dk, dv);
    std::vector<float> dq_naive(dq.size()), dk_naive(dk.size()), dv_naive(dv.size());
    attention_backward_naive_bf16(s, in.q, in.k, in.v, in.d_o, lse, delta, dq_naive, dk_naive, dv_naive);
    dq_tolerance = factor * max_error(dq_naive, dq);
    dk_tolerance = factor * max_error(dk_naive, dk);
    dv_tolerance = factor * max_error(dv_naive, dv);
  }
};

const AttentionShape kPairs[] = {
    {37, 37, 4, 4, 64, true, 100, 100},  // diagonal causal block, 37 rows
    {50, 70, 8, 2, 128, false, 200, 0},  // earlier block, GQA 4:1
    {129, 129, 2, 1, 128, true, 0, 0},   // causal, one K/V head, past two tiles
    {16, 200, 4, 2, 64, true, 184, 0},   // the last 16 queries of 200 keys
    {70, 33, 2, 2, 128, true, 0, 40},    // keys after some queries: rows that see nothing (o = 0, lse = -inf)
};

}  // namespace

TEST(GpuAttention, ChunkPairForwardMatchesTheReference) {
  TRAINYARD_REQUIRE_GPU();
  for (const auto& s : kPairs) {
    for (std::uint32_t seed : {1u, 2u}) {
      const Inputs in(s, seed);
      const Expected want(s, in, 2.0);
      for (const auto path : kPaths) {
        DeviceBuffer<bf16_bits> q(test::bits(in.q)), k(test::bits(in.k)), v(test::bits(in.v)), o(in.q.size());
        DeviceBuffer<float> lse(want.lse.size());
        attention_forward(s, q.get(), k.get(), v.get(), o.get(), lse.get(), nullptr, path);
        const auto what = ::testing::Message() << name(path) << ", q " << s.q_len << " kv " << s.kv_len << " d " << s.head_dim << " seed " << seed;
        EXPECT_TRUE(test::close_to(test::floats(o.download()), want.o, want.o_tolerance, 0)) << what;
        const auto got_lse = lse.download();
        for (std::size_t i = 0; i < got_lse.size(); ++i) {
          if (std::isinf(want.lse[i])) {
            EXPECT_TRUE(std::isinf(got_lse[i]) && got_lse[i] < 0) << what << " lse " << i << " = " << got_lse[i];
          } else {
            EXPECT_NEAR(got_lse[i], want.lse[i], 1e-3 + 1e-4 * std::abs(want.lse[i])) << what << " lse " << i;
          }
        }
      }
    }
  }
}

TEST(GpuAttention, ChunkPairBackwardMatchesTheReference) {
  TRAINYARD_REQUIRE_GPU();
  for (const auto& s : kPairs) {
    const Inputs in(s, 7);
    const Expected want(s, in, 2.0);
    for (const auto path : kPaths) {
      DeviceBuffer<bf16_bits> q(test::bits(in.q)), k(test::bits(in.k)), v(test::bits(in.v)), d_o(test::bits(in.d_o)), o(test::bits(want.o_bf16));
      DeviceBuffer<float> lse(want.lse), delta(want.delta.size());
      DeviceBuffer<float> dq(std::vector<float>(in.q.size(), 0)), dk(std::vector<float>(in.k.size(), 0)), dv(std::vector<float>(in.v.size(), 0));
      attention_backward_prep(s.q_len, s.heads, s.head_dim, o.get(), d_o.get(), delta.get(), nullptr);
      attention_backward(s, q.get(), k.get(), v.get(), d_o.get(), lse.get(), delta.get(), dq.get(), dk.get(), dv.get(), nullptr, path);
      const auto what = ::testing::Message() << name(path) << ", q " << s.q_len << " kv " << s.kv_len << " d " << s.head_dim;
      EXPECT_TRUE(test::close_to(delta.download(), want.delta, 1e-5, 1e-5)) << what;
      EXPECT_TRUE(test::close_to(dq.download(), want.dq, want.dq_tolerance, 0)) << what << " dq";
      EXPECT_TRUE(test::close_to(dk.download(), want.dk, want.dk_tolerance, 0)) << what << " dk";
      EXPECT_TRUE(test::close_to(dv.download(), want.dv, want.dv_tolerance, 0)) << what << " dv";
    }
  }
}

// Causal attention over 3 chunks of 96 tokens done one chunk pair at a time (the diagonal pair causal, earlier
// pairs not), forward with the merge and backward into shared accumulators, equals the unchunked reference.
TEST(GpuAttention, ChunkedEqualsUnchunkedForwardAndBackward) {
  TRAINYARD_REQUIRE_GPU();
  const int chunks = 3, chunk = 96, heads = 4, kv_heads = 2, dim = 128, S = chunks * chunk;
  const AttentionShape whole{S, S, heads, kv_heads, dim, true, 0, 0};
  const Inputs in(whole, 4);
  const Expected want(whole, in, 3.0);
  const std::size_t chunk_q = static_cast<std::size_t>(chunk * heads * dim), chunk_kv = static_cast<std::size_t>(chunk * kv_heads * dim);
  const std::size_t chunk_rows = static_cast<std::size_t>(heads * chunk);
  for (const auto path : kPaths) {
    DeviceBuffer<bf16_bits> q(test::bits(in.q)), k(test::bits(in.k)), v(test::bits(in.v)), d_o(test::bits(in.d_o));
    std::vector<float> o_all(in.q.size());
    std::vector<float> lse_all(want.lse.size());
    for (int qi = 0; qi < chunks; ++qi) {
      DeviceBuffer<float> o_acc(std::vector<float>(chunk_q, 0.0f)), lse_acc(std::vector<float>(chunk_rows, -INFINITY));
      DeviceBuffer<bf16_bits> o_part(chunk_q);
      DeviceBuffer<float> lse_part(chunk_rows);
      for (int kj = qi; kj >= 0; --kj) {
        const AttentionShape pair{chunk, chunk, heads, kv_heads, dim, kj == qi, std::int64_t{qi} * chunk, std::int64_t{kj} * chunk};
        attention_forward(pair, q.get() + qi * chunk_q, k.get() + kj * chunk_kv, v.get() + kj * chunk_kv, o_part.get(), lse_part.get(), nullptr,
                          path);
        attention_merge(chunk, heads, dim, o_acc.get(), lse_acc.get(), o_part.get(), lse_part.get(), nullptr);
      }
      const auto o_chunk = o_acc.download();
      std::copy(o_chunk.begin(), o_chunk.end(), o_all.begin() + static_cast<std::ptrdiff_t>(qi * chunk_q));
      const auto lse_chunk = lse_acc.download();
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < chunk; ++i) lse_all[h * S + qi * chunk + i] = lse_chunk[h * chunk + i];
      }
    }
    EXPECT_TRUE(test::close_to(o_all, want.o, want.o_tolerance, 0)) << name(path) << " forward";
    EXPECT_TRUE(test::close_to(lse_all, want.lse, 1e-3, 1e-4)) << name(path) << " lse";

    // Backward, query chunk outer and descending (ring-track's order), with the exact lse and D per query chunk.
    DeviceBuffer<float> dq(std::vector<float>(in.q.size(), 0)), dk(std::vector<float>(in.k.size(), 0)), dv(std::vector<float>(in.v.size(), 0));
    for (int qi = chunks - 1; qi >= 0; --qi) {
      std::vector<float> lse_chunk(chunk_rows), delta_chunk(chunk_rows);
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < chunk; ++i) {
          lse_chunk[h * chunk + i] = want.lse[h * S + qi * chunk + i];
          delta_chunk[h * chunk + i] = want.delta[h * S + qi * chunk + i];
        }
      }
      DeviceBuffer<float> lse(lse_chunk), delta(delta_chunk);
      for (int kj = qi; kj >= 0; --kj) {
        const AttentionShape pair{chunk, chunk, heads, kv_heads, dim, kj == qi, std::int64_t{qi} * chunk, std::int64_t{kj} * chunk};
        attention_backward(pair, q.get() + qi * chunk_q, k.get() + kj * chunk_kv, v.get() + kj * chunk_kv, d_o.get() + qi * chunk_q, lse.get(),
                           delta.get(), dq.get() + qi * chunk_q, dk.get() + kj * chunk_kv, dv.get() + kj * chunk_kv, nullptr, path);
      }
      TRAINYARD_CUDA_CHECK(cudaDeviceSynchronize());  // lse and delta go out of scope
    }
    EXPECT_TRUE(test::close_to(dq.download(), want.dq, want.dq_tolerance, 0)) << name(path) << " dq";
    EXPECT_TRUE(test::close_to(dk.download(), want.dk, want.dk_tolerance, 0)) << name(path) << " dk";
    EXPECT_TRUE(test::close_to(dv.download(), want.dv, want.dv_tolerance, 0)) << name(path) << " dv";
  }
}

TEST(GpuAttention, UnsupportedHeadDimIsAnError) {
  TRAINYARD_REQUIRE_GPU();
  const AttentionShape s{8, 8, 2, 2, 96, true, 0, 0};
  for (const auto path : kPaths) {
    EXPECT_THROW(attention_forward(s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, path), ::trainyard::InternalError);
  }
}

}  // namespace trainyard::kernels
