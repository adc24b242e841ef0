#include "app/commands.hpp"

#include <iostream>
#include <map>
#include <optional>
#include <set>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "app/report.hpp"
#include "common/atomic_file.hpp"
#include "common/catalog.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/memory_budget.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/estimate.hpp"
#include "planner/megatron.hpp"
#include "planner/plan.hpp"
#include "planner/ringtrack.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/symmetry.hpp"
#include "planner/zero.hpp"
#include "sim/collective_bench.hpp"
#include "sim/graph_json.hpp"
#include "sim/report.hpp"
#include "stacks/collective_library.hpp"

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

namespace {

// The schemes' on/off flags (po::bool_switch: always present in the variables map, so tested by value).
constexpr const char* kSchemeSwitches[] = {"sequence-parallel", "tp-comm-overlap", "distributed-optimizer", "zigzag"};

// Every scheme's flags that take a value (the registry's, less the switches), each once.
std::vector<std::string> valued_scheme_flags() {
  std::vector<std::string> out;
  for (const auto& name : planner::scheme_names()) {
    for (const auto& flag : planner::scheme_named(name).flags) {
      const bool is_switch = std::find(std::begin(kSchemeSwitches), std::end(kSchemeSwitches), flag) != std::end(kSchemeSwitches);
      if (!is_switch && std::find(out.begin(), out.end(), flag) == out.end()) out.push_back(flag);
    }
  }
  return out;
}

void list_gpus(bool as_json, Json& out) {
  TextTable table({"name", "bf16 TFLOP/s", "HBM", "HBM GB/s", "PCIe", "NVLink GB/s/dir", "description"},
                  {false, true, true, true, false, true, false});
  for (const auto& name : hw::builtin_gpu_names()) {
    const auto gpu = hw::load_gpu(name);
    if (as_json) {
      out["gpus"].push_back(gpu_json(gpu));
      continue;
    }
    table.add_row({gpu.name, format_fixed(gpu.peak_tflops(hw::Dtype::bf16), 1), format_bytes(gpu.hbm_bytes.value),
                   format_fixed(gpu.hbm_gbps.value, 0), "Gen" + format_number(gpu.pcie_generation.value) + " x" + format_number(gpu.pcie_lanes.value),
                   format_fixed(gpu.nvlink_gbps_per_direction.value, 0), gpu.description});
  }
  if (!as_json) {
    std::cout << "GPUs\n";
    table.print(std::cout);
  }
}

void list_nodes(bool as_json, Json& out) {
  TextTable table({"name", "GPUs", "host DRAM", "DRAM GB/s", "NVLink", "NIC GB/s/GPU", "description"},
                  {false, false, true, true, false, true, false});
  for (const auto& name : hw::builtin_node_names()) {
    const auto node = hw::load_node(name);
    if (as_json) {
      out["nodes"].push_back(node_json(node, 1));
      continue;
    }
    const bool nvlink = node.count(hw::VertexType::nvswitch) > 0;
    table.add_row({node.name, std::to_string(node.gpu_count()) + "x " + node.gpu.name, format_bytes(node.host_dram_bytes.value),
                   format_fixed(node.host_dram_gbps(), 1), nvlink ? "NVSwitch" : "none", format_fixed(node.nic_gbps_per_gpu(), 1), node.description});
  }
  if (!as_json) {
    std::cout << "nodes\n";
    table.print(std::cout);
  }
}

void list_models(bool as_json, Json& out) {
  TextTable table({"name", "params", "layers", "hidden", "heads/kv", "ffn", "vocab", "description"},
                  {false, true, true, true, true, true, true, false});
  for (const auto& name : model::builtin_model_names()) {
    const auto m = model::load_model(name);
    if (as_json) {
      out["models"].push_back(model_json(m, {4096, model::precision_policy("bf16-mixed"), nullptr, 1}));
      continue;
    }
    table.add_row({m.name, format_count(m.params()), std::to_string(m.layers), std::to_string(m.hidden),
                   std::to_string(m.heads) + "/" + std::to_string(m.kv_heads), std::to_string(m.ffn_hidden), std::to_string(m.vocab), m.description});
  }
  if (!as_json) {
    std::cout << "models\n";
    table.print(std::cout);
  }
}

void list_strategies(bool as_json, Json& out) {
  TextTable table({"name", "status", "description"});
  auto add = [&](const std::string& name, const std::string& status, const std::string& summary) {
    if (as_json) {
      out["strategies"].push_back({{"name", name}, {"summary", summary}, {"status", status}});
    } else {
      table.add_row({name, status, summary});
    }
  };
  for (const auto& name : planner::scheme_names()) add(name, "simulate --strategy, plan", planner::scheme_named(name).description);
  add("hotspa", "simulate --lengths ... --switch ..., plan --lengths ...", "HotSPa: per-length-group strategies with hot switching");
  if (!as_json) {
    std::cout << "strategies\n";
    table.print(std::cout);
  }
}

void list_precisions(bool as_json, Json& out) {
  TextTable table({"name", "bytes/param", "description"}, {false, true, false});
  for (const auto& p : model::precision_policies()) {
    if (as_json) {
      out["precisions"].push_back({{"name", p.name},
                                   {"description", p.description},
                                   {"weight_bytes", p.weight_bytes},
                                   {"grad_bytes", p.grad_bytes},
                                   {"master_bytes", p.master_bytes},
                                   {"optimizer_bytes", p.optimizer_bytes}});
    } else {
      table.add_row({p.name, format_number(p.bytes_per_param()), p.description});
    }
  }
  if (!as_json) {
    std::cout << "precision policies\n";
    table.print(std::cout);
  }
}

}  // namespace

