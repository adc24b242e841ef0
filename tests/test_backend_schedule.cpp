// The executor's plan, checked on the CPU: per-rank steps in a valid submission order, event waits pruned to
// what stream order does not already give, arenas with offsets that never overlap in time, and reuse that waits
// for the previous owner's last user.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "backend/measured.hpp"
#include "backend/schedule.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "sim/engine.hpp"
#include "test_support.hpp"

namespace trainyard::backend {

namespace {

using sim::Stream;
using sim::StreamKind;
using sim::TaskGraph;
using sim::TaskId;

const Submission& submission_of(const RankSchedule& s, TaskId t) {
  for (const auto& step : s.submissions) {
    if (step.task == t) return step;
  }
  throw std::runtime_error("task " + std::to_string(t) + " not scheduled");
}

// Every wait refers to a step submitted earlier, on another stream; every task appears once.
void expect_valid(const RankSchedule& s) {
  std::map<TaskId, std::size_t> at;
  for (std::size_t i = 0; i < s.submissions.size(); ++i) {
    EXPECT_TRUE(at.emplace(s.submissions[i].task, i).second) << "task " << s.submissions[i].task << " twice";
    for (TaskId w : s.submissions[i].waits) {
      ASSERT_TRUE(at.count(w)) << "step " << s.submissions[i].task << " waits for " << w << ", not submitted before it";
      EXPECT_NE(s.submissions[at[w]].slot, s.submissions[i].slot);
      EXPECT_TRUE(s.waited_on[w]);
    }
  }
}

sim::TaskId compute(TaskGraph& g, const std::string& name, sim::DeviceId gpu, std::initializer_list<TaskId> deps = {}) {
  return g.add(name, {gpu, {StreamKind::compute, 0}, false, sim::Gemm{128, 128, 128}}, deps);
}

}  // namespace

TEST(BackendSchedule, CrossStreamDependenciesBecomeWaitsPrunedByStreamOrder) {
  TaskGraph g;
  const TaskId a = compute(g, "a", 0);
  const TaskId b = compute(g, "b", 0);
  const TaskId up = g.copy("H2D x", 0, {sim::Copy::Direction::h2d, 1 << 20, true}, {{a}});
  const TaskId c = compute(g, "c", 0, {a, b, up});                                               // a and b: same stream, no wait; up: another stream
  const TaskId down = g.copy("D2H y", 0, {sim::Copy::Direction::d2h, 1 << 20, true}, {{a, b}});  // b is later on compute0
  g.finalize();
  const RankSchedule s = make_schedule(g, 0, 8);
  expect_valid(s);
  ASSERT_EQ(s.submissions.size(), 5u);
  EXPECT_EQ(s.streams.size(), 3u);
  EXPECT_EQ(submission_of(s, c).waits, std::vector<TaskId>{up});
  EXPECT_EQ(submission_of(s, down).waits, std::vector<TaskId>{b});  // a is implied: compute0 runs a before b
  EXPECT_EQ(submission_of(s, up).waits, std::vector<TaskId>{a});
  EXPECT_FALSE(s.waited_on[c]);
  EXPECT_EQ(s.streams[submission_of(s, up).slot].name(), "gpu0 h2d");
}

TEST(BackendSchedule, ArenaReusesFreedBytesOnlyAfterTheirLastUser) {
  TaskGraph g;
  const TaskId x = g.alloc("alloc x", 0, sim::Pool::hbm, 4000, "x");
  const TaskId use_x = g.copy("H2D x", 0, {sim::Copy::Direction::h2d, 4000, true}, {{x}});
  const TaskId free_x = g.free("free x", x, {{use_x}});
  const TaskId y = g.alloc("alloc y", 0, sim::Pool::hbm, 4000, "y", {{free_x}});
  const TaskId z = g.alloc("alloc z", 0, sim::Pool::hbm, 1000, "z");  // live beside x and y
  const TaskId use_y = compute(g, "use y", 0, {y, z});
  g.finalize();
  const RankSchedule s = make_schedule(g, 0, 8);
  expect_valid(s);
  ASSERT_EQ(s.submissions.size(), 2u);  // allocs and frees take no stream
  EXPECT_EQ(s.hbm.offset_bytes.at(x), 0);
  EXPECT_EQ(s.hbm.offset_bytes.at(y), 0);     // x's bytes, reused
  EXPECT_EQ(s.hbm.offset_bytes.at(z), 4096);  // beside them, 256-byte aligned
  EXPECT_EQ(s.hbm.size_bytes, 4096 + 1024);
  // use_y runs on compute0; y's bytes were last used by the H2D copy, so it waits for it through the free.
  EXPECT_EQ(submission_of(s, use_y).waits, std::vector<TaskId>{use_x});
}

TEST(BackendSchedule, ReuseWaitsEvenWithoutADependencyOnTheFree) {
  // Two independent buffers in sequence: the second reuses the first's bytes, so its user waits for the first's.
  TaskGraph g;
  const TaskId x = g.alloc("alloc x", 0, sim::Pool::hbm, 4096, "x");
  const TaskId use_x = g.copy("D2H x", 0, {sim::Copy::Direction::d2h, 4096, true}, {{x}});
  g.free("free x", x, {{use_x}});
  const TaskId later = compute(g, "later", 0, {use_x});
  const TaskId y = g.alloc("alloc y", 0, sim::Pool::hbm, 2048, "y", {{later}});
  const TaskId use_y = g.copy("H2D y", 0, {sim::Copy::Direction::h2d, 2048, true}, {{y}});
  g.finalize();
  const RankSchedule s = make_schedule(g, 0, 8);
  expect_valid(s);
  EXPECT_EQ(s.hbm.offset_bytes.at(y), 0);
  const auto& waits = submission_of(s, use_y).waits;
  EXPECT_TRUE(std::find(waits.begin(), waits.end(), later) != waits.end());
  EXPECT_TRUE(std::find(waits.begin(), waits.end(), use_x) != waits.end());
}

TEST(BackendSchedule, SendsReceivesAndCollectivesReachEveryRankInvolved) {
  TaskGraph g;
  const TaskId f0 = compute(g, "F gpu0", 0);
  const std::vector<TaskId> after_f0{f0};
  const TaskId send = g.send("send act", 0, 1, 1 << 20, after_f0);
  const TaskId f1 = compute(g, "F gpu1", 1, {send});
  const auto group = g.add_group({0, 1});
  const TaskId ar = g.collective("ar grads", {sim::CollectiveOp::all_reduce, sim::Algorithm::ring, group, 1 << 20}, std::vector<TaskId>{f0, f1}, 1);
  const TaskId alone = compute(g, "gpu2 only", 2);
  g.finalize();
  const RankSchedule r0 = make_schedule(g, 0, 8), r1 = make_schedule(g, 1, 8);
  expect_valid(r0);
  expect_valid(r1);
  EXPECT_EQ(r0.submissions.size(), 3u);  // F gpu0, send, ar
  EXPECT_EQ(r1.submissions.size(), 3u);  // recv, F gpu1, ar
  EXPECT_FALSE(r0.streams[submission_of(r0, send).slot].receive);
  EXPECT_TRUE(r1.streams[submission_of(r1, send).slot].receive);
  EXPECT_EQ(r1.streams[submission_of(r1, send).slot].name(), "gpu1 comm0 recv from gpu0");
  EXPECT_EQ(submission_of(r1, f1).waits, std::vector<TaskId>{send});
  EXPECT_EQ(submission_of(r1, ar).waits, std::vector<TaskId>{f1});
  // The receive's and the all-reduce's dependencies on gpu0's forward: held by NCCL (the send matches the
  // receive only after gpu0's forward; the all-reduce completes only with gpu0's share).
  EXPECT_EQ(r1.remote_dependencies, 2);
  for (const auto& st : r0.submissions) EXPECT_NE(st.task, alone);
}

TEST(BackendSchedule, StreamOrderAgainstTheDependenciesIsAnError) {
  TaskGraph g;
  const TaskId first = compute(g, "first", 0);
  const TaskId second = compute(g, "second", 0);
  g.add_dependency(second, first);  // compute0 runs `first` before `second`, yet it waits for `second`
  g.finalize();
  try {
    make_schedule(g, 0, 8);
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'first' on gpu0 can never start"), std::string::npos) << e.what();
  }
}

// Two peers send to gpu0 on the same comm stream index, and the graph orders the later-numbered send first (a
// pipeline's gradient from the next stage before the cp ring's block that needs it). One receive queue per comm
// stream would hold the ring's receive ahead of the gradient it waits for; each sender has its own.
TEST(BackendSchedule, ReceivesFromTwoPeersQueueApart) {
  TaskGraph g;
  const TaskId produce = compute(g, "F gpu2", 2);
  const TaskId ring_source = compute(g, "F gpu1", 1);
  const std::vector<TaskId> after_ring{ring_source};
  const TaskId ring = g.send("ring block", 1, 0, 1 << 10, after_ring, 1);  // lower id, yet after the gradient
  const std::vector<TaskId> after_produce{produce};
  const TaskId gradient = g.send("pipeline grad", 2, 0, 1 << 10, after_produce, 1);
  g.add_dependency(gradient, ring_source);  // the ring's block is made after the gradient is sent
  const TaskId use = compute(g, "B gpu0", 0, {ring, gradient});
  g.finalize();
  const RankSchedule r0 = make_schedule(g, 0, 8);
  expect_valid(r0);
  const auto& ring_slot = r0.streams[submission_of(r0, ring).slot];
  const auto& gradient_slot = r0.streams[submission_of(r0, gradient).slot];
  EXPECT_NE(submission_of(r0, ring).slot, submission_of(r0, gradient).slot);
  EXPECT_EQ(ring_slot.name(), "gpu0 comm1 recv from gpu1");
  EXPECT_EQ(gradient_slot.name(), "gpu0 comm1 recv from gpu2");
  (void)use;
}

// A real ring-track plan scheduled in the simulator's order: every rank's schedule is valid, and its HBM arena
// holds the simulator's peak (it can only be larger: alignment and fragmentation), within 5%.
TEST(BackendSchedule, RingTrackPlanSchedulesOnEveryRank) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/ring-node.json"), 1, test::ideal_stack());
  const planner::StepInputs in{m, c, {2048, 2}, model::precision_policy("bf16-mixed")};  // two replicas of a 2-GPU ring
  planner::RingTrackParams p;
  p.ring = 2;
  p.chunk = 512;
  p.kv = planner::Placement::dram;
  planner::RingTrackPlan plan = planner::build_ringtrack(in, p);
  sim::validate(plan.graph, c.gpus(), c.nodes, "ringtrack");
  plan.graph.finalize();
  const auto predicted = sim::simulate(plan.graph, c);
  ASSERT_TRUE(predicted.completed) << predicted.stuck;
  std::size_t steps = 0;
  for (int rank = 0; rank < c.gpus(); ++rank) {
    const RankSchedule s = make_schedule(plan.graph, rank, c.topology.gpus_per_node(), predicted.timing);
    expect_valid(s);
    steps += s.submissions.size();
    const auto peak = predicted.pools[rank].peak_bytes;
    EXPECT_GE(s.hbm.size_bytes, peak) << "rank " << rank;
    EXPECT_LE(static_cast<double>(s.hbm.size_bytes), 1.05 * static_cast<double>(peak)) << "rank " << rank;
    std::set<std::string> kinds;
    for (const auto& slot : s.streams) kinds.insert(std::string(sim::to_string(slot.stream.kind)));
    EXPECT_TRUE(kinds.count("h2d") && kinds.count("d2h") && kinds.count("compute")) << "rank " << rank;
  }
  EXPECT_GT(steps, 100u);
}

