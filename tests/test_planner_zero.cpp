// ZeRO stages, offload and Ulysses as task graphs.
#include <gtest/gtest.h>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/zero_family/zero.hpp"
#include "planner/search.hpp"
#include "sim/cost_model.hpp"
#include "test_support.hpp"

namespace trainyard::planner {

namespace {

struct Counts {
  int all_gathers = 0, reduce_scatters = 0, all_reduces = 0, all_to_alls = 0, h2d = 0, d2h = 0, host_steps = 0;
  double a2a_bytes = 0;
};

Counts count(const sim::TaskGraph& g) {
  Counts c;
  for (const auto& t : g.tasks()) {
    if (const auto* col = std::get_if<sim::Collective>(&t.params)) {
      c.all_gathers += col->op == sim::CollectiveOp::all_gather;
      c.reduce_scatters += col->op == sim::CollectiveOp::reduce_scatter;
      c.all_reduces += col->op == sim::CollectiveOp::all_reduce;
      if (col->op == sim::CollectiveOp::all_to_all) {
        ++c.all_to_alls;
        c.a2a_bytes += static_cast<double>(col->bytes);
      }
    } else if (const auto* copy = std::get_if<sim::Copy>(&t.params)) {
      (copy->direction == sim::Copy::Direction::h2d ? c.h2d : c.d2h) += 1;
    } else if (t.kind() == sim::TaskKind::optimizer && sim::is_host(t.device)) {
      ++c.host_steps;
    }
  }
  return c;
}

std::int64_t alloc_bytes(const sim::TaskGraph& g, const std::string& name) {
  for (const auto& t : g.tasks()) {
    if (g.name_of(t) == name) return std::get<sim::Alloc>(t.params).bytes;
  }
  return -1;
}

sim::SimResult run(sim::TaskGraph& g, const sim::Cluster& c) { return test::simulate_built(g, c, "zero"); }

}  // namespace

TEST(Zero, StagesShardModelStatesAndPickTheirCollectives) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=1024,heads=16,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {1024, 8}, model::precision_policy("bf16-mixed")};  // 2 micro-batches per GPU
  const double p = m.params();
  std::vector<std::int64_t> peak_hbm;
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(stage);
    ZeroParams z;
    z.stage = stage;
    sim::TaskGraph g = build_zero(in, z);
    // Gradients: 2 bytes per parameter, sharded from stage 2; master + Adam: 12 bytes, sharded from stage 1.
    EXPECT_NEAR(static_cast<double>(alloc_bytes(g, "grads gpu0")), 2 * (stage >= 2 ? p / 4 : p), 1);
    EXPECT_NEAR(static_cast<double>(alloc_bytes(g, "optimizer gpu0")), 12 * (stage >= 1 ? p / 4 : p), 1);
    const Counts k = count(g);
    EXPECT_EQ(k.all_gathers, stage == 3 ? 2 * 4 * 2 : (stage >= 1 ? 1 : 0));  // per layer fwd + bwd; or after the step
    // Gradients: the 4 layers', the LM head's and the embedding's; every micro-batch, or the last one only;
    // reduce-scattered where the optimizer states are sharded (stage 1 on).
    EXPECT_EQ(k.reduce_scatters, stage >= 2 ? (4 + 2) * 2 : stage == 1 ? 4 + 2 : 0);
    EXPECT_EQ(k.all_reduces, stage == 0 ? 4 + 2 : 0);
    const sim::SimResult r = run(g, c);
    EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
    peak_hbm.push_back(r.pools[0].peak_bytes);
  }
  // Each stage needs less HBM than the one before (stage 3 only if it holds few gathered layers at a time).
  for (int stage = 1; stage <= 3; ++stage) EXPECT_LT(peak_hbm[stage], peak_hbm[stage - 1]) << stage;
}

