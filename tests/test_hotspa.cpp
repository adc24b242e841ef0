// Variable-length workloads and HotSPa hot switching (planner/lengths, planner/switching, planner/hotspa).
#include <gtest/gtest.h>

#include <numeric>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/hotspa.hpp"
#include "sim/cost_model.hpp"
#include "test_support.hpp"

namespace trainyard {
namespace {

using planner::GroupPlan;
using planner::PlanSpec;

std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

TEST(Lengths, SeededDrawIsDeterministicExactAndCut) {
  const auto src = planner::load_lengths("dist:github");
  const auto a = planner::sample_minibatch(src, 1 << 20, 32768, 7);
  const auto b = planner::sample_minibatch(src, 1 << 20, 32768, 7);
  const auto c = planner::sample_minibatch(src, 1 << 20, 32768, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(sum(a), 1 << 20);
  EXPECT_LE(*std::max_element(a.begin(), a.end()), 32768);
  EXPECT_GE(*std::min_element(a.begin(), a.end()), 1);
}

// The built-in fits' defining figure: 512 documents packed first-fit decreasing into padded 32K rows fill, on
// average, the rows seed 004's static times give (28.9 CommonCrawl, 83.3 GitHub: planner/lengths.cpp).
TEST(Lengths, BuiltinFitsFillTheStaticRows) {
  for (const auto& [name, rows] : std::vector<std::pair<std::string, double>>{{"dist:commoncrawl", 28.9}, {"dist:github", 83.3}}) {
    const auto source = planner::load_lengths(name);
    constexpr int kDraws = 16;
    double filled = 0;
    for (int seed = 1; seed <= kDraws; ++seed) {
      const planner::LengthGroup all{0, 32768, planner::sample_documents(source, 512, 32768, static_cast<std::uint64_t>(seed))};
      filled += static_cast<double>(planner::group_rows(all, planner::Batching::ffd_padded, 1).packed_rows);
    }
    EXPECT_NEAR(filled / kDraws / rows, 1.0, 0.06) << name;
  }
}

TEST(Lengths, FilesAndHistogramsWithErrorsNamingTheLine) {
  test::TempDir dir;
  const auto good = dir.write("lengths.txt", "# observed\n100\n\n2000\n");
  const auto src = planner::load_lengths(good);
  const auto l = planner::sample_minibatch(src, 10000, 4096, 3);
  for (auto x : l) EXPECT_TRUE(x == 100 || x == 2000 || x == 10000 - (sum(l) - x)) << x;
  EXPECT_EQ(sum(l), 10000);
  const auto bad = dir.write("bad.txt", "100\n12x\n");
  try {
    planner::load_lengths(bad);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":2"), std::string::npos) << e.what();
  }
  const auto hist = dir.write("h.json", R"({"schema": "trainyard.lengths.v1", "bins": [{"min": 10, "max": 20, "weight": 1}]})");
  for (auto x : planner::sample_minibatch(planner::load_lengths(hist), 5000, 4096, 1)) EXPECT_LE(x, 20);
  const auto typo = dir.write("t.json", R"({"schema": "trainyard.lengths.v1", "bins": [{"min": 10, "max": 20, "weigth": 1}]})");
  EXPECT_THROW(planner::load_lengths(typo), InputError);
  EXPECT_THROW(planner::load_lengths("dist:wikipedia"), InputError);
}

TEST(Lengths, PackingAndPaddingRows) {
  const auto groups = planner::group_lengths({3, 2, 3, 2, 9}, {5, 10});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].lengths, (std::vector<std::int64_t>{3, 3, 2, 2}));
  // Best-fit decreasing into rows of 5: {3, 2}, {3, 2}.
  const auto packed = planner::group_rows(groups[0], planner::Batching::packing, 1);
  EXPECT_EQ(packed.workload.global_batch, 2);
  EXPECT_EQ(packed.workload.seq_len, 5);
  EXPECT_DOUBLE_EQ(packed.attention_density, (9.0 + 9 + 4 + 4) / (2 * 25));
  EXPECT_DOUBLE_EQ(packed.fill, 1.0);
  const auto padded = planner::group_rows(groups[0], planner::Batching::padding, 3);
  EXPECT_EQ(padded.workload.global_batch, 6);  // 4 sequences, rounded up to the strategy's multiple
  EXPECT_DOUBLE_EQ(padded.attention_density, 1.0);
  EXPECT_THROW(planner::group_lengths({11}, {5, 10}), InputError);
}

