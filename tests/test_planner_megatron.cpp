// The shared transformer decomposition and the Megatron builder against the published formulas.
#include <map>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/transformer.hpp"
#include "sim/collectives.hpp"
#include "test_support.hpp"

namespace trainyard::planner {

namespace {

// A GPT-3-like layer as Korthikanti et al. assume it: MHA, GELU with a 4h MLP.
model::ModelConfig gpt_like() { return model::parse_custom_model("custom:layers=4,hidden=1024,heads=16,activation=gelu,vocab=64"); }

}  // namespace

TEST(Activations, MatchKorthikantiPerLayer) {
  // Korthikanti et al. (2022), bytes per layer with b*s tokens and hidden h (no parallelism):
  //   34 s b h + 5 a s^2 b   (the 5as^2b term is the stored attention scores; flash attention never stores
  //                           them, which is what their selective recompute also achieves)
  //   tensor parallel t:            s b h (10 + 24 / t)
  //   tensor + sequence parallel t: s b h 34 / t
  //   full recompute:               2 s b h (/ t with sequence parallelism)
  // Flash attention also keeps the fp32 log-sum-exp: 4 bytes per token per head (per local head under TP).
  const model::ModelConfig m = gpt_like();
  const double s = 4096, b = 2, h = 1024, a = 16;
  const double lse = 4 * s * b * a;
  for (int t : {1, 2, 4, 8}) {
    SCOPED_TRACE(t);
    LayerSplit split{2, 4096, t, false, true};
    const double tp_expected = s * b * h * (10 + 24.0 / t) + lse / t;
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, split, Recompute::none).total(), tp_expected);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, split, Recompute::selective).total(), tp_expected);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, split, Recompute::full).total(), 2 * s * b * h);
    split.sequence_parallel = true;
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, split, Recompute::none).total(), s * b * h * 34 / t + lse / t);
    EXPECT_DOUBLE_EQ(layer_activation_bytes(m, split, Recompute::full).total(), 2 * s * b * h / t);
  }
  // Without dropout (how the built-in models train) the two 1-byte masks go: 32 s b h.
  EXPECT_DOUBLE_EQ(layer_activation_bytes(m, LayerSplit{2, 4096, 1, false, false}, Recompute::none).total(), 32 * s * b * h + lse);
}

TEST(Activations, SwigluAndGqaCountTheirOwnTensors) {
  // llama3-8b, one 8K sequence, no parallelism: norms 4sh + projection inputs 4sh, q 2s*4096, k and v
  // 2s*1024 each, output 2s*4096, lse 4*s*32, MLP gate/up/product 3 * 2s*14336.
  const model::ModelConfig m = model::load_model("llama3-8b");
  const double s = 8192;
  const auto a = layer_activation_bytes(m, LayerSplit{1, 8192, 1, false, false}, Recompute::none);
  EXPECT_DOUBLE_EQ(a.norms + a.projection_inputs, 8 * s * 4096);
  EXPECT_DOUBLE_EQ(a.attention, 2 * s * (4096 + 2 * 1024) + 2 * s * 4096 + 4 * s * 32);
  EXPECT_DOUBLE_EQ(a.mlp, 6 * s * 14336);
}

TEST(TensorParallel, BytesPerLayerMatchTheRingFormula) {
  // Forward: two all-reduces of the b*S*h activation (2 bytes each); a ring all-reduce sends 2(t-1)/t of the
  // buffer per GPU. Count what the emitted collectives actually send, step by step.
  const model::ModelConfig m = gpt_like();
  for (bool sp : {false, true}) {
    const LayerSplit split{2, 4096, 4, sp, false};
    sim::TaskGraph g;
    LayerEmitter layer(g, m, split, {0, 1, 2, 3});
    std::vector<sim::TaskId> last(4, -1);
    layer.forward("F L0", last);
    double sent_by_rank0 = 0;
    for (const auto& task : g.tasks()) {
      const auto* c = std::get_if<sim::Collective>(&task.params);
      if (c == nullptr) continue;
      for (int step = 0; step < sim::collective_steps(c->op, c->algorithm, 4); ++step) {
        std::vector<sim::Transfer> transfers;
        sim::collective_step(c->op, c->algorithm, 4, c->bytes, step, transfers);
        for (const auto& tr : transfers) sent_by_rank0 += tr.src_rank == 0 ? tr.bytes : 0;
      }
    }
    EXPECT_DOUBLE_EQ(sent_by_rank0, tp_bytes_per_layer_forward(m, split)) << "sequence parallel " << sp;
    EXPECT_DOUBLE_EQ(tp_bytes_per_layer_forward(m, split), 2 * 2 * 3.0 / 4 * 2 * 2 * 4096 * 1024);
  }
}