TEST(Zero, OffloadMovesStatesAndCheckpointsToHostMemory) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=1024,heads=16,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {2048, 4}, model::precision_policy("bf16-mixed")};
  ZeroParams base;
  base.stage = 3;
  base.activation_checkpointing = true;
  sim::TaskGraph plain = build_zero(in, base);
  const sim::SimResult r_plain = run(plain, c);
  ASSERT_TRUE(r_plain.completed);
  ZeroParams off = base;
  off.offload_optimizer = off.offload_grads = off.offload_params = off.offload_activations = true;
  sim::TaskGraph g = build_zero(in, off);
  const Counts k = count(g);
  EXPECT_EQ(k.host_steps, 4);       // the AdamW step of each GPU's shard runs on the host
  EXPECT_EQ(k.d2h, 4 * 4 + 4 * 4);  // checkpoints (4 layers x 4 GPUs, 1 micro-batch) and gradient shards
  EXPECT_GT(k.h2d, 4 * 4);          // checkpoints back, parameter shards before each gather
  const sim::SimResult r = run(g, c);
  ASSERT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
  EXPECT_GT(r.pools[4].peak_bytes, 0);                            // host DRAM holds states and checkpoints
  EXPECT_LT(r.pools[0].peak_bytes, r_plain.pools[0].peak_bytes);  // and HBM holds less
  EXPECT_GT(r.step_ns, r_plain.step_ns);                          // at the price of PCIe traffic
}

TEST(Ulysses, AllToAllBytesMatchTheFormula) {
  // DeepSpeed-Ulysses moves q, k, v before attention and the output after: 4 b S h / P elements per GPU per
  // layer forward for multi-head attention, 2 bytes each; backward moves the same.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=1024,heads=16,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {4096, 1}, model::precision_policy("bf16-mixed")};
  ZeroParams z;
  z.sp = 4;
  z.stage = 3;
  z.activation_checkpointing = true;
  sim::TaskGraph g = build_zero(in, z);
  const Counts k = count(g);
  const double per_layer = 2.0 * 4 * 4096 * 1024 / 4;
  LayerSplit split{1, 4096, 1, false, false};
  split.ulysses = 4;
  EXPECT_DOUBLE_EQ(ulysses_bytes_per_layer_forward(m, split), per_layer);
  // 2 layers x (forward + recomputed forward + backward), two all-to-alls each.
  EXPECT_EQ(k.all_to_alls, 2 * 3 * 2);
  EXPECT_DOUBLE_EQ(k.a2a_bytes, 2 * 3 * per_layer);
  const sim::SimResult r = run(g, c);
  EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
}

// torchtitan's selective layer AC: every other layer checkpointed, so half the layers run their forward again
// and the others keep their full activations.
TEST(Zero, CheckpointingEveryOtherLayerRecomputesHalf) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=1024,heads=16,vocab=1024");
  const sim::Cluster c(hw::load_node("dgx-a100"), 1, test::ideal_stack());
  const StepInputs in{m, c, {4096, 8}, model::precision_policy("bf16-mixed")};
  ZeroParams none, every, other;
  every.activation_checkpointing = other.activation_checkpointing = true;
  other.checkpoint_every = 2;
  EXPECT_EQ(other.checkpointed_layers(4), 2);
  EXPECT_FALSE(other.checkpoints_layer(0));
  EXPECT_TRUE(other.checkpoints_layer(1));
  auto recomputed = [&](const ZeroParams& z) {
    sim::TaskGraph g = build_zero(in, z);
    int n = 0;
    for (const auto& t : g.tasks()) n += t.recompute && t.kind() == sim::TaskKind::gemm;
    const sim::SimResult r = run(g, c);
    EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
    return std::pair{n, r};
  };
  const auto [n_none, r_none] = recomputed(none);
  const auto [n_every, r_every] = recomputed(every);
  const auto [n_other, r_other] = recomputed(other);
  EXPECT_EQ(n_none, 0);
  EXPECT_GT(n_every, 0);
  EXPECT_EQ(2 * n_other, n_every);
  EXPECT_LT(r_every.step_ns, r_none.step_ns * 2);
  EXPECT_GT(r_other.step_ns, r_none.step_ns);
  EXPECT_LT(r_other.step_ns, r_every.step_ns);
  EXPECT_LT(r_every.pools[0].peak_bytes, r_other.pools[0].peak_bytes);
  EXPECT_LT(r_other.pools[0].peak_bytes, r_none.pools[0].peak_bytes);
  other.checkpoint_every = 5;  // more than the model's layers
  EXPECT_NE(test::error_of([&] { build_zero(in, other); }).find("--recompute"), std::string::npos);
}

