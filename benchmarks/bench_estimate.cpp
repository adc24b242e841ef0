// The analytic estimate (planner/analytic.hpp) against the simulator on a corpus of configurations: every scheme,
// A100/H100/H200 nodes, short to long sequences. Prints, per scheme, how many configurations were compared and the
// median and 90th-percentile |estimate - simulation| / simulation of the step time, the peak HBM and the peak host
// DRAM (configurations that keep something there), the share on which both say the same about fitting, the largest
// estimate / simulation - 1 of each (the measured margins, planner/estimate_margin.cpp), and the estimate's and the
// simulator's time per configuration.
//   bench_estimate [--stride N] [--max-tasks T] [--scheme NAME] [--rows FILE]
//   (every Nth enumerated configuration; graphs above T tasks skipped; NAME: that scheme's of them alone, the same
//   configurations as without it; FILE: one CSV row per configuration)
// Not a Google Benchmark: one pass over the corpus is the measurement (benchmarks/results/estimate.md).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/analytic.hpp"
#include "planner/estimate.hpp"
#include "planner/search.hpp"

namespace {

using namespace trainyard;
using Clock = std::chrono::steady_clock;

struct CorpusInput {
  std::string model, node;
  int nodes;
  std::int64_t seq_len, global_batch;
};

// Short, medium and long sequences on each GPU generation the profiles carry.
const std::vector<CorpusInput> kCorpus = {
    {"llama3-8b", "dgx-a100", 1, 1 << 20, 1},    {"llama3-8b", "dgx-a100", 1, 256 << 10, 1}, {"llama3-8b", "dgx-a100", 1, 32 << 10, 8},
    {"gpt-2.7b", "dgx-a100", 1, 128 << 10, 2},   {"llama3-8b", "hgx-h200", 1, 512 << 10, 1}, {"llama3-70b", "dgx-h100", 2, 128 << 10, 2},
    {"llama3.2-3b", "dgx-h100", 1, 64 << 10, 4}, {"llama2-13b", "dgx-a100", 2, 64 << 10, 4}, {"llama3.2-1b", "dgx-a100", 1, 64 << 10, 2},
    {"llama3.2-1b", "dgx-a100", 1, 8 << 10, 16}, {"llama3-8b", "dgx-h100", 4, 16 << 10, 32},
};

struct Errors {
  std::vector<double> step, hbm, dram;                 // |estimate - simulation| / simulation
  std::vector<double> step_over, hbm_over, dram_over;  // estimate / simulation - 1
  int fit_agree = 0, compared = 0;
  double estimate_s = 0, simulate_s = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(std::min<double>(static_cast<double>(v.size()) - 1, p * static_cast<double>(v.size())))];
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  int stride = 7;
  double max_tasks = 400000;
  std::FILE* rows = nullptr;  // --rows FILE: one CSV row per configuration, for looking into the misses
  std::string only;           // --scheme NAME
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--stride") stride = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--max-tasks") max_tasks = std::atof(argv[i + 1]);
    if (flag == "--rows") rows = std::fopen(argv[i + 1], "w");
    if (flag == "--scheme") only = argv[i + 1];
  }
  std::map<std::string, Errors> by_scheme;
  for (const CorpusInput& c : kCorpus) {
    const model::ModelConfig m = model::load_model(c.model);
    const sim::Cluster cluster(hw::load_node(c.node), c.nodes);
    const planner::StepInputs in{m, cluster, {c.seq_len, c.global_batch}, model::precision_policy("bf16-mixed")};
    const std::vector<planner::PlanSpec> specs = planner::enumerate_plans(in, planner::scheme_names());
    for (std::size_t i = 0; i < specs.size(); i += static_cast<std::size_t>(stride)) {
      const planner::PlanSpec& spec = specs[i];
      if (!only.empty() && spec.scheme != only) continue;
      if (planner::estimate_plan(in, spec).tasks > max_tasks) continue;
      Errors& e = by_scheme[spec.scheme];
      auto t0 = Clock::now();
      const planner::StepEstimate est = planner::analytic_estimate(in, spec, 0.05);
      e.estimate_s += seconds_since(t0);
      t0 = Clock::now();
      const planner::PlanMetrics sim = planner::measure(planner::simulate_plan_step(in, spec), in, 0.05);
      e.simulate_s += seconds_since(t0);
      ++e.compared;
      if (rows != nullptr) {
        std::fprintf(rows, "%s,%s,%s,%lld,%s,%d,%d,%.6f,%.6f,%.0f,%lld,%.6f,%.6f,%.6f,%.0f,%lld\n", c.model.c_str(), c.node.c_str(),
                     spec.scheme.c_str(), static_cast<long long>(c.seq_len), planner::scheme_named(spec.scheme).summary(spec).c_str(),
                     est.fits ? 1 : 0, sim.fits ? 1 : 0, est.step_s, sim.step_s, est.hbm_bytes, static_cast<long long>(sim.peak_hbm_bytes),
                     sim.compute_s, sim.exposed_transfer_s, sim.bubble_s, est.dram_bytes, static_cast<long long>(sim.peak_dram_bytes));
      }
      if (est.fits == sim.fits) ++e.fit_agree;
      if (!sim.fits || sim.step_s <= 0) continue;
      const double sim_hbm = static_cast<double>(sim.peak_hbm_bytes), sim_dram = static_cast<double>(sim.peak_dram_bytes);
      e.step.push_back(std::abs(est.step_s - sim.step_s) / sim.step_s);
      e.hbm.push_back(std::abs(est.hbm_bytes - sim_hbm) / sim_hbm);
      e.step_over.push_back(est.step_s / sim.step_s - 1);
      e.hbm_over.push_back(est.hbm_bytes / sim_hbm - 1);
      if (sim_dram > 0) {
        e.dram.push_back(std::abs(est.dram_bytes - sim_dram) / sim_dram);
        e.dram_over.push_back(est.dram_bytes / sim_dram - 1);
      }
    }
  }
  if (rows != nullptr) std::fclose(rows);
  std::printf("%-15s %8s %9s %9s %9s %9s %9s %9s %8s %26s %12s %12s\n", "scheme", "configs", "step p50", "step p90", "hbm p50", "hbm p90", "dram p50",
              "dram p90", "fits", "most over (step/hbm/dram)", "estimate ms", "simulate ms");
  for (const auto& [scheme, e] : by_scheme) {
    std::printf("%-15s %8d %8.1f%% %8.1f%% %8.1f%% %8.1f%% %8.1f%% %8.1f%% %7.1f%% %8.1f%% %7.1f%% %7.1f%% %12.3f %12.1f\n", scheme.c_str(),
                e.compared, 100 * percentile(e.step, 0.5), 100 * percentile(e.step, 0.9), 100 * percentile(e.hbm, 0.5), 100 * percentile(e.hbm, 0.9),
                100 * percentile(e.dram, 0.5), 100 * percentile(e.dram, 0.9), 100.0 * e.fit_agree / std::max(1, e.compared),
                100 * percentile(e.step_over, 1), 100 * percentile(e.hbm_over, 1), 100 * percentile(e.dram_over, 1),
                1e3 * e.estimate_s / std::max(1, e.compared), 1e3 * e.simulate_s / std::max(1, e.compared));
  }
  return 0;
}
