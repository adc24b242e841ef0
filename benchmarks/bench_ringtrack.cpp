// Building and simulating one ring-track step: Llama-3 8B at 1M tokens on a DGX A100, chunks of 16K or 4K, K/V in
// host DRAM (the target: at most 1 s for build + simulate on the developers' machine).
#include <benchmark/benchmark.h>

#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "sim/engine.hpp"

namespace {

using namespace trainyard;

void BM_RingTrackStep(benchmark::State& state) {
  const model::ModelConfig m = model::load_model("llama3-8b");
  const sim::Cluster cluster(hw::load_node("dgx-a100"), 1);
  const planner::StepInputs in{m, cluster, {state.range(0) * 1024, 1}, model::precision_policy("bf16-mixed")};
  planner::RingTrackParams p;
  p.ring = 8;
  p.chunk = state.range(1) * 1024;
  p.kv = planner::Placement::dram;
  p.acts = planner::ActivationPolicy::recompute;  // full activations of 1M tokens do not fit the node's DRAM
  sim::SimOptions options;
  options.record_memory = false;
  options.record_links = false;
  std::size_t tasks = 0;
  double step_s = 0;
  sim::TaskGraph::MemoryBytes graph_bytes;
  std::size_t engine_bytes = 0;
  for (auto _ : state) {
    planner::RingTrackPlan plan = planner::build_ringtrack(in, p);
    plan.graph.finalize();
    const sim::SimResult r = sim::simulate(plan.graph, cluster, options);
    tasks = plan.graph.size();
    step_s = static_cast<double>(r.step_ns) * 1e-9;
    graph_bytes = plan.graph.memory();
    engine_bytes = r.engine_bytes;
    benchmark::DoNotOptimize(r.step_ns);
  }
  state.counters["tasks"] = static_cast<double>(tasks);
  state.counters["simulated_step_s"] = step_s;
  // Where the bytes per task go (benchmarks/results/sim.md explains each).
  const double n = static_cast<double>(tasks);
  state.counters["task_record_bytes_per_task"] = static_cast<double>(graph_bytes.task_records) / n;
  state.counters["name_bytes_per_task"] = static_cast<double>(graph_bytes.names) / n;
  state.counters["edge_bytes_per_task"] = static_cast<double>(graph_bytes.edges) / n;
  state.counters["engine_bytes_per_task"] = static_cast<double>(engine_bytes) / n;
}
// 1M tokens in chunks of 16K (state.range(1) = 16) and of 4K (4): the second is the planner's largest ring-track graphs.
BENCHMARK(BM_RingTrackStep)->Args({1024, 16})->Args({1024, 4})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
BENCHMARK_MAIN();
