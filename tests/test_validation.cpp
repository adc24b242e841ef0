// The public validation suite: datasets load with every field checked, the FLOP conventions reproduce
// the published figure pairs they come from, the lone-collective benchmark keeps nccl-tests' definitions, and
// `trainyard validate --baseline` fails when a dataset got worse.
#include <gtest/gtest.h>

#include <cmath>

#include "app/validation_suite.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "sim/collective_bench.hpp"
#include "test_support.hpp"

namespace trainyard {
namespace {

using Json = nlohmann::json;

Json minimal_dataset() {
  return Json::parse(R"({"schema": "trainyard.validation.v1", "dataset": "d", "title": "t", "source": "s",
    "flop_convention": {"causal_attention_halved": true, "recompute_counted": false, "input_embedding_counted": false, "text": "x"},
    "cases": [{"name": "c", "simulate": ["--collective", "all-reduce", "--bytes", "1G", "--hw", "dgx-a100"],
               "published": {"busbw_gbps": 200}}]})");
}

TEST(Validation, EveryBuiltInDatasetLoads) {
  const auto suite = app::builtin_validation_suite();
  ASSERT_GE(suite.size(), 5u);
  for (const auto& d : suite) {
    SCOPED_TRACE(d.origin);
    EXPECT_FALSE(d.cases.empty());
    EXPECT_FALSE(d.source.empty());
    for (const auto& c : d.cases) EXPECT_FALSE(c.published.empty()) << c.name;
  }
}

// validate under mpirun carries each case's result between ranks as a record: every field comes back, a missing
// estimate (NaN) included, and a record short of a field is an error naming its origin.
TEST(Validation, ACaseResultRecordReadsBackWhole) {
  app::CaseResult r;
  r.name = "a case";
  r.comparisons.push_back({"step_s", 2.5, 2.25, true});
  r.comparisons.push_back({"mfu", 0.4, 0.38, false, 0.41});
  r.error = "";
  r.remark = "stopped short";
  r.kind = app::PredictionKind{"megatron", "hopper", "megatron-lm", 8192, 4096};
  const app::CaseResult back = app::case_result_from_record(app::case_result_record(r), "test");
  EXPECT_EQ(app::case_result_record(back), app::case_result_record(r));
  ASSERT_EQ(back.comparisons.size(), 2u);
  EXPECT_FALSE(back.comparisons[0].has_estimate());
  EXPECT_DOUBLE_EQ(back.comparisons[1].estimated, 0.41);
  EXPECT_FALSE(back.comparisons[1].counted);
  ASSERT_TRUE(back.kind.has_value());
  EXPECT_EQ(back.kind->gpu_generation, "hopper");
  EXPECT_THROW(app::case_result_from_record(nlohmann::json{{"name", "x"}}, "rank 1's case"), InputError);
}

TEST(Validation, BadDatasetsNameTheFileAndTheField) {
  const auto error = [](const Json& doc) { return test::error_of([&] { app::parse_validation_dataset(doc, "bad.json"); }); };
  Json doc = minimal_dataset();
  EXPECT_NO_THROW(app::parse_validation_dataset(doc, "ok.json"));
  // busbw_gbps: the old spelling of busbw_GBps, read for one release.
  EXPECT_EQ(app::parse_validation_dataset(doc, "ok.json").cases.at(0).published.count("busbw_GBps"), 1u);

  doc["cases"][0]["published"] = {{"speed", 1}};
  EXPECT_NE(error(doc).find("bad.json"), std::string::npos);
  EXPECT_NE(error(doc).find("speed"), std::string::npos);

  doc = minimal_dataset();
  doc["cases"][0]["published"] = {{"max_seq", "32K"}};  // a max length needs a scan
  EXPECT_NE(error(doc).find("scan_seq"), std::string::npos);

  doc = minimal_dataset();
  doc["cases"][0]["attention"] = {{"hw", "dgx-a100"}};  // both kinds at once
  EXPECT_NE(error(doc).find("exactly one"), std::string::npos);

  doc = minimal_dataset();
  doc["cases"].push_back(doc["cases"][0]);
  EXPECT_NE(error(doc).find("twice"), std::string::npos);

  doc = minimal_dataset();
  doc["cases"][0]["simulate"] = {"--collective", 3};
  EXPECT_NE(error(doc).find("array of strings"), std::string::npos);

  doc = minimal_dataset();
  doc["flop_convention"]["typo"] = true;
  EXPECT_NE(error(doc).find("typo"), std::string::npos);
  doc = minimal_dataset();
  doc["cases"][0]["unstated"] = {{"micro-batch", {"1", "2"}}};  // not a flag
  EXPECT_NE(error(doc).find("unstated.micro-batch"), std::string::npos);

  doc = minimal_dataset();
  doc["cases"][0]["published"] = {{"speedup", 1.5}};  // a speedup names the case it is over
  EXPECT_NE(error(doc).find("speedup_over"), std::string::npos);
  doc["cases"][0]["speedup_over"] = "nowhere";
  EXPECT_NE(error(doc).find("nowhere"), std::string::npos);
  doc["cases"][0]["speedup_over"] = "c";  // not itself
  EXPECT_NE(error(doc).find("speedup_over"), std::string::npos);
}

// A source that tuned options it does not state: every combination is simulated, the fastest that fits is
// compared, and the choice is said.
TEST(Validation, UnstatedOptionsTakeTheFastestCombinationThatFits) {
  Json doc = minimal_dataset();
  doc["cases"][0] = Json::parse(R"({"name": "tuned", "published": {"step_s": 1},
    "simulate": ["--strategy", "megatron", "--model", "custom:layers=2,hidden=1024,heads=16,vocab=1024", "--hw", "dgx-a100",
                 "--tp", "8", "--sequence-parallel", "--seq", "4K", "--global-batch", "4"],
    "unstated": {"--micro-batch": ["1", "4"], "--recompute": ["none", "full"]}})");
  const app::ValidationDataset d = app::parse_validation_dataset(doc, "tuned.json");
  const app::CaseResult r = app::run_case(d, d.cases[0], 0);
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_NE(r.remark.find("4 tried"), std::string::npos) << r.remark;
  EXPECT_NE(r.remark.find("--recompute none"), std::string::npos) << r.remark;  // recomputing only costs time
  double slowest = 0;
  for (const char* mb : {"1", "4"}) {  // the compared step is the faster of the two micro-batch sizes
    app::ValidationCase one = d.cases[0];
    one.unstated = {{"--micro-batch", {mb}}, {"--recompute", {"none"}}};
    const app::CaseResult single = app::run_case(d, one, 0);
    ASSERT_EQ(single.comparisons.size(), 1U);
    EXPECT_LE(r.comparisons[0].predicted, single.comparisons[0].predicted);
    slowest = std::max(slowest, single.comparisons[0].predicted);
  }
  EXPECT_LT(r.comparisons[0].predicted, slowest);
}

