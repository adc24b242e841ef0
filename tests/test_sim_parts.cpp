// The simulator's parts on their own: max-min fair sharing, collective decomposition, the cost model, and the
// task graph's JSON form with its error messages.
#include <cmath>
#include <map>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "sim/collectives.hpp"
#include "sim/cost_model.hpp"
#include "sim/flow_network.hpp"
#include "sim/graph_json.hpp"
#include "test_support.hpp"

namespace trainyard::sim {

TEST(FlowNetwork, MaxMinFairShares) {
  // r0 = 10, r1 = 4 bytes/ns. f1 on r0; f2 on r0 and r1; f3 on r1. r1 is the tightest: f2 = f3 = 2; then f1
  // takes what r0 has left: 8.
  FlowNetwork net({10, 4});
  const std::int32_t r0[] = {0}, r01[] = {0, 1}, r1[] = {1};
  const int f1 = net.start(r0, 1000, FlowNetwork::kUncapped, 0, 0);
  EXPECT_DOUBLE_EQ(net.rate(f1), 10);
  const int f2 = net.start(r01, 1000, FlowNetwork::kUncapped, 0, 1);
  // r1 (4 for f2 alone) is tighter than r0 (10 / 2 = 5): f2 = 4, and f1 takes the 6 that r0 has left.
  EXPECT_DOUBLE_EQ(net.rate(f2), 4);
  EXPECT_DOUBLE_EQ(net.rate(f1), 6);
  const int f3 = net.start(r1, 1000, FlowNetwork::kUncapped, 0, 2);
  EXPECT_DOUBLE_EQ(net.rate(f2), 2);
  EXPECT_DOUBLE_EQ(net.rate(f3), 2);
  EXPECT_DOUBLE_EQ(net.rate(f1), 8);
  EXPECT_EQ(net.active_flows(), 3);
  // A cap below the fair share binds first; the others share the rest.
  FlowNetwork capped({10});
  const std::int32_t only[] = {0};
  const int slow = capped.start(only, 100, 1.0, 0, 0);
  const int fast = capped.start(only, 100, FlowNetwork::kUncapped, 0, 1);
  EXPECT_DOUBLE_EQ(capped.rate(slow), 1);
  EXPECT_DOUBLE_EQ(capped.rate(fast), 9);
}

TEST(FlowNetwork, FinishingAFlowSpeedsUpItsNeighbours) {
  // Two flows of 100 bytes on a 10 bytes/ns link: 5 each. At t = 10 the first ends (50 bytes moved by each...
  // it had only 50 bytes), the second then has 50 left at 10 bytes/ns: done at t = 15.
  FlowNetwork net({10});
  const std::int32_t r[] = {0};
  const int a = net.start(r, 50, FlowNetwork::kUncapped, 0, 0);
  const int b = net.start(r, 100, FlowNetwork::kUncapped, 0, 1);
  EXPECT_EQ(net.completion_ns(a), 10);
  EXPECT_EQ(net.completion_ns(b), 20);
  net.finish(a, 10);
  EXPECT_EQ(net.completion_ns(b), 15);
  ASSERT_EQ(net.changed().size(), 1u);
  EXPECT_EQ(net.changed()[0], b);
  net.finish(b, 15);
  EXPECT_DOUBLE_EQ(net.bytes_moved(0), 150);
  EXPECT_EQ(net.busy_ns(0), 15);
  EXPECT_EQ(net.active_flows(), 0);
}

TEST(FlowNetwork, ARouteMayCrossAHalfDuplexResourceTwice) {
  // GPU -> DRAM -> GPU staging uses the DRAM resource for the write and the read: it consumes twice its rate.
  FlowNetwork net({10, 100});
  const std::int32_t route[] = {1, 0, 0, 1};
  const int f = net.start(route, 100, FlowNetwork::kUncapped, 0, 0);
  EXPECT_DOUBLE_EQ(net.rate(f), 5);
  const std::int32_t other[] = {0};
  const int g = net.start(other, 100, FlowNetwork::kUncapped, 0, 1);
  net.finish(f, 7);
  net.finish(g, 9);
  EXPECT_EQ(net.active_flows(), 0);
}

TEST(Collectives, StepCountsAndBytesPerRank) {
  EXPECT_EQ(collective_steps(CollectiveOp::all_reduce, Algorithm::ring, 8), 14);
  EXPECT_EQ(collective_steps(CollectiveOp::all_reduce, Algorithm::direct, 8), 2);
  EXPECT_EQ(collective_steps(CollectiveOp::all_reduce, Algorithm::tree, 8), 6);  // depth 3: up 3, down 3
  EXPECT_EQ(collective_steps(CollectiveOp::all_gather, Algorithm::ring, 8), 7);
  EXPECT_EQ(collective_steps(CollectiveOp::all_to_all, Algorithm::ring, 8), 7);
  EXPECT_EQ(collective_steps(CollectiveOp::broadcast, Algorithm::ring, 8), 13);
  EXPECT_EQ(collective_steps(CollectiveOp::broadcast, Algorithm::ring, 2), 1);
  // Ring all-reduce: each rank sends 2(n-1)/n * B in total, always to its right neighbour.
  const int n = 8;
  const std::int64_t bytes = 8000;
  std::vector<double> sent(n, 0);
  for (int s = 0; s < collective_steps(CollectiveOp::all_reduce, Algorithm::ring, n); ++s) {
    std::vector<Transfer> step;
    collective_step(CollectiveOp::all_reduce, Algorithm::ring, n, bytes, s, step);
    ASSERT_EQ(step.size(), static_cast<std::size_t>(n));
    for (const auto& t : step) {
      EXPECT_EQ(t.dst_rank, (t.src_rank + 1) % n);
      sent[t.src_rank] += t.bytes;
    }
  }
  for (double s : sent) EXPECT_DOUBLE_EQ(s, 2.0 * (n - 1) / n * bytes);
  // All-to-all (pairwise): every rank reaches every other rank exactly once.
  std::vector<std::vector<int>> seen(n, std::vector<int>(n, 0));
  for (int s = 0; s < n - 1; ++s) {
    std::vector<Transfer> step;
    collective_step(CollectiveOp::all_to_all, Algorithm::ring, n, bytes, s, step);
    for (const auto& t : step) ++seen[t.src_rank][t.dst_rank];
  }
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) EXPECT_EQ(seen[a][b], a == b ? 0 : 1);
  }
  // Pipelined ring broadcast: every rank but the root receives B in total.
  std::vector<double> received(n, 0);
  for (int s = 0; s < collective_steps(CollectiveOp::broadcast, Algorithm::ring, n); ++s) {
    std::vector<Transfer> step;
    collective_step(CollectiveOp::broadcast, Algorithm::ring, n, bytes, s, step);
    for (const auto& t : step) received[t.dst_rank] += t.bytes;
  }
  for (int r = 1; r < n; ++r) EXPECT_DOUBLE_EQ(received[r], bytes);
}

