// Simulator throughput: tasks simulated per second on one core, for (1) a 1M-task graph without link
// contention and (2) a 1M-task graph with thousands of concurrent flows over shared links.
// Results are recorded in benchmarks/results/sim.md.
#include <benchmark/benchmark.h>

#include "hwprofiles/catalog.hpp"
#include "sim/engine.hpp"

namespace trainyard::sim {
namespace {

// 8 GPUs of one DGX A100, a pipeline of compute tasks: task i on GPU g waits for task i on GPU g-1 and
// (stream order) task i-1 on GPU g. No transfers at all.
TaskGraph compute_pipeline(int tasks) {
  TaskGraph g;
  const int gpus = 8;
  std::vector<TaskId> previous(gpus, -1);
  for (int i = 0; i < tasks / gpus; ++i) {
    TaskId left = -1;
    for (int gpu = 0; gpu < gpus; ++gpu) {
      std::vector<TaskId> deps;
      if (left >= 0) deps.push_back(left);
      left = g.gemm("F L" + std::to_string(gpu) + " C" + std::to_string(i), gpu, {4096, 4096 + 64 * (i % 7), 4096, hw::Dtype::bf16}, deps);
    }
  }
  g.finalize();
  return g;
}

// `nodes` DGX A100s. Every GPU streams copies both ways through its shared PCIe switch and socket DRAM, and
// sends to the same GPU of the next node through the NICs, all the time: 3 flows per GPU in flight.
TaskGraph contended(int nodes, int tasks) {
  TaskGraph g;
  const int gpus = nodes * 8;
  const int rounds = tasks / (gpus * 4);
  for (int i = 0; i < rounds; ++i) {
    for (int gpu = 0; gpu < gpus; ++gpu) {
      const std::int64_t bytes = (1 << 20) + 4096 * ((gpu * 7 + i) % 13);
      g.copy("H2D " + std::to_string(i), gpu, {Copy::Direction::h2d, bytes, true});
      g.copy("D2H " + std::to_string(i), gpu, {Copy::Direction::d2h, bytes, true});
      g.send("send " + std::to_string(i), gpu, (gpu + 8) % gpus, 2 * bytes);
      g.elementwise("ew " + std::to_string(i), gpu, {bytes, bytes});
    }
  }
  g.finalize();
  return g;
}

void run(benchmark::State& state, const TaskGraph& graph, const Cluster& cluster) {
  SimOptions options;
  options.record_links = false;
  options.record_memory = false;
  std::uint64_t events = 0;
  double component = 0;
  std::uint64_t concurrent = 0;
  std::size_t engine_bytes = 0;
  for (auto _ : state) {
    SimResult r = simulate(graph, cluster, options);
    if (!r.completed) state.SkipWithError("simulation did not complete");
    events = r.events;
    component = r.mean_component_flows;
    concurrent = r.max_concurrent_flows;
    engine_bytes = r.engine_bytes;
    benchmark::DoNotOptimize(r.step_ns);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(graph.size()));
  state.counters["tasks"] = static_cast<double>(graph.size());
  state.counters["events"] = static_cast<double>(events);
  state.counters["flows_per_recompute"] = component;
  state.counters["max_concurrent_flows"] = static_cast<double>(concurrent);
  state.counters["engine_bytes_per_task"] = static_cast<double>(engine_bytes) / static_cast<double>(graph.size());
  state.counters["graph_bytes_per_task"] = static_cast<double>(graph.memory_bytes()) / static_cast<double>(graph.size());
}

void BM_NoContention(benchmark::State& state) {
  const Cluster cluster(hw::load_node("dgx-a100"), 1);
  const TaskGraph graph = compute_pipeline(static_cast<int>(state.range(0)));
  run(state, graph, cluster);
}
BENCHMARK(BM_NoContention)->Arg(1 << 20)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_HeavyContention(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const Cluster cluster(hw::load_node("dgx-a100"), nodes);
  const TaskGraph graph = contended(nodes, 1 << 20);
  run(state, graph, cluster);
}
BENCHMARK(BM_HeavyContention)->Arg(4)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace trainyard::sim

BENCHMARK_MAIN();
