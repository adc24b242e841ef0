// Symmetry reduction (planner/symmetry.hpp): a step simulated with one of its identical data-parallel replicas
// and one rank of each node-filling TP group (Megatron), or two units of identical nodes (the ZeRO family), gives
// the whole step's per-GPU figures.
#include <gtest/gtest.h>

#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/plan.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/symmetry.hpp"
#include "test_support.hpp"

namespace trainyard::planner {

namespace {

struct Figures {
  double step_ns = 0;
  double peak_hbm_bytes = 0;
  double mfu = 0;
};

Figures simulate_step(const model::ModelConfig& m, const hw::NodeProfile& node, int nodes, const Workload& w, const PlanSpec& spec,
                      int devices_per_node = 0) {
  const sim::Cluster cluster(node, nodes, stacks::default_stack(), devices_per_node);
  const StepInputs in{m, cluster, w, model::precision_policy("bf16-mixed")};
  sim::TaskGraph g = build_plan(in, spec);
  const sim::SimResult r = test::simulate_built(g, cluster, "symmetry");
  EXPECT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
  Figures f{static_cast<double>(r.step_ns), 0, r.mfu()};
  for (int gpu = 0; gpu < r.gpus; ++gpu) f.peak_hbm_bytes = std::max(f.peak_hbm_bytes, static_cast<double>(r.pools[gpu].peak_bytes));
  return f;
}

// The whole step and its reduction, within 0.1% (the bar the reduction is held to); returns the reduction's replicas.
void expect_reduction_exact(const std::string& node_name, int nodes, const Workload& w, const PlanSpec& spec) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=8,hidden=2048,heads=16,vocab=32000");
  const hw::NodeProfile node = hw::load_node(node_name);
  const sim::Cluster full_cluster(node, nodes);
  const StepInputs in{m, full_cluster, w, model::precision_policy("bf16-mixed")};
  std::string why;
  const auto reduced = reduce_by_symmetry(in, spec, &why);
  ASSERT_TRUE(reduced.has_value()) << why;
  // The simulated share of the step is the share of its replicas (and CP ranks) that were built.
  EXPECT_EQ(reduced->nodes * reduced->replicas * std::max(1, reduced->cp_ranks),
            nodes * reduced->simulated_replicas * std::max(1, reduced->simulated_cp_ranks));
  EXPECT_LT(reduced->nodes * (reduced->devices_per_node > 0 ? reduced->devices_per_node : node.gpu_count()), nodes * node.gpu_count());
  const Figures whole = simulate_step(m, node, nodes, w, spec);
  const Figures part = simulate_step(m, node, reduced->nodes, reduced->workload, reduced->spec, reduced->devices_per_node);
  EXPECT_NEAR(part.step_ns / whole.step_ns, 1, 1e-3) << spec.summary();
  EXPECT_NEAR(part.peak_hbm_bytes / whole.peak_hbm_bytes, 1, 1e-3) << spec.summary();
  EXPECT_NEAR(part.mfu / whole.mfu, 1, 1e-3) << spec.summary();
}

PlanSpec megatron(int tp, int pp, int dp) {
  PlanSpec spec = scheme_named("megatron").blank();
  spec.as<MegatronParams>().tp = tp;
  spec.as<MegatronParams>().pp = pp;
  spec.as<MegatronParams>().dp = dp;
  spec.as<MegatronParams>().bucket_params = 20e6;
  return spec;
}

PlanSpec zero_family(const std::string& scheme, int stage) {
  PlanSpec spec = scheme_named(scheme).blank();
  spec.as<ZeroParams>().stage = stage;
  return spec;
}

}  // namespace