int run_list(const std::vector<std::string>& args) {
  po::options_description options("list options");
  options.add_options()("what", po::value<std::string>()->default_value("all")->value_name("gpus|nodes|models|strategies|precisions|all"),
                        "what to list")("json", po::bool_switch(), "print JSON instead of tables");
  po::positional_options_description positional;
  positional.add("what", 1);
  po::variables_map vm;
  if (parse(args, "trainyard list [gpus|nodes|models|strategies|precisions] [--json]", options, positional, vm)) return 0;
  const std::string what = vm["what"].as<std::string>();
  const bool as_json = vm["json"].as<bool>();

  using Lister = void (*)(bool, Json&);
  const std::pair<const char*, Lister> listers[] = {
      {"gpus", list_gpus}, {"nodes", list_nodes}, {"models", list_models}, {"strategies", list_strategies}, {"precisions", list_precisions}};
  Json out = Json::object();
  bool matched = false;
  for (const auto& [name, lister] : listers) {
    if (what != "all" && what != name) continue;
    if (matched && !as_json) std::cout << "\n";
    matched = true;
    lister(as_json, out);
  }
  if (!matched) {
    throw InputError("list", "what", "one of gpus, nodes, models, strategies, precisions, all", "\"" + what + "\"");
  }
  if (as_json) std::cout << out.dump(2) << "\n";
  return 0;
}

