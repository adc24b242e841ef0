// `trainyard plan`: the plan search on the command line (planner/search.hpp does the work).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/plan_farm.hpp"
#include "app/report.hpp"
#include "backend/executor.hpp"
#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/progress.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/engines/launch.hpp"
#include "planner/estimate.hpp"
#include "planner/no_fit.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"
#include "sim/report.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

namespace {

// `plan --executable DEVICE`: the plans `trainyard run --device DEVICE` takes. On the CPU, as one process (the
// executor, or the CPU reference where the executor refuses the graph). On GPUs, under mpirun with one rank per
// GPU, the executor alone: its graph, as the search builds it, must be one the executor runs.
void keep_runnable(planner::SearchOptions& search, const std::string& device) {
  if (device == "cpu") {
    search.runnable = [](const planner::StepInputs& in, const planner::PlanSpec& spec) { return run_refusal(in, spec, "cpu").empty(); };
    return;
  }
  search.runnable = [](const planner::StepInputs& in, const planner::PlanSpec& spec) {
    return run_refusal(in, spec, "gpu", in.cluster.gpus()).empty();
  };
  search.runnable_graph = [](const planner::StepInputs& in, const planner::PlanSpec&, const sim::TaskGraph& graph) {
    return !backend::executor_refusal(graph, in.cluster.gpus());
  };
}

// `plan --engine NAME`: the plans `trainyard export --to NAME` writes, each parameter expressed (with
// --executable, the plans both keep), so the plan written exports as it is.
const planner::Engine& engine_flag(const std::string& engine) {
  const auto& known = planner::engines();
  const auto it = std::find_if(known.begin(), known.end(), [&](const planner::Engine& e) { return e.name == engine; });
  if (it == known.end()) throw InputError("--engine", "value", "megatron, deepspeed or torchtitan", "\"" + engine + "\"");
  return *it;
}

void keep_exportable(planner::SearchOptions& search, const std::string& engine) {
  engine_flag(engine);  // a known one
  auto executable = search.runnable;
  search.runnable = [executable, engine](const planner::StepInputs& in, const planner::PlanSpec& spec) {
    if (executable && !executable(in, spec)) return false;
    try {
      planner::export_plan(in, spec, engine);
      return true;
    } catch (const InputError&) {
      return false;  // the engine has no equivalent of the scheme, or of one of its parameters
    }
  };
  search.runnable_keeps = (executable ? search.runnable_keeps + " and " : std::string()) + "`trainyard export --to " + engine + "` writes";
}

// --precision, or with --engine and no --precision the engine's own (torchtitan reduces gradients in fp32), so the
// plan written exports as it is.
std::string precision_flag(const po::variables_map& vm) {
  if (vm.count("engine") && vm["precision"].defaulted()) return engine_flag(vm["engine"].as<std::string>()).precision;
  return vm["precision"].as<std::string>();
}

// The engines `trainyard export` writes the scheme's plans for (none: only `trainyard run` runs them).
Json engines_of(const std::string& scheme) {
  Json out = Json::array();
  for (const auto& [engine, writer] : planner::scheme_named(scheme).exports) out.push_back(engine);
  return out;
}

Json plan_json(const planner::RankedPlan& p, const ErrorBar& bar) {
  return {{"scheme", p.spec.scheme},
          {"summary", p.spec.summary()},
          {"parameters", planner::parameters_json(p.spec)},
          {"metrics", planner::metrics_json(p.metrics)},
          {"error_bar", bar.json()},
          {"engines", engines_of(p.spec.scheme)}};
}

// Why a scheme has no plan, for --json.
Json no_fit_json(const planner::SchemeNoFit& s) {
  Json j{{"scheme", s.scheme}, {"configurations", s.configurations}, {"reason", s.reason()}};
  if (s.closest) {
    const auto& m = s.closest->metrics;
    j["closest_miss"] = {{"summary", s.closest->spec.summary()},
                         {"parameters", planner::parameters_json(s.closest->spec)},
                         {"failure", m.failure},
                         {"short_of", m.short_of},
                         {"shortfall_bytes", m.shortfall_bytes},
                         {"by_bounds", m.bound_only}};
  }
  return j;
}

constexpr const char* kBarLegend =
    "published runs like this: trainyard's step-time error on the nearest published runs (smallest..largest, cases; negative: "
    "predicted too fast; docs/validation.md, Error bars)\n";

void add_plan_row(TextTable& table, const std::string& rank, const planner::RankedPlan& p, const ErrorBar& bar) {
  const auto& m = p.metrics;
  table.add_row({rank, p.spec.scheme, p.spec.summary(), format_seconds(m.step_s), format_fixed(m.tokens_per_s, 0), format_fixed(100 * m.mfu, 1) + "%",
                 format_bytes(static_cast<double>(m.peak_hbm_bytes)), format_bytes(static_cast<double>(m.peak_dram_bytes)), m.bottleneck,
                 bar.short_text()});
}

// Why `other` loses to `winner`, in one sentence: the largest per-GPU difference among recompute, other
// compute, waiting on transfers and idling.
std::string reason(const planner::RankedPlan& winner, const planner::RankedPlan& other) {
  const auto& w = winner.metrics;
  const auto& o = other.metrics;
  const double slower = o.step_s / w.step_s;
  struct Part {
    double delta;
    std::string words;
  };
  const double dense_w = w.compute_s - w.recompute_s, dense_o = o.compute_s - o.recompute_s;
  std::vector<Part> parts{
      {o.recompute_s - w.recompute_s, "it recomputes " + format_seconds(o.recompute_s) + " per GPU (HFU " + format_fixed(100 * o.hfu, 1) +
                                          "% vs MFU " + format_fixed(100 * o.mfu, 1) + "%) against " + format_seconds(w.recompute_s)},
      {dense_o - dense_w, "its kernels take longer: " + format_seconds(dense_o) + " of compute per GPU without recompute against " +
                              format_seconds(dense_w) + " (smaller or less efficient calls)"},
      {o.exposed_transfer_s - w.exposed_transfer_s, "it waits " + format_seconds(o.exposed_transfer_s) + " per GPU on transfers against " +
                                                        format_seconds(w.exposed_transfer_s) +
                                                        (o.busiest_link.empty() ? "" : " (busiest link " + o.busiest_link + ")")},
      {o.bubble_s - w.bubble_s,
       "its GPUs idle " + format_seconds(o.bubble_s) + " per GPU in pipeline bubbles or imbalance against " + format_seconds(w.bubble_s)},
  };
  const auto worst = std::max_element(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.delta < b.delta; });
  return other.spec.scheme + " (" + other.spec.summary() + "): " + format_fixed(slower, 2) + "x the step time, mainly because " + worst->words + ".";
}