// A ring over several nodes runs one channel per rail, each channel rotating every node's members so that its
// hops between nodes leave and enter through other GPUs (so other NICs); anything irregular keeps one ring.
TEST(Collectives, RingChannelsRotateEachNodesMembers) {
  const auto two_nodes = ring_channels({0, 0, 0, 0, 1, 1, 1, 1}, 8);
  ASSERT_EQ(two_nodes.size(), 4u);  // min(rails, members per node)
  EXPECT_EQ(two_nodes[0], (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(two_nodes[1], (std::vector<int>{1, 2, 3, 0, 5, 6, 7, 4}));
  std::set<int> exits;  // the member each channel leaves node 0 from
  for (const auto& order : two_nodes) exits.insert(order[3]);
  EXPECT_EQ(exits.size(), 4u);
  EXPECT_EQ(ring_channels({0, 0, 1, 1}, 1).size(), 1u);        // one rail
  EXPECT_EQ(ring_channels({0, 0, 0, 0}, 8).size(), 1u);        // one node
  EXPECT_EQ(ring_channels({0, 0, 0, 1}, 8).size(), 1u);        // uneven
  EXPECT_EQ(ring_channels({0, 1, 0, 1}, 8).size(), 1u);        // not contiguous per node
  EXPECT_EQ(ring_channels({0, 0, 1, 1, 0, 0}, 8).size(), 1u);  // a node twice
}

TEST(CostModel, CausalAttentionCountsUnmaskedPairs) {
  Attention a{4, 4, 1, 1, 1, true, false};
  EXPECT_DOUBLE_EQ(attention_pairs(a), 10);  // 1 + 2 + 3 + 4
  a.q_len = 2;                               // queries at positions 2, 3 of 4 keys: 3 + 4
  EXPECT_DOUBLE_EQ(attention_pairs(a), 7);
  a.causal = false;
  EXPECT_DOUBLE_EQ(attention_pairs(a), 8);
  Task t{0, {StreamKind::compute, 0}, false, Attention{1024, 1024, 8, 8, 64, true, true}};
  const ComputeCost c = compute_cost(t);
  const double fwd = 4.0 * (1024.0 * 1025 / 2) * 64 * 8;
  EXPECT_DOUBLE_EQ(c.model_flops, 2 * fwd);
  EXPECT_DOUBLE_EQ(c.hardware_flops, 2.5 * fwd);
  t.recompute = true;
  EXPECT_DOUBLE_EQ(compute_cost(t).model_flops, 0);
}

TEST(CostModel, RooflineAndEfficiencyTable) {
  const hw::NodeProfile node = hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json");
  const ComputeModel model(node, stacks::default_stack());
  auto compute_duration_ns = [&](const Task& t, const hw::GpuProfile&, const hw::NodeProfile&) { return model.duration_ns(t); };
  // Compute-bound: 2e9 FLOPs at 100 TFLOP/s x 0.5 = 40,000 ns.
  Task big{0, {StreamKind::compute, 0}, false, Gemm{1000, 1000, 1000, hw::Dtype::bf16}};
  EXPECT_EQ(compute_duration_ns(big, node.gpu, node), 40'000);
  // Memory-bound: m=1, n=1,000,000, k=1000 moves (m*k + k*n + m*n) x 2 = (1e3 + 1e9 + 1e6) x 2 bytes at
  // 1000 GB/s = 2,002,002 ns, while its 2e9 FLOPs take 40,000 ns.
  Task skinny{0, {StreamKind::compute, 0}, false, Gemm{1, 1'000'000, 1000, hw::Dtype::bf16}};
  EXPECT_EQ(compute_duration_ns(skinny, node.gpu, node), 2'002'002);
  // Small GEMMs reach less of the peak: 2e6 FLOPs sit between the table's (1e6, 0.1) and (1e9, 0.5) points,
  // at log10 fraction 0.1003: efficiency 0.1401.
  Task small{0, {StreamKind::compute, 0}, false, Gemm{100, 100, 100, hw::Dtype::bf16}};
  const double eff = 0.1 + 0.4 * (std::log10(2e6) - 6) / 3;
  EXPECT_EQ(compute_duration_ns(small, node.gpu, node), static_cast<std::int64_t>(std::ceil(2e6 / (100e3 * eff))));
  // Elementwise: bytes over HBM.
  Task norm{0, {StreamKind::compute, 0}, false, Elementwise{500'000, 500'000}};
  EXPECT_EQ(compute_duration_ns(norm, node.gpu, node), 1'000);
}

// The fused attention kernel model (hw::AttentionKernel): blocks of 128 query rows, each running over its keys
// plus a fixed overhead, at the kernel's ceiling for the head_dim.
TEST(CostModel, FusedAttentionByBlocks) {
  const hw::NodeProfile node = hw::load_node("dgx-h100");
  stacks::StackProfile stack = stacks::default_stack();
  stack.attention.preference = {stacks::AttentionImpl::flash3};
  const ComputeModel model(node, stack);
  ASSERT_EQ(model.attention_impl(), stacks::AttentionImpl::flash3);
  const hw::AttentionKernel& k = node.gpu.sustained.attention_kernels.at("flash3");
  const double peak_per_ns = 989.4e3, launch = 4000;
  const double overhead = k.forward.block_overhead_keys.value;
  // Non-causal, 1024 queries and keys, 16 heads of 128: 8 blocks x 128 rows x (1024 + overhead) keys.
  Task full{0, {StreamKind::compute, 0}, false, Attention{1024, 1024, 16, 16, 128, false, false}};
  const double full_flops = 8 * 128 * (1024 + overhead) * 16 * 4 * 128;
  EXPECT_EQ(model.duration_ns(full), static_cast<std::int64_t>(std::ceil(full_flops / (peak_per_ns * k.forward.ceiling(128))) + launch));
  // Causal: block i runs over (i + 1) x 128 keys, the diagonal block whole: 128 x 36 / 8 = 576 keys per block on average.
  Task causal = full;
  std::get<Attention>(causal.params).causal = true;
  const double causal_flops = 128 * (128.0 * 36 + 8 * overhead) * 16 * 4 * 128;
  EXPECT_EQ(model.duration_ns(causal), static_cast<std::int64_t>(std::ceil(causal_flops / (peak_per_ns * k.forward.ceiling(128))) + launch));
  // Queries at the end of a longer key range (a later chunk): 2 blocks of 128 queries after 768 earlier keys.
  Task chunk{0, {StreamKind::compute, 0}, false, Attention{256, 1024, 16, 16, 128, true, false}};
  const double chunk_flops = 128 * ((768 + 128) + (768 + 256) + 2 * overhead) * 16 * 4 * 128;
  EXPECT_EQ(model.duration_ns(chunk), static_cast<std::int64_t>(std::ceil(chunk_flops / (peak_per_ns * k.forward.ceiling(128))) + launch));
  // The ceiling interpolates in log2(head_dim): d96 lies between d64 and d128.
  const double t = (std::log2(96) - 6) / 1;
  EXPECT_NEAR(k.forward.ceiling(96), k.forward.ceiling(64) + t * (k.forward.ceiling(128) - k.forward.ceiling(64)), 1e-12);
  // A lower bound may use the ceiling: no call is faster.
  EXPECT_GE(static_cast<double>(model.duration_ns(causal)),
            compute_cost(causal).hardware_flops / (peak_per_ns * model.attention_best_fraction(false, 128)));
}

// A100: 108 SMs, 128x128 tiles. 108 tiles fill one wave; one more tile needs a second wave that does 1/108 of it.
TEST(CostModel, GemmWavesOverTheSms) {
  const hw::NodeProfile node = hw::load_node("dgx-a100");
  const ComputeModel model(node, stacks::default_stack());
  ASSERT_EQ(node.gpu.sm_count.value, 108);
  auto compute_ns = [&](std::int64_t m, std::int64_t n, std::int64_t k) {
    const Task t{0, {StreamKind::compute, 0}, false, Gemm{m, n, k, hw::Dtype::bf16}};
    return static_cast<double>(model.duration_ns(t)) - node.gpu.sustained.kernel_launch_ns.value;
  };
  auto curve_ns = [&](double m, double n, double k) {
    const double flops = 2 * m * n * k;
    return flops / (312e3 * node.gpu.sustained.gemm.at(flops));
  };
  EXPECT_NEAR(compute_ns(108 * 128, 128, 8192), std::ceil(curve_ns(108 * 128, 128, 8192)), 1);  // one full wave
  // 109 tiles: two waves for 109 tiles' work.
  EXPECT_NEAR(compute_ns(109 * 128, 128, 8192), std::ceil(curve_ns(109 * 128, 128, 8192) * 216 / 109), 1);
  // A partial tile costs a whole one: 108 tiles of which the last row of tiles is 1 row of 128.
  EXPECT_NEAR(compute_ns(107 * 128 + 1, 128, 8192), std::ceil(curve_ns(107 * 128 + 1, 128, 8192) * 108 * 128 / (107 * 128 + 1)), 1);
  // Under one wave the efficiency curve alone applies (cuBLAS splits such GEMMs differently).
  EXPECT_NEAR(compute_ns(64 * 128, 128, 8192), std::ceil(curve_ns(64 * 128, 128, 8192)), 1);
}

TEST(CostModel, UnfusedAttentionComputesTheWholeSquareAndPassesThroughHbm) {
  const hw::NodeProfile node = hw::load_node("dgx-a100");
  const stacks::StackProfile unfused = stacks::load_stack("megatron-lm-unfused", "test");
  const ComputeModel model(node, unfused);
  ASSERT_EQ(model.attention_impl(), stacks::AttentionImpl::unfused);
  Task t{0, {StreamKind::compute, 0}, false, Attention{4096, 4096, 8, 8, 128, true, false}};
  const double scores = 4096.0 * 4096 * 8;
  const double gemm_flops = 2 * scores * 128;
  const double gemm_ns = 2 * gemm_flops / (312e3 * node.gpu.sustained.gemm.at(gemm_flops));
  const double softmax_ns = 2 * scores * 3 / (2039 * node.gpu.sustained.hbm_efficiency.value);
  // Forward: 2 GEMMs and 3 softmax passes, 5 kernels.
  EXPECT_EQ(model.kernels(t), 5);
  EXPECT_NEAR(static_cast<double>(model.duration_ns(t)), gemm_ns + softmax_ns + 5 * 4000, 2);
  // Causal masking does not shorten it.
  Task full = t;
  std::get<Attention>(full.params).causal = false;
  EXPECT_EQ(model.duration_ns(full), model.duration_ns(t));
  EXPECT_GE(static_cast<double>(model.duration_ns(full)), compute_cost(full).hardware_flops / (312e3 * model.attention_best_fraction(false, 128)));
  std::get<Attention>(full.params).backward = true;
  EXPECT_GE(static_cast<double>(model.duration_ns(full)), compute_cost(full).hardware_flops / (312e3 * model.attention_best_fraction(true, 128)));
}

TEST(CostModel, EagerElementwiseOpsMoveMoreBytesInMoreKernels) {
  const hw::NodeProfile node = hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json");
  const stacks::StackProfile eager = stacks::load_stack("torchtitan", "test");
  const ComputeModel fused(node, stacks::default_stack()), model(node, eager);
  Task norm{0, {StreamKind::compute, 0}, false, Elementwise{500'000'000, 500'000'000}, Op{OpCode::norm1}};
  Task residual = norm;
  residual.op.code = OpCode::residual1;
  const double launch = node.gpu.sustained.kernel_launch_ns.value;
  const double fused_ns = static_cast<double>(fused.duration_ns(norm)) - launch;
  EXPECT_EQ(model.kernels(norm), static_cast<int>(eager.norm.kernels.value));
  EXPECT_NEAR(static_cast<double>(model.duration_ns(norm)), fused_ns * eager.norm.hbm_passes.value + model.kernels(norm) * launch, 1);
  EXPECT_EQ(model.duration_ns(residual), fused.duration_ns(residual));  // an add is one kernel in any stack
  // The cross-entropy over the logits: eager PyTorch ops in torchtitan and Megatron-LM, one fused pass in
  // trainyard's own executor.
  Task loss = norm;
  loss.op.code = OpCode::head_xent;
  const stacks::StackProfile own_stack = stacks::load_stack("trainyard", "test");  // the model keeps a pointer to it
  const ComputeModel own(node, own_stack);
  EXPECT_EQ(own.kernels(loss), 1);
  const double one_pass_ns = static_cast<double>(own.duration_ns(loss)) - launch;
  EXPECT_NEAR(static_cast<double>(model.duration_ns(loss)), one_pass_ns * eager.loss.hbm_passes.value + model.kernels(loss) * launch, 1);
  EXPECT_GT(stacks::load_stack("megatron-lm", "test").loss.hbm_passes.value, 8);
}

// --- JSON form ---------------------------------------------------------------------------------------------

namespace {
std::string graph_error(const std::string& tasks_json) {
  const std::string text = R"({"schema": "trainyard.taskgraph.v1", "tasks": )" + tasks_json + "}";
  try {
    GraphDocument doc = parse_graph(json::parse(text, "g.json"), "g.json");
    validate(doc.graph, 8, 1, "g.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(GraphJson, RoundTripsThroughTheBuilder) {
  TaskGraph g;
  const TaskId a = g.alloc("alloc x", 0, Pool::hbm, 1024, "x layer 0");
  const TaskId m = g.gemm("F L0 C0 qkv", 0, {64, 64, 64, hw::Dtype::bf16}, std::vector<TaskId>{a});
  const auto group = g.add_group({0, 1});
  g.collective("ar", {CollectiveOp::all_reduce, Algorithm::ring, group, 1024}, std::vector<TaskId>{m});
  g.collective("mirrored ar", {CollectiveOp::all_reduce, Algorithm::ring, group, 1024, 8}, std::vector<TaskId>{m});
  g.free("free x", a, std::vector<TaskId>{m});
  g.finalize();
  const json::Json j = graph_to_json(g);
  const GraphDocument back = parse_graph(j, "roundtrip");
  EXPECT_EQ(back.graph.size(), g.size());
  EXPECT_EQ(graph_to_json(back.graph).dump(), j.dump());
}

TEST(GraphJson, MalformedGraphsAreRejectedClearly) {
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {R"([{"name": "a", "kind": "gemm", "device": "gpu0", "m": 1, "n": 1, "k": 1},
           {"name": "a", "kind": "gemm", "device": "gpu0", "m": 1, "n": 1, "k": 1}])",
       {"g.json", "tasks[1].name", "a name no other task has"}},
      {R"([{"name": "a", "kind": "gemm", "device": "gpu0", "m": 1, "n": 1, "k": 1, "deps": ["nope"]}])", {"tasks[0].deps[0]", "\"nope\""}},
      {R"([{"name": "a", "kind": "gemm", "device": "gpu0", "m": 1, "n": 1, "k": 1, "deps": ["b"]},
           {"name": "b", "kind": "gemm", "device": "gpu0", "m": 1, "n": 1, "k": 1, "deps": ["a"]}])",
       {"no dependency cycle", "'a'"}},
      {R"([{"name": "a", "kind": "gemm", "device": "gpu0", "m": 1, "n": 1, "k": 1},
           {"name": "f", "kind": "free", "device": "gpu0", "alloc": "a"}])",
       {"tasks[1] 'f'.alloc", "the name of an alloc task"}},
      {R"([{"name": "a", "kind": "gemm", "device": "gpu9", "m": 1, "n": 1, "k": 1}])", {"tasks[0] 'a'.device", "gpu0..gpu7", "gpu9"}},
      {R"([{"name": "a", "kind": "gemm", "device": "cpu0", "m": 1, "n": 1, "k": 1}])", {"tasks[0].device", "\"gpu0\""}},
      {R"([{"name": "a", "kind": "gemm", "device": "gpu0", "m": 0, "n": 1, "k": 1}])", {"tasks[0].m", "got 0"}},
      {R"([{"name": "a", "kind": "matmul", "device": "gpu0"}])", {"tasks[0].kind", "gemm, attention"}},
      {R"([{"name": "a", "kind": "gemm", "device": "gpu0", "m": 1, "n": 1, "k": 1, "flops": 5}])", {"tasks[0].flops", "unknown field"}},
      {R"([{"name": "c", "kind": "collective", "op": "all_reduce", "group": ["gpu0"], "bytes": 8}])", {"tasks[0].group", "at least 2"}},
      {R"([{"name": "c", "kind": "collective", "op": "all_gather", "algorithm": "tree", "group": ["gpu0", "gpu1"], "bytes": 8}])",
       {"'c'.algorithm", "ring or direct"}},
      {R"([{"name": "p", "kind": "p2p", "device": "gpu0", "dst": "gpu0", "bytes": 8}])", {"'p'.dst", "other than the sender"}},
      {R"([{"name": "c", "kind": "collective", "op": "all_to_all", "group": ["gpu0", "gpu1"], "bytes": 8, "ring_ranks": 4}])",
       {"'c'.ring_ranks", "only on a ring all_reduce"}},
      {R"([{"name": "c", "kind": "collective", "op": "all_reduce", "group": ["gpu0", "gpu1", "gpu2"], "bytes": 6, "ring_ranks": 2}])",
       {"'c'.ring_ranks", "at least the group size (3)"}},
      {R"([{"name": "c", "kind": "collective", "op": "all_reduce", "group": ["gpu0", "gpu1"], "bytes": 6, "ring_ranks": 4}])",
       {"'c'.bytes", "a multiple of the ring_ranks (4)"}},
      {R"([{"name": "x", "kind": "attention", "device": "gpu0", "q_len": 8, "kv_len": 4, "heads": 2, "kv_heads": 2, "head_dim": 8, "causal": true, "backward": false}])",
       {"'x'.q_len", "at most kv_len"}},
      {R"([{"name": "h", "kind": "gemm", "device": "host0", "m": 1, "n": 1, "k": 1}])",
       {"'h'", "only optimizer, alloc and free tasks run on a host"}},
  };
  for (const auto& [tasks, expected] : cases) {
    SCOPED_TRACE(tasks);
    const std::string msg = graph_error(tasks);
    ASSERT_FALSE(msg.empty()) << "accepted";
    for (const auto& part : expected) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
  EXPECT_NE(graph_error("[]").find("non-empty array"), std::string::npos);
  // A cycle through the implicit alloc -> free edge is a cycle too.
  const std::string through_free = graph_error(R"([
      {"name": "a", "kind": "alloc", "device": "gpu0", "pool": "hbm", "bytes": 8, "label": "x", "deps": ["f"]},
      {"name": "f", "kind": "free", "device": "gpu0", "alloc": "a"}])");
  EXPECT_NE(through_free.find("no dependency cycle"), std::string::npos) << through_free;
}

}  // namespace trainyard::sim

