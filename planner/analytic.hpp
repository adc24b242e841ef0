#pragma once
// The analytic estimate of a plan's step: step time, peak HBM per GPU, peak host DRAM per node and MFU in closed
// form from the same model, GPU, node, stack and collective profiles the simulator uses, without building the
// step's graph (microseconds, against milliseconds to seconds for a simulation). A fast, provisional answer: every
// place that shows it labels it an estimate, and the simulator's figure replaces it. How far apart they are, per
// scheme, is measured by benchmarks/bench_estimate.cpp (benchmarks/results/estimate.md) and held by a test.
//
// Each scheme's registry entry gives its share (`analytic`, a SchemeEstimate), reusing the byte counts its builder
// allocates (zero_layer_bytes, layer_activation_bytes, the state bytes) and the per-layer dense time its tasks take
// (dense_layer_seconds); analytic_estimate adds what every scheme shares (attention, the fit verdict, MFU).
#include "planner/bounds.hpp"
#include "planner/plan.hpp"

namespace trainyard::planner {

// One scheme's part of the estimate. The step is max(compute + exposed + bubble, paced).
struct SchemeEstimate {
  double dense_s = 0;  // the busiest GPU's dense ops (as SchemeBounds::dense_s), LM head included
  // The busiest GPU's attention: its calls as the scheme's emitter makes them (< 0: every FLOP at the profile's
  // best rate, with `attention_recompute` of the layers' forward again, as the search's lower bound counts it).
  double attention_s = -1;
  double attention_recompute = 0;  // the share of layers whose attention forward runs again
  double exposed_s = 0;            // time the compute stream waits on transfers the schedule does not hide
  double bubble_fraction = 0;      // pipeline fill and drain, as a fraction of the busiest GPU's compute
  double paced_s = 0;              // the pace copies or critical paths set on their own: a floor
  double hbm_bytes = 0;            // the fullest GPU's peak, tensors only
  double dram_bytes = 0;           // the fullest node's host DRAM
};

struct StepEstimate {
  double step_s = 0;
  double hbm_bytes = 0;   // the fullest GPU's peak, tensors only (as PlanMetrics::peak_hbm_bytes)
  double dram_bytes = 0;  // the fullest node's host DRAM
  double mfu = 0;         // trainyard's convention (models/model.hpp), of the bf16 peak
  bool fits = false;      // HBM within what the stack can allocate after `hbm_headroom`, DRAM within the node's
};

StepEstimate analytic_estimate(const StepInputs& in, const PlanSpec& spec, double hbm_headroom);

// The schemes' shares (their registry entries' `analytic`).
SchemeEstimate zero_estimate(const BoundContext& ctx, const ZeroParams& z);
SchemeEstimate megatron_estimate(const BoundContext& ctx, const MegatronParams& p);
// Ring-track: its lower bounds for now (planner/bounds.hpp), which the copy pacing dominates.
SchemeEstimate ringtrack_estimate(const BoundContext& ctx, const RingTrackParams& p);

}  // namespace trainyard::planner
