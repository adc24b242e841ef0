#pragma once
// The analytic estimate of a plan's step: step time, peak HBM per GPU, peak host DRAM per node and MFU in closed
// form from the same model, GPU, node, stack and collective profiles the simulator uses, without building the
// step's graph. A fast, provisional answer: every place that shows it labels it an estimate, and the simulator's
// figure replaces it (benchmarks/results/estimate.md measures how far apart they are).
#include "planner/plan.hpp"

namespace trainyard::planner {

struct StepEstimate {
  double step_s = 0;
  double hbm_bytes = 0;   // the fullest GPU's peak, tensors only (as PlanMetrics::peak_hbm_bytes)
  double dram_bytes = 0;  // the fullest node's host DRAM
  double mfu = 0;         // trainyard's convention (models/model.hpp), of the bf16 peak
  bool fits = false;      // HBM within what the stack can allocate after `hbm_headroom`, DRAM within the node's
};

StepEstimate analytic_estimate(const StepInputs& in, const PlanSpec& spec, double hbm_headroom);

}  // namespace trainyard::planner
