// The error bar on every prediction (app/error_bars.hpp): the documented rule (same family, the distance, the
// nearest kMaxCases, no bar below kMinCases, the cases' range), the sign of a figure's step-time error,
// the leave-one-out coverage, the recorded table against what validate computes, and the bar in simulate's and
// plan's output.
#include <gtest/gtest.h>

#include "app/error_bars.hpp"
#include "common/error.hpp"
#include "test_support.hpp"

namespace trainyard {
namespace {

using Json = nlohmann::json;
using app::ErrorRecord;
using app::PredictionKind;

PredictionKind kind(const std::string& family, double seq, double tokens_per_gpu, const std::string& gpu = "ampere",
                    const std::string& stack = "megatron-lm") {
  return {family, gpu, stack, seq, tokens_per_gpu};
}

ErrorRecord record(const std::string& name, const PredictionKind& k, double error) { return {"d", name, "step_s", k, error}; }

TEST(ErrorBars, ThroughputFiguresInvertIntoStepTimeErrors) {
  // A step predicted at 1 s that really took 2 s: -50%, whether published as seconds or as a rate.
  EXPECT_DOUBLE_EQ(*app::step_time_error("step_s", 2.0, 1.0), -0.5);
  EXPECT_DOUBLE_EQ(*app::step_time_error("tokens_per_s_per_gpu", 1000, 2000), -0.5);
  EXPECT_DOUBLE_EQ(*app::step_time_error("mfu", 0.2, 0.4), -0.5);
  EXPECT_FALSE(app::step_time_error("peak_hbm_gib", 60, 70));
  EXPECT_FALSE(app::step_time_error("max_seq", 65536, 32768));
}

TEST(ErrorBars, FamiliesAndGenerationsFollowTheNames) {
  EXPECT_EQ(app::scheme_family("fpdt"), "zero");
  EXPECT_EQ(app::scheme_family("ulysses"), "zero");
  EXPECT_EQ(app::scheme_family("megatron"), "megatron");
  EXPECT_EQ(app::scheme_family("ringtrack"), "ringtrack");
  EXPECT_EQ(app::gpu_generation("a100-80gb-sxm"), "ampere");
  EXPECT_EQ(app::gpu_generation("h100-sxm-96gb-500w"), "hopper");
  EXPECT_EQ(app::gpu_generation("mystery-gpu"), "other");
}

TEST(ErrorBars, OnlyNearCasesOfTheSameFamilyCount) {
  std::vector<ErrorRecord> records;
  for (int i = 0; i < 5; ++i) records.push_back(record("near" + std::to_string(i), kind("megatron", 8192, 1024), -0.1 * i));
  records.push_back(record("other family", kind("zero", 8192, 1024), 5.0));
  records.push_back(record("far", kind("megatron", 8192 * 256, 1024 * 256), 5.0));  // 8 doublings away
  const app::ErrorBar bar = app::error_bar(kind("megatron", 8192, 1024), records);
  EXPECT_EQ(bar.cases, 5);
  EXPECT_DOUBLE_EQ(bar.median, -0.2);
  EXPECT_DOUBLE_EQ(bar.low, -0.4);  // the range of the 5
  EXPECT_DOUBLE_EQ(bar.high, 0.0);
  EXPECT_EQ(bar.datasets, std::vector<std::string>{"d"});
  EXPECT_NE(bar.text().find("5 published runs"), std::string::npos) << bar.text();
}

TEST(ErrorBars, AnotherGenerationOrStackCostsADistanceOfOne) {
  std::vector<ErrorRecord> records;
  for (int i = 0; i < 3; ++i) records.push_back(record("h" + std::to_string(i), kind("zero", 8192, 1024, "hopper", "torchtitan"), -0.3));
  // Two steps of distance (generation, stack) + one doubling: within kMaxDistance.
  EXPECT_EQ(app::error_bar(kind("zero", 16384, 2048, "ampere", "deepspeed"), records).cases, 3);
  // Two more doublings: 4 > kMaxDistance.
  EXPECT_EQ(app::error_bar(kind("zero", 65536, 8192, "ampere", "deepspeed"), records).cases, 0);
}

TEST(ErrorBars, FewerThanTheMinimumGivesNoBar) {
  const std::vector<ErrorRecord> records{record("a", kind("megatron", 8192, 1024), -0.1), record("b", kind("megatron", 8192, 1024), -0.2)};
  const app::ErrorBar bar = app::error_bar(kind("megatron", 8192, 1024), records);
  EXPECT_EQ(bar.cases, 0);
  EXPECT_EQ(bar.text(), "no validated case near this plan");
  EXPECT_EQ(bar.short_text(), "none");
  EXPECT_EQ(bar.json()["cases"], 0);
}

TEST(ErrorBars, OnlyTheNearestTwelveCount) {
  std::vector<ErrorRecord> records;
  for (int i = 0; i < 12; ++i) records.push_back(record("same" + std::to_string(i), kind("megatron", 8192, 1024), -0.1));
  for (int i = 0; i < 5; ++i) records.push_back(record("one doubling" + std::to_string(i), kind("megatron", 16384, 2048), 0.9));
  const app::ErrorBar bar = app::error_bar(kind("megatron", 8192, 1024), records);
  EXPECT_EQ(bar.cases, app::kMaxCases);
  EXPECT_DOUBLE_EQ(bar.high, -0.1);  // the farther cases did not get in
}

TEST(ErrorBars, CoverageLeavesEachCaseOutOfItsOwnBar) {
  std::vector<ErrorRecord> records;
  for (int i = 0; i < 10; ++i) records.push_back(record("c" + std::to_string(i), kind("megatron", 8192, 1024), -0.01 * i));
  records.push_back(record("outlier", kind("megatron", 8192, 1024), 3.0));
  const app::Coverage c = app::coverage(records);
  EXPECT_EQ(c.with_bar, 11);
  EXPECT_EQ(c.without_bar, 0);
  EXPECT_LT(c.covered, 11);  // the outlier lies outside the bar of the others
  EXPECT_GE(c.covered, 8);
}

TEST(ErrorBars, RecordsRoundTripAndBadFilesNameTheField) {
  const std::vector<ErrorRecord> records{record("a", kind("megatron", 8192, 1024), -0.25)};
  const auto back = app::parse_error_records(app::error_records_json(records), "r.json");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].case_name, "a");
  EXPECT_DOUBLE_EQ(back[0].step_error, -0.25);
  Json bad = app::error_records_json(records);
  bad["records"][0]["seq_tokens"] = "long";
  const std::string error = test::error_of([&] { app::parse_error_records(bad, "r.json"); });
  EXPECT_NE(error.find("r.json"), std::string::npos) << error;
  EXPECT_NE(error.find("seq_tokens"), std::string::npos) << error;
}

