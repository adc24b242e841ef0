// The full plan search (every scheme) for Llama-3 8B at 1M tokens on a DGX A100, on all cores (the
// target: <= 10 s on the 2-core developers' machine). One iteration: the search takes tens of seconds.
#include <benchmark/benchmark.h>

#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/search.hpp"

namespace {

using namespace trainyard;

void BM_PlanSearch(benchmark::State& state) {
  const model::ModelConfig m = model::load_model("llama3-8b");
  const sim::Cluster cluster(hw::load_node("dgx-a100"), 1);
  const planner::StepInputs in{m, cluster, {state.range(0) * 1024, 1}, model::precision_policy("bf16-mixed")};
  planner::SearchReport report;
  for (auto _ : state) report = planner::search(in, {});
  state.counters["enumerated"] = static_cast<double>(report.enumerated);
  state.counters["pruned_memory"] = static_cast<double>(report.pruned_memory);
  state.counters["pruned_time"] = static_cast<double>(report.pruned_time);
  state.counters["simulated"] = static_cast<double>(report.simulated);
  state.counters["simulated_per_s"] = benchmark::Counter(static_cast<double>(report.simulated), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PlanSearch)->Arg(256)->Arg(1024)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

// quick_plan (the GUI's stand-in before the search ends): enumeration and bounds only, per scheme at 1M.
void BM_QuickPlan(benchmark::State& state, const std::string& scheme) {
  const model::ModelConfig m = model::load_model("llama3-8b");
  const sim::Cluster cluster(hw::load_node("dgx-a100"), 1);
  const planner::StepInputs in{m, cluster, {1024 * 1024, 1}, model::precision_policy("bf16-mixed")};
  for (auto _ : state) benchmark::DoNotOptimize(planner::quick_plan(in, scheme, 0.05));
  state.counters["candidates"] = static_cast<double>(planner::enumerate_plans(in, {scheme}).size());
}
BENCHMARK_CAPTURE(BM_QuickPlan, ringtrack, std::string("ringtrack"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_QuickPlan, fpdt, std::string("fpdt"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_QuickPlan, zero, std::string("zero"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_QuickPlan, megatron, std::string("megatron"))->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
