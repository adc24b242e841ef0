// The plan search: sound bounds, pruning that never loses the best plan, determinism, plan files.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"
#include "test_support.hpp"

namespace trainyard::planner {

namespace {

const std::string kData = TRAINYARD_TEST_DATA_DIR;

std::vector<std::string> summaries(const std::vector<RankedPlan>& plans) {
  std::vector<std::string> out;
  for (const auto& p : plans) out.push_back(p.spec.scheme + ": " + p.spec.summary());
  return out;
}

}  // namespace

TEST(Search, LowerBoundsNeverExceedTheSimulation) {
  // Every configuration of every scheme on a small case: the bounds must stay below what the simulation reports.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=256,heads=4,kv_heads=4,vocab=1024");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {32768, 4}, model::precision_policy("bf16-mixed")};  // FPDT needs chunks of 16K+
  const auto specs = enumerate_plans(in, scheme_names());
  ASSERT_GT(specs.size(), 100u);
  std::map<std::string, int> checked, seen, total;
  for (const auto& spec : specs) ++total[spec.scheme];
  for (std::size_t i = 0; i < specs.size(); ++i) {
    // Every third configuration of the large schemes, to keep the test quick; all of the small ones.
    if (seen[specs[i].scheme]++ % (total[specs[i].scheme] > 60 ? 3 : 1) != 0) continue;
    const Bounds b = lower_bounds(in, specs[i]);
    sim::TaskGraph g = build_plan(in, specs[i]);
    g.finalize();
    const sim::SimResult r = sim::simulate(g, c);
    std::int64_t hbm = 0, dram = 0;
    for (int gpu = 0; gpu < 4; ++gpu) hbm = std::max(hbm, r.pools[gpu].peak_bytes);
    dram = r.pools[4].peak_bytes;
    const std::string what = specs[i].scheme + ": " + specs[i].summary();
    if (r.completed) {
      EXPECT_LE(b.step_s, static_cast<double>(r.step_ns) * 1e-9 * (1 + 1e-9)) << what;
      EXPECT_LE(b.hbm_bytes, static_cast<double>(hbm) + 1) << what;
      EXPECT_LE(b.dram_bytes, static_cast<double>(dram) + 1) << what;
      ++checked[specs[i].scheme];
    }
  }
  for (const auto& scheme : scheme_names()) EXPECT_GT(checked[scheme], 0) << scheme << " had no completed configuration to check";
}

TEST(Search, MegatronSearchCoversContextParallelismAndUnevenStages) {
  // 6 layers on 4 GPUs: pp 4 splits them 1, 2, 2, 1 (the middle stages take ceil(6 / 4), the ends the rest), and
  // CP 2 and 4 are searched beside TP and PP. The bounds hold for those plans too.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=6,hidden=256,heads=4,kv_heads=4,vocab=1024");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {16384, 4}, model::precision_policy("bf16-mixed")};
  int uneven = 0, cp = 0;
  for (const auto& spec : enumerate_plans(in, {"megatron"})) {
    const auto& p = spec.as<MegatronParams>();
    if (p.pp == 4) {
      EXPECT_EQ(p.first_stage_layers, 1) << spec.summary();
      EXPECT_EQ(p.last_stage_layers, 1) << spec.summary();
    }
    if (p.pp == 2) {
      EXPECT_EQ(p.first_stage_layers, 0) << spec.summary();  // 3 + 3: even
    }
    if (p.pp != 4 && p.cp == 1) continue;
    sim::TaskGraph g = build_plan(in, spec);
    g.finalize();
    const sim::SimResult r = sim::simulate(g, c);
    if (!r.completed) continue;  // the test node's HBM is small
    EXPECT_LE(lower_bounds(in, spec).step_s, static_cast<double>(r.step_ns) * 1e-9 * (1 + 1e-9)) << spec.summary();
    ++(p.pp == 4 ? uneven : cp);
  }
  EXPECT_GT(uneven, 0);
  EXPECT_GT(cp, 0);
}

TEST(Search, ProbesStopAtTheFirstFitAndSkipWhatIsKnownNotToFit) {
  // max_sequence's probe options: stop_at_first_fit ends the search with the first wave that holds a fitting
  // plan; known_not_to_fit leaves candidates out before their bounds; simulated_misses lists what did not fit.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=256,heads=4,kv_heads=4,vocab=1024");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {16384, 4}, model::precision_policy("bf16-mixed")};
  SearchOptions all;
  all.schemes = {"megatron"};
  const SearchReport full = search(in, all);
  ASSERT_FALSE(full.ranked.empty());
  SearchOptions first = all;
  first.stop_at_first_fit = true;
  const SearchReport quick = search(in, first);
  ASSERT_FALSE(quick.ranked.empty());
  EXPECT_LT(quick.simulated, full.simulated);
  SearchOptions none = all;
  std::atomic<std::size_t> asked{0};  // called on the bounds phase's threads
  none.known_not_to_fit = [&](const PlanSpec&) { return ++asked > 0; };
  const SearchReport skipped = search(in, none);
  EXPECT_TRUE(skipped.ranked.empty());
  EXPECT_EQ(skipped.simulated, 0u);
  EXPECT_EQ(asked.load(), skipped.enumerated);
  EXPECT_EQ(skipped.pruned_memory, skipped.enumerated);
  for (const PlanSpec& miss : full.simulated_misses) {
    EXPECT_TRUE(std::none_of(full.ranked.begin(), full.ranked.end(), [&](const RankedPlan& r) { return r.spec.summary() == miss.summary(); }));
  }
}

TEST(Search, RingTrackBoundsHoldWhereKvBlocksStreamThroughOneBuffer) {
  // Long sequences in small chunks: many K/V blocks per visit, where the one-buffer bound adds the copies.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=256,heads=4,kv_heads=4,vocab=1024");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {256 * 1024, 1}, model::precision_policy("bf16-mixed")};
  for (const std::int64_t chunk : {1024, 4096}) {
    std::map<int, double> bound;
    for (int prefetch : {1, 2}) {
      PlanSpec spec = scheme_named("ringtrack").blank();
      spec.as<RingTrackParams>().ring = 4;
      spec.as<RingTrackParams>().chunk = chunk;
      spec.as<RingTrackParams>().prefetch = prefetch;
      spec.as<RingTrackParams>().acts = ActivationPolicy::recompute;
      const Bounds b = lower_bounds(in, spec);
      sim::TaskGraph g = build_plan(in, spec);
      g.finalize();
      const sim::SimResult r = sim::simulate(g, c);
      ASSERT_TRUE(r.completed) << (r.oom ? r.oom->describe(g) : r.stuck);
      EXPECT_LE(b.step_s, static_cast<double>(r.step_ns) * 1e-9) << spec.summary();
      bound[prefetch] = b.step_s;
    }
    EXPECT_GT(bound[1], bound[2]) << "the one-buffer copies are counted, chunk " << chunk;
  }
}

TEST(Search, PruningNeverLosesTheBestPlan) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,kv_heads=4,vocab=2048");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  int with_gap = 0;  // schemes whose shown best was reached with some of their plans skipped
  for (const std::int64_t seq : {4096, 16384}) {
    const StepInputs in{m, c, {seq, 4}, model::precision_policy("bf16-mixed")};
    for (Objective objective : {Objective::throughput, Objective::min_hbm}) {
      SearchOptions pruned;
      pruned.objective = objective;
      pruned.top = 3;
      SearchOptions full = pruned;
      full.prune = false;
      const SearchReport a = search(in, pruned), b = search(in, full);
      ASSERT_FALSE(a.ranked.empty());
      EXPECT_LT(a.simulated, b.simulated) << "pruning removed nothing";
      EXPECT_EQ(a.enumerated, b.enumerated);
      // The top plans and the best plan of each scheme are the same with and without pruning.
      const std::size_t k = std::min<std::size_t>(3, b.ranked.size());
      EXPECT_EQ(summaries({a.ranked.begin(), a.ranked.begin() + static_cast<std::ptrdiff_t>(k)}),
                summaries({b.ranked.begin(), b.ranked.begin() + static_cast<std::ptrdiff_t>(k)}))
          << seq;
      // Every scheme with a plan that fits shows one; where the bounds skipped some of its plans, the true best is
      // no further ahead than the reported gap.
      ASSERT_EQ(a.best_of_scheme.size(), b.best_of_scheme.size()) << seq;
      for (std::size_t i = 0; i < a.best_of_scheme.size(); ++i) {
        const auto& shown = a.best_of_scheme[i];
        const auto& truth = b.best_of_scheme[i];
        ASSERT_EQ(shown.spec.scheme, truth.spec.scheme);
        auto key = [&](const RankedPlan& p) {
          return objective == Objective::min_hbm ? static_cast<double>(p.metrics.peak_hbm_bytes) : p.metrics.step_s;
        };
        EXPECT_GE(key(shown), key(truth)) << shown.spec.scheme;
        EXPECT_GE(key(truth), key(shown) * (1 - shown.gap) * (1 - 1e-12)) << shown.spec.scheme << " gap " << shown.gap;
        with_gap += shown.gap > 0;
        if (shown.gap == 0) {
          EXPECT_EQ(key(shown), key(truth)) << shown.spec.scheme;
        }
      }
    }
  }
  EXPECT_GT(with_gap, 0) << "the per-scheme gap was never exercised";
}

