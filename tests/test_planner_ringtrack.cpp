// Ring-track temporal parallelism as a task graph: dependencies, bytes between GPUs, bubbles, memory that does
// not grow with the sequence, host-DRAM overflow and the ring order.
#include <gtest/gtest.h>

#include <map>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "test_support.hpp"

namespace trainyard::planner {

namespace {

const std::string kData = TRAINYARD_TEST_DATA_DIR;

sim::SimResult run(sim::TaskGraph& g, const sim::Cluster& c) { return test::simulate_built(g, c, "ringtrack"); }

// First start and last end of the compute tasks whose names start with `prefix` + " " on GPUs below `gpus`
// (replica 0 when the ring is the first `gpus` GPUs).
struct Span {
  std::int64_t start = -1, end = -1;
  sim::DeviceId device = -1;
};
Span span_of(const sim::TaskGraph& g, const sim::SimResult& r, const std::string& prefix, int gpus = 1 << 30) {
  Span s;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto& t = g.tasks()[i];
    if (t.stream.kind != sim::StreamKind::compute || t.device >= gpus || g.name_of(t).rfind(prefix + " ", 0) != 0) continue;
    if (s.start < 0 || r.timing[i].start_ns < s.start) s.start = r.timing[i].start_ns;
    s.end = std::max(s.end, r.timing[i].end_ns);
    s.device = t.device;
  }
  return s;
}

}  // namespace

TEST(RingTrack, VisitsFollowTheTrainDependencies) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,vocab=1024");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {2048, 2}, model::precision_policy("bf16-mixed")};  // 2 replicas of a 2-GPU ring
  RingTrackParams p;
  p.ring = 2;
  p.chunk = 512;  // 4 chunks
  p.ring_order = {0, 1};
  RingTrackPlan plan = build_ringtrack(in, p);
  ASSERT_EQ(plan.rings.size(), 2u);
  EXPECT_EQ(plan.rings[1], (std::vector<int>{2, 3}));
  const auto r = run(plan.graph, c);
  ASSERT_TRUE(r.completed) << r.stuck;
  const int L = 4, C = 4;
  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < C; ++k) {
      const Span f = span_of(plan.graph, r, "F L" + std::to_string(l) + " C" + std::to_string(k), 2);
      ASSERT_GE(f.start, 0) << l << " " << k;
      // Layer l of replica 0 lives on ring position l mod 2.
      EXPECT_EQ(f.device, l % 2) << "F L" << l << " C" << k;
      if (l > 0) {
        EXPECT_GE(f.start, span_of(plan.graph, r, "F L" + std::to_string(l - 1) + " C" + std::to_string(k), 2).end);
      }
      if (k > 0) {
        EXPECT_GE(f.start, span_of(plan.graph, r, "F L" + std::to_string(l) + " C" + std::to_string(k - 1), 2).end);
      }
      const Span b = span_of(plan.graph, r, "B L" + std::to_string(l) + " C" + std::to_string(k), 2);
      EXPECT_GE(b.start, f.end);
      if (l < L - 1) {
        EXPECT_GE(b.start, span_of(plan.graph, r, "B L" + std::to_string(l + 1) + " C" + std::to_string(k), 2).end);
      }
      if (k < C - 1) {
        EXPECT_GE(b.start, span_of(plan.graph, r, "B L" + std::to_string(l) + " C" + std::to_string(k + 1), 2).end);
      }
    }
  }
  // Causal attention of chunk 3 reads the K/V of chunks 0..2 back from host DRAM (one 64K-token block).
  int kv_reads = 0;
  for (const auto& t : plan.graph.tasks()) kv_reads += plan.graph.name_of(t) == "F L2 C3 attn H2D kv C0..C2" && t.device == 0;
  EXPECT_EQ(kv_reads, 1);
  // Data-parallel replicas all-reduce each layer's gradients once per step, and the LM head's and the embedding's.
  int all_reduces = 0;
  for (const auto& t : plan.graph.tasks()) all_reduces += t.kind() == sim::TaskKind::collective;
  EXPECT_EQ(all_reduces, L + 2);
}

