// `simulate --lengths` and `plan --lengths`: variable-length mini-batches, static beside hot-switched (HotSPa).
#include <iostream>

#include "app/commands.hpp"
#include "app/plan_farm.hpp"
#include "backend/executor.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/progress.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/estimate.hpp"
#include "planner/hotspa.hpp"
#include "stacks/collective_library.hpp"
#include "stacks/stack_profile.hpp"

namespace trainyard::app {

namespace po = boost::program_options;

namespace {

std::vector<std::int64_t> token_list(const std::string& text, const std::string& flag) {
  std::vector<std::int64_t> out;
  for (const std::string& item : split_commas(text)) out.push_back(parse_token_count(item, flag));
  return out;
}

// What both commands share: model, cluster, the drawn mini-batch and the setting.
struct LengthsRun {
  model::ModelConfig model;
  std::optional<sim::Cluster> cluster;
  planner::LengthSource source;
  std::vector<std::int64_t> lengths;
  std::int64_t tokens = 0;     // the mini-batch's trained positions (--tokens-per-step, or the documents drawn)
  std::int64_t documents = 0;  // --batch-sequences (0: --tokens-per-step)
  std::int64_t max_len = 0;
  std::optional<planner::HotSpaSetting> setting;
};

// Model and cluster.
void load_hardware(const po::variables_map& vm, LengthsRun& run) {
  for (const char* flag : {"model", "hw"}) {
    if (!vm.count(flag)) throw InputError(std::string("--") + flag, "value", "a value with --lengths", "nothing");
  }
  if (vm.count("tokens-per-step") == vm.count("batch-sequences")) {
    throw InputError("--tokens-per-step/--batch-sequences", "value", "exactly one of them with --lengths",
                     vm.count("tokens-per-step") ? "both" : "neither");
  }
  if (vm.count("global-batch") || vm.count("seq")) {
    throw InputError("--seq/--global-batch", "value",
                     "none with --lengths (the lengths and --tokens-per-step or --batch-sequences set the mini-batch)", "given");
  }
  run.model = model::load_model(vm["model"].as<std::string>(), "--model");
  hw::NodeProfile node = hw::load_node(vm["hw"].as<std::string>(), "--hw");
  const int nodes = vm.count("nodes") ? vm["nodes"].as<int>() : 1;
  check_node_count(nodes, node);
  planner::require_cluster_within_budget(node, nodes, memory_budget(vm));
  run.cluster.emplace(std::move(node), nodes);
}

// The most sequences `tokens` can split into (every document as short as the source allows), as the bytes the
// drawn lengths and their groups hold: refused before drawing when over the budget.
void check_minibatch_size(const planner::LengthSource& source, std::int64_t tokens, std::int64_t budget_bytes) {
  std::int64_t shortest = planner::kMinDocumentTokens;
  if (!source.samples.empty()) shortest = *std::min_element(source.samples.begin(), source.samples.end());
  for (const auto& bin : source.bins) shortest = std::min(shortest, bin.min);
  constexpr double kBytesPerSequence = 4 * sizeof(std::int64_t);  // the draw, the groups, their merges
  const double sequences = static_cast<double>(tokens) / static_cast<double>(std::max<std::int64_t>(1, shortest));
  planner::require_within_budget({sequences, sequences * kBytesPerSequence}, budget_bytes, "a mini-batch of lengths", "fewer --tokens-per-step",
                                 "sequences at most");
}

// --batch-sequences N documents (HotSPa's artifact), or --tokens-per-step T tokens of documents cut into pieces.
void draw_minibatch(const po::variables_map& vm, LengthsRun& run) {
  const auto seed = vm["seed"].as<std::uint64_t>();
  if (vm.count("batch-sequences")) {
    run.documents = vm["batch-sequences"].as<std::int64_t>();
    constexpr double kBytesPerDocument = 4 * sizeof(std::int64_t);  // the draw, the groups, their merges
    const auto documents = static_cast<double>(run.documents);
    planner::require_within_budget({documents, documents * kBytesPerDocument}, memory_budget(vm), "a mini-batch of documents",
                                   "fewer --batch-sequences", "documents at most");
    run.lengths = planner::sample_documents(run.source, run.documents, run.max_len, seed);
    run.tokens = 0;
    for (auto l : run.lengths) run.tokens += l;
    return;
  }
  run.tokens = parse_token_count(vm["tokens-per-step"].as<std::string>(), "--tokens-per-step");
  check_minibatch_size(run.source, run.tokens, memory_budget(vm));
  run.lengths = planner::sample_minibatch(run.source, run.tokens, run.max_len, seed);
}

// plan --lengths' longest sequence without --max-len: 32K, or for a lengths file (or histogram) whose longest
// document is shorter, that length rounded up to a power of two, so the last group's rows are no longer than the
// documents they hold (a 32K row for a file of 60-token documents fits nothing a tiny model's step can run).
std::int64_t default_max_len(const planner::LengthSource& source) {
  constexpr std::int64_t kDefault = 32 * 1024;
  std::int64_t longest = 0;
  for (const std::int64_t s : source.samples) longest = std::max(longest, s);
  for (const auto& bin : source.bins) longest = std::max(longest, bin.max);
  if (source.kind == planner::LengthSource::Kind::lognormal || longest <= 0) return kDefault;
  std::int64_t len = 1;
  while (len < longest) len *= 2;
  return std::min(len, kDefault);
}

// The mini-batch and the setting; `max_len` 0: plan --lengths' default, from the lengths (default_max_len).
void load(const po::variables_map& vm, LengthsRun& run, std::int64_t max_len) {
  run.source = planner::load_lengths(vm["lengths"].as<std::string>());
  run.max_len = max_len > 0 ? max_len : default_max_len(run.source);
  draw_minibatch(vm, run);
  run.setting.emplace(planner::HotSpaSetting{run.model, *run.cluster, model::precision_policy(vm["precision"].as<std::string>())});
  run.setting->batching = planner::parse_batching(vm["batching"].as<std::string>());
  run.setting->micro_batch_tokens = parse_token_count(vm["micro-batch-tokens"].as<std::string>(), "--micro-batch-tokens");
  if (vm.count("threads")) run.setting->threads = vm["threads"].as<int>();
  if (vm.count("hbm-headroom")) run.setting->hbm_headroom = vm["hbm-headroom"].as<double>();
  run.setting->memory_budget_bytes = memory_budget(vm);
  run.setting->cancel = &interrupt_flag();
}

// What a --resume file's range results depend on besides each job's groups and plan: the hardware, the model and
// precision, the drawn mini-batch (its lengths, hashed: FNV-1a over their decimal text) and how it is grouped.
std::string lengths_inputs_key(const po::variables_map& vm, const LengthsRun& run, const std::vector<std::int64_t>& bounds) {
  std::uint64_t hash = 14695981039346656037ULL;
  for (const std::int64_t length : run.lengths) {
    for (const char c : std::to_string(length) + ",") hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  }
  std::string groups;
  for (const std::int64_t b : bounds) groups += (groups.empty() ? "" : ",") + std::to_string(b);
  const planner::HotSpaSetting& s = *run.setting;
  return "--lengths " + run.model.name + " on " + std::to_string(run.cluster->nodes) + " x " + run.cluster->node.name + ", " +
         vm["precision"].as<std::string>() + ", HBM headroom " + format_number(s.hbm_headroom) + ", " + std::string(planner::to_string(s.batching)) +
         ", micro-batch tokens " + std::to_string(s.micro_batch_tokens) + ", " + std::to_string(run.lengths.size()) + " lengths hashed " +
         std::to_string(hash) + ", groups " + groups + (vm.count("executable") ? ", executable " + vm["executable"].as<std::string>() : "");
}

void print_header(const LengthsRun& run) {
  std::cout << "lengths: " << run.source.origin << ": " << run.source.description << "\n"
            << "mini-batch: " << run.lengths.size() << (run.documents ? " documents, " : " sequences, ") << format_tokens(run.tokens)
            << " tokens, longest " << format_tokens(*std::max_element(run.lengths.begin(), run.lengths.end())) << " (documents cut at "
            << format_tokens(run.max_len) << (run.documents ? ", the rest dropped" : ", the rest in pieces") << "), "
            << planner::to_string(run.setting->batching) << "\n"
            << "model " << run.model.name << " on " << run.cluster->nodes << " x " << run.cluster->node.name << " (" << run.cluster->gpus()
            << " GPUs)\n\n";
}

nlohmann::json header_json(const LengthsRun& run) {
  return {{"lengths", run.source.origin},    {"description", run.source.description},
          {"sequences", run.lengths.size()}, {"tokens", run.tokens},
          {"max_len", run.max_len},          {"model", run.model.name},
          {"gpus", run.cluster->gpus()},     {"batching", planner::to_string(run.setting->batching)}};
}

void print_failure(const std::string& what, const planner::MinibatchResult& r) {
  if (!r.fits) std::cout << what << " does not fit: " << r.failure << "\n";
}

}  // namespace

void add_lengths_options(po::options_description& options, bool plan) {
  // clang-format off
  options.add_options()
      ("lengths", po::value<std::string>()->value_name("dist:NAME|FILE"),
       "variable-length mini-batches: dist:commoncrawl, dist:github, a file of lengths (one per line) or a histogram JSON")
      ("seed", po::value<std::uint64_t>()->default_value(1)->value_name("int"), "with --lengths: the mini-batch's random seed")
      ("max-len", po::value<std::string>()->value_name("tokens"),
       plan ? "with --lengths: longest sequence; longer documents are cut (default: a lengths file's longest document rounded up to a power of two, at most 32K; 32K for dist:)"
            : "with --lengths: longest sequence; longer documents are cut (default: the last group bound)")
      ("groups", po::value<std::string>()->value_name("list"), plan ? "with --lengths: candidate group bounds (default: powers of two from 1K, or from half of --max-len below 2K, to --max-len)"
                                                                    : "with --lengths: the length groups to break the time down by, e.g. 1K,4K,8K,16K,32K")
      ("batch-sequences", po::value<std::int64_t>()->value_name("int"),
       "with --lengths: a mini-batch of this many documents, each cut at --max-len (instead of --tokens-per-step; HotSPa's artifact: 512)")
      ("batching", po::value<std::string>()->default_value("packing")->value_name("packing|padding|ffd-padded"),
       "with --lengths: packed rows with per-document masks, one padded row per sequence, or HotSPa's artifact: first-fit decreasing "
       "into rows padded to the group's bound, causal over the whole row, one row per micro-batch, rows past a multiple of dp x micro-batch dropped")
      ("micro-batch-tokens", po::value<std::string>()->default_value("16K")->value_name("tokens"), "with --lengths: micro-batch size for strategies that give none");
  // clang-format on
  if (!plan) {
    // clang-format off
    options.add_options()
        ("static", po::value<std::string>()->value_name("SCHEME:k=v,..."), "with --lengths: one strategy for every group, e.g. megatron:tp=16,pp=2")
        ("switch", po::value<std::string>()->value_name("UPPER=SCHEME:k=v,...;..."), "with --lengths: hot switching, a strategy per group, e.g. 4K=megatron:dp=4,tp=2,pp=4;32K=megatron:tp=16,pp=2");
    // clang-format on
  } else {
    options.add_options()("per-group", po::value<int>()->default_value(3)->value_name("int"),
                          "with --lengths: configurations simulated per candidate group");
  }
}

namespace {

struct LengthsOutcome {
  LengthsRun run;
  std::optional<planner::MinibatchResult> static_run, switched_run;
};

// The mini-batch of --lengths under --static and/or --switch (what simulate --lengths prints).
LengthsOutcome simulate_minibatch(const po::variables_map& vm) {
  if (!vm.count("static") && !vm.count("switch")) throw InputError("--static/--switch", "value", "at least one with --lengths", "neither");
  for (const char* flag : {"graph", "plan", "strategy"}) {
    if (vm.count(flag))
      throw InputError(std::string("--") + flag, "value", "none with --lengths (--static and --switch give the strategies)", "given");
  }
  // Groups: --groups, else the --switch bounds; rows of the static plan are --max-len long.
  std::vector<planner::GroupPlan> switched;
  std::vector<std::int64_t> bounds;
  LengthsRun run;
  {
    load_hardware(vm, run);  // the strategies need the GPU count (megatron's default dp)
    const int gpus = run.cluster->gpus();
    if (vm.count("switch")) switched = planner::parse_group_plans(vm["switch"].as<std::string>(), "--switch", gpus);
    if (vm.count("groups")) bounds = token_list(vm["groups"].as<std::string>(), "--groups");
    else if (!switched.empty())
      for (const auto& p : switched) bounds.push_back(p.upper);
    std::int64_t max_len = vm.count("max-len") ? parse_token_count(vm["max-len"].as<std::string>(), "--max-len") : 0;
    if (max_len == 0) {
      if (bounds.empty()) throw InputError("--max-len", "value", "a value (or --groups / --switch bounds)", "nothing");
      max_len = bounds.back();
    }
    if (bounds.empty()) bounds.push_back(max_len);
    if (!switched.empty() && switched.back().upper < max_len) {
      throw InputError("--switch", "value", "a last group bound of at least --max-len (" + format_tokens(max_len) + ")",
                       format_tokens(switched.back().upper));
    }
    if (bounds.back() < max_len)
      throw InputError("--groups", "value", "a last bound of at least --max-len (" + format_tokens(max_len) + ")", format_tokens(bounds.back()));
    load(vm, run, max_len);
  }
  std::optional<planner::MinibatchResult> st, sw;
  if (vm.count("static")) {
    bool micro_batch_given = false;
    const planner::PlanSpec spec = planner::parse_strategy(vm["static"].as<std::string>(), "--static", run.cluster->gpus(), &micro_batch_given);
    st = planner::run_static(*run.setting, run.lengths, bounds, spec, !micro_batch_given, "--static");
  }
  if (!switched.empty()) sw = planner::run_minibatch(*run.setting, run.lengths, switched, "--switch");
  return {std::move(run), std::move(st), std::move(sw)};
}

}  // namespace

SwitchedMinibatch load_switched_minibatch(const po::variables_map& vm, bool predict) {
  if (!vm.count("switch")) throw InputError("--switch", "value", "the groups' strategies with --lengths (UPPER=SCHEME:k=v,...;...)", "nothing");
  LengthsRun run;
  load_hardware(vm, run);
  hw::NodeProfile node = run.cluster->node;
  if (vm.count("gpu-profile")) node.gpu = hw::load_gpu(vm["gpu-profile"].as<std::string>(), "--gpu-profile");
  const int nodes = run.cluster->topology.node_count(), per_node = run.cluster->devices_per_node;
  run.cluster.emplace(std::move(node), nodes, stacks::load_stack("trainyard", "run's prediction"), per_node);
  const auto plans = planner::parse_group_plans(vm["switch"].as<std::string>(), "--switch", run.cluster->gpus());
  const std::int64_t max_len = vm.count("max-len") ? parse_token_count(vm["max-len"].as<std::string>(), "--max-len") : plans.back().upper;
  if (plans.back().upper < max_len) {
    throw InputError("--switch", "value", "a last group bound of at least --max-len (" + format_tokens(max_len) + ")",
                     format_tokens(plans.back().upper));
  }
  load(vm, run, max_len);
  run.setting->document_masks = false;  // the executors attend over whole rows
  SwitchedMinibatch out{run.model, run.cluster, run.setting->precision, {}, static_cast<std::int64_t>(run.lengths.size()), {}, {}};
  if (vm.count("collectives")) {
    out.collectives = stacks::load_collective_library(vm["collectives"].as<std::string>(), "--collectives");
    run.setting->collectives = &*out.collectives;
  }
  out.groups = planner::minibatch_groups(*run.setting, run.lengths, plans, "--switch");
  if (predict) out.predicted = planner::run_minibatch(*run.setting, run.lengths, plans, "--switch");
  return out;
}

double simulate_minibatch_seconds(const po::variables_map& vm, std::string& why_not) {
  const LengthsOutcome o = simulate_minibatch(vm);
  const planner::MinibatchResult& r = o.switched_run ? *o.switched_run : *o.static_run;
  if (!r.fits) why_not = r.failure;
  return r.total_s;
}

int run_simulate_lengths(const po::variables_map& vm) {
  LengthsOutcome outcome = simulate_minibatch(vm);
  const LengthsRun& run = outcome.run;
  const std::optional<planner::MinibatchResult>& st = outcome.static_run;
  const std::optional<planner::MinibatchResult>& sw = outcome.switched_run;
  if (vm["json"].as<bool>()) {
    nlohmann::json out = header_json(run);
    if (st) out["static"] = planner::minibatch_json(*st, *run.cluster);
    if (sw) out["switched"] = planner::minibatch_json(*sw, *run.cluster);
    std::cout << out.dump(2) << "\n";
    return (st && !st->fits) || (sw && !sw->fits) ? 1 : 0;
  }
  print_header(run);
  if (st && sw) {
    std::cout << planner::table3(*st, *sw);
  } else {
    const auto& r = st ? *st : *sw;
    std::cout << planner::table3(r, r);
  }
  if (st) print_failure("static", *st);
  if (sw) print_failure("hot-switched", *sw);
  if (sw) {
    for (const auto& s : sw->switches) {
      std::cout << "switch to group " << s.to + 1 << ": " << format_bytes(static_cast<double>(s.param_bytes)) << " parameters"
                << (s.params_overlapped ? " (during the group before)" : "") << ", " << format_bytes(static_cast<double>(s.grad_bytes))
                << " gradients, " << format_fixed(s.exposed_s, 3) << " s exposed\n";
    }
    std::cout << "MFU: static " << (st ? format_fixed(100 * st->mfu(*run.cluster), 1) + "%" : "-") << ", hot-switched "
              << format_fixed(100 * sw->mfu(*run.cluster), 1) << "%\n";
  }
  return (st && !st->fits) || (sw && !sw->fits) ? 1 : 0;
}

namespace {

// --groups, or powers of two from 1K up to --max-len; the last bound is --max-len.
std::vector<std::int64_t> group_bounds(const po::variables_map& vm, std::int64_t max_len) {
  std::vector<std::int64_t> bounds;
  if (vm.count("groups")) {
    bounds = token_list(vm["groups"].as<std::string>(), "--groups");
  } else {
    // Powers of two from 1K (from half the longest length when that is shorter, so a short one still has two groups).
    for (std::int64_t b = std::max<std::int64_t>(1, std::min<std::int64_t>(1024, max_len / 2)); b < max_len; b *= 2) bounds.push_back(b);
    bounds.push_back(max_len);
  }
  if (bounds.back() != max_len)
    throw InputError("--groups", "value", "a last bound equal to --max-len (" + format_tokens(max_len) + ")", format_tokens(bounds.back()));
  return bounds;
}

// --executable: only the groups `run --lengths` takes on this device, one rank per GPU.
void keep_runnable_groups(const po::variables_map& vm, LengthsRun& run) {
  if (!vm.count("executable")) return;
  const std::string device = vm["executable"].as<std::string>();
  if (device != "cpu" && device != "gpu") throw InputError("--executable", "value", "cpu or gpu", "\"" + device + "\"");
  run.setting->runnable = [device](const planner::StepInputs& in, const planner::PlanSpec& spec) {
    return run_refusal(in, spec, device, in.cluster.gpus()).empty();
  };
  const int ranks = run.cluster->gpus();
  run.setting->runnable_graph = [ranks](const sim::TaskGraph& graph) { return !backend::executor_refusal(graph, ranks); };
}

void print_search_json(const LengthsRun& run, const planner::HotSpaSearchReport& report, const std::optional<ResumeFile>& resume) {
  nlohmann::json out = header_json(run);
  out["simulated"] = report.simulated;
  if (resume) out["reused_from_resume"] = resume->reused();
  if (!report.best_static.empty()) out["static"] = planner::minibatch_json(report.static_result, *run.cluster);
  if (!report.best_switched.empty()) {
    out["switched"] = planner::minibatch_json(report.switched_result, *run.cluster);
    out["switch"] = planner::switch_text(report.best_switched);
  }
  std::cout << out.dump(2) << "\n";
}

// The best static and hot-switched plans and the seed's Table 3; exit 1 when either has none.
int print_search_text(const po::variables_map& vm, const LengthsRun& run, const planner::HotSpaSearchReport& report,
                      const std::optional<ResumeFile>& resume) {
  print_header(run);
  if (report.best_static.empty() || report.best_switched.empty()) {
    const bool no_static = report.best_static.empty();
    const std::string& why = (no_static ? report.static_result : report.switched_result).failure;
    std::cout << "no " << (no_static ? "static" : "hot-switched") << " plan fits"
              << (!why.empty() ? ": the best-bounded candidate's " + why
                  : no_static  ? " (no configuration passed the memory bounds)"
                               : " (no chain of groups that fit covers every length)")
              << "\n";
    return 1;
  }
  std::cout << "best static: " << report.best_static.front().spec.scheme << " " << report.best_static.front().spec.summary() << "\n"
            << "best hot-switched: " << planner::describe(report.best_switched) << "\n"
            << "  as run --lengths takes it: --switch \"" << planner::switch_text(report.best_switched) << "\"\n"
            << report.simulated << " group simulations"
            << (resume ? " (" + std::to_string(resume->reused()) + " taken from --resume " + vm["resume"].as<std::string>() + ")" : "") << "\n\n"
            << planner::table3(report.static_result, report.switched_result);
  print_failure("hot-switched", report.switched_result);
  return 0;
}

}  // namespace

int run_plan_lengths(const po::variables_map& vm, const std::vector<std::string>& schemes) {
  LengthsRun run;
  load_hardware(vm, run);
  load(vm, run, vm.count("max-len") ? parse_token_count(vm["max-len"].as<std::string>(), "--max-len") : 0);
  const std::vector<std::int64_t> bounds = group_bounds(vm, run.max_len);
  keep_runnable_groups(vm, run);
  planner::HotSpaSearchOptions options;
  options.schemes = schemes;
  options.bounds = bounds;
  options.per_group = vm["per-group"].as<int>();
  if (options.per_group < 1) throw InputError("--per-group", "value", "a positive integer", std::to_string(options.per_group));
  // Under mpirun, rank 0 searches and the other ranks simulate its range jobs (app/plan_farm.hpp).
  const std::unique_ptr<PlanFarm> ranks = PlanFarm::join(rank_timeout(vm));
  std::optional<planner::RangeSimulator> simulator;
  if (ranks) {
    simulator.emplace(*run.setting, run.lengths, options);
    if (!ranks->root()) {
      try {
        return ranks->serve_ranges(*simulator);
      } catch (const std::exception& e) {
        ranks->abort_after(e);
      }
    }
    options.farm = ranks->range_farm(*simulator);
  }
  std::optional<ResumeFile> resume;  // the farm refers to it
  if (vm.count("resume")) {
    resume.emplace(vm["resume"].as<std::string>(), lengths_inputs_key(vm, run, bounds));
    if (!simulator) simulator.emplace(*run.setting, run.lengths, options);
    if (!options.farm) options.farm = [&here = *simulator](const std::vector<planner::RangeJob>& jobs) { return here.run(jobs); };
    options.farm = resume->wrap_ranges(options.farm);
  }
  const bool json = vm["json"].as<bool>();
  // On a terminal only; nothing when stderr is piped (common/progress.hpp).
  Progress progress("HotSPa search", !json);
  options.progress = [&](std::size_t done, std::size_t total) { progress.update(done, total, "group simulations"); };
  const planner::HotSpaSearchReport report = planner::search_hotspa(*run.setting, run.lengths, options);
  progress.finish();
  if (!json) return print_search_text(vm, run, report, resume);
  print_search_json(run, report, resume);
  return !report.best_static.empty() && !report.best_switched.empty() ? 0 : 1;
}

}  // namespace trainyard::app