TEST(Pipeline, ScheduleIsOneForwardOneBackward) {
  // pp = 4, m = 8: stage 0 warms up with 3 forwards; the last stage alternates from the start.
  const auto first = pipeline_schedule(0, 4, 8, 1);
  ASSERT_EQ(first.size(), 16u);
  EXPECT_TRUE(first[0].forward && first[1].forward && first[2].forward && first[3].forward);
  EXPECT_FALSE(first[4].forward);
  EXPECT_EQ(first[4].micro_batch, 0);
  const auto last = pipeline_schedule(3, 4, 8, 1);
  EXPECT_TRUE(last[0].forward);
  EXPECT_FALSE(last[1].forward);
  // Interleaved: every (micro-batch, chunk) appears once forward and once backward.
  const auto inter = pipeline_schedule(1, 4, 8, 2);
  ASSERT_EQ(inter.size(), 32u);
  std::set<std::tuple<bool, std::int64_t, int>> seen;
  for (const auto& s : inter) seen.insert({s.forward, s.micro_batch, s.chunk});
  EXPECT_EQ(seen.size(), 32u);
}

// Bubble fraction of 1F1B and interleaved 1F1B: (p - 1) / (v * m) of the ideal time (Narayanan et al. 2021).
// Measured on the tiny 4-GPU node with a model whose layers dominate (vocabulary 64): the time stage 0's
// compute stream is not busy before its optimizer step, over its busy time.
TEST(Pipeline, BubbleFractionMatchesTheFormula) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=8,hidden=1024,heads=16,vocab=64");
  const sim::Cluster cluster(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  for (const auto& [vpp, micro_batches] : std::vector<std::pair<int, int>>{{1, 8}, {1, 16}, {2, 8}}) {
    SCOPED_TRACE("vpp " + std::to_string(vpp) + " m " + std::to_string(micro_batches));
    const StepInputs in{m, cluster, {1024, micro_batches}, model::precision_policy("bf16-mixed")};
    MegatronParams p;
    p.pp = 4;
    p.vpp = vpp;
    sim::TaskGraph g = build_megatron(in, p);
    sim::validate(g, cluster.gpus(), cluster.nodes, "megatron");
    g.finalize();
    const sim::SimResult r = sim::simulate(g, cluster);
    ASSERT_TRUE(r.completed) << r.stuck << (r.oom ? r.oom->describe(g) : "");
    std::int64_t busy = 0, end = 0;
    for (sim::TaskId t = 0; t < static_cast<sim::TaskId>(g.size()); ++t) {
      const auto& task = g.task(t);
      if (task.device != 0 || task.stream.kind != sim::StreamKind::compute) continue;
      if (task.kind() == sim::TaskKind::optimizer) continue;
      busy += r.timing[t].end_ns - r.timing[t].start_ns;
      end = std::max(end, r.timing[t].end_ns);
    }
    const double measured = static_cast<double>(end - busy) / static_cast<double>(busy);
    const double formula = 3.0 / (vpp * micro_batches);
    EXPECT_NEAR(measured, formula, 0.15 * formula) << "measured " << measured << " formula " << formula;
  }
}