namespace trainyard::sim {

// The incremental recomputation must give exactly what a from-scratch max-min filling of all active flows
// gives, after every start and finish, on random routes, capacities and caps.
TEST(FlowNetwork, IncrementalRatesEqualAFullRecomputation) {
  struct RefFlow {
    std::vector<std::int32_t> route;
    double cap;
  };
  auto reference = [](const std::vector<double>& capacity, const std::map<int, RefFlow>& flows) {
    std::map<int, double> rate;
    std::vector<double> remaining = capacity;
    std::set<int> unfrozen;
    for (const auto& [id, _] : flows) unfrozen.insert(id);
    while (!unfrozen.empty()) {
      std::vector<int> count(capacity.size(), 0);
      for (int id : unfrozen) {
        for (auto r : flows.at(id).route) ++count[r];
      }
      double share = FlowNetwork::kUncapped;
      int bottleneck = -1;
      for (std::size_t r = 0; r < capacity.size(); ++r) {
        if (count[r] > 0 && std::max(0.0, remaining[r]) / count[r] < share) {
          share = std::max(0.0, remaining[r]) / count[r];
          bottleneck = static_cast<int>(r);
        }
      }
      double cap = FlowNetwork::kUncapped;
      for (int id : unfrozen) cap = std::min(cap, flows.at(id).cap);
      std::vector<int> freeze;
      for (int id : unfrozen) {
        const auto& route = flows.at(id).route;
        const bool on_bottleneck = std::find(route.begin(), route.end(), bottleneck) != route.end();
        if (cap <= share ? flows.at(id).cap <= cap : on_bottleneck) freeze.push_back(id);
      }
      for (int id : freeze) {
        rate[id] = cap <= share ? flows.at(id).cap : share;
        for (auto r : flows.at(id).route) remaining[r] -= rate[id];
        unfrozen.erase(id);
      }
    }
    return rate;
  };

  for (unsigned seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const int resources = 8;
    std::vector<double> capacity;
    for (int r = 0; r < resources; ++r) capacity.push_back(1 + static_cast<double>(rng() % 40));
    FlowNetwork net(capacity);
    std::map<int, RefFlow> live;
    std::int64_t now = 0;
    for (int op = 0; op < 200; ++op) {
      now += static_cast<std::int64_t>(rng() % 5);
      if (live.empty() || rng() % 3 != 0) {
        RefFlow f;
        const int hops = 1 + static_cast<int>(rng() % 6);  // with 8 resources, repeats (3+ times too) are common
        for (int h = 0; h < hops; ++h) f.route.push_back(static_cast<std::int32_t>(rng() % resources));
        f.cap = rng() % 2 ? FlowNetwork::kUncapped : 1 + static_cast<double>(rng() % 20);
        const int id = net.start(f.route, 1e12, f.cap, now, 0);
        live[id] = f;
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        net.finish(it->first, now);
        live.erase(it);
      }
      const auto expected = reference(capacity, live);
      for (const auto& [id, r] : expected) {
        ASSERT_NEAR(net.rate(id), r, 1e-9 * std::max(1.0, r)) << "seed " << seed << " op " << op << " flow " << id;
      }
    }
  }
}

}  // namespace trainyard::sim