// torchtitan's published pair (docs/performance.md at 1ea476e): Llama 3 8B at 8K tokens, 2973 tokens/s per A100
// printed as 58.2% MFU, counting every parameter (the input embedding too) and attention unhalved.
TEST(Validation, TorchtitanConventionReproducesItsPublishedMfu) {
  const model::ModelConfig m = model::load_model("llama3-8b", "test");
  model::FlopConvention torchtitan{false, false, true};
  const double mfu = model::convention_flops_per_token(m, 8192, torchtitan, false) * 2973 / 312e12;
  EXPECT_NEAR(mfu, 0.582, 0.001);
  // Its later convention leaves the input embedding out: 57.91 GFLOP per token at 8K (6N + 12 L h s).
  torchtitan.input_embedding_counted = false;
  EXPECT_NEAR(model::convention_flops_per_token(m, 8192, torchtitan, false) / 57.91e9, 1, 1e-3);
  // Causal halving removes half the attention term; a counted recompute adds one forward.
  const model::FlopConvention halved{true, false, false}, with_recompute{true, true, false};
  const double attention_full = 12.0 * 32 * 4096 * 8192;
  EXPECT_NEAR(model::convention_flops_per_token(m, 8192, torchtitan, false) - model::convention_flops_per_token(m, 8192, halved, false),
              attention_full / 2, attention_full * 1e-3);
  EXPECT_NEAR(model::convention_flops_per_token(m, 8192, with_recompute, true) / model::convention_flops_per_token(m, 8192, halved, true), 4.0 / 3,
              1e-9);
}