TEST(Megatron, CheckpointOffloadMovesCheckpointsToHost) {
  // Full recompute keeps each layer's input; with OC those inputs live in host DRAM, copied out after each
  // layer's forward and back before its backward: HBM peaks lower, host DRAM holds the checkpoints.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=8,hidden=1024,heads=16,vocab=64");
  const sim::Cluster cluster(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, cluster, {8192, 4}, model::precision_policy("bf16-mixed")};
  std::vector<sim::SimResult> results;
  std::vector<int> copies;
  for (bool oc : {false, true}) {
    MegatronParams p;
    p.tp = 4;
    p.recompute = Recompute::full;
    p.offload_activations = oc;
    sim::TaskGraph g = build_megatron(in, p);
    int n = 0;
    for (const auto& t : g.tasks()) n += t.kind() == sim::TaskKind::copy;
    copies.push_back(n);
    sim::validate(g, cluster.gpus(), cluster.nodes, "megatron");
    g.finalize();
    results.push_back(sim::simulate(g, cluster));
    ASSERT_TRUE(results.back().completed) << results.back().stuck;
  }
  EXPECT_EQ(copies[0], 0);
  EXPECT_EQ(copies[1], 2 * 8 * 4 * 4);  // D2H and H2D per layer, micro-batch and TP rank
  EXPECT_EQ(results[0].pools[4].peak_bytes, 0);
  EXPECT_GT(results[1].pools[4].peak_bytes, 0);
  EXPECT_LT(results[1].pools[0].peak_bytes, results[0].pools[0].peak_bytes);
}

