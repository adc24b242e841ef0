// "No plan fits" says why, per scheme, and a miss's text and shortfall name the same memory.
#include <gtest/gtest.h>

#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/no_fit.hpp"
#include "planner/schemes/scheme.hpp"
#include "test_support.hpp"

namespace trainyard::planner {

namespace {

PlanSpec megatron() {
  PlanSpec spec = scheme_named("megatron").blank();
  return spec;
}

}  // namespace

TEST(NoFit, BoundMissNamesTheMemoryItsShortfallCounts) {
  // Both memories short; DRAM by more: the text, the memory and the arithmetic are all DRAM's.
  const Bounds both{90e9, 3e12, 1.0};
  const RankedPlan dram = bound_miss(megatron(), both, 76e9, 2e12);
  EXPECT_EQ(dram.metrics.short_of, "host DRAM per node");
  EXPECT_EQ(dram.metrics.shortfall_bytes, static_cast<std::int64_t>(1e12));
  EXPECT_EQ(dram.metrics.failure.rfind("needs at least " + format_bytes(3e12) + " of host DRAM per node", 0), 0u) << dram.metrics.failure;
  EXPECT_NE(dram.metrics.failure.find("(and needs at least " + format_bytes(90e9) + " of HBM per GPU"), std::string::npos);
  EXPECT_NE(describe_miss(dram).find("short by at least " + format_bytes(1e12) + " of host DRAM per node"), std::string::npos) << describe_miss(dram);
  // HBM short by more than DRAM: HBM's.
  const RankedPlan hbm = bound_miss(megatron(), {100e9, 2.01e12, 1.0}, 76e9, 2e12);
  EXPECT_EQ(hbm.metrics.short_of, "HBM per GPU");
  EXPECT_EQ(hbm.metrics.shortfall_bytes, static_cast<std::int64_t>(24e9));
  EXPECT_EQ(hbm.metrics.failure.rfind("needs at least " + format_bytes(100e9) + " of HBM per GPU", 0), 0u) << hbm.metrics.failure;
  EXPECT_NE(describe_miss(hbm).find("short by at least " + format_bytes(24e9) + " of HBM per GPU"), std::string::npos);
  // Only DRAM short: no HBM in the text.
  const RankedPlan only = bound_miss(megatron(), {10e9, 2.5e12, 1.0}, 76e9, 2e12);
  EXPECT_EQ(only.metrics.short_of, "host DRAM per node");
  EXPECT_EQ(only.metrics.failure.find("HBM"), std::string::npos) << only.metrics.failure;
}

TEST(NoFit, AMemoryMissIsCloserThanAStepThatDidNotFinish) {
  SearchReport report;
  RankedPlan stuck{megatron(), {}, {}};
  stuck.metrics.failure = "did not finish";  // shortfall 0, but not a memory miss
  note_miss(report, bound_miss(megatron(), {90e9, 0, 1}, 76e9, 2e12));
  note_miss(report, stuck);
  ASSERT_TRUE(report.closest_miss);
  EXPECT_EQ(report.closest_miss->metrics.short_of, "HBM per GPU");
  note_miss(report, bound_miss(megatron(), {80e9, 0, 1}, 76e9, 2e12));
  EXPECT_EQ(report.closest_miss_by_scheme.at("megatron").metrics.shortfall_bytes, static_cast<std::int64_t>(4e9));
}

TEST(NoFit, AnInterruptedSearchDoesNotClaimNothingFits) {
  SearchReport report;
  report.interrupted = true;
  report.enumerated_by_scheme["megatron"] = 3;
  note_miss(report, bound_miss(megatron(), {90e9, 0, 1}, 76e9, 2e12));
  const model::ModelConfig m = model::load_model("llama3.2-1b");
  const sim::Cluster c(hw::load_node("lab-h100"), 1);
  const auto why = schemes_without_fit(report, {"megatron", "zero"}, {m, c, {8192, 1}, model::precision_policy("bf16-mixed")});
  ASSERT_EQ(why.size(), 2u);
  EXPECT_NE(why[0].reason().find("not all tried (interrupted)"), std::string::npos) << why[0].reason();
  EXPECT_EQ(why[0].reason().find("fits"), std::string::npos) << why[0].reason();
  EXPECT_NE(why[1].reason().find("no valid configuration"), std::string::npos) << why[1].reason();
}

TEST(NoFit, EachSchemeSaysWhy) {
  // llama3-405b on one 8 x H100 node at 8K tokens: nothing fits; FPDT has no configuration at 8K.
  const model::ModelConfig m = model::load_model("llama3-405b");
  const sim::Cluster c(hw::load_node("lab-h100"), 1);
  const StepInputs in{m, c, {8192, 1}, model::precision_policy("bf16-mixed")};
  const SearchReport r = search(in, {});
  ASSERT_TRUE(r.ranked.empty());
  const auto why = schemes_without_fit(r, scheme_names(), in);
  ASSERT_EQ(why.size(), scheme_names().size());
  for (const auto& s : why) {
    if (s.configurations == 0) {
      EXPECT_NE(s.reason().find("no valid configuration"), std::string::npos) << s.reason();
      continue;
    }
    ASSERT_TRUE(s.closest) << s.scheme;
    EXPECT_EQ(s.closest->spec.scheme, s.scheme);
    EXPECT_GT(s.closest->metrics.shortfall_bytes, 0) << s.reason();
    // The failure names the memory the shortfall is of.
    const bool dram = s.closest->metrics.short_of == "host DRAM per node";
    EXPECT_NE(s.closest->metrics.failure.find(dram ? "DRAM" : "HBM"), std::string::npos) << s.reason();
    EXPECT_NE(s.reason().find("none of its " + std::to_string(s.configurations)), std::string::npos) << s.reason();
  }
  EXPECT_TRUE(std::any_of(why.begin(), why.end(), [](const SchemeNoFit& s) { return s.configurations > 0; }));
}

TEST(NoFit, TheCliPrintsAReasonPerScheme) {
  const auto r = test::run_cli("plan --model llama3-405b --hw lab-h100 --seq 8K");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no plan fits"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("closest miss"), std::string::npos) << r.err;
  for (const auto& scheme : scheme_names()) EXPECT_NE(r.err.find("\n  " + scheme + ": "), std::string::npos) << scheme << "\n" << r.err;
  const auto j = test::run_cli("plan --model llama3-405b --hw lab-h100 --seq 8K --json");
  EXPECT_EQ(j.exit_code, 1);
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_FALSE(doc["fits"].get<bool>());
  ASSERT_EQ(doc["schemes"].size(), scheme_names().size());
  for (const auto& s : doc["schemes"]) {
    if (s["configurations"].get<int>() == 0) continue;
    EXPECT_GT(s["closest_miss"]["shortfall_bytes"].get<double>(), 0);
    EXPECT_FALSE(s["closest_miss"]["short_of"].get<std::string>().empty());
  }
}

}  // namespace trainyard::planner