// HotSPa's artifact packs row by row from the longest document, which is first-fit decreasing.
TEST(Lengths, FirstFitDecreasingGivesTheExpectedRows) {
  using Rows = std::vector<std::vector<std::int64_t>>;
  EXPECT_EQ(planner::first_fit_decreasing({5, 7, 2, 4, 3, 1}, 10), (Rows{{7, 3}, {5, 4, 1}, {2}}));
  EXPECT_EQ(planner::first_fit_decreasing({6, 6, 6, 4, 4, 4}, 10), (Rows{{6, 4}, {6, 4}, {6, 4}}));
  // First fit, not best fit: 3 goes to the first row with room (room 4), not the fullest (room 3).
  EXPECT_EQ(planner::first_fit_decreasing({6, 7, 3}, 10), (Rows{{7, 3}, {6}}));
  EXPECT_EQ(planner::first_fit_decreasing({6, 5, 3}, 9), (Rows{{6, 3}, {5}}));
  EXPECT_TRUE(planner::first_fit_decreasing({}, 10).empty());
  EXPECT_THROW(planner::first_fit_decreasing({11}, 10), InputError);
}

TEST(Lengths, DocumentsAreCountedAndCutNotSplit) {
  const auto src = planner::load_lengths("dist:github");
  const auto a = planner::sample_documents(src, 512, 32768, 1);
  EXPECT_EQ(a, planner::sample_documents(src, 512, 32768, 1));
  ASSERT_EQ(a.size(), 512u);
  EXPECT_EQ(*std::max_element(a.begin(), a.end()), 32768);  // documents over 32K + 1 tokens keep 32K positions
  EXPECT_GE(*std::min_element(a.begin(), a.end()), planner::kMinDocumentTokens - planner::kLabelShiftTokens);
  test::TempDir dir;
  const auto one = planner::load_lengths(dir.write("long.txt", "100000\n"));
  EXPECT_EQ(planner::sample_documents(one, 3, 4096, 1), (std::vector<std::int64_t>{4096, 4096, 4096}));
  EXPECT_THROW(planner::sample_documents(one, 0, 4096, 1), InputError);
}

// ffd-padded: a row holds documents up to the bound + 1 tokens, each document its positions + 1 (the label shift).
TEST(Lengths, FfdPaddedRowsAreWholeBucketRowsAndTheRemainderIsDropped) {
  planner::LengthGroup g{0, 4096, {2048, 2047}};
  auto rows = planner::group_rows(g, planner::Batching::ffd_padded, 1);
  EXPECT_EQ(rows.workload.global_batch, 1);  // 2049 + 2048 = 4097 tokens fit
  EXPECT_EQ(rows.workload.seq_len, 4096);    // a padded row runs the whole bound
  EXPECT_DOUBLE_EQ(rows.attention_density, 1.0);
  EXPECT_DOUBLE_EQ(rows.fill, 4095.0 / 4096);
  g.lengths = {2048, 2048};
  EXPECT_EQ(planner::group_rows(g, planner::Batching::ffd_padded, 1).workload.global_batch, 2);
  // One short document still costs a whole row of the bound.
  g.lengths = {100};
  rows = planner::group_rows(g, planner::Batching::ffd_padded, 1);
  EXPECT_EQ(rows.workload.seq_len, 4096);
  EXPECT_EQ(rows.workload.global_batch, 1);
  // Five rows under DP 2: four run, one is dropped.
  g.lengths = {4000, 4000, 4000, 4000, 4000};
  rows = planner::group_rows(g, planner::Batching::ffd_padded, 2);
  EXPECT_EQ(rows.packed_rows, 5);
  EXPECT_EQ(rows.workload.global_batch, 4);
  EXPECT_EQ(rows.dropped_rows, 1);
  // Fewer rows than DP: none kept, the group runs DP dummy rows of 128 tokens; so does an empty group.
  g.lengths = {4000};
  rows = planner::group_rows(g, planner::Batching::ffd_padded, 4);
  EXPECT_EQ(rows.workload.global_batch, 4);
  EXPECT_EQ(rows.workload.seq_len, planner::kDummyRowTokens);
  EXPECT_EQ(rows.dropped_rows, 1);
  g.lengths.clear();
  EXPECT_EQ(planner::group_rows(g, planner::Batching::ffd_padded, 2).workload.seq_len, planner::kDummyRowTokens);
  EXPECT_EQ(planner::parse_batching("ffd-padded"), planner::Batching::ffd_padded);
  EXPECT_THROW(planner::parse_batching("ffd"), InputError);
}