TEST(RingTrack, OnlyChunkActivationsCrossBetweenGpus) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=8,hidden=512,heads=8,vocab=1024");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const std::int64_t S = 8192, chunk = 1024;
  const StepInputs in{m, c, {S, 1}, model::precision_policy("bf16-mixed")};
  RingTrackParams p;
  p.ring = 4;
  p.chunk = chunk;
  RingTrackPlan plan = build_ringtrack(in, p);
  double forward = 0, backward = 0, other = 0;
  for (const auto& t : plan.graph.tasks()) {
    if (const auto* msg = std::get_if<sim::PointToPoint>(&t.params)) {
      (plan.graph.name_of(t)[0] == 'F' ? forward : plan.graph.name_of(t)[0] == 'B' ? backward : other) += static_cast<double>(msg->bytes);
    }
  }
  // Every chunk hops L times forward (into layers 1..L-1 and into the LM head's stop) and L times back.
  const double expected = static_cast<double>(S / chunk) * 8 * static_cast<double>(chunk * m.hidden) * 2;
  EXPECT_DOUBLE_EQ(forward, expected);
  EXPECT_DOUBLE_EQ(backward, expected);
  EXPECT_EQ(other, 0);
  // With plain stages (b = L/P) only the stage boundaries are crossed: 4 per chunk (3 + the head's stop).
  p.block = 2;
  RingTrackPlan stages = build_ringtrack(in, p);
  double staged = 0;
  for (const auto& t : stages.graph.tasks()) {
    if (const auto* msg = std::get_if<sim::PointToPoint>(&t.params); msg && stages.graph.name_of(t)[0] == 'F')
      staged += static_cast<double>(msg->bytes);
  }
  EXPECT_DOUBLE_EQ(staged, expected / 2);
}

TEST(RingTrack, BubbleMatchesTheFillAndDrainFormula) {
  // Nearly uniform visits: attention is small beside the dense ops (short chunks, wide layers), everything in HBM,
  // a head with a tiny vocabulary.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=8,hidden=1024,heads=8,vocab=256");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const int P = 4, L = 8;
  for (const std::int64_t chunks : {8, 32}) {
    const std::int64_t chunk = 32;
    const StepInputs in{m, c, {chunk * chunks, 1}, model::precision_policy("bf16-mixed")};
    RingTrackParams p;
    p.ring = P;
    p.chunk = chunk;
    p.kv = Placement::hbm;
    p.acts = ActivationPolicy::hbm;
    RingTrackPlan plan = build_ringtrack(in, p);
    const auto r = run(plan.graph, c);
    ASSERT_TRUE(r.completed) << (r.oom ? r.oom->describe(plan.graph) : r.stuck);
    // Busy time per GPU and span of the train (forward and backward visits, not the optimizer step).
    std::int64_t first = -1, last = 0;
    std::vector<double> busy(P, 0);
    for (std::size_t i = 0; i < plan.graph.size(); ++i) {
      const auto& t = plan.graph.tasks()[i];
      if (t.stream.kind != sim::StreamKind::compute || t.kind() == sim::TaskKind::optimizer) continue;
      if (first < 0 || r.timing[i].start_ns < first) first = r.timing[i].start_ns;
      last = std::max(last, r.timing[i].end_ns);
      busy[t.device] += static_cast<double>(r.timing[i].end_ns - r.timing[i].start_ns);
    }
    const double span = static_cast<double>(last - first);
    double total = 0, most = 0, least = 1e300;
    for (double b : busy) {
      total += b;
      most = std::max(most, b);
      least = std::min(least, b);
    }
    const double bubble = 1 - total / (P * span);
    const double formula = (P - 1.0) / (static_cast<double>(chunks) * L / P + P - 1.0);
    // GPU 0 also runs the embedding and the (small) LM head, so its visits are a little longer: the span is its
    // work plus P - 1 fill/drain visits of the others. With equal work this is exactly the formula above.
    const double visit = least / (static_cast<double>(chunks) * L / P);
    const double expected = 1 - total / (P * (most + (P - 1) * visit));
    EXPECT_NEAR(expected, formula, 0.2 * formula) << chunks << " chunks: the case is not uniform enough";
    EXPECT_NEAR(bubble, expected, 0.15 * expected) << chunks << " chunks (formula " << formula << ")";
  }
}

TEST(RingTrack, HbmDoesNotGrowWithTheSequenceWhenKvAndActivationsLiveInDram) {
  const model::ModelConfig m = model::load_model("llama3.2-1b");
  const sim::Cluster c(hw::load_node("dgx-a100"), 1);
  std::vector<std::int64_t> peaks;
  std::vector<std::int64_t> dram;
  for (const std::int64_t S : {128 * 1024, 1024 * 1024}) {
    const StepInputs in{m, c, {S, 1}, model::precision_policy("bf16-mixed")};
    RingTrackParams p;
    p.ring = 8;
    p.chunk = 16384;
    RingTrackPlan plan = build_ringtrack(in, p);
    const auto r = run(plan.graph, c);
    ASSERT_TRUE(r.completed) << S;
    std::int64_t peak = 0;
    for (int gpu = 0; gpu < 8; ++gpu) peak = std::max(peak, r.pools[gpu].peak_bytes);
    peaks.push_back(peak);
    dram.push_back(r.pools[8].peak_bytes);
  }
  EXPECT_NEAR(static_cast<double>(peaks[1]), static_cast<double>(peaks[0]), 0.01 * static_cast<double>(peaks[0]));
  EXPECT_GT(dram[1], 6 * dram[0]);  // the sequence went to host DRAM instead
}

