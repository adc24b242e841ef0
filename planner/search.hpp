#pragma once
// The plan search: enumerate the configurations of every selected scheme, drop those that cheap sound lower
// bounds show cannot fit or cannot beat the plans already found, simulate the rest on all cores, and rank.
//
// Pruning follows the bounds: a candidate is skipped when its bound is no better than the k-th best plan found
// (so the top k are exact) and its scheme already has a plan that fits; for each skipped candidate its bound is
// remembered, so the report can say how far each scheme's best shown plan can be from its true best.
//
// With SearchOptions::prune_by_estimate, the analytic estimate orders the candidates and prunes beside the bounds:
// a candidate is skipped when the estimate, less its measured margin, cannot beat the k-th plan found.
//
// Determinism: candidates are visited in order of their estimate (or bound; ties: enumeration order) in waves of
// a fixed size; pruning decisions are taken between waves from the results of whole waves, so the plans
// simulated, the counts and the ranking are the same for any number of threads.
#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/memory_budget.hpp"
#include "planner/plan.hpp"
#include "planner/schemes/scheme.hpp"
#include "sim/engine.hpp"

namespace trainyard::planner {

enum class Objective { throughput, max_seq, min_hbm };
Objective parse_objective(const std::string& name);  // InputError naming --objective

// What one simulated plan achieved, and where its time went.
struct PlanMetrics {
  bool fits = false;
  double step_s = 0, tokens_per_s = 0, mfu = 0, hfu = 0;
  std::int64_t peak_hbm_bytes = 0;   // the fullest GPU
  std::int64_t peak_dram_bytes = 0;  // the fullest node
  // Per GPU, averaged: compute stream busy (recompute included), idle while waiting on a transfer, other idle
  // (pipeline fill and drain, imbalance between GPUs), and the recompute part of the busy time.
  double compute_s = 0, exposed_transfer_s = 0, bubble_s = 0, recompute_s = 0;
  std::string bottleneck;    // compute, PCIe, DRAM, link, bubble
  std::string busiest_link;  // its name and utilisation, when transfers matter
  std::string failure;       // when it does not fit: why
  std::int64_t shortfall_bytes = 0;
  std::string short_of;     // the memory shortfall_bytes is short of ("HBM per GPU", "host DRAM per node"); empty: not memory
  bool bound_only = false;  // a miss by the memory lower bounds (not simulated): the shortfall is at least this
};
// HBM per GPU the plan's tensors may use: what the stack's allocator can hand out of the HBM left after the
// headroom (the CUDA context, workspaces and communication buffers, and the allocator's slack, taken off).
double usable_hbm_bytes(const sim::Cluster& cluster, double hbm_headroom);
PlanMetrics measure(const sim::SimResult& r, const StepInputs& in, double hbm_headroom);
// Builds and simulates a plan's step as a search does: totals only (no memory or link counters for a trace), and
// stopped early once `cancel` is set. Throws InputError where the plan cannot be built.
sim::SimResult simulate_plan_step(const StepInputs& in, const PlanSpec& spec, const std::atomic<bool>* cancel = nullptr);
// As plan files ("predicted") and `plan --json` write it.
nlohmann::json metrics_json(const PlanMetrics& m);

// Cheap bounds, never above what the simulation would report: the bytes that must sit in one GPU's HBM and in
// one node's DRAM, and the step time (compute at the best efficiency the profile allows for every FLOP, or the
// copies one GPU's copy engine must make at its sustained rate, whichever is longer).
struct Bounds {
  double hbm_bytes = 0;
  double dram_bytes = 0;
  double step_s = 0;
};
Bounds lower_bounds(const StepInputs& in, const PlanSpec& spec);

// The chunk lengths the search tries for a sequence: powers of two from 1K to 256K that divide it, and S / 2^j
// where the sequence is not a power of two (so that 1000K still gets chunks of 125K, 62.5K...).
std::vector<std::int64_t> chunk_sizes(std::int64_t seq);
// The divisors of n, ascending: the degrees the search tries.
std::vector<int> divisors(int n);
// Micro-batches of 1, 2 or 4 sequences (where the batch splits so; the schemes' checks drop the rest).
inline constexpr std::int64_t kSearchedMicroBatches[] = {1, 2, 4};

// The configuration of `scheme` the bounds favour, without simulating anything: among the valid configurations
// whose memory bounds fit, the one with the smallest step-time bound; when none fits, the one with the least HBM
// bound. A quick stand-in for the search's answer (the GUI draws its curves with it while the search runs);
// nullopt when the scheme has no valid configuration for these inputs.
std::optional<PlanSpec> quick_plan(const StepInputs& in, const std::string& scheme, double hbm_headroom);

// Every configuration of the schemes that passes the schemes' own checks (divisibility, heads, batch).
std::vector<PlanSpec> enumerate_plans(const StepInputs& in, const std::vector<std::string>& schemes);

struct RankedPlan {
  PlanSpec spec;
  PlanMetrics metrics;
  Bounds bounds;
  // For the best plan of a scheme outside the top k: how much better (as a fraction of its objective) an
  // unsimulated plan of the same scheme could still be, by the bounds; 0 when it is that scheme's exact best.
  double gap = 0;
};

// A plan's step by the analytic estimate (planner/analytic.hpp): provisional wherever it is shown.
struct StepEstimate {
  double step_s = 0;
  double hbm_bytes = 0;   // the fullest GPU's peak, tensors only (as PlanMetrics::peak_hbm_bytes)
  double dram_bytes = 0;  // the fullest node's host DRAM
  double mfu = 0;         // trainyard's convention (models/model.hpp), of the bf16 peak
  bool fits = false;      // HBM within what the stack can allocate after `hbm_headroom`, DRAM within the node's
};
struct EstimatedPlan {
  PlanSpec spec;
  StepEstimate estimate;
};

struct SearchOptions;
// Each spec's simulated metrics, in order; nullopt where SearchOptions::runnable_graph refused its graph.
using WaveResults = std::vector<std::optional<PlanMetrics>>;
// Where a wave's simulations run when not on this process's threads: other MPI ranks (app/plan_farm.hpp), or a
// file of earlier results first (--resume). Called on the search's thread with a wave's specs.
using SimulationFarm = std::function<WaveResults(const StepInputs&, const std::vector<PlanSpec>&)>;

struct SearchOptions {
  std::vector<std::string> schemes = scheme_names();
  Objective objective = Objective::throughput;  // throughput or min_hbm (max_seq: max_sequence below)
  double hbm_headroom = 0.05;                   // fraction of each GPU's HBM kept free
  int top = 10;
  int threads = 0;                                                           // 0: all cores
  std::function<void(std::size_t done, std::size_t total)> progress;         // plans decided, of all enumerated
  std::function<void(std::size_t done, std::size_t total)> bounds_progress;  // candidates whose bounds are computed
  // Set (e.g. by Ctrl-C): the bounds phase and the simulations stop; the report (interrupted) holds every plan whose
  // simulation finished.
  const std::atomic<bool>* cancel = nullptr;
  bool prune = true;  // false: simulate every candidate (tests compare the two)
  // True: candidates are visited best estimate first, and a candidate is also skipped where the analytic estimate,
  // less the most it has been measured above the simulator (planner/analytic.hpp, estimate_margin), cannot beat the
  // k-th plan found. Exact as long as the estimate errs no further than measured; false: the sound bounds alone.
  bool prune_by_estimate = true;
  // With prune_by_estimate: called once the bounds phase is done with the `top` candidates the estimate ranks first
  // among those that may fit (a terminal shows them at once, labelled, while the simulator confirms).
  std::function<void(const std::vector<EstimatedPlan>&)> estimated;
  // Memory for the graphs in flight (0: common/memory_budget.hpp's default). A candidate whose graph alone would
  // not fit is skipped (counted in over_budget); a wave runs as many simulations at once as fit together. When no
  // plan fits and some candidates were skipped so, search() throws InputError (--memory-budget) with the smallest
  // estimate, unless refuse_over_budget is false (max_sequence probes).
  std::int64_t memory_budget_bytes = 0;
  // The gate the simulations in flight hold their estimates in: shared with other work that builds graphs (the
  // GUI's chart points) so that all of it together stays within one budget; null: the search's own, of the budget.
  MemoryGate* memory_gate = nullptr;
  bool refuse_over_budget = true;
  // True: the search ends with the wave in which some plan first fits (max_sequence's probes ask only whether one
  // does); `ranked` then holds that wave's fitting plans, not the best of all.
  bool stop_at_first_fit = false;
  // Candidates for which this says true are left out as known not to fit (counted in pruned_memory):
  // max_sequence's probes skip the configurations that did not fit at a shorter length.
  // Called on the worker threads of the bounds phase.
  std::function<bool(const PlanSpec&)> known_not_to_fit;
  // With prune_by_estimate: a candidate whose estimated memory, less the estimate's measured margin, exceeds what
  // the GPU or node has is left out as known not to fit too (max_sequence's probes: near and above the longest
  // length, where every candidate must be shown not to fit, the simulator gets only the close calls).
  bool prune_memory_by_estimate = false;
  // When set, only the candidates for which it returns true are enumerated (`plan --executable`: the plans the
  // chosen executor runs). Given the inputs, which max_sequence's probes change.
  std::function<bool(const StepInputs&, const PlanSpec&)> runnable;
  // What `runnable` keeps, as the reason a scheme without a kept configuration gives ("none of its 12
  // configurations is one ..."): the executor's (--executable) by default, or an engine's (--engine).
  std::string runnable_keeps = "the executor asked for (--executable) runs";
  // When set, a candidate the search is about to simulate is left out (counted in not_runnable_by_scheme) unless
  // its built graph passes this too: checked on the graph the simulation builds, so nothing is built twice and
  // nothing the bounds pruned is built. Called on the worker threads.
  std::function<bool(const StepInputs&, const PlanSpec&, const sim::TaskGraph&)> runnable_graph;
  // Set: the waves' simulations go there instead of this process's threads (the answer does not depend on it).
  SimulationFarm farm;
  // Called on the worker thread before each simulation (tests inject failures here).
  std::function<void(const PlanSpec&)> before_simulate;
};

struct SearchReport {
  std::vector<RankedPlan> ranked;  // every simulated plan that fits, best first
  // The best simulated plan of each scheme that has one fitting, in scheme_names() order. Exact for the schemes in the
  // top k; for the others, `gap` bounds how far their true best can be ahead of it.
  std::vector<RankedPlan> best_of_scheme;
  std::optional<RankedPlan> closest_miss;  // when nothing fits: the candidate that missed by the least
  // Per scheme: its candidate that missed by the least (planner/no_fit.hpp says why a scheme has no plan).
  std::map<std::string, RankedPlan> closest_miss_by_scheme;
  std::size_t enumerated = 0, pruned_memory = 0, pruned_time = 0, simulated = 0;
  std::size_t pruned_estimate = 0;  // of pruned_time: those only the estimate (with its measured margin) ruled out
  std::size_t over_budget = 0;      // candidates skipped: their graph would exceed the memory budget
  double smallest_over_budget_bytes = 0;
  std::map<std::string, std::size_t> enumerated_by_scheme;    // valid configurations per scheme
  std::map<std::string, std::size_t> not_runnable_by_scheme;  // valid ones SearchOptions::runnable left out
  std::string runnable_keeps;                                 // SearchOptions::runnable_keeps
  std::vector<PlanSpec> simulated_misses;                     // the simulated candidates that did not fit
  bool interrupted = false;
};

SearchReport search(const StepInputs& in, const SearchOptions& options);

// Simulates `specs` on this process's threads as a search's wave does (options' threads, memory budget, cancel,
// runnable_graph, before_simulate): what a farm's workers run.
WaveResults simulate_here(const StepInputs& in, const std::vector<PlanSpec>& specs, const SearchOptions& options);
// PlanMetrics in full and back, doubles exact (a farm's messages, --resume's file); InputError naming `origin`.
nlohmann::json metrics_record(const PlanMetrics& m);
PlanMetrics metrics_from_record(const nlohmann::json& j, const std::string& origin);
// A plan as JSON ({"scheme", "parameters"}, as plan files name them) and back, for the records that carry plans
// (app/plan_farm.hpp's messages and --resume lines, HotSPa's group results); `origin` names the record in errors.
nlohmann::json plan_spec_record(const PlanSpec& spec);
PlanSpec plan_spec_from_record(const nlohmann::json& j, const std::string& origin);

// The longest sequence (a multiple of 1K tokens, found by doubling then bisection) at which `scheme` has a
// plan that fits, with that plan; nullopt when not even 1K tokens fit. options.progress gets (probes done, the
// most probes there can be); a set cancel flag ends the probing with the longest length found so far.
struct MaxSeqResult {
  std::int64_t seq_len = 0;
  RankedPlan plan;
  bool limited_by_budget = false;  // longer probes had no candidate within the memory budget
};
std::optional<MaxSeqResult> max_sequence(const StepInputs& in, const std::string& scheme, const SearchOptions& options);

}  // namespace trainyard::planner