TEST(Search, TheAnswerDoesNotDependOnTheThreadCount) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,kv_heads=4,vocab=2048");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {16384, 4}, model::precision_policy("bf16-mixed")};
  std::vector<SearchReport> reports;
  for (int threads : {1, 2, 5}) {
    SearchOptions o;
    o.threads = threads;
    reports.push_back(search(in, o));
  }
  for (std::size_t i = 1; i < reports.size(); ++i) {
    EXPECT_EQ(summaries(reports[i].ranked), summaries(reports[0].ranked));
    EXPECT_EQ(reports[i].simulated, reports[0].simulated);
    EXPECT_EQ(reports[i].pruned_time, reports[0].pruned_time);
    ASSERT_EQ(reports[i].ranked.size(), reports[0].ranked.size());
    for (std::size_t j = 0; j < reports[0].ranked.size(); ++j) {
      EXPECT_EQ(reports[i].ranked[j].metrics.step_s, reports[0].ranked[j].metrics.step_s);
    }
  }
}

TEST(Search, NothingFitsReportsTheClosestMiss) {
  const model::ModelConfig m = model::load_model("llama3-405b");
  const sim::Cluster c(hw::load_node("lab-h100"), 1);
  const StepInputs in{m, c, {8192, 1}, model::precision_policy("bf16-mixed")};
  const SearchReport r = search(in, {});
  EXPECT_TRUE(r.ranked.empty());
  ASSERT_TRUE(r.closest_miss.has_value());
  EXPECT_GT(r.closest_miss->metrics.shortfall_bytes, 0);
  EXPECT_FALSE(r.closest_miss->metrics.failure.empty());
}