// Simulated: under ffd-padded a row costs its bound whatever it holds, packed documents share a row, and the rows
// past a multiple of DP do not run. Without packing the five short documents would cost five rows.
TEST(HotSpa, FfdPaddedRowsCostTheirBoundAndPackingSharesThem) {
  const model::ModelConfig tiny = model::load_model("custom:layers=2,hidden=128,heads=8,kv_heads=8,head_dim=16,ffn_hidden=256,vocab=256");
  const sim::Cluster cluster(hw::load_node("dgx-a100"), 1);
  planner::HotSpaSetting s{tiny, cluster, model::precision_policy("bf16-mixed")};
  s.batching = planner::Batching::ffd_padded;
  const auto seconds = [&](const std::vector<std::int64_t>& lengths, const std::string& spec) {
    const auto r = planner::run_minibatch(s, lengths, {{4096, planner::parse_strategy(spec, "test", cluster.gpus())}}, "test");
    EXPECT_TRUE(r.fits) << r.failure;
    return r.total_s;
  };
  const std::string dp1 = "megatron:dp=1,tp=8";
  const double one_full_row = seconds({4096}, dp1);
  EXPECT_DOUBLE_EQ(seconds({100}, dp1), one_full_row);                      // padding: the row's bound is computed
  EXPECT_DOUBLE_EQ(seconds({800, 800, 800, 800, 800}, dp1), one_full_row);  // packed into one row
  const double five_rows = seconds({4096, 4096, 4096, 4096, 4096}, dp1);
  EXPECT_GT(five_rows, 2 * one_full_row);
  const std::string dp2 = "megatron:dp=2,tp=4,distributed_optimizer=true";
  EXPECT_DOUBLE_EQ(seconds({4096, 4096, 4096, 4096, 4096}, dp2), seconds({4096, 4096, 4096, 4096}, dp2));  // the fifth is dropped
}

