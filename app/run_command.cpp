// `trainyard run --plan plan.json`: executes a plan's step with real tensors. So far on the CPU reference
// executor (backend/reference_step.hpp): small models, the chunked-vs-unchunked check and training curves. The
// CUDA executor that runs the same graph on GPUs is not written yet (backend/README.md), and says so.
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "backend/model_state.hpp"
#include "backend/reference_step.hpp"
#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/plan.hpp"
#include "sim/report.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

namespace {

// The CPU references are plain loops: about a GFLOP/s. Larger steps would take minutes each.
constexpr double kCpuStepFlopLimit = 5e9;
// --check: the chunked step against the unchunked one, with bf16 storage in both (rounding differs with the cut).
constexpr double kLossTolerance = 2e-3;      // relative
constexpr double kGradientTolerance = 0.03;  // of each gradient block's largest entry (backend::max_gradient_difference)

// The plan's step without chunks or offload: one chunk per sequence, K/V and activations in HBM, on the same
// rings. What `--check` compares against.
planner::PlanSpec unchunked(const planner::PlanSpec& spec, std::int64_t seq_len) {
  planner::PlanSpec plain = spec;
  plain.ringtrack.chunk = seq_len;
  plain.ringtrack.kv = planner::Placement::hbm;
  plain.ringtrack.acts = planner::ActivationPolicy::hbm;
  plain.ringtrack.weights = planner::WeightPolicy::resident;
  plain.ringtrack.states = planner::Placement::hbm;
  return plain;
}

}  // namespace

