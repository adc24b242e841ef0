// The executor's numerical half on the CPU: a ring-track step run task by task with real tensors gives the same
// loss and gradients whether it is chunked and offloaded or not, its gradients match finite differences, the
// dataflow checks catch a plan that lacks a copy or orders a read by chance, and a small model learns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "backend/model_state.hpp"
#include "backend/reference_step.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/model.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "planner/schemes/zero_family/zero.hpp"
#include "tests/backend_fixtures.hpp"
#include "tests/test_support.hpp"

namespace trainyard::backend {

namespace {

using test::chunked_offloaded;
using test::one_gpu;
using test::tiny_model;

const std::string kData = TRAINYARD_TEST_DATA_DIR;

struct Step {
  sim::TaskGraph graph;
  std::int64_t chunk = 0;
  int gpus_per_node = 1;
};

Step ringtrack_step(const model::ModelConfig& m, const sim::Cluster& cluster, std::int64_t seq, std::int64_t batch,
                    const planner::RingTrackParams& p) {
  const planner::StepInputs in{m, cluster, {seq, batch}, model::precision_policy("bf16-mixed")};
  Step s{planner::build_ringtrack(in, p).graph, p.chunk, cluster.topology.gpus_per_node()};
  sim::validate(s.graph, cluster.gpus(), cluster.nodes, "test");
  return s;
}

planner::RingTrackParams unchunked(std::int64_t seq) {
  planner::RingTrackParams p;
  p.chunk = seq;
  p.kv = planner::Placement::hbm;
  p.acts = planner::ActivationPolicy::hbm;
  return p;
}

struct Outcome {
  ReferenceResult result;
  std::unique_ptr<ModelState> state;  // the gradients of the step
};

Outcome run(const Step& step, const model::ModelConfig& m, const std::vector<std::vector<std::int32_t>>& tokens, ReferenceOptions options = {},
            std::uint64_t seed = 7) {
  Outcome o{{}, std::make_unique<ModelState>(m, seed)};
  o.result = run_reference_step(step.graph, *o.state, step.gpus_per_node, tokens, options);
  return o;
}

double gradient_difference(const Outcome& a, const Outcome& b) { return max_gradient_difference(*a.state, *b.state); }

}  // namespace

TEST(ReferenceStep, ChunkedOffloadedRingTrackMatchesTheUnchunkedStep) {
  const auto m = tiny_model();
  const std::int64_t seq = 128;  // 8 chunks of 16: up to 4 K/V blocks through 2 buffers, so the buffers are reused
  const auto tokens = random_windows(m.vocab, seq, 1, 3);
  const Outcome plain = run(ringtrack_step(m, one_gpu(), seq, 1, unchunked(seq)), m, tokens);
  for (auto acts : {planner::ActivationPolicy::dram, planner::ActivationPolicy::recompute, planner::ActivationPolicy::hbm}) {
    const Outcome chunked = run(ringtrack_step(m, one_gpu(), seq, 1, chunked_offloaded(acts)), m, tokens);
    SCOPED_TRACE(static_cast<int>(acts));
    EXPECT_TRUE(chunked.result.race_checked);
    EXPECT_GT(chunked.result.reads_checked, 500);
    EXPECT_NEAR(chunked.result.loss, plain.result.loss, 2e-3 * plain.result.loss);
    // bf16 storage rounds differently when the work is cut differently: a few bf16 ulps of the largest gradient.
    EXPECT_LT(gradient_difference(chunked, plain), 0.03);
  }
  // Near log(vocab) for random weights: the step computes a real loss.
  EXPECT_NEAR(plain.result.loss, std::log(61.0), 0.2);
}

// A graph runs only on the sequences it was built for: tokens of another length, even a multiple of the chunk, are
// refused by name (TaskGraph::sequence_tokens), as is a graph whose builder did not say its length.
TEST(ReferenceStep, RunsOnlyOnSequencesOfTheGraphsLength) {
  const auto m = tiny_model();
  const Step step = ringtrack_step(m, one_gpu(), 64, 1, chunked_offloaded());
  EXPECT_EQ(step.graph.sequence_tokens(), 64);
  EXPECT_NO_THROW(run(step, m, random_windows(m.vocab, 64, 1, 3)));
  const std::string longer = test::error_of([&] { run(step, m, random_windows(m.vocab, 128, 1, 3)); });
  EXPECT_NE(longer.find("64 tokens, the graph's sequence"), std::string::npos) << longer;
  Step unsaid{step.graph, step.chunk, step.gpus_per_node};
  unsaid.graph.set_sequence_tokens(0);
  const std::string none = test::error_of([&] { run(unsaid, m, random_windows(m.vocab, 64, 1, 3)); });
  EXPECT_NE(none.find("chunk and sequence length"), std::string::npos) << none;
}

TEST(ReferenceStep, WithoutBf16RoundingChunkingChangesNothingButSummationOrder) {
  const auto m = tiny_model(true);
  const std::int64_t seq = 64;
  const auto tokens = random_windows(m.vocab, seq, 1, 5);
  ReferenceOptions exact;
  exact.emulate_bf16 = false;
  const Outcome plain = run(ringtrack_step(m, one_gpu(), seq, 1, unchunked(seq)), m, tokens, exact);
  const Outcome chunked = run(ringtrack_step(m, one_gpu(), seq, 1, chunked_offloaded()), m, tokens, exact);
  EXPECT_NEAR(chunked.result.loss, plain.result.loss, 1e-5 * plain.result.loss);
  EXPECT_LT(gradient_difference(chunked, plain), 1e-4);
}

// Central differences of the loss against the analytic gradient at the largest entry of every block of every
// parameter (wqkv's q, k and v rows and wup's gate and up rows apart, so RoPE's and attention's backward through
// dQ and dK are checked too), on a two-sequence step (the loss scaling), untied and tied.
TEST(ReferenceStep, GradientsMatchFiniteDifferences) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const auto m = tiny_model(tied);
    const std::int64_t seq = 32;
    const auto tokens = random_windows(m.vocab, seq, 2, 11);
    const Step step = ringtrack_step(m, one_gpu(), seq, 2, chunked_offloaded());
    ReferenceOptions exact;
    exact.emulate_bf16 = false;
    ModelState state(m, 13);
    run_reference_step(step.graph, state, step.gpus_per_node, tokens, exact);
    std::vector<std::vector<float>> analytic;  // kept: every run below overwrites the gradients
    for (const Parameter* p : state.all()) analytic.push_back(p->grad);
    int checked = 0;
    const auto params = state.all();
    for (std::size_t i = 0; i < params.size(); ++i) {
      Parameter* p = params[i];
      const auto cuts = gradient_blocks(m, *p);
      for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
        const auto& g = analytic[i];
        std::size_t at = cuts[c];
        for (std::size_t j = cuts[c]; j < cuts[c + 1]; ++j) {
          if (std::abs(g[j]) > std::abs(g[at])) at = j;
        }
        const double expected = g[at];
        const float original = p->weight[at];
        const float eps = 1e-2f * std::max(1.0f, std::abs(original));
        auto loss_at = [&](float w) {
          p->weight[at] = w;
          const double loss = run_reference_step(step.graph, state, step.gpus_per_node, tokens, exact).loss;
          p->weight[at] = original;
          return loss;
        };
        const double numeric = (loss_at(original + eps) - loss_at(original - eps)) / (2.0 * eps);
        EXPECT_NEAR(expected, numeric, 0.02 * std::abs(expected) + 2e-5) << p->name << " block " << c << " [" << at << "]";
        ++checked;
      }
    }
    EXPECT_GE(checked, 20);
  }
}