TEST(Search, QuickPlanIsTheFittingCandidateWithTheBestTimeBound) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,kv_heads=4,vocab=2048");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {32768, 4}, model::precision_policy("bf16-mixed")};
  const double headroom = 0.05, usable = c.node.gpu.hbm_bytes.value * (1 - headroom);
  for (const auto& scheme : scheme_names()) {
    const auto quick = quick_plan(in, scheme, headroom);
    const auto specs = enumerate_plans(in, {scheme});
    ASSERT_EQ(quick.has_value(), !specs.empty()) << scheme;
    if (!quick) continue;
    EXPECT_EQ(quick->scheme, scheme);
    EXPECT_NO_THROW(check_plan(in, *quick));
    const Bounds qb = lower_bounds(in, *quick);
    ASSERT_LE(qb.hbm_bytes, usable) << scheme;  // this tiny model fits every scheme
    for (const auto& spec : specs) {
      const Bounds b = lower_bounds(in, spec);
      if (b.hbm_bytes <= usable && b.dram_bytes <= c.node.host_dram_bytes.value) {
        EXPECT_LE(qb.step_s, b.step_s) << spec.summary();
      }
    }
  }
  // One GPU: Ulysses needs sp > 1, so it has no configuration at all.
  const sim::Cluster one(hw::load_node("lab-h100"), 1);
  EXPECT_FALSE(quick_plan({m, one, {32768, 1}, in.precision}, "ulysses", headroom).has_value());
}

