// The commands' table and what several commands share: the workload and output flags, plan files, the MFU as a
// stack logs it and the error bars.
#include "app/commands.hpp"

#include <iostream>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/memory_budget.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/estimate.hpp"
#include "planner/plan.hpp"
#include "sim/report.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {
      {"list", "list built-in GPUs, nodes, models, strategies or precision policies", run_list},
      {"show", "show a GPU, node or model (built-in name or JSON path) with derived figures", run_show},
      {"plan", "search chunk sizes, rings, offload and parallelism of every scheme; rank, explain, write a plan", run_plan},
      {"simulate", "simulate one step of a task graph (JSON) on a cluster: step time, MFU, memory, trace", run_simulate},
      {"compare", "compare a predicted timeline with a measured one: per task class, per stream, step and peak HBM", run_compare},
      {"run", "run a plan's step with real tensors on a GPU or the CPU: measured against predicted, --check, training", run_run},
      {"export", "write a plan as the launch script and configuration of Megatron-LM, DeepSpeed or torchtitan", run_export},
      {"calibrate", "measure the GPU at hand or the CPU device (GEMM, attention, copies, launches); fit and write a profile", run_calibrate},
      {"validate", "predict every published run, kernel and collective of the validation suite: error per figure, MAPE per dataset", run_validate},
  };
  return all;
}

// Parses `args` against `options` (+ positionals); true when --help was asked for and printed.
bool parse(const std::vector<std::string>& args, const std::string& usage, po::options_description& options,
           const po::positional_options_description& positional, po::variables_map& vm) {
  // Boost.Program_options 1.74 fills its error messages by replacing placeholders until none is left, so an
  // argument holding one ("--x%original_token%") made the error's what() loop forever (found by fuzzing).
  for (const auto& arg : args) {
    for (const char* placeholder : {"%canonical_option%", "%option%", "%original_token%", "%prefix%", "%value%"}) {
      if (arg.find(placeholder) != std::string::npos) {
        throw InputError("arguments", "value", std::string("no argument containing ") + placeholder, "\"" + arg + "\"");
      }
    }
  }
  options.add_options()("help,h", "show this help");
  po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: " << usage << "\n\n" << options << "\n";
    return true;
  }
  po::notify(vm);
  return false;
}

// --seq with --global-batch or --tokens-per-step.
planner::Workload workload_from_flags(const po::variables_map& vm) {
  planner::Workload workload;
  workload.seq_len = parse_token_count(vm["seq"].as<std::string>(), "--seq");
  if (vm.count("global-batch") == vm.count("tokens-per-step")) {
    throw InputError("--global-batch/--tokens-per-step", "value", "exactly one of them", vm.count("global-batch") ? "both" : "neither");
  }
  if (vm.count("global-batch")) {
    workload.global_batch = vm["global-batch"].as<std::int64_t>();
  } else {
    const std::int64_t tokens = parse_token_count(vm["tokens-per-step"].as<std::string>(), "--tokens-per-step");
    if (tokens % workload.seq_len != 0) {
      throw InputError("--tokens-per-step", "value", "a multiple of --seq (" + std::to_string(workload.seq_len) + ")", std::to_string(tokens));
    }
    workload.global_batch = tokens / workload.seq_len;
  }
  if (workload.global_batch < 1) throw InputError("--global-batch", "value", "a positive integer", std::to_string(workload.global_batch));
  return workload;
}

void check_output_flags(const po::variables_map& vm, std::initializer_list<const char*> flags) {
  std::map<std::string, std::string> seen;  // path -> flag
  for (const char* name : flags) {
    if (!vm.count(name)) continue;
    const std::string flag = std::string("--") + name, path = vm[name].as<std::string>();
    check_writable(path, flag);
    if (const auto [it, fresh] = seen.emplace(path, flag); !fresh) {
      throw InputError(flag, "value", "a file other than " + it->second + "'s", "\"" + path + "\" for both");
    }
  }
}