void explain(std::ostream& out, const planner::SearchReport& report) {
  const auto& win = report.ranked.front();
  const auto& m = win.metrics;
  out << "\nwhy " << win.spec.scheme << " (" << win.spec.summary() << ") wins\n";
  TextTable t({"per GPU, mean", "time", "share of step"}, {false, true, true});
  auto row = [&](const std::string& what, double s) { t.add_row({what, format_seconds(s), format_fixed(100 * s / m.step_s, 1) + "%"}); };
  row("compute (model FLOPs)", m.compute_s - m.recompute_s);
  row("compute beyond model FLOPs (recompute)", m.recompute_s);
  row("exposed copies and communication", m.exposed_transfer_s);
  row("bubbles and imbalance", m.bubble_s);
  row("step", m.step_s);
  t.print(out);
  if (!m.busiest_link.empty()) out << "busiest link: " << m.busiest_link << "\n";
  bool any = false;
  for (const auto& best : report.best_of_scheme) {
    if (best.spec.scheme == win.spec.scheme) continue;
    if (!any) out << "\nthe best plan of each other scheme, and the one reason it loses\n";
    any = true;
    out << "- " << reason(win, best) << "\n";
  }
}

// The command line's options (--lengths and the farm's included).
po::options_description plan_options() {
  po::options_description options("plan options");
  // clang-format off
  options.add_options()
      ("model", po::value<std::string>()->value_name("name|path|custom:..."), "model (required)")
      ("hw", po::value<std::string>()->value_name("name|path"), "node profile (required)")
      ("nodes", po::value<int>()->default_value(1)->value_name("int"), "number of nodes")
      ("seq", po::value<std::string>()->value_name("tokens"), "sequence length (required but with --objective max-seq), e.g. 256K, 1M")
      ("global-batch", po::value<std::int64_t>()->value_name("int"), "sequences per optimizer step (default 1)")
      ("tokens-per-step", po::value<std::string>()->value_name("tokens"), "tokens per optimizer step (instead of --global-batch)")
      ("precision", po::value<std::string>()->default_value("bf16-mixed")->value_name("name"), "precision policy of the model states")
      ("stack", po::value<std::string>()->value_name("name|path"), stacks::kStackFlagHelp)
      ("strategies", po::value<std::string>()->default_value("all")->value_name("list"), ("all, or a comma list of " + planner::scheme_list()).c_str())
      ("objective", po::value<std::string>()->default_value("throughput")->value_name("name"), "throughput, max-seq or min-hbm")
      ("hbm-headroom", po::value<double>()->default_value(0.05)->value_name("fraction"), "fraction of each GPU's HBM kept free")
      ("top", po::value<int>()->default_value(10)->value_name("int"), "plans to show")
      ("threads", po::value<int>()->default_value(0)->value_name("int"), "simulation threads (0: all cores); the answer does not depend on it")
      ("executable", po::value<std::string>()->value_name("cpu|gpu"),
       "only plans `trainyard run --device cpu|gpu` runs (its executors do not run every scheme yet)")
      ("engine", po::value<std::string>()->value_name("megatron|deepspeed|torchtitan"),
       "only plans `trainyard export --to` this engine writes, every parameter expressed (the plan written exports as it is)")
      ("json", po::bool_switch(), "print the result as JSON")
      ("out", po::value<std::string>()->value_name("path"), "write the best plan to a plan file (trainyard simulate --plan runs it)")
      ("trace", po::value<std::string>()->value_name("path"), "write the best plan's Chrome trace")
      ("explain", po::bool_switch(), "the winner's step-time breakdown and why each other scheme's best loses")
      ("bounds-only", po::bool_switch(),
       "prune by the sound lower bounds alone, not also by the analytic estimate within its measured margin (slower; exact whatever the estimate's error)")
      ("estimate-only", po::bool_switch(), "rank by the analytic estimate alone, nothing simulated (every figure labelled an estimate; no --out or --trace)");
  // clang-format on
  add_lengths_options(options, true);
  add_farm_options(options);
  add_trace_options(options);
  add_memory_budget_option(options);
  return options;
}