int run_show(const std::vector<std::string>& args) {
  po::options_description options("show options");
  // clang-format off
  options.add_options()
      ("name", po::value<std::string>()->value_name("name|path"), "a built-in GPU, node or model name, custom:..., or a JSON file")
      ("hw", po::value<std::string>()->value_name("name|path"), "with a model: set its states against this node profile")
      ("nodes", po::value<int>()->default_value(1)->value_name("int"), "number of nodes (cluster of identical nodes)")
      ("seq", po::value<std::string>()->default_value("4K")->value_name("tokens"), "sequence length for attention FLOPs (e.g. 32K, 1M)")
      ("precision", po::value<std::string>()->default_value("bf16-mixed")->value_name("name"), "precision policy for model states (trainyard list precisions)")
      ("json", po::bool_switch(), "print JSON instead of text");
  // clang-format on
  po::positional_options_description positional;
  positional.add("name", 1);
  po::variables_map vm;
  if (parse(args, "trainyard show <name|path> [--hw NODE] [--nodes N] [--seq S] [--precision P] [--json]", options, positional, vm)) {
    return 0;
  }
  if (!vm.count("name")) throw InputError("show", "name", "a GPU, node or model name or a JSON path", "nothing");
  const std::string name = vm["name"].as<std::string>();
  const bool as_json = vm["json"].as<bool>();
  const int nodes = vm["nodes"].as<int>();
  check_node_count(nodes);

  // What kind of thing is it? A file says so in its "schema"; a name is looked up in each catalog.
  enum class Kind { gpu, node, model } kind;
  Json document;
  std::string origin;
  if (looks_like_path(name)) {
    document = trainyard::json::parse_file(name);
    origin = name;
    const std::string schema = document.is_object() && document.contains("schema") && document["schema"].is_string()
                                   ? document["schema"].get<std::string>()
                                   : "";
    if (schema == "trainyard.gpu.v1") kind = Kind::gpu;
    else if (schema == "trainyard.node.v1") kind = Kind::node;
    else if (schema == "trainyard.model.v1") kind = Kind::model;
    else
      throw InputError(name, "schema", "\"trainyard.gpu.v1\", \"trainyard.node.v1\" or \"trainyard.model.v1\"",
                       schema.empty() ? "nothing" : "\"" + schema + "\"");
  } else if (hw::is_builtin_gpu(name)) {
    kind = Kind::gpu;
  } else if (hw::is_builtin_node(name)) {
    kind = Kind::node;
  } else if (model::is_builtin_model(name) || name.starts_with("custom:")) {
    kind = Kind::model;
  } else {
    std::string known;
    for (const auto& list : {hw::builtin_gpu_names(), hw::builtin_node_names(), model::builtin_model_names()}) {
      for (const auto& n : list) known += (known.empty() ? "" : ", ") + n;
    }
    throw InputError("show: unknown name \"" + name + "\": expected a built-in GPU, node or model (" + known +
                     "), custom:..., or a path to a .json file");
  }
  if (kind != Kind::model && vm.count("hw")) {
    throw InputError("--hw", "value", "--hw only together with a model (show MODEL --hw NODE)",
                     "--hw with a " + std::string(kind == Kind::gpu ? "GPU" : "node") + " profile");
  }
  if (kind != Kind::node && kind != Kind::model && nodes != 1) {
    throw InputError("--nodes", "value", "--nodes only with a node profile or a model with --hw", std::to_string(nodes));
  }

  if (kind == Kind::gpu) {
    const auto gpu = origin.empty() ? hw::load_gpu(name) : hw::gpu_from_document(document, origin);
    if (as_json) std::cout << gpu_json(gpu).dump(2) << "\n";
    else print_gpu(std::cout, gpu);
    return 0;
  }
  if (kind == Kind::node) {
    const auto node = origin.empty() ? hw::load_node(name) : hw::node_from_document(document, origin);
    check_node_count(nodes, node);
    if (as_json) std::cout << node_json(node, nodes).dump(2) << "\n";
    else print_node(std::cout, node, nodes);
    return 0;
  }

  std::vector<std::string> defaults;
  const auto m = origin.empty() ? model::load_model(name, "show", &defaults) : model::parse_model(document, origin);
  ModelReportOptions report;
  report.seq_len = parse_token_count(vm["seq"].as<std::string>(), "--seq");
  report.precision = model::precision_policy(vm["precision"].as<std::string>());
  report.nodes = nodes;
  std::optional<hw::NodeProfile> node;
  if (vm.count("hw")) {
    node = hw::load_node(vm["hw"].as<std::string>(), "--hw");
    check_node_count(nodes, *node);
    report.hw = &*node;
  } else if (nodes != 1) {
    throw InputError("--nodes", "value", "--nodes with a model only together with --hw", std::to_string(nodes));
  }
  if (as_json) {
    Json out = model_json(m, report);
    if (!defaults.empty()) out["defaults_used"] = defaults;
    std::cout << out.dump(2) << "\n";
  } else {
    if (!defaults.empty()) {
      std::cout << "custom model: defaults used for";
      for (const auto& d : defaults) std::cout << " " << d;
      std::cout << "\n\n";
    }
    print_model(std::cout, m, report);
  }
  return 0;
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

namespace {

// Megatron's identical data-parallel replicas are simulated by one (two of a node each), its context-parallel
// ranks (the ZeRO family: identical nodes) two at a time, and a node-filling TP group by one rank
// (planner/symmetry.hpp) unless --no-symmetry. On a reduction `cluster` becomes the smaller one (so `inputs`,
// which refers to the old one, must not be used after) and the reduced step is returned; the note says what was
// done or why not.
std::optional<planner::ReducedStep> reduce_step(const po::variables_map& vm, const planner::StepInputs& inputs, const planner::PlanSpec& spec,
                                                std::optional<sim::Cluster>& cluster, SimulationSetup& setup) {
  if (vm.count("no-symmetry") && vm["no-symmetry"].as<bool>()) {
    setup.symmetry_note = "every replica simulated (--no-symmetry)";
    return std::nullopt;
  }
  std::string why_not;
  auto reduced = planner::reduce_by_symmetry(inputs, spec, &why_not);
  if (!reduced) {
    setup.symmetry_note = "every replica simulated: " + why_not;
    return std::nullopt;
  }
  hw::NodeProfile node = cluster->node;
  stacks::StackProfile stack = cluster->stack;
  cluster.emplace(std::move(node), reduced->nodes, std::move(stack), reduced->devices_per_node);
  setup.symmetry_unit = reduced->unit;
  setup.replicas = reduced->replicas;
  setup.simulated_replicas = reduced->simulated_replicas;
  setup.cp_ranks = reduced->cp_ranks;
  setup.simulated_cp_ranks = reduced->simulated_cp_ranks;
  setup.tp_ranks = reduced->tp_ranks;
  setup.simulated_tp_ranks = reduced->simulated_tp_ranks;
  setup.symmetry_note = std::to_string(setup.simulated_replicas) + " of " + std::to_string(setup.replicas) + " identical " + reduced->unit;
  if (setup.cp_ranks > setup.simulated_cp_ranks) {
    setup.symmetry_note += " and " + std::to_string(setup.simulated_cp_ranks) + " of " + std::to_string(setup.cp_ranks) + " context-parallel ranks";
  }
  if (setup.tp_ranks > setup.simulated_tp_ranks) {
    setup.symmetry_note += ", " + std::to_string(setup.simulated_tp_ranks) + " of each group's " + std::to_string(setup.tp_ranks) +
                           " tensor-parallel ranks";
  }
  setup.symmetry_note +=
      " simulated, their collectives as the whole rings (figures are per GPU of the whole step; --no-symmetry "
      "simulates them all)";
  return reduced;
}

}  // namespace

SimulationSetup setup_simulation(const po::variables_map& vm) {
  const bool from_graph = vm.count("graph") > 0, from_plan = vm.count("plan") > 0;
  const int modes = static_cast<int>(from_graph) + static_cast<int>(from_plan) + static_cast<int>(vm.count("strategy") > 0);
  if (modes != 1) {
    throw InputError("--graph/--plan/--strategy", "value", "exactly one of --graph FILE, --plan FILE or --strategy NAME",
                     modes == 0 ? "neither" : "more than one");
  }
  std::vector<std::string> step_flags{"model", "seq", "global-batch", "tokens-per-step"};  // --strategy's alone
  for (const auto& flag : valued_scheme_flags()) step_flags.push_back(flag);
  SimulationSetup setup;
  std::optional<sim::Cluster>& cluster = setup.cluster;
  sim::TaskGraph& graph = setup.graph;
  std::string& origin = setup.origin;
  std::optional<planner::RingTrackPlan>& ring = setup.ring;
  std::optional<planner::PlanFile>& plan_file = setup.plan_file;
  if (from_graph || from_plan) {
    const std::string mode = from_graph ? "--graph" : "--plan";
    for (const auto& flag : step_flags) {
      if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "no scheme flags with " + mode, "--" + std::string(flag));
    }
  }
  if (from_plan) {
    if (vm.count("hw") || vm.count("nodes")) throw InputError("--hw/--nodes", "value", "none with --plan (the plan names its hardware)", "given");
    if (vm.count("stack")) throw InputError("--stack", "value", "none with --plan (the plan names its stack)", "given");
    origin = vm["plan"].as<std::string>();
    LoadedPlan loaded = load_plan(origin, memory_budget(vm));
    plan_file = loaded.plan;
    {
      const planner::StepInputs full{loaded.model, *loaded.cluster, loaded.plan.workload,
                                     model::precision_policy(loaded.plan.precision, origin + ": field 'precision'")};
      try {
        planner::check_plan(full, loaded.plan.spec);
      } catch (const InputError& e) {
        throw planner::plan_file_error(origin, e);
      }
      if (vm["estimate"].as<bool>()) {
        setup.estimate = planner::analytic_estimate(full, loaded.plan.spec, 0);
        setup.cluster = std::move(loaded.cluster);
        return setup;
      }
      if (auto reduced = reduce_step(vm, full, loaded.plan.spec, loaded.cluster, setup)) {
        loaded.plan.spec = reduced->spec;
        loaded.plan.workload = reduced->workload;
      }
    }
    ring.emplace();
    graph = build_plan_step(loaded, loaded.plan.spec, origin, &*ring, memory_budget(vm));
    if (ring->rings.empty()) ring.reset();  // only ring-track builds rings
    const bool full = loaded.plan.spec.recomputed_layer_share(loaded.model.layers) == 1;
    setup.step = SimulationSetup::Step{loaded.model, plan_file->workload, full, plan_file->nodes * loaded.cluster->node.gpu_count(),
                                       loaded.plan.spec.scheme};
    cluster = std::move(loaded.cluster);
  } else if (from_graph) {
    for (const char* flag : {"sequence-parallel", "tp-comm-overlap", "distributed-optimizer", "no-symmetry"}) {
      if (vm[flag].as<bool>()) throw InputError(std::string("--") + flag, "value", "no scheme flags with --graph", "it");
    }
    origin = vm["graph"].as<std::string>();
    sim::GraphDocument doc = sim::load_graph(origin);
    std::string hw_name;
    if (vm.count("hw")) hw_name = vm["hw"].as<std::string>();
    else if (doc.hw) hw_name = *doc.hw;
    else throw InputError("--hw", "value", "a node profile (the graph file names none)", "nothing");
    const int nodes = vm.count("nodes") ? vm["nodes"].as<int>() : doc.nodes.value_or(1);
    hw::NodeProfile node = hw::load_node(hw_name, vm.count("hw") ? "--hw" : origin + ": field 'hw'");
    check_node_count(nodes, node);
    planner::require_cluster_within_budget(node, nodes, memory_budget(vm));
    cluster.emplace(std::move(node), nodes, stack_from_flags(vm));
    graph = std::move(doc.graph);
    sim::validate(graph, cluster->gpus(), cluster->nodes, origin);
  } else {
    const std::string strategy = vm["strategy"].as<std::string>();
    // The flags each scheme takes (its registry entry); any other scheme flag is an error, not silently ignored.
    const planner::Scheme* scheme = planner::find_scheme(strategy);
    if (scheme == nullptr) {
      throw InputError("--strategy", "value", planner::scheme_list() + " (HotSPa: --lengths with --static/--switch)", "\"" + strategy + "\"");
    }
    auto takes = [&](const std::string& flag) { return std::find(scheme->flags.begin(), scheme->flags.end(), flag) != scheme->flags.end(); };
    auto foreign = [&](const std::string& flag) {
      std::string owners;
      for (const auto& name : planner::scheme_names()) {
        const auto& flags = planner::scheme_named(name).flags;
        if (std::find(flags.begin(), flags.end(), flag) != flags.end()) owners += (owners.empty() ? "" : ", ") + name;
      }
      throw InputError("--" + flag, "value", "no --" + flag + " with --strategy " + strategy + " (it is a flag of " + owners + ")", "--" + flag);
    };
    for (const auto& flag : valued_scheme_flags()) {
      if (vm.count(flag) && !takes(flag)) foreign(flag);
    }
    for (const char* flag : kSchemeSwitches) {
      if (vm[flag].as<bool>() && !takes(flag)) foreign(flag);
    }
    for (const auto& [flag, expected] : scheme->required_flags) {
      if (!vm.count(flag)) throw InputError("--" + flag, "value", expected + " with --strategy " + strategy, "nothing");
    }
    for (const char* flag : {"model", "hw", "seq"}) {
      if (!vm.count(flag)) throw InputError(std::string("--") + flag, "value", "a value with --strategy", "nothing");
    }
    origin = "--strategy " + strategy;
    const model::ModelConfig model = model::load_model(vm["model"].as<std::string>(), "--model");
    const int nodes = vm.count("nodes") ? vm["nodes"].as<int>() : 1;
    hw::NodeProfile node = hw::load_node(vm["hw"].as<std::string>(), "--hw");
    check_node_count(nodes, node);
    planner::require_cluster_within_budget(node, nodes, memory_budget(vm));
    cluster.emplace(std::move(node), nodes, stack_from_flags(vm));
    const planner::Workload workload = workload_from_flags(vm);
    const planner::FlagValues flags = flag_values(vm);
    const planner::Recompute recompute = planner::recompute_flag(flags);
    const planner::StepInputs inputs{model, *cluster, workload, model::precision_policy(vm["precision"].as<std::string>())};
    setup.step = SimulationSetup::Step{model, workload, recompute == planner::Recompute::full, cluster->gpus(), strategy};
    planner::PlanSpec spec = scheme->from_flags(flags, *cluster);
    spec.scheme = strategy;
    planner::check_plan(inputs, spec);
    if (vm["estimate"].as<bool>()) {
      setup.estimate = planner::analytic_estimate(inputs, spec, 0);  // simulate's own test: out of HBM or not
      return setup;
    }
    planner::Workload simulated = workload;
    if (auto reduced = reduce_step(vm, inputs, spec, cluster, setup)) {  // `inputs` refers to the old cluster from here
      spec = reduced->spec;
      simulated = reduced->workload;
    }
    const planner::StepInputs step_inputs{model, *cluster, simulated, inputs.precision};
    planner::require_within_budget(planner::estimate_plan(step_inputs, spec), memory_budget(vm), "the step graph of " + origin,
                                   "fewer --nodes, a smaller --global-batch, a shorter --seq or a larger --chunk");
    ring.emplace();
    graph = planner::build_plan(step_inputs, spec, &*ring);
    if (ring->rings.empty()) ring.reset();  // only ring-track builds rings
    sim::validate(graph, cluster->gpus(), cluster->nodes, origin);
  }
  if (vm.count("gpu-profile")) {  // the step as built, timed on another profile of the same GPU
    hw::NodeProfile node = cluster->node;
    node.gpu = hw::load_gpu(vm["gpu-profile"].as<std::string>(), "--gpu-profile");
    sim::Cluster timed(std::move(node), cluster->nodes, cluster->stack, cluster->devices_per_node);
    cluster = std::move(timed);  // (emplace would read the old cluster's fields after destroying it)
  }
  if (vm.count("collectives")) setup.collectives = stacks::load_collective_library(vm["collectives"].as<std::string>(), "--collectives");
  return setup;
}

