// trainyard-gui under QT_QPA_PLATFORM=offscreen (QTest): the window builds and fills its charts, the sequence
// length recomputes chart 2, a table row drives charts 3 and 4, bad input shows an error, files round-trip; and the
// GUI's plain functions (what_if.hpp).
#include <QFile>
#include <QTemporaryDir>
#include <QtTest/QtTest>

#include <fstream>

#include "gui/main_window.hpp"
#include "gui/what_if.hpp"
#include "planner/plan.hpp"

using namespace trainyard;
using namespace trainyard::gui;

namespace {

constexpr int kWaitMs = 120000;  // a generous bound on a small model's charts; tests fail rather than hang

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
    planner::PlanSpec fpdt;
    fpdt.scheme = "fpdt";
    fpdt.zero.fpdt_chunk = 4096;
    QVERIFY(!too_large_to_simulate(fpdt, std::int64_t{1} << 20).empty());
    QVERIFY(too_large_to_simulate(with_chunk(fpdt, 8192), std::int64_t{1} << 20).empty());
  }

  void chart_plan_prefers_the_given_plans_where_valid() {
    const Setup setup(small_inputs());
    const planner::StepInputs in = setup.at(65536);
    planner::PlanSpec mine;
    mine.scheme = "ringtrack";
    mine.ringtrack.chunk = 8192;
    mine.ringtrack.acts = planner::ActivationPolicy::recompute;
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

  void a_step_that_runs_out_of_memory_reports_at_least_the_capacity() {
    WhatIfInputs big = small_inputs();
    big.model = "llama3-8b";
    const Setup setup(big);
    planner::PlanSpec spec;
    spec.scheme = "zero";  // whole model states and a 64K activation set on one 80 GB GPU: does not fit
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

  void selecting_a_row_updates_charts_three_and_four() {
    MainWindow w(small_inputs());
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QTableWidget* table = w.plan_table();
    QVERIFY(table->rowCount() >= 2);
    QVERIFY(w.selected_plan().has_value());
    const int row = table->rowCount() - 1;
    const QString plan = table->item(row, 2)->text();
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
    const QString plan = table->item(row, 2)->text();
    // A longer sequence (every chunk of 64K still divides it): the search runs again and ends with its own
    // winner; the picked plan stays selected.
    w.set_seq_len(131072);
    w.recompute_now();
    QVERIFY(w.jobs().wait_idle(kWaitMs));
    QVERIFY(w.plan_table()->rowCount() > 0);
    QCOMPARE(QString::fromStdString(w.selected_plan()->summary()), plan);
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