// plan --lengths: the hot-switching search, which takes only some of plan's flags.
int run_lengths_plan(const po::variables_map& vm) {
  if (vm["estimate-only"].as<bool>()) throw InputError("--estimate-only", "value", "none with --lengths (no estimate of hot switching yet)", "given");
  if (vm["bounds-only"].as<bool>())
    throw InputError("--bounds-only", "value", "none with --lengths (its search prunes by the bounds alone already)", "given");
  for (const char* flag : {"out", "trace", "trace-gpus", "trace-window", "trace-counters"}) {
    if (vm.count(flag))
      throw InputError(std::string("--") + flag, "value", "none with --lengths (no plan file format for hot switching yet)", "given");
  }
  if (vm["explain"].as<bool>() || vm["objective"].as<std::string>() != "throughput") {
    throw InputError("--objective/--explain", "value", "throughput and no --explain with --lengths", "given");
  }
  if (vm.count("engine")) throw InputError("--engine", "value", "none with --lengths (no engine switches strategies within a step)", "given");
  return run_plan_lengths(vm, planner::schemes_from_list(vm["strategies"].as<std::string>()));
}

// The flags of a plan search on one length, checked before anything is loaded.
void check_search_flags(const po::variables_map& vm) {
  for (const char* flag : {"groups", "max-len", "seed", "batch-sequences"}) {
    if (vm.count(flag) && !vm[flag].defaulted()) throw InputError(std::string("--") + flag, "value", "only with --lengths", "--" + std::string(flag));
  }
  check_output_flags(vm, {"out", "trace"});  // before the search, so a bad path does not cost its result
  const bool max_seq = planner::parse_objective(vm["objective"].as<std::string>()) == planner::Objective::max_seq;
  for (const char* flag : {"model", "hw", "seq"}) {
    if (!vm.count(flag) && !(max_seq && std::string(flag) == "seq")) throw InputError(std::string("--") + flag, "value", "a value", "nothing");
  }
  if (max_seq && !vm.count("seq") && vm.count("tokens-per-step")) {
    throw InputError("--tokens-per-step", "value", "--global-batch with --objective max-seq (the length is what it finds)", "given");
  }
  const double headroom = vm["hbm-headroom"].as<double>();
  if (!(headroom >= 0 && headroom < 1)) throw InputError("--hbm-headroom", "value", "a fraction in [0, 1)", std::to_string(headroom));
  const int top = vm["top"].as<int>();
  if (top < 1) throw InputError("--top", "value", "a positive integer", std::to_string(top));
  const int threads = vm["threads"].as<int>();
  if (threads < 0 || threads > 1024) throw InputError("--threads", "value", "0 (all cores) to 1024", std::to_string(threads));
  const planner::Objective objective = planner::parse_objective(vm["objective"].as<std::string>());
  if (objective == planner::Objective::max_seq && (vm.count("out") || vm.count("trace"))) {
    throw InputError("--out/--trace", "value", "none with --objective max-seq (each scheme gets its own length)", "given");
  }
}

