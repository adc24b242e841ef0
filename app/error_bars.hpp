#pragma once
// An error bar on every prediction (docs/validation.md, "Error bars"): how far trainyard's step time was off on the
// published runs most like this one. `trainyard validate --write-error-bars` records each public case's signed
// error with what it was (scheme family, GPU generation, stack, sequence length, tokens per GPU) in
// validation/error_bars.json, built into the binary; simulate, plan and the GUI look up the nearest of them.
//
// The rule: only cases of the same scheme family count; their distance is the mean of |log2 of the sequence
// ratio| and |log2 of the tokens-per-GPU ratio|, + 1 for another GPU generation, + 1 for another stack; cases within
// kMaxDistance count, the kMaxCases nearest of them. With fewer than kMinCases there is no bar. The bar is the
// median error and the range (smallest to largest) of those cases: were runs like them exchangeable, a new one
// would land inside the range of n with probability (n - 1) / (n + 1), 85% with 12.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/step.hpp"

namespace trainyard::app {

// What a prediction is, as far as its expected error goes.
struct PredictionKind {
  std::string family;          // scheme_family(): the scheme registry's family (megatron, zero, ringtrack), or hotspa
  std::string gpu_generation;  // gpu_generation(): ampere, hopper, ada, cpu, other
  std::string stack;
  double seq_tokens = 0;
  double tokens_per_gpu = 0;  // tokens of one step per GPU: the work each GPU has
};

std::string scheme_family(const std::string& scheme);  // --strategy name, or "hotspa" for a mini-batch of mixed lengths
std::string gpu_generation(const std::string& gpu);    // by the GPU profile's name
PredictionKind prediction_kind(const std::string& scheme, const std::string& gpu, const std::string& stack, double seq_tokens, double tokens_per_gpu);
// A step of `workload` on the cluster's GPU and stack, its tokens over `gpus` (the whole step's: a symmetry
// reduction simulates fewer than it has).
PredictionKind step_kind(const std::string& scheme, const sim::Cluster& cluster, const planner::Workload& workload, int gpus);

// One published figure of the suite: trainyard's signed relative error on the step time it implies (negative:
// the prediction was faster than the run).
struct ErrorRecord {
  std::string dataset;
  std::string case_name;
  std::string metric;  // the published figure it came from (step_s, mfu, tokens_per_s_per_gpu, tflops_per_gpu)
  PredictionKind kind;
  double step_error = 0;
};

// The step-time error a figure implies: (predicted - published) / published of the step time, so a throughput
// figure's error is inverted. nullopt for figures that are not about the step's speed (memory, max length, kernels).
std::optional<double> step_time_error(const std::string& metric, double published, double predicted);

struct ErrorBar {
  int cases = 0;  // 0: no validated case near this plan
  double median = 0, low = 0, high = 0;
  std::vector<std::string> datasets;  // where its cases come from
  std::string text() const;           // "trainyard's step time was -8%..+21% off (median -3%) on 12 published runs like this"
  std::string short_text() const;     // "-8%..+21% (12)", or "none"
  nlohmann::json json() const;
};

inline constexpr double kMaxDistance = 3.0;
inline constexpr int kMaxCases = 12;
inline constexpr int kMinCases = 3;

// The bar for `kind` from `records`, leaving out the record named `exclude` (dataset/case) when given.
ErrorBar error_bar(const PredictionKind& kind, const std::vector<ErrorRecord>& records, const std::string& exclude_dataset = "",
                   const std::string& exclude_case = "");
// The built-in records (validation/error_bars.json).
const std::vector<ErrorRecord>& builtin_error_records();
ErrorBar error_bar(const PredictionKind& kind);

std::vector<ErrorRecord> parse_error_records(const nlohmann::json& document, const std::string& origin);
nlohmann::json error_records_json(const std::vector<ErrorRecord>& records);

// How many records lie within the bar built from the others (each left out of its own bar), of those that have one.
struct Coverage {
  int covered = 0, with_bar = 0, without_bar = 0;
};
Coverage coverage(const std::vector<ErrorRecord>& records);

}  // namespace trainyard::app
