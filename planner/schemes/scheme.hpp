#pragma once
// The scheme registry: one entry per parallelisation scheme, each in its own file under planner/schemes/, holding
// everything the rest of trainyard needs to know about it. The search, `simulate --strategy`, plan files, HotSPa's
// strategy strings and the GUI loop over this table and never compare scheme names.
//
// Adding a scheme: write planner/schemes/NAME.cpp with a function returning its entry, and add that function to
// the table in registry.cpp (or call register_scheme, as tests/test_scheme_registry.cpp does). A scheme whose
// parameters fit none of PlanSpec's parameter structs also needs a member there.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_reader.hpp"
#include "planner/estimate.hpp"
#include "planner/plan.hpp"
#include "planner/switching.hpp"

namespace trainyard::planner {

using AddPlan = std::function<void(PlanSpec)>;

struct Scheme {
  std::string name;
  std::string description;  // one line, for help texts and the GUI
  // The scheme flags `simulate --strategy NAME` takes (without "--"); the other schemes' flags are refused.
  std::vector<std::string> flags;
  struct RequiredFlag {
    std::string flag;      // without "--"
    std::string expected;  // what the error asks for: "a degree"
  };
  std::vector<RequiredFlag> required_flags;  // of `flags`, the ones without a default
  // `trainyard run` can execute its graph: its tasks say what they compute (sim::Op), so far ring-track's only.
  bool executable = false;

  // The key parameters in a few words ("ring 8, chunk 16K, kv dram, ...").
  std::string (*summary)(const PlanSpec& spec);
  // A plan file's "parameters" object, and back from it (PlanSpec::scheme already set; the reader's fields are
  // the parameters, unknown ones refused by the caller).
  nlohmann::json (*parameters_json)(const PlanSpec& spec);
  void (*parse_parameters)(const json::Reader& parameters, PlanSpec& spec);
  // The scheme's own checks against the inputs, without building anything (InputError names the flag).
  void (*check)(const StepInputs& in, const PlanSpec& spec);
  // The step's task graph; ring-track also fills `rings` (when given) with the ring orders it chose.
  sim::TaskGraph (*build)(const StepInputs& in, const PlanSpec& spec, RingTrackPlan* rings);
  // Every configuration the plan search tries on these inputs, each passed to `add` (which drops invalid ones).
  void (*enumerate)(const StepInputs& in, const AddPlan& add);
  // The graph's size, counted from the parameters (planner/estimate.hpp).
  GraphEstimate (*estimate)(const StepInputs& in, const PlanSpec& spec);
  // The share of `layers` whose whole forward runs again in backward (full recompute, checkpointing).
  double (*recomputed_layer_share)(const PlanSpec& spec, std::int64_t layers);
  // Where parameters (gradients: false) or reduced gradients (true) sit (planner/switching.hpp).
  StateLayout (*layout)(const StepInputs& in, const PlanSpec& spec, bool gradients);

  // HotSPa (planner/hotspa.hpp): a group's micro-batch in sequences, the row count its step needs a multiple of,
  // and the parameters a strategy string may leave out, filled from the group's GPU count.
  void (*set_micro_batch)(PlanSpec& spec, std::int64_t sequences);
  std::int64_t (*row_multiple)(const PlanSpec& spec, int gpus);
  void (*complete_strategy)(nlohmann::json& parameters, const std::vector<std::string>& given, int gpus);
};

// The schemes in the order the planner lists them.
const std::vector<std::string>& scheme_names();
// "ringtrack, fpdt, ..., zero" (joined by `separator`) for help texts and errors.
std::string scheme_list(std::string_view separator = ", ");
// The entry of `name`, or nullptr.
const Scheme* find_scheme(std::string_view name);
// The entry of `name`; InputError (`origin`, `field`) naming the schemes otherwise.
const Scheme& scheme_named(std::string_view name, const std::string& origin = "scheme", const std::string& field = "value");
// Adds an entry after the built-in ones (tests' own schemes); InputError when the name is taken.
void register_scheme(const Scheme& scheme);

}  // namespace trainyard::planner