namespace trainyard::sim {

// The chunk length a graph carries for the executors survives the graph's copies and merges, and a merge of
// graphs built with different chunks carries none (so an executor refuses it rather than guess).
TEST(TaskGraph, TheChunkLengthSurvivesCopiesAndMergesOnlyWhenItAgrees) {
  TaskGraph a, b, c;
  a.set_chunk_tokens(4096);
  a.set_sequence_tokens(16384);
  a.gemm("a", 0, {16, 16, 16});
  b.set_chunk_tokens(4096);
  b.set_sequence_tokens(16384);
  b.gemm("b", 0, {16, 16, 16});
  c.set_chunk_tokens(8192);
  c.gemm("c", 0, {16, 16, 16});
  EXPECT_EQ(without_tasks(a, [](const Task&) { return false; }).chunk_tokens(), 4096);
  EXPECT_EQ(without_tasks(a, [](const Task&) { return false; }).sequence_tokens(), 16384);
  TaskGraph merged;
  append(merged, a);
  EXPECT_EQ(merged.chunk_tokens(), 4096);
  append(merged, b);
  EXPECT_EQ(merged.chunk_tokens(), 4096);
  EXPECT_EQ(merged.sequence_tokens(), 16384);
  append(merged, c);
  EXPECT_EQ(merged.chunk_tokens(), 0);
  EXPECT_EQ(merged.sequence_tokens(), 0);
}

}  // namespace trainyard::sim
