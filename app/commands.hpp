#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "app/error_bars.hpp"
#include "hwprofiles/catalog.hpp"
#include "hwprofiles/node.hpp"
#include "planner/analytic.hpp"
#include "planner/hotspa.hpp"
#include "planner/plan.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"
#include "planner/step.hpp"
#include "sim/collective_bench.hpp"
#include "stacks/collective_library.hpp"

namespace trainyard::app {

struct Command {
  std::string name;
  std::string summary;
  std::function<int(const std::vector<std::string>& args)> run;  // returns the exit code
};

const std::vector<Command>& commands();

int run_list(const std::vector<std::string>& args);
int run_show(const std::vector<std::string>& args);
int run_simulate(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);     // app/plan_command.cpp
int run_compare(const std::vector<std::string>& args);  // app/compare_command.cpp
int run_run(const std::vector<std::string>& args);      // app/run_command.cpp
int run_export(const std::vector<std::string>& args);   // app/export_command.cpp
// What `trainyard run --device DEVICE` (cpu or gpu) needs of a plan that it does not have: empty when it runs the
// plan, else what it expects ("a small model ...", "tp 1 ..."). `plan --executable DEVICE` keeps only the plans
// with an empty answer, so it never picks one that run refuses; run refuses the others with this text.
std::string run_refusal(const planner::StepInputs& in, const planner::PlanSpec& spec, const std::string& device, int ranks = 1);
int run_calibrate(const std::vector<std::string>& args);  // app/calibrate_command.cpp
int run_validate(const std::vector<std::string>& args);   // app/validate_command.cpp
// app/hotspa_command.cpp: the --lengths flags of simulate and plan, and those commands with them.
void add_lengths_options(boost::program_options::options_description& options, bool plan);
int run_simulate_lengths(const boost::program_options::variables_map& vm);
// The mini-batch time of simulate --lengths (the hot-switched run when --switch is given, else the static one);
// `why_not` gets the failure when a group does not fit.
double simulate_minibatch_seconds(const boost::program_options::variables_map& vm, std::string& why_not);
int run_plan_lengths(const boost::program_options::variables_map& vm, const std::vector<std::string>& schemes);
// app/plan_estimate_command.cpp: `plan --estimate-only`, every figure labelled an estimate (JSON: "provisional").
int run_plan_estimate_only(const planner::StepInputs& in, const planner::SearchOptions& search, bool as_json);
// The estimate's first plans, shown while the simulator confirms them (plan on a terminal): labelled provisional.
void print_provisional(std::ostream& out, const std::vector<planner::EstimatedPlan>& plans, double tokens_per_step);
// `run --lengths --switch`: the mini-batch drawn as simulate --lengths draws it, on --hw's nodes under the trainyard
// stack (the executor's) with --gpu-profile's GPU and --collectives' library when given; its non-empty groups built under their strategies
// (planner::minibatch_groups, graphs not finalized), and when `predict` the mini-batch simulated there. Attention
// runs causal over whole rows, as the executors run it (HotSpaSetting::document_masks).
struct SwitchedMinibatch {
  model::ModelConfig model;
  std::optional<sim::Cluster> cluster;
  model::PrecisionPolicy precision;
  std::vector<planner::ExecutableGroup> groups;
  std::int64_t sequences = 0;
  planner::MinibatchResult predicted;
  std::optional<stacks::CollectiveLibrary> collectives;  // --collectives, which the prediction used
};
SwitchedMinibatch load_switched_minibatch(const boost::program_options::variables_map& vm, bool predict);

// Shared by the commands. Parses `args` against `options` (+ positionals); true when --help was printed.
bool parse(const std::vector<std::string>& args, const std::string& usage, boost::program_options::options_description& options,
           const boost::program_options::positional_options_description& positional, boost::program_options::variables_map& vm);
// --seq with exactly one of --global-batch or --tokens-per-step (a multiple of --seq).
planner::Workload workload_from_flags(const boost::program_options::variables_map& vm);
// Each of `flags` that was given names a path write_file_atomically can write (common/atomic_file.hpp); checked
// before any work, and two flags may not name the same file.
void check_output_flags(const boost::program_options::variables_map& vm, std::initializer_list<const char*> flags);
using hw::check_node_count;  // --nodes (hwprofiles/catalog.hpp)
// The command line as the schemes' registry entries read it (their `from_flags`). The map must outlive the result.
planner::FlagValues flag_values(const boost::program_options::variables_map& vm);

// --memory-budget (app/limits.cpp): the option, and its value or the default budget in bytes.
void add_memory_budget_option(boost::program_options::options_description& options);
std::int64_t memory_budget(const boost::program_options::variables_map& vm);

// A plan file with the model and cluster it names (errors name the file and the field).
struct LoadedPlan {
  std::string origin;  // the file
  planner::PlanFile plan;
  model::ModelConfig model;
  std::optional<sim::Cluster> cluster;  // always set; optional because a cluster has no empty state
};
LoadedPlan load_plan(const std::string& path, std::int64_t budget_bytes = 0);  // the cluster is sized first (0: default budget)
// Builds and validates the step of `spec` (the plan's own, or a variant of it) for the plan's model and cluster;
// parameters they cannot take are an InputError naming `origin`.
// Refused (InputError, --memory-budget) before building when its estimate exceeds `budget_bytes` (0: the default).
sim::TaskGraph build_plan_step(const LoadedPlan& loaded, const planner::PlanSpec& spec, const std::string& origin,
                               planner::RingTrackPlan* rings = nullptr, std::int64_t budget_bytes = 0);

// `trainyard simulate`'s options, and the step its flags describe (--graph, --plan or --strategy; not --lengths),
// built and validated; shared with `trainyard validate`, whose cases are simulate flags.
boost::program_options::options_description simulate_options();
struct SimulationSetup {
  std::optional<sim::Cluster> cluster;  // always set
  sim::TaskGraph graph;
  std::string origin;                                    // the file or "--strategy NAME"
  std::optional<planner::RingTrackPlan> ring;            // ringtrack: the rings it chose, reported beside the metrics
  std::optional<planner::PlanFile> plan_file;            // --plan: its stored prediction is compared with the simulation
  std::optional<stacks::CollectiveLibrary> collectives;  // --collectives; none: NCCL's (SimOptions::collectives)
  // --strategy and --plan: the model and workload, so the MFU can be restated in the stack's own convention.
  struct Step {
    model::ModelConfig model;
    planner::Workload workload;
    bool full_recompute = false;  // every layer's forward runs twice (a convention may count it)
    int gpus = 0;                 // of the whole step (a symmetry reduction simulates fewer)
    std::string scheme;           // the --strategy or the plan's scheme
  };
  std::optional<Step> step;
  // Symmetry reduction (planner/symmetry.hpp): the replicas (`symmetry_unit` says what they are),
  // context-parallel ranks and tensor-parallel ranks (of a group) of the whole step and how many of each were
  // simulated (all 0: the whole step ran); `symmetry_note` says what was done or why not.
  std::string symmetry_unit;
  int replicas = 0;
  int simulated_replicas = 0;
  int cp_ranks = 0;
  int simulated_cp_ranks = 0;
  int tp_ranks = 0;
  int simulated_tp_ranks = 0;
  std::string symmetry_note;
  // --estimate: the analytic estimate of the whole step (planner/analytic.hpp), printed instead of a simulation;
  // nothing was built.
  std::optional<planner::StepEstimate> estimate;
};
// The MFU and TFLOP/s per GPU the stack's own log would print for this step (stacks::StackProfile::mfu_convention).
struct LoggedMfu {
  double mfu = 0;
  double tflops_per_gpu = 0;
};
LoggedMfu logged_mfu(const SimulationSetup::Step& step, const sim::SimResult& result, const model::FlopConvention& convention);
// The error bar of this step's prediction: how far trainyard was off on the published runs most like it.
ErrorBar step_error_bar(const SimulationSetup::Step& step, const sim::Cluster& cluster);
stacks::StackProfile stack_from_flags(const boost::program_options::variables_map& vm);
// The cluster of `nodes` nodes of the profile `hw` (`hw_field` names it in errors) under --stack, refused before it
// is built when over --memory-budget (it grows with the nodes).
sim::Cluster load_cluster(const boost::program_options::variables_map& vm, const std::string& hw, const std::string& hw_field, int nodes);
SimulationSetup setup_simulation(const boost::program_options::variables_map& vm);
// simulate --collective OP --bytes S --hw NODE [--nodes N] [--algorithm A]: the lone collective, simulated.
sim::CollectiveBenchmark collective_from_flags(const boost::program_options::variables_map& vm);

}  // namespace trainyard::app
