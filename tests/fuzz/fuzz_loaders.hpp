#pragma once
// What each fuzz target feeds its input to, shared with tests/test_fuzz_regressions.cpp (which loads the inputs
// the fuzzers found and expects a clean InputError). Each function throws InputError for bad input and
// nothing else; loaders that take a path get the text through a temporary file.
#include <iostream>
#include <string>
#include <string_view>

#include <boost/program_options.hpp>

#include "app/commands.hpp"
#include "common/catalog.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "hwprofiles/topology.hpp"
#include "models/catalog.hpp"
#include "planner/hotspa.hpp"
#include "planner/lengths.hpp"
#include "planner/plan.hpp"
#include "sim/cluster.hpp"
#include "sim/compare.hpp"
#include "sim/graph_json.hpp"
#include "tests/fuzz/fuzz_support.hpp"
#include "traces/engine_compare.hpp"
#include "traces/kineto.hpp"
#include "traces/nsys.hpp"

namespace trainyard::fuzz {

// GPU profile (hwprofiles/gpus/*.json, show <file>): JSON text -> GpuProfile.
inline void load_gpu_profile(std::string_view text) {
  const hw::GpuProfile gpu = hw::gpu_from_document(json::parse(text, "fuzz-gpu.json"), "fuzz-gpu.json");
  (void)gpu.peak_tflops(hw::Dtype::bf16);
}

// Node profile -> topology graph; the node's "gpu" resolves to built-ins only (no files of this machine).
inline hw::GpuProfile builtin_gpu(const std::string& name, const std::string& origin) {
  if (!hw::is_builtin_gpu(name)) throw InputError(origin, "gpu", "a built-in GPU (fuzzing)", name);
  return hw::load_gpu(name, origin);
}
inline void load_node_profile(std::string_view text) {
  const hw::NodeProfile node = hw::parse_node(json::parse(text, "fuzz-node.json"), "fuzz-node.json", &builtin_gpu);
  const hw::Topology topology(node, node.count(hw::VertexType::nic) > 0 ? 2 : 1);
  (void)topology.gpu_count();
  (void)node.nic_GBps_per_gpu();
}

// Model file (models/*.json, --model path.json) with the derived figures `show` prints.
inline void load_model_file(std::string_view text) {
  const model::ModelConfig m = model::parse_model(json::parse(text, "fuzz-model.json"), "fuzz-model.json");
  (void)m.training_flops_per_token(4096, true);
  (void)m.megatron_flops_per_token(4096);
}

// --model custom:...: the text after "custom:".
inline void load_custom_model(std::string_view text) {
  std::vector<std::string> defaults;
  const model::ModelConfig m = model::load_model("custom:" + std::string(text), "--model", &defaults);
  (void)m.training_flops_per_token(4096, true);
}

// Plan file (simulate --plan, run --plan): read, model and hardware loaded, the scheme's checks run (nothing
// built). Model or hardware naming a path are not followed.
inline void load_plan_file(std::string_view text) {
  const std::string path = write_temp(text, ".plan.json");
  const planner::PlanFile plan = planner::read_plan_file(path);
  if (looks_like_path(plan.model) || looks_like_path(plan.hw)) return;
  const app::LoadedPlan loaded = app::load_plan(path);
  const planner::StepInputs inputs{loaded.model, *loaded.cluster, loaded.plan.workload, model::precision_policy(loaded.plan.precision, path)};
  planner::check_plan(inputs, loaded.plan.spec);
  (void)loaded.plan.spec.summary();
}

// Task graph (simulate --graph): parsed, validated against two DGX A100 nodes, written back.
inline void load_task_graph(std::string_view text) {
  static const sim::Cluster cluster(hw::load_node("dgx-a100"), 2);
  const sim::GraphDocument graph = sim::parse_graph(json::parse(text, "fuzz-graph.json"), "fuzz-graph.json");
  sim::validate(graph.graph, cluster.gpus(), cluster.nodes, "fuzz-graph.json");
  (void)sim::graph_to_json(graph.graph).dump();
}

// --lengths FILE (one length per line) or FILE.json (trainyard.lengths.v1 histogram): loaded, a small
// mini-batch drawn, grouped and cut into rows.
inline void load_lengths(std::string_view text, const std::string& suffix) {
  const planner::LengthSource source = planner::load_lengths(write_temp(text, suffix));
  const auto lengths = planner::sample_minibatch(source, 64 * 1024, 8 * 1024, 1);
  const auto groups = planner::group_lengths(lengths, {1024, 8 * 1024});
  (void)planner::group_rows(groups.back(), planner::Batching::packing, 2);
}
inline void load_lengths_file(std::string_view text) { load_lengths(text, ".lengths.txt"); }
inline void load_lengths_histogram(std::string_view text) { load_lengths(text, ".lengths.json"); }

// A trace `compare` reads: parsed, compared with itself, the report printed.
inline void load_compare_trace(std::string_view text) {
  const sim::Timeline timeline = sim::parse_timeline(json::parse(text, "fuzz-trace.json"), "fuzz-trace.json");
  const sim::Comparison c = sim::compare(timeline, timeline);
  sim::print_comparison(null_stream(), c);
  (void)sim::comparison_json(c).dump();
}

// One rank's engine trace compared with a one-task step, the report printed.
inline void compare_with_one_task(const traces::RankTrace& rank) {
  sim::Timeline predicted;
  predicted.origin = "fuzz-predicted";
  predicted.process_names[0] = "gpu0";
  predicted.slices.push_back({"gemm", 0, 0, "gemm", 0, 1000, 0});
  const traces::KernelClassifier classes;
  const traces::EngineComparison c = traces::compare_with_engine(predicted, {rank}, classes);
  traces::print_engine_comparison(null_stream(), c);
  (void)traces::engine_comparison_json(c).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // as compare --json dumps it
}

// An engine's profiler trace (a Kineto file, plain or gzip: zlib tells), read and compared with a one-task step.
inline void load_kineto_trace(std::string_view text) { compare_with_one_task(traces::read_kineto_file(write_temp(text, ".pt.trace.json"))); }

// An Nsight Systems SQLite export (the bytes of a .sqlite file), read and compared with a one-task step like Kineto's.
inline void load_nsys_export(std::string_view text) { compare_with_one_task(traces::read_nsys_file(write_temp(text, ".sqlite"))); }

// The CLI's arguments, one per line (at most 64). `list` and `show` run as the program would (quick, no search);
// anything else is parsed against the flags whose values trainyard parses itself and each value goes through the
// commands' own parsers (token counts, custom: models, --strategies, --switch/--static, ring orders, ...) without
// starting a search or a simulation. Arguments that look like paths end the run (no files of this machine).
inline std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> args;
  std::size_t start = 0;
  while (start <= text.size() && args.size() < 64) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    args.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return args;
}
inline void value_options(boost::program_options::options_description& o) {
  namespace po = boost::program_options;
  for (const char* flag : {"model", "hw", "seq", "tokens-per-step", "precision", "strategies", "chunk", "kv", "acts", "weights", "states",
                           "ring-order", "switch", "static", "groups", "batching", "max-len"}) {
    o.add_options()(flag, po::value<std::string>());
  }
  for (const char* flag : {"nodes", "ring", "block", "prefetch", "top"}) o.add_options()(flag, po::value<int>());
  o.add_options()("global-batch", po::value<std::int64_t>())("hbm-headroom", po::value<double>())("seed", po::value<std::uint64_t>());
}
inline void parse_values(const boost::program_options::variables_map& vm) {
  static const sim::Cluster cluster(hw::load_node("dgx-a100"), 2);
  auto given = [&](const char* flag) { return vm.count(flag) > 0; };
  auto text = [&](const char* flag) { return vm[flag].as<std::string>(); };
  if (given("model")) (void)model::load_model(text("model"));
  if (given("hw")) (void)hw::load_node(text("hw"));
  if (given("nodes")) app::check_node_count(vm["nodes"].as<int>(), cluster.node);
  if (given("seq")) (void)app::workload_from_flags(vm);
  if (given("precision")) (void)model::precision_policy(text("precision"));
  if (given("strategies")) (void)planner::schemes_from_list(text("strategies"));
  (void)planner::scheme_named("ringtrack").from_flags(app::flag_values(vm), cluster);
  if (given("switch")) (void)planner::parse_group_plans(text("switch"), "--switch", cluster.gpus());
  if (given("static")) (void)planner::parse_strategy(text("static"), "--static", cluster.gpus());
  if (given("groups")) {
    for (const auto& item : split_commas(text("groups"))) (void)parse_token_count(item, "--groups");
  }
  if (given("batching")) (void)planner::parse_batching(text("batching"));
  if (given("max-len")) (void)parse_token_count(text("max-len"), "--max-len");
}
inline void load_cli_args(std::string_view text) {
  namespace po = boost::program_options;
  const std::vector<std::string> args = split_lines(text);
  for (const auto& a : args) {
    if (looks_like_path(a)) return;
  }
  struct Silence {  // the commands print to std::cout
    std::streambuf* saved = std::cout.rdbuf(null_stream().rdbuf());
    ~Silence() { std::cout.rdbuf(saved); }
  } silence;
  try {
    if (args[0] == "list" || args[0] == "show") {
      const std::vector<std::string> rest(args.begin() + 1, args.end());
      (void)(args[0] == "list" ? app::run_list(rest) : app::run_show(rest));
      return;
    }
    po::options_description options("fuzz");
    value_options(options);
    po::variables_map vm;
    if (!app::parse(args, "fuzz", options, {}, vm)) parse_values(vm);
  } catch (const po::error& e) {  // a usage error: main() exits 2 with it, as with an InputError
    throw InputError(std::string("usage: ") + e.what());
  }
}

}  // namespace trainyard::fuzz
