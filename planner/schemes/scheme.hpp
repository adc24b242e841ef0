#pragma once
// The scheme registry: one entry per parallelisation scheme, each in its own folder under planner/schemes/, holding
// everything the rest of trainyard needs to know about it. The search, `simulate --strategy`, plan files, HotSPa's
// strategy strings and the GUI loop over this table and never compare scheme names.
//
// Adding a scheme: write planner/schemes/NAME/NAME_scheme.cpp with a function returning its entry, and add that
// function to the table in registry.cpp (or call register_scheme, as tests/test_scheme_registry.cpp does). A scheme whose
// parameters fit none of the existing structs adds its own to planner/plan.hpp's SchemeParams.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_reader.hpp"
#include "planner/bounds.hpp"
#include "planner/engines/launch.hpp"
#include "planner/estimate.hpp"
#include "planner/plan.hpp"
#include "planner/switching.hpp"
#include "planner/symmetry.hpp"

namespace trainyard::planner {

using AddPlan = std::function<void(PlanSpec)>;

// The command line as `simulate --strategy` hands it to a scheme (app/ adapts boost::program_options to it).
struct FlagValues {
  std::function<std::optional<std::int64_t>(const std::string& flag)> integer;  // an integer flag, when given
  std::function<std::optional<std::string>(const std::string& flag)> text;      // a text flag, when given
  std::function<bool(const std::string& flag)> on;                              // a switch
};
// --recompute: none (the default), selective or full; InputError otherwise.
Recompute recompute_flag(const FlagValues& flags);

// One parameter of a scheme, described once: its plan-file field, how the GUI shows it, and how it is read from and
// written to a PlanSpec. Plan files, HotSPa's strategy strings and the GUI's panel are generated from these.
struct Param {
  enum class Kind {
    integer,  // min..max
    boolean,
    choice,  // one of `choices`
    tokens,  // a token count min..max (the GUI's shared chunk control sets it: not in the panel)
    set,     // a comma list of some of `choices`, "none" for none of them (the GUI: a check box each)
    custom,  // read by `read` (errors name the field), written by `get`; not in the panel
  };
  enum class Bound { fixed, gpus, layers };  // the GUI's upper bound: `max`, the cluster's GPUs, the model's layers
  std::string key;                           // plan-file field ("micro_batch")
  std::string label;                         // the GUI's label ("micro-batch")
  Kind kind = Kind::integer;
  std::int64_t min = 1, max = 1 << 20;
  Bound gui_max = Bound::fixed;
  std::vector<std::string> choices;
  bool optional = false;                                      // plan files written before it existed may lack it: the PlanSpec's default stays
  bool in_panel = true;                                       // shown in the GUI's parameter panel
  std::function<nlohmann::json(const PlanSpec&)> get;         // an integer, a bool or a string
  std::function<void(PlanSpec&, const nlohmann::json&)> set;  // from a value of the kind (custom: unused)
  std::function<void(const json::Reader&, PlanSpec&)> read;   // custom only
};

// What `trainyard run` needs of a scheme (a facet: schemes without it have no plan that runs with real tensors).
struct RunFacet {
  // What `trainyard run` needs of this scheme's plan to run it with real tensors (its tasks say what they compute:
  // sim::Op), for the plan's model and cluster, run as `ranks` processes (1: without mpirun). Empty: it runs; else
  // the parameter and value it needs ("tp 1: ..."). On the CPU a graph the executor refuses
  // (backend::executor_refusal) falls back to the untimed CPU reference; on GPUs it is refused.
  std::function<std::string(const StepInputs&, const PlanSpec&, int ranks)> refusal;
  // What `trainyard run --check` compares the plan's step with: the same plan without chunks or offload (given a
  // sequence length). Null: the plainest step of the model, data parallelism alone (the ring-track entry's
  // unchunked step with rings of one GPU), so that the scheme's sharding, pipelining and offload are checked.
  std::function<PlanSpec(const PlanSpec&, std::int64_t seq_len)> unchunked;
};

// HotSPa's hooks (planner/hotspa.hpp; a facet: HotSPa switches between the schemes that have it).
struct HotSpaFacet {
  // Where parameters (gradients: false) or reduced gradients (true) sit, which a switch moves (planner/switching.hpp).
  StateLayout (*layout)(const StepInputs& in, const PlanSpec& spec, bool gradients);
  // A group's micro-batch in sequences, the row count its step needs a multiple of, and the parameters a
  // strategy string may leave out, filled from the group's GPU count.
  void (*set_micro_batch)(PlanSpec& spec, std::int64_t sequences);
  std::int64_t (*row_multiple)(const PlanSpec& spec, int gpus);
  void (*complete_strategy)(nlohmann::json& parameters, const std::vector<std::string>& given, int gpus);
  std::int64_t min_row_tokens = 0;  // HotSPa's search tries the scheme for rows at least this long only
};

// The sequence chunk of schemes that have one (ring-track's chunk, FPDT's attention chunk), which the GUI's chunk
// chart sweeps (a facet).
struct ChunkFacet {
  std::int64_t (*tokens)(const PlanSpec& spec);
  void (*set_tokens)(PlanSpec& spec, std::int64_t tokens);
  // The most chunks per sequence a GUI sweep builds (the graph grows with them, FPDT's quadratically).
  std::int64_t interactive_chunks = 0;
};

// A scheme: a small core every scheme fills, and facets that the features some schemes take read (absent: the
// feature passes the scheme by). One entry per scheme, in planner/schemes/NAME/.
struct Scheme {
  std::string name;
  std::string description;  // one line, for help texts and the GUI
  // The family of published runs that give its predictions their error bar (app/error_bars.hpp): schemes that
  // run on the same framework machinery share one (the ZeRO family: zero, Ulysses, ring attention, FPDT).
  std::string family;
  // Its parameter struct before any parameter is set: which of PlanSpec's alternatives the scheme's plans hold.
  SchemeParams defaults;
  // Every parameter, in the order a plan file's fields are checked.
  std::vector<Param> params;
  // The scheme flags `simulate --strategy NAME` takes (without "--"); the other schemes' flags are refused.
  std::vector<std::string> flags;
  struct RequiredFlag {
    std::string flag;      // without "--"
    std::string expected;  // what the error asks for: "a degree"
  };
  std::vector<RequiredFlag> required_flags;  // of `flags`, the ones without a default
  // The plan `simulate --strategy NAME` builds from the scheme's flags and their defaults (other schemes' flags
  // are refused before); InputError names the flag.
  PlanSpec (*from_flags)(const FlagValues& flags, const sim::Cluster& cluster);
  // The key parameters in a few words ("ring 8, chunk 16K, kv dram, ...").
  std::string (*summary)(const PlanSpec& spec);
  // The scheme's own checks against the inputs, without building anything (InputError names the flag).
  void (*check)(const StepInputs& in, const PlanSpec& spec);
  // The step's task graph; ring-track also fills `rings` (when given) with the ring orders it chose.
  sim::TaskGraph (*build)(const StepInputs& in, const PlanSpec& spec, RingTrackPlan* rings);
  // Every configuration the plan search tries on these inputs, each passed to `add` (which drops invalid ones).
  void (*enumerate)(const StepInputs& in, const AddPlan& add);
  // The scheme's share of the search's lower bounds (planner/bounds.hpp).
  SchemeBounds (*bounds)(const BoundContext& ctx, const PlanSpec& spec);
  // The scheme's share of the analytic estimate of the step (planner/analytic.hpp): time, memory, in closed form.
  SchemeEstimate (*analytic)(const BoundContext& ctx, const PlanSpec& spec);
  // The graph's size, counted from the parameters (planner/estimate.hpp).
  GraphEstimate (*estimate)(const StepInputs& in, const PlanSpec& spec);
  // What simulating it costs, roughly (visits or attention blocks): the search orders candidates whose bounds tie by it.
  double (*search_cost)(const StepInputs& in, const PlanSpec& spec);
  // The share of `layers` whose whole forward runs again in backward (full recompute, checkpointing).
  double (*recomputed_layer_share)(const PlanSpec& spec, std::int64_t layers);

