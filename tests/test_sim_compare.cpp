// `compare` on recorded timelines: a simulated trace read back, against a "measured" one made from it by
// changing known durations, so every expected error is known exactly.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "sim/compare.hpp"
#include "sim/engine.hpp"
#include "sim/graph_json.hpp"
#include "sim/report.hpp"

namespace trainyard::sim {

namespace {

nlohmann::json simulated_trace() {
  const Cluster c(hw::load_node("dgx-a100"), 1);
  GraphDocument doc = load_graph(std::string(TRAINYARD_SOURCE_DIR) + "/examples/two-gpu-offload.json");
  validate(doc.graph, c.gpus(), c.nodes, "example");
  doc.graph.finalize();
  const SimResult r = simulate(doc.graph, c);
  EXPECT_TRUE(r.completed);
  std::ostringstream trace;
  write_chrome_trace(trace, r, doc.graph, c);
  return nlohmann::json::parse(trace.str());
}

// Scales the duration of every slice of `task_class` by `factor` and marks the trace measured.
nlohmann::json scaled(nlohmann::json trace, const std::string& task_class, double factor) {
  for (auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["args"]["class"] == task_class) e["dur"] = e["dur"].get<double>() * factor;
  }
  trace["otherData"]["source"] = "measured";
  return trace;
}

const ComparisonRow& row(const std::vector<ComparisonRow>& rows, const std::string& what) {
  for (const auto& r : rows) {
    if (r.what == what) return r;
  }
  throw std::runtime_error("no row " + what);
}

}  // namespace

TEST(SimCompare, TheTraceCarriesWhatCompareNeeds) {
  const auto trace = simulated_trace();
  const Timeline t = parse_timeline(trace, "predicted.json");
  EXPECT_EQ(t.source, "simulated");
  EXPECT_GT(t.step_ns, 0);
  ASSERT_EQ(t.peak_hbm_bytes.size(), 8u);
  EXPECT_GT(t.peak_hbm_bytes[0], 0);
  EXPECT_EQ(t.process_names.at(0), "gpu0");
  std::set<std::string> classes;
  for (const auto& s : t.slices) classes.insert(s.task_class);
  for (const char* c : {"gemm", "attention fwd", "D2H", "p2p", "collective"}) EXPECT_TRUE(classes.count(c)) << c;
}