// A search on one length as the command line gives it: what its results are printed and written against.
struct PlanRun {
  const po::variables_map& vm;
  const model::ModelConfig& model;
  const sim::Cluster& cluster;
  planner::Workload workload;
  planner::StepInputs inputs;  // refers to `model` and `cluster`
  int top = 10;
  bool as_json = false;
  // Each plan's error bar: how far trainyard was off on the published runs most like it (app/error_bars.hpp).
  ErrorBar bar_of(const planner::RankedPlan& p, std::int64_t seq) const {
    return error_bar(step_kind(p.spec.scheme, cluster, {seq, workload.global_batch}, cluster.gpus()));
  }
  std::string model_name() const { return vm["model"].as<std::string>(); }
  std::string hw_name() const { return vm["hw"].as<std::string>(); }
  int nodes() const { return vm["nodes"].as<int>(); }
};

planner::Workload workload_of(const po::variables_map& vm) {
  planner::Workload workload;
  if (!vm.count("seq")) {  // --objective max-seq: the length is what it finds; its probes start at 1K
    workload.seq_len = 1024;
    if (vm.count("global-batch")) workload.global_batch = vm["global-batch"].as<std::int64_t>();
    if (workload.global_batch < 1) throw InputError("--global-batch", "value", "a positive integer", std::to_string(workload.global_batch));
    return workload;
  }
  if (vm.count("global-batch") || vm.count("tokens-per-step")) return workload_from_flags(vm);
  workload.seq_len = parse_token_count(vm["seq"].as<std::string>(), "--seq");
  return workload;
}

planner::SearchOptions search_options(const po::variables_map& vm, std::int64_t memory_budget_bytes) {
  planner::SearchOptions search;
  search.schemes = planner::schemes_from_list(vm["strategies"].as<std::string>());
  search.objective = planner::parse_objective(vm["objective"].as<std::string>());
  search.hbm_headroom = vm["hbm-headroom"].as<double>();
  search.top = vm["top"].as<int>();
  search.threads = vm["threads"].as<int>();
  search.cancel = &interrupt_flag();
  search.prune_by_estimate = !vm["bounds-only"].as<bool>();
  search.memory_budget_bytes = memory_budget_bytes;
  if (vm.count("executable")) {
    const std::string device = vm["executable"].as<std::string>();
    if (device != "cpu" && device != "gpu") throw InputError("--executable", "value", "cpu or gpu", "\"" + device + "\"");
    keep_runnable(search, device);
  }
  if (vm.count("engine")) keep_exportable(search, vm["engine"].as<std::string>());
  return search;
}