namespace {

sim::CollectiveOp collective_op_from_flag(const std::string& text) {
  static const std::map<std::string, sim::CollectiveOp> ops = {{"all-reduce", sim::CollectiveOp::all_reduce},
                                                               {"all-gather", sim::CollectiveOp::all_gather},
                                                               {"reduce-scatter", sim::CollectiveOp::reduce_scatter},
                                                               {"all-to-all", sim::CollectiveOp::all_to_all},
                                                               {"broadcast", sim::CollectiveOp::broadcast}};
  const auto it = ops.find(text);
  if (it == ops.end()) {
    throw InputError("--collective", "value", "all-reduce, all-gather, reduce-scatter, all-to-all or broadcast", "\"" + text + "\"");
  }
  return it->second;
}

sim::Algorithm collective_algorithm_from_flag(const std::string& text) {
  if (text == "ring") return sim::Algorithm::ring;
  if (text == "tree") return sim::Algorithm::tree;
  if (text == "direct") return sim::Algorithm::direct;
  throw InputError("--algorithm", "value", "ring, tree or direct", "\"" + text + "\"");
}

}  // namespace

sim::CollectiveBenchmark collective_from_flags(const po::variables_map& vm) {
  for (const char* flag : {"graph", "plan", "strategy", "model", "seq", "global-batch", "tokens-per-step", "lengths", "trace", "batch-sequences"}) {
    if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "none with --collective", "given");
  }
  if (!vm.count("hw")) throw InputError("--hw", "value", "a node profile with --collective", "nothing");
  if (!vm.count("bytes")) throw InputError("--bytes", "value", "a size with --collective (e.g. 1G)", "nothing");
  const int nodes = vm.count("nodes") ? vm["nodes"].as<int>() : 1;
  hw::NodeProfile node = hw::load_node(vm["hw"].as<std::string>(), "--hw");
  check_node_count(nodes, node);
  planner::require_cluster_within_budget(node, nodes, memory_budget(vm));
  const sim::Cluster cluster(std::move(node), nodes);
  return sim::benchmark_collective(cluster, collective_op_from_flag(vm["collective"].as<std::string>()),
                                   collective_algorithm_from_flag(vm["algorithm"].as<std::string>()),
                                   parse_memory_size(vm["bytes"].as<std::string>(), "--bytes"));
}