TEST(SimCompare, ToTimelineHoldsWhatTheTraceHolds) {
  const Cluster c(hw::load_node("dgx-a100"), 1);
  GraphDocument doc = load_graph(std::string(TRAINYARD_SOURCE_DIR) + "/examples/two-gpu-offload.json");
  doc.graph.finalize();
  const SimResult r = simulate(doc.graph, c);
  std::ostringstream trace;
  write_chrome_trace(trace, r, doc.graph, c);
  const Timeline parsed = parse_timeline(nlohmann::json::parse(trace.str()), "trace.json");
  const Timeline direct = to_timeline(r, doc.graph);
  EXPECT_EQ(direct.step_ns, parsed.step_ns);
  EXPECT_EQ(direct.peak_hbm_bytes, parsed.peak_hbm_bytes);
  EXPECT_EQ(direct.stream_names, parsed.stream_names);
  ASSERT_EQ(direct.slices.size(), parsed.slices.size());
  for (std::size_t i = 0; i < direct.slices.size(); ++i) {
    const auto &a = direct.slices[i], &b = parsed.slices[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(std::tie(a.pid, a.tid, a.task_class), std::tie(b.pid, b.tid, b.task_class)) << a.name;
    EXPECT_NEAR(static_cast<double>(a.start_ns), static_cast<double>(b.start_ns), 1) << a.name;  // the trace keeps ns to 3 decimals of us
    EXPECT_NEAR(static_cast<double>(a.duration_ns), static_cast<double>(b.duration_ns), 1) << a.name;
  }
  // The trace names GPUs by their product and index; the timeline by the index the trace's name ends with.
  for (const auto& [pid, name] : direct.process_names) EXPECT_EQ(parsed.process_names.at(pid), name);
}

TEST(SimCompare, ErrorsPerClassAndStreamAreExact) {
  const auto predicted_json = simulated_trace();
  const Timeline predicted = parse_timeline(predicted_json, "predicted.json");
  const Timeline measured = parse_timeline(scaled(predicted_json, "gemm", 2.0), "measured.json");  // GEMMs took twice as long
  const Comparison c = compare(predicted, measured);
  EXPECT_EQ(c.only_predicted, 0);
  EXPECT_EQ(c.only_measured, 0);
  const auto& gemm = row(c.by_class, "gemm");
  EXPECT_GT(gemm.predicted_ns, 0);
  EXPECT_NEAR(static_cast<double>(gemm.measured_ns), 2.0 * static_cast<double>(gemm.predicted_ns), 2.0 * gemm.predicted_count);  // ns rounding
  EXPECT_NEAR(gemm.error(), -0.5, 1e-3);
  EXPECT_NEAR(row(c.by_class, "attention fwd").error(), 0.0, 1e-9);
  EXPECT_NEAR(row(c.by_class, "D2H").error(), 0.0, 1e-9);
  // The class order is fixed: GEMMs first.
  EXPECT_EQ(c.by_class.front().what, "gemm");
  // Compute streams carry the GEMMs; copy streams did not change.
  EXPECT_LT(row(c.by_stream, "gpu0 compute0").error(), -0.01);
  EXPECT_NEAR(row(c.by_stream, "gpu0 d2h").error(), 0.0, 1e-9);
  // The largest differences are GEMMs, sorted by |difference|.
  ASSERT_FALSE(c.largest.empty());
  for (std::size_t i = 0; i + 1 < c.largest.size(); ++i) {
    EXPECT_GE(std::llabs(c.largest[i].predicted_ns - c.largest[i].measured_ns),
              std::llabs(c.largest[i + 1].predicted_ns - c.largest[i + 1].measured_ns));
  }
  EXPECT_NE(c.largest.front().name.find("qkv"), std::string::npos) << c.largest.front().name;
  // Step time and peak HBM come from otherData, unchanged here.
  EXPECT_EQ(c.step.error(), 0.0);
  EXPECT_EQ(c.peak_hbm_error(), 0.0);

  std::ostringstream text;
  print_comparison(text, c);
  EXPECT_NE(text.str().find("-50.0%"), std::string::npos) << text.str();
  const auto j = comparison_json(c);
  EXPECT_NEAR(j["by_class"][0]["error"].get<double>(), -0.5, 1e-3);
}

TEST(SimCompare, StepAndPeakHbmErrors) {
  auto measured_json = simulated_trace();
  const Timeline predicted = parse_timeline(measured_json, "p.json");
  measured_json["otherData"]["step_ns"] = predicted.step_ns * 2;
  measured_json["otherData"]["selection"]["end_ns"] = predicted.step_ns * 2;          // the whole (longer) step
  measured_json["otherData"]["peak_hbm_bytes"][3] = predicted.peak_hbm_bytes[0] * 4;  // one GPU used 4x the largest predicted peak
  const Comparison c = compare(predicted, parse_timeline(measured_json, "m.json"));
  EXPECT_NEAR(c.step.error(), -0.5, 1e-9);
  EXPECT_NEAR(c.peak_hbm_error(), -0.75, 1e-9);
}

// A timeline trimmed to a window of its step (simulate --trace-window) is refused: its per-step totals are short.
TEST(SimCompare, ATimelineOfPartOfTheStepIsRefused) {
  auto trimmed = simulated_trace();
  const Timeline whole = parse_timeline(simulated_trace(), "whole.json");
  trimmed["otherData"]["selection"]["end_ns"] = whole.step_ns / 2;
  try {
    compare(whole, parse_timeline(trimmed, "trimmed.json"));
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("trimmed.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--trace-window"), std::string::npos) << e.what();
  }
}

TEST(SimCompare, TimelinesOfDifferentPlansAreRejected) {
  auto other = simulated_trace();
  for (auto& e : other["traceEvents"]) {
    if (e["ph"] == "X") e["name"] = "renamed " + e["name"].get<std::string>();
  }
  const Timeline a = parse_timeline(simulated_trace(), "a.json"), b = parse_timeline(other, "b.json");
  try {
    compare(a, b);
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no task of a.json appears in b.json"), std::string::npos) << e.what();
  }
}

TEST(SimCompare, MalformedTimelinesNameTheField) {
  auto trace = simulated_trace();
  trace.erase("otherData");
  EXPECT_THROW(
      {
        try {
          parse_timeline(trace, "t.json");
        } catch (const InputError& e) {
          EXPECT_NE(std::string(e.what()).find("t.json: field 'otherData': expected this field to be present"), std::string::npos) << e.what();
          throw;
        }
      },
      InputError);
  auto bad = simulated_trace();
  for (auto& e : bad["traceEvents"]) {
    if (e["ph"] == "X") {
      e["dur"] = "long";
      break;
    }
  }
  try {
    parse_timeline(bad, "t.json");
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(".dur': expected a number"), std::string::npos) << e.what();
  }
  // A peak past int64's range (the fuzzer's 2.2e129) is refused before the cast, not converted to garbage.
  for (const double peak : {2.22222e129, -1.0}) {
    auto huge = simulated_trace();
    huge["otherData"]["peak_hbm_bytes"][0] = peak;
    try {
      parse_timeline(huge, "t.json");
      FAIL() << "expected an error for peak " << peak;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("peak_hbm_bytes[0]': expected bytes (a number from 0 to 1e18)"), std::string::npos) << e.what();
    }
  }
}

}  // namespace trainyard::sim