int run_run(const std::vector<std::string>& args) {
  po::options_description options("run options");
  options.add_options()
      ("plan", po::value<std::string>()->value_name("path"), "plan file (trainyard plan --out, or written by hand: examples/)")
      ("device", po::value<std::string>()->default_value("gpu")->value_name("gpu|cpu"),
       "gpu: the CUDA executor (not written yet); cpu: the CPU reference executor, small models only")
      ("steps", po::value<int>()->default_value(1)->value_name("int"), "optimizer steps to run (AdamW after each)")
      ("check", po::bool_switch(), "compare the plan's loss and gradients with the unchunked step on the same weights and tokens")
      ("text", po::value<std::string>()->value_name("path"), "train on this file's bytes (byte-level tokens; the model's vocab must be >= 256); default: random tokens")
      ("seed", po::value<std::uint64_t>()->default_value(1)->value_name("int"), "seed of the weights (and of random tokens)")
      ("lr", po::value<float>()->default_value(1e-3f)->value_name("float"), "AdamW learning rate")
      ("loss-curve", po::value<std::string>()->value_name("path"), "write step,loss,seconds as CSV")
      ("json", po::bool_switch(), "print the result as JSON");
  po::positional_options_description positional;
  po::variables_map vm;
  if (parse(args, "trainyard run --plan FILE [--device gpu|cpu] [--steps N] [--check] [--text FILE] [--loss-curve FILE] [--json]", options,
            positional, vm)) {
    return 0;
  }
  if (!vm.count("plan")) throw InputError("--plan", "value", "a plan file", "nothing");
  const std::string device = vm["device"].as<std::string>();
  if (device != "gpu" && device != "cpu") throw InputError("--device", "value", "gpu or cpu", "\"" + device + "\"");
  if (device == "gpu") {
    throw InputError("--device", "value",
                     "cpu for now: the CUDA executor that runs plans on GPUs is not written yet (issue 8 is in progress: backend/README.md)",
                     "gpu");
  }
  const int steps = vm["steps"].as<int>();
  if (steps < 1 || steps > 100000) throw InputError("--steps", "value", "1 to 100000", std::to_string(steps));
  const std::string origin = vm["plan"].as<std::string>();

  const LoadedPlan l = load_plan(origin);
  if (l.plan.spec.scheme != "ringtrack") {
    throw InputError(origin, "scheme", "ringtrack (the scheme whose tasks say what they compute, so far)", "\"" + l.plan.spec.scheme + "\"");
  }
  const auto& workload = l.plan.workload;
  const double flops = l.model.training_flops_per_token(workload.seq_len, true) * static_cast<double>(workload.tokens());
  if (flops > kCpuStepFlopLimit) {
    throw InputError(origin, "model", "a small model for --device cpu (at most " + format_fixed(kCpuStepFlopLimit / 1e9, 0) + " GFLOP per step)",
                     format_fixed(flops / 1e9, 1) + " GFLOP per step");
  }
  std::optional<std::string> text;
  if (vm.count("text")) {
    text = vm["text"].as<std::string>();
    if (l.model.vocab < 256) throw InputError(origin, "model", "a vocab of at least 256 for byte-level --text", std::to_string(l.model.vocab));
  }
  const std::uint64_t seed = vm["seed"].as<std::uint64_t>();
  auto tokens_for = [&](int step) {
    if (text) return backend::text_windows(*text, workload.seq_len, workload.global_batch, static_cast<std::int64_t>(step) * workload.tokens());
    return backend::random_windows(l.model.vocab, workload.seq_len, workload.global_batch, seed + 1000003ull * static_cast<std::uint64_t>(step));
  };
  const sim::TaskGraph graph = build_plan_step(l, l.plan.spec, origin);
  const int gpus_per_node = l.cluster->topology.gpus_per_node();
  const bool as_json = vm["json"].as<bool>();
  Json out = {{"plan", origin}, {"device", "cpu"}, {"summary", l.plan.spec.summary()}};

  if (vm["check"].as<bool>()) {
    const auto tokens = tokens_for(0);
    backend::ModelState chunked(l.model, seed), plain(l.model, seed);
    const auto a = backend::run_reference_step(graph, chunked, l.plan.spec.ringtrack.chunk, gpus_per_node, tokens);
    const sim::TaskGraph plain_graph = build_plan_step(l, unchunked(l.plan.spec, workload.seq_len), origin + " (unchunked)");
    const auto b = backend::run_reference_step(plain_graph, plain, workload.seq_len, gpus_per_node, tokens);
    const double loss_error = std::abs(a.loss - b.loss) / std::abs(b.loss);
    const double grad_error = backend::max_gradient_difference(chunked, plain);
    const bool pass = loss_error <= kLossTolerance && grad_error <= kGradientTolerance;
    out["check"] = {{"loss", a.loss}, {"unchunked_loss", b.loss}, {"loss_relative_error", loss_error},
                    {"gradient_max_error_relative_per_block", grad_error}, {"loss_tolerance", kLossTolerance},
                    {"gradient_tolerance", kGradientTolerance}, {"reads_checked", a.reads_checked},
                    {"race_checked", a.race_checked}, {"pass", pass}};
    if (as_json) {
      std::cout << out.dump(2) << "\n";
    } else {
      std::cout << "plan           " << l.plan.spec.summary() << " (" << graph.size() << " tasks, CPU reference executor)\n"
                << "loss           " << format_fixed(a.loss, 6) << " chunked, " << format_fixed(b.loss, 6) << " unchunked: relative error "
                << loss_error << " (tolerance " << kLossTolerance << ")\n"
                << "gradients      largest difference " << grad_error << " of the block's largest entry, worst block (tolerance " << kGradientTolerance << ")\n"
                << "dataflow       " << a.reads_checked << " reads checked: every tensor where the plan put it, latest, "
                << (a.race_checked ? "and ordered by the graph" : "(order not checked: graph too large)") << "\n"
                << "check          " << (pass ? "PASS" : "FAIL") << "\n";
    }
    return pass ? 0 : 1;
  }

  backend::ModelState state(l.model, seed);
  backend::ReferenceOptions o;
  o.run_optimizer = true;
  o.adam.lr = vm["lr"].as<float>();
  Json curve = Json::array();
  std::string csv = "step,loss,seconds\n";
  for (int s = 1; s <= steps; ++s) {
    o.optimizer_step = s;
    const auto start = std::chrono::steady_clock::now();
    const auto r = backend::run_reference_step(graph, state, l.plan.spec.ringtrack.chunk, gpus_per_node, tokens_for(s - 1), o);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    curve.push_back({{"step", s}, {"loss", r.loss}, {"seconds", seconds}});
    csv += std::to_string(s) + "," + format_fixed(r.loss, 6) + "," + format_fixed(seconds, 3) + "\n";
    if (!as_json) std::cout << "step " << s << "  loss " << format_fixed(r.loss, 4) << "  (" << format_fixed(seconds, 2) << " s)\n";
  }
  if (vm.count("loss-curve")) {
    sim::write_file_atomically(vm["loss-curve"].as<std::string>(), [&](std::ostream& file) { file << csv; });
  }
  if (as_json) {
    out["steps"] = curve;
    std::cout << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace trainyard::app