TEST(Megatron, BadParametersNameTheirFlag) {
  const model::ModelConfig m = model::load_model("llama3-8b");
  const sim::Cluster cluster(hw::load_node("dgx-a100"), 1);
  const StepInputs in{m, cluster, {8192, 16}, model::precision_policy("bf16-mixed")};
  auto error = [&](MegatronParams p) {
    try {
      check_megatron(in, p);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  MegatronParams p;
  p.dp = 8;
  EXPECT_EQ(error(p), "");
  p.tp = 3;
  p.dp = 1;
  EXPECT_NE(error(p).find("tp * pp * dp"), std::string::npos);
  p = {};
  p.tp = 8;
  p.sequence_parallel = true;
  EXPECT_EQ(error(p), "");
  p.tp = 1;
  p.dp = 8;
  EXPECT_NE(error(p).find("--sequence-parallel"), std::string::npos);
  p = {};
  p.pp = 8;
  p.vpp = 3;
  EXPECT_NE(error(p).find("--pp/--vpp"), std::string::npos);
  p = {};
  p.dp = 8;
  p.micro_batch = 3;
  EXPECT_NE(error(p).find("--global-batch"), std::string::npos);
  p = {};
  p.dp = 8;
  p.offload_activations = true;
  EXPECT_NE(error(p).find("--recompute full"), std::string::npos);
}

TEST(Megatron, DataParallelStepAllReducesTheGradients) {
  // dp = 4 on the tiny node: every GPU ends with an optimizer step after all-reduces whose payloads add up to
  // its gradients (bf16: 2 bytes per parameter).
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=1024,heads=16,vocab=1024");
  const sim::Cluster cluster(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, cluster, {1024, 8}, model::precision_policy("bf16-mixed")};
  MegatronParams p;
  p.dp = 4;
  p.bucket_params = 1e6;
  sim::TaskGraph g = build_megatron(in, p);
  double reduced = 0;
  int optimizers = 0;
  for (const auto& task : g.tasks()) {
    if (const auto* c = std::get_if<sim::Collective>(&task.params)) reduced += static_cast<double>(c->bytes);
    optimizers += task.kind() == sim::TaskKind::optimizer;
  }
  EXPECT_EQ(optimizers, 4);
  // Every gradient: the layers', the embedding's and the LM head's (with the final norm); rounding to the group size.
  const auto params = m.param_counts();
  EXPECT_NEAR(reduced, 2 * (params.per_layer() * 4 + params.embedding + static_cast<double>(m.vocab * m.hidden) + params.final_norm), 64);
  sim::validate(g, cluster.gpus(), cluster.nodes, "megatron");
  g.finalize();
  const sim::SimResult r = sim::simulate(g, cluster);
  EXPECT_TRUE(r.completed);
  EXPECT_GT(r.mfu(), 0);
}

}  // namespace trainyard::planner

namespace trainyard::planner {

namespace {

// tp 2 x cp 2 on the tiny node's 4 GPUs: GPU = cp index * 2 + TP index.
struct ContextParallelCase {
  model::ModelConfig model = model::parse_custom_model("custom:layers=2,hidden=1024,heads=16,vocab=1024");
  sim::Cluster cluster{hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack()};
  StepInputs inputs() const { return {model, cluster, {8192, 1}, model::precision_policy("bf16-mixed")}; }
  static MegatronParams params(bool allgather) {
    MegatronParams p;
    p.tp = 2;
    p.cp = 2;
    p.cp_comm = allgather ? CpComm::all_gather : CpComm::p2p;
    return p;
  }
};

std::set<std::vector<sim::DeviceId>> groups_of(const sim::TaskGraph& g, sim::CollectiveOp op) {
  std::set<std::vector<sim::DeviceId>> out;
  for (const auto& t : g.tasks()) {
    const auto* c = std::get_if<sim::Collective>(&t.params);
    if (c != nullptr && c->op == op) out.insert(g.groups()[c->group]);
  }
  return out;
}

}  // namespace

TEST(Megatron, ContextParallelSplitsTheSequenceAndKeepsEachExchangeInItsGroup) {
  const ContextParallelCase k;
  const StepInputs in = k.inputs();
  const MegatronParams p = ContextParallelCase::params(false);
  sim::TaskGraph g = build_megatron(in, p);
  // Every GEMM of a layer sees half the sequence (4K of 8K tokens).
  int layer_gemms = 0;
  for (const auto& t : g.tasks()) {
    const auto* gemm = std::get_if<sim::Gemm>(&t.params);
    if (gemm != nullptr && g.name_of(t).find(" qkv") != std::string::npos && g.name_of(t).find("dgrad") == std::string::npos &&
        g.name_of(t).find("wgrad") == std::string::npos) {
      EXPECT_EQ(gemm->m, 4096) << g.name_of(t);
      ++layer_gemms;
    }
  }
  EXPECT_EQ(layer_gemms, 2 * 4);  // 2 layers x 4 GPUs
  // K/V pass between the two cp ranks of one TP index; TP all-reduces stay in a cp slice; the gradients are
  // all-reduced across the cp ranks holding the same weights.
  double passed_by_gpu0 = 0;
  for (const auto& t : g.tasks()) {
    if (const auto* p2p = std::get_if<sim::PointToPoint>(&t.params)) {
      EXPECT_EQ(t.device % 2, p2p->dst % 2) << g.name_of(t);
      EXPECT_NE(t.device / 2, p2p->dst / 2) << g.name_of(t);
      if (t.device == 0) passed_by_gpu0 += static_cast<double>(p2p->bytes);
    }
  }
  const LayerSplit split = megatron_layer_split(in, p);
  EXPECT_NEAR(passed_by_gpu0, 2 * (ring_bytes_per_layer(k.model, split, false) + ring_bytes_per_layer(k.model, split, true)), 8);
  const std::vector<sim::DeviceId> tp0{0, 1}, tp1{2, 3}, replicas0{0, 2}, replicas1{1, 3};
  std::set<std::vector<sim::DeviceId>> expected{tp0, tp1, replicas0, replicas1};
  EXPECT_EQ(groups_of(g, sim::CollectiveOp::all_reduce), expected);
  const sim::SimResult r = test::simulate_built(g, k.cluster, "megatron");
  EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
}

TEST(Megatron, AllGatherContextParallelGathersKvAndReduceScattersItsGradients) {
  const ContextParallelCase k;
  const StepInputs in = k.inputs();
  const MegatronParams p = ContextParallelCase::params(true);
  sim::TaskGraph g = build_megatron(in, p);
  const LayerSplit split = megatron_layer_split(in, p);
  // One TP rank's K/V heads (16 heads / 2 x 64) for the whole 8K sequence, K and V in bf16.
  EXPECT_DOUBLE_EQ(cp_gathered_kv_bytes(k.model, split), 2 * 2 * 8192.0 * 512);
  int gathers = 0, scatters = 0;
  for (const auto& t : g.tasks()) {
    const auto* c = std::get_if<sim::Collective>(&t.params);
    if (c == nullptr || g.groups()[c->group].size() != 2 || t.op.is_lm_head()) continue;  // not the vocab-parallel loss's TP gather
    const auto& members = g.groups()[c->group];
    if (c->op == sim::CollectiveOp::all_gather || c->op == sim::CollectiveOp::reduce_scatter) {
      EXPECT_EQ(members[0] % 2, members[1] % 2) << g.name_of(t);  // the cp ranks of one TP index
      EXPECT_NEAR(static_cast<double>(c->bytes), cp_gathered_kv_bytes(k.model, split), 2);
      gathers += c->op == sim::CollectiveOp::all_gather;
      scatters += c->op == sim::CollectiveOp::reduce_scatter;
    }
  }
  EXPECT_EQ(gathers, 2 * 2 * 2);  // 2 layers x (forward, backward) x 2 TP indices
  EXPECT_EQ(scatters, 2 * 2);     // 2 layers x 2 TP indices
  for (const auto& t : g.tasks()) {
    EXPECT_NE(t.kind(), sim::TaskKind::p2p) << g.name_of(t);
  }
  const sim::SimResult r = test::simulate_built(g, k.cluster, "megatron");
  EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
}

TEST(Megatron, UnevenPipelineStagesTakeTheirOwnLayerCounts) {
  // Llama 3 405B's split (Dubey et al. 2024, 3.3.2): 126 layers over 16 stages, one layer fewer on the first
  // and the last.
  MegatronParams p;
  p.pp = 16;
  p.first_stage_layers = 7;
  p.last_stage_layers = 7;
  std::vector<std::int64_t> expected(16, 8);
  expected.front() = expected.back() = 7;
  EXPECT_EQ(megatron_stage_layers(126, p), expected);
  // Built: 6 layers over 4 stages as 1, 2, 2, 1; the middle stages hold twice the first's layer weights.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=6,hidden=1024,heads=16,vocab=64");
  const sim::Cluster cluster(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, cluster, {1024, 4}, model::precision_policy("bf16-mixed")};
  MegatronParams q;
  q.pp = 4;
  q.first_stage_layers = 1;
  q.last_stage_layers = 1;
  sim::TaskGraph g = build_megatron(in, q);
  std::map<sim::DeviceId, std::set<std::string>> layers_on;
  for (const auto& t : g.tasks()) {
    if (t.kind() == sim::TaskKind::gemm && g.name_of(t).rfind("F L", 0) == 0)
      layers_on[t.device].insert(std::string(g.name_of(t).substr(2, g.name_of(t).find(' ', 2) - 2)));
  }
  EXPECT_EQ(layers_on[0], (std::set<std::string>{"L0"}));
  EXPECT_EQ(layers_on[1], (std::set<std::string>{"L1", "L2"}));
  EXPECT_EQ(layers_on[2], (std::set<std::string>{"L3", "L4"}));
  EXPECT_EQ(layers_on[3], (std::set<std::string>{"L5"}));
  EXPECT_TRUE(test::simulate_built(g, cluster, "megatron").completed);
  // What does not add up is refused, naming the flags.
  q.last_stage_layers = 2;
  EXPECT_NE(test::error_of([&] { check_megatron(in, q); }).find("--first-stage-layers/--last-stage-layers"), std::string::npos);
  q.last_stage_layers = 1;
  q.vpp = 2;
  EXPECT_NE(test::error_of([&] { check_megatron(in, q); }).find("--vpp"), std::string::npos);  // a 1-layer stage
}

TEST(Megatron, InterleavedChunksOfUnevenStagesSplitAsEvenlyAsTheyCan) {
  // Llama 3 405B's stages of 7 and 8 layers in 2 model chunks each: the 7-layer stages' chunks hold 4 then 3
  // layers (Megatron's --pipeline-model-parallel-layout), so the first virtual stage ends at layer 4 and the
  // second chunk of stage 0 starts after the 16 first chunks' 4 + 14 x 4 + 4 = 64 layers.
  MegatronParams p;
  p.pp = 16;
  p.vpp = 2;
  p.first_stage_layers = 7;
  p.last_stage_layers = 7;
  const std::vector<std::int64_t> first = megatron_chunk_first_layers(126, p);
  ASSERT_EQ(first.size(), 33U);
  EXPECT_EQ(first[1], 4);
  EXPECT_EQ(first[16], 64);
  EXPECT_EQ(first[17], 67);  // stage 0's second chunk: 3 layers
  EXPECT_EQ(first.back(), 126);
  for (std::size_t v = 0; v + 1 < first.size(); ++v) EXPECT_GE(first[v + 1] - first[v], 3) << v;
}

TEST(Megatron, AllToAllContextParallelTradesTheSequenceSplitForAHeadSplit) {
  const ContextParallelCase k;  // 2 layers, 16 heads, tp 2, cp 2, 8K tokens
  const StepInputs in = k.inputs();
  MegatronParams p = ContextParallelCase::params(false);
  p.cp_comm = CpComm::a2a;
  sim::TaskGraph g = build_megatron(in, p);
  int exchanges = 0, attentions = 0;
  for (const auto& t : g.tasks()) {
    if (const auto* c = std::get_if<sim::Collective>(&t.params); c != nullptr && c->op == sim::CollectiveOp::all_to_all) {
      const auto& members = g.groups()[c->group];
      ASSERT_EQ(members.size(), 2U);
      EXPECT_EQ(members[0] % 2, members[1] % 2) << g.name_of(t);  // the cp ranks of one TP index
      ++exchanges;
    }
    if (const auto* a = std::get_if<sim::Attention>(&t.params); a != nullptr && t.device == 0) {
      EXPECT_EQ(a->q_len, 8192) << g.name_of(t);          // the whole sequence ...
      EXPECT_EQ(a->heads, 16 / (2 * 2)) << g.name_of(t);  // ... for 1/cp of the TP rank's heads
      ++attentions;
    }
  }
  EXPECT_EQ(exchanges, 2 * 2 * 2 * 2);  // layers x (forward, backward) x (in, out) x TP indices
  EXPECT_EQ(attentions, 2 * 2);         // layers x (forward, backward) on GPU 0
  const sim::SimResult r = test::simulate_built(g, k.cluster, "megatron");
  EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
  // A cp degree that does not divide the TP rank's heads cannot split them.
  p.cp = 4;
  p.tp = 1;
  p.dp = 1;
  const model::ModelConfig odd = model::parse_custom_model("custom:layers=2,hidden=1536,heads=6,vocab=1024");
  const StepInputs odd_in{odd, k.cluster, {8192, 1}, model::precision_policy("bf16-mixed")};
  EXPECT_NE(test::error_of([&] { check_megatron(odd_in, p); }).find("--cp-comm a2a"), std::string::npos);
}

TEST(Megatron, HierarchicalContextParallelRunsAllToAllsInsideGroupsAndARingAcrossThem) {
  // Megatron's a2a+p2p with --hierarchical-context-parallel-sizes 2 2: tp 2 x cp 4 on two 4-GPU nodes. GPU =
  // cp_rank * 2 + tp_rank; the all-to-all groups are cp ranks {0, 1} and {2, 3} of one TP index, the rings join
  // the ranks at the same place in both groups.
  const ContextParallelCase k;
  const sim::Cluster two_nodes{k.cluster.node, 2, test::ideal_stack()};
  const StepInputs in{k.model, two_nodes, {8192, 1}, model::precision_policy("bf16-mixed")};
  MegatronParams p = ContextParallelCase::params(false);
  p.cp = 4;
  p.cp_comm = CpComm::a2a_p2p;
  p.cp_a2a = 2;
  check_megatron(in, p);
  sim::TaskGraph g = build_megatron(in, p);
  const std::set<std::vector<sim::DeviceId>> a2a_groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}};
  EXPECT_EQ(groups_of(g, sim::CollectiveOp::all_to_all), a2a_groups);
  double passed_by_gpu0 = 0;
  int sends = 0, blocks_on_gpu0 = 0;
  for (const auto& t : g.tasks()) {
    if (const auto* p2p = std::get_if<sim::PointToPoint>(&t.params)) {
      EXPECT_EQ(p2p->dst, (t.device + 4) % 8) << g.name_of(t);  // cp rank c to c + 2: the same place in the other group
      if (t.device == 0) passed_by_gpu0 += static_cast<double>(p2p->bytes);
      ++sends;
    }
    if (const auto* a = std::get_if<sim::Attention>(&t.params); a != nullptr && t.device == 0) {
      EXPECT_EQ(a->q_len, 2 * 8192 / 4) << g.name_of(t);  // the group's two quarters of the sequence ...
      EXPECT_EQ(a->heads, 16 / (2 * 2)) << g.name_of(t);  // ... for half of the TP rank's heads
      ++blocks_on_gpu0;
    }
  }
  EXPECT_EQ(sends, 2 * 3 * 8);           // layers x (forward K/V, backward K/V, the dK/dV accumulator home) x 8 ranks, round rings of 2
  EXPECT_EQ(blocks_on_gpu0, 2 * 2 * 2);  // layers x (forward, backward) x ring steps
  // Each pass carries what a p2p ring's does (twice the tokens, half the K/V heads), but once instead of cp - 1 times.
  MegatronParams flat = p;
  flat.cp_comm = CpComm::p2p;
  flat.cp_a2a = 0;
  const LayerSplit split = megatron_layer_split(in, flat);
  EXPECT_NEAR(passed_by_gpu0, 2 * (ring_bytes_per_layer(k.model, split, false) + ring_bytes_per_layer(k.model, split, true)) / 3, 8);
  const sim::SimResult r = test::simulate_built(g, two_nodes, "megatron");
  EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
  // The all-to-all level must split cp into at least two groups of at least two, and is refused elsewhere.
  for (int bad : {0, 3, 4}) {
    p.cp_a2a = bad;
    EXPECT_NE(test::error_of([&] { check_megatron(in, p); }).find("--cp-a2a"), std::string::npos) << bad;
  }
  flat.cp_a2a = 2;
  EXPECT_NE(test::error_of([&] { check_megatron(in, flat); }).find("only with --cp-comm a2a+p2p"), std::string::npos);
}