TEST(Search, ChunkSizesAreThePowersOfTwoThatDivideAndTheHalvings) {
  EXPECT_EQ(chunk_sizes(std::int64_t{1} << 20), (std::vector<std::int64_t>{1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144}));
  EXPECT_EQ(chunk_sizes(4096), (std::vector<std::int64_t>{1024, 2048, 4096}));
  EXPECT_EQ(chunk_sizes(1000 * 1024), (std::vector<std::int64_t>{1024, 2000, 2048, 4000, 4096, 8000, 8192, 16000, 32000, 64000, 128000, 256000}));
}

TEST(PlanFile, RoundTripsEveryScheme) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,kv_heads=4,vocab=2048");
  const sim::Cluster c(hw::load_node(kData + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {32768, 4}, model::precision_policy("bf16-mixed")};
  const auto specs = enumerate_plans(in, scheme_names());
  const std::string path = ::testing::TempDir() + "/roundtrip-plan.json";
  std::map<std::string, int> seen, count;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (count[specs[i].scheme]++ % 7 != 0) continue;
    PlanFile file;
    file.model = "custom:layers=4,hidden=512,heads=8,kv_heads=4,vocab=2048";
    file.hw = kData + "/ring-node.json";
    file.workload = in.workload;
    file.spec = specs[i];
    std::ofstream(path) << plan_file_json(file).dump(2);
    const PlanFile back = read_plan_file(path);
    EXPECT_EQ(back.spec.scheme, specs[i].scheme);
    EXPECT_EQ(parameters_json(back.spec), parameters_json(specs[i]));
    EXPECT_EQ(back.spec.summary(), specs[i].summary());
    ++seen[specs[i].scheme];
  }
  for (const auto& scheme : scheme_names()) EXPECT_GT(seen[scheme], 0) << scheme;
}

TEST(PlanFile, RoundTripsMegatronContextParallelCommTypes) {
  for (CpComm comm : {CpComm::p2p, CpComm::all_gather, CpComm::a2a, CpComm::a2a_p2p}) {
    PlanSpec spec = scheme_named("megatron").blank();
    spec.as<MegatronParams>().cp = 4;
    spec.as<MegatronParams>().cp_comm = comm;
    spec.as<MegatronParams>().cp_a2a = comm == CpComm::a2a_p2p ? 2 : 0;
    const PlanSpec back = parse_parameters("megatron", parameters_json(spec), "test");
    EXPECT_EQ(back.as<MegatronParams>().cp_comm, comm) << to_string(comm);
    EXPECT_EQ(back.as<MegatronParams>().cp_a2a, spec.as<MegatronParams>().cp_a2a) << to_string(comm);
    EXPECT_EQ(back.summary(), spec.summary());
  }
}

TEST(PlanFile, BadFilesNameTheFieldAndTheFile) {
  const std::string path = ::testing::TempDir() + "/bad-plan.json";
  auto error_of = [&](const std::string& text) -> std::string {
    std::ofstream(path) << text;
    try {
      read_plan_file(path);
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string head = R"({"format": "trainyard.plan.v1", "model": "llama3-8b", "hw": "dgx-a100", "nodes": 1,
    "workload": {"seq_len": 65536, "global_batch": 1}, "precision": "bf16-mixed", )";
  const std::string ring = R"("parameters": {"ring": 8, "block": 1, "chunk": 16384, "prefetch": 2, "kv": "dram",
    "acts": "recompute", "weights": "resident", "states": "hbm", "ring_order": []}})";
  EXPECT_EQ(error_of(head + R"("scheme": "ringtrack", )" + ring), "no error");
  const std::string unknown = error_of(head + R"("scheme": "warp-drive", )" + ring);
  EXPECT_NE(unknown.find("bad-plan.json"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("scheme"), std::string::npos) << unknown;
  std::string missing = ring;
  missing.replace(missing.find(R"("prefetch": 2, )"), 15, "");
  const std::string miss = error_of(head + R"("scheme": "ringtrack", )" + missing);
  EXPECT_NE(miss.find("parameters.prefetch"), std::string::npos) << miss;
  const std::string typo = error_of(head + R"("scheme": "ringtrack", )" + ring.substr(0, ring.size() - 2) + R"(, "chunks": 3}})");
  EXPECT_NE(typo.find("parameters.chunks"), std::string::npos) << typo;
}

}  // namespace trainyard::planner

