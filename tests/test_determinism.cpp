// The same command gives the same bytes: `plan --json` and the traces of `plan --trace` and `simulate --trace`
// across two runs and across 1, 2 and 8 search threads.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace trainyard::test {

namespace {

// A small search: about 200 plans simulated, two seconds.
const std::string kPlan = "plan --model custom:layers=4,hidden=256,heads=4,kv_heads=4,vocab=1024 --hw dgx-a100 --seq 32K --global-batch 8";

struct Output {
  std::string stdout_text, trace;
};

Output plan(int threads, const TempDir& dir) {
  const std::string trace = (dir.path() / ("plan-" + std::to_string(threads) + ".json")).string();
  const auto r = run_cli(kPlan + " --json --threads " + std::to_string(threads) + " --trace " + trace);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return {r.out, read_file(trace)};
}

}  // namespace

TEST(Determinism, PlanJsonAndTraceAreByteIdenticalAcrossRunsAndThreadCounts) {
  TempDir dir;
  const Output first = plan(1, dir);
  ASSERT_FALSE(first.stdout_text.empty());
  ASSERT_GT(first.trace.size(), 1000u);
  EXPECT_NE(first.stdout_text.find("\"ranked\""), std::string::npos);
  for (int threads : {1, 2, 8}) {
    const Output again = plan(threads, dir);
    EXPECT_TRUE(again.stdout_text == first.stdout_text) << "plan --json differs with --threads " << threads;
    EXPECT_TRUE(again.trace == first.trace) << "plan --trace differs with --threads " << threads;
  }
}

TEST(Determinism, SimulateTraceIsByteIdenticalAcrossRuns) {
  TempDir dir;
  const std::string plan_file = (dir.path() / "plan.json").string();
  const auto p = run_cli(kPlan + " --threads 2 --out " + plan_file);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  std::string traces[2], outputs[2];
  for (int i = 0; i < 2; ++i) {
    const std::string trace = (dir.path() / ("sim-" + std::to_string(i) + ".json")).string();
    const auto r = run_cli("simulate --plan " + plan_file + " --json --trace " + trace + " --trace-gpus all");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    traces[i] = read_file(trace);
    outputs[i] = r.out;
  }
  ASSERT_GT(traces[0].size(), 1000u);
  EXPECT_TRUE(traces[0] == traces[1]) << "simulate --trace differs between two runs";
  EXPECT_TRUE(outputs[0] == outputs[1]) << "simulate --json differs between two runs";
}

}  // namespace trainyard::test