// Measured timings (as the CUDA executor records them) become the simulator's result shape: the copy time not
// covered by compute stream 0 is what is exposed; streams' busy time is the union of their tasks.
TEST(BackendMeasured, ExposedCopyTimeAndBusyTimesFromRecordedTimings) {
  TaskGraph g;
  compute(g, "a", 0);
  compute(g, "b", 0);
  g.add("h2d", {0, {StreamKind::h2d, 0}, false, sim::Copy{sim::Copy::Direction::h2d, 1 << 20, true}});
  g.add("d2h", {0, {StreamKind::d2h, 0}, false, sim::Copy{sim::Copy::Direction::d2h, 1 << 20, true}});
  g.add("other gpu", {1, {StreamKind::h2d, 0}, false, sim::Copy{sim::Copy::Direction::h2d, 1 << 20, true}});
  // a [0, 40), b [60, 100); h2d [30, 70) overlaps both and is exposed in [40, 60); d2h [90, 130) in [100, 130).
  const std::vector<sim::TaskTiming> timing = {{0, 40}, {60, 100}, {30, 70}, {90, 130}, {0, 500}};
  EXPECT_EQ(exposed_copy_ns(g, timing, 0), 20 + 30);
  EXPECT_EQ(exposed_copy_ns(g, timing, 1), 500) << "no compute on gpu1: the whole copy is exposed";

  sim::SimResult predicted;
  predicted.gpus = 2;
  predicted.pools = {{"gpu0 hbm", 80, 70, {{0, 1.0}}}, {"gpu1 hbm", 80, 60, {}}};
  predicted.streams = {{0, {StreamKind::compute, 0}, 999}, {0, {StreamKind::h2d, 0}, 999}};
  predicted.exposed_transfer_ns = {7, 7};
  predicted.model_flops = 1e12;
  predicted.peak_flops_per_gpu = 1e15;
  predicted.step_ns = 1;
  const sim::SimResult m = measured_result(predicted, g, timing, 130, 42);
  EXPECT_EQ(m.step_ns, 130);
  EXPECT_EQ(m.pools[0].peak_bytes, 42);
  EXPECT_TRUE(m.pools[0].level.empty());
  EXPECT_EQ(m.streams[0].busy_ns, 80);
  EXPECT_EQ(m.streams[1].busy_ns, 40);
  EXPECT_EQ(m.exposed_transfer_ns, (std::vector<std::int64_t>{50, 500}));
  EXPECT_NEAR(m.mfu(), predicted.mfu() / 130.0, 1e-12) << "the same FLOPs over the measured time";
}

}  // namespace trainyard::backend
