// The CUDA executor enqueues a whole step before the GPU runs it, so it learns every tensor's reads, writes,
// size and lifetime from backend/dataflow.hpp's table rather than from running the numerics. These tests hold
// that table to the CPU reference executor, which does run the numerics: for the same graph, every task must
// read and write exactly the tensors, at exactly the places, that the reference did.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "backend/dataflow.hpp"
#include "backend/reference_step.hpp"
#include "backend/schedule.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/model.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "tests/backend_fixtures.hpp"

namespace trainyard::backend {

namespace {

using test::chunked_offloaded;
using test::one_gpu;
using test::tiny_model;

const std::string kData = TRAINYARD_TEST_DATA_DIR;

using Seen = std::tuple<sim::TaskId, sim::DeviceId, Key, bool>;  // task, place, tensor, write

// The reads and writes plan_dataflow says each task makes.
std::set<Seen> planned_accesses(const sim::TaskGraph& g, const DataflowPlan& plan, const model::ModelConfig& m) {
  std::set<Seen> out;
  auto at = [&](sim::TaskId task, int instance, bool write) {
    const Instance& i = plan.instances.at(instance);
    out.insert({task, i.place, i.key, write});
  };
  for (const TaskTensors& step : plan.steps) {
    const sim::Task& t = g.task(step.task);
    const bool move = t.kind() == sim::TaskKind::copy || t.kind() == sim::TaskKind::p2p;
    if (move) {
      for (std::size_t i = 0; i + 1 < step.instances.size(); i += 2) {
        if (step.instances[i] < 0) continue;
        at(step.task, step.instances[i], false);
        at(step.task, step.instances[i + 1], true);
      }
      continue;
    }
    if (step.instances.empty()) continue;
    const auto uses = compute_uses(t.op, m, g.chunk_tokens());
    EXPECT_EQ(uses.size(), step.instances.size()) << g.name(step.task);
    for (std::size_t u = 0; u < uses.size() && u < step.instances.size(); ++u) {
      const int inst = step.instances[u];
      const bool fresh = std::count(step.zero_first.begin(), step.zero_first.end(), inst) > 0;
      switch (uses[u].access) {
        case Access::read: at(step.task, inst, false); break;
        case Access::write: at(step.task, inst, true); break;
        case Access::update: at(step.task, inst, false), at(step.task, inst, true); break;
        case Access::accumulate:
          if (!fresh) at(step.task, inst, false);
          at(step.task, inst, true);
          break;
      }
    }
  }
  return out;
}

struct Checked {
  DataflowPlan plan;
  std::size_t accesses = 0;
};

// Runs the reference on the graph, recording its accesses, and holds plan_dataflow's to them.
Checked check_against_reference(const sim::TaskGraph& g, const model::ModelConfig& m, std::int64_t chunk, std::int64_t seq, int batch,
                                int gpus_per_node, std::span<const sim::TaskId> order) {
  EXPECT_EQ(g.chunk_tokens(), chunk) << "the graph carries the chunk length it was built with";
  std::vector<RecordedAccess> recorded;
  ReferenceOptions options;
  options.record = &recorded;
  ModelState state(m, 5);
  const auto tokens = random_windows(m.vocab, seq, batch, 11);
  run_reference_step(g, state, gpus_per_node, tokens, options);
  std::set<Seen> reference;
  for (const RecordedAccess& a : recorded) reference.insert({a.task, a.place, a.key, a.write});

  Checked c{plan_dataflow(g, order, m, gpus_per_node), reference.size()};
  const std::set<Seen> planned = planned_accesses(g, c.plan, m);
  std::vector<Seen> missing, extra;
  std::set_difference(reference.begin(), reference.end(), planned.begin(), planned.end(), std::back_inserter(missing));
  std::set_difference(planned.begin(), planned.end(), reference.begin(), reference.end(), std::back_inserter(extra));
  auto show = [&](const std::vector<Seen>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size() && i < 5; ++i) {
      const auto& [task, place, key, write] = v[i];
      s += "\n  " + std::string(g.name(task)) + " " + (write ? "writes " : "reads ") + describe(key) + " on " + sim::device_name(place);
    }
    return s;
  };
  EXPECT_TRUE(missing.empty()) << missing.size() << " accesses the reference made and the table lacks:" << show(missing);
  EXPECT_TRUE(extra.empty()) << extra.size() << " accesses the table has and the reference did not make:" << show(extra);
  // Device instances live at the same time never share bytes, and the arena holds at least the live peak.
  EXPECT_GE(c.plan.device_arena_bytes, c.plan.device_peak_bytes);
  for (const Instance& a : c.plan.instances) {
    for (const Instance& b : c.plan.instances) {
      if (&a == &b || a.place != b.place || sim::is_host(a.place)) continue;
      const bool together = a.accessors.front() <= b.release_after && b.accessors.front() <= a.release_after;
      const bool overlap = a.device_offset_bytes < b.device_offset_bytes + b.bytes && b.device_offset_bytes < a.device_offset_bytes + a.bytes;
      EXPECT_FALSE(together && overlap) << describe(a.key) << " and " << describe(b.key) << " share bytes while both are live";
    }
  }
  // Every instance is released after its last access, and a host instance has its place in the pinned arena.
  for (const Instance& i : c.plan.instances) {
    EXPECT_GE(i.release_after, i.accessors.back()) << describe(i.key);
    EXPECT_EQ(sim::is_host(i.place), i.host_offset_bytes >= 0) << describe(i.key);
  }
  return c;
}

std::vector<sim::TaskId> schedule_order(const sim::TaskGraph& g) { return make_schedule(g, 0, 1).order; }

sim::TaskGraph ringtrack(const sim::Cluster& cluster, std::int64_t seq, int batch, const planner::RingTrackParams& p) {
  const planner::StepInputs in{tiny_model(), cluster, {seq, batch}, model::precision_policy("bf16-mixed")};
  auto g = planner::build_ringtrack(in, p).graph;
  g.finalize();  // for make_schedule
  return g;
}

}  // namespace