TEST(Switching, AlgorithmOneOnTwoNodesOfTwo) {
  // One unit of 100 bytes held whole by GPU 0, wanted by all four GPUs (nodes {0,1} and {2,3}).
  planner::StateLayout from{{{planner::Shard{0, 1, {0}}}}}, to{{{planner::Shard{0, 1, {0, 1, 2, 3}}}}};
  auto plan = planner::plan_switch(from, to, {100}, 2, 4);
  ASSERT_EQ(plan.transfers.size(), 3u);
  EXPECT_EQ(plan.transfers[0].src, 0);
  EXPECT_EQ(plan.transfers[0].dst, 1);
  EXPECT_FALSE(plan.transfers[0].inter_node);
  EXPECT_TRUE(plan.transfers[1].inter_node);
  EXPECT_TRUE(plan.transfers[2].inter_node);
  EXPECT_EQ(plan.intra_send_bytes[0], 100);
  EXPECT_EQ(plan.inter_send_bytes[0], 200);

  // Held by GPUs 0 and 1 (node 0), wanted by 2 and 3: the inter-node sends alternate to balance the senders.
  from = {{{planner::Shard{0, 1, {0, 1}}}}};
  to = {{{planner::Shard{0, 1, {2, 3}}}}};
  plan = planner::plan_switch(from, to, {100}, 2, 4);
  ASSERT_EQ(plan.transfers.size(), 2u);
  EXPECT_EQ(plan.transfers[0].src, 0);
  EXPECT_EQ(plan.transfers[0].dst, 2);
  EXPECT_EQ(plan.transfers[1].src, 1);
  EXPECT_EQ(plan.transfers[1].dst, 3);

  // TP 2 shards on GPUs 0 and 1, gathered whole onto all four: each half goes to its node neighbour over NVLink
  // and across to both GPUs of the other node; 300 bytes (4 copies of 100 minus the 100 already held).
  from = {{{planner::Shard{0, 0.5, {0}}, planner::Shard{0.5, 1, {1}}}}};
  to = {{{planner::Shard{0, 1, {0, 1, 2, 3}}}}};
  plan = planner::plan_switch(from, to, {100}, 2, 4);
  ASSERT_EQ(plan.transfers.size(), 6u);
  EXPECT_EQ(plan.bytes(), 300);
  EXPECT_EQ(plan.intra_send_bytes[0], 50);
  EXPECT_EQ(plan.intra_send_bytes[1], 50);
  EXPECT_EQ(plan.inter_send_bytes[0], 100);
  EXPECT_EQ(plan.inter_send_bytes[1], 100);
  // Two intra-node sources: the one that has sent less intra-node so far.
  from = {{{planner::Shard{0, 1, {0, 1}}}, {planner::Shard{0, 1, {0, 1}}}}};
  to = {{{planner::Shard{0, 1, {0, 1, 2}}}, {planner::Shard{0, 1, {0, 1, 2}}}}};
  plan = planner::plan_switch(from, to, {10, 10}, 4, 4);  // one node of 4
  ASSERT_EQ(plan.transfers.size(), 2u);
  EXPECT_EQ(plan.transfers[0].src, 0);
  EXPECT_EQ(plan.transfers[1].src, 1);
}

// llama3.2-1b on DGX A100 nodes.
struct Rig {
  explicit Rig(int nodes) : cluster(hw::load_node("dgx-a100"), nodes) {}
  model::ModelConfig model = model::load_model("llama3.2-1b");
  sim::Cluster cluster;
  planner::HotSpaSetting setting{model, cluster, model::precision_policy("bf16-mixed")};
  planner::StepInputs in(planner::Workload w) const { return {model, cluster, w, setting.precision}; }
};

PlanSpec strategy(const std::string& text, int gpus) { return planner::parse_strategy(text, "test", gpus); }

TEST(Switching, BytesMatchTheReshardedState) {
  const Rig s(2);
  const auto in = s.in({4096, 64});
  const auto units = planner::unit_bytes(s.model, 2);
  const std::int64_t model_bytes = sum(units);
  EXPECT_NEAR(static_cast<double>(model_bytes), s.model.params() * 2, 16);
  const auto pure_dp = planner::parameter_layout(in, strategy("megatron:dp=16", 16));
  const auto tp8_pp2 = planner::parameter_layout(in, strategy("megatron:tp=8,pp=2", 16));
  // Everyone holds everything under DP: nothing to send. The reverse gives each GPU the 15/16 it lacks.
  EXPECT_EQ(planner::plan_switch(pure_dp, tp8_pp2, units, 8, 16).bytes(), 0);
  const auto gather = planner::plan_switch(tp8_pp2, pure_dp, units, 8, 16);
  // llama3.2-1b ties its embeddings: with PP 2 the first and last stage both hold them, so they need 14 copies.
  const std::int64_t embedding = units[s.model.layers];
  EXPECT_EQ(gather.bytes(), 15 * model_bytes - embedding);
  // ZeRO-3 (GPU g holds 1/16 of every unit) to TP 8 x PP 2 (GPU 8s+t wants slice t/8 of its stage's units): only
  // GPU 0 (stage 0) and GPU 15 (stage 1) already hold half of their slice, 1/16 of a unit.
  const auto zero3 = planner::parameter_layout(in, strategy("zero:zero_stage=3", 16));
  const auto to_tp = planner::plan_switch(zero3, tp8_pp2, units, 8, 16);
  const double layers = static_cast<double>(model_bytes - embedding);
  EXPECT_NEAR(static_cast<double>(to_tp.bytes()), layers * 15 / 16 + static_cast<double>(embedding) * (2 - 2.0 / 16), 64);
}

