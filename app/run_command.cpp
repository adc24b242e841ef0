// `trainyard run --plan plan.json`: executes a plan's step with real tensors.
//   - The executor (backend/executor.hpp, one rank per GPU) on a device: the measured step against the simulator's
//     prediction and the measured trace. --device gpu: the CUDA device, and --check against the CPU reference
//     (run on one H100 and one H200: benchmarks/results/gpu.md). --device cpu: the CPU device (streams as threads), small models.
//   - The CPU reference executor (backend/reference_step.hpp): small models, the chunked-vs-unchunked check
//     (--check) and training on plans the executor does not run yet, on one rank or, under mpirun, one rank per
//     GPU of the plan (backend/mpi_communicator.hpp). Untimed.
//   - --lengths --switch instead of --plan: HotSPa's mini-batch, each length group on the executor under its own
//     strategy, the states switched between them (backend/hotspa_step.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/report.hpp"
#include "backend/cpu_device.hpp"
#include "backend/executor.hpp"
#include "backend/hotspa_step.hpp"
#include "backend/measured.hpp"
#include "backend/model_state.hpp"
#include "backend/mpi_communicator.hpp"
#include "backend/reference_step.hpp"
#include "sim/compare.hpp"
#include "sim/engine.hpp"
#ifdef TRAINYARD_HAVE_CUDA
#include "backend/device_info.hpp"
#endif
#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/interrupt.hpp"
#include "common/json_reader.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "planner/plan.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/switching.hpp"
#include "sim/report.hpp"
#include "stacks/collective_library.hpp"
#include "stacks/stack_profile.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

namespace {

// The CPU references are plain loops: about a GFLOP/s. Larger steps would take minutes each.
constexpr double kCpuStepFlopLimit = 5e9;
// --loss-curve: the steps' CSV, written by rank 0 (also when Ctrl-C stops the run: the steps done).
void write_loss_curve(const po::variables_map& vm, bool root, const std::string& csv) {
  if (root && vm.count("loss-curve")) write_file_atomically(vm["loss-curve"].as<std::string>(), [&](std::ostream& file) { file << csv; });
}

// --check: the chunked step against the unchunked one, with bf16 storage in both (rounding differs with the cut).
constexpr double kLossTolerance = 2e-3;      // relative
constexpr double kGradientTolerance = 0.03;  // of each gradient block's largest entry (backend::max_gradient_difference)
constexpr float kMaxLearningRate = 1.0f;

// The verdict of every --check: a step's loss and gradients against the step it is checked with (the CPU
// reference, the unchunked step, the groups' unchunked steps). One set of JSON keys; the older per-case names
// ("unchunked_loss"; "gpu_loss" and "cpu_loss") are still written beside them for one release.
struct CheckVerdict {
  double loss = 0, reference_loss = 0;
  double gradient_error = 0;              // of each block's largest entry, the worst block (NaN: a slice never delivered)
  std::string loss_name, reference_name;  // how the text names the two steps: "GPU", "CPU reference"
  bool worst_block = true;                // the text says the gradient error is the worst block's

  double loss_error() const { return std::abs(loss - reference_loss) / std::abs(reference_loss); }
  bool pass() const { return loss_error() <= kLossTolerance && gradient_error <= kGradientTolerance; }
  Json json() const {
    return {{"loss", loss},
            {"reference_loss", reference_loss},
            {"loss_relative_error", loss_error()},
            {"gradient_max_error_relative_per_block", gradient_error},
            {"loss_tolerance", kLossTolerance},
            {"gradient_tolerance", kGradientTolerance},
            {"pass", pass()}};
  }
  void print_loss_and_gradients(std::ostream& out) const {
    out << "loss           " << format_fixed(loss, 6) << " " << loss_name << ", " << format_fixed(reference_loss, 6) << " " << reference_name
        << ": relative error " << loss_error() << " (tolerance " << kLossTolerance << ")\n"
        << "gradients      largest difference " << gradient_error << " of the block's largest entry" << (worst_block ? ", worst block" : "")
        << " (tolerance " << kGradientTolerance << ")\n";
  }
  void print_result(std::ostream& out) const { out << "check          " << (pass() ? "PASS" : "FAIL") << "\n"; }
};

// What `--check` compares the plan's step with: the scheme's own step without chunks or offload, or for schemes
// without one the plain data-parallel step (planner::RunFacet::unchunked).
planner::PlanSpec unchunked(const planner::PlanSpec& spec, std::int64_t seq_len) {
  const planner::Scheme& scheme = planner::scheme_named(spec.scheme);
  if (scheme.run && scheme.run->unchunked) return scheme.run->unchunked(spec, seq_len);
  const planner::Scheme& ringtrack = planner::scheme_named("ringtrack");  // rings of one GPU: data parallelism alone
  return ringtrack.run->unchunked(ringtrack.blank(), seq_len);
}

}  // namespace

std::string run_refusal(const planner::StepInputs& in, const planner::PlanSpec& spec, const std::string& device, int ranks) {
  const planner::Scheme& scheme = planner::scheme_named(spec.scheme);
  const bool cpu = device == "cpu";
  if (!scheme.run) {
    std::string runnable;
    for (const auto& name : planner::scheme_names()) {
      if (planner::scheme_named(name).run) runnable += (runnable.empty() ? "" : " or ") + name;
    }
    return "scheme " + runnable + " (the schemes whose tasks say what they compute, so far)";
  }
  if (std::string needs = scheme.run->refusal(in, spec, ranks); !needs.empty()) return needs + " to run with real tensors";
  if (cpu) {
    const double flops = in.model.training_flops_per_token(in.workload.seq_len, true) * static_cast<double>(in.workload.tokens());
    if (flops > kCpuStepFlopLimit) {
      return "a small model for --device cpu (at most " + format_fixed(kCpuStepFlopLimit / 1e9, 0) + " GFLOP per step; this step is " +
             format_fixed(flops / 1e9, 1) + " GFLOP)";
    }
  } else if (in.cluster.gpus() != ranks) {
    return "one GPU for --device gpu, or under mpirun one rank per GPU (" + std::to_string(ranks) + " rank" + (ranks == 1 ? "" : "s") +
           "; this plan has " + std::to_string(in.cluster.gpus()) + ")";
  }
  return "";
}