TEST(Symmetry, MegatronDataParallelReplicasReduceExactly) {
  // 64 and 128 A100s: TP 8 fills a node (one rank of it built), PP 2, DP 4 and 8; the gradient all-reduce, the
  // distributed optimizer's reduce-scatter and weight all-gather, sequence parallelism with selective recompute,
  // full recompute with checkpoints offloaded to host DRAM (TP ranks then all built: they share PCIe).
  expect_reduction_exact("dgx-a100", 8, {2048, 16}, megatron(8, 2, 4));
  PlanSpec dist = megatron(8, 2, 8);
  dist.as<MegatronParams>().distributed_optimizer = true;
  dist.as<MegatronParams>().sequence_parallel = true;
  dist.as<MegatronParams>().recompute = Recompute::selective;
  expect_reduction_exact("dgx-a100", 16, {2048, 32}, dist);
  PlanSpec offload = megatron(8, 1, 4);
  offload.as<MegatronParams>().recompute = Recompute::full;
  offload.as<MegatronParams>().offload_activations = true;
  expect_reduction_exact("dgx-a100", 4, {4096, 8}, offload);
  // H100 nodes (NVLS inside the node, SMs shared with collectives), interleaved pipeline, CP 2 across nodes.
  PlanSpec cp = megatron(8, 2, 3);
  cp.as<MegatronParams>().cp = 2;
  cp.as<MegatronParams>().vpp = 2;
  expect_reduction_exact("dgx-h100", 12, {8192, 6}, cp);
  // DP 2 on H100 nodes: the one replica built all-reduces through its rail NIC, never as NVLS inside its node.
  PlanSpec two = megatron(8, 2, 2);
  two.as<MegatronParams>().sequence_parallel = true;
  expect_reduction_exact("dgx-h100", 4, {4096, 8}, two);
}

TEST(Symmetry, MegatronContextParallelRanksReduceExactly) {
  // TP 8 fills an H100 node, so CP ranks meet only at the fabric: CP 4 with ring passes, CP 3 with all-gathered
  // K/V (the reduction keeps 2 ranks, whose exchanges run as the whole ring's), and CP 3 with DP 3 both reduced.
  PlanSpec p2p = megatron(8, 1, 2);
  p2p.as<MegatronParams>().cp = 4;
  expect_reduction_exact("dgx-h100", 8, {16384, 4}, p2p);
  PlanSpec gathered = megatron(8, 2, 1);
  gathered.as<MegatronParams>().cp = 3;
  gathered.as<MegatronParams>().cp_comm = planner::CpComm::all_gather;
  gathered.as<MegatronParams>().sequence_parallel = true;
  expect_reduction_exact("dgx-h100", 6, {12288, 4}, gathered);
  PlanSpec both = megatron(8, 1, 3);
  both.as<MegatronParams>().cp = 3;
  both.as<MegatronParams>().distributed_optimizer = true;
  expect_reduction_exact("dgx-a100", 9, {12288, 6}, both);
}

TEST(Symmetry, MegatronTensorParallelRanksReduceToOneExactly) {
  // Nothing but the TP group to reduce: one rank of each 8-GPU node built, its all-reduces (A100: rings through
  // the NVSwitch; H100: NVLS) and, with sequence parallelism, all-gathers and reduce-scatters run beside their
  // GEMMs as the whole group's; pipeline sends on each GPU's own rail.
  expect_reduction_exact("dgx-a100", 2, {2048, 8}, megatron(8, 2, 1));
  PlanSpec overlap = megatron(8, 2, 2);
  overlap.as<MegatronParams>().sequence_parallel = true;
  overlap.as<MegatronParams>().tp_comm_overlap = true;
  overlap.as<MegatronParams>().vpp = 2;
  expect_reduction_exact("dgx-h100", 4, {4096, 8}, overlap);
  PlanSpec cp = megatron(8, 1, 1);
  cp.as<MegatronParams>().cp = 2;
  cp.as<MegatronParams>().recompute = Recompute::full;
  expect_reduction_exact("dgx-h100", 2, {16384, 2}, cp);
}

TEST(Symmetry, ZeroStagesReduceByNodesExactly) {
  // Every GPU a data-parallel rank: two of four or six nodes built, the ZeRO collectives run as the whole ring.
  expect_reduction_exact("dgx-a100", 4, {2048, 64}, zero_family("zero", 0));
  expect_reduction_exact("dgx-a100", 3, {2048, 48}, zero_family("zero", 1));
  PlanSpec stage2 = zero_family("zero", 2);
  stage2.as<ZeroParams>().micro_batch = 2;
  expect_reduction_exact("dgx-h100", 4, {2048, 128}, stage2);
  PlanSpec stage3 = zero_family("zero", 3);
  stage3.as<ZeroParams>().activation_checkpointing = true;
  expect_reduction_exact("dgx-a100", 6, {2048, 48}, stage3);
  // Offload of everything: the host optimizer step, gradient and parameter copies, checkpoints in host DRAM.
  PlanSpec offload = zero_family("zero", 3);
  offload.as<ZeroParams>().offload_optimizer = offload.as<ZeroParams>().offload_grads = offload.as<ZeroParams>().offload_params = true;
  offload.as<ZeroParams>().offload_activations = true;
  expect_reduction_exact("dgx-a100", 4, {4096, 32}, offload);
}

