// Chrome traces kept to a part of the step (--trace-gpus, --trace-window, --trace-counters) and the default that
// keeps a long step's trace small enough to open.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "hwprofiles/catalog.hpp"
#include "sim/compare.hpp"
#include "sim/engine.hpp"
#include "sim/graph_json.hpp"
#include "sim/report.hpp"
#include "test_support.hpp"

namespace trainyard::sim {

namespace {

struct Simulated {
  Cluster cluster{hw::load_node("dgx-a100"), 1};
  TaskGraph graph;
  SimResult result;
  Simulated() {
    GraphDocument doc = load_graph(std::string(TRAINYARD_SOURCE_DIR) + "/examples/two-gpu-offload.json");
    validate(doc.graph, cluster.gpus(), cluster.nodes, "example");
    graph = std::move(doc.graph);
    graph.finalize();
    result = simulate(graph, cluster);
  }
  nlohmann::json trace(const TraceSelection& selection) const {
    std::ostringstream out;
    write_chrome_trace(out, result, graph, cluster, "simulated", selection);
    return nlohmann::json::parse(out.str());  // throws on invalid JSON
  }
};

const Simulated& example() {
  static const Simulated s;
  return s;
}

std::set<int> slice_pids(const nlohmann::json& trace) {
  std::set<int> pids;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") pids.insert(e["pid"].get<int>());
  }
  return pids;
}

int count(const nlohmann::json& trace, const std::string& ph) {
  int n = 0;
  for (const auto& e : trace["traceEvents"]) n += e["ph"] == ph;
  return n;
}

}  // namespace