// `short_count` sequences of 512 tokens and `long_count` of 32K on one DGX A100, static under TP 8 against
// switching the short ones to DP 8 (distributed optimizer).
struct TwoGroups {
  planner::MinibatchResult st, hot;
  std::int64_t model_bytes = 0;
};
TwoGroups two_groups(std::size_t short_count, std::size_t long_count) {
  const Rig s(1);
  std::vector<std::int64_t> lengths(short_count, 512);
  lengths.insert(lengths.end(), long_count, 32768);
  const PlanSpec tp8 = strategy("megatron:tp=8,sequence_parallel=true", 8);
  const PlanSpec dp8 = strategy("megatron:dp=8,distributed_optimizer=true", 8);
  TwoGroups r;
  r.st = planner::run_static(s.setting, lengths, {512, 32768}, tp8, true, "test");
  r.hot = planner::run_minibatch(s.setting, lengths, {{512, dp8}, {32768, tp8}}, "test");
  r.model_bytes = sum(planner::unit_bytes(s.model, 2));
  return r;
}

// Short sequences are far better off data-parallel than under TP 8: the switches cost less than that saves.
TEST(HotSpa, SwitchingWinsWhenTheShortGroupIsLarge) {
  const auto [st, hot, model_bytes] = two_groups(2048, 2);
  ASSERT_TRUE(st.fits) << st.failure;
  ASSERT_TRUE(hot.fits) << hot.failure;
  // Into the short group every GPU gathers the 7/8 of the model it lacks; back, the data-parallel gradients are
  // already everywhere, so nothing moves.
  ASSERT_EQ(hot.switches.size(), 1u);
  EXPECT_EQ(hot.switches[0].param_bytes, 7 * model_bytes);
  EXPECT_EQ(hot.switches[0].grad_bytes, 0);
  EXPECT_GT(hot.others_s, 0);
  EXPECT_LT(hot.total_s, st.total_s);
  EXPECT_LT(hot.groups[0].time_s + hot.others_s, st.groups[0].time_s);
}

// A handful of short tokens: what data parallelism saves on them is less than moving the model there.
TEST(HotSpa, SwitchingLosesWhenTheShortGroupIsSmall) {
  [[maybe_unused]] const auto [st, hot, model_bytes] = two_groups(8, 1);
  ASSERT_TRUE(st.fits) << st.failure;
  ASSERT_TRUE(hot.fits) << hot.failure;
  EXPECT_GT(hot.others_s, st.groups[0].time_s - hot.groups[0].time_s);
  EXPECT_GT(hot.total_s, st.total_s);
}

// plan --lengths --executable: the search considers only strategies `runnable` accepts, and a group whose graph
// `runnable_graph` refuses does not fit.
// A search that runs in milliseconds: a tiny model on one H100 node, ten documents, two bounds.
struct TinySearch {
  TinySearch() {
    setting.micro_batch_tokens = 64;
    options.bounds = {32, 64};
  }
  const model::ModelConfig model = model::load_model("custom:layers=2,hidden=32,heads=4,kv_heads=2,head_dim=8,ffn_hidden=48,vocab=256");
  const sim::Cluster cluster{hw::load_node("lab-h100"), 1};
  planner::HotSpaSetting setting{model, cluster, model::precision_policy("bf16-mixed")};
  const std::vector<std::int64_t> lengths = {12, 20, 24, 16, 28, 30, 50, 60, 64, 40};
  planner::HotSpaSearchOptions options;
};

TEST(HotSpa, TheSearchKeepsToWhatTheExecutorsRun) {
  TinySearch t;
  planner::HotSpaSetting& s = t.setting;
  const auto& lengths = t.lengths;
  const auto& options = t.options;
  const auto free_choice = planner::search_hotspa(s, lengths, options);
  ASSERT_FALSE(free_choice.best_switched.empty());
  const std::string picked = free_choice.best_switched.back().spec.scheme;
  s.runnable = [&](const planner::StepInputs&, const PlanSpec& spec) { return spec.scheme != picked; };
  const auto kept = planner::search_hotspa(s, lengths, options);
  ASSERT_FALSE(kept.best_switched.empty());
  for (const auto& g : kept.best_switched) EXPECT_NE(g.spec.scheme, picked);
  for (const auto& g : kept.best_static) EXPECT_NE(g.spec.scheme, picked);
  s.runnable = nullptr;
  s.runnable_graph = [](const sim::TaskGraph&) { return false; };
  const auto refused = planner::run_minibatch(s, lengths, {{64, strategy("megatron", 1)}}, "test");
  EXPECT_FALSE(refused.fits);
  EXPECT_NE(refused.failure.find("--executable"), std::string::npos) << refused.failure;
}