TEST(Zero, BadParametersNameTheirFlag) {
  const model::ModelConfig m = model::load_model("llama3-8b");
  const sim::Cluster c(hw::load_node("dgx-a100"), 1);
  const StepInputs in{m, c, {65536, 1}, model::precision_policy("bf16-mixed")};
  auto error = [&](ZeroParams p) {
    try {
      check_zero(in, p);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ZeroParams p;
  p.sp = 8;
  EXPECT_EQ(error(p), "");
  p.sp = 3;
  EXPECT_NE(error(p).find("--sp"), std::string::npos);
  p.sp = 8;
  p.offload_params = true;
  EXPECT_NE(error(p).find("--zero-stage 3"), std::string::npos);
  p = {};
  EXPECT_NE(error(p).find("--global-batch"), std::string::npos);  // 1 sequence cannot feed 8 data-parallel GPUs
}

}  // namespace trainyard::planner

namespace trainyard::planner {

TEST(RingAttention, PassesKvBlocksRoundTheRingAndZigzagBalancesTheWork) {
  // cp = 4, one sequence of 8K tokens: every layer's forward passes K and V (2 x 2K tokens x kv_dim x 2 bytes)
  // three times round the ring, backward also the fp32 dK, dV. Without zigzag rank r computes r + 1 blocks, so
  // the last rank is the busiest; zigzag gives every rank the same work.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=1024,heads=16,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {8192, 1}, model::precision_policy("bf16-mixed")};
  LayerSplit split{1, 8192, 1, false, false};
  split.cp = 4;
  const double block = 2048.0 * 1024;
  EXPECT_DOUBLE_EQ(ring_bytes_per_layer(m, split, false), 3 * 2 * block * 2);
  EXPECT_DOUBLE_EQ(ring_bytes_per_layer(m, split, true), 3 * (2 * block * 2 + 2 * block * 4));
  std::vector<std::vector<double>> busy;
  for (bool zigzag : {false, true}) {
    ZeroParams z;
    z.cp = 4;
    z.zigzag = zigzag;
    sim::TaskGraph g = build_zero(in, z);
    double passed = 0;
    for (const auto& t : g.tasks()) {
      if (const auto* p2p = std::get_if<sim::PointToPoint>(&t.params); p2p && t.device == 0) passed += static_cast<double>(p2p->bytes);
    }
    // 2 layers: forward and backward passes from rank 0. With zigzag it also passes on every block's dK, dV
    // accumulator after adding its share; without, rank 0 computes on no other block, so it passes K and V only.
    const double backward_bytes = zigzag ? ring_bytes_per_layer(m, split, true) : ring_bytes_per_layer(m, split, false);
    EXPECT_NEAR(passed, 2 * (ring_bytes_per_layer(m, split, false) + backward_bytes), 8);
    const sim::SimResult r = run(g, c);
    ASSERT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
    std::vector<double> attention_ns(4, 0);
    for (sim::TaskId t = 0; t < static_cast<sim::TaskId>(g.size()); ++t) {
      if (g.task(t).kind() == sim::TaskKind::attention) {
        attention_ns[g.task(t).device] += static_cast<double>(r.timing[t].end_ns - r.timing[t].start_ns);
      }
    }
    busy.push_back(attention_ns);
  }
  EXPECT_GT(busy[0][3], 3 * busy[0][0]);            // plain: rank 3 computes 4 blocks, rank 0 one
  EXPECT_NEAR(busy[1][3] / busy[1][0], 1.0, 0.05);  // zigzag: balanced
}

}  // namespace trainyard::planner

namespace trainyard::planner {

TEST(Fpdt, ChunkedAttentionDoesTheCausalWorkAndStreamsThroughHost) {
  // One 16K sequence in 4 chunks of 4K on 4 GPUs (Ulysses sp = 4): the chunk pairs (i, j <= i) together hold
  // exactly the causal pairs of the whole sequence; K/V of each chunk goes out once and comes back once per later
  // chunk, and the copies add up to fpdt_copy_bytes.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=1,hidden=1024,heads=16,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {16384, 1}, model::precision_policy("bf16-mixed")};
  ZeroParams z;
  z.sp = 4;
  z.fpdt_chunk = 4096;
  z.stage = 3;
  z.activation_checkpointing = true;
  sim::TaskGraph g = build_zero(in, z);
  double forward_pairs_gpu0 = 0, copied_gpu0 = 0;
  int blocks_gpu0 = 0;
  for (const auto& t : g.tasks()) {
    if (t.device != 0) continue;
    if (const auto* a = std::get_if<sim::Attention>(&t.params); a && !a->backward && !t.recompute) {
      forward_pairs_gpu0 += sim::attention_pairs(*a) * a->heads;
      ++blocks_gpu0;
    }
    if (const auto* cp = std::get_if<sim::Copy>(&t.params)) copied_gpu0 += static_cast<double>(cp->bytes);
  }
  EXPECT_EQ(blocks_gpu0, 4 * 5 / 2);
  // heads per GPU = 16 / 4; causal pairs of 16K tokens.
  EXPECT_DOUBLE_EQ(forward_pairs_gpu0, 16384.0 * 16385 / 2 * 4);
  LayerSplit split{1, 16384, 1, false, false};
  split.ulysses = 4;
  split.fpdt_chunks = 4;
  // Forward, recomputed forward (AC) and backward; the layer input is not offloaded here (AC without OC).
  EXPECT_NEAR(copied_gpu0, 2 * fpdt_copy_bytes(m, split, false) + fpdt_copy_bytes(m, split, true), 64);
  const sim::SimResult r = run(g, c);
  ASSERT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
  EXPECT_GT(r.pools[4].peak_bytes, 0);  // the attention tensors wait in host DRAM
}

// A chunk of at least the whole sequence is one chunk, as DeepSpeed's FPDT takes it: the step equals the one of a
// chunk the sequence's length, and the search offers FPDT on sequences too short for two of its chunks (issue 45).
TEST(Fpdt, AChunkOfAtLeastTheSequenceIsOneChunk) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=512,heads=8,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {16384, 4}, model::precision_policy("bf16-mixed")};
  ZeroParams whole, longer;
  whole.sp = longer.sp = 2;
  whole.activation_checkpointing = longer.activation_checkpointing = true;
  whole.fpdt_chunk = 16384;
  longer.fpdt_chunk = 65536;
  check_zero(in, longer);  // no InputError
  EXPECT_EQ(zero_layer_split(in, longer).fpdt_chunks, 1);
  sim::TaskGraph a = build_zero(in, whole), b = build_zero(in, longer);
  ASSERT_EQ(a.size(), b.size());
  const sim::SimResult ra = run(a, c), rb = run(b, c);
  ASSERT_TRUE(ra.completed && rb.completed);
  EXPECT_EQ(ra.step_ns, rb.step_ns);
  // The search offers FPDT here, as one chunk (before: no configuration below 32K tokens).
  const std::vector<PlanSpec> specs = enumerate_plans(in, {"fpdt"});
  ASSERT_FALSE(specs.empty());
  for (const PlanSpec& spec : specs) EXPECT_EQ(spec.as<ZeroParams>().fpdt_chunk, 16384);
  // A chunk shorter than the sequence still has to divide it.
  ZeroParams uneven = whole;
  uneven.fpdt_chunk = 12288;
  EXPECT_NE(test::error_of([&] { check_zero(in, uneven); }).find("--chunk"), std::string::npos);
}

}  // namespace trainyard::planner
