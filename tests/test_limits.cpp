// Bounded work: every command estimates what it will build and refuses, quickly and with exit 2, what
// would exceed the memory budget; the estimate is a real count of what the builders make; Ctrl-C exits 130 and
// leaves no temporary files; progress never writes '\r' when stderr is not a terminal.
//
// The CLI runs here under an address-space limit and a timeout, so that a regression fails the test instead of
// eating the machine.
#include <gtest/gtest.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>

#include "common/error.hpp"
#include "common/memory_budget.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/estimate.hpp"
#include "planner/search.hpp"
#include "test_support.hpp"

namespace trainyard {
namespace {

constexpr rlim_t kAddressSpaceLimitBytes = rlim_t{4} << 30;

// AddressSanitizer reserves terabytes of address space for its shadow memory and cannot start under that limit: in
// the ASan build (scripts/sanitize.sh) the CLI runs without it; the normal build holds the limit.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSpaceLimited = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSpaceLimited = false;
#else
constexpr bool kAddressSpaceLimited = true;
#endif
#else
constexpr bool kAddressSpaceLimited = true;
#endif

struct LimitedRun {
  int exit_code = -1;  // -1: killed (timeout or signal)
  double seconds = 0;
  std::string out, err;
};

// Runs the CLI with `args` (no shell: one string per argument) under the address-space limit; `interrupt_after_s`
// > 0 sends SIGINT that long after the start. Killed after `timeout_s`.
LimitedRun run_limited(const std::vector<std::string>& args, double timeout_s = 30, double interrupt_after_s = 0) {
  test::TempDir dir;
  const std::string out = (dir.path() / "out").string(), err = (dir.path() / "err").string();
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    const rlimit limit{kAddressSpaceLimitBytes, kAddressSpaceLimitBytes};
    if (kAddressSpaceLimited) setrlimit(RLIMIT_AS, &limit);
    if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(127);
    std::vector<char*> argv{const_cast<char*>(TRAINYARD_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(TRAINYARD_BINARY, argv.data());
    _exit(127);
  }
  LimitedRun r;
  bool interrupted = false;
  int status = 0;
  for (;;) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (interrupt_after_s > 0 && !interrupted && elapsed >= interrupt_after_s) {
      kill(pid, SIGINT);
      interrupted = true;
    }
    if (elapsed > timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = test::read_file(out);
  r.err = test::read_file(err);
  return r;
}

// Refused before building: exit 2 within a few seconds (under a second on an idle machine; the slack is for a
// loaded CI box), naming the budget and the estimate.
void expect_refused(const std::vector<std::string>& args) {
  std::string line;
  for (const auto& a : args) line += a + " ";
  const LimitedRun r = run_limited(args);
  EXPECT_EQ(r.exit_code, 2) << line << "\n" << r.err;
  EXPECT_LT(r.seconds, 5.0) << line;
  EXPECT_NE(r.err.find("--memory-budget"), std::string::npos) << line << "\n" << r.err;
  EXPECT_NE(r.err.find("estimated"), std::string::npos) << line << "\n" << r.err;
}

TEST(Limits, HugeBatchIsRefusedQuickly) {
  // Grew to 18 GB and was killed by the kernel.
  expect_refused({"plan", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--seq", "64K", "--global-batch", "1000000000"});
}

TEST(Limits, HugeClusterIsRefusedQuickly) {
  // Passed 6 GB in a minute, then aborted ("terminate called without an active exception").
  expect_refused({"plan", "--model", "llama3-70b", "--hw", "dgx-h100", "--nodes", "100000", "--seq", "1M", "--global-batch", "800000"});
}

TEST(Limits, HugeSequencesAreRefusedQuickly) {
  // Spun for over 10 minutes in the bounds phase; then, until megatron's memory bound counted activations, took
  // 86 s simulating megatron candidates that could never fit.
  expect_refused({"plan", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--seq", "1G"});
  expect_refused({"plan", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--seq", "1000000000000"});
}

TEST(Limits, SimulateAStrategyOrPlanTooLargeIsRefused) {
  expect_refused({"simulate", "--strategy", "megatron", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--seq", "64K", "--global-batch", "1000000000",
                  "--tp", "8"});
  expect_refused(
      {"simulate", "--strategy", "ringtrack", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--seq", "1G", "--global-batch", "1", "--chunk", "1K"});
  test::TempDir dir;
  const std::string plan = dir.write("huge.plan.json", R"({"format": "trainyard.plan.v1", "model": "llama3.2-1b", "hw": "dgx-a100",
    "nodes": 1, "precision": "bf16-mixed", "workload": {"seq_len": 65536, "global_batch": 1000000000}, "scheme": "ringtrack",
    "parameters": {"ring": 8, "block": 1, "chunk": 4096, "prefetch": 2, "kv": "dram", "acts": "dram", "weights": "resident",
                   "states": "hbm", "ring_order": []}})");
  const LimitedRun r = run_limited({"simulate", "--plan", plan});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--memory-budget"), std::string::npos) << r.err;
}

TEST(Limits, LengthsTooManyTokensAreRefused) {
  expect_refused({"simulate", "--lengths", "dist:github", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--tokens-per-step", "1000000000000",
                  "--max-len", "8K", "--static", "megatron:tp=8"});
  expect_refused({"plan", "--lengths", "dist:github", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--tokens-per-step", "1000000000000", "--max-len",
                  "4K", "--strategies", "megatron"});
}

TEST(Limits, ARaisedBudgetIsHonoured) {
  // The same command is refused under a small budget and runs under the default one.
  const std::vector<std::string> args{"simulate", "--strategy", "megatron",       "--model", "llama3.2-1b", "--hw", "dgx-a100",
                                      "--seq",    "4K",         "--global-batch", "64",      "--tp",        "8"};
  auto small = args;
  small.insert(small.end(), {"--memory-budget", "1M"});
  EXPECT_EQ(run_limited(small).exit_code, 2);
  EXPECT_EQ(run_limited(args).exit_code, 0);
  auto bad = args;
  bad.insert(bad.end(), {"--memory-budget", "lots"});
  const LimitedRun r = run_limited(bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--memory-budget"), std::string::npos) << r.err;
}

TEST(Limits, MemorySizesParse) {
  EXPECT_EQ(parse_memory_size("8G", "--memory-budget"), std::int64_t{8} << 30);
  EXPECT_EQ(parse_memory_size("512M", "--memory-budget"), std::int64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1.5GiB", "--memory-budget"), std::int64_t{3} << 29);
  EXPECT_THROW(parse_memory_size("8X", "--memory-budget"), InputError);
  EXPECT_THROW(parse_memory_size("-1G", "--memory-budget"), InputError);
  EXPECT_THROW(parse_memory_size("1K", "--memory-budget"), InputError);  // below a MiB: surely a mistake
  // "1GB" is decimal to some and binary to others: refused, naming both spellings that are not ambiguous (issue 45).
  const std::string ambiguous = test::error_of([] { parse_memory_size("1GB", "--bytes"); });
  EXPECT_NE(ambiguous.find("1G or 1GiB"), std::string::npos) << ambiguous;
  EXPECT_NE(ambiguous.find("--bytes"), std::string::npos) << ambiguous;
  EXPECT_EQ(parse_memory_size("1e9", "--bytes"), 1000000000);
  EXPECT_GT(default_memory_budget_bytes(), 0);
  EXPECT_LE(default_memory_budget_bytes(), kDefaultBudgetCapBytes);
}

// The estimate against the graphs the builders make: within a factor of 2 for every scheme's configurations.
TEST(Limits, EstimateCountsWhatTheBuildersMake) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=256,heads=4,kv_heads=4,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/ring-node.json"), 1, test::ideal_stack());
  std::map<std::string, int> checked;
  for (const planner::Workload w : {planner::Workload{32768, 4}, planner::Workload{65536, 8}, planner::Workload{131072, 4}}) {
    const planner::StepInputs in{m, c, w, model::precision_policy("bf16-mixed")};
    const auto specs = planner::enumerate_plans(in, planner::scheme_names());
    for (std::size_t i = 0; i < specs.size(); i += 5) {
      const double estimate = planner::estimate_plan(in, specs[i]).tasks;
      const double built = static_cast<double>(planner::build_plan(in, specs[i]).size());
      EXPECT_GE(estimate, built / 2) << specs[i].scheme << ": " << specs[i].summary() << " at " << w.seq_len << " x " << w.global_batch;
      EXPECT_LE(estimate, built * 2) << specs[i].scheme << ": " << specs[i].summary() << " at " << w.seq_len << " x " << w.global_batch;
      ++checked[specs[i].scheme];
    }
  }
  for (const auto& scheme : planner::scheme_names()) EXPECT_GT(checked[scheme], 0) << scheme;
}

// What building, finalizing and simulating `spec` holds at its peak, measured by the allocator (heap blocks in use
// and mmapped ones); the engine's own state is gone when simulate() returns, so its reported size is added to what
// the graph and the result still hold then. Sets `tasks` to the graph's size.
double held_bytes(const planner::StepInputs& in, const planner::PlanSpec& spec, double& tasks) {
  const auto in_use = [] {
    const auto info = mallinfo2();
    return info.uordblks + info.hblkhd;
  };
  malloc_trim(0);
  const std::size_t before = in_use();
  std::size_t peak = 0;
  {
    sim::TaskGraph g = planner::build_plan(in, spec);
    g.finalize();
    tasks = static_cast<double>(g.size());
    sim::SimOptions o;
    o.record_memory = false;
    o.record_links = false;
    const sim::SimResult r = sim::simulate(g, in.cluster, o);
    peak = in_use() + r.engine_bytes;
    EXPECT_TRUE(r.completed || r.oom) << r.stuck;
  }
  return static_cast<double>(peak - before);
}

// The bytes per task: what a built graph and its simulation hold stays within the estimate, for every scheme's
// largest configuration here (thousands to half a million tasks).
TEST(Limits, BytesPerTaskCoverABuiltAndSimulatedGraph) {
  const model::ModelConfig m = model::load_model("llama3.2-1b", "model");
  const sim::Cluster c(hw::load_node("dgx-a100", "hw"), 1);
  const planner::StepInputs in{m, c, {65536, 8}, model::precision_policy("bf16-mixed")};
  std::map<std::string, planner::PlanSpec> largest;  // per scheme, the configuration of most estimated tasks
  std::map<std::string, double> largest_tasks;
  for (const planner::PlanSpec& spec : planner::enumerate_plans(in, planner::scheme_names())) {
    const double tasks = planner::estimate_plan(in, spec).tasks;
    if (tasks <= 1.5e6 && tasks > largest_tasks[spec.scheme]) {
      largest_tasks[spec.scheme] = tasks;
      largest[spec.scheme] = spec;
    }
  }
  for (const auto& scheme : planner::scheme_names()) {
    ASSERT_TRUE(largest.count(scheme)) << scheme;
    const planner::PlanSpec& spec = largest.at(scheme);
    double tasks = 0;
    const double held = held_bytes(in, spec, tasks);
    EXPECT_GT(tasks, 5000) << scheme;
    EXPECT_LE(held, tasks * planner::kBytesPerTask) << scheme << " " << spec.summary() << ": " << held / tasks << " bytes per task";
    EXPECT_LE(held, planner::estimate_plan(in, spec).bytes * 2) << scheme;
    std::cout << scheme << " " << spec.summary() << ": " << tasks << " tasks, " << held / tasks << " bytes per task\n";
  }
}

TEST(Limits, TheSearchSkipsCandidatesOverTheBudget) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=256,heads=4,kv_heads=4,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/ring-node.json"), 1, test::ideal_stack());
  const planner::StepInputs in{m, c, {65536, 4}, model::precision_policy("bf16-mixed")};
  planner::SearchOptions o;
  o.schemes = {"ringtrack"};
  o.memory_budget_bytes = 8 << 20;  // the smallest chunks' graphs do not fit
  const auto report = planner::search(in, o);
  EXPECT_GT(report.over_budget, 0u);
  EXPECT_LT(report.over_budget, report.enumerated);
  o.memory_budget_bytes = 4096;  // no graph is this small
  try {
    planner::search(in, o);
    FAIL() << "no refusal";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--memory-budget"), std::string::npos) << e.what();
  }
}

// --- Ctrl-C -------------------------------------------------------------------------------------------------

TEST(Interrupt, PlanStopsWith130AndLeavesNoTemporaryFiles) {
  test::TempDir dir;
  const std::string out = (dir.path() / "best.plan.json").string();
  const LimitedRun r = run_limited(
      {"plan", "--model", "llama3-8b", "--hw", "dgx-h100", "--nodes", "2", "--seq", "256K", "--threads", "1", "--out", out}, 60, 1.5);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_LT(r.seconds, 20) << "the search did not stop soon after Ctrl-C";
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

TEST(Interrupt, LengthsSearchStopsWith130) {
  // A search of about 18 s here, of many short simulations (at 4M tokens the refit GitHub lengths finish inside 1.5 s).
  const LimitedRun r = run_limited({"plan", "--lengths", "dist:github", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--tokens-per-step", "64M",
                                    "--max-len", "32K", "--threads", "1"},
                                   60, 1.5);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_LT(r.seconds, 20);
}

// --- progress -------------------------------------------------------------------------------------------------

TEST(Progress, NoCarriageReturnWhenStderrIsNotATerminal) {
  const LimitedRun lengths = run_limited({"plan", "--lengths", "dist:github", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--tokens-per-step",
                                          "128K", "--max-len", "4K", "--strategies", "megatron", "--per-group", "1"});
  EXPECT_EQ(lengths.exit_code, 0) << lengths.err;
  EXPECT_EQ(lengths.err.find('\r'), std::string::npos) << lengths.err;
  const LimitedRun plan = run_limited({"plan", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--seq", "32K", "--strategies", "megatron,zero"});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(plan.err.find('\r'), std::string::npos) << plan.err;
}

}  // namespace
}  // namespace trainyard
