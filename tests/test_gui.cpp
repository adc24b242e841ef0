// trainyard-gui under QT_QPA_PLATFORM=offscreen (QTest): the window builds and fills its charts, the sequence
// length recomputes chart 2, a table row drives charts 3 and 4, bad input shows an error, files round-trip; and the
// GUI's plain functions (what_if.hpp).
#include <QFile>
#include <QTemporaryDir>
#include <QtTest/QtTest>

#include <fstream>
#include <set>

#include "common/json_reader.hpp"
#include "gui/charts.hpp"
#include "gui/main_window.hpp"
#include "gui/param_panel.hpp"
#include "gui/what_if.hpp"
#include "planner/estimate.hpp"
#include "planner/plan.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"

using namespace trainyard;
using namespace trainyard::gui;

namespace {

constexpr int kWaitMs = 120000;  // a generous bound on a small model's charts; tests fail rather than hang
constexpr int kPlanColumn = 9;   // the ranked table's plan description
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
const QString kTinyPlan = QStringLiteral(TRAINYARD_SOURCE_DIR "/examples/tiny-ringtrack.plan.json");

// A small model on one GPU: every chart completes in a few seconds.
WhatIfInputs small_inputs() {
  WhatIfInputs in;
  in.model = "custom:layers=2,hidden=256,heads=4,kv_heads=2,ffn_hidden=512,vocab=1024";
  in.hw = "lab-h100";
  in.seq_len = 65536;
  in.schemes = {"ringtrack", "zero"};
  return in;
}

std::vector<double> xs(const QList<QPointF>& points) {
  std::vector<double> out;
  for (const auto& p : points) out.push_back(p.x());
  return out;
}

// Pixels of `image` within a small distance of `color` (anti-aliased edges blend, the core of a line does not).
int pixels_of(const QImage& image, QColor color) {
  int n = 0;
  for (int y = 0; y < image.height(); ++y) {
    for (int x = 0; x < image.width(); ++x) {
      const QColor c = image.pixelColor(x, y);
      if (std::abs(c.red() - color.red()) + std::abs(c.green() - color.green()) + std::abs(c.blue() - color.blue()) < 40) ++n;
    }
  }
  return n;
}

// A chart point as the window's jobs deliver it.
Point point(const std::string& scheme, std::int64_t x, bool fits, double hbm_gib, double dram_gib, double mfu = 0.4) {
  Point p;
  p.scheme = scheme;
  p.x = x;
  p.metrics.fits = fits;
  p.metrics.mfu = mfu;
  p.metrics.step_s = 1;
  p.out_of_memory = !fits;
  p.hbm_needed_bytes = static_cast<std::int64_t>(hbm_gib * kGiB);
  p.dram_needed_bytes = static_cast<std::int64_t>(dram_gib * kGiB);
  return p;
}

// The window's ringtrack plan at 64K with another chunk than `chunk`.
std::int64_t another_chunk(std::int64_t chunk) {
  for (std::int64_t c : chunk_sweep("ringtrack", 65536)) {
    if (c != chunk) return c;
  }
  return 0;
}

}  // namespace

class GuiTest : public QObject {
  Q_OBJECT

 private slots:
  void sweep_lengths_are_powers_of_two_around_the_sequence() {
    QCOMPARE(memory_sweep_lengths(std::int64_t{1} << 20),
             (std::vector<std::int64_t>{16384, 32768, 65536, 131072, 262144, 524288, 1 << 20, 1 << 21, 1 << 22}));
    QCOMPARE(memory_sweep_lengths(65536), (std::vector<std::int64_t>{4096, 8192, 16384, 32768, 65536, 131072, 262144}));
    QCOMPARE(memory_sweep_lengths(kMaxSeqLen).back(), kMaxSeqLen);  // clamped to the control's range
    QCOMPARE(memory_sweep_lengths(4096).front(), std::int64_t{4096});
  }

  void chunk_sweeps_leave_out_graphs_too_large_to_simulate() {
    const auto rt = chunk_sweep("ringtrack", std::int64_t{1} << 20);
    QCOMPARE(rt.front(), std::int64_t{1024});  // 1024 chunks: the limit
    QVERIFY(chunk_sweep("ringtrack", std::int64_t{1} << 21).front() == 2048);
    QCOMPARE(chunk_sweep("fpdt", std::int64_t{1} << 20).front(), std::int64_t{8192});  // 128 chunks
    QVERIFY(chunk_sweep("zero", std::int64_t{1} << 20).empty());
    planner::PlanSpec fpdt = planner::scheme_named("fpdt").blank();
    fpdt.as<planner::ZeroParams>().fpdt_chunk = 4096;
    QVERIFY(!too_large_to_simulate(fpdt, std::int64_t{1} << 20).empty());
    QVERIFY(too_large_to_simulate(with_chunk(fpdt, 8192), std::int64_t{1} << 20).empty());
  }