LoggedMfu logged_mfu(const SimulationSetup::Step& step, const sim::SimResult& result, const model::FlopConvention& convention) {
  const double flops = model::convention_flops_per_token(step.model, step.workload.seq_len, convention, step.full_recompute) *
                       static_cast<double>(step.workload.tokens());
  const double per_gpu_flops_per_s = flops / (static_cast<double>(result.step_ns) * 1e-9) / step.gpus;
  return {per_gpu_flops_per_s / result.peak_flops_per_gpu, per_gpu_flops_per_s * 1e-12};
}

ErrorBar step_error_bar(const SimulationSetup::Step& step, const sim::Cluster& cluster) {
  return error_bar(step_kind(step.scheme, cluster, step.workload, step.gpus));
}

stacks::StackProfile stack_from_flags(const po::variables_map& vm) {
  return vm.count("stack") ? stacks::load_stack(vm["stack"].as<std::string>(), "--stack") : stacks::default_stack();
}

sim::Cluster load_cluster(const po::variables_map& vm, const std::string& hw, const std::string& hw_field, int nodes) {
  hw::NodeProfile node = hw::load_node(hw, hw_field);
  check_node_count(nodes, node);
  planner::require_cluster_within_budget(node, nodes, memory_budget(vm));
  return sim::Cluster(std::move(node), nodes, stack_from_flags(vm));
}

LoadedPlan load_plan(const std::string& path, std::int64_t budget_bytes) {
  LoadedPlan l{path, planner::read_plan_file(path), {}, std::nullopt};
  l.model = model::load_model(l.plan.model, path + ": field 'model'");
  hw::NodeProfile node = hw::load_node(l.plan.hw, path + ": field 'hw'");
  try {
    check_node_count(l.plan.nodes, node);
  } catch (const InputError& e) {
    throw planner::plan_file_error(path, e);
  }
  planner::require_cluster_within_budget(node, l.plan.nodes, budget_bytes > 0 ? budget_bytes : default_memory_budget_bytes());
  l.cluster.emplace(std::move(node), l.plan.nodes, stacks::load_stack(l.plan.stack, path + ": field 'stack'"));
  return l;
}

sim::TaskGraph build_plan_step(const LoadedPlan& l, const planner::PlanSpec& spec, const std::string& origin, planner::RingTrackPlan* rings,
                               std::int64_t budget_bytes) {
  const planner::StepInputs inputs{l.model, *l.cluster, l.plan.workload, model::precision_policy(l.plan.precision, l.origin + ": field 'precision'")};
  // Checked and sized before it is built: a graph larger than the memory budget is refused, not built.
  try {
    planner::check_plan(inputs, spec);
  } catch (const InputError& e) {
    throw planner::plan_file_error(origin, e);
  }
  planner::require_within_budget(planner::estimate_plan(inputs, spec), budget_bytes > 0 ? budget_bytes : default_memory_budget_bytes(),
                                 "the step graph of " + origin, "a smaller global_batch, fewer nodes or a larger chunk in the plan");
  sim::TaskGraph graph;
  try {
    graph = planner::build_plan(inputs, spec, rings);
  } catch (const InputError& e) {  // parameters this model or hardware cannot take: the checks name flags, the file has fields
    throw planner::plan_file_error(origin, e);
  }
  sim::validate(graph, l.cluster->gpus(), l.cluster->nodes, origin);
  return graph;
}

planner::FlagValues flag_values(const po::variables_map& vm) {
  planner::FlagValues flags;
  flags.integer = [&vm](const std::string& flag) -> std::optional<std::int64_t> {
    if (!vm.count(flag)) return std::nullopt;
    const boost::any& v = vm[flag].value();
    if (v.type() == typeid(int)) return boost::any_cast<int>(v);
    if (v.type() == typeid(std::int64_t)) return boost::any_cast<std::int64_t>(v);
    throw std::logic_error("--" + flag + " is not an integer option");
  };
  flags.text = [&vm](const std::string& flag) -> std::optional<std::string> {
    if (!vm.count(flag)) return std::nullopt;
    return vm[flag].as<std::string>();
  };
  flags.on = [&vm](const std::string& flag) { return vm.count(flag) > 0 && vm[flag].as<bool>(); };
  return flags;
}

}  // namespace trainyard::app
