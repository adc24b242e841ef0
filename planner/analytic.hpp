#pragma once
// The analytic estimate of a plan's step: step time, peak HBM per GPU, peak host DRAM per node and MFU in closed
// form from the same model, GPU, node, stack and collective profiles the simulator uses, without building the
// step's graph (microseconds, against milliseconds to seconds for a simulation). A fast, provisional answer: every
// place that shows it labels it an estimate, and the simulator's figure replaces it. How far apart they are, per
// scheme, is measured by benchmarks/bench_estimate.cpp (benchmarks/results/estimate.md) and held by a test.
//
// Each scheme's registry entry gives its share (`analytic`, a SchemeEstimate: planner/schemes/NAME/analytic.cpp,
// over the shared parts in planner/analytic_parts.hpp), reusing the byte counts its builder
// allocates (zero_layer_bytes, layer_activation_bytes, the state bytes) and the per-layer dense time its tasks take
// (dense_layer_seconds); analytic_estimate adds what every scheme shares (attention, the fit verdict, MFU).
#include <optional>
#include <vector>

#include "planner/bounds.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

// StepEstimate and EstimatedPlan are in planner/search.hpp: the search carries them too.
StepEstimate analytic_estimate(const StepInputs& in, const PlanSpec& spec, double hbm_headroom);

// The most the estimate has been measured above the simulator for a scheme, as a fraction of the simulation
// (estimate / simulation - 1, over the fitting configurations of bench_estimate's corpus, rounded up; held by
// test_analytic on its own corpus). The search prunes a candidate only where its estimate, divided by (1 + margin),
// cannot beat the plans found: the estimate's measured error says when the simulator need not confirm.
struct EstimateMargin {
  double step = 0;  // of the step time
  double hbm = 0;   // of the peak HBM per GPU
  double dram = 0;  // of the peak host DRAM per node
};
EstimateMargin estimate_margin(const std::string& scheme);

// `plan --estimate-only`: every configuration the search would enumerate (options.schemes, options.runnable),
// estimated; those the estimate says fit, best first by options.objective (throughput: step time; min_hbm: peak
// HBM), ties by scheme and summary so the order never depends on anything else.
std::vector<EstimatedPlan> rank_by_estimate(const StepInputs& in, const SearchOptions& options);
// The same over `specs` (already enumerated; options.runnable still applies).
std::vector<EstimatedPlan> rank_estimated(const StepInputs& in, std::vector<PlanSpec> specs, const SearchOptions& options);
// The longest sequence (a multiple of 1K tokens: doubling, then bisection) at which the estimate says some
// configuration of `scheme` fits, with the fastest such; nullopt when not even 1K does. No simulation.
struct EstimatedMaxSeq {
  std::int64_t seq_len = 0;
  EstimatedPlan plan;
};
std::optional<EstimatedMaxSeq> max_sequence_by_estimate(const StepInputs& in, const std::string& scheme, const SearchOptions& options);

}  // namespace trainyard::planner