  void chart_plan_prefers_the_given_plans_where_valid() {
    const Setup setup(small_inputs());
    const planner::StepInputs in = setup.at(65536);
    planner::PlanSpec mine = planner::scheme_named("ringtrack").blank();
    mine.as<planner::RingTrackParams>().chunk = 8192;
    mine.as<planner::RingTrackParams>().acts = planner::ActivationPolicy::recompute;
    const auto kept = chart_plan(in, "ringtrack", {mine}, 0.05);
    QVERIFY(kept.has_value());
    QCOMPARE(kept->summary(), mine.summary());
    // At 4K tokens an 8K chunk does not divide the sequence: the nearest chunk that does (4K) replaces it.
    const auto shorter = chart_plan(setup.at(4096), "ringtrack", {mine}, 0.05);
    QVERIFY(shorter.has_value());
    QCOMPARE(chunk_of(*shorter), std::int64_t{4096});
    // Another scheme ignores it: the planner's quick pick.
    const auto zero = chart_plan(in, "zero", {mine}, 0.05);
    QVERIFY(zero.has_value());
    QCOMPARE(zero->scheme, std::string("zero"));
    QVERIFY(!chart_plan(in, "ulysses", {mine}, 0.05).has_value());  // one GPU: no Ulysses
  }

  void the_stack_reaches_the_cluster_and_the_saved_plan() {
    WhatIfInputs in = small_inputs();
    in.stack = "torchtitan";
    const Setup setup(in);
    QCOMPARE(setup.cluster.stack.name, std::string("torchtitan"));
    planner::PlanSpec spec = planner::scheme_named("zero").blank();
    QCOMPARE(plan_file(setup, spec, nullptr).stack, std::string("torchtitan"));
    in.stack = "no-such-stack";
    QVERIFY_THROWS_EXCEPTION(InputError, Setup{in});
  }

  void a_point_whose_graph_is_over_the_budget_is_left_out_with_the_reason() {
    const Setup setup(small_inputs());
    planner::StepInputs in = setup.at(65536);
    in.workload.global_batch = std::int64_t{1} << 24;  // millions of micro-batches: an estimate of many GiB
    planner::PlanSpec spec = planner::scheme_named("zero").blank();
    QVERIFY(planner::estimate_plan(in, spec).bytes > graph_memory_gate().budget_bytes());
    const Point p = simulate_point(in, spec, 0.05, 65536);
    QVERIFY2(p.skipped.find("over the window's memory budget") != std::string::npos, p.skipped.c_str());
    QVERIFY(!p.metrics.fits);
  }

  void a_step_that_runs_out_of_memory_reports_at_least_the_capacity() {
    WhatIfInputs big = small_inputs();
    big.model = "llama3-8b";
    const Setup setup(big);
    planner::PlanSpec spec = planner::scheme_named("zero").blank();  // whole model states and a 64K activation set on one 80 GB GPU: does not fit
    const Point p = simulate_point(setup.at(65536), spec, 0.05, 65536);
    QVERIFY(p.skipped.empty());
    QVERIFY(!p.metrics.fits);
    QVERIFY(p.out_of_memory);
    QVERIFY(static_cast<double>(p.hbm_needed_bytes) > setup.cluster.node.gpu.hbm_bytes.value);
  }

