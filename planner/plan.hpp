#pragma once
// A plan: one scheme with all its parameters. The search produces them, plan files store them
// (trainyard.plan.v1), `simulate --plan` and the executor rebuild the same task graph from them.
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "sim/engine.hpp"

#include "planner/schemes/megatron/megatron.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "planner/schemes/zero_family/zero.hpp"

namespace trainyard::planner {

// Each scheme's parameters, one struct per scheme: MegatronParams for "megatron", ZeroParams for the ZeRO family
// ("zero", "ulysses", "ring-attention", "fpdt": one builder), RingTrackParams for "ringtrack". A new scheme with a
// struct of its own adds it to this list and touches no other scheme's.
using SchemeParams = std::variant<MegatronParams, ZeroParams, RingTrackParams>;

struct PlanSpec {
  std::string scheme;   // a registered scheme's name (planner/schemes/scheme.hpp)
  SchemeParams params;  // the struct of that scheme (Scheme::defaults says which)

  // The scheme's parameters; InternalError when the plan holds another scheme's struct (a caller's bug: each
  // scheme's code reads only its own).
  template <typename P>
  P& as() {
    P* p = std::get_if<P>(&params);
    TRAINYARD_CHECK(p != nullptr, "the plan of scheme \"" + scheme + "\" read as another scheme's parameters");
    return *p;
  }
  template <typename P>
  const P& as() const {
    const P* p = std::get_if<P>(&params);
    TRAINYARD_CHECK(p != nullptr, "the plan of scheme \"" + scheme + "\" read as another scheme's parameters");
    return *p;
  }

  std::string summary() const;  // the key parameters in a few words: "ring 8, chunk 16K, kv dram, ..."
  // The share of a model's `layers` whose whole forward runs again in backward (full recompute, checkpointing);
  // every other layer of the ZeRO family's every-n checkpointing counts, so the share is rounded down.
  double recomputed_layer_share(std::int64_t layers) const;
};

// The scheme's own checks of its parameters against the inputs, without building anything (InputError names the flag).
void check_plan(const StepInputs& in, const PlanSpec& spec);

// Builds the step's task graph (validated by the scheme's checks: InputError names the flag). For ringtrack,
// `rings` receives the chosen ring orders when given.
sim::TaskGraph build_plan(const StepInputs& in, const PlanSpec& spec, RingTrackPlan* rings = nullptr);

// The "parameters" object of a plan file, and back. Every parameter of the scheme is written and required.
nlohmann::json parameters_json(const PlanSpec& spec);
PlanSpec parse_parameters(const std::string& scheme, const nlohmann::json& parameters, const std::string& origin);

// A plan file (trainyard.plan.v1): what to run and what the planner predicted. Model and hardware are kept as
// the names (or paths, or custom: specs) the user gave, so `simulate --plan` and the executor load the same ones.
struct PlanFile {
  std::string model;
  std::string hw;
  int nodes = 1;
  Workload workload;
  std::string precision = "bf16-mixed";
  std::string stack = "megatron-lm";  // the software stack (stacks/frameworks/); plans written before stacks lack it
  PlanSpec spec;
  nlohmann::json predicted = nlohmann::json::object();  // metrics at planning time
};
nlohmann::json plan_file_json(const PlanFile& plan);
// Reads and checks a plan file; every error names the file and the field.
PlanFile read_plan_file(const std::string& path);

// A ring order: empty (chosen from the topology), or each position 0..ring-1 exactly once. The InputError
// (`origin`, `field`) names the first position out of range, else the first repeated one, else the count.
void check_ring_order(const std::vector<int>& order, int ring, const std::string& origin, const std::string& field);

// The schemes' checks name command-line flags ("--chunk: field 'value': ..."); for a plan file the same problem
// is in a field of the file. Returns `e` retold for `path` ("plan.json: field 'parameters.chunk': ..."), flags
// mentioned in its text renamed too; an error that names no flag comes back as it was.
InputError plan_file_error(const std::string& path, const InputError& e);

// How far a plan's stored prediction ("predicted": step_s and peak_hbm_bytes) is from `result`, in one sentence,
// when either differs by more than kPredictionTolerance; empty when within it or when the plan stores none.
// The simulator is deterministic: the same inputs give the same numbers, so a difference means the plan's inputs
// (a profile or model file, or trainyard itself) changed since it was written. The tolerance only absorbs
// floating-point differences between builds (a libm's last bits move results by far less than 0.01%).
inline constexpr double kPredictionTolerance = 0.001;
std::string prediction_drift(const PlanFile& plan, const sim::SimResult& result, int gpus);

}  // namespace trainyard::planner