namespace {

// Each step's tokens: the text's next windows (the file read once, with its size cap), or seeded random ones.
class StepTokens {
 public:
  StepTokens(const LoadedPlan& l, const po::variables_map& vm) : loaded_(l), seed_(vm["seed"].as<std::uint64_t>()) {
    if (vm.count("text")) {
      text_path_ = vm["text"].as<std::string>();
      text_ = read_input_file(text_path_, kTextFileCapBytes, "a text file to train on");
    }
  }
  // Step `step` (0-based).
  std::vector<std::vector<std::int32_t>> operator()(int step) const {
    const auto& w = loaded_.plan.workload;
    if (!text_path_.empty()) return backend::text_windows(text_, text_path_, w.seq_len, w.global_batch, static_cast<std::int64_t>(step) * w.tokens());
    return backend::random_windows(loaded_.model.vocab, w.seq_len, w.global_batch, seed_ + 1000003ull * static_cast<std::uint64_t>(step));
  }

 private:
  const LoadedPlan& loaded_;
  std::uint64_t seed_;
  std::string text_path_;  // empty: random tokens
  std::string text_;
};

// The cluster the measured step is predicted on: the plan's nodes (or --hw's node, e.g. the ranks of this machine
// as `mpirun -np N trainyard calibrate --device cpu` measured them) under the `trainyard` stack (this executor's
// kernels and memory, whatever stack the plan names for other engines), with --gpu-profile's GPU (a profile
// `trainyard calibrate` wrote on this device) when given.
sim::Cluster executor_cluster(const LoadedPlan& l, const po::variables_map& vm) {
  hw::NodeProfile node = l.cluster->node;
  if (vm.count("hw")) {
    node = hw::load_node(vm["hw"].as<std::string>(), "--hw");
    if (node.gpu_count() < l.cluster->devices_per_node) {
      throw InputError("--hw", "value",
                       "a node of at least the plan's " + std::to_string(l.cluster->devices_per_node) +
                           " GPUs per node (calibrate under mpirun -np " + std::to_string(l.cluster->devices_per_node) + " or more)",
                       "\"" + node.name + "\" with " + std::to_string(node.gpu_count()));
    }
  }
  if (vm.count("gpu-profile")) node.gpu = hw::load_gpu(vm["gpu-profile"].as<std::string>(), "--gpu-profile");
  return sim::Cluster(node, l.cluster->topology.node_count(), stacks::load_stack("trainyard", "run's prediction"), l.cluster->devices_per_node);
}

int run_measured(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm, sim::TaskGraph graph, backend::Device& device,
                 const std::string& label, bool cpu_can_check, backend::Communicator* comm = nullptr);

// The plan's step (`graph`, as built) as the executor runs it, predicted on executor_cluster.
struct PredictedStep {
  sim::TaskGraph graph;
  sim::Cluster cluster;
  sim::SimResult result;
};
PredictedStep predict_step(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm, sim::TaskGraph graph) {
  graph.finalize();
  sim::Cluster cluster = executor_cluster(l, vm);
  std::optional<stacks::CollectiveLibrary> library;
  if (vm.count("collectives")) library = stacks::load_collective_library(vm["collectives"].as<std::string>(), "--collectives");
  sim::SimOptions options;
  options.collectives = library ? &*library : nullptr;
  sim::SimResult result = sim::simulate(graph, cluster, options);
  if (!result.completed)
    throw InputError(origin, "plan", "a plan the simulator can complete (trainyard simulate --plan says why not)", "one it cannot");
  return {std::move(graph), std::move(cluster), std::move(result)};
}

int run_on_gpu(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm, bool cpu_can_check) {
#ifndef TRAINYARD_HAVE_CUDA
  (void)l, (void)origin, (void)vm, (void)cpu_can_check;
  throw InputError("--device", "value", "cpu (this trainyard was built without CUDA: TRAINYARD_CUDA=OFF)", "gpu");
#else
  const auto found = backend::query_cuda_devices();
  if (found.devices.empty()) throw InputError("--device", "value", "cpu: there is no usable CUDA GPU here (" + found.reason + ")", "gpu");
  const auto device = backend::make_cuda_device();
  return run_measured(l, origin, vm, build_plan_step(l, l.plan.spec, origin, nullptr, memory_budget(vm)), *device, found.devices.front().name,
                      cpu_can_check);
#endif
}

// Several ranks: every rank's timings of its own tasks, on rank 0, as one step's (the ranks' origin events follow
// one barrier, so their clocks agree to its exit's spread); the memory of the rank with the highest peak.
void merge_ranks(backend::MeasuredStep& step, const sim::TaskGraph& graph, backend::Communicator& comm, int gpus_per_node) {
  std::vector<int> everyone(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) everyone[static_cast<std::size_t>(r)] = r;
  const std::size_t n = step.timing.size();
  // Origin-relative microseconds per task, then the memory: arena, states, scratch (one gather for all of it).
  std::vector<float> mine(2 * n + 3, -1.0f);
  for (std::size_t t = 0; t < n; ++t) {
    if (step.timing[t].start_ns < 0) continue;
    mine[2 * t] = static_cast<float>(static_cast<double>(step.timing[t].start_ns + step.first_task_ns) * 1e-3);
    mine[2 * t + 1] = static_cast<float>(static_cast<double>(step.timing[t].end_ns + step.first_task_ns) * 1e-3);
  }
  mine[2 * n] = static_cast<float>(step.arena_bytes);
  mine[2 * n + 1] = static_cast<float>(step.states_bytes);
  mine[2 * n + 2] = static_cast<float>(step.scratch_peak_bytes);
  const std::vector<float> all = comm.all_gather(everyone, mine);
  auto at = [&](int rank, std::size_t i) { return all[static_cast<std::size_t>(rank) * (2 * n + 3) + i]; };
  double first = 1e300, last = 0;
  for (std::size_t t = 0; t < n; ++t) {
    // The rank of the task's GPU (host tasks: the node's first rank), else any rank that timed it.
    const sim::DeviceId d = graph.task(static_cast<sim::TaskId>(t)).device;
    int owner = sim::is_host(d) ? sim::host_node(d) * gpus_per_node : d;
    if (owner >= comm.size() || at(owner, 2 * t) < 0) {
      owner = -1;
      for (int r = 0; r < comm.size() && owner < 0; ++r) owner = at(r, 2 * t) >= 0 ? r : -1;
    }
    if (owner < 0) {
      step.timing[t] = {};
      step.timing[t].start_ns = step.timing[t].end_ns = -1;
      continue;
    }
    step.timing[t].start_ns = static_cast<std::int64_t>(std::llround(at(owner, 2 * t) * 1e3));
    step.timing[t].end_ns = static_cast<std::int64_t>(std::llround(at(owner, 2 * t + 1) * 1e3));
    first = std::min(first, static_cast<double>(step.timing[t].start_ns));
    last = std::max(last, static_cast<double>(step.timing[t].end_ns));
  }
  for (auto& t : step.timing) {
    if (t.start_ns >= 0) t.start_ns -= static_cast<std::int64_t>(first), t.end_ns -= static_cast<std::int64_t>(first);
  }
  step.step_ns = static_cast<std::int64_t>(last - first);
  auto peak = [&](int r) { return at(r, 2 * n) + at(r, 2 * n + 1) + at(r, 2 * n + 2); };
  int highest = 0;
  for (int r = 1; r < comm.size(); ++r) highest = peak(r) > peak(highest) ? r : highest;
  step.arena_bytes = static_cast<std::int64_t>(at(highest, 2 * n));
  step.states_bytes = static_cast<std::int64_t>(at(highest, 2 * n + 1));
  step.scratch_peak_bytes = static_cast<std::int64_t>(at(highest, 2 * n + 2));
}

// The measured steps beside the prediction: JSON, or the text and the per-class comparison.
int report_measured(const po::variables_map& vm, const PredictedStep& step, const backend::MeasuredStep& last, const sim::SimResult& measured,
                    const sim::Comparison& comparison, Json& out) {
  const sim::SimResult& predicted = step.result;
  const sim::Cluster& predicting = step.cluster;
  const bool as_json = vm["json"].as<bool>();
  const double step_s = static_cast<double>(last.step_ns) * 1e-9;
  const double exposed = static_cast<double>(measured.exposed_transfer_ns.empty() ? 0 : measured.exposed_transfer_ns.front());
  out["measured"] = {{"step_ns", last.step_ns},
                     {"tokens_per_s", static_cast<double>(last.tokens) / step_s},
                     {"mfu", measured.mfu()},
                     {"exposed_copy_ns", exposed},
                     {"peak_hbm_bytes", last.peak_hbm_bytes()},
                     {"arena_bytes", last.arena_bytes},
                     {"live_peak_bytes", last.live_peak_bytes},
                     {"states_bytes", last.states_bytes},
                     {"scratch_peak_bytes", last.scratch_peak_bytes},
                     {"pinned_bytes", last.pinned_bytes},
                     {"device_used_bytes", last.device_used_bytes}};
  out["predicted"] = {{"step_ns", predicted.step_ns},   {"mfu", predicted.mfu()},       {"peak_hbm_bytes", predicted.pools.front().peak_bytes},
                      {"stack", predicting.stack.name}, {"node", predicting.node.name}, {"gpu_profile", predicting.node.gpu.name}};
  out["comparison"] = sim::comparison_json(comparison);
  if (as_json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "predicted on   the " << predicting.stack.name << " stack (this executor), node " << predicting.node.name << ", GPU profile "
            << predicting.node.gpu.name << (vm.count("collectives") ? ", collectives " + vm["collectives"].as<std::string>() : std::string()) << "\n";
  std::cout << "measured       " << format_fixed(step_s * 1e3, 2) << " ms per step (predicted "
            << format_fixed(static_cast<double>(predicted.step_ns) * 1e-6, 2) << "), " << format_fixed(static_cast<double>(last.tokens) / step_s, 0)
            << " tokens/s, MFU " << format_fixed(100 * measured.mfu(), 1) << "% (predicted " << format_fixed(100 * predicted.mfu(), 1) << "%)\n"
            << "exposed copy   " << format_fixed(exposed * 1e-6, 2) << " ms ("
            << format_fixed(100 * exposed / static_cast<double>(std::max<std::int64_t>(last.step_ns, 1)), 1) << "% of the step)\n"
            << "peak HBM       " << format_bytes(static_cast<double>(last.peak_hbm_bytes())) << " (tensor arena "
            << format_bytes(static_cast<double>(last.arena_bytes)) << ", states " << format_bytes(static_cast<double>(last.states_bytes))
            << ", scratch " << format_bytes(static_cast<double>(last.scratch_peak_bytes)) << "; predicted "
            << format_bytes(static_cast<double>(predicted.pools.front().peak_bytes)) << ")\n\n";
  sim::print_comparison(std::cout, comparison);
  return 0;
}

// --check on the GPU: one step against the CPU reference on the same weights and tokens.
int check_against_reference(const LoadedPlan& l, backend::Executor& executor, backend::ModelState& state, const sim::TaskGraph& graph,
                            const std::vector<std::vector<std::int32_t>>& tokens, std::uint64_t seed, bool as_json, Json& out) {
  const backend::MeasuredStep g = executor.run_step(tokens);
  backend::ModelState on_gpu(l.model, seed);
  executor.download(on_gpu);
  const auto r = backend::run_reference_step(graph, state, l.cluster->topology.gpus_per_node(), tokens);
  const CheckVerdict verdict{g.loss, r.loss, backend::max_gradient_difference(on_gpu, state), "GPU", "CPU reference", false};
  out["check"] = verdict.json();
  out["check"]["gpu_loss"] = g.loss;  // the older names, for one release
  out["check"]["cpu_loss"] = r.loss;
  if (as_json) {
    std::cout << out.dump(2) << "\n";
  } else {
    verdict.print_loss_and_gradients(std::cout);
    verdict.print_result(std::cout);
  }
  return verdict.pass() ? 0 : 1;
}

// The executor on `device` (the CUDA device, or the CPU device: streams as threads): steps measured with the
// device's events against the simulator's prediction, or with --check (GPU) one step against the CPU reference.
// With `comm`, one rank per GPU (data parallelism): rank 0 reports the ranks' merged timeline.
int run_measured(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm, sim::TaskGraph plan_graph, backend::Device& device,
                 const std::string& label, bool cpu_can_check, backend::Communicator* comm) {
  const bool check = vm["check"].as<bool>();
  if (check && !cpu_can_check) {
    throw InputError(
        origin, "model",
        "a small model for --check (the CPU reference runs the same step; at most " + format_fixed(kCpuStepFlopLimit / 1e9, 0) + " GFLOP per step)",
        "a larger one");
  }
  const int warmup = vm["warmup"].as<int>(), steps = vm["steps"].as<int>();
  const PredictedStep step = predict_step(l, origin, vm, std::move(plan_graph));
  const sim::TaskGraph& graph = step.graph;
  const sim::SimResult& predicted = step.result;
  const std::uint64_t seed = vm["seed"].as<std::uint64_t>();
  const int gpn = l.cluster->topology.gpus_per_node();
  backend::ModelState state(l.model, seed);
  backend::ExecutorOptions options;
  options.run_optimizer = !check;
  options.adam.lr = vm["lr"].as<float>();
  options.comm = comm;
  options.comm_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(vm["comm-timeout"].as<double>() * 1000));
  backend::Executor executor(device, graph, state, gpn, predicted.timing, options);
  executor.upload(state);
  const bool as_json = vm["json"].as<bool>(), root = comm == nullptr || comm->rank() == 0;
  Json out = {{"plan", origin}, {"device", label}, {"executor", "schedule"}, {"summary", l.plan.spec.summary()}};
  const StepTokens step_tokens(l, vm);
  auto run_step = [&](int s) {  // step s (0-based), AdamW's t = s + 1
    backend::MeasuredStep m = executor.run_step(step_tokens(s), s + 1);
    if (comm != nullptr) merge_ranks(m, graph, *comm, gpn);
    return m;
  };
  if (comm != nullptr) out["ranks"] = comm->size();

  if (check) {
    TRAINYARD_CHECK(comm == nullptr, "--check on GPU ranks is refused before");
    return check_against_reference(l, executor, state, graph, step_tokens(0), seed, as_json, out);
  }

  std::string csv = "step,loss,seconds\n";  // --loss-curve: every step, the warm-up ones too
  for (int s = 0; s < warmup; ++s) {
    const backend::MeasuredStep w = run_step(s);
    csv += std::to_string(s + 1) + "," + format_fixed(w.loss, 6) + "," + format_fixed(static_cast<double>(w.step_ns) * 1e-9, 6) + "\n";
  }
  backend::MeasuredStep last;
  Json measured_steps = Json::array();
  const auto write_curve = [&] { write_loss_curve(vm, root, csv); };
  try {
    for (int s = 0; s < steps; ++s) {
      if (interrupted()) throw Interrupted();
      last = run_step(warmup + s);
      measured_steps.push_back({{"loss", last.loss}, {"step_ns", last.step_ns}});
      csv += std::to_string(warmup + s + 1) + "," + format_fixed(last.loss, 6) + "," + format_fixed(static_cast<double>(last.step_ns) * 1e-9, 6) +
             "\n";
      if (!as_json && root)
        std::cout << "step " << s + 1 << "  loss " << format_fixed(last.loss, 4) << "  " << format_fixed(static_cast<double>(last.step_ns) * 1e-6, 2)
                  << " ms\n";
    }
  } catch (const Interrupted&) {
    write_curve();  // Ctrl-C (between steps or inside one): the steps done are written before the run stops
    throw;
  }
  if (!root) return 0;
  out["steps"] = measured_steps;
  write_curve();
  const sim::SimResult measured = backend::measured_result(predicted, graph, last.timing, last.step_ns, last.peak_hbm_bytes());
  if (const auto trace = trace_request(vm, l.cluster->gpus())) write_trace(*trace, measured, graph, *l.cluster, "measured");
  const sim::Comparison comparison = sim::compare(sim::to_timeline(predicted, graph, "simulated"), sim::to_timeline(measured, graph, "measured"));
  return report_measured(vm, step, last, measured, comparison, out);
}

// Every number and file flag, before any work: a bad one must not cost a training run or its results.
void check_run_flags(const po::variables_map& vm, const std::string& device) {
  const int steps = vm["steps"].as<int>(), warmup = vm["warmup"].as<int>();
  if (steps < 1 || steps > 100000) throw InputError("--steps", "value", "1 to 100000", std::to_string(steps));
  if (warmup < 0 || warmup > 1000) throw InputError("--warmup", "value", "0 to 1000", std::to_string(warmup));
  // AdamW's step is lr times a normalised update: beyond 1 every weight moves by its own size each step.
  const float lr = vm["lr"].as<float>();
  if (!(std::isfinite(lr) && lr > 0 && lr <= kMaxLearningRate)) {
    throw InputError("--lr", "value", "a learning rate in (0, " + format_number(kMaxLearningRate) + "]", format_number(lr));
  }
  const bool check = vm["check"].as<bool>();
  // Flags the chosen path would ignore: an output that never appears, or a setting that changes nothing.
  const auto refuse = [](const std::string& flag, const std::string& expected) { throw InputError(flag, "value", expected, "given"); };
  (void)device;
  if (vm.count("trace") && check) refuse("--trace", "a run without --check (the measured step's trace)");
  if (vm.count("loss-curve") && check) refuse("--loss-curve", "a run without --check");
  if (!vm["warmup"].defaulted() && check) refuse("--warmup", "a run without --check");
  if (!vm["steps"].defaulted() && check) refuse("--steps", "no --steps with --check (it runs one step)");
  if (!vm["lr"].defaulted() && check) refuse("--lr", "no --lr with --check (no optimizer step is taken)");
  const double timeout_s = vm["comm-timeout"].as<double>();
  if (!(timeout_s > 0 && timeout_s <= 86400)) throw InputError("--comm-timeout", "value", "seconds in (0, 86400]", format_number(timeout_s));
  if (!vm["comm-timeout"].defaulted() && !backend::MpiSession::launched_by_mpirun())
    refuse("--comm-timeout", "a run under mpirun (one rank has no one to wait for)");
  if (vm.count("text")) check_input_file(vm["text"].as<std::string>(), kTextFileCapBytes, "a text file to train on");
  // The prediction's profiles load before anything runs; an error names the flag that gave the file.
  const auto loads = [&](const char* flag, const std::function<void(const std::string&)>& load) {
    if (!vm.count(flag)) return;
    try {
      load(vm[flag].as<std::string>());
    } catch (const InputError& e) {
      const std::string what = e.what();
      if (what.find(std::string("--") + flag) != std::string::npos) throw;
      throw InputError("--" + std::string(flag) + ": " + what);
    }
  };
  loads("hw", [](const std::string& v) { hw::load_node(v, "--hw"); });
  loads("gpu-profile", [](const std::string& v) { hw::load_gpu(v, "--gpu-profile"); });
  loads("collectives", [](const std::string& v) { stacks::load_collective_library(v, "--collectives"); });
  check_output_flags(vm, {"trace", "loss-curve"});
  if (!vm.count("trace")) trace_request(vm, 0);  // the trace flags without --trace are refused
}

int run_on_cpu(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm, backend::Communicator* comm);
int run_switched(const po::variables_map& vm, const std::string& device);
std::unique_ptr<backend::Device> make_rank_device(const std::string& kind, int rank);
void fall_back_to_reference(const po::variables_map& vm, const backend::ExecutorRefusal& refusal, bool root);

}  // namespace