// --resume FILE around the search's simulations (or the farm's), keyed by the inputs its results depend on.
// `resume` is the caller's: the search's farm refers to it.
void open_resume(const PlanRun& run, const planner::SearchOptions& local, planner::SearchOptions& search, std::optional<ResumeFile>& resume) {
  const po::variables_map& vm = run.vm;
  if (!vm.count("resume")) return;
  const std::string key = run.model_name() + " on " + std::to_string(run.nodes()) + " x " + run.hw_name() + ", stack " + run.cluster.stack.name +
                          ", " + precision_flag(vm) + ", HBM headroom " + format_number(vm["hbm-headroom"].as<double>()) +
                          (vm.count("executable") ? ", executable " + vm["executable"].as<std::string>() : "");
  resume.emplace(vm["resume"].as<std::string>(), key);
  if (!search.farm)
    search.farm = [local](const planner::StepInputs& in, const std::vector<planner::PlanSpec>& specs) {
      return planner::simulate_here(in, specs, local);
    };
  search.farm = resume->wrap(search.farm);
}

// --objective max-seq: each scheme's longest sequence, one search after another.
int run_max_seq(const PlanRun& run, planner::SearchOptions search, Progress& progress) {
  Json out = Json::array();
  TextTable table({"scheme", "max length", "plan", "MFU there", "peak HBM/GPU", "peak DRAM/node", "published runs like this"},
                  {false, true, false, true, true, true, false});
  for (const auto& scheme : search.schemes) {
    if (interrupted()) break;
    progress.set_phase("longest sequence for " + scheme);
    search.progress = [&](std::size_t done, std::size_t total) { progress.update(done, total, "probes"); };
    const auto best = planner::max_sequence(run.inputs, scheme, search);
    if (!best) {
      // Not even 1K fits: say when the batch, not the length, is the cause.
      const planner::StepInputs at_1k{run.inputs.model, run.inputs.cluster, {1024, run.workload.global_batch}, run.inputs.precision};
      const std::int64_t batch = planner::global_batch_needed(at_1k, scheme);
      table.add_row({scheme, batch ? "none" : "< 1K",
                     batch ? "no valid configuration with this batch: --global-batch " + std::to_string(batch) : "no plan fits", "", "", "", ""});
      out.push_back({{"scheme", scheme}, {"max_seq_len", nullptr}, {"valid_global_batch", batch}});
      continue;
    }
    const auto& m = best->plan.metrics;
    table.add_row({scheme, format_tokens(best->seq_len) + (best->limited_by_budget ? " (budget)" : ""), best->plan.spec.summary(),
                   format_fixed(100 * m.mfu, 1) + "%", format_bytes(static_cast<double>(m.peak_hbm_bytes)),
                   format_bytes(static_cast<double>(m.peak_dram_bytes)), run.bar_of(best->plan, best->seq_len).short_text()});
    Json j = plan_json(best->plan, run.bar_of(best->plan, best->seq_len));
    j["max_seq_len"] = best->seq_len;
    j["limited_by_budget"] = best->limited_by_budget;
    out.push_back(j);
  }
  progress.finish();
  if (run.as_json) {
    std::cout << Json{{"objective", "max-seq"}, {"interrupted", interrupted()}, {"schemes", out}}.dump(2) << "\n";
  } else {
    std::cout << "longest trainable sequence per scheme (multiples of 1K tokens), " << run.model.name << " on " << run.nodes() << " x "
              << run.cluster.node.name << (interrupted() ? " (interrupted: partial)" : "") << "\n\n";
    table.print(std::cout);
    std::cout << kBarLegend;
    const bool budget = std::any_of(out.begin(), out.end(), [](const Json& j) { return j.value("limited_by_budget", false); });
    if (budget) {
      std::cout << "(budget): longer probes had no candidate within the memory budget, so the length is a lower bound (--memory-budget "
                   "raises it)\n";
    }
  }
  return interrupted() ? kInterruptedExitCode : 0;
}

