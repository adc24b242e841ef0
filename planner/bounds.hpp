#pragma once
// The plan search's lower bounds (Bounds, planner/search.hpp), never above what the simulation would report. The
// part every scheme shares (attention and the LM head at their best efficiencies) is lower_bounds'; each scheme's
// share (its busiest GPU's dense ops, the HBM and host DRAM it must hold, how copies and critical paths pace it)
// is its registry entry's `bounds` (planner/schemes/NAME/bounds.cpp).
#include "models/model.hpp"
#include "planner/plan.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::planner {

// What every scheme's bound uses, computed once per plan.
struct BoundContext {
  const StepInputs& in;
  int gpus = 0;
  double seq_len = 0, tokens = 0;  // per sequence; per step
  double layers = 0;
  model::ParamCounts params;
  double layer_params = 0;     // one layer's parameters
  double resident_params = 0;  // embedding, LM head and final norm
  double all_params = 0;
  double states_per_param = 0;  // master weights and optimizer states, bytes
  double peak_flops = 0;        // one GPU's bf16 peak, FLOP/s
  sim::ComputeModel compute;
  double head_s = 0;           // the LM head's forward and backward per GPU at the best GEMM efficiency
  double dense_recompute = 0;  // the share of layers whose forward runs again (rounded down)
  BoundContext(const StepInputs& inputs, const PlanSpec& spec);
  // Seconds of one attention pass over `flops` at the best efficiency the profile reaches.
  double attention_s(double flops, bool backward) const;
  // The step's attention per GPU at that rate: forward, the `recompute_share` of layers whose forward runs again,
  // and backward (every FLOP spread evenly over the GPUs).
  double best_attention_s(double recompute_share) const;
};

// Ring-track: the busiest GPU's host copies per step, bytes each way, and those its compute stream waits for.
struct RingCopyBytes {
  double h2d = 0, d2h = 0, serial_h2d = 0;
};

struct SchemeBounds {
  double dense_s = 0;              // the busiest GPU's dense ops (the builders' own tasks, timed)
  double attention_recompute = 0;  // the share of layers whose attention forward runs again
  double hbm_bytes = 0;            // per GPU
  double dram_bytes = 0;           // per node
  double paced_s = 0;              // how the work is paced: copy engines, critical paths, idle turns
  double serial_copy_s = 0;        // copies during which the busiest GPU's compute stream must wait
  RingCopyBytes ring_copies;       // ring-track only
};

// One scheme's part of the analytic estimate (planner/analytic.hpp). The step is max(compute + exposed + bubble, paced).
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
  double host_s = 0;               // the host's time to issue the busiest GPU's kernels (the stack's dispatch cost): a floor
};

// Seconds GPU 0's compute stream spends on one layer's dense ops (everything but attention): forward, backward
// and, with `recompute`, the forward again. Exact for these ops: the very tasks the builders emit, timed by the
// simulator's own cost model.
double dense_layer_seconds(const StepInputs& in, const LayerSplit& split, bool recompute);
// The same, with the layer's attention as its emitter runs it when `attention` (ring passes' blocks, FPDT's chunk
// pairs, Ulysses' head group), and the kernels GPU 0's host issues for them: what the analytic estimate counts
// (planner/analytic.hpp).
struct LayerCompute {
  double seconds = 0;
  double kernels = 0;
};
LayerCompute layer_compute(const StepInputs& in, const LayerSplit& split, bool recompute, bool attention);
// GPU 0's compute-stream tasks of a scratch graph, timed by the simulator's cost model.
LayerCompute gpu0_compute(const StepInputs& in, const sim::TaskGraph& g);

}  // namespace trainyard::planner
