// trainyard simulate: one step from a task graph file, a plan file or a scheme's flags (setup_simulation, shared
// with validate), one collective as nccl-tests runs it, or a mini-batch of lengths (app/hotspa_command.cpp).
#include <iostream>
#include <map>
#include <optional>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/report.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/estimate.hpp"
#include "planner/plan.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/symmetry.hpp"
#include "sim/collective_bench.hpp"
#include "sim/graph_json.hpp"
#include "sim/report.hpp"
#include "stacks/collective_library.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

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

// --graph and --plan take the step as it is: no flag that would build one.
void refuse_step_flags(const po::variables_map& vm, const std::string& mode) {
  std::vector<std::string> step_flags{"model", "seq", "global-batch", "tokens-per-step"};  // --strategy's alone
  for (const auto& flag : valued_scheme_flags()) step_flags.push_back(flag);
  for (const auto& flag : step_flags) {
    if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "no scheme flags with " + mode, "--" + std::string(flag));
  }
}

SimulationSetup from_plan(const po::variables_map& vm) {
  if (vm.count("hw") || vm.count("nodes")) throw InputError("--hw/--nodes", "value", "none with --plan (the plan names its hardware)", "given");
  if (vm.count("stack")) throw InputError("--stack", "value", "none with --plan (the plan names its stack)", "given");
  SimulationSetup setup;
  setup.origin = vm["plan"].as<std::string>();
  LoadedPlan loaded = load_plan(setup.origin, memory_budget(vm));
  setup.plan_file = loaded.plan;
  {  // `full` refers to the loaded cluster, which a symmetry reduction replaces
    const planner::StepInputs full{loaded.model, *loaded.cluster, loaded.plan.workload,
                                   model::precision_policy(loaded.plan.precision, setup.origin + ": field 'precision'")};
    try {
      planner::check_plan(full, loaded.plan.spec);
    } catch (const InputError& e) {
      throw planner::plan_file_error(setup.origin, e);
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
  setup.ring.emplace();
  setup.graph = build_plan_step(loaded, loaded.plan.spec, setup.origin, &*setup.ring, memory_budget(vm));
  if (setup.ring->rings.empty()) setup.ring.reset();  // only ring-track builds rings
  const bool full_recompute = loaded.plan.spec.recomputed_layer_share(loaded.model.layers) == 1;
  setup.step = SimulationSetup::Step{loaded.model, setup.plan_file->workload, full_recompute,
                                     setup.plan_file->nodes * loaded.cluster->node.gpu_count(), loaded.plan.spec.scheme};
  setup.cluster = std::move(loaded.cluster);
  return setup;
}

SimulationSetup from_graph(const po::variables_map& vm) {
  for (const char* flag : {"sequence-parallel", "tp-comm-overlap", "distributed-optimizer", "no-symmetry"}) {
    if (vm[flag].as<bool>()) throw InputError(std::string("--") + flag, "value", "no scheme flags with --graph", "it");
  }
  SimulationSetup setup;
  setup.origin = vm["graph"].as<std::string>();
  sim::GraphDocument doc = sim::load_graph(setup.origin);
  std::string hw_name;
  if (vm.count("hw")) hw_name = vm["hw"].as<std::string>();
  else if (doc.hw) hw_name = *doc.hw;
  else throw InputError("--hw", "value", "a node profile (the graph file names none)", "nothing");
  const int nodes = vm.count("nodes") ? vm["nodes"].as<int>() : doc.nodes.value_or(1);
  setup.cluster.emplace(load_cluster(vm, hw_name, vm.count("hw") ? "--hw" : setup.origin + ": field 'hw'", nodes));
  setup.graph = std::move(doc.graph);
  sim::validate(setup.graph, setup.cluster->gpus(), setup.cluster->nodes, setup.origin);
  return setup;
}

// The flags `scheme` takes (its registry entry); any other scheme's flag is an error, not silently ignored.
void check_strategy_flags(const po::variables_map& vm, const planner::Scheme& scheme, const std::string& strategy) {
  auto takes = [&](const std::string& flag) { return std::find(scheme.flags.begin(), scheme.flags.end(), flag) != scheme.flags.end(); };
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
  for (const auto& [flag, expected] : scheme.required_flags) {
    if (!vm.count(flag)) throw InputError("--" + flag, "value", expected + " with --strategy " + strategy, "nothing");
  }
  for (const char* flag : {"model", "hw", "seq"}) {
    if (!vm.count(flag)) throw InputError(std::string("--") + flag, "value", "a value with --strategy", "nothing");
  }
}

SimulationSetup from_strategy(const po::variables_map& vm) {
  const std::string strategy = vm["strategy"].as<std::string>();
  const planner::Scheme* scheme = planner::find_scheme(strategy);
  if (scheme == nullptr) {
    throw InputError("--strategy", "value", planner::scheme_list() + " (HotSPa: --lengths with --static/--switch)", "\"" + strategy + "\"");
  }
  check_strategy_flags(vm, *scheme, strategy);
  SimulationSetup setup;
  setup.origin = "--strategy " + strategy;
  const model::ModelConfig model = model::load_model(vm["model"].as<std::string>(), "--model");
  setup.cluster.emplace(load_cluster(vm, vm["hw"].as<std::string>(), "--hw", vm.count("nodes") ? vm["nodes"].as<int>() : 1));
  std::optional<sim::Cluster>& cluster = setup.cluster;
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
  planner::require_within_budget(planner::estimate_plan(step_inputs, spec), memory_budget(vm), "the step graph of " + setup.origin,
                                 "fewer --nodes, a smaller --global-batch, a shorter --seq or a larger --chunk");
  setup.ring.emplace();
  setup.graph = planner::build_plan(step_inputs, spec, &*setup.ring);
  if (setup.ring->rings.empty()) setup.ring.reset();  // only ring-track builds rings
  sim::validate(setup.graph, cluster->gpus(), cluster->nodes, setup.origin);
  return setup;
}

}  // namespace

SimulationSetup setup_simulation(const po::variables_map& vm) {
  const bool from_graph_file = vm.count("graph") > 0, from_plan_file = vm.count("plan") > 0;
  const int modes = static_cast<int>(from_graph_file) + static_cast<int>(from_plan_file) + static_cast<int>(vm.count("strategy") > 0);
  if (modes != 1) {
    throw InputError("--graph/--plan/--strategy", "value", "exactly one of --graph FILE, --plan FILE or --strategy NAME",
                     modes == 0 ? "neither" : "more than one");
  }
  if (from_graph_file || from_plan_file) refuse_step_flags(vm, from_graph_file ? "--graph" : "--plan");
  SimulationSetup setup = from_plan_file ? from_plan(vm) : from_graph_file ? from_graph(vm) : from_strategy(vm);
  if (setup.estimate) return setup;
  if (vm.count("gpu-profile")) {  // the step as built, timed on another profile of the same GPU
    hw::NodeProfile node = setup.cluster->node;
    node.gpu = hw::load_gpu(vm["gpu-profile"].as<std::string>(), "--gpu-profile");
    sim::Cluster timed(std::move(node), setup.cluster->nodes, setup.cluster->stack, setup.cluster->devices_per_node);
    setup.cluster = std::move(timed);  // (emplace would read the old cluster's fields after destroying it)
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
                      {"algbw_GBps", b.algbw_GBps},
                      {"busbw_GBps", b.busbw_GBps},
                      // The old spelling, kept for one release (docs/taskgraph.md, "Renamed keys").
                      {"algbw_gbps", b.algbw_GBps},
                      {"busbw_gbps", b.busbw_GBps}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << sim::to_string(b.op) << " of " << format_bytes(static_cast<double>(b.bytes)) << " per GPU over " << b.ranks << " GPUs, "
            << sim::to_string(b.algorithm) << " (" << b.protocol << "): " << format_fixed(static_cast<double>(b.time_ns) * 1e-3, 1) << " us, algbw "
            << format_fixed(b.algbw_GBps, 1) << " GB/s, busbw " << format_fixed(b.busbw_GBps, 1) << " GB/s (nccl-tests' definitions)\n";
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

namespace {

// The flags that only some ways of simulating take, refused before anything is loaded.
void check_simulate_flags(const po::variables_map& vm) {
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
}

// What a simulated step adds beside its metrics: the MFU as the stack logs it, and the error bar of published runs
// like it.
struct StepNotes {
  std::optional<LoggedMfu> logged;
  std::optional<ErrorBar> bar;
};

void print_simulation_json(const SimulationSetup& setup, const sim::SimResult& result, const StepNotes& notes) {
  const sim::Cluster& cluster = *setup.cluster;
  Json out = sim::metrics_json(result, setup.graph, cluster);
  if (notes.logged) out["stack"]["as_logged"] = {{"mfu", notes.logged->mfu}, {"tflops_per_gpu", notes.logged->tflops_per_gpu}};
  if (notes.bar) out["error_bar"] = notes.bar->json();
  if (setup.replicas > 0) {
    out["symmetry"] = {{"unit", setup.symmetry_unit},
                       {"replicas", setup.replicas},
                       {"simulated_replicas", setup.simulated_replicas},
                       {"cp_ranks", setup.cp_ranks},
                       {"simulated_cp_ranks", setup.simulated_cp_ranks},
                       {"tp_ranks", setup.tp_ranks},
                       {"simulated_tp_ranks", setup.simulated_tp_ranks}};
  }
  if (setup.ring) {
    out["ring_order"] = setup.ring->rings;
    Json hops = Json::array();
    for (const auto& hop : setup.ring->hops) {  // "gbps": the old spelling, kept for one release (docs/taskgraph.md, "Renamed keys")
      hops.push_back({{"from", hop.from}, {"to", hop.to}, {"GBps", hop.GBps}, {"gbps", hop.GBps}});
    }
    out["ring_hops"] = hops;
  }
  std::cout << out.dump(2) << "\n";
}

void print_simulation_text(const SimulationSetup& setup, const sim::SimResult& result, const StepNotes& notes) {
  const sim::Cluster& cluster = *setup.cluster;
  if (setup.ring) std::cout << "ring order     " << setup.ring->describe() << "\n";
  if (setup.replicas > 0) std::cout << "symmetry       " << setup.symmetry_note << "\n";
  sim::print_metrics(std::cout, result, setup.graph, cluster);
  if (notes.logged) {
    const model::FlopConvention& c = cluster.stack.mfu_convention;
    std::cout << "\nas " << cluster.stack.name << " logs it: MFU " << format_fixed(100 * notes.logged->mfu, 1) << "%, "
              << format_fixed(notes.logged->tflops_per_gpu, 1) << " TFLOP/s per GPU (attention "
              << (c.causal_attention_halved ? "causal-halved" : "over the full square") << ", recompute "
              << (c.recompute_counted ? "counted" : "not counted")
              << (c.formula == model::FlopFormula::parameters ? "" : "; " + model::to_string(c.formula) + "'s formula") << ")\n";
  }
  if (notes.bar) std::cout << "error bar      " << notes.bar->text() << " (docs/validation.md, Error bars)\n";
}

// The step simulated and reported; exit 1 when it does not fit or cannot finish (not malformed input).
int simulate_step(const po::variables_map& vm, SimulationSetup& setup) {
  const sim::Cluster& cluster = *setup.cluster;
  const std::optional<TraceRequest> trace = trace_request(vm, cluster.gpus());
  setup.graph.finalize();
  sim::SimOptions sim_options;
  sim_options.cancel = &interrupt_flag();  // Ctrl-C: the engine stops, the command exits 130
  sim_options.collectives = setup.collectives ? &*setup.collectives : nullptr;
  // The memory and link samples feed only the trace's counters: without a trace they would be kept for nothing
  // (on large steps they hold more than the graph).
  sim_options.record_memory = trace.has_value();
  sim_options.record_links = trace.has_value();
  const sim::SimResult result = sim::simulate(setup.graph, cluster, sim_options);
  throw_if_interrupted();
  if (setup.plan_file && result.completed) {
    if (const std::string drift = planner::prediction_drift(*setup.plan_file, result, cluster.gpus()); !drift.empty()) {
      std::cerr << "warning: " << setup.origin << ": " << drift << "\n";
    }
  }
  if (trace) write_trace(*trace, result, setup.graph, cluster);
  StepNotes notes;
  if (setup.step && result.completed) {
    notes.logged = logged_mfu(*setup.step, result, cluster.stack.mfu_convention);
    notes.bar = step_error_bar(*setup.step, cluster);
  }
  if (vm["json"].as<bool>()) print_simulation_json(setup, result, notes);
  else print_simulation_text(setup, result, notes);
  if (result.oom) {
    std::cerr << "error: " << setup.origin << ": " << result.oom->describe(setup.graph) << "\n";
    return 1;
  }
  if (!result.stuck.empty()) {
    std::cerr << "error: " << setup.origin << ": " << result.stuck << "\n";
    return 1;
  }
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
  check_simulate_flags(vm);
  if (vm.count("collective")) return run_simulate_collective(vm);
  if (vm.count("bytes")) throw InputError("--bytes", "value", "only with --collective", "given");
  if (vm.count("lengths")) return run_simulate_lengths(vm);
  for (const char* flag : {"static", "switch", "groups", "max-len", "threads", "batch-sequences"}) {
    if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "only with --lengths", "--" + std::string(flag));
  }
  SimulationSetup setup = setup_simulation(vm);
  if (setup.estimate) return print_estimate(*setup.estimate, setup.origin, vm["json"].as<bool>());
  return simulate_step(vm, setup);
}

}  // namespace trainyard::app