// No plan fits: why, per scheme (exit 1; 130 when interrupted).
int print_no_fit(const PlanRun& run, const planner::SearchReport& report, const std::vector<std::string>& schemes_searched) {
  std::string miss = "no plan fits " + run.model.name + " at " + format_tokens(run.workload.seq_len) + " tokens on " + std::to_string(run.nodes()) +
                     " x " + run.cluster.node.name;
  if (report.closest_miss) miss += "; closest miss: " + planner::describe_miss(*report.closest_miss);
  const auto schemes = planner::schemes_without_fit(report, schemes_searched, run.inputs);
  if (run.as_json) {
    Json why = Json::array();
    for (const auto& s : schemes) why.push_back(no_fit_json(s));
    std::cout << Json{{"fits", false}, {"message", miss}, {"enumerated", report.enumerated}, {"schemes", why}}.dump(2) << "\n";
  }
  std::cerr << "error: " << miss << (report.interrupted ? " (search interrupted)" : "") << "\n";
  for (const auto& s : schemes) std::cerr << "  " << s.reason() << "\n";
  return report.interrupted ? kInterruptedExitCode : 1;
}

// --out and --trace of the best plan; neither from an interrupted search, whose best is not its answer.
void write_best(const PlanRun& run, const planner::SearchReport& report, const std::optional<TraceRequest>& trace) {
  const po::variables_map& vm = run.vm;
  const auto& best = report.ranked.front();
  if (report.interrupted && (vm.count("out") || vm.count("trace"))) std::cerr << "interrupted: --out and --trace not written\n";
  if (vm.count("out") && !report.interrupted) {
    planner::PlanFile file;
    file.model = run.model_name();
    file.hw = run.hw_name();
    file.nodes = run.nodes();
    file.workload = run.workload;
    file.precision = precision_flag(vm);
    file.stack = vm.count("stack") ? vm["stack"].as<std::string>() : std::string(stacks::kDefaultStack);
    file.spec = best.spec;
    file.predicted = planner::metrics_json(best.metrics);
    write_file_atomically(vm["out"].as<std::string>(), [&](std::ostream& out) { out << planner::plan_file_json(file).dump(2) << "\n"; });
  }
  if (trace && !report.interrupted) {
    sim::TaskGraph graph = planner::build_plan(run.inputs, best.spec);
    graph.finalize();
    const sim::SimResult r = sim::simulate(graph, run.cluster);
    write_trace(*trace, r, graph, run.cluster);
  }
}

int print_ranked_json(const PlanRun& run, const planner::SearchReport& report, const std::vector<std::string>& schemes_searched) {
  const auto& best = report.ranked.front();
  Json ranked = Json::array(), per_scheme = Json::array();
  for (std::size_t i = 0; i < report.ranked.size() && i < static_cast<std::size_t>(run.top); ++i)
    ranked.push_back(plan_json(report.ranked[i], run.bar_of(report.ranked[i], run.workload.seq_len)));
  for (const auto& p : report.best_of_scheme) {
    per_scheme.push_back(plan_json(p, run.bar_of(p, run.workload.seq_len)));
    per_scheme.back()["gap"] = p.gap;
  }
  Json without_plan = Json::array();  // every other scheme's verdict, as the text prints it
  for (const auto& s : planner::schemes_without_fit(report, schemes_searched, run.inputs)) without_plan.push_back(no_fit_json(s));
  Json out{{"model", run.model_name()},
           {"hw", run.hw_name()},
           {"nodes", run.nodes()},
           {"workload", {{"seq_len", run.workload.seq_len}, {"global_batch", run.workload.global_batch}}},
           {"objective", run.vm["objective"].as<std::string>()},
           {"ranked", ranked},
           {"best_of_scheme", per_scheme},
           {"schemes_without_plan", without_plan},
           {"enumerated", report.enumerated},
           {"pruned_memory", report.pruned_memory},
           {"pruned_time", report.pruned_time},
           {"pruned_by_estimate", report.pruned_estimate},
           {"simulated", report.simulated},
           {"over_budget", report.over_budget},
           {"interrupted", report.interrupted}};
  if (run.vm["explain"].as<bool>()) {
    Json reasons = Json::array();
    for (const auto& p : report.best_of_scheme) {
      if (p.spec.scheme != best.spec.scheme) reasons.push_back({{"scheme", p.spec.scheme}, {"reason", reason(best, p)}});
    }
    out["explain"] = reasons;
  }
  std::cout << out.dump(2) << "\n";
  return report.interrupted ? kInterruptedExitCode : 0;
}