namespace {

// --lengths: the groups' steps of run --lengths (rows of each group's row length) for mini-batch `step` (0-based):
// the text's next windows, or seeded random ones.
std::vector<std::vector<std::vector<std::int32_t>>> switched_tokens(const SwitchedMinibatch& sm, const po::variables_map& vm, const std::string& text,
                                                                    int step) {
  std::vector<std::vector<std::vector<std::int32_t>>> out;
  std::int64_t per_step = 0;
  for (const auto& g : sm.groups) per_step += g.workload.tokens();
  std::int64_t offset = static_cast<std::int64_t>(step) * per_step;
  const std::uint64_t seed = vm["seed"].as<std::uint64_t>();
  for (std::size_t k = 0; k < sm.groups.size(); ++k) {
    const auto& w = sm.groups[k].workload;
    if (vm.count("text")) {
      out.push_back(backend::text_windows(text, vm["text"].as<std::string>(), w.seq_len, w.global_batch, offset));
    } else {
      out.push_back(
          backend::random_windows(sm.model.vocab, w.seq_len, w.global_batch, seed + 1000003ull * static_cast<std::uint64_t>(step) + 7919 * k));
    }
    offset += w.tokens();
  }
  return out;
}

// Each group's strategy must run on the executor at these ranks: the same refusals as run --plan, naming the group.
void refuse_unrunnable_groups(SwitchedMinibatch& sm, const std::string& device, int ranks) {
  for (auto& g : sm.groups) {
    const std::string group = "--switch: group " + format_tokens(g.lo) + "~" + format_tokens(g.hi);
    const planner::StepInputs in{sm.model, *sm.cluster, g.workload, sm.precision};
    if (const std::string needs = run_refusal(in, g.spec, device, ranks); !needs.empty()) {
      throw InputError(group, g.spec.scheme, needs, g.spec.summary());
    }
    g.graph.finalize();
    if (const auto refusal = backend::executor_refusal(g.graph, ranks)) throw InputError(group, refusal->task, refusal->expected, refusal->found);
  }
}

// --check of run --lengths: the accumulated gradients gathered to rank 0 by one more switch (the home layout to
// everything on rank 0), and there compared with each group's unchunked step on one rank, summed by tokens.
int check_switched(const SwitchedMinibatch& sm, const po::variables_map& vm, backend::ModelState& state, const backend::HotSpaStepResult& r,
                   const std::vector<std::vector<std::vector<std::int32_t>>>& tokens, backend::Communicator* comm, Json& out) {
  const int gpn = sm.cluster->topology.gpus_per_node();
  if (comm != nullptr) {
    backend::gather_switched(state, backend::executor_layout(sm.groups.back().graph, sm.model), gpn, *comm);
    if (comm->rank() != 0) return 0;
  }
  std::vector<sim::TaskGraph> plain;
  for (const auto& g : sm.groups) {
    const planner::StepInputs in{sm.model, *sm.cluster, g.workload, sm.precision};
    plain.push_back(planner::build_plan(in, unchunked(g.spec, g.workload.seq_len)));
  }
  std::vector<backend::HotSpaGroupRun> runs;
  for (std::size_t k = 0; k < plain.size(); ++k) runs.push_back({&plain[k], tokens[k]});
  backend::ModelState reference(sm.model, vm["seed"].as<std::uint64_t>());
  const double expected = backend::hotspa_reference_step(runs, reference, gpn, 1, false, {});
  const CheckVerdict verdict{r.loss, expected, backend::max_gradient_difference(state, reference), "switched groups", "the groups' unchunked steps"};
  out["check"] = verdict.json();
  out["check"]["unchunked_loss"] = expected;  // the older name, for one release
  if (vm["json"].as<bool>()) {
    std::cout << out.dump(2) << "\n";
  } else {
    verdict.print_loss_and_gradients(std::cout);
    verdict.print_result(std::cout);
  }
  return verdict.pass() ? 0 : 1;
}

// The last mini-batch of run --lengths against the prediction: each group's step (rank 0's device timing: its first
// task's start to its last task's end), the switches (this rank's wall time, the prediction's exposed time) and the
// mini-batch (wall time, with each group's executor set up; the prediction has no set-up).
void report_switched(const SwitchedMinibatch& sm, const backend::HotSpaStepResult& last, double minibatch_s, bool as_json, Json& out) {
  const planner::MinibatchResult& p = sm.predicted;
  Json groups = Json::array();
  for (std::size_t k = 0; k < sm.groups.size(); ++k) {
    const auto& g = sm.groups[k];
    groups.push_back({{"lo", g.lo},
                      {"hi", g.hi},
                      {"scheme", g.spec.scheme},
                      {"summary", g.spec.summary()},
                      {"rows", g.workload.global_batch},
                      {"row_len", g.workload.seq_len},
                      {"measured_step_ns", last.group_step_ns[k]},
                      {"predicted_s", p.groups[k].time_s}});
  }
  out["groups"] = groups;
  out["switches"] = {{"sent_bytes", last.sent_bytes},
                     {"planned_param_bytes", last.planned_param_bytes},
                     {"planned_grad_bytes", last.planned_grad_bytes},
                     {"measured_ns", last.switch_ns},
                     {"predicted_exposed_s", p.others_s}};
  out["minibatch"] = {{"measured_s", minibatch_s},
                      {"predicted_s", p.total_s},
                      {"predicted_fits", p.fits},
                      {"predicted_failure", p.failure},
                      {"gpu_profile", sm.cluster->node.gpu.name}};
  if (as_json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  const auto ms = [](double s) { return format_fixed(s * 1e3, 2) + " ms"; };
  if (!p.fits) std::cout << "prediction     the mini-batch does not fit on " << sm.cluster->node.name << ": " << p.failure << "\n";
  std::cout << "predicted on   the trainyard stack, " << sm.cluster->node.name << ", GPU profile " << sm.cluster->node.gpu.name
            << (sm.collectives ? ", collectives " + sm.collectives->name : std::string()) << "\n";
  for (std::size_t k = 0; k < sm.groups.size(); ++k) {
    const auto& g = sm.groups[k];
    std::cout << "group " << format_tokens(g.lo) << "~" << format_tokens(g.hi) << "  " << g.spec.scheme << " " << g.spec.summary() << ", "
              << g.workload.global_batch << " rows of " << format_tokens(g.workload.seq_len) << ": "
              << ms(static_cast<double>(last.group_step_ns[k]) * 1e-9) << " (predicted " << ms(p.groups[k].time_s) << ")\n";
  }
  std::cout << "switches       " << ms(static_cast<double>(last.switch_ns) * 1e-9) << " (predicted exposed " << ms(p.others_s) << "), "
            << format_bytes(static_cast<double>(last.sent_bytes)) << " sent over the ranks (fp32 values; plan_switch at the executors' layouts: "
            << format_bytes(static_cast<double>(last.planned_param_bytes)) << " bf16 parameters, "
            << format_bytes(static_cast<double>(last.planned_grad_bytes)) << " fp32 gradients)\n"
            << "mini-batch     " << ms(minibatch_s) << " (predicted " << ms(p.total_s) << "; measured with each group's executor set up)\n";
}

// The groups' steps of a mini-batch on `tokens` (switched_tokens).
std::vector<backend::HotSpaGroupRun> switched_runs(const SwitchedMinibatch& sm, const std::vector<std::vector<std::vector<std::int32_t>>>& tokens) {
  std::vector<backend::HotSpaGroupRun> runs;
  for (std::size_t k = 0; k < sm.groups.size(); ++k) runs.push_back({&sm.groups[k].graph, tokens[k]});
  return runs;
}

// --steps mini-batches of training: the loss of each (rank 0 prints it), --loss-curve, and the last one against the
// prediction.
int train_switched(const SwitchedMinibatch& sm, const po::variables_map& vm, const std::string& text, backend::Device& device,
                   backend::ModelState& state, const backend::HotSpaOptions& o, Json& out) {
  const bool root = o.comm == nullptr || o.comm->rank() == 0, as_json = vm["json"].as<bool>();
  std::string csv = "step,loss,seconds\n";
  Json steps = Json::array();
  backend::HotSpaStepResult last;
  double seconds = 0;
  const auto write_curve = [&] { write_loss_curve(vm, root, csv); };
  try {
    for (int s = 1; s <= vm["steps"].as<int>(); ++s) {
      if (interrupted()) throw Interrupted();
      const auto tokens = switched_tokens(sm, vm, text, s - 1);
      const auto start = std::chrono::steady_clock::now();
      last = backend::run_hotspa_step(device, switched_runs(sm, tokens), state, sm.cluster->topology.gpus_per_node(), s, o);
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      steps.push_back({{"loss", last.loss},
                       {"seconds", seconds},
                       {"switch_s", static_cast<double>(last.switch_ns) * 1e-9},
                       {"group_step_ns", last.group_step_ns}});
      csv += std::to_string(s) + "," + format_fixed(last.loss, 6) + "," + format_fixed(seconds, 6) + "\n";
      if (root && !as_json) {
        std::cout << "mini-batch " << s << "  loss " << format_fixed(last.loss, 4) << "  " << format_fixed(seconds * 1e3, 1) << " ms (switches "
                  << format_fixed(static_cast<double>(last.switch_ns) * 1e-6, 1) << " ms)\n";
      }
    }
  } catch (const Interrupted&) {
    write_curve();  // Ctrl-C (between mini-batches or inside one): the ones done are written before the run stops
    throw;
  }
  if (!root) return 0;
  write_curve();
  out["steps"] = steps;
  report_switched(sm, last, seconds, as_json, out);
  return 0;
}

// run --lengths --switch (HotSPa, backend/hotspa_step.hpp): every group's step on the executor, the switches as
// messages between the ranks, one update per mini-batch, against the mini-batch simulated on --hw's nodes under the
// executor's stack (--gpu-profile, --collectives: e.g. what calibrate --device cpu wrote); --check compares one mini-batch's loss
// and accumulated gradients with the groups' unchunked steps on one rank.
int run_switched(const po::variables_map& vm, const std::string& device) {
  if (vm.count("trace")) throw InputError("--trace", "value", "none with --lengths (a HotSPa run is not traced yet)", "given");
  if (!vm["warmup"].defaulted()) throw InputError("--warmup", "value", "none with --lengths (every mini-batch is measured)", "given");
  const bool check = vm["check"].as<bool>();
  SwitchedMinibatch sm = load_switched_minibatch(vm, !check);
  refuse_unrunnable_groups(sm, device, backend::MpiSession::world_size_from_environment());
  if (vm.count("text") && sm.model.vocab < 256)
    throw InputError("--model", "vocab", "at least 256 for byte-level --text", std::to_string(sm.model.vocab));
  const std::string text = vm.count("text") ? read_input_file(vm["text"].as<std::string>(), kTextFileCapBytes, "a text file to train on") : "";
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(vm["comm-timeout"].as<double>() * 1000));
  backend::MpiSession mpi;
  std::optional<backend::MpiCommunicator> comm;
  if (mpi.active()) comm.emplace(timeout);
  try {
    const auto rank_device = make_rank_device(device, comm ? comm->rank() : 0);
    backend::HotSpaOptions o;
    o.comm = comm ? &*comm : nullptr;
    o.update = !check;
    o.adam.lr = vm["lr"].as<float>();
    o.comm_timeout = timeout;
    backend::ModelState state(sm.model, vm["seed"].as<std::uint64_t>());
    Json out = {{"lengths", vm["lengths"].as<std::string>()}, {"device", device}, {"sequences", sm.sequences}};
    if (check) {
      const auto tokens = switched_tokens(sm, vm, text, 0);
      const auto r = backend::run_hotspa_step(*rank_device, switched_runs(sm, tokens), state, sm.cluster->topology.gpus_per_node(), 1, o);
      return check_switched(sm, vm, state, r, tokens, o.comm, out);
    }
    return train_switched(sm, vm, text, *rank_device, state, o, out);
  } catch (const std::exception& e) {
    if (!comm || comm->size() == 1) throw;
    backend::MpiSession::abort_all_after(e, comm->rank(), comm->size());
  }
}

// What a run goes through when the executor cannot take the plan: the untimed CPU reference. The flags only the
// executor honours are refused (they would be ignored), and rank 0 says why the executor did not take it.
void fall_back_to_reference(const po::variables_map& vm, const backend::ExecutorRefusal& refusal, bool root) {
  for (const char* flag : {"trace", "warmup", "gpu-profile", "hw", "collectives"}) {
    if (vm.count(flag) && !vm[flag].defaulted()) {
      throw InputError("--" + std::string(flag), "value", "a plan the executor runs (" + refusal.expected + ")",
                       refusal.task + ": " + refusal.found + "; the CPU reference executor runs it, untimed");
    }
  }
  if (root && !vm["json"].as<bool>()) {
    std::cout << "executor       CPU reference, untimed (the executor does not run " << refusal.task << ": " << refusal.found << ")\n";
  }
}

// This rank's device: the CPU device, or the GPU of the rank's index among the visible ones (NCCL: NOT YET RUN ON
// GPUs).
std::unique_ptr<backend::Device> make_rank_device(const std::string& kind, int rank) {
  if (kind == "cpu") return backend::make_cpu_device();
#ifdef TRAINYARD_HAVE_CUDA
  const auto found = backend::query_cuda_devices();
  if (found.devices.empty()) throw InputError("--device", "value", "cpu: there is no usable CUDA GPU here (" + found.reason + ")", "gpu");
  return backend::make_cuda_device(found.devices[static_cast<std::size_t>(rank) % found.devices.size()].index);
#else
  (void)rank;
  throw InputError("--device", "value", "cpu (this trainyard was built without CUDA: TRAINYARD_CUDA=OFF)", "gpu");
#endif
}

// The CPU reference executor: one rank with everything, or under mpirun this rank's GPU (rank 0 prints).
int run_on_cpu(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm, backend::Communicator* comm) {
  const auto& workload = l.plan.workload;
  const int steps = vm["steps"].as<int>();
  const bool root = comm == nullptr || comm->rank() == 0;
  const std::uint64_t seed = vm["seed"].as<std::uint64_t>();
  const sim::TaskGraph graph = build_plan_step(l, l.plan.spec, origin, nullptr, memory_budget(vm));
  const int gpus_per_node = l.cluster->topology.gpus_per_node();
  const bool as_json = vm["json"].as<bool>();
  Json out = {{"plan", origin}, {"device", "cpu"}, {"summary", l.plan.spec.summary()}};
  const StepTokens step_tokens(l, vm);

  if (vm["check"].as<bool>()) {
    const auto tokens = step_tokens(0);
    backend::ModelState chunked(l.model, seed), plain(l.model, seed);
    backend::ReferenceOptions distributed;
    distributed.comm = comm;
    const auto a = backend::run_reference_step(graph, chunked, gpus_per_node, tokens, distributed);
    if (comm != nullptr) backend::gather_to_rank0(graph, chunked, *comm);
    if (!root) return 0;  // rank 0 compares and reports
    // The unchunked step on this one rank, every GPU's tasks here.
    const sim::TaskGraph plain_graph = build_plan_step(l, unchunked(l.plan.spec, workload.seq_len), origin + " (unchunked)", nullptr,
                                                       memory_budget(vm));
    const auto b = backend::run_reference_step(plain_graph, plain, gpus_per_node, tokens);
    const auto& run = planner::scheme_named(l.plan.spec.scheme).run;
    const bool own = run && run->unchunked;  // else the plain data-parallel step
    const CheckVerdict verdict{a.loss, b.loss, backend::max_gradient_difference(chunked, plain), own ? "chunked" : "this plan",
                               own ? "unchunked" : "plain data-parallel step"};
    out["check"] = verdict.json();
    out["check"]["unchunked_loss"] = b.loss;  // the older name, for one release
    out["check"]["reads_checked"] = a.reads_checked;
    out["check"]["race_checked"] = a.race_checked;
    if (as_json) {
      std::cout << out.dump(2) << "\n";
    } else {
      std::cout << "plan           " << l.plan.spec.summary() << " (" << graph.size() << " tasks, CPU reference executor"
                << (comm != nullptr ? ", " + std::to_string(comm->size()) + " ranks" : std::string()) << ")\n";
      verdict.print_loss_and_gradients(std::cout);
      std::cout << "dataflow       " << a.reads_checked << " reads checked" << (comm != nullptr ? " on rank 0" : "")
                << ": every tensor where the plan put it, latest, "
                << (a.race_checked ? "and ordered by the graph" : "(order not checked: graph too large)") << "\n";
      verdict.print_result(std::cout);
    }
    return verdict.pass() ? 0 : 1;
  }

  backend::ModelState state(l.model, seed);
  backend::ReferenceOptions o;
  o.comm = comm;
  o.run_optimizer = true;
  o.adam.lr = vm["lr"].as<float>();
  Json curve = Json::array();
  std::string csv = "step,loss,seconds\n";
  for (int s = 1; s <= steps; ++s) {
    if (interrupted()) {  // Ctrl-C: stop between steps; the steps done are reported (and written) below
      std::cerr << "interrupted after " << s - 1 << " of " << steps << " steps\n";
      break;
    }
    o.optimizer_step = s;
    const auto start = std::chrono::steady_clock::now();
    const auto r = backend::run_reference_step(graph, state, gpus_per_node, step_tokens(s - 1), o);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    curve.push_back({{"step", s}, {"loss", r.loss}, {"seconds", seconds}});
    csv += std::to_string(s) + "," + format_fixed(r.loss, 6) + "," + format_fixed(seconds, 3) + "\n";
    if (!as_json && root) std::cout << "step " << s << "  loss " << format_fixed(r.loss, 4) << "  (" << format_fixed(seconds, 2) << " s)\n";
  }
  if (!root) return interrupted() ? kInterruptedExitCode : 0;
  if (vm.count("loss-curve")) {
    write_file_atomically(vm["loss-curve"].as<std::string>(), [&](std::ostream& file) { file << csv; });
  }
  if (as_json) {
    out["steps"] = curve;
    out["interrupted"] = interrupted();
    std::cout << out.dump(2) << "\n";
  }
  return interrupted() ? kInterruptedExitCode : 0;
}

}  // namespace