TEST(Dataflow, TheTableMatchesTheReferenceOnOffloadedAndRecomputedRingTrack) {
  const auto m = tiny_model();
  const std::int64_t seq = 64;
  planner::RingTrackParams plain;
  plain.chunk = seq;
  plain.kv = planner::Placement::hbm;
  plain.acts = planner::ActivationPolicy::hbm;
  const auto unchunked = ringtrack(one_gpu(), seq, 1, plain);
  const Checked whole = check_against_reference(unchunked, m, seq, seq, 1, 1, schedule_order(unchunked));
  EXPECT_EQ(whole.plan.host_bytes, 0) << "nothing is offloaded";
  for (auto acts : {planner::ActivationPolicy::dram, planner::ActivationPolicy::recompute, planner::ActivationPolicy::hbm}) {
    SCOPED_TRACE(static_cast<int>(acts));
    const auto g = ringtrack(one_gpu(), seq, 1, chunked_offloaded(acts));
    const Checked c = check_against_reference(g, m, 16, seq, 1, 1, schedule_order(g));
    EXPECT_GT(c.accesses, 300u);
    EXPECT_GT(c.plan.host_bytes, 0) << "K/V are offloaded";
    // Chunks of 16 with K/V and activations in host memory hold less on the GPU than the whole sequence at once.
    if (acts == planner::ActivationPolicy::dram) {
      EXPECT_LT(c.plan.device_peak_bytes, whole.plan.device_peak_bytes);
    }
  }
}

TEST(Dataflow, TheTableMatchesTheReferenceAcrossGpusAndOnMegatron) {
  const auto m = tiny_model();
  const std::int64_t seq = 64;
  const sim::Cluster four(hw::load_node(kData + "/tiny-node.json"), 1);
  planner::RingTrackParams ring = chunked_offloaded(planner::ActivationPolicy::dram);
  ring.ring = 2;
  ring.ring_order = {0, 1};
  const auto g = ringtrack(four, seq, 2, ring);
  check_against_reference(g, m, 16, seq, 2, four.topology.gpus_per_node(), stream_ordered_order(g));

  planner::MegatronParams p;
  p.pp = 2;
  p.dp = 2;
  p.recompute = planner::Recompute::full;
  p.offload_activations = true;
  const planner::StepInputs in{m, four, {seq, 2}, model::precision_policy("bf16-mixed")};
  const auto megatron = planner::build_megatron(in, p);
  check_against_reference(megatron, m, seq, seq, 2, four.topology.gpus_per_node(), stream_ordered_order(megatron));
}

TEST(Dataflow, AReadOfATensorNoTaskPutThereIsRefusedBeforeAnythingRuns) {
  const auto m = tiny_model();
  auto g = ringtrack(one_gpu(), 32, 1, chunked_offloaded(planner::ActivationPolicy::dram));
  // Drop the first copy of K/V to the host: their reload would find nothing there.
  std::vector<sim::TaskId> order = schedule_order(g);
  const auto reload = std::find_if(order.begin(), order.end(), [&](sim::TaskId id) {
    const auto& t = g.task(id);
    return t.kind() == sim::TaskKind::copy && t.op.code == sim::OpCode::kv && std::get<sim::Copy>(t.params).direction == sim::Copy::Direction::d2h;
  });
  ASSERT_NE(reload, order.end());
  order.erase(reload);
  try {
    plan_dataflow(g, order, m, 1);
    FAIL() << "a reload of K/V that never reached the host passed";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("which does not hold it"), std::string::npos) << e.what();
  }
}

}  // namespace trainyard::backend
