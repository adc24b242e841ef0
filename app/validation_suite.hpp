#pragma once
#include <cmath>
#include <limits>
// The public validation suite (validation/datasets/*.json, schema trainyard.validation.v1; docs/validation.md): published
// measurements and how to predict each with trainyard. Loading checks every field (errors name the file and
// the field); running a case simulates it and states the prediction in the source's own terms.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/error_bars.hpp"
#include "models/model.hpp"

namespace trainyard::app {

// An attention kernel benchmark as FlashAttention's benchmark script runs it: `tokens` tokens per call split
// into sequences of `seq`, hidden / head_dim heads; the forward, the backward, or both timed.
struct AttentionShape {
  std::string hw;  // a node profile; its GPU is the one timed
  std::int64_t seq = 0;
  std::int64_t head_dim = 0;
  std::int64_t hidden = 0;
  std::int64_t tokens = 0;
  bool causal = true;
  std::string pass = "fwd+bwd";  // fwd, bwd or fwd+bwd
  std::string implementation;    // the kernel the source timed: flash2, flash3 or cudnn (hw::AttentionKernel)
  std::string gpu_profile;       // validate --gpu-profile: timed on this GPU profile instead of the node's
};

// Scan --seq over powers of two from `from` to `to`: the longest that completes is the predicted max length,
// and the other figures are taken there. `clamp` lists flags whose value must not exceed the sequence
// (FPDT's --chunk: a run shorter than one chunk is one chunk).
struct SeqScan {
  std::int64_t from = 0;
  std::int64_t to = 0;
  std::vector<std::string> clamp;
};

struct ValidationCase {
  std::string name;
  bool fast = false;                  // cheap enough for CI (trainyard validate --fast)
  std::vector<std::string> simulate;  // `trainyard simulate` flags: --strategy ... or --collective ...
  // Options the source does not state but tuned (micro-batch, interleaving, recompute): flag -> the values to
  // try. Every combination is simulated and the fastest that fits is compared, as a user tuning the run would
  // pick; the choice is reported.
  std::vector<std::pair<std::string, std::vector<std::string>>> unstated;
  std::optional<AttentionShape> attention;
  std::optional<SeqScan> scan;
  std::map<std::string, double> published;  // metric -> the published figure (kValidationMetrics)
  std::string note;                         // what the source leaves unstated and what was assumed
  // "speedup_over": the case (same dataset, publishing step_s) whose step_s over this case's is the "speedup" figure.
  std::string speedup_over;
  // "calibration": why this case's figures were used to fit an input (e.g. a length distribution); they are
  // printed beside the checks but left out of the MAPE.
  std::string calibration;
};

// Another reasonable reading of what a source leaves unstated (the testbed's NIC, the FLOP convention of its
// MFU): the same cases with some flag values replaced, or under another convention. validate reports the error
// under each reading beside the dataset's own, so a choice between readings is shown, not hidden.
struct ValidationReading {
  std::string name;
  std::map<std::string, std::string> replace;  // a simulate flag value -> the value this reading uses instead
  std::optional<model::FlopConvention> convention;
  std::string convention_text;
};

struct ValidationDataset {
  std::string name;
  std::string title;
  std::string source;
  std::string origin;  // the file
  model::FlopConvention convention;
  double peak_tflops = 0;  // the peak the source divides by for MFU; 0: the GPU profile's bf16 dense peak
  std::string convention_text;
  std::vector<ValidationCase> cases;
  std::vector<ValidationReading> readings;
};

// The dataset as `reading` reads it (same name): its convention, every case's flags with the reading's replacements.
ValidationDataset under_reading(const ValidationDataset& dataset, const ValidationReading& reading);

// The figures a case may publish: step_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu, peak_hbm_gib, max_seq,
// busbw_GBps, algbw_GBps, time_us (collectives), attention_tflops (kernels), speedup (with "speedup_over").
extern const std::vector<std::string> kValidationMetrics;

struct Comparison {
  std::string metric;
  double published = 0;
  double predicted = 0;
  bool counted = true;  // false: a calibration figure (ValidationCase::calibration), not in the MAPE
  // The analytic estimate's figure (planner/analytic.hpp), where it gives one (a step's figures but its max
  // length); NaN otherwise.
  double estimated = std::numeric_limits<double>::quiet_NaN();
  double relative_error() const { return (predicted - published) / published; }
  bool has_estimate() const { return !std::isnan(estimated); }
  double estimate_error() const { return (estimated - published) / published; }
};

struct CaseResult {
  std::string name;
  std::vector<Comparison> comparisons;
  std::string error;                   // not empty: the case could not be predicted (says why)
  std::string remark;                  // e.g. where a --seq scan had to stop short of its end, and why
  std::optional<PredictionKind> kind;  // a training step's: what its error bar is looked up by (app/error_bars.hpp)
};

ValidationDataset parse_validation_dataset(const nlohmann::json& document, const std::string& origin);
std::vector<ValidationDataset> builtin_validation_suite();
std::vector<ValidationDataset> load_validation_files(const std::vector<std::string>& paths);

// Predicts the case; a configuration trainyard cannot build (an InputError) or a predicted out-of-memory
// comes back as CaseResult::error rather than an exception.
CaseResult run_case(const ValidationDataset& dataset, const ValidationCase& c, std::int64_t budget_bytes);
// A case's result as JSON and back, every field (validate under mpirun carries them from rank to rank); `origin`
// names the message in errors.
nlohmann::json case_result_record(const CaseResult& r);
CaseResult case_result_from_record(const nlohmann::json& j, const std::string& origin);
// The "speedup" figures of the cases in `results` that have speedup_over: the named case's predicted step_s over
// this one's (that case is run here when `results` lacks it, e.g. under validate --only).
void add_speedups(const ValidationDataset& dataset, std::vector<CaseResult>& results, std::int64_t budget_bytes);

}  // namespace trainyard::app