// validation/error_bars.json is what validate records: every fast case's record there equals this build's.
TEST(ErrorBarsCli, TheRecordedTableIsWhatValidateComputes) {
  test::TempDir dir;
  const std::string path = (dir.path() / "bars.json").string();
  const auto r = test::run_cli("validate --fast --write-error-bars " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("error bars (each case left out of its own)"), std::string::npos) << r.out;
  const auto fast = app::parse_error_records(Json::parse(test::read_file(path)), path);
  const auto& recorded = app::builtin_error_records();
  ASSERT_FALSE(fast.empty());
  for (const auto& f : fast) {
    const auto it = std::find_if(recorded.begin(), recorded.end(),
                                 [&](const ErrorRecord& e) { return e.dataset == f.dataset && e.case_name == f.case_name && e.metric == f.metric; });
    ASSERT_NE(it, recorded.end()) << f.dataset << ": " << f.case_name << " is not in validation/error_bars.json: run scripts/validation_doc.sh";
    EXPECT_NEAR(it->step_error, f.step_error, 1e-9) << f.dataset << ": " << f.case_name << ": run scripts/validation_doc.sh";
    EXPECT_EQ(it->kind.family, f.kind.family);
    EXPECT_EQ(it->kind.stack, f.kind.stack);
  }
}

TEST(ErrorBarsCli, SimulateAndPlanCarryTheBar) {
  const auto sim = test::run_cli(
      "simulate --strategy megatron --tp 8 --model llama3-8b --hw osc-ascend-a100x4 --nodes 2 --global-batch 1 --stack deepspeed --seq 32K --json");
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  const Json bar = Json::parse(sim.out)["error_bar"];
  ASSERT_TRUE(bar.contains("cases")) << bar.dump();
  EXPECT_FALSE(bar["text"].get<std::string>().empty());
  const auto text = test::run_cli(
      "simulate --strategy megatron --tp 8 --model llama3-8b --hw osc-ascend-a100x4 --nodes 2 --global-batch 1 --stack deepspeed --seq 32K");
  EXPECT_NE(text.out.find("error bar"), std::string::npos) << text.out;
  const auto plan = test::run_cli("plan --model llama3.2-1b --hw dgx-a100 --seq 32K --strategies megatron --top 2 --json");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const Json ranked = Json::parse(plan.out)["ranked"];
  ASSERT_FALSE(ranked.empty());
  for (const auto& row : ranked) EXPECT_TRUE(row.contains("error_bar")) << row.dump();
}

}  // namespace
}  // namespace trainyard