TEST(TraceSelection, EverythingByDefaultWithTheSelectionInOtherData) {
  const auto& s = example();
  const auto t = s.trace({});
  EXPECT_EQ(slice_pids(t), (std::set<int>{0, 1}));
  EXPECT_GT(count(t, "C"), 0);
  const auto& sel = t["otherData"]["selection"];
  EXPECT_EQ(sel["gpus"], nlohmann::json::array({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(sel["slices_left_out"], 0);
  EXPECT_EQ(sel["slices_written"], count(t, "X"));
  // trace_events counts what is written, and its size estimate is close to the written size.
  const auto events = trace_events(s.result, s.graph, s.cluster, {});
  EXPECT_EQ(events.size(), static_cast<std::size_t>(count(t, "X") + count(t, "C")));
  std::int64_t estimate = 0;
  for (const auto& e : events) estimate += e.bytes;
  std::ostringstream written;
  write_chrome_trace(written, s.result, s.graph, s.cluster);
  EXPECT_GT(static_cast<double>(estimate), 0.7 * static_cast<double>(written.str().size()));
  EXPECT_LT(static_cast<double>(estimate), 1.3 * static_cast<double>(written.str().size()));
}

TEST(TraceSelection, GpusKeepOnlyTheirTracksAndTheirHost) {
  const auto& s = example();
  TraceSelection one;
  one.gpus = {1};
  const auto t = s.trace(one);
  EXPECT_EQ(slice_pids(t), (std::set<int>{1}));
  std::set<int> processes;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(processes, (std::set<int>{1, 8, 1000000}));  // gpu1, host0, links
  EXPECT_EQ(t["otherData"]["selection"]["gpus"], nlohmann::json::array({1}));
  EXPECT_GT(t["otherData"]["selection"]["slices_left_out"].get<int>(), 0);
  // What compare needs is still there: every GPU's peak HBM, and the slices parse back.
  EXPECT_EQ(parse_timeline(t, "one.json").peak_hbm_bytes.size(), 8u);
}

TEST(TraceSelection, WindowKeepsOverlappingSlicesAndCarriesCounterLevels) {
  const auto& s = example();
  TraceSelection w;
  w.start_ns = s.result.step_ns / 3;
  w.end_ns = 2 * s.result.step_ns / 3;
  const auto t = s.trace(w);
  const auto all = s.trace({});
  EXPECT_LT(count(t, "X"), count(all, "X"));
  EXPECT_GT(count(t, "X"), 0);
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      const double start_us = e["ts"].get<double>(), end_us = start_us + e["dur"].get<double>();
      EXPECT_GE(end_us * 1000 + 1, static_cast<double>(w.start_ns));
      EXPECT_LE(start_us * 1000 - 1, static_cast<double>(w.end_ns));
    } else if (e["ph"] == "C") {
      const double ns = e["ts"].get<double>() * 1000;
      EXPECT_GE(ns + 1, static_cast<double>(w.start_ns));
      EXPECT_LE(ns - 1, static_cast<double>(w.end_ns));
    }
  }
  EXPECT_EQ(t["otherData"]["selection"]["end_ns"], w.end_ns);
}

TEST(TraceSelection, CountersOff) {
  const auto& s = example();
  TraceSelection off;
  off.counters = false;
  const auto t = s.trace(off);
  EXPECT_EQ(count(t, "C"), 0);
  EXPECT_EQ(count(t, "X"), count(s.trace({}), "X"));
  EXPECT_FALSE(t["otherData"]["selection"]["counters"].get<bool>());
}

// --- the CLI ---------------------------------------------------------------------------------------------------

namespace {

nlohmann::json read_trace(const std::string& path) { return nlohmann::json::parse(test::read_file(path)); }

// A mid-size step: llama3-8b at 256K tokens, ring-track with 2K chunks on a DGX A100 (76 MB as a whole trace).
const std::string kMidSize = "simulate --strategy ringtrack --model llama3-8b --hw dgx-a100 --seq 256K --global-batch 1 --chunk 2K --json";

}  // namespace

TEST(TraceCli, DefaultTraceOfALongStepIsBoundedAndSaysWhatItKept) {
  test::TempDir dir;
  const std::string small = (dir.path() / "default.json").string(), full = (dir.path() / "all.json").string();
  const auto d = test::run_cli(kMidSize + " --trace " + small);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const auto f = test::run_cli(kMidSize + " --trace " + full + " --trace-gpus all");
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const auto small_bytes = std::filesystem::file_size(small), full_bytes = std::filesystem::file_size(full);
  EXPECT_LT(small_bytes, 50u << 20);
  EXPECT_LT(small_bytes * 3, full_bytes) << "the default should keep one GPU of eight";
  const auto t = read_trace(small);  // valid JSON, Chrome trace form
  ASSERT_TRUE(t["traceEvents"].is_array());
  EXPECT_EQ(t["otherData"]["selection"]["gpus"], nlohmann::json::array({0}));
  EXPECT_GT(t["otherData"]["selection"]["slices_left_out"].get<int>(), 0);
  const auto pids = slice_pids(t);
  EXPECT_TRUE(pids.count(0));
  for (int pid : pids) EXPECT_TRUE(pid == 0 || pid == 8) << pid;  // GPU 0 and its host
  EXPECT_NE(d.err.find("GPU 0 of 8 with its host"), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("--trace-gpus all"), std::string::npos) << d.err;
  EXPECT_EQ(read_trace(full)["otherData"]["selection"]["slices_left_out"], 0);
}

TEST(TraceCli, SmallStepsGetTheWholeTrace) {
  test::TempDir dir;
  const std::string path = (dir.path() / "t.json").string();
  const auto r = test::run_cli("simulate --graph " + std::string(TRAINYARD_SOURCE_DIR) + "/examples/two-gpu-offload.json --trace " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto t = read_trace(path);
  EXPECT_EQ(slice_pids(t), (std::set<int>{0, 1}));
  EXPECT_EQ(t["otherData"]["selection"]["slices_left_out"], 0);
}

TEST(TraceCli, EachFlagChangesTheTrace) {
  test::TempDir dir;
  const std::string graph = "simulate --graph " + std::string(TRAINYARD_SOURCE_DIR) + "/examples/two-gpu-offload.json --trace ";
  const std::string a = (dir.path() / "a.json").string(), b = (dir.path() / "b.json").string(), c = (dir.path() / "c.json").string();
  ASSERT_EQ(test::run_cli(graph + a + " --trace-gpus 1").exit_code, 0);
  EXPECT_EQ(slice_pids(read_trace(a)), (std::set<int>{1}));
  ASSERT_EQ(test::run_cli(graph + b + " --trace-counters off").exit_code, 0);
  EXPECT_EQ(count(read_trace(b), "C"), 0);
  ASSERT_EQ(test::run_cli(graph + c + " --trace-window 0:0.001").exit_code, 0);
  const auto w = read_trace(c);
  EXPECT_EQ(w["otherData"]["selection"]["end_ns"], 1000);
  for (const auto& e : w["traceEvents"]) {
    if (e["ph"] == "X") {
      EXPECT_LE(e["ts"].get<double>(), 1.0);
    }
  }
}

TEST(TraceCli, BadTraceFlagsNameTheFlag) {
  const std::string graph = "simulate --graph " + std::string(TRAINYARD_SOURCE_DIR) + "/examples/two-gpu-offload.json ";
  for (const std::string bad : {"--trace-gpus 8", "--trace-gpus 3-1", "--trace-gpus x", "--trace-window 5:2", "--trace-window 5",
                                "--trace-window -1:2", "--trace-counters maybe"}) {
    test::TempDir dir;
    const auto r = test::run_cli(graph + "--trace " + (dir.path() / "t.json").string() + " " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find(bad.substr(0, bad.find(' '))), std::string::npos) << r.err;
  }
  const auto r = test::run_cli(graph + "--trace-gpus 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("only with --trace"), std::string::npos) << r.err;
}

}  // namespace trainyard::sim