TEST(RingTrack, HostDramOverflowIsAnOomOfTheHostPool) {
  const model::ModelConfig m = model::load_model("llama3-8b");
  const sim::Cluster c(hw::load_node("dgx-a100"), 1);
  const StepInputs in{m, c, {1024 * 1024, 1}, model::precision_policy("bf16-mixed")};
  RingTrackParams p;
  p.ring = 8;
  p.acts = ActivationPolicy::dram;  // 1M tokens of full activations: about 4 TiB, the node has 2
  RingTrackPlan plan = build_ringtrack(in, p);
  const auto r = run(plan.graph, c);
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_EQ(r.oom->pool, "host0 dram");
  EXPECT_NE(r.oom->describe(plan.graph).find("activations in host DRAM"), std::string::npos);
}

TEST(RingTrack, RingOrderAvoidsTheSlowHops) {
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const std::vector<int> naive{0, 1, 2, 3};
  double naive_slowest = 1e9;
  for (const auto& hop : ring_hops(c, naive)) naive_slowest = std::min(naive_slowest, hop.GBps);
  const auto best = best_ring_order(c, naive);
  EXPECT_EQ(best, (std::vector<int>{0, 2, 1, 3}));
  double best_slowest = 1e9;
  for (const auto& hop : ring_hops(c, best)) best_slowest = std::min(best_slowest, hop.GBps);
  EXPECT_DOUBLE_EQ(best_slowest, 100);  // every hop on an NVLink bridge
  // The naive ring sends 0->1 and 2->3 over the shared switch: 31.5 GB/s PCIe links.
  EXPECT_LT(naive_slowest, 40);

  // And the order matters for the step: the naive order is slower.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=8,hidden=1024,heads=8,vocab=1024");
  const StepInputs in{m, c, {4096, 1}, model::precision_policy("bf16-mixed")};
  RingTrackParams p;
  p.ring = 4;
  p.chunk = 256;
  p.kv = Placement::hbm;
  p.acts = ActivationPolicy::hbm;
  RingTrackPlan chosen = build_ringtrack(in, p);
  EXPECT_EQ(chosen.rings[0], best);
  EXPECT_NE(chosen.describe().find("gpu0 -> gpu2 -> gpu1 -> gpu3 -> gpu0"), std::string::npos);
  p.ring_order = naive;
  RingTrackPlan plain = build_ringtrack(in, p);
  const auto fast = run(chosen.graph, c), slow = run(plain.graph, c);
  ASSERT_TRUE(fast.completed && slow.completed) << (fast.oom ? fast.oom->describe(chosen.graph) : fast.stuck);
  EXPECT_LT(fast.step_ns, slow.step_ns);
}

TEST(RingTrack, BadParametersNameTheirFlag) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,vocab=1024");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {4096, 1}, model::precision_policy("bf16-mixed")};
  auto flag_of = [&](RingTrackParams p) -> std::string {
    try {
      build_ringtrack(in, p);
    } catch (const InputError& e) {
      return e.origin();
    }
    return "no error";
  };
  RingTrackParams ok;
  ok.ring = 4;
  ok.chunk = 1024;
  EXPECT_EQ(flag_of(ok), "no error");
  auto with = [&](auto change) {
    RingTrackParams p = ok;
    change(p);
    return flag_of(p);
  };
  EXPECT_EQ(with([](RingTrackParams& p) { p.ring = 3; }), "--ring");
  EXPECT_EQ(with([](RingTrackParams& p) { p.block = 2; }), "--ring");  // 2 blocks of 2 layers for 4 GPUs
  EXPECT_EQ(with([](RingTrackParams& p) { p.block = 5; }), "--block");
  EXPECT_EQ(with([](RingTrackParams& p) { p.chunk = 1000; }), "--chunk");
  EXPECT_EQ(with([](RingTrackParams& p) { p.prefetch = 0; }), "--prefetch");
  EXPECT_EQ(with([](RingTrackParams& p) { p.weights = WeightPolicy::stream; }), "--weights");
  EXPECT_EQ(with([](RingTrackParams& p) { p.ring_order = {0, 1, 1, 3}; }), "--ring-order");
  EXPECT_EQ(with([](RingTrackParams& p) { p.ring = 2; }), "--global-batch");  // 2 replicas, 1 sequence
}

}  // namespace trainyard::planner