// The ranked table, the best of each scheme, what was pruned and simulated, and --explain.
void print_ranked_text(const PlanRun& run, const planner::SearchReport& report, const std::vector<std::string>& schemes_searched, double elapsed,
                       const std::optional<ResumeFile>& resume, int ranks) {
  const po::variables_map& vm = run.vm;
  const double rate = elapsed > 0 ? static_cast<double>(report.simulated) / elapsed : 0;
  std::cout << "plans for " << run.model.name << " at " << format_tokens(run.workload.seq_len) << " tokens x " << run.workload.global_batch
            << " per step on " << run.nodes() << " x " << run.cluster.node.name << ", objective " << vm["objective"].as<std::string>()
            << (report.interrupted ? " (interrupted: best found so far)" : "") << "\n\n";
  TextTable table(
      {"rank", "scheme", "parameters", "step", "tokens/s", "MFU", "peak HBM/GPU", "peak DRAM/node", "bottleneck", "published runs like this"},
      {true, false, false, true, true, true, true, true, false, false});
  for (std::size_t i = 0; i < report.ranked.size() && i < static_cast<std::size_t>(run.top); ++i) {
    add_plan_row(table, std::to_string(i + 1), report.ranked[i], run.bar_of(report.ranked[i], run.workload.seq_len));
  }
  // The best plan of every scheme, even when it is not in the top k.
  for (const auto& p : report.best_of_scheme) {
    // Its rank: the best plan of a scheme is the first of that scheme in the ranking.
    const auto rank = static_cast<std::size_t>(
        std::find_if(report.ranked.begin(), report.ranked.end(), [&](const auto& r) { return r.spec.scheme == p.spec.scheme; }) -
        report.ranked.begin());
    if (rank >= static_cast<std::size_t>(run.top)) add_plan_row(table, std::to_string(rank + 1), p, run.bar_of(p, run.workload.seq_len));
  }
  table.print(std::cout);
  std::cout << kBarLegend;
  for (const auto& p : report.best_of_scheme) {
    if (p.gap > 0) {
      std::cout << p.spec.scheme << ": the best of its simulated plans; by the bounds" << (report.pruned_estimate ? " and the estimate's margin" : "")
                << ", none of its skipped plans can be more than " << format_fixed(100 * p.gap, 1) << "% better\n";
    }
  }
  for (const auto& p : report.best_of_scheme) {
    if (planner::scheme_named(p.spec.scheme).exports.empty()) {
      std::cout << p.spec.scheme << ": no engine runs its plans (trainyard export has no equivalent to write; trainyard run runs them)\n";
    }
  }
  for (const auto& s : planner::schemes_without_fit(report, schemes_searched, run.inputs)) {
    if (s.configurations == 0 || !report.interrupted) std::cout << s.reason() << "\n";
  }
  std::cout << "\n"
            << report.enumerated << " plans enumerated, " << report.pruned_memory << " pruned by memory bounds, " << report.pruned_time
            << " by time bounds"
            << (report.pruned_estimate ? " (" + std::to_string(report.pruned_estimate) + " by the estimate within its measured margin)" : "") << ", "
            << (report.over_budget ? std::to_string(report.over_budget) + " too large for the memory budget (--memory-budget), " : "")
            << report.simulated << " simulated in " << format_fixed(elapsed, 1) << " s (" << format_fixed(rate, 1) << " plans/s)"
            << (resume ? ", " + std::to_string(resume->reused()) + " of them taken from --resume " + vm["resume"].as<std::string>() : "")
            << (ranks > 1 ? " on " + std::to_string(ranks) + " MPI ranks" : "") << "\n";
  if (vm["explain"].as<bool>()) explain(std::cout, report);
  if (vm.count("out") && !report.interrupted)
    std::cout << "\nplan written to " << vm["out"].as<std::string>() << " (run it: trainyard simulate --plan " << vm["out"].as<std::string>()
              << ")\n";
}

}  // namespace

