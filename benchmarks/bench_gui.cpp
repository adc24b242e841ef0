// How quickly trainyard-gui draws its first picture and answers its controls: Llama-3 8B on a DGX A100 at 1M
// tokens (issue 22's targets: the first complete picture within 20 s and 1.5 GiB, a sequence move's charts 3-4
// and ranked table within 3 s). Offscreen, in-process.
//
// Each iteration moves a control and times, from the move: the first new point of chart 1 (chunk sweep) and of
// chart 2 (memory vs length), the selected plan's charts 3 and 4, every chart point, and the ranked table (by the
// estimate, provisional, and simulated). The
// iteration time is the later of the two first points. `gui_blocked_ms` is how long the control's handler held
// the GUI thread; `max_freeze_ms` the longest gap between ticks of a 5 ms timer while the work ran (how long the
// window could not repaint).
#include <QApplication>
#include <QElapsedTimer>
#include <QTimer>

#include <benchmark/benchmark.h>

#include <sys/resource.h>

#include <memory>

#include "gui/main_window.hpp"

using trainyard::gui::MainWindow;
using trainyard::gui::WhatIfInputs;

namespace {

constexpr int kWaitMs = 900000;

std::unique_ptr<MainWindow> g_window;  // destroyed at the end of main, while the QApplication still exists

MainWindow& window() {
  auto& w = g_window;
  if (!w) {
    WhatIfInputs in;
    in.model = "llama3-8b";
    in.hw = "dgx-a100";
    in.seq_len = std::int64_t{1} << 20;
    w = std::make_unique<MainWindow>(in);
    w->resize(1600, 1000);
    w->show();
    w->jobs().wait_idle(kWaitMs);
  }
  return *w;
}

struct Timings {
  double blocked_ms = 0, chunk_ms = -1, memory_ms = -1, plan_ms = -1, charts_ms = -1, table_ms = -1, max_freeze_ms = 0;
  double provisional_table_ms = -1;   // the ranked table by the estimate (chart_updated(6))
  double provisional_charts_ms = -1;  // charts 1 and 2 by the estimate (chart_updated(7))
};

// Runs `move` and processes events until every job is done, noting when each chart first got data.
Timings time_move(MainWindow& w, const std::function<void()>& move) {
  Timings t;
  QElapsedTimer clock;
  double last_tick = 0;
  QTimer ticker;
  ticker.setInterval(5);
  QObject::connect(&ticker, &QTimer::timeout, [&] {
    const double now = static_cast<double>(clock.nsecsElapsed()) * 1e-6;
    t.max_freeze_ms = std::max(t.max_freeze_ms, now - last_tick);
    last_tick = now;
  });
  const auto connection = QObject::connect(&w, &MainWindow::chart_updated, [&](int chart) {
    const double now = static_cast<double>(clock.nsecsElapsed()) * 1e-6;
    double& slot = chart == 1   ? t.chunk_ms
                   : chart == 2 ? t.memory_ms
                   : chart == 3 ? t.plan_ms
                   : chart == 6 ? t.provisional_table_ms
                   : chart == 7 ? t.provisional_charts_ms
                                : t.table_ms;
    if (slot < 0) slot = now;
  });
  clock.start();
  move();
  t.blocked_ms = static_cast<double>(clock.nsecsElapsed()) * 1e-6;
  last_tick = t.blocked_ms;
  t.max_freeze_ms = t.blocked_ms;
  ticker.start();
  while (w.jobs().pending() > 0 && clock.elapsed() < kWaitMs) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 5);
    // The chart jobs start once the estimate is drawn, most of them once the search is done
    // (MainWindow::start_simulations): none pending before then.
    if (t.charts_ms < 0 && w.jobs().pending("estimate") + w.jobs().pending("search") + w.jobs().pending("chunk/") + w.jobs().pending("memory/") +
                                   w.jobs().pending("plan") ==
                               0) {
      t.charts_ms = static_cast<double>(clock.nsecsElapsed()) * 1e-6;
    }
  }
  ticker.stop();
  QObject::disconnect(connection);
  return t;
}

// The iteration time is `first_ms`: when the charts that control drives first showed new points.
void report(benchmark::State& state, const Timings& t, double first_ms) {
  state.SetIterationTime(first_ms * 1e-3);
  state.counters["gui_blocked_ms"] = t.blocked_ms;
  state.counters["first_chunk_point_ms"] = t.chunk_ms;
  state.counters["first_memory_point_ms"] = t.memory_ms;
  state.counters["selected_plan_ms"] = t.plan_ms;
  state.counters["all_chart_points_ms"] = t.charts_ms;
  state.counters["ranked_table_ms"] = t.table_ms;
  state.counters["estimate_table_ms"] = t.provisional_table_ms;
  state.counters["estimate_charts_ms"] = t.provisional_charts_ms;
  state.counters["max_freeze_ms"] = t.max_freeze_ms;
}