// A farm (app/plan_farm.hpp) gets the same search: its range jobs, run by a RangeSimulator prepared from the same
// inputs and carried as records, give the answer the search gives alone.
TEST(HotSpa, AFarmOfRangeJobsGivesTheSameSearch) {
  TinySearch t;
  const planner::HotSpaSetting& s = t.setting;
  const auto& lengths = t.lengths;
  planner::HotSpaSearchOptions& options = t.options;
  const sim::Cluster& cluster = t.cluster;
  const auto alone = planner::search_hotspa(s, lengths, options);
  const planner::RangeSimulator simulator(s, lengths, options);
  std::size_t farmed = 0;
  options.farm = [&](const std::vector<planner::RangeJob>& jobs) {
    std::vector<planner::GroupResult> out;
    for (const auto& g : simulator.run(jobs)) out.push_back(planner::group_result_from_record(planner::group_result_record(g), "test"));
    farmed += jobs.size();
    return out;
  };
  const auto via_farm = planner::search_hotspa(s, lengths, options);
  EXPECT_GT(farmed, 0u);  // the range phase went through the farm
  EXPECT_EQ(via_farm.simulated, alone.simulated);
  EXPECT_EQ(planner::minibatch_json(via_farm.switched_result, cluster), planner::minibatch_json(alone.switched_result, cluster));
  EXPECT_EQ(planner::switch_text(via_farm.best_switched), planner::switch_text(alone.best_switched));
  EXPECT_THROW(planner::group_result_from_record(nlohmann::json{{"lo", 1}}, "rank 1's results"), InputError);
}

TEST(HotSpa, StrategiesParseWithErrorsNamingTheKey) {
  const PlanSpec p = strategy("megatron:tp=2,pp=2", 16);
  EXPECT_EQ(p.as<planner::MegatronParams>().dp, 4);
  EXPECT_EQ(strategy("ulysses:sp=8", 8).as<planner::ZeroParams>().sp, 8);
  try {
    strategy("megatron:tensor=2", 8);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor=2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(strategy("hotspa", 8), InputError);
  // 0 only where it means "not set" (a plan file's value, copied): a count of 0 GPUs is refused, not divided by.
  EXPECT_EQ(strategy("megatron:cp_a2a=0,first_stage_layers=0", 8).as<planner::MegatronParams>().dp, 8);
  EXPECT_THROW(strategy("megatron:tp=0", 8), InputError);
  EXPECT_THROW(strategy("megatron:pp=0", 8), InputError);
  const auto plans = planner::parse_group_plans("4K=megatron:dp=8;32K=megatron:tp=8,micro_batch=2", "--switch", 8);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_TRUE(plans[0].auto_micro_batch);
  EXPECT_FALSE(plans[1].auto_micro_batch);
  EXPECT_THROW(planner::parse_group_plans("32K=megatron:dp=8;4K=megatron:dp=8", "--switch", 8), InputError);
  // switch_text (what plan --lengths prints for run --lengths) reads back to the same plans.
  const auto back = planner::parse_group_plans(planner::switch_text(plans), "test", 8);
  ASSERT_EQ(back.size(), plans.size());
  for (std::size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(back[i].upper, plans[i].upper);
    EXPECT_EQ(back[i].spec.scheme, plans[i].spec.scheme);
    EXPECT_EQ(planner::parameters_json(back[i].spec), planner::parameters_json(plans[i].spec)) << planner::switch_text(plans);
  }
}

TEST(SimGraph, WithoutTasksKeepsTheOrderThroughDroppedTasks) {
  sim::TaskGraph g;
  const auto a = g.elementwise("a", 0, {100, 100});
  const auto b = g.add("opt", {0, {sim::StreamKind::compute, 0}, false, sim::OptimizerStep{1000}}, {a});
  g.elementwise("c", 0, {100, 100}, std::vector<sim::TaskId>{b});
  const auto out = sim::without_tasks(g, [](const sim::Task& t) { return t.kind() == sim::TaskKind::optimizer; });
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out.edges().size(), 1u);
  EXPECT_EQ(out.edges()[0], std::make_pair(sim::TaskId{0}, sim::TaskId{1}));
}

