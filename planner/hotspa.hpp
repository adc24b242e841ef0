#pragma once
// Variable-length mini-batches run static (one strategy for every length group) or hot-switched (seed 004,
// HotSPa: each length group under its own strategy, gradients accumulated across groups, one update), and the
// search for the group bounds and the strategy of each group.
//
// A mini-batch runs its groups shortest first. The update layout ("home") is the last group's: its parameters
// stay in place while the others run, so the first switch moves parameters only, the last gradients only, and
// those between both. A switch's parameter transfers overlap the group before it when the destination GPUs have
// room for the incoming parameters beside that group's peak; its gradient transfers wait for the group to end.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/lengths.hpp"
#include "planner/plan.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/switching.hpp"

namespace trainyard::planner {

struct HotSpaSetting {
  const model::ModelConfig& model;
  const sim::Cluster& cluster;
  model::PrecisionPolicy precision;
  Batching batching = Batching::packing;
  double hbm_headroom = 0.05;
  // Strategies given without a micro-batch get the largest that keeps a micro-batch within this many tokens
  // (ffd-padded: one row, as the artifact runs them).
  std::int64_t micro_batch_tokens = 16384;
  int threads = 0;  // 0: all cores
  // Memory for the group graphs in flight (0: common/memory_budget.hpp's default): a group whose graph alone would
  // exceed it is an InputError (--memory-budget) before it is built; the search skips such candidates.
  std::int64_t memory_budget_bytes = 0;
  // Set (e.g. by Ctrl-C): simulations stop and the functions below throw trainyard::Interrupted.
  const std::atomic<bool>* cancel = nullptr;
  // `plan --lengths --executable`: when set, the search considers only strategies `runnable` accepts for a group's
  // rows, and a group whose built graph `runnable_graph` refuses does not fit (the executors' refusals).
  std::function<bool(const StepInputs&, const PlanSpec&)> runnable = nullptr;
  std::function<bool(const sim::TaskGraph&)> runnable_graph = nullptr;
  // Packed rows attend within each document (attention scaled to the documents' share: GroupRows::attention_density);
  // false: causal over whole rows, as the executors run them (run --lengths).
  bool document_masks = true;
  // The collectives' costs (run --lengths --collectives: e.g. the MPI library calibrate wrote); null: NCCL's.
  const stacks::CollectiveLibrary* collectives = nullptr;
};

// "megatron:tp=16,pp=2" (dp defaults to the GPUs left), "ulysses:sp=8", "ringtrack:ring=8,chunk=16384": a scheme and
// any of its plan-file parameters (docs/planner.md); the rest keep their defaults. InputError names `origin`.
// `micro_batch_given` (when not null) says whether the text set micro_batch.
PlanSpec parse_strategy(const std::string& text, const std::string& origin, int gpus, bool* micro_batch_given = nullptr);
// "4K=megatron:dp=4,tp=2,pp=4;32K=megatron:tp=16,pp=2": groups by upper bound, ascending.
struct GroupPlan {
  std::int64_t upper = 0;  // the group is (previous upper, upper]
  PlanSpec spec;
  bool auto_micro_batch = true;  // the micro-batch was not given: HotSpaSetting::micro_batch_tokens picks it
  std::int64_t row_len = 0;      // rows of this many tokens; 0: the group's bound (a static plan uses the longest)
};
std::vector<GroupPlan> parse_group_plans(const std::string& text, const std::string& origin, int gpus);
std::string describe(const std::vector<GroupPlan>& plans);  // for people: "4K=megatron tp 2, pp 4, ...; ..."
// The --switch text parse_group_plans reads back to the same plans (every parameter given, so the micro-batch too):
// what `plan --lengths` prints for `run --lengths --switch`.
std::string switch_text(const std::vector<GroupPlan>& plans);

// `spec` with the micro-batch HotSpaSetting::micro_batch_tokens gives rows of `row_len`; and the multiple of rows
// the spec's builder needs (data-parallel width times micro-batch).
PlanSpec with_micro_batch(const HotSpaSetting& s, PlanSpec spec, std::int64_t row_len);
std::int64_t row_multiple(const PlanSpec& spec, int gpus);

struct GroupResult {
  std::int64_t lo = 0, hi = 0, sequences = 0, tokens = 0;
  GroupRows rows;
  PlanSpec spec;
  bool fits = false;
  std::string failure;
  double time_s = 0;
  std::int64_t peak_hbm_bytes = 0;
  double model_flops = 0;
};
struct SwitchResult {
  std::size_t from = 0, to = 0;  // group indices
  std::int64_t param_bytes = 0, grad_bytes = 0;
  bool params_overlapped = false;  // the parameters moved during group `from`
  double exposed_s = 0;            // time the switch adds to the mini-batch
};
struct MinibatchResult {
  std::vector<GroupResult> groups;  // non-empty groups, shortest first
  std::vector<SwitchResult> switches;
  double others_s = 0;  // the switches
  double total_s = 0;
  std::int64_t whole_rows = 0;  // run_static: the rows of the whole mini-batch's run, which gives total_s (else 0)
  bool fits = true;
  std::string failure;  // the first group that does not fit, and why
  double mfu(const sim::Cluster& cluster) const;
};

// Runs the groups of `lengths` cut at the plans' bounds, each under its plan. One plan (or plans that are all the
// same strategy) is static execution. Invalid strategies for a group are an InputError naming `origin`.
MinibatchResult run_minibatch(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const std::vector<GroupPlan>& plans,
                              const std::string& origin);
// The plans of static execution: `spec` on every group of `bounds`, rows at the last bound.
std::vector<GroupPlan> static_plans(const std::vector<std::int64_t>& bounds, const PlanSpec& spec, bool auto_micro_batch);
// Static execution of `spec`: one run over the whole mini-batch packed at the longest bound gives the total (one
// pipeline, one update); each group of `bounds` run alone under the same strategy gives the breakdown (those runs
// each fill and drain the pipeline, so they can add up to more than the total).
MinibatchResult run_static(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const std::vector<std::int64_t>& bounds,
                           const PlanSpec& spec, bool auto_micro_batch, const std::string& origin);
// A group's step as a mini-batch runs it unless it is the last: without its optimizer tasks (the gradients
// accumulate across the groups; one update after the last).
sim::TaskGraph without_optimizer(const sim::TaskGraph& step);
// The mini-batch's non-empty groups as the executors run them (backend/hotspa_step.hpp), shortest first: each
// group's strategy (micro-batch filled in), rows and step graph, without the optimizer (the runner updates once,
// in the last group's layout). InputError names `origin` and the group for a strategy the group cannot take.
struct ExecutableGroup {
  std::int64_t lo = 0, hi = 0;
  PlanSpec spec;
  Workload workload;  // the rows: seq_len tokens each, global_batch of them
  sim::TaskGraph graph;
};
std::vector<ExecutableGroup> minibatch_groups(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const std::vector<GroupPlan>& plans,
                                              const std::string& origin);
// One group alone: `update` keeps the optimizer step.
GroupResult run_group(const HotSpaSetting& s, const LengthGroup& group, const GroupPlan& plan, bool update);

// The search. Candidate bounds are `bounds` (ascending, the last one the longest sequence allowed); every
// contiguous range of them is a candidate group, simulated under the `per_group` configurations (of `schemes`)
// with the best time bounds; group bounds and strategies then come from a shortest path over the bounds that
// counts a switch between neighbouring groups. The best static plan is the best of `per_group` whole-range
// configurations, each run on the finest groups.
// One simulation of the search's range phase: the lengths between bounds i and j (indices into the search's
// bounds, j exclusive) run with `spec`.
struct RangeJob {
  std::size_t i = 0, j = 0;
  PlanSpec spec;
};
// Where the range phase's simulations run (app/plan_farm.hpp spreads them over MPI ranks): the results in the
// order of the jobs.
using RangeFarm = std::function<std::vector<GroupResult>(const std::vector<RangeJob>& jobs)>;

struct HotSpaSearchOptions {
  std::vector<std::string> schemes = scheme_names();
  std::vector<std::int64_t> bounds;
  int per_group = 3;
  std::function<void(std::size_t done, std::size_t total)> progress;
  RangeFarm farm;  // null: here, on the setting's threads
};
struct HotSpaSearchReport {
  std::vector<GroupPlan> best_static, best_switched;  // the static one: one plan per finest group, all the same
  MinibatchResult static_result, switched_result;
  std::size_t simulated = 0;
};
HotSpaSearchReport search_hotspa(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const HotSpaSearchOptions& options);

// The range phase's simulations of a search on these inputs, run here as search_hotspa runs them (a farm's other
// ranks use it): prepared once, then any number of jobs.
class RangeSimulator {
 public:
  RangeSimulator(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const HotSpaSearchOptions& options);
  ~RangeSimulator();
  std::vector<GroupResult> run(const std::vector<RangeJob>& jobs) const;

 private:
  struct Prepared;
  std::unique_ptr<Prepared> prepared_;
};

// A group's result as JSON and back, every field (a farm's message); `origin` names the message in errors.
nlohmann::json group_result_record(const GroupResult& g);
GroupResult group_result_from_record(const nlohmann::json& j, const std::string& origin);

// Static beside hot-switched in the seed's Table 3 form: one row per static group (each run alone), the switched
// plan's time on the first row of each of its groups with the speedup over those rows, "Others", and the totals.
std::string table3(const MinibatchResult& static_run, const MinibatchResult& switched_run);
nlohmann::json minibatch_json(const MinibatchResult& r, const sim::Cluster& cluster);

}  // namespace trainyard::planner