  void the_window_builds_and_fills_every_chart() {
    MainWindow w(small_inputs());
    w.resize(1400, 900);
    w.show();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.error_text(), QString());
    QVERIFY(w.chunk_chart()->points("ringtrack") > 0);
    QCOMPARE(w.chunk_chart()->points("zero"), 1);  // no chunk: one plan, drawn flat
    QVERIFY(w.memory_chart()->total_points() > 0);
    QVERIFY(w.plan_table()->rowCount() > 0);
    QVERIFY(w.selected_detail() != nullptr);
    QVERIFY(w.step_memory_chart()->points() > 0);
    QVERIFY(w.timeline()->predicted_slices() > 0);
    QVERIFY(w.timeline()->stream_rows() >= 1);
    QCOMPARE(w.status_text(), QString("ready"));
  }

  void changing_the_sequence_length_recomputes_chart_two() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.memory_chart()->points("ringtrack"), 7);  // 4K .. 256K around 64K
    QCOMPARE(w.memory_chart()->points("zero"), 7);
    w.set_seq_len(16384);
    w.recompute_now();
    QVERIFY(w.jobs().pending() > 0);  // the work runs on workers: the call returned before it was done
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.setup()->inputs.seq_len, std::int64_t{16384});
    QCOMPARE(w.memory_chart()->points("ringtrack"), 5);  // 4K .. 64K around 16K
    QCOMPARE(w.memory_chart()->points("zero"), 5);
    QCOMPARE(w.memory_chart()->total_points(), 10);
    QCOMPARE(xs(w.memory_chart()->hbm_points("ringtrack")), (std::vector<double>{4096, 8192, 16384, 32768, 65536}));
  }

  void a_change_cancels_stale_work() {
    MainWindow w(small_inputs());
    // Two moves in a row without waiting: only the last one's points may arrive.
    w.set_seq_len(8192);
    w.recompute_now();
    w.set_seq_len(32768);
    w.recompute_now();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.setup()->inputs.seq_len, std::int64_t{32768});
    QCOMPARE(w.memory_chart()->points("ringtrack"), 6);  // 4K .. 128K
    QCOMPARE(w.plan_table()->rowCount() > 0, true);
  }

  // The estimate's ranking, shown while the search simulates, is marked in every row; picking one of its rows
  // selects that plan; the simulated ranking replaces it.
  void the_provisional_table_is_labelled() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    planner::SearchOptions options;
    options.schemes = w.setup()->inputs.schemes;
    options.top = 3;
    std::vector<planner::EstimatedPlan> plans;
    options.estimated = [&](const std::vector<planner::EstimatedPlan>& p) { plans = p; };
    planner::search(w.setup()->at(w.setup()->inputs.seq_len), options);
    QVERIFY(plans.size() >= 2);
    w.show_provisional(plans);
    QTableWidget* table = w.plan_table();
    QCOMPARE(table->rowCount(), static_cast<int>(plans.size()));
    for (int row = 0; row < table->rowCount(); ++row) {
      QVERIFY(table->item(row, 0)->text().startsWith("~"));
      QVERIFY2(table->item(row, 2)->text().contains("(est.)"), qPrintable(table->item(row, 2)->text()));
      QVERIFY(table->item(row, 2)->toolTip().contains("ESTIMATE"));
    }
    table->selectRow(1);
    QCOMPARE(QString::fromStdString(w.selected_plan()->summary()), QString::fromStdString(plans[1].spec.summary()));
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    w.recompute_now();  // a new search: its simulated ranking replaces the estimate's
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    for (int row = 0; row < table->rowCount(); ++row) QVERIFY(!table->item(row, 0)->text().startsWith("~"));
  }

  // Charts 1 and 2 show the estimate's points first, faded, each replaced by its simulated point when that comes.
  void the_charts_show_the_estimate_until_simulated() {
    MainWindow w(small_inputs());
    const std::vector<std::string> schemes = small_inputs().schemes;
    const auto estimated = [&] {
      int n = 0;
      for (const auto& scheme : schemes) n += w.chunk_chart()->estimated_points(scheme) + w.memory_chart()->estimated_points(scheme);
      return n;
    };
    int shown = -1;
    QObject::connect(&w, &MainWindow::chart_updated, [&](int chart) {
      if (chart == 7 && shown < 0) shown = estimated();
    });
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QVERIFY2(shown > 0, "no provisional chart point was drawn");
    for (const auto& scheme : schemes) {
      QVERIFY(w.chunk_chart()->points(scheme) > 0);
      QVERIFY(w.memory_chart()->points(scheme) > 0);
    }
    QCOMPARE(estimated(), 0);  // every point was simulated here, so none is left provisional

    // The chart itself: a provisional point gives way to the simulated one and never comes back over it.
    ChunkChart chart;
    chart.reset({"ringtrack"}, 1024, 8192);
    Point p;
    p.scheme = "ringtrack";
    p.x = 4096;
    p.metrics.fits = true;
    p.metrics.mfu = 0.4;
    p.metrics.step_s = 1;
    p.provisional = true;
    chart.add_point(p);
    chart.add_point(p);
    QCOMPARE(chart.estimated_points("ringtrack"), 1);
    Point simulated = p;
    simulated.provisional = false;
    chart.add_point(simulated);
    QCOMPARE(chart.estimated_points("ringtrack"), 0);
    chart.add_point(p);
    QCOMPARE(chart.estimated_points("ringtrack"), 0);
    QCOMPARE(chart.points("ringtrack"), 1);
  }

  void selecting_a_row_updates_charts_three_and_four() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTableWidget* table = w.plan_table();
    QVERIFY(table->rowCount() >= 2);
    QVERIFY(w.selected_plan().has_value());
    const int row = table->rowCount() - 1;
    const QString plan = table->item(row, kPlanColumn)->text();
    const QString scheme = table->item(row, 1)->text();
    QVERIFY(QString::fromStdString(w.selected_plan()->summary()) != plan || w.selected_plan()->scheme != scheme.toStdString());
    table->selectRow(row);
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(QString::fromStdString(w.selected_plan()->summary()), plan);
    QVERIFY(w.selected_detail() != nullptr);
    QCOMPARE(QString::fromStdString(w.selected_detail()->spec.summary()), plan);
    QVERIFY(w.step_memory_chart()->points() > 0);
    // Chart 4 shows the new plan's tasks: the timeline's step is the new plan's.
    QCOMPARE(w.timeline()->view().second, static_cast<double>(w.selected_detail()->result->step_ns));
    QVERIFY(w.timeline()->predicted_slices() > 0);
    QCOMPARE(w.error_text(), QString());
  }

  void a_bad_profile_path_shows_an_error() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    w.set_hw("/nonexistent/node.json");
    w.recompute_now();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QVERIFY2(w.error_text().contains("/nonexistent/node.json"), qPrintable(w.error_text()));
    QCOMPARE(w.memory_chart()->total_points(), 0);
    QCOMPARE(w.plan_table()->rowCount(), 0);
    // A malformed profile names its field.
    QTemporaryDir dir;
    const QString path = dir.filePath("broken.json");
    std::ofstream(path.toStdString()) << "{\"name\": \"broken\", \"gpu\": 3}";
    w.set_hw(path);
    w.recompute_now();
    QVERIFY(w.error_text().contains("broken.json"));
    // A good one clears it.
    w.set_hw("lab-h100");
    w.recompute_now();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.error_text(), QString());
    QVERIFY(w.memory_chart()->total_points() > 0);
  }

  void plans_traces_and_charts_round_trip_through_files() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTemporaryDir dir;
    const QString plan = dir.filePath("plan.json");
    QVERIFY(w.save_plan(plan));
    const planner::PlanFile file = planner::read_plan_file(plan.toStdString());
    QCOMPARE(file.spec.summary(), w.selected_plan()->summary());
    QCOMPARE(file.workload.seq_len, std::int64_t{65536});
    QCOMPARE(file.hw, std::string("lab-h100"));
    QVERIFY(file.predicted.contains("step_s"));

    // Open it in a fresh window at another length: the plan's inputs and parameters come back.
    WhatIfInputs other = small_inputs();
    other.seq_len = 16384;
    MainWindow w2(other);
    QVERIFY(w2.open_plan(plan));
    QVERIFY(w2.jobs().wait_idle(kWaitMs));
    QCOMPARE(w2.setup()->inputs.seq_len, std::int64_t{65536});
    QCOMPARE(w2.selected_plan()->summary(), file.spec.summary());
    QCOMPARE(w2.error_text(), QString());

    const QString trace = dir.filePath("trace.json");
    QVERIFY(w.save_trace(trace));
    QVERIFY(w.open_measured(trace));  // the prediction against itself: every task matches
    QVERIFY(w.timeline()->has_measured());
    QCOMPARE(w.timeline()->measured_slices(), w.timeline()->predicted_slices());

    for (const char* name : {"chart.png", "chart.svg"}) {
      const QString path = dir.filePath(name);
      QVERIFY(w.save_chart(w.memory_chart(), path));
      QVERIFY(QFileInfo(path).size() > 1000);
      QVERIFY(!QFile::exists(path + ".tmp"));
    }
    QVERIFY(!w.save_chart(w.memory_chart(), dir.filePath("chart.bmp")));
    QVERIFY(w.error_text().contains(".png or .svg"));
    QVERIFY(!w.open_plan(dir.filePath("missing.json")));
    QVERIFY(w.error_text().contains("missing.json"));
  }

  void the_headroom_given_at_start_is_kept() {
    WhatIfInputs in = small_inputs();
    in.hbm_headroom = 0.2;
    MainWindow w(in);
    w.set_seq_len(16384);
    w.recompute_now();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.setup()->inputs.hbm_headroom, 0.2);
  }

  void a_plan_whose_hardware_does_not_load_is_refused() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTemporaryDir dir;
    const QString plan = dir.filePath("plan.json");
    QVERIFY(w.save_plan(plan));
    planner::PlanFile file = planner::read_plan_file(plan.toStdString());
    file.hw = dir.filePath("no-such-node.json").toStdString();
    std::ofstream(plan.toStdString()) << planner::plan_file_json(file).dump(2);
    QVERIFY(!w.open_plan(plan));
    QVERIFY2(w.error_text().contains("no-such-node.json"), qPrintable(w.error_text()));
    QVERIFY(!w.setup());
  }

  void a_plan_the_user_picks_survives_the_search() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTableWidget* table = w.plan_table();
    QVERIFY(table->rowCount() >= 2);
    const int row = table->rowCount() - 1;
    table->selectRow(row);
    const QString plan = table->item(row, kPlanColumn)->text();
    // A longer sequence (every chunk of 64K still divides it): the search runs again and ends with its own
    // winner; the picked plan stays selected.
    w.set_seq_len(131072);
    w.recompute_now();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QVERIFY(w.plan_table()->rowCount() > 0);
    QCOMPARE(QString::fromStdString(w.selected_plan()->summary()), plan);
  }

  void a_plan_shorter_than_the_slider_widens_it() {
    // examples/tiny-ringtrack.plan.json: 256 tokens, below the slider's usual 4K.
    MainWindow w(small_inputs());
    QVERIFY2(w.open_plan(kTinyPlan), qPrintable(w.error_text()));
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.error_text(), QString());
    QCOMPARE(w.setup()->inputs.seq_len, std::int64_t{256});
    const planner::PlanFile file = planner::read_plan_file(kTinyPlan.toStdString());
    QCOMPARE(w.selected_plan()->summary(), file.spec.summary());
    QVERIFY(w.selected_detail() != nullptr);
    QCOMPARE(w.selected_detail()->spec.summary(), file.spec.summary());
    QCOMPARE(xs(w.memory_chart()->hbm_points("ringtrack")), (std::vector<double>{256, 512, 1024}));
    // The slider now reaches 256 and back up.
    w.set_seq_len(512);
    w.recompute_now();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(w.setup()->inputs.seq_len, std::int64_t{512});
  }

  void a_plan_the_slider_cannot_show_is_refused_in_view() {
    QTemporaryDir dir;
    planner::PlanFile file = planner::read_plan_file(kTinyPlan.toStdString());
    file.workload.seq_len = 3072;  // not a power of two
    const QString path = dir.filePath("odd.plan.json");
    std::ofstream(path.toStdString()) << planner::plan_file_json(file).dump(2);
    MainWindow w(small_inputs());  // its own first picks are still on their way
    QVERIFY(!w.open_plan(path));
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    // Still shown once the window's picks have arrived.
    QVERIFY2(w.error_text().contains("workload.seq_len") && w.error_text().contains("power of two"), qPrintable(w.error_text()));
    QVERIFY(w.error_text().contains("odd.plan.json"));
    QCOMPARE(w.setup()->inputs.seq_len, std::int64_t{65536});  // the window's inputs are untouched
  }

  void a_measured_trace_of_another_plan_is_refused() {
    WhatIfInputs in = small_inputs();
    in.schemes = {"ringtrack"};
    MainWindow w(in);
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTemporaryDir dir;
    const QString trace = dir.filePath("trace.json");
    QVERIFY(w.save_trace(trace));
    const std::int64_t chunk = chunk_of(*w.selected_plan()), other = another_chunk(chunk);
    QVERIFY(other > 0);
    w.set_chunk(other);
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QCOMPARE(chunk_of(w.selected_detail()->spec), other);
    QVERIFY(!w.open_measured(trace));
    QVERIFY2(w.error_text().contains("not a trace of the selected plan") && w.error_text().contains("trace.json"), qPrintable(w.error_text()));
    QVERIFY(!w.timeline()->has_measured());
    // Back on the plan it was taken from, it is accepted.
    w.set_chunk(chunk);
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QVERIFY2(w.open_measured(trace), qPrintable(w.error_text()));
    QVERIFY(w.timeline()->has_measured());
    // A later switch to another plan takes the overlay down and says why.
    w.set_chunk(other);
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QVERIFY(!w.timeline()->has_measured());
  }

  void a_measured_trace_cut_to_a_window_or_a_gpu_still_matches() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTemporaryDir dir;
    const QString whole = dir.filePath("whole.json");
    QVERIFY(w.save_trace(whole));
    json::Json doc = json::parse_file(whole.toStdString());
    const double half_us = doc["otherData"]["step_ns"].get<double>() / 2000.0;
    json::Json kept = json::Json::array();
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X" || e["ts"].get<double>() < half_us) kept.push_back(e);
    }
    QVERIFY(kept.size() < doc["traceEvents"].size());
    doc["traceEvents"] = kept;
    const QString unmarked = dir.filePath("first-half-unmarked.json");
    std::ofstream(unmarked.toStdString()) << doc.dump();
    // Without saying it holds a window, half a step lacks tasks of the plan.
    QVERIFY(!w.open_measured(unmarked));
    QVERIFY2(w.error_text().contains("of the plan's tasks"), qPrintable(w.error_text()));
    doc["otherData"]["selection"] = {{"gpus", json::Json::array({0})},
                                     {"gpus_total", 1},
                                     {"start_ns", 0},
                                     {"end_ns", static_cast<std::int64_t>(half_us * 1000)},
                                     {"counters", true}};  // ns are integers
    const QString window = dir.filePath("first-half.json");
    std::ofstream(window.toStdString()) << doc.dump();
    QVERIFY2(w.open_measured(window), qPrintable(w.error_text()));
    QVERIFY(w.timeline()->has_measured());
  }

  void the_ranked_table_shows_every_cell_in_full() {
    MainWindow w(small_inputs());
    w.resize(1600, 1000);
    w.show();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTableWidget* t = w.plan_table();
    QVERIFY(t->rowCount() > 0);
    QCOMPARE(t->horizontalHeaderItem(kPlanColumn)->text(), QString("plan"));
    const QFontMetrics metrics(t->font());
    for (int c = 0; c < t->columnCount(); ++c) {
      for (int r = 0; r < t->rowCount(); ++r) {
        const QString text = t->item(r, c)->text();
        QVERIFY2(metrics.horizontalAdvance(text) <= t->columnWidth(c), qPrintable(QString("column %1: \"%2\" clipped").arg(c).arg(text)));
      }
    }
    // The figures (every column before the plan) are in view without scrolling sideways.
    const int last = kPlanColumn - 1;
    QVERIFY2(t->columnViewportPosition(last) + t->columnWidth(last) <= t->viewport()->width(),
             qPrintable(QString("%1 + %2 > %3").arg(t->columnViewportPosition(last)).arg(t->columnWidth(last)).arg(t->viewport()->width())));
  }

  void coinciding_scheme_curves_stay_visible() {
    // Two schemes with the same numbers: the one drawn first must still show.
    const std::vector<std::string> schemes{"ulysses", "ring-attention"};
    MemoryChart memory;
    ChunkChart chunk;
    memory.resize(800, 500);
    chunk.resize(800, 500);
    memory.reset(schemes, {4096, 8192, 16384}, 80 * kGiB, 2048 * kGiB);
    chunk.reset(schemes, 1024, 16384);
    for (const auto& scheme : schemes) {
      for (std::int64_t x : {4096, 8192, 16384}) memory.add_point(point(scheme, x, true, 4.0 * static_cast<double>(x / 4096), 100));
      chunk.add_point(point(scheme, 0, true, 1, 1));  // no chunk: a flat line
    }
    for (QChartView* view : std::initializer_list<QChartView*>{&memory, &chunk}) {
      view->chart()->legend()->hide();  // the legend names both anyway: only the curves count here
      const QImage image = view->grab().toImage();
      for (const auto& scheme : schemes) {
        QVERIFY2(pixels_of(image, scheme_color(scheme)) >= 20, scheme.c_str());
      }
    }
    // Each scheme has a marker shape of its own.
    std::set<int> shapes;
    for (const auto& scheme : planner::scheme_names()) shapes.insert(scheme_style(scheme, 0, 1).shape);
    QCOMPARE(shapes.size(), planner::scheme_names().size());
  }

  void the_parameter_panel_shows_every_scheme_parameter_and_gives_it_back() {
    // The panel is generated from the schemes' parameter descriptions: a plan set into it comes back whole,
    // Megatron's CP, distributed optimizer and TP overlap included (the hand-made panel had no controls for them).
    ParamPanel panel;
    panel.set_ranges(64, 32);
    planner::PlanSpec megatron = planner::scheme_named("megatron").blank();
    auto& m = megatron.as<planner::MegatronParams>();
    m.tp = 4;
    m.pp = 2;
    m.dp = 2;
    m.cp = 4;
    m.cp_comm = planner::CpComm::a2a_p2p;
    m.cp_a2a = 2;
    m.vpp = 2;
    m.micro_batch = 3;
    m.sequence_parallel = m.tp_comm_overlap = m.distributed_optimizer = true;
    m.recompute = planner::Recompute::selective;
    m.first_stage_layers = 7;
    planner::PlanSpec ulysses = planner::scheme_named("ulysses").blank();
    ulysses.as<planner::ZeroParams>().sp = 8;
    ulysses.as<planner::ZeroParams>().stage = 3;
    ulysses.as<planner::ZeroParams>().offload_params = ulysses.as<planner::ZeroParams>().offload_grads = true;
    ulysses.as<planner::ZeroParams>().activation_checkpointing = true;
    ulysses.as<planner::ZeroParams>().checkpoint_every = 2;
    planner::PlanSpec ring = planner::scheme_named("ringtrack").blank();
    ring.as<planner::RingTrackParams>().ring = 8;
    ring.as<planner::RingTrackParams>().block = 3;
    ring.as<planner::RingTrackParams>().acts = planner::ActivationPolicy::recompute;
    ring.as<planner::RingTrackParams>().states = planner::Placement::dram;
    for (const planner::PlanSpec& spec : {megatron, ulysses, ring}) {
      panel.set(spec);
      QCOMPARE(planner::parameters_json(panel.spec(spec.scheme)).dump(), planner::parameters_json(spec).dump());
    }
    // Only the current scheme's group is visible, and a control's change is reported.
    panel.show_scheme("ulysses");
    QSignalSpy changed(&panel, &ParamPanel::changed);
    auto* spin = panel.findChild<QSpinBox*>();
    QVERIFY(spin != nullptr);
    spin->setValue(spin->value() == 1 ? 2 : 1);
    QCOMPARE(changed.count(), 1);
  }

  void lengths_that_do_not_fit_are_drawn_hollow_off_the_curve() {
    MemoryChart chart;
    chart.resize(800, 500);
    chart.reset({"ringtrack"}, {4096, 8192, 16384}, 80 * kGiB, 2048 * kGiB);
    chart.add_point(point("ringtrack", 4096, true, 40, 100));
    chart.add_point(point("ringtrack", 16384, false, 90, 300));  // ran out of HBM: needed at least 90 GiB
    chart.add_point(point("ringtrack", 8192, true, 60, 200));
    QCOMPARE(xs(chart.hbm_points("ringtrack")), (std::vector<double>{4096, 8192}));
    QCOMPARE(chart.points("ringtrack"), 3);
    const QList<QPointF> misses = chart.misses("ringtrack");  // HBM and DRAM at the length that did not fit
    QCOMPARE(misses.size(), 2);
    QVERIFY(misses.contains(QPointF(16384, 90)) && misses.contains(QPointF(16384, 300)));
    // Drawn hollow: white at the marker's centre, the scheme's colour at a fitting point's.
    chart.chart()->legend()->hide();
    const QImage image = chart.grab().toImage();
    auto pixel = [&](QPointF value) {
      const QPointF scene = chart.chart()->mapToPosition(value, chart.chart()->series().front());
      return image.pixelColor(chart.mapFromScene(scene));
    };
    const auto distance = [](QColor a, QColor b) {
      return std::abs(a.red() - b.red()) + std::abs(a.green() - b.green()) + std::abs(a.blue() - b.blue());
    };
    const QColor hollow = pixel({16384, 90}), filled = pixel({4096, 40});
    QVERIFY2(distance(hollow, Qt::white) < 30, qPrintable(hollow.name()));
    QVERIFY2(distance(filled, scheme_color("ringtrack")) < 30, qPrintable(filled.name()));
    ChunkChart chunks;
    chunks.reset({"ringtrack"}, 1024, 16384);
    chunks.add_point(point("ringtrack", 16384, false, 90, 300));
    QCOMPARE(chunks.points("ringtrack"), 0);
    QCOMPARE(chunks.misses("ringtrack"), (QList<QPointF>{{16384, 0}}));
  }

  void points_left_out_are_counted_in_the_title_until_their_scheme_is_cleared() {
    Point skipped = point("ringtrack", 16384, false, 0, 0);
    skipped.skipped = "over the window's memory budget";
    MemoryChart memory;
    memory.reset({"ringtrack", "zero"}, {4096, 8192, 16384}, 80 * kGiB, 2048 * kGiB);
    memory.add_point(point("ringtrack", 4096, true, 40, 100));
    QCOMPARE(memory.left_out(), 0);
    QVERIFY(!memory.chart()->title().contains("left out"));
    memory.add_point(skipped);
    QCOMPARE(memory.left_out(), 1);
    QVERIFY2(memory.chart()->title().contains("1 point left out"), qPrintable(memory.chart()->title()));
    QCOMPARE(memory.points("ringtrack"), 1);  // not drawn
    memory.clear_scheme("zero");
    QCOMPARE(memory.left_out(), 1);
    memory.clear_scheme("ringtrack");
    QCOMPARE(memory.left_out(), 0);
    QVERIFY(!memory.chart()->title().contains("left out"));
    ChunkChart chunks;
    chunks.reset({"ringtrack"}, 1024, 16384);
    chunks.add_point(skipped);
    chunks.add_point(skipped);
    QVERIFY2(chunks.chart()->title().contains("2 points left out"), qPrintable(chunks.chart()->title()));
    chunks.reset({"ringtrack"}, 1024, 16384);
    QCOMPARE(chunks.left_out(), 0);
  }

  void the_chunk_chart_draws_the_error_bar_as_a_band_around_the_step() {
    ChunkChart chunks;
    chunks.reset({"fpdt", "ringtrack"}, 1024, 16384);
    app::ErrorBar bar;
    bar.cases = 5;
    bar.low = -0.5;  // predicted 50% too fast: the real step up to twice the predicted
    bar.high = -0.2;
    chunks.set_error_bar("fpdt", bar);
    chunks.set_error_bar("ringtrack", app::ErrorBar{});  // no validated case near it: no band
    chunks.add_point(point("fpdt", 4096, true, 10, 10));
    chunks.add_point(point("ringtrack", 4096, true, 10, 10));
    const QList<QPointF> upper = chunks.band("fpdt", true), lower = chunks.band("fpdt", false);
    QCOMPARE(upper.size(), 1);
    QCOMPARE(lower.size(), 1);
    QVERIFY(std::abs(upper[0].y() - 2.0) < 1e-9);   // step 1 s / (1 - 0.5)
    QVERIFY(std::abs(lower[0].y() - 1.25) < 1e-9);  // step 1 s / (1 - 0.2)
    QVERIFY(chunks.band("ringtrack", true).isEmpty());
    chunks.clear_scheme("fpdt");
    QVERIFY(chunks.band("fpdt", true).isEmpty());
  }

  void a_chart_saved_through_a_link_replaces_the_files_it_points_to() {
    // The project's atomic writer follows a link (the link stays); renaming a temporary over the link would
    // replace the link with a file.
    MainWindow w(small_inputs());
    QTemporaryDir dir;
    const QString target = dir.filePath("target.png"), link = dir.filePath("link.png");
    std::ofstream(target.toStdString()) << "old";
    QVERIFY(QFile::link(target, link));
    QVERIFY2(w.save_chart(w.memory_chart(), link), qPrintable(w.error_text()));
    QVERIFY(QFileInfo(link).isSymLink());
    QVERIFY(QFileInfo(target).size() > 1000);
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files | QDir::System).size(), 2);  // no temporary left
    // A folder that does not exist: refused, naming the path.
    const QString missing = dir.filePath("no-such-folder/chart.png");
    QVERIFY(!w.save_chart(w.memory_chart(), missing));
    QVERIFY2(w.error_text().contains(missing), qPrintable(w.error_text()));
  }

  void the_timeline_zooms_around_a_point() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    TimelineView* t = w.timeline();
    t->resize(800, 200);
    const auto whole = t->view();
    t->zoom(4, 0.5);
    const auto zoomed = t->view();
    QVERIFY(std::abs((zoomed.second - zoomed.first) * 4 - (whole.second - whole.first)) < 1e-6 * whole.second);
    QVERIFY(zoomed.first > whole.first && zoomed.second < whole.second);
    t->show_all();
    QVERIFY(t->view() == whole);
  }
};

QTEST_MAIN(GuiTest)
#include "test_gui.moc"