TEST(ReferenceStep, RingOfTwoGpusAndDataParallelReplicasGiveTheSameStep) {
  const auto m = tiny_model();
  const std::int64_t seq = 64;
  const auto tokens = random_windows(m.vocab, seq, 2, 17);
  const sim::Cluster four(hw::load_node(kData + "/tiny-node.json"), 1);
  const Outcome single = run(ringtrack_step(m, one_gpu(), seq, 2, unchunked(seq)), m, tokens);
  planner::RingTrackParams ring = chunked_offloaded();
  ring.ring = 2;  // 2 GPUs per ring, 2 replicas with one sequence each: sends between GPUs and a gradient all-reduce
  ring.ring_order = {0, 1};
  const Outcome split = run(ringtrack_step(m, four, seq, 2, ring), m, tokens);
  EXPECT_NEAR(split.result.loss, single.result.loss, 2e-3 * single.result.loss);
  EXPECT_LT(gradient_difference(split, single), 0.03);
  EXPECT_EQ(split.result.tokens, 2 * seq);
}

// Megatron's builder is independent of ring-track's: the same step through both must agree.
TEST(ReferenceStep, MegatronStepsEqualTheRingTrackStep) {
  const auto m = tiny_model();
  const std::int64_t seq = 64;
  const auto tokens = random_windows(m.vocab, seq, 2, 29);
  const Outcome ringtrack = run(ringtrack_step(m, one_gpu(), seq, 2, chunked_offloaded()), m, tokens);
  auto megatron = [&](const sim::Cluster& cluster, const planner::MegatronParams& p) {
    const planner::StepInputs in{m, cluster, {seq, 2}, model::precision_policy("bf16-mixed")};
    Step s{planner::build_megatron(in, p), seq, cluster.topology.gpus_per_node()};
    sim::validate(s.graph, cluster.gpus(), cluster.nodes, "test");
    return run(s, m, tokens);
  };
  const Outcome plain = megatron(one_gpu(), {});  // one GPU, two micro-batches
  EXPECT_NEAR(plain.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
  planner::MegatronParams both_at_once;  // one micro-batch of both sequences: each op covers the two
  both_at_once.micro_batch = 2;
  both_at_once.recompute = planner::Recompute::full;
  const Outcome batched = megatron(one_gpu(), both_at_once);
  EXPECT_NEAR(batched.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
  EXPECT_LT(gradient_difference(batched, ringtrack), 0.03);
  EXPECT_LT(gradient_difference(plain, ringtrack), 0.03);
  // Two pipeline stages x two data-parallel replicas, full recompute from checkpoints offloaded to host DRAM.
  planner::MegatronParams p;
  p.pp = 2;
  p.dp = 2;
  p.recompute = planner::Recompute::full;
  p.offload_activations = true;
  const Outcome piped = megatron(sim::Cluster(hw::load_node(kData + "/tiny-node.json"), 1), p);
  EXPECT_TRUE(piped.result.race_checked);
  EXPECT_NEAR(piped.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
  EXPECT_LT(gradient_difference(piped, ringtrack), 0.03);
  // Context parallelism (Megatron's zigzag ring) over 2 GPUs x 2 replicas, selective recompute.
  planner::MegatronParams cp;
  cp.cp = 2;
  cp.dp = 2;
  cp.recompute = planner::Recompute::selective;
  const Outcome rings = megatron(sim::Cluster(hw::load_node(kData + "/tiny-node.json"), 1), cp);
  EXPECT_NEAR(rings.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
  EXPECT_LT(gradient_difference(rings, ringtrack), 0.03);
  // The same by all-to-alls (Megatron's a2a comm type: each rank's two zigzag chunks to a head group and back).
  cp.cp_comm = planner::CpComm::a2a;
  const Outcome heads = megatron(sim::Cluster(hw::load_node(kData + "/tiny-node.json"), 1), cp);
  EXPECT_NEAR(heads.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
  EXPECT_LT(gradient_difference(heads, ringtrack), 0.03);
  // Hierarchical (a2a+p2p) over 4 GPUs: all-to-alls inside 2 groups of 2, then a ring of 2 over the groups, each
  // block its group's 2 chunks and their mirrors in one head group.
  planner::MegatronParams hierarchical;
  hierarchical.cp = 4;
  hierarchical.cp_comm = planner::CpComm::a2a_p2p;
  hierarchical.cp_a2a = 2;
  const Outcome both = megatron(sim::Cluster(hw::load_node(kData + "/tiny-node.json"), 1), hierarchical);
  EXPECT_TRUE(both.result.race_checked);
  EXPECT_NEAR(both.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
  EXPECT_LT(gradient_difference(both, ringtrack), 0.03);
}

namespace {

// Each ZeRO-family plan's step on 4 GPUs (all on this one rank) against the one-GPU ring-track step's loss and
// gradients on the same 4 sequences.
void expect_zero_family_steps_equal_the_ringtrack_step(const std::vector<std::pair<std::string, planner::ZeroParams>>& plans,
                                                       std::uint64_t token_seed) {
  const auto m = tiny_model(true);
  const std::int64_t seq = 32;
  const auto tokens = random_windows(m.vocab, seq, 4, token_seed);
  const Outcome ringtrack = run(ringtrack_step(m, one_gpu(), seq, 4, unchunked(seq)), m, tokens);
  const sim::Cluster four(hw::load_node(kData + "/tiny-node.json"), 1);
  const planner::StepInputs in{m, four, {seq, 4}, model::precision_policy("bf16-mixed")};
  for (const auto& [name, p] : plans) {
    SCOPED_TRACE(name);
    Step s{planner::build_zero(in, p), seq, four.topology.gpus_per_node()};
    sim::validate(s.graph, four.gpus(), four.nodes, "test");
    const Outcome step = run(s, m, tokens);
    EXPECT_TRUE(step.result.race_checked);
    EXPECT_NEAR(step.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
    EXPECT_LT(gradient_difference(step, ringtrack), 0.03);
  }
}

}  // namespace

// ZeRO's step is the model's: data parallelism, whatever it shards, offloads or recomputes.
TEST(ReferenceStep, ZeroStepsEqualTheRingTrackStep) {
  planner::ZeroParams offloaded;
  offloaded.stage = 3;
  offloaded.offload_activations = offloaded.offload_optimizer = offloaded.offload_grads = offloaded.offload_params = true;
  expect_zero_family_steps_equal_the_ringtrack_step({{"stage 0", planner::ZeroParams{}}, {"stage 3, everything offloaded", offloaded}}, 61);
}

// A micro-batch of both sequences on one GPU: every op covers the two (sim::Op::seq_count), the LM head's pieces
// their rows end to end.
TEST(ReferenceStep, AZeroMicroBatchOfTwoSequencesEqualsTheRingTrackStep) {
  const auto m = tiny_model();
  const std::int64_t seq = 64;
  const auto tokens = random_windows(m.vocab, seq, 2, 31);
  const Outcome ringtrack = run(ringtrack_step(m, one_gpu(), seq, 2, chunked_offloaded()), m, tokens);
  planner::ZeroParams p;
  p.micro_batch = 2;
  p.activation_checkpointing = true;
  const planner::StepInputs in{m, one_gpu(), {seq, 2}, model::precision_policy("bf16-mixed")};
  Step s{planner::build_zero(in, p), seq, one_gpu().topology.gpus_per_node()};
  const auto& tasks = s.graph.tasks();
  EXPECT_TRUE(std::any_of(tasks.begin(), tasks.end(), [](const sim::Task& t) { return t.op.seq_count == 2; }));
  const Outcome batched = run(s, m, tokens);
  EXPECT_NEAR(batched.result.loss, ringtrack.result.loss, 2e-3 * ringtrack.result.loss);
  EXPECT_LT(gradient_difference(batched, ringtrack), 0.03);
}

namespace {

// cp 2 on two replicas with checkpointed layers and ZeRO-3, and cp 4 on one sequence with ZeRO-1.
std::vector<std::pair<std::string, planner::ZeroParams>> ring_attention_plans(bool zigzag) {
  planner::ZeroParams pairs, one_ring;
  pairs.cp = 2;
  pairs.stage = 3;
  pairs.activation_checkpointing = true;
  one_ring.cp = 4;
  one_ring.stage = 1;
  pairs.zigzag = one_ring.zigzag = zigzag;
  const std::string how = zigzag ? " zigzag" : "";
  return {{"cp 2" + how + " x 2 replicas, ZeRO-3, checkpointed", pairs}, {"cp 4" + how + ", ZeRO-1", one_ring}};
}

}  // namespace

// Ring attention: each of cp GPUs holds one chunk of the sequence, K/V pass round the ring, and the dK | dV
// accumulators follow the ranks that compute on them and come home: the step equals the plain one.
TEST(ReferenceStep, RingAttentionStepsEqualTheRingTrackStep) { expect_zero_family_steps_equal_the_ringtrack_step(ring_attention_plans(false), 67); }

// Zigzag: each cp rank holds a chunk and its mirror (8 chunks of 4 tokens for cp 4), and the ring's blocks pass
// both; a rank computes only the pairs its mask leaves, and an accumulator part nothing added to arrives as zeros.
TEST(ReferenceStep, ZigzagRingAttentionStepsEqualTheRingTrackStep) {
  expect_zero_family_steps_equal_the_ringtrack_step(ring_attention_plans(true), 67);
}

// DeepSpeed-Ulysses: rank i of an sp group holds chunk i and, around attention, head group i of the whole sequence
// (the all-to-alls move Q, K, V and dO to head groups, the output and dQ, dK | dV back). FPDT: attention in chunks
// of 8 of the 32 tokens, each chunk against itself and every earlier one in FPDT's order (backward: K/V chunk
// outermost), on that Ulysses (each sp rank's ops over its run of 2 chunks) or alone (sp 1: every rank's ops over
// all 4); its streamed buffers move no values.
TEST(ReferenceStep, UlyssesAndFpdtStepsEqualTheRingTrackStep) {
  planner::ZeroParams pairs, offloaded;
  pairs.sp = 2;
  pairs.stage = 3;
  pairs.activation_checkpointing = true;
  offloaded.sp = 2;
  offloaded.stage = 2;
  offloaded.offload_activations = offloaded.offload_optimizer = true;
  planner::ZeroParams fpdt = pairs, fpdt_alone = pairs;
  fpdt.fpdt_chunk = fpdt_alone.fpdt_chunk = 8;
  fpdt_alone.sp = 1;
  fpdt_alone.stage = 1;
  expect_zero_family_steps_equal_the_ringtrack_step({{"sp 2 x 2 replicas, ZeRO-3, checkpointed", pairs},
                                                     {"sp 2 x 2, ZeRO-2, checkpoints and optimizer offloaded", offloaded},
                                                     {"FPDT sp 2 x 2 replicas, ZeRO-3", fpdt},
                                                     {"FPDT sp 1 x 4 replicas, ZeRO-1", fpdt_alone}},
                                                    83);
}

namespace {

// The reference's error for a ZeRO-family step on the 4-GPU tiny node with the edges `cut` says taken out (at
// least one must be); empty, with a failure, when the step runs.
std::string error_without_edges(const planner::ZeroParams& p, std::int64_t sequences, const std::function<bool(const sim::Op&, const sim::Op&)>& cut,
                                std::uint64_t token_seed) {
  const auto m = tiny_model(true);
  const std::int64_t seq = 32;
  const sim::Cluster four(hw::load_node(kData + "/tiny-node.json"), 1);
  const planner::StepInputs in{m, four, {seq, sequences}, model::precision_policy("bf16-mixed")};
  const sim::TaskGraph good = planner::build_zero(in, p);
  int dropped = 0;
  sim::TaskGraph broken = test::rebuilt(
      good, [](sim::TaskId, sim::Task&) {},
      [&](sim::TaskId before, sim::TaskId after) {
        const bool drop = cut(good.task(before).op, good.task(after).op);
        dropped += drop ? 1 : 0;
        return !drop;
      });
  EXPECT_GT(dropped, 0);
  sim::validate(broken, four.gpus(), four.nodes, "test");
  Step s{std::move(broken), seq, four.topology.gpus_per_node()};
  try {
    run(s, m, random_windows(m.vocab, seq, sequences, token_seed));
  } catch (const InternalError& e) {
    return e.what();
  }
  ADD_FAILURE() << "the step ran without the edges";
  return "";
}

}  // namespace

// Without the edges from the all-to-all that brings Q, K and V to the head groups, attention reads them before
// they arrive: the reference names the missing tensor.
TEST(ReferenceStep, AUlyssesAttentionNotOrderedAfterItsAllToAllIsCaught) {
  planner::ZeroParams p;
  p.sp = 2;
  const std::string what = error_without_edges(
      p, 2,
      [](const sim::Op& before, const sim::Op& after) {
        return before.code == sim::OpCode::heads_qkv && after.code == sim::OpCode::attn && after.layer == 1;
      },
      89);
  EXPECT_NE(what.find("of layer 1"), std::string::npos) << what;
  EXPECT_NE(what.find("head group"), std::string::npos) << what;
}

// The dK | dV accumulators' order: without the edge from the pass that brings a chunk's accumulator home to the
// owner's add (of layer 1), the add reads what arrives by chance of the order only, which the reference calls a race.
TEST(ReferenceStep, ARingAttentionAddNotOrderedAfterItsAccumulatorIsCaught) {
  planner::ZeroParams p;
  p.cp = 4;
  const std::string what = error_without_edges(
      p, 1,
      [](const sim::Op& pass, const sim::Op& add) {
        return pass.code == sim::OpCode::dkv_pass && add.code == sim::OpCode::dkv_add && add.layer == 1 && add.chunk == add.kv_first;
      },
      71);
  EXPECT_NE(what.find("a race"), std::string::npos) << what;
  EXPECT_NE(what.find("received dK|dV accumulator of layer 1"), std::string::npos) << what;
}

// ZeRO-2 reduces each group every micro-batch, in place: the next micro-batch's gradient writers must wait for
// that reduction. The built graph orders them and runs; without those edges the reference calls it a race.
TEST(ReferenceStep, AGradientWriterNotOrderedAfterItsGroupsReductionIsCaught) {
  const auto m = tiny_model(true);
  const std::int64_t seq = 32;
  const sim::Cluster four(hw::load_node(kData + "/tiny-node.json"), 1);
  planner::ZeroParams p;
  p.stage = 2;
  const planner::StepInputs in{m, four, {seq, 8}, model::precision_policy("bf16-mixed")};
  const sim::TaskGraph good = planner::build_zero(in, p);
  const auto tokens = random_windows(m.vocab, seq, 8, 79);
  EXPECT_NO_THROW(run(Step{good, seq, four.topology.gpus_per_node()}, m, tokens));
  int dropped = 0;
  sim::TaskGraph broken = test::rebuilt(
      good, [](sim::TaskId, sim::Task&) {},
      [&](sim::TaskId before, sim::TaskId after) {
        // a reduction the next micro-batch's compute waits for
        const bool awaited = good.task(before).op.carries_gradients() && good.task(after).stream.kind == sim::StreamKind::compute;
        dropped += awaited ? 1 : 0;
        return !awaited;
      });
  ASSERT_GT(dropped, 0);
  try {
    run(Step{std::move(broken), seq, four.topology.gpus_per_node()}, m, tokens);
    FAIL() << "the unordered gradient writer ran";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("may still be reducing: a race"), std::string::npos) << e.what();
  }
}

TEST(ReferenceStep, APlanThatLacksACopyOrOrdersAReadByChanceIsCaught) {
  const auto m = tiny_model();
  const std::int64_t seq = 64;
  const auto tokens = random_windows(m.vocab, seq, 1, 19);
  const auto p = chunked_offloaded();
  const planner::StepInputs in{m, one_gpu(), {seq, 1}, model::precision_policy("bf16-mixed")};

  // Drop the copy that brings chunk 0's K/V back for chunk 1's attention: the read finds no K/V in HBM.
  {
    const sim::TaskGraph good = planner::build_ringtrack(in, p).graph;
    sim::TaskGraph broken;
    broken.set_chunk_tokens(good.chunk_tokens());
    broken.set_sequence_tokens(good.sequence_tokens());
    sim::TaskId removed = -1;
    for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(good.size()); ++id) {
      const auto& t = good.task(id);
      if (removed < 0 && t.kind() == sim::TaskKind::copy && t.op.code == sim::OpCode::kv && t.op.layer == 1 && t.op.chunk == 1 &&
          std::get<sim::Copy>(t.params).direction == sim::Copy::Direction::h2d) {
        removed = id;
        sim::Task states_copy = t;  // keep the ids: the copy becomes a copy of model states, which carries no values
        states_copy.op = {sim::OpCode::states};
        broken.add(good.name(id), states_copy);
        continue;
      }
      broken.add(good.name(id), t);
    }
    for (const auto& [a, b] : good.edges()) broken.add_dependency(a, b);
    ASSERT_GE(removed, 0);
    ModelState state(m, 1);
    try {
      run_reference_step(broken, state, 1, tokens);
      FAIL() << "the missing copy was not caught";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("does not hold it"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("layer 1 chunk 0"), std::string::npos) << e.what();
    }
  }
  // Drop the dependency of a K/V reload on the D2H that wrote that K/V to the host: sequential order still works,
  // but on a GPU the reload could overtake the write.
  {
    const sim::TaskGraph good = planner::build_ringtrack(in, p).graph;
    sim::TaskGraph broken;
    broken.set_chunk_tokens(good.chunk_tokens());
    broken.set_sequence_tokens(good.sequence_tokens());
    for (const auto& t : good.tasks()) broken.add(good.name_of(t), t);
    int dropped = 0;
    for (const auto& [a, b] : good.edges()) {
      const auto& from = good.task(a);
      const auto& to = good.task(b);
      const bool d2h_kv = from.kind() == sim::TaskKind::copy && from.op.code == sim::OpCode::kv &&
                          std::get<sim::Copy>(from.params).direction == sim::Copy::Direction::d2h;
      const bool h2d_kv = to.kind() == sim::TaskKind::copy && to.op.code == sim::OpCode::kv &&
                          std::get<sim::Copy>(to.params).direction == sim::Copy::Direction::h2d;
      if (d2h_kv && h2d_kv && from.op.layer == 0 && from.op.chunk == 0 && to.op.chunk == 1 && good.name(b)[0] == 'F') {  // forward's reload
        ++dropped;
        continue;
      }
      broken.add_dependency(a, b);
    }
    ASSERT_EQ(dropped, 1);
    ModelState state(m, 1);
    try {
      run_reference_step(broken, state, 1, tokens);
      FAIL() << "the race was not caught";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("a race"), std::string::npos) << e.what();
    }
  }
}

TEST(ReferenceStep, RefusesGraphsWhoseTasksDoNotSayWhatTheyAre) {
  const auto m = tiny_model();
  sim::TaskGraph g;
  g.gemm("a gemm", 0, {16, 16, 16});
  ModelState state(m, 1);
  const auto tokens = random_windows(m.vocab, 16, 1, 1);
  EXPECT_THROW(run_reference_step(g, state, 1, tokens), InputError);
}

TEST(ReferenceStep, ASmallModelLearnsRepeatedText) {
  const auto m = tiny_model();
  const std::int64_t seq = 32;
  const Step step = ringtrack_step(m, one_gpu(), seq, 1, chunked_offloaded());
  // A short repeating text: a model that learns anything lowers the loss on it quickly.
  std::vector<std::vector<std::int32_t>> tokens(1);
  for (int i = 0; i <= seq; ++i) tokens[0].push_back((i * 7) % 13);
  ModelState state(m, 23);
  ReferenceOptions o;
  o.run_optimizer = true;
  o.adam.lr = 1e-2f;
  o.adam.weight_decay = 0;
  double first = 0, last = 0;
  for (int s = 1; s <= 30; ++s) {
    o.optimizer_step = s;
    const double loss = run_reference_step(step.graph, state, step.gpus_per_node, tokens, o).loss;
    if (s == 1) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.5 * first);
}

}  // namespace trainyard::backend