// The first complete picture: a new window with the default inputs (llama3-8b, dgx-a100, 1M) until every chart
// point and the ranked table are in, and the process's peak RSS by then. Registered first, so the peak is this
// window's alone.
void BM_FirstPicture(benchmark::State& state) {
  for (auto _ : state) {
    QElapsedTimer clock;
    clock.start();
    MainWindow w{WhatIfInputs{}};
    w.resize(1600, 1000);
    w.show();
    double table_ms = -1, estimate_table_ms = -1, estimate_charts_ms = -1;
    const auto connection = QObject::connect(&w, &MainWindow::chart_updated, [&](int chart) {
      const double now = static_cast<double>(clock.nsecsElapsed()) * 1e-6;
      if (chart == 5 && table_ms < 0) table_ms = now;
      if (chart == 6 && estimate_table_ms < 0) estimate_table_ms = now;
      if (chart == 7 && estimate_charts_ms < 0) estimate_charts_ms = now;
    });
    do {
      QCoreApplication::processEvents(QEventLoop::AllEvents, 5);
    } while (w.jobs().pending() > 0 && clock.elapsed() < kWaitMs);
    const double complete_ms = static_cast<double>(clock.nsecsElapsed()) * 1e-6;
    QObject::disconnect(connection);
    state.SetIterationTime(complete_ms * 1e-3);
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    state.counters["complete_picture_ms"] = complete_ms;
    state.counters["ranked_table_ms"] = table_ms;
    state.counters["estimate_table_ms"] = estimate_table_ms;
    state.counters["estimate_charts_ms"] = estimate_charts_ms;
    state.counters["peak_rss_mib"] = static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
  }
}
BENCHMARK(BM_FirstPicture)->UseManualTime()->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);

// The window idle at 512K; the sequence control moves to 1M.
void BM_SequenceControlFromIdle(benchmark::State& state) {
  MainWindow& w = window();
  for (auto _ : state) {
    w.set_seq_len(std::int64_t{1} << 19);
    w.recompute_now();
    w.jobs().wait_idle(kWaitMs);
    const Timings t = time_move(w, [&] {
      w.set_seq_len(std::int64_t{1} << 20);
      w.recompute_now();
    });
    report(state, t, std::max(t.chunk_ms, t.memory_ms));
  }
}
BENCHMARK(BM_SequenceControlFromIdle)->UseManualTime()->Iterations(1)->Repetitions(3)->Unit(benchmark::kMillisecond);

// Dragging: the control moves 1M -> 512K and, 200 ms later while that work still runs, back to 1M.
void BM_SequenceControlWhileBusy(benchmark::State& state) {
  MainWindow& w = window();
  for (auto _ : state) {
    w.jobs().wait_idle(kWaitMs);
    w.set_seq_len(std::int64_t{1} << 19);
    w.recompute_now();
    QElapsedTimer wait;
    wait.start();
    while (wait.elapsed() < 200) QCoreApplication::processEvents(QEventLoop::AllEvents, 5);
    const Timings t = time_move(w, [&] {
      w.set_seq_len(std::int64_t{1} << 20);
      w.recompute_now();
    });
    report(state, t, std::max(t.chunk_ms, t.memory_ms));
  }
}
BENCHMARK(BM_SequenceControlWhileBusy)->UseManualTime()->Iterations(1)->Repetitions(3)->Unit(benchmark::kMillisecond);

// The selected ring-track plan's chunk control, 16K <-> 32K, at 1M (chart 1's selected series and charts 3-4).
void BM_ChunkControl(benchmark::State& state) {
  MainWindow& w = window();
  static std::int64_t chunk = 16384;  // across repetitions: each moves the control
  for (auto _ : state) {
    w.jobs().wait_idle(kWaitMs);
    chunk = chunk == 16384 ? 32768 : 16384;
    const Timings t = time_move(w, [&] { w.set_chunk(chunk); });
    if (t.chunk_ms < 0) {
      state.SkipWithError("the chunk control changed nothing: the selected plan has no chunk, or already had this one");
      break;
    }
    report(state, t, t.chunk_ms);  // chart 2 redraws the selected scheme's curve too, later
  }
}
BENCHMARK(BM_ChunkControl)->UseManualTime()->Iterations(1)->Repetitions(3)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_window.reset();
  return 0;
}
