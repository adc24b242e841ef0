// Golden-number tests of the simulator on tests/data/tiny-node.json: 4 GPUs of 100 TFLOP/s bf16, 1000 GB/s
// HBM, 1 GiB each; gpu0-2 and a NIC behind one PCIe Gen4 x16 switch (31.5077 GB/s per direction), gpu3 straight
// on the root complex; copy engines capped at 25 GB/s; NVLink 100 GB/s per direction with 1000 ns per hop;
// DRAM 100 GB/s (half duplex); PCIe and DRAM latencies 0; kernel launch 0.
#include <cmath>
#include <sstream>

#include <gtest/gtest.h>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "sim/engine.hpp"
#include "sim/event_queue.hpp"
#include "sim/graph_json.hpp"
#include "sim/report.hpp"
#include "test_support.hpp"

namespace trainyard::sim {

namespace {

const double kPcie = hw::pcie_GBps_per_direction(4, 16);  // 31.5077 GB/s = bytes/ns

Cluster tiny(int nodes = 1) { return Cluster(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), nodes, test::ideal_stack()); }

SimResult run(TaskGraph& graph, const Cluster& cluster) {
  validate(graph, cluster.gpus(), cluster.nodes, "test graph");
  graph.finalize();
  SimResult r = simulate(graph, cluster);
  EXPECT_TRUE(r.completed) << r.stuck;
  return r;
}

std::int64_t ceil_ns(double ns) { return static_cast<std::int64_t>(std::ceil(ns)); }

Copy h2d(std::int64_t bytes) { return {Copy::Direction::h2d, bytes, true}; }
Copy d2h(std::int64_t bytes) { return {Copy::Direction::d2h, bytes, true}; }

}  // namespace