  // The facets.
  std::optional<RunFacet> run;        // `trainyard run`
  std::optional<HotSpaFacet> hotspa;  // `plan --lengths`, `simulate --lengths`
  std::optional<ChunkFacet> chunk;    // the GUI's chunk chart
  // The step with identical ranks simulated once (planner/symmetry.hpp); nullptr: the scheme is not reduced.
  std::optional<ReducedStep> (*reduce_by_symmetry)(const StepInputs& in, const PlanSpec& spec, std::string* why_not) = nullptr;
  // `trainyard export --to ENGINE` (planner/engines/launch.hpp): the engines that run this scheme's plans, each with
  // its writer (planner/engines/writers.hpp); none: no engine has an equivalent (ring-track).
  std::vector<std::pair<std::string, EngineLaunch (*)(const StepInputs&, const PlanSpec&)>> exports = {};

  // A plan of this scheme with its parameters' defaults.
  PlanSpec blank() const { return PlanSpec{name, defaults}; }
};

// A plan file's "parameters" object from the entry's params, and back (the reader's unknown fields are the
// caller's to refuse).
nlohmann::json params_json(const Scheme& scheme, const PlanSpec& spec);
void read_params(const Scheme& scheme, const json::Reader& parameters, PlanSpec& spec);

// Param helpers for the common kinds: `field` is a pointer to a member of the scheme's parameter struct
// (e.g. int_param("tp", "tp", &MegatronParams::tp, 1, 1 << 20)).
template <typename Part, typename T>
Param member_param(std::string key, std::string label, Param::Kind kind, T Part::*field) {
  Param p;
  p.key = std::move(key);
  p.label = std::move(label);
  p.kind = kind;
  p.get = [field](const PlanSpec& spec) { return nlohmann::json(spec.as<Part>().*field); };
  p.set = [field](PlanSpec& spec, const nlohmann::json& v) { spec.as<Part>().*field = v.get<T>(); };
  return p;
}
template <typename Part, typename T>
Param int_param(std::string key, std::string label, T Part::*field, std::int64_t min, std::int64_t max, Param::Bound gui_max = Param::Bound::fixed) {
  Param p = member_param(std::move(key), std::move(label), Param::Kind::integer, field);
  p.min = min;
  p.max = max;
  p.gui_max = gui_max;
  return p;
}
template <typename Part>
Param bool_param(std::string key, std::string label, bool Part::*field) {
  return member_param(std::move(key), std::move(label), Param::Kind::boolean, field);
}
// An enum member taking `values`, each shown as name(value) (the enum's own spelling, as summaries print it).
template <typename Part, typename E>
Param enum_param(std::string key, std::string label, E Part::*field, std::vector<E> values, std::string_view (*name)(E)) {
  Param p;
  p.key = std::move(key);
  p.label = std::move(label);
  p.kind = Param::Kind::choice;
  for (E v : values) p.choices.emplace_back(name(v));
  p.get = [field, name](const PlanSpec& spec) { return nlohmann::json(std::string(name(spec.as<Part>().*field))); };
  p.set = [field, values, name](PlanSpec& spec, const nlohmann::json& v) {
    const auto at = std::find_if(values.begin(), values.end(), [&](E e) { return name(e) == v.get<std::string>(); });
    spec.as<Part>().*field = *at;  // v is one of the choices: read_params and the GUI give no other
  };
  return p;
}
// Plan files written before the parameter existed may lack it.
inline Param optional(Param p) {
  p.optional = true;
  return p;
}
inline Param hidden(Param p) {
  p.in_panel = false;
  return p;
}

// The schemes in the order the planner lists them.
const std::vector<std::string>& scheme_names();
// "ringtrack, fpdt, ..., zero" (joined by `separator`) for help texts and errors.
std::string scheme_list(std::string_view separator = ", ");
// --strategies: "all" (every scheme) or a comma list of scheme names, duplicates dropped; InputError naming
// --strategies otherwise.
std::vector<std::string> schemes_from_list(const std::string& text);
// The entry of `name`, or nullptr.
const Scheme* find_scheme(std::string_view name);
// The entry of `name`; InputError (`origin`, `field`) naming the schemes otherwise.
const Scheme& scheme_named(std::string_view name, const std::string& origin = "scheme", const std::string& field = "value");
// The HotSPa facet of the plan's scheme; InternalError for a scheme without one (parse_strategy and HotSPa's search
// take no such scheme).
const HotSpaFacet& hotspa_facet(const PlanSpec& spec);
// Adds an entry after the built-in ones (tests' own schemes); InputError when the name is taken.
void register_scheme(const Scheme& scheme);

}  // namespace trainyard::planner