TEST(Validation, CollectiveBenchmarkUsesNcclTestsDefinitions) {
  EXPECT_DOUBLE_EQ(sim::busbw_factor(sim::CollectiveOp::all_reduce, 8), 14.0 / 8);
  EXPECT_DOUBLE_EQ(sim::busbw_factor(sim::CollectiveOp::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(sim::busbw_factor(sim::CollectiveOp::broadcast, 8), 1);
  const sim::Cluster cluster(hw::load_node("dgx-a100", "test"), 1);
  const auto b = sim::benchmark_collective(cluster, sim::CollectiveOp::all_reduce, sim::Algorithm::ring, std::int64_t{1} << 30);
  EXPECT_EQ(b.ranks, 8);
  EXPECT_NEAR(b.algbw_GBps, static_cast<double>(b.bytes) / static_cast<double>(b.time_ns), 1e-9);
  EXPECT_NEAR(b.busbw_GBps, b.algbw_GBps * 14 / 8, 1e-9);
  // Small messages cannot beat large ones: latency is paid per step.
  const auto small = sim::benchmark_collective(cluster, sim::CollectiveOp::all_reduce, sim::Algorithm::ring, std::int64_t{1} << 20);
  EXPECT_LT(small.busbw_GBps, b.busbw_GBps);
  EXPECT_THROW(sim::benchmark_collective(cluster, sim::CollectiveOp::all_gather, sim::Algorithm::tree, 1 << 20), InputError);
}

// NCCL's tuner picks by predicted time: latency-bound LL for small messages, Simple at full rate for large ones,
// and on an NVSwitch that reduces (H100) the in-switch NVLS all-reduce, which beats the ring's 2(n-1)/n traffic.
TEST(Validation, CollectivesPickNcclsProtocolAndNvlsWhereTheSwitchReduces) {
  const sim::Cluster a100(hw::load_node("dgx-a100", "test"), 1), h100(hw::load_node("dgx-h100", "test"), 1);
  const auto ring = sim::Algorithm::ring;
  const auto all_reduce = sim::CollectiveOp::all_reduce;
  EXPECT_EQ(sim::benchmark_collective(a100, all_reduce, ring, std::int64_t{1} << 10).protocol, "LL");
  const auto large_a100 = sim::benchmark_collective(a100, all_reduce, ring, std::int64_t{1} << 30);
  EXPECT_EQ(large_a100.protocol, "Simple");
  EXPECT_LE(large_a100.busbw_GBps, 240.0);  // 12 NVLink lanes x 20 GB/s: a ring's busbw cannot exceed it
  EXPECT_GT(large_a100.busbw_GBps, 230.0);
  const auto large_h100 = sim::benchmark_collective(h100, all_reduce, ring, std::int64_t{1} << 30);
  EXPECT_EQ(large_h100.protocol, "NVLS");
  EXPECT_GT(large_h100.busbw_GBps, 370.8);  // above any ring on that link
  // NVLS is an all-reduce algorithm only.
  EXPECT_NE(sim::benchmark_collective(h100, sim::CollectiveOp::all_gather, ring, std::int64_t{1} << 30).protocol, "NVLS");
  EXPECT_THROW(sim::benchmark_collective(a100, sim::CollectiveOp::all_reduce, sim::Algorithm::ring, 4), InputError);
}

TEST(Validation, AReadingReplacesFlagValuesOrTheConvention) {
  Json doc = minimal_dataset();
  doc["readings"] = Json::parse(R"([{"name": "other node", "replace": {"dgx-a100": "dgx-h100"}},
    {"name": "full square", "flop_convention": {"causal_attention_halved": false, "recompute_counted": false,
                                                "input_embedding_counted": false, "text": "full"}}])");
  const app::ValidationDataset d = app::parse_validation_dataset(doc, "r.json");
  ASSERT_EQ(d.readings.size(), 2u);
  const app::ValidationDataset other = app::under_reading(d, d.readings[0]);
  EXPECT_EQ(other.cases[0].simulate.back(), "dgx-h100");
  EXPECT_EQ(other.name, d.name);
  EXPECT_TRUE(other.convention.causal_attention_halved);
  const app::ValidationDataset full = app::under_reading(d, d.readings[1]);
  EXPECT_FALSE(full.convention.causal_attention_halved);
  EXPECT_EQ(full.convention_text, "full");
  EXPECT_EQ(full.cases[0].simulate.back(), "dgx-a100");
  doc["readings"] = Json::parse(R"([{"name": "nothing"}])");
  const std::string error = test::error_of([&] { app::parse_validation_dataset(doc, "r.json"); });
  EXPECT_NE(error.find("r.json"), std::string::npos) << error;
  EXPECT_NE(error.find("replace"), std::string::npos) << error;
}

TEST(ValidationCli, EveryReadingIsReportedBesideTheDatasetsOwn) {
  Json doc = minimal_dataset();
  doc["readings"] = Json::parse(R"([{"name": "an H100 node", "replace": {"dgx-a100": "dgx-h100"}}])");
  doc["cases"][0]["fast"] = true;
  test::TempDir dir;
  const std::string cases = dir.write("cases.json", doc.dump());
  const auto r = test::run_cli("validate --cases " + cases + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json out = Json::parse(r.out);
  ASSERT_TRUE(out[0].contains("readings"));
  ASSERT_EQ(out[0]["readings"].size(), 1u);
  EXPECT_EQ(out[0]["readings"][0]["reading"], "an H100 node");
  EXPECT_EQ(out[0]["readings"][0]["compared"], 1);
  EXPECT_NE(out[0]["readings"][0]["mape"], out[0]["mape"]);  // the H100 node's busbw differs from the A100's
  const auto text = test::run_cli("validate --cases " + cases);
  EXPECT_NE(text.out.find("under the reading \"an H100 node\""), std::string::npos) << text.out;
  const auto fast = test::run_cli("validate --cases " + cases + " --fast");  // CI's run holds the dataset's own reading
  ASSERT_EQ(fast.exit_code, 0) << fast.err;
  EXPECT_EQ(fast.out.find("under the reading"), std::string::npos) << fast.out;
}

TEST(ValidationCli, SimulateCollectivePrintsNcclTestsFigures) {
  const auto r = test::run_cli("simulate --collective all-reduce --bytes 1G --hw dgx-a100 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json out = Json::parse(r.out);
  EXPECT_EQ(out["ranks"], 8);
  EXPECT_GT(out["busbw_GBps"].get<double>(), 0);
  EXPECT_EQ(out["busbw_gbps"], out["busbw_GBps"]) << "the old key, kept for one release";
  const auto bad = test::run_cli("simulate --collective all-sum --bytes 1G --hw dgx-a100");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--collective"), std::string::npos) << bad.err;
}

// Two output formats at once are refused, not one of them picked silently (issue 45).
TEST(ValidationCli, MarkdownAndJsonTogetherAreRefused) {
  const auto r = test::run_cli("validate --fast --markdown --json");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("--markdown/--json"), std::string::npos) << r.err;
}

// CI's check: the fast cases are no worse than validation/baseline.json records. A baseline recording better
// figures than the model reaches must fail, so the check can fail.
TEST(ValidationCli, FastCasesAreNoWorseThanTheBaselineAndABetterBaselineFails) {
  const std::string baseline = std::string(TRAINYARD_SOURCE_DIR) + "/validation/baseline.json";
  const auto r = test::run_cli("validate --fast --baseline " + baseline);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;

  test::TempDir dir;
  Json better = test::source_json("validation/baseline.json");
  ASSERT_TRUE(better.contains("fast"));
  for (auto& [name, figures] : better["fast"].items()) figures["mape"] = figures["mape"].get<double>() * 0.5;
  const std::string path = dir.write("better.json", better.dump());
  const auto worse = test::run_cli("validate --fast --baseline " + path);
  EXPECT_EQ(worse.exit_code, 1);
  EXPECT_NE(worse.err.find("worse than the baseline"), std::string::npos) << worse.err;
}

TEST(ValidationCli, MixedLengthCasesPredictWhatSimulateLengthsPrints) {
  // A HotSPa-style case: a mini-batch of mixed lengths under a static strategy; its step_s is simulate --lengths'
  // total for the same flags.
  const std::string flags =
      R"("--lengths", "dist:github", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--tokens-per-step", "64K", "--max-len", "8K", "--seed", "1", "--static", "megatron:dp=8")";
  test::TempDir dir;
  const std::string cases = dir.write("cases.json", R"({"schema": "trainyard.validation.v1", "dataset": "lengths", "title": "t", "source": "s",
    "flop_convention": {"causal_attention_halved": true, "recompute_counted": false, "input_embedding_counted": false, "text": "x"},
    "cases": [{"name": "mixed", "simulate": [)" + flags +
                                                        R"(], "published": {"step_s": 1.0}}]})");
  const auto validated = test::run_cli("validate --cases " + cases + " --json");
  ASSERT_EQ(validated.exit_code, 0) << validated.err;
  const auto simulated = test::run_cli(
      "simulate --lengths dist:github --model llama3.2-1b --hw dgx-a100 --tokens-per-step 64K --max-len 8K --seed 1 --static megatron:dp=8 --json");
  ASSERT_EQ(simulated.exit_code, 0) << simulated.err;
  const double total_s = Json::parse(simulated.out)["static"]["total_s"].get<double>();
  const Json figure = Json::parse(validated.out)[0]["cases"][0]["figures"][0];
  EXPECT_EQ(figure["metric"], "step_s");
  EXPECT_DOUBLE_EQ(figure["predicted"].get<double>(), total_s);
  EXPECT_GT(total_s, 0);
}

// A case's "speedup" is the named case's predicted step_s over its own; a "calibration" case's figures are printed
// but left out of the MAPE.
TEST(ValidationCli, SpeedupsAreRatiosOfPredictionsAndCalibrationIsNotCounted) {
  const std::string common =
      R"("--lengths", "dist:github", "--model", "llama3.2-1b", "--hw", "dgx-a100", "--tokens-per-step", "64K", "--max-len", "8K", "--seed", "1")";
  test::TempDir dir;
  const std::string cases = dir.write("cases.json", R"({"schema": "trainyard.validation.v1", "dataset": "speedups", "title": "t", "source": "s",
    "flop_convention": {"causal_attention_halved": true, "recompute_counted": false, "input_embedding_counted": false, "text": "x"},
    "cases": [{"name": "static", "calibration": "fits the lengths", "simulate": [)" +
                                                        common +
                                                        R"(, "--static", "megatron:tp=8"], "published": {"step_s": 1.0}},
              {"name": "switched", "speedup_over": "static", "simulate": [)" +
                                                        common +
                                                        R"(, "--switch", "1K=megatron:dp=8,distributed_optimizer=true;8K=megatron:tp=8"],
               "published": {"step_s": 2.0, "speedup": 1.25}}]})");
  const auto r = test::run_cli("validate --cases " + cases + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json d = Json::parse(r.out)[0];
  const Json st = d["cases"][0]["figures"][0], sw = d["cases"][1]["figures"];
  EXPECT_FALSE(st["counted"].get<bool>());
  ASSERT_EQ(sw.size(), 2u);
  EXPECT_EQ(sw[1]["metric"], "speedup");
  EXPECT_DOUBLE_EQ(sw[1]["predicted"].get<double>(), st["predicted"].get<double>() / sw[0]["predicted"].get<double>());
  EXPECT_EQ(d["compared"].get<int>(), 2);  // the switched step_s and speedup; not the calibration
  const double mape = (std::abs(sw[0]["relative_error"].get<double>()) + std::abs(sw[1]["relative_error"].get<double>())) / 2;
  EXPECT_DOUBLE_EQ(d["mape"].get<double>(), mape);
  // Under --only the case a speedup is over is run for it.
  const auto only = test::run_cli("validate --cases " + cases + " --only switched --json");
  ASSERT_EQ(only.exit_code, 0) << only.err;
  const Json alone = Json::parse(only.out)[0]["cases"];
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_DOUBLE_EQ(alone[0]["figures"][1]["predicted"].get<double>(), sw[1]["predicted"].get<double>());
}

TEST(ValidationCli, WriteBaselineRecordsEachDataset) {
  test::TempDir dir;
  const std::string path = (dir.path() / "b.json").string();
  const auto r = test::run_cli("validate --only nccl-tests --fast --json --write-baseline " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json written = Json::parse(test::read_file(path));
  ASSERT_TRUE(written["fast"].contains("nccl-tests"));
  const Json printed = Json::parse(r.out);
  EXPECT_DOUBLE_EQ(written["fast"]["nccl-tests"]["mape"].get<double>(), printed[0]["mape"].get<double>());
  EXPECT_EQ(test::run_cli("validate --only no-such-dataset").exit_code, 2);
}

}  // namespace
}  // namespace trainyard