TEST(SimGraph, AttentionDensityScalesItsFlops) {
  sim::Task t{0, {sim::StreamKind::compute, 0}, false, sim::Attention{4096, 4096, 32, 8, 128, true, false, 1.0}};
  const double full = sim::compute_cost(t).model_flops;
  std::get<sim::Attention>(t.params).density = 0.25;
  EXPECT_DOUBLE_EQ(sim::compute_cost(t).model_flops, full / 4);
}

TEST(HotSpaCli, SimulateAndPlanWithLengths) {
  const auto sim = test::run_cli(
      "simulate --lengths dist:github --model llama3.2-1b --hw dgx-a100 --tokens-per-step 256K --max-len 8K --groups 1K,8K "
      "--static megatron:tp=8 --switch '1K=megatron:dp=8,distributed_optimizer=true;8K=megatron:tp=8' --json");
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  const auto j = nlohmann::json::parse(sim.out);
  EXPECT_GT(j["static"]["total_s"].get<double>(), 0);
  EXPECT_GT(j["switched"]["total_s"].get<double>(), 0);
  EXPECT_EQ(j["switched"]["groups"].size(), 2u);
  const auto plan = test::run_cli(
      "plan --lengths dist:github --model llama3.2-1b --hw dgx-a100 --tokens-per-step 128K --max-len 4K --strategies megatron "
      "--per-group 1 --json");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const auto p = nlohmann::json::parse(plan.out);
  EXPECT_TRUE(p["static"]["fits"].get<bool>());
  EXPECT_TRUE(p["switched"]["fits"].get<bool>());
  const auto bad = test::run_cli(
      "simulate --lengths dist:nope --model llama3.2-1b --hw dgx-a100 --tokens-per-step 64K --max-len 4K --static megatron:tp=8");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--lengths"), std::string::npos) << bad.err;
}

// HotSPa's artifact: --batch-sequences documents, --batching ffd-padded; the static total is the whole batch's rows.
TEST(HotSpaCli, DocumentBatchesPackedIntoPaddedRows) {
  const std::string flags = "simulate --lengths dist:github --model llama3.2-1b --hw dgx-a100 --max-len 8K ";
  const auto r = test::run_cli(
      flags + "--batching ffd-padded --batch-sequences 64 --static megatron:tp=8 --switch '2K=megatron:dp=8;8K=megatron:tp=8' --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["sequences"].get<int>(), 64);
  EXPECT_GT(j["static"]["whole_rows"].get<int>(), 0);
  const auto& short_group = j["switched"]["groups"][0];
  EXPECT_EQ(short_group["rows"].get<int>() % 8, 0);  // dp 8: the rows past a multiple of 8 dropped
  EXPECT_EQ(short_group["packed_rows"].get<int>() - short_group["dropped_rows"].get<int>(),
            short_group["row_len"].get<int>() == 2048 ? short_group["rows"].get<int>() : 0);
  for (const auto& [args, expected] :
       std::vector<std::pair<std::string, std::string>>{{"--batching ffd-padded --batch-sequences 64 --tokens-per-step 64K", "exactly one"},
                                                        {"--batching ffd-padded --batch-sequences 0", "a positive number of documents"},
                                                        {"--batch-sequences 64 --batching ffd", "ffd-padded"}}) {
    const auto e = test::run_cli(flags + args + " --static megatron:tp=8");
    EXPECT_EQ(e.exit_code, 2) << args;
    EXPECT_NE(e.err.find(expected), std::string::npos) << e.err;
  }
}

}  // namespace
}  // namespace trainyard