TEST(Symmetry, SequenceParallelSchemesReduceByNodesExactly) {
  // Ulysses of 8 (a node) and of 16 (two nodes: a unit of two nodes, four units), ring attention of 8 with zigzag
  // and of 4 (two groups a node), FPDT's chunked attention with its host traffic.
  PlanSpec ulysses = zero_family("ulysses", 3);
  ulysses.as<ZeroParams>().sp = 8;
  expect_reduction_exact("dgx-a100", 3, {32768, 3}, ulysses);
  ulysses.as<ZeroParams>().sp = 16;
  expect_reduction_exact("dgx-h100", 8, {32768, 4}, ulysses);
  PlanSpec ring = zero_family("ring-attention", 2);
  ring.as<ZeroParams>().cp = 8;
  ring.as<ZeroParams>().zigzag = true;
  expect_reduction_exact("dgx-a100", 4, {32768, 4}, ring);
  ring.as<ZeroParams>().cp = 4;
  expect_reduction_exact("dgx-h100", 3, {16384, 6}, ring);
  PlanSpec fpdt = zero_family("fpdt", 3);
  fpdt.as<ZeroParams>().sp = 8;
  fpdt.as<ZeroParams>().fpdt_chunk = 16384;
  expect_reduction_exact("dgx-a100", 3, {65536, 3}, fpdt);
}

TEST(Symmetry, SaysWhyAPlanIsNotReduced) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=8,hidden=2048,heads=16,vocab=32000");
  const sim::Cluster cluster(hw::load_node("dgx-a100"), 2);
  const StepInputs in{m, cluster, {2048, 16}, model::precision_policy("bf16-mixed")};
  std::string why;
  EXPECT_FALSE(reduce_by_symmetry(in, megatron(4, 1, 4), &why).has_value());  // two replicas per node
  EXPECT_NE(why.find("whole nodes"), std::string::npos) << why;
  PlanSpec offload = megatron(8, 1, 2);  // the TP ranks' checkpoints share PCIe to host DRAM
  offload.as<MegatronParams>().recompute = Recompute::full;
  offload.as<MegatronParams>().offload_activations = true;
  EXPECT_FALSE(reduce_by_symmetry(in, offload, &why).has_value());
  EXPECT_NE(why.find("nothing to reduce, and TP ranks are not: checkpoints are offloaded"), std::string::npos) << why;
  const sim::Cluster pcie(hw::load_node("pcie-a100x4"), 2);  // no NVSwitch: a TP ring's hops differ by rank
  EXPECT_FALSE(reduce_by_symmetry({m, pcie, {2048, 16}, in.precision}, megatron(4, 1, 2), &why).has_value());
  EXPECT_NE(why.find("do not meet at one NVSwitch"), std::string::npos) << why;
  PlanSpec narrow_cp = megatron(4, 1, 1);  // CP ranks of TP 4 would share nodes
  narrow_cp.as<MegatronParams>().cp = 4;
  EXPECT_FALSE(reduce_by_symmetry(in, narrow_cp, &why).has_value());
  EXPECT_NE(why.find("whole nodes"), std::string::npos) << why;
  EXPECT_FALSE(reduce_by_symmetry(in, zero_family("zero", 1), &why).has_value());  // two nodes
  EXPECT_NE(why.find("nothing to reduce"), std::string::npos) << why;
  const sim::Cluster three_nodes(hw::load_node("dgx-a100"), 3);
  PlanSpec odd_group = zero_family("ring-attention", 0);  // groups of 12 GPUs straddle nodes of 8
  odd_group.as<ZeroParams>().cp = 12;
  EXPECT_FALSE(reduce_by_symmetry({m, three_nodes, {24576, 2}, in.precision}, odd_group, &why).has_value());
  EXPECT_NE(why.find("share node links"), std::string::npos) << why;
  PlanSpec ringtrack = scheme_named("ringtrack").blank();
  EXPECT_FALSE(reduce_by_symmetry(in, ringtrack, &why).has_value());
  EXPECT_NE(why.find("ringtrack steps are not reduced by symmetry yet (only "), std::string::npos) << why;
  EXPECT_NE(why.find("megatron"), std::string::npos) << why;
  EXPECT_NE(why.find("zero"), std::string::npos) << why;
}

}  // namespace trainyard::planner