int run_plan(const std::vector<std::string>& args) {
  po::options_description options = plan_options();
  po::positional_options_description positional;
  po::variables_map vm;
  if (parse(args,
            "trainyard plan --model M --hw NODE [--nodes N] --seq S [--global-batch B | --tokens-per-step T]\n"
            "       [--strategies all|LIST] [--objective throughput|max-seq|min-hbm] [--hbm-headroom 0.05] [--top 10] [--executable cpu|gpu] "
            "[--engine E]\n"
            "       [--json] [--out plan.json] [--trace best.json] [--explain] [--estimate-only | --bounds-only] [--resume FILE]\n"
            "       (under mpirun -np N: the simulations spread over the N ranks, the same answer; --rank-timeout 600)\n"
            "       trainyard plan --lengths dist:NAME|FILE --model M --hw NODE [--nodes N] (--tokens-per-step T | --batch-sequences N)\n"
            "       [--max-len 32K] [--groups LIST] [--strategies all|LIST] [--per-group 3] [--executable cpu|gpu] [--json] [--resume FILE]",
            options, positional, vm)) {
    return 0;
  }
  if (vm.count("lengths")) return run_lengths_plan(vm);
  check_search_flags(vm);
  const model::ModelConfig model = model::load_model(vm["model"].as<std::string>(), "--model");
  const sim::Cluster cluster = load_cluster(vm, vm["hw"].as<std::string>(), "--hw", vm["nodes"].as<int>());
  const std::int64_t budget = memory_budget(vm);
  const double cluster_bytes = planner::cluster_bytes(cluster.node, cluster.nodes);
  const std::optional<TraceRequest> trace = trace_request(vm, cluster.gpus());
  const planner::Workload workload = workload_of(vm);
  const PlanRun run{vm,
                    model,
                    cluster,
                    workload,
                    {model, cluster, workload, model::precision_policy(precision_flag(vm))},
                    vm["top"].as<int>(),
                    vm["json"].as<bool>()};
  // What the cluster leaves of the budget.
  planner::SearchOptions search = search_options(vm, std::max<std::int64_t>(1, budget - static_cast<std::int64_t>(cluster_bytes)));
  // Under mpirun, rank 0 searches and the other ranks simulate its waves; --resume reuses earlier results.
  const planner::SearchOptions local = search;  // how this rank simulates its share
  const std::unique_ptr<PlanFarm> ranks = PlanFarm::join(rank_timeout(vm));
  if (ranks && !ranks->root()) {
    try {
      return ranks->serve(run.inputs, local);
    } catch (const std::exception& e) {
      ranks->abort_after(e);
    }
  }
  if (ranks) search.farm = ranks->farm(local);
  std::optional<ResumeFile> resume;
  open_resume(run, local, search, resume);
  if (vm["estimate-only"].as<bool>()) {
    for (const char* flag : {"out", "trace", "explain"}) {
      if (vm.count(flag) && !vm[flag].defaulted())
        throw InputError(std::string("--") + flag, "value", "none with --estimate-only (plan files and traces hold simulated figures)", "given");
    }
    return run_plan_estimate_only(run.inputs, search, run.as_json);
  }
  // A progress line on a terminal only (not with --json; nothing when stderr is piped): common/progress.hpp.
  Progress progress("bounds", !run.as_json);
  search.bounds_progress = [&](std::size_t done, std::size_t total) { progress.update(done, total, "plans"); };
  search.progress = [&](std::size_t done, std::size_t total) {
    progress.set_phase("simulating");
    progress.update(done, total, "plans");
  };
  if (search.objective == planner::Objective::max_seq) return run_max_seq(run, search, progress);
  // On a terminal, the estimate's ranking at once (labelled), while the simulator confirms; never in --json or a pipe.
  if (!run.as_json && Progress::stderr_is_terminal()) {
    search.estimated = [&](const std::vector<planner::EstimatedPlan>& plans) {
      progress.finish();
      print_provisional(std::cerr, plans, static_cast<double>(workload.tokens()));
    };
  }
  const auto started = std::chrono::steady_clock::now();
  const planner::SearchReport report = planner::search(run.inputs, search);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  progress.finish();
  if (report.ranked.empty()) return print_no_fit(run, report, search.schemes);
  write_best(run, report, trace);
  if (run.as_json) return print_ranked_json(run, report, search.schemes);
  print_ranked_text(run, report, search.schemes, elapsed, resume, ranks ? ranks->size() : 1);
  return report.interrupted ? kInterruptedExitCode : 0;
}

}  // namespace trainyard::app