namespace {

int run_simulate_collective(const po::variables_map& vm) {
  const sim::CollectiveBenchmark b = collective_from_flags(vm);
  if (vm["json"].as<bool>()) {
    const Json out = {{"collective", std::string(sim::to_string(b.op))},
                      {"algorithm", std::string(sim::to_string(b.algorithm))},
                      {"protocol", b.protocol},
                      {"bytes", b.bytes},
                      {"ranks", b.ranks},
                      {"time_ns", b.time_ns},
                      {"algbw_gbps", b.algbw_gbps},
                      {"busbw_gbps", b.busbw_gbps}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << sim::to_string(b.op) << " of " << format_bytes(static_cast<double>(b.bytes)) << " per GPU over " << b.ranks << " GPUs, "
            << sim::to_string(b.algorithm) << " (" << b.protocol << "): " << format_fixed(static_cast<double>(b.time_ns) * 1e-3, 1) << " us, algbw "
            << format_fixed(b.algbw_gbps, 1) << " GB/s, busbw " << format_fixed(b.busbw_gbps, 1) << " GB/s (nccl-tests' definitions)\n";
  return 0;
}

}  // namespace

po::options_description simulate_options() {
  po::options_description options("simulate options (a task graph file, or a strategy built for a model)");
  // clang-format off
  options.add_options()
      ("graph", po::value<std::string>()->value_name("path"), "task graph JSON file (docs/taskgraph.md)")
      ("plan", po::value<std::string>()->value_name("path"), "plan file written by 'trainyard plan --out' (docs/planner.md)")
      ("strategy", po::value<std::string>()->value_name("name"), ("build the step with this scheme: " + planner::scheme_list()).c_str())
      ("model", po::value<std::string>()->value_name("name|path|custom:..."), "model, with --strategy")
      ("hw", po::value<std::string>()->value_name("name|path"), "node profile (with --graph, default: the graph's \"hw\")")
      ("nodes", po::value<int>()->value_name("int"), "number of nodes (default: the graph's \"nodes\", else 1)")
      ("seq", po::value<std::string>()->value_name("tokens"), "sequence length, with --strategy (e.g. 32K, 1M)")
      ("global-batch", po::value<std::int64_t>()->value_name("int"), "sequences per optimizer step")
      ("tokens-per-step", po::value<std::string>()->value_name("tokens"), "tokens per optimizer step (instead of --global-batch)")
      ("precision", po::value<std::string>()->default_value("bf16-mixed")->value_name("name"), "precision policy of the model states")
      ("stack", po::value<std::string>()->value_name("name|path"), stacks::kStackFlagHelp)
      ("tp", po::value<int>()->value_name("int"), "megatron: tensor-parallel degree (default 1)")
      ("pp", po::value<int>()->value_name("int"), "megatron: pipeline stages (default 1)")
      ("dp", po::value<int>()->value_name("int"), "megatron: data-parallel degree (default: GPUs / (tp * pp))")
      ("vpp", po::value<int>()->value_name("int"), "megatron: virtual stages per pipeline rank (default 1)")
      ("micro-batch", po::value<std::int64_t>()->value_name("int"), "sequences per micro-batch (default 1)")
      ("sequence-parallel", po::bool_switch(), "megatron: sequence parallelism with TP")
      ("tp-comm-overlap", po::bool_switch(), "megatron: TP all-gathers and reduce-scatters overlap their GEMMs (needs --sequence-parallel)")
      ("distributed-optimizer", po::bool_switch(), "megatron: master weights and Adam moments split across the data-parallel ranks")
      ("recompute", po::value<std::string>()->value_name("none|selective|full"), "activation recomputation (default none; full = activation checkpointing; zero family: selective = every other layer, torchtitan's selective layer AC)")
      ("zero-stage", po::value<int>()->value_name("0..3"), "zero, ulysses: ZeRO stage (default 0)")
      ("offload", po::value<std::string>()->value_name("list"), "comma list of optimizer, grads, params, acts (megatron: acts only)")
      ("sp", po::value<int>()->value_name("int"), "ulysses: sequence-parallel degree (required)")
      ("cp", po::value<int>()->value_name("int"), "ring-attention (required), megatron (default 1): context-parallel degree")
      ("no-symmetry", po::bool_switch(), "simulate every replica (default: one of Megatron's identical data-parallel replicas (two of one node each), two of its CP ranks and one TP rank of a node-filling group, or two units of identical nodes of the ZeRO family; planner/symmetry.hpp)")
      ("cp-comm", po::value<std::string>()->value_name("p2p|all_gather|a2a|a2a+p2p"), "megatron: how CP ranks share attention's inputs: K/V ring passes (p2p, default), K/V all-gathered, all-to-all to a head split (a2a), or both in two levels (a2a+p2p, hierarchical CP: give --cp-a2a)")
      ("cp-a2a", po::value<int>()->value_name("int"), "megatron, --cp-comm a2a+p2p: ranks in each all-to-all group, consecutive cp ranks (Megatron's --hierarchical-context-parallel-sizes A cp/A)")
      ("first-stage-layers", po::value<int>()->value_name("int"), "megatron: layers on the first pipeline stage (default: an even split)")
      ("last-stage-layers", po::value<int>()->value_name("int"), "megatron: layers on the last pipeline stage (default: an even split)")
      ("zigzag", po::bool_switch(), "ring-attention: zigzag causal load balancing")
      ("chunk", po::value<std::string>()->value_name("tokens"), "fpdt: attention chunk in global tokens (default 64K); ringtrack: chunk length (default 16K)")
      ("ring", po::value<int>()->value_name("int"), "ringtrack: GPUs per ring (default: all); the rest are data-parallel replicas")
      ("block", po::value<int>()->value_name("int"), "ringtrack: consecutive layers per ring position (default 1: fully cyclic)")
      ("prefetch", po::value<int>()->value_name("int"), "ringtrack: HBM buffers in flight per stream from DRAM (default 2)")
      ("kv", po::value<std::string>()->value_name("hbm|dram"), "ringtrack: where K/V of earlier chunks and dK/dV live (default dram)")
      ("acts", po::value<std::string>()->value_name("hbm|dram|recompute"), "ringtrack: activations kept for backward (default dram)")
      ("weights", po::value<std::string>()->value_name("resident|stream"), "ringtrack: layer weights in HBM, or streamed from DRAM per visit (default resident)")
      ("states", po::value<std::string>()->value_name("hbm|dram"), "ringtrack: gradients and optimizer state; dram = optimizer on the CPU (default hbm)")
      ("ring-order", po::value<std::string>()->value_name("list"), "ringtrack: ring positions in order, e.g. 0,2,1,3 (default: chosen from the topology)")
      ("trace", po::value<std::string>()->value_name("path"), "write a Chrome trace JSON (open in Perfetto)")
      ("json", po::bool_switch(), "print metrics as JSON")
      ("estimate", po::bool_switch(), "with --strategy or --plan: the analytic estimate (closed form, nothing built or simulated; labelled as an estimate) instead of the simulation")
      ("threads", po::value<int>()->value_name("int"), "with --lengths: simulation threads (0: all cores)")
      ("collective", po::value<std::string>()->value_name("op"), "one collective over all GPUs of --hw x --nodes, as nccl-tests runs it: all-reduce, all-gather, reduce-scatter, all-to-all or broadcast")
      ("bytes", po::value<std::string>()->value_name("size"), "with --collective: the buffer per GPU (nccl-tests' size), e.g. 1M, 8G")
      ("algorithm", po::value<std::string>()->default_value("ring")->value_name("ring|tree|direct"), "with --collective: how it runs")
      ("gpu-profile", po::value<std::string>()->value_name("name|path"),
       "predict on this GPU profile instead of the node's (e.g. one trainyard calibrate wrote, from a sweep or --from-trace)")
      ("collectives", po::value<std::string>()->value_name("name|path"),
       "the collective library's costs (stacks/collectives/, or one calibrate wrote; default: NCCL's)");
  // clang-format on
  add_lengths_options(options, false);
  add_memory_budget_option(options);
  add_trace_options(options);
  return options;
}

namespace {

// --estimate: the analytic figures, each marked as an estimate on screen and `provisional` in JSON.
int print_estimate(const planner::StepEstimate& e, const std::string& origin, bool as_json) {
  if (as_json) {
    const Json out = {{"estimate",
                       {{"provisional", true},
                        {"method", "analytic (planner/analytic.hpp): closed form, not simulated"},
                        {"origin", origin},
                        {"step_s", e.step_s},
                        {"mfu", e.mfu},
                        {"peak_hbm_bytes", e.hbm_bytes},
                        {"peak_dram_bytes", e.dram_bytes},
                        {"fits", e.fits}}}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "ESTIMATE of " << origin << " (analytic, not simulated; without --estimate the simulator's figures)\n"
            << "step time      ~" << format_fixed(e.step_s * 1e3, 1) << " ms (estimate)\n"
            << "MFU            ~" << format_fixed(100 * e.mfu, 1) << "% (estimate)\n"
            << "peak HBM       ~" << format_bytes(e.hbm_bytes) << " per GPU, tensors (estimate)\n"
            << "peak DRAM      ~" << format_bytes(e.dram_bytes) << " per node (estimate)\n"
            << "fits           " << (e.fits ? "yes" : "no") << " (estimate)\n";
  return 0;
}

}  // namespace

int run_simulate(const std::vector<std::string>& args) {
  po::options_description options = simulate_options();
  po::positional_options_description positional;
  po::variables_map vm;
  if (parse(args,
            "trainyard simulate --graph FILE [--hw NODE] [--nodes N] [--trace FILE] [--json]\n"
            "       trainyard simulate --plan FILE [--trace FILE] [--json]\n"
            "       trainyard simulate --strategy NAME --model M --hw NODE [--nodes N] --seq S\n"
            "                          (--global-batch B | --tokens-per-step T) [scheme flags] [--trace FILE] [--json]\n"
            "       trainyard simulate --lengths dist:NAME|FILE --model M --hw NODE [--nodes N] (--tokens-per-step T | --batch-sequences N)\n"
            "                          [--batching packing|padding|ffd-padded]\n"
            "                          [--static SCHEME:k=v,...] [--switch UPPER=SCHEME:k=v,...;...] [--groups LIST] [--json]\n"
            "       trainyard simulate --collective OP --bytes SIZE --hw NODE [--nodes N] [--algorithm ring|tree|direct] [--json]",
            options, positional, vm)) {
    return 0;
  }
  if (vm.count("lengths") && vm.count("trace")) {
    throw InputError("--trace", "value", "none with --lengths (no trace of a hot-switched mini-batch yet)", "given");
  }
  check_output_flags(vm, {"trace"});  // before the simulation, so a bad path does not cost its result
  if (vm.count("collective") || vm.count("lengths")) {
    for (const char* flag : {"gpu-profile", "collectives"}) {
      if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "only with --graph, --plan or --strategy", "given");
    }
  }
  if (vm["estimate"].as<bool>()) {
    if (!vm.count("strategy") && !vm.count("plan")) throw InputError("--estimate", "value", "only with --strategy or --plan", "given");
    for (const char* flag : {"trace", "gpu-profile", "collectives"}) {
      if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "none with --estimate (nothing is simulated)", "given");
    }
  }
  if (vm.count("collective")) return run_simulate_collective(vm);
  if (vm.count("bytes")) throw InputError("--bytes", "value", "only with --collective", "given");
  if (vm.count("lengths")) return run_simulate_lengths(vm);
  for (const char* flag : {"static", "switch", "groups", "max-len", "threads", "batch-sequences"}) {
    if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "only with --lengths", "--" + std::string(flag));
  }
  SimulationSetup setup = setup_simulation(vm);
  if (setup.estimate) return print_estimate(*setup.estimate, setup.origin, vm["json"].as<bool>());
  const std::optional<sim::Cluster>& cluster = setup.cluster;
  sim::TaskGraph& graph = setup.graph;
  const std::string& origin = setup.origin;
  const std::optional<planner::RingTrackPlan>& ring = setup.ring;
  const std::optional<planner::PlanFile>& plan_file = setup.plan_file;
  const std::optional<TraceRequest> trace = trace_request(vm, cluster->gpus());
  graph.finalize();
  sim::SimOptions sim_options;
  sim_options.cancel = &interrupt_flag();  // Ctrl-C: the engine stops, the command exits 130
  sim_options.collectives = setup.collectives ? &*setup.collectives : nullptr;
  // The memory and link samples feed only the trace's counters: without a trace they would be kept for nothing
  // (on large steps they hold more than the graph).
  sim_options.record_memory = trace.has_value();
  sim_options.record_links = trace.has_value();
  const sim::SimResult result = sim::simulate(graph, *cluster, sim_options);
  throw_if_interrupted();
  if (plan_file && result.completed) {
    if (const std::string drift = planner::prediction_drift(*plan_file, result, cluster->gpus()); !drift.empty()) {
      std::cerr << "warning: " << origin << ": " << drift << "\n";
    }
  }
  if (trace) write_trace(*trace, result, graph, *cluster);
  std::optional<LoggedMfu> logged;
  std::optional<ErrorBar> bar;  // how far published runs like this one were off
  if (setup.step && result.completed) {
    logged = logged_mfu(*setup.step, result, cluster->stack.mfu_convention);
    bar = step_error_bar(*setup.step, *cluster);
  }
  if (vm["json"].as<bool>()) {
    Json out = sim::metrics_json(result, graph, *cluster);
    if (logged) out["stack"]["as_logged"] = {{"mfu", logged->mfu}, {"tflops_per_gpu", logged->tflops_per_gpu}};
    if (bar) out["error_bar"] = bar->json();
    if (setup.replicas > 0) {
      out["symmetry"] = {{"unit", setup.symmetry_unit},
                         {"replicas", setup.replicas},
                         {"simulated_replicas", setup.simulated_replicas},
                         {"cp_ranks", setup.cp_ranks},
                         {"simulated_cp_ranks", setup.simulated_cp_ranks},
                         {"tp_ranks", setup.tp_ranks},
                         {"simulated_tp_ranks", setup.simulated_tp_ranks}};
    }
    if (ring) {
      out["ring_order"] = ring->rings;
      Json hops = Json::array();
      for (const auto& hop : ring->hops) hops.push_back({{"from", hop.from}, {"to", hop.to}, {"gbps", hop.gbps}});
      out["ring_hops"] = hops;
    }
    std::cout << out.dump(2) << "\n";
  } else {
    if (ring) std::cout << "ring order     " << ring->describe() << "\n";
    if (setup.replicas > 0) std::cout << "symmetry       " << setup.symmetry_note << "\n";
    sim::print_metrics(std::cout, result, graph, *cluster);
    if (logged) {
      const model::FlopConvention& c = cluster->stack.mfu_convention;
      std::cout << "\nas " << cluster->stack.name << " logs it: MFU " << format_fixed(100 * logged->mfu, 1) << "%, "
                << format_fixed(logged->tflops_per_gpu, 1) << " TFLOP/s per GPU (attention "
                << (c.causal_attention_halved ? "causal-halved" : "over the full square") << ", recompute "
                << (c.recompute_counted ? "counted" : "not counted")
                << (c.formula == model::FlopFormula::parameters ? "" : "; " + model::to_string(c.formula) + "'s formula") << ")\n";
    }
    if (bar) std::cout << "error bar      " << bar->text() << " (docs/validation.md, Error bars)\n";
  }
  // A plan that does not fit, or cannot finish, is not malformed input: exit 1 with the report.
  if (result.oom) {
    std::cerr << "error: " << origin << ": " << result.oom->describe(graph) << "\n";
    return 1;
  }
  if (!result.stuck.empty()) {
    std::cerr << "error: " << origin << ": " << result.stuck << "\n";
    return 1;
  }
  return 0;
}

}  // namespace trainyard::app