namespace trainyard::planner {

TEST(Search, MaxSequenceIsTheLongestThatFits) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=4,hidden=512,heads=8,kv_heads=4,vocab=2048");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/ring-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {4096, 1}, model::precision_policy("bf16-mixed")};
  SearchOptions o;
  o.top = 1;
  const auto best = max_sequence(in, "ulysses", o);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->seq_len % 1024, 0);
  EXPECT_TRUE(best->plan.metrics.fits);
  // One step of the resolution longer (1K, or 1/64 of the length where that is more) does not fit (or has no
  // valid configuration).
  o.schemes = {"ulysses"};
  const std::int64_t resolution = std::max<std::int64_t>(1024, (best->seq_len / 64 + 1023) / 1024 * 1024);
  const StepInputs longer{m, c, {best->seq_len + resolution, 1}, model::precision_policy("bf16-mixed")};
  EXPECT_TRUE(search(longer, o).ranked.empty()) << best->seq_len;
  // Its plan is the throughput search's best at that length, although max_sequence's last search skips the
  // configurations its probes saw miss.
  const StepInputs at{m, c, {best->seq_len, 1}, model::precision_policy("bf16-mixed")};
  const SearchReport direct = search(at, o);
  ASSERT_FALSE(direct.ranked.empty());
  EXPECT_EQ(direct.ranked.front().spec.summary(), best->plan.spec.summary());
  EXPECT_EQ(direct.ranked.front().metrics.step_s, best->plan.metrics.step_s);
}

// The estimate prunes beside the bounds on a real model and node: the same top plans and per-scheme bests as the
// bounds alone and as no pruning at all, with fewer simulations than the bounds alone.
TEST(Search, PruningByTheEstimateKeepsTheAnswer) {
  const model::ModelConfig m = model::load_model("llama3.2-1b");
  const sim::Cluster c(hw::load_node("dgx-a100"), 1);
  const StepInputs in{m, c, {32 * 1024, 1}, model::precision_policy("bf16-mixed")};
  SearchOptions estimate;
  estimate.top = 3;
  SearchOptions bounds = estimate;
  bounds.prune_by_estimate = false;
  SearchOptions full = bounds;
  full.prune = false;
  const SearchReport a = search(in, estimate), b = search(in, bounds), f = search(in, full);
  ASSERT_GE(f.ranked.size(), 3u);
  EXPECT_GT(a.pruned_estimate, 0u) << "the estimate pruned nothing";
  EXPECT_EQ(b.pruned_estimate, 0u);
  EXPECT_LT(a.simulated, b.simulated);
  const auto top3 = [](const SearchReport& r) { return summaries({r.ranked.begin(), r.ranked.begin() + 3}); };
  EXPECT_EQ(top3(a), top3(f));
  EXPECT_EQ(top3(b), top3(f));
  ASSERT_EQ(a.best_of_scheme.size(), f.best_of_scheme.size());
  for (std::size_t i = 0; i < a.best_of_scheme.size(); ++i) {
    const double shown = a.best_of_scheme[i].metrics.step_s, truth = f.best_of_scheme[i].metrics.step_s;
    EXPECT_GE(truth, shown * (1 - a.best_of_scheme[i].gap) * (1 - 1e-12)) << a.best_of_scheme[i].spec.scheme;
  }
}

// max-seq bracketed by the estimate and confirmed by the simulator gives the simulator's own bisection's answer.
TEST(Search, MaxSequenceByTheEstimateEqualsTheSimulators) {
  const model::ModelConfig m = model::load_model("llama3.2-1b");
  const sim::Cluster c(hw::load_node("dgx-a100"), 1);
  const StepInputs in{m, c, {32 * 1024, 1}, model::precision_policy("bf16-mixed")};
  for (const std::string scheme : {"ulysses", "megatron"}) {
    SearchOptions estimate;
    SearchOptions exact = estimate;
    exact.prune_by_estimate = false;
    const auto a = max_sequence(in, scheme, estimate), b = max_sequence(in, scheme, exact);
    ASSERT_TRUE(a && b) << scheme;
    EXPECT_EQ(a->seq_len, b->seq_len) << scheme;
    EXPECT_EQ(a->plan.spec.summary(), b->plan.spec.summary()) << scheme;
    EXPECT_EQ(a->plan.metrics.step_s, b->plan.metrics.step_s) << scheme;
    EXPECT_EQ(a->limited_by_budget, b->limited_by_budget) << scheme;
  }
}

}  // namespace trainyard::planner