TEST(LayerEmitter, UlyssesAndRingAttentionEmitNoTensorParallelCollectives) {
  // Regression: the emitter used to all-reduce the attention and MLP outputs over any multi-rank group, so
  // Ulysses and ring-attention layers paid four TP all-reduces they do not run.
  const model::ModelConfig m = gpt_like();
  for (bool ulysses : {true, false}) {
    LayerSplit split{1, 4096, 1, false, false};
    (ulysses ? split.ulysses : split.cp) = 4;
    sim::TaskGraph g;
    LayerEmitter layer(g, m, split, {0, 1, 2, 3});
    std::vector<sim::TaskId> last(4, -1);
    layer.forward("F L0", last);
    layer.backward("B L0", last);
    for (const auto& t : g.tasks()) {
      if (const auto* c = std::get_if<sim::Collective>(&t.params)) {
        EXPECT_EQ(c->op, sim::CollectiveOp::all_to_all) << g.name_of(t);
      }
    }
  }
}

TEST(Megatron, TpCommOverlapRunsEachTpCollectiveBesideItsGemm) {
  const ContextParallelCase k;  // 2 layers, tiny node
  const StepInputs in{k.model, k.cluster, {8192, 1}, model::precision_policy("bf16-mixed")};
  MegatronParams p;
  p.tp = 4;
  p.sequence_parallel = true;
  sim::TaskGraph serial = build_megatron(in, p);
  p.tp_comm_overlap = true;
  sim::TaskGraph overlapped = build_megatron(in, p);
  ASSERT_EQ(serial.size(), overlapped.size());  // the same tasks, other dependencies
  // Without overlap the forward QKV GEMM waits for its all-gather; with it, the GEMM and the all-gather share
  // their predecessor and RoPE, which reads the GEMM's output, waits for both.
  auto gathered_before = [](const sim::TaskGraph& g, const std::string& gemm_name) {
    for (sim::TaskId t = 0; t < static_cast<sim::TaskId>(g.size()); ++t) {
      if (std::string(g.name(t)) != gemm_name || g.task(t).device != 0) continue;
      for (sim::TaskId s = 0; s < static_cast<sim::TaskId>(g.size()); ++s) {
        if (g.task(s).kind() != sim::TaskKind::collective) continue;
        for (sim::TaskId next : g.successors(s)) {
          if (next == t) return true;
        }
      }
      return false;
    }
    ADD_FAILURE() << "no task " << gemm_name;
    return false;
  };
  const sim::SimResult a = test::simulate_built(serial, k.cluster, "megatron");  // finalizes: successors exist
  const sim::SimResult b = test::simulate_built(overlapped, k.cluster, "megatron");
  ASSERT_TRUE(a.completed && b.completed);
  EXPECT_LT(b.step_ns, a.step_ns);
  EXPECT_TRUE(gathered_before(serial, "F L0 mb0 qkv"));
  EXPECT_FALSE(gathered_before(overlapped, "F L0 mb0 qkv"));
  EXPECT_TRUE(gathered_before(overlapped, "F L0 mb0 rope"));
  // Megatron refuses --tp-comm-overlap without sequence parallelism; so does trainyard.
  p.sequence_parallel = false;
  EXPECT_NE(test::error_of([&] { check_megatron(in, p); }).find("--tp-comm-overlap"), std::string::npos);
}

}  // namespace trainyard::planner