namespace {

po::options_description run_options() {
  po::options_description options("run options");
  // clang-format off
  options.add_options()
      ("plan", po::value<std::string>()->value_name("path"), "plan file (trainyard plan --out, or written by hand: examples/)")
      ("device", po::value<std::string>()->default_value("gpu")->value_name("gpu|cpu"),
       "gpu: the executor on the CUDA device (one GPU; under mpirun one rank per GPU, NCCL not yet run on GPUs); cpu: small models only, the same executor on the CPU device (streams as threads) "
       "where it runs the plan (under mpirun -np N one rank per GPU, sends and collectives over MPI), else the CPU reference executor (several GPUs on one process, FPDT; no timing)")
      ("warmup", po::value<int>()->default_value(1)->value_name("int"), "the executor: steps run before the measured ones (not measured)")
      ("trace", po::value<std::string>()->value_name("path"), "the executor: write the last measured step as a Chrome trace (trainyard compare reads it)")
      ("gpu-profile", po::value<std::string>()->value_name("name|path"),
       "the executor: predict with this device profile (e.g. one `trainyard calibrate` wrote here) instead of the plan node's GPU; the prediction always uses the trainyard stack")
      ("hw", po::value<std::string>()->value_name("name|path"),
       "the executor: predict on this node profile instead of the plan's (e.g. the NAME-node.json `mpirun -np N trainyard calibrate --device cpu` wrote); with --lengths: the cluster's node")
      ("collectives", po::value<std::string>()->value_name("name|path"),
       "the executor: predict collectives with this library (e.g. the NAME-mpi.json calibrate wrote) instead of NCCL's")
      ("steps", po::value<int>()->default_value(1)->value_name("int"), "optimizer steps to run (AdamW after each)")
      ("check", po::bool_switch(), "compare the plan's loss and gradients with the unchunked step on the same weights and tokens")
      ("text", po::value<std::string>()->value_name("path"), "train on this file's bytes (byte-level tokens; the model's vocab must be >= 256); default: random tokens")
      ("seed", po::value<std::uint64_t>()->default_value(1)->value_name("int"), "seed of the weights (and of random tokens)")
      ("lr", po::value<float>()->default_value(1e-3f)->value_name("float"), "AdamW learning rate")
      ("loss-curve", po::value<std::string>()->value_name("path"), "write step,loss,seconds as CSV")
      ("json", po::bool_switch(), "print the result as JSON")
      ("comm-timeout", po::value<double>()->default_value(300)->value_name("seconds"),
       "under mpirun: the longest any rank waits for a message or a collective before the run stops with an error")
      ("lengths", po::value<std::string>()->value_name("dist:NAME|FILE"),
       "instead of --plan: HotSPa, a mini-batch of these lengths (as simulate --lengths draws it) run group by group under --switch's strategies, the states switched between them")
      ("switch", po::value<std::string>()->value_name("UPPER=SCHEME:k=v,...;..."), "with --lengths: each length group's strategy")
      ("model", po::value<std::string>()->value_name("name|path"), "with --lengths: the model")
      ("nodes", po::value<int>()->value_name("int"), "with --lengths: nodes of --hw's node (default 1)")
      ("tokens-per-step", po::value<std::string>()->value_name("tokens"), "with --lengths: the mini-batch's tokens")
      ("max-len", po::value<std::string>()->value_name("tokens"), "with --lengths: longest sequence (default: the last group bound)")
      ("batch-sequences", po::value<std::int64_t>()->value_name("int"), "with --lengths: the mini-batch's documents (instead of --tokens-per-step)")
      ("batching", po::value<std::string>()->default_value("packing")->value_name("packing|padding|ffd-padded"),
       "with --lengths: rows packed, padded, or packed first-fit decreasing into padded rows (simulate --help)")
      ("micro-batch-tokens", po::value<std::string>()->default_value("16K")->value_name("tokens"), "with --lengths: micro-batch size for strategies that give none")
      ("precision", po::value<std::string>()->default_value("bf16-mixed")->value_name("name"), "with --lengths: precision policy");
  // clang-format on
  add_memory_budget_option(options);
  add_trace_options(options);
  return options;
}

// The plan file, refused by name when this device (at this many MPI ranks) does not run it.
LoadedPlan load_runnable_plan(const po::variables_map& vm, const std::string& device, const std::string& origin) {
  LoadedPlan l = load_plan(origin, memory_budget(vm));
  const planner::StepInputs inputs{l.model, *l.cluster, l.plan.workload, model::precision_policy(l.plan.precision, origin + ": field 'precision'")};
  if (const std::string needs = run_refusal(inputs, l.plan.spec, device, backend::MpiSession::world_size_from_environment()); !needs.empty()) {
    throw InputError(origin, "plan", needs, l.plan.spec.scheme + ": " + l.plan.spec.summary());
  }
  if (vm.count("text") && l.model.vocab < 256) {
    throw InputError(origin, "model", "a vocab of at least 256 for byte-level --text", std::to_string(l.model.vocab));
  }
  return l;
}

// One process on the CPU: the executor on the CPU device where it runs the plan (timed, as on a GPU); else the
// reference, untimed.
int run_in_this_process(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm) {
  if (!vm["check"].as<bool>()) {
    sim::TaskGraph graph = build_plan_step(l, l.plan.spec, origin, nullptr, memory_budget(vm));
    const auto refusal = backend::executor_refusal(graph);
    if (!refusal) {
      const auto cpu = backend::make_cpu_device();
      return run_measured(l, origin, vm, std::move(graph), *cpu, "cpu", true);
    }
    fall_back_to_reference(vm, *refusal, true);
  }
  return run_on_cpu(l, origin, vm, nullptr);
}

// Under mpirun: the executor, one rank per GPU, where it runs the plan; else the reference, untimed (on GPUs:
// refused). An error on one rank ends them all rather than leave them to their timeouts.
int run_on_ranks(const LoadedPlan& l, const std::string& origin, const po::variables_map& vm, const std::string& device) {
  const double timeout_s = vm["comm-timeout"].as<double>();
  backend::MpiCommunicator comm(std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
  try {
    if (!vm["check"].as<bool>() || device == "gpu") {
      sim::TaskGraph graph = build_plan_step(l, l.plan.spec, origin, nullptr, memory_budget(vm));
      const auto refusal = backend::executor_refusal(graph, comm.size());
      if (refusal && device == "gpu") {
        throw InputError("the plan's task graph", refusal->task, refusal->expected + " (on GPU ranks)", refusal->found);
      }
      if (vm["check"].as<bool>()) throw InputError("--check", "value", "--device cpu under mpirun (GPU ranks: not written)", "given");
      if (!refusal) {
        const auto rank_device = make_rank_device(device, comm.rank());
        return run_measured(l, origin, vm, std::move(graph), *rank_device, device, false, &comm);
      }
      fall_back_to_reference(vm, *refusal, comm.rank() == 0);
    }
    return run_on_cpu(l, origin, vm, &comm);
  } catch (const std::exception& e) {
    if (comm.size() == 1) throw;
    backend::MpiSession::abort_all_after(e, comm.rank(), comm.size());
  }
}

}  // namespace

int run_run(const std::vector<std::string>& args) {
  po::options_description options = run_options();
  po::positional_options_description positional;
  po::variables_map vm;
  if (parse(args,
            "trainyard run --plan FILE [--device gpu|cpu] [--warmup N] [--steps N] [--check] [--text FILE] [--trace FILE] [--gpu-profile P] "
            "[--hw NODE] [--collectives LIB] [--loss-curve FILE] [--comm-timeout S] [--json]",
            options, positional, vm)) {
    return 0;
  }
  const std::string device = vm["device"].as<std::string>();
  if (device != "gpu" && device != "cpu") throw InputError("--device", "value", "gpu or cpu", "\"" + device + "\"");
  check_run_flags(vm, device);
  if (vm.count("lengths")) {
    if (vm.count("plan")) throw InputError("--plan", "value", "none with --lengths (--switch gives the groups' strategies)", "given");
    return run_switched(vm, device);
  }
  for (const char* flag : {"switch", "model", "nodes", "tokens-per-step", "batch-sequences", "max-len"}) {
    if (vm.count(flag)) throw InputError(std::string("--") + flag, "value", "none without --lengths (the plan file gives it)", "given");
  }
  if (!vm.count("plan")) throw InputError("--plan", "value", "a plan file (or --lengths with --switch)", "nothing");
  const std::string origin = vm["plan"].as<std::string>();
  const LoadedPlan l = load_runnable_plan(vm, device, origin);
  if (device == "gpu" && !backend::MpiSession::launched_by_mpirun()) {
    const planner::StepInputs inputs{l.model, *l.cluster, l.plan.workload, model::precision_policy(l.plan.precision)};
    return run_on_gpu(l, origin, vm, run_refusal(inputs, l.plan.spec, "cpu").empty());
  }
  backend::MpiSession mpi;
  if (!mpi.active()) return run_in_this_process(l, origin, vm);
  return run_on_ranks(l, origin, vm, device);
}

}  // namespace trainyard::app
