#pragma once
// The questions the GUI asks, as plain functions over the planner and the simulator (no Qt here, and no cost
// logic of its own): the window runs them on worker threads, one chart point per call.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/error_bars.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"
#include "sim/compare.hpp"
#include "sim/engine.hpp"

namespace trainyard::gui {

// What the user chose: the same words as the CLI's flags.
struct WhatIfInputs {
  std::string model = "llama3-8b";  // --model: a catalog name, a JSON path or custom:...
  std::string hw = "dgx-a100";      // --hw: a node profile name or path
  int nodes = 1;
  std::string stack = "megatron-lm";  // --stack: the software stack (stacks/frameworks/), recorded in saved plans
  std::int64_t seq_len = std::int64_t{1} << 20;
  std::int64_t tokens_per_step = 0;  // 0: one sequence per step; else sequences = max(1, tokens / length)
  std::vector<std::string> schemes = planner::scheme_names();
  planner::Objective objective = planner::Objective::throughput;
  double hbm_headroom = 0.05;
};

// The sequence-length control's range: powers of two from 4K to 16M. A shorter power of two (a plan file's, say:
// examples/tiny-ringtrack.plan.json has 256 tokens) widens it downwards.
inline constexpr std::int64_t kMinSeqLen = 4096, kMaxSeqLen = std::int64_t{16} << 20;
// InputError (naming `origin`, `field` and the length `as_given`) unless the control can show `seq_len`: a power
// of two up to kMaxSeqLen.
void check_sequence_control_length(std::int64_t seq_len, const std::string& origin, const std::string& field, const std::string& as_given);

// The model and cluster the inputs name, loaded once and shared (read-only) by the jobs of one set of inputs.
// Loading errors are InputErrors naming the field, as on the command line.
struct Setup {
  explicit Setup(const WhatIfInputs& inputs);
  WhatIfInputs inputs;
  model::ModelConfig model;
  sim::Cluster cluster;
  model::PrecisionPolicy precision;
  // The step at `seq_len` tokens per sequence with the inputs' tokens per step.
  planner::StepInputs at(std::int64_t seq_len) const;
};

// How far trainyard was off on the published runs most like `scheme` at the inputs' length (app/error_bars.hpp).
app::ErrorBar error_bar_of(const Setup& setup, const std::string& scheme);

// Chart 2's lengths: powers of two from seq/64 to seq*4, within the control's range (not below 4K unless seq is).
std::vector<std::int64_t> memory_sweep_lengths(std::int64_t seq_len);

// The chunk length of schemes that have one (ring-track's chunk, FPDT's attention chunk).
bool has_chunk(const std::string& scheme);
std::int64_t chunk_of(const planner::PlanSpec& spec);
planner::PlanSpec with_chunk(planner::PlanSpec spec, std::int64_t chunk);

// Chart 1's chunk lengths for a scheme: the planner's candidates (planner::chunk_sizes), less those whose step
// graph is too large to simulate interactively (see too_large_to_simulate). Empty for schemes without a chunk.
std::vector<std::int64_t> chunk_sweep(const std::string& scheme, std::int64_t seq_len);
// Chart 1's points of `spec` at `seq_len`: (chunk, the plan with that chunk) per chunk of chunk_sweep, shortest
// first; (0, spec) for a scheme without a chunk.
std::vector<std::pair<std::int64_t, planner::PlanSpec>> chunk_points(const planner::PlanSpec& spec, std::int64_t seq_len);

// Why a plan's task graph is too large for the charts' sweeps (empty when it is not): ring-track with more than
// 1024 chunks per sequence (the planner's shortest chunk is 1K), FPDT with more than 128 (its chunk pairs grow
// with the square: 256 chunks take 40 s and 10 GB). The selected plan is always simulated, whatever its size.
std::string too_large_to_simulate(const planner::PlanSpec& spec, std::int64_t seq_len);

// One simulated chart point.
struct Point {
  std::string scheme;
  std::int64_t x = 0;            // the chunk length (chart 1), the sequence length (chart 2); 0: no chunk
  std::string summary;           // the configuration simulated
  std::string skipped;           // not simulated, and why (invalid here, too large)
  planner::PlanMetrics metrics;  // fits, step time, MFU, peaks
  // Peak HBM of the fullest GPU and DRAM of the fullest node; where the step ran out of memory, what that pool
  // needed at that moment (at least this much, then).
  std::int64_t hbm_needed_bytes = 0, dram_needed_bytes = 0;
  bool out_of_memory = false;
  bool provisional = false;  // from the analytic estimate, not simulated: drawn as such until the simulated point comes
};
// What every graph the GUI builds holds while it is built and simulated (chart points, the selected plan, the
// plan search): one budget for all of them, common/memory_budget.hpp's default.
MemoryGate& graph_memory_gate();

// `cancel` (optional) stops the simulation early once set; the point is then of no use.
Point simulate_point(const planner::StepInputs& in, const planner::PlanSpec& spec, double hbm_headroom, std::int64_t x,
                     const std::atomic<bool>* cancel = nullptr);

// A chart point from the analytic estimate (planner/analytic.hpp), marked provisional; nothing is built or simulated.
Point estimate_point(const planner::StepInputs& in, const planner::PlanSpec& spec, double hbm_headroom, std::int64_t x);

// Every chart point of charts 1 and 2 from the estimate, for the configurations of `preferred` (the parameter
// panel's plan, then the estimate's best of each scheme): the simulated points replace them as they come. A scheme
// or length where none of `preferred` is valid gets no provisional point (its simulated one still comes).
struct ChartEstimates {
  std::vector<Point> chunk, memory;  // chart 1's, chart 2's
};
ChartEstimates estimate_charts(const Setup& setup, const std::vector<planner::PlanSpec>& preferred);

// The configuration the charts draw for `scheme` at a step: the first of `preferred` that is of that scheme and
// valid there (the window passes the parameter panel's plan, then the search's best of each scheme), else the
// planner's quick_plan. On schemes with a chunk, a chunk that does not divide this length or makes the graph too
// large becomes the nearest longer one that works.
std::optional<planner::PlanSpec> chart_plan(const planner::StepInputs& in, const std::string& scheme, const std::vector<planner::PlanSpec>& preferred,
                                            double hbm_headroom);

// A measured trace (trainyard run --trace) and how much of its step it holds (otherData.selection).
struct MeasuredTrace {
  sim::Timeline timeline;
  bool whole_step = true;  // false: cut to a time window, so tasks outside it are missing
};
MeasuredTrace read_measured_trace(const std::string& path);
// Why `measured` is not a trace of the plan `predicted` was simulated from, for people; empty when it is. A trace
// of the plan has the plan's GPU count, only tasks of the plan, and (unless cut to a window) every task of the plan
// on each device it covers: a trace cut to some GPUs or the one-GPU executor's trace still matches.
std::string measured_mismatch(const sim::Timeline& predicted, const MeasuredTrace& measured);

// A timeline's slices by device (the trace's pid) and stream (tid), each list in start order: what the Gantt
// draws, indexed once on a worker (a 1M-token step has a million slices).
using TimelineRows = std::map<int, std::map<int, std::vector<std::size_t>>>;
TimelineRows index_timeline(const sim::Timeline& timeline);

// The selected plan in full, for charts 3 and 4 and for saving its trace. Shared and read-only: it is large, so the
// GUI thread never copies it.
struct PlanDetail {
  std::shared_ptr<const Setup> setup;
  planner::PlanSpec spec;
  planner::PlanMetrics metrics;
  std::shared_ptr<const sim::TaskGraph> graph;
  std::shared_ptr<const sim::SimResult> result;   // memory levels and link loads recorded
  std::shared_ptr<const sim::Timeline> timeline;  // the Chrome trace's slices
  std::shared_ptr<const TimelineRows> rows;       // index_timeline(*timeline)
};
PlanDetail simulate_plan_detail(std::shared_ptr<const Setup> setup, const planner::PlanSpec& spec, const std::atomic<bool>* cancel = nullptr);

// The plan file (trainyard.plan.v1) of a plan at these inputs, as `trainyard plan --out` writes it.
planner::PlanFile plan_file(const Setup& setup, const planner::PlanSpec& spec, const planner::PlanMetrics* predicted);

}  // namespace trainyard::gui