TEST(SimEngine, TwoFlowsOnOneLinkEachGetHalf) {
  // gpu0 and gpu1 each send 1e8 bytes to gpu2 at once: both cross nvswitch->gpu2 (100 GB/s), 50 GB/s each:
  // 1e8 / 50 = 2,000,000 ns, plus 2 NVLink hops of 1000 ns.
  const Cluster c = tiny();
  TaskGraph g2;
  const TaskId x = g2.send("x", 0, 2, 100'000'000);
  const TaskId y = g2.send("y", 1, 2, 100'000'000);
  const SimResult r = run(g2, c);
  EXPECT_EQ(r.timing[x].end_ns, 2'000'000 + 2'000);
  EXPECT_EQ(r.timing[y].end_ns, 2'000'000 + 2'000);
}

TEST(SimEngine, H2DAndD2HAtOnceEachGetFullDuplexBandwidth) {
  // gpu3: 2.5e8 bytes up and 2.5e8 down at once. PCIe is full duplex and DRAM (100 GB/s) has room for both,
  // so each runs at its copy engine's 25 GB/s: 10,000,000 ns. Half duplex would give 15.75 GB/s each.
  const Cluster c = tiny();
  TaskGraph g;
  const TaskId up = g.copy("up", 3, h2d(250'000'000));
  const TaskId down = g.copy("down", 3, d2h(250'000'000));
  const SimResult r = run(g, c);
  EXPECT_EQ(r.timing[up].end_ns, 10'000'000);
  EXPECT_EQ(r.timing[down].end_ns, 10'000'000);
}

TEST(SimEngine, ThreeGpusBehindOneSwitchShareItsUplink) {
  // gpu0-2 each copy 1e9 bytes host-to-device: the switch uplink cpu0->sw0 (31.5077 GB/s) is the bottleneck,
  // 10.5026 GB/s each (under the 25 GB/s engine cap): 1e9 / (31.5077 / 3) ns.
  const Cluster c = tiny();
  TaskGraph g;
  std::vector<TaskId> copies;
  for (int gpu = 0; gpu < 3; ++gpu) copies.push_back(g.copy("h2d" + std::to_string(gpu), gpu, h2d(1'000'000'000)));
  const SimResult r = run(g, c);
  for (TaskId t : copies) EXPECT_EQ(r.timing[t].end_ns, ceil_ns(1e9 / (kPcie / 3))) << t;
  // gpu3 is not behind the switch: alone it gets its engine's 25 GB/s.
  TaskGraph g3;
  const TaskId alone = g3.copy("h2d3", 3, h2d(1'000'000'000));
  EXPECT_EQ(run(g3, c).timing[alone].end_ns, 40'000'000);
}

TEST(SimEngine, NicTrafficSharesTheSwitchWithGpus) {
  // Two nodes. gpu0 of node 0 sends 1e8 bytes to gpu0 of node 1 (gpu4) through the 10 GB/s NIC under sw0:
  // 10,000,000 ns. gpu1 copies to host at the same time through the same switch; the NIC flow uses
  // gpu0->sw0->nic0 and the copy gpu1->sw0->cpu0, so the copy keeps its 25 GB/s: 2.5e8 / 25 = 10,000,000 ns.
  const Cluster c = tiny(2);
  TaskGraph g;
  const TaskId net = g.send("net", 0, 4, 100'000'000);
  const TaskId copy = g.copy("d2h", 1, d2h(250'000'000));
  const SimResult r = run(g, c);
  EXPECT_EQ(r.timing[net].end_ns, 10'000'000);
  EXPECT_EQ(r.timing[copy].end_ns, 10'000'000);
}

TEST(SimEngine, RingAllReduceTakesTwoNMinusOneSteps) {
  // n = 4 GPUs, B = 4e8 bytes: 2(n-1) = 6 steps of B/n = 1e8 bytes at 100 GB/s (each GPU sends one flow and
  // receives one; no link is shared) = 1,000,000 ns each. NCCL's Simple protocol (stacks/collectives/nccl.json)
  // wins at this size: its base latency 8.4 us once, and 3.4 us per step over NVLink:
  // 6 * 1,000,000 + 8,400 + 6 * 3,400 = 6,028,800 ns = 2(n-1)/n * B / bw + base + 2(n-1) * step latency.
  const Cluster c = tiny();
  TaskGraph g;
  const auto group = g.add_group({0, 1, 2, 3});
  const TaskId ar = g.collective("ar", {CollectiveOp::all_reduce, Algorithm::ring, group, 400'000'000});
  const SimResult r = run(g, c);
  EXPECT_EQ(r.timing[ar].end_ns, 6'028'800);
  ASSERT_EQ(r.collective_protocols.size(), 1u);
  EXPECT_EQ(r.protocol_names[r.collective_protocols[0].second], "Simple");
}

TEST(SimEngine, DependencyChainAcrossStreams) {
  // gemm 1000^3 on gpu3: 2e9 FLOPs at 100 TFLOP/s x 0.5 = 40,000 ns (memory 6e6 bytes / 1000 GB/s = 6,000 ns);
  // then D2H 2.5e7 bytes at 25 GB/s = 1,000,000 ns; then H2D back, 1,000,000 ns; then the gemm again.
  const Cluster c = tiny();
  TaskGraph g;
  const Gemm gemm{1000, 1000, 1000, hw::Dtype::bf16};
  const TaskId g1 = g.gemm("g1", 3, gemm);
  const TaskId down = g.copy("down", 3, d2h(25'000'000), std::vector<TaskId>{g1});
  const TaskId up = g.copy("up", 3, h2d(25'000'000), std::vector<TaskId>{down});
  const TaskId g2 = g.gemm("g2", 3, gemm, std::vector<TaskId>{up});
  const SimResult r = run(g, c);
  EXPECT_EQ(r.timing[g1].end_ns, 40'000);
  EXPECT_EQ(r.timing[down].end_ns, 1'040'000);
  EXPECT_EQ(r.timing[up].end_ns, 2'040'000);
  EXPECT_EQ(r.timing[g2].start_ns, 2'040'000);
  EXPECT_EQ(r.step_ns, 2'080'000);
  // The compute stream waited 2,000,000 ns on the copies: all of it is exposed transfer time.
  EXPECT_EQ(r.exposed_transfer_ns[3], 2'000'000);
  // MFU: 4e9 model FLOPs over 2.08 ms on 4 GPUs of 100 TFLOP/s.
  EXPECT_NEAR(r.mfu(), 4e9 / (2.08e-3 * 4 * 100e12), 1e-12);
}

TEST(SimEngine, StreamsAreInOrder) {
  // Two H2D copies on one GPU share its single copy engine: the second starts when the first ends.
  const Cluster c = tiny();
  TaskGraph g;
  const TaskId first = g.copy("first", 3, h2d(25'000'000));
  const TaskId second = g.copy("second", 3, h2d(25'000'000));
  const SimResult r = run(g, c);
  EXPECT_EQ(r.timing[first].end_ns, 1'000'000);
  EXPECT_EQ(r.timing[second].start_ns, 1'000'000);
  EXPECT_EQ(r.timing[second].end_ns, 2'000'000);
}

TEST(SimEngine, OutOfMemoryIsReportedAtTheRightTaskWithTheExcess) {
  // 1 GiB = 1024 MiB of HBM: 700 MiB + 300 MiB live (a 10 MiB scratch came and went), then 124 MiB more is
  // 100 MiB (104,857,600 bytes) over.
  const Cluster c = tiny();
  TaskGraph g;
  const TaskId a = g.alloc("a", 0, Pool::hbm, 700 << 20, "kv layer 0 chunk 0");
  const TaskId b = g.alloc("b", 0, Pool::hbm, 300 << 20, "activations layer 0", std::vector<TaskId>{a});
  const TaskId small = g.alloc("small", 0, Pool::hbm, 10 << 20, "scratch", std::vector<TaskId>{b});
  const TaskId freed = g.free("free small", small);
  const TaskId over = g.alloc("too much", 0, Pool::hbm, 124 << 20, "kv layer 0 chunk 1", std::vector<TaskId>{freed});
  const TaskId after = g.gemm("after", 0, {1000, 1000, 1000, hw::Dtype::bf16}, std::vector<TaskId>{over});
  validate(g, c.gpus(), c.nodes, "test graph");
  g.finalize();
  const SimResult r = simulate(g, c);
  EXPECT_FALSE(r.completed);
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_EQ(r.oom->task, over);
  EXPECT_EQ(r.oom->pool, "gpu0 hbm");
  EXPECT_EQ(r.oom->in_use_bytes, 1000 << 20);
  EXPECT_EQ(r.oom->excess_bytes, 104'857'600);
  ASSERT_EQ(r.oom->largest_live.size(), 2u);
  EXPECT_EQ(r.oom->largest_live[0].first, "kv layer 0 chunk 0");
  EXPECT_EQ(r.oom->largest_live[1].first, "activations layer 0");
  EXPECT_EQ(r.timing[after].start_ns, -1);  // nothing ran past the failure
  EXPECT_NE(r.oom->describe(g).find("100.0 MiB (104857600 bytes) over"), std::string::npos) << r.oom->describe(g);
}

TEST(SimEngine, NothingRunsAfterTheFirstOutOfMemory) {
  // x's successors: a1 does not fit, a2 would, a3 does not either. The run stops at a1 and starts nothing else.
  const Cluster c = tiny();
  TaskGraph g;
  const TaskId x = g.gemm("x", 0, {100, 100, 100, hw::Dtype::bf16});
  const std::vector<TaskId> after{x};
  const TaskId a1 = g.alloc("a1", 0, Pool::hbm, 2LL << 30, "too big", after);
  const TaskId a2 = g.alloc("a2", 0, Pool::hbm, 1 << 20, "fits", after);
  g.alloc("a3", 0, Pool::hbm, 3LL << 30, "also too big", after);
  validate(g, c.gpus(), c.nodes, "test graph");
  g.finalize();
  const SimResult r = simulate(g, c);
  ASSERT_TRUE(r.oom.has_value());
  EXPECT_EQ(r.oom->task, a1);
  EXPECT_EQ(r.timing[a2].start_ns, -1);
  EXPECT_EQ(r.pools[0].peak_bytes, 0);
}

TEST(SimEngine, SizesBeyondTheClockAreInputErrors) {
  const Cluster c = tiny();
  TaskGraph g;
  g.gemm("huge", 0, {1LL << 30, 1LL << 30, 1LL << 30, hw::Dtype::bf16});
  validate(g, c.gpus(), c.nodes, "test graph");
  g.finalize();
  try {
    simulate(g, c);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("task 'huge'"), std::string::npos) << e.what();
  }
}

TEST(SimEngine, DeadlockBehindACollectiveNamesTheBlockingTask) {
  // On gpu1's comm stream s0 comes first but depends on the all-reduce c1, which is queued behind it there.
  const Cluster c = tiny();
  TaskGraph g;
  const auto group = g.add_group({0, 1});
  const TaskId s0 = g.send("s0", 1, 2, 1000);
  const TaskId c1 = g.collective("c1", {CollectiveOp::all_reduce, Algorithm::ring, group, 1000});
  g.add_dependency(c1, s0);
  validate(g, c.gpus(), c.nodes, "test graph");
  g.finalize();
  const SimResult r = simulate(g, c);
  EXPECT_FALSE(r.completed);
  EXPECT_NE(r.stuck.find("'s0'"), std::string::npos) << r.stuck;
  EXPECT_NE(r.stuck.find("'c1'"), std::string::npos) << r.stuck;
}

TEST(SimEngine, MemoryPeaksAndDramPool) {
  const Cluster c = tiny();
  TaskGraph g;
  const TaskId a = g.alloc("a", 1, Pool::hbm, 100 << 20, "x");
  const TaskId f = g.free("fa", a);
  const TaskId b = g.alloc("b", 1, Pool::hbm, 50 << 20, "y", std::vector<TaskId>{f});
  const TaskId h = g.alloc("h", host_device(0), Pool::dram, 1 << 30, "host kv");
  (void)b;
  (void)h;
  const SimResult r = run(g, c);
  EXPECT_EQ(r.pools[1].peak_bytes, 100 << 20);
  EXPECT_EQ(r.pools[4].name, "host0 dram");
  EXPECT_EQ(r.pools[4].peak_bytes, 1 << 30);
}

TEST(SimEngine, StagedPeerCopyWithoutPeerToPeerCrossesHostMemory) {
  // RTX 4090 server: no NVLink, no P2P. gpu0 -> gpu1 goes up to DRAM and back down: the half-duplex DRAM link
  // carries the bytes twice.
  const Cluster c(hw::load_node("pcie-4090x8"), 1);
  TaskGraph g;
  g.send("x", 0, 1, 1'000'000);
  const SimResult r = run(g, c);
  bool found = false;
  for (const auto& l : r.links) {
    if (l.name == "cpu0<->dram0") {
      found = true;
      EXPECT_DOUBLE_EQ(l.bytes, 2'000'000);
    }
  }
  EXPECT_TRUE(found);
}

TEST(SimEngine, StreamOrderDeadlockIsReported) {
  // On one compute stream, "first" waits for "second", which is queued behind it.
  const Cluster c = tiny();
  TaskGraph g;
  const TaskId first = g.gemm("first", 0, {100, 100, 100, hw::Dtype::bf16});
  const TaskId second = g.gemm("second", 0, {100, 100, 100, hw::Dtype::bf16});
  g.add_dependency(second, first);
  validate(g, c.gpus(), c.nodes, "test graph");
  g.finalize();
  const SimResult r = simulate(g, c);
  EXPECT_FALSE(r.completed);
  EXPECT_NE(r.stuck.find("deadlock"), std::string::npos) << r.stuck;
  EXPECT_NE(r.stuck.find("'first'"), std::string::npos) << r.stuck;
}

TEST(EventQueue, TiesAreFifoAndTimeNeverGoesBack) {
  EventQueue q;
  q.push(5, 0, 1);
  q.push(5, 0, 2);
  q.push(3, 0, 3);
  q.push(5, 0, 4);
  EXPECT_EQ(q.pop().id, 3);
  EXPECT_EQ(q.pop().id, 1);
  EXPECT_EQ(q.pop().id, 2);
  EXPECT_EQ(q.pop().id, 4);
  EXPECT_EQ(q.now_ns(), 5);
  EXPECT_THROW(q.push(4, 0, 9), InternalError);
}

TEST(SimEngine, RunsAreDeterministic) {
  const Cluster c(hw::load_node("dgx-a100"), 1);
  GraphDocument doc = load_graph(std::string(TRAINYARD_SOURCE_DIR) + "/examples/two-gpu-offload.json");
  validate(doc.graph, c.gpus(), c.nodes, "example");
  doc.graph.finalize();
  std::string traces[2], metrics[2];
  for (int i = 0; i < 2; ++i) {
    const SimResult r = simulate(doc.graph, c);
    ASSERT_TRUE(r.completed);
    std::ostringstream trace;
    write_chrome_trace(trace, r, doc.graph, c);
    traces[i] = trace.str();
    metrics[i] = metrics_json(r, doc.graph, c).dump();
  }
  EXPECT_EQ(traces[0], traces[1]);
  EXPECT_EQ(metrics[0], metrics[1]);
  const auto parsed = nlohmann::json::parse(traces[0]);
  EXPECT_GT(parsed["traceEvents"].size(), 10u);
}

}  // namespace trainyard::sim

namespace trainyard::sim {

TEST(SimEngine, TheSameTransfersTakeTheSameTimeOnEveryNode) {
  // Routes inside node n are node 0's shifted; transfers between nodes cross the fabric. Check by timing one
  // pattern on node 0 and on node 2 of a 3-node DGX H100 cluster, and between nodes 0-1 and 1-2.
  const Cluster c(hw::load_node("dgx-h100"), 3);
  auto pattern = [&](int base, int peer_base) {
    TaskGraph g;
    std::vector<TaskId> ids;
    ids.push_back(g.copy("up", base + 1, {Copy::Direction::h2d, 300'000'000, true}));
    ids.push_back(g.copy("down", base + 3, {Copy::Direction::d2h, 200'000'000, false}));
    ids.push_back(g.send("nvlink", base + 2, base + 6, 500'000'000));
    ids.push_back(g.send("network", base + 5, peer_base + 5, 100'000'000));
    const SimResult r = run(g, c);
    std::vector<std::int64_t> ends;
    for (TaskId t : ids) ends.push_back(r.timing[t].end_ns);
    return ends;
  };
  EXPECT_EQ(pattern(0, 8), pattern(8, 16));
  EXPECT_EQ(pattern(0, 8), pattern(16, 0));
}

}  // namespace trainyard::sim

namespace trainyard::sim {

TEST(SimEngine, ACancelFlagStopsTheRunEarly) {
  const Cluster c = tiny();
  auto chain = [] {
    TaskGraph g;
    TaskId last = g.gemm("g0", 0, {256, 256, 256, hw::Dtype::bf16});
    for (int i = 1; i < 20000; ++i) last = g.gemm("g" + std::to_string(i), 0, {256, 256, 256, hw::Dtype::bf16}, std::vector<TaskId>{last});
    g.finalize();
    return g;
  };
  const TaskGraph g = chain();
  std::atomic<bool> cancel{false};
  SimOptions options;
  options.cancel = &cancel;
  const SimResult whole = simulate(g, c, options);  // not set: runs to the end
  EXPECT_TRUE(whole.completed);
  cancel = true;
  const SimResult stopped = simulate(g, c, options);
  EXPECT_FALSE(stopped.completed);
  EXPECT_EQ(stopped.stuck, "cancelled");
  EXPECT_LT(stopped.events, whole.events);
}

}  // namespace trainyard::sim

namespace trainyard::sim {

TEST(SimEngine, ACollectiveHoldsSmsFromTheGemmsItOverlaps) {
  // The tiny GPU has 100 SMs; say a collective keeps 20 of them. A GEMM on gpu0 that starts with an all-reduce
  // of gpu0 and gpu1 runs at 80% until the all-reduce ends, then at full rate: it ends 0.2 x (the all-reduce's
  // time) later than the same GEMM on gpu3, which the all-reduce does not touch.
  hw::NodeProfile node = hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json");
  node.gpu.sustained.collective_ctas.value = 20;
  const Cluster c(std::move(node), 1, test::ideal_stack());
  TaskGraph g;
  const Gemm big{10000, 10000, 10000, hw::Dtype::bf16};
  const TaskId shared = g.gemm("shared", 0, big);
  const TaskId alone = g.gemm("alone", 3, big);
  const TaskId ar = g.collective("ar", {CollectiveOp::all_reduce, Algorithm::ring, g.add_group({0, 1}), 400'000'000});
  const SimResult r = run(g, c);
  const std::int64_t full = r.timing[alone].end_ns, ar_ns = r.timing[ar].end_ns;
  ASSERT_GT(full, ar_ns);  // the GEMM outlasts the all-reduce
  EXPECT_NEAR(static_cast<double>(r.timing[shared].end_ns), static_cast<double>(full) + 0.2 * static_cast<double>(ar_ns), 2);
  EXPECT_NEAR(static_cast<double>(r.collective_sm_ns), 0.2 * static_cast<double>(ar_ns), 2);
  // The compute class counts the time the kernels took.
  EXPECT_EQ(r.compute_classes[static_cast<std::size_t>(TaskKind::gemm)].busy_ns, r.timing[shared].end_ns + full);
  // Without the figure (0: not modelled) both GEMMs take the same time.
  const Cluster plain = tiny();
  TaskGraph g2;
  const TaskId a = g2.gemm("shared", 0, big);
  g2.collective("ar", {CollectiveOp::all_reduce, Algorithm::ring, g2.add_group({0, 1}), 400'000'000});
  EXPECT_EQ(run(g2, plain).timing[a].end_ns, full);
}

}  // namespace trainyard::sim
