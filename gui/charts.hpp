#pragma once
// The window's Qt Charts, one widget each. They only draw: the points come from what_if.hpp through the window.
#include <QtCharts/QAreaSeries>
#include <QtCharts/QChartView>
#include <QtCharts/QLineSeries>
#include <QtCharts/QLogValueAxis>
#include <QtCharts/QScatterSeries>
#include <QtCharts/QValueAxis>

#include <map>
#include <string>
#include <vector>

#include "gui/what_if.hpp"

namespace trainyard::gui {

// Points of one series kept sorted by x, as they arrive in any order.
void insert_sorted(QXYSeries* series, QPointF point);

// How a scheme is drawn in every chart: a colour, a marker shape, and a line width and marker size that shrink
// with the scheme's place in the list, so that where two schemes' curves coincide, the one drawn later (on top)
// leaves an edge of the one below visible.
struct SchemeStyle {
  QColor color;
  QScatterSeries::MarkerShape shape = QScatterSeries::MarkerShapeCircle;
  double line_width = 2;
  double marker_size = 8;
};
SchemeStyle scheme_style(const std::string& scheme, std::size_t index, std::size_t count);

// Chart 1: MFU (solid, left axis, filled markers) and step time (dashed, right axis) against the chunk length, one
// colour and marker shape per scheme; schemes without a chunk are flat lines across the range; chunks that do
// not fit are the scheme's marker drawn hollow on the axis. Until a point is simulated, the analytic estimate's
// (Point::provisional) stands in for it as the scheme's marker, smaller and faded (MFU only, no line).
// The points a chart could not draw (Point::skipped: a graph too large to simulate here, or no valid plan),
// counted per scheme and said under the chart's title, so that a gap in a curve is not read as the scheme's limit.
class LeftOutPoints {
 public:
  void set_chart(QChart* chart, const QString& title);
  void add(const std::string& scheme);
  void clear(const std::string& scheme);
  void clear_all();
  int count() const;

 private:
  void show() const;
  QChart* chart_ = nullptr;
  QString title_;
  std::map<std::string, int> per_scheme_;
};

class ChunkChart : public QChartView {
  Q_OBJECT
 public:
  explicit ChunkChart(QWidget* parent = nullptr);
  void reset(const std::vector<std::string>& schemes, std::int64_t min_chunk, std::int64_t max_chunk);
  void clear_scheme(const std::string& scheme);
  void add_point(const Point& p);
  // The band where the scheme's real step time is likely to lie, by the error bar of published runs like it
  // (app/error_bars.hpp): the predicted step over 1 + the bar's high and low errors. No band without a bar.
  void set_error_bar(const std::string& scheme, const app::ErrorBar& bar);
  QList<QPointF> band(const std::string& scheme, bool upper) const;  // the band's edge, (chunk, seconds)
  int points(const std::string& scheme) const;                       // MFU points shown (flat lines count 1)
  int estimated_points(const std::string& scheme) const;             // provisional points still shown
  QList<QPointF> misses(const std::string& scheme) const;            // (chunk, 0) of the chunks that do not fit
  int left_out() const { return left_out_.count(); }

 private:
  struct Series {
    QLineSeries* mfu = nullptr;
    QLineSeries* step = nullptr;
    QScatterSeries* markers = nullptr;    // on the MFU points
    QScatterSeries* misses = nullptr;     // hollow, on the axis
    QScatterSeries* estimated = nullptr;  // faded: the estimate's MFU where nothing is simulated yet
    QAreaSeries* band = nullptr;          // the error bar's band around the step time (none: no bar)
    double band_low = 1, band_high = 1;   // the step's factors at the band's edges
    int points = 0;
  };
  void add_to_band(Series& s, const QPointF& step_point);
  void add_estimate(Series& s, const Point& p);
  QLogValueAxis* x_ = nullptr;
  QValueAxis* mfu_axis_ = nullptr;
  QValueAxis* step_axis_ = nullptr;
  std::map<std::string, Series> series_;
  std::int64_t min_chunk_ = 1024, max_chunk_ = 1024;
  double step_max_s_ = 0;
  LeftOutPoints left_out_;
};

// Chart 2: peak HBM per GPU (solid, filled markers) and peak DRAM per node (dashed) against the sequence length,
// per scheme, with the two capacities as horizontal lines: where a curve crosses its line, that scheme stops
// fitting. The lines join the lengths that fit; a length that does not fit is the scheme's marker drawn hollow
// at what the step needed when it ran out (at least that much), for HBM and DRAM. Until a length is simulated,
// the estimate's HBM and DRAM stand in for it as faded markers.
class MemoryChart : public QChartView {
  Q_OBJECT
 public:
  explicit MemoryChart(QWidget* parent = nullptr);
  void reset(const std::vector<std::string>& schemes, const std::vector<std::int64_t>& lengths, double hbm_capacity_bytes,
             double dram_capacity_bytes);
  void clear_scheme(const std::string& scheme);
  void add_point(const Point& p);
  int points(const std::string& scheme) const;                 // HBM points shown for the scheme
  int estimated_points(const std::string& scheme) const;       // provisional HBM and DRAM points still shown
  QList<QPointF> hbm_points(const std::string& scheme) const;  // (length, GiB) of the lengths that fit, by length
  QList<QPointF> misses(const std::string& scheme) const;      // (length, GiB needed) of those that do not, HBM and DRAM
  int total_points() const;
  int left_out() const { return left_out_.count(); }

 private:
  struct Series {
    QLineSeries* hbm = nullptr;
    QLineSeries* dram = nullptr;
    QScatterSeries* markers = nullptr;    // on the HBM points
    QScatterSeries* misses = nullptr;     // hollow
    QScatterSeries* estimated = nullptr;  // faded: the estimate's HBM and DRAM where nothing is simulated yet
    int missed_lengths = 0;
  };
  QLogValueAxis* x_ = nullptr;
  QLogValueAxis* y_ = nullptr;
  std::map<std::string, Series> series_;
  QLineSeries* hbm_capacity_ = nullptr;
  QLineSeries* dram_capacity_ = nullptr;
  double y_min_ = 0, y_max_ = 0;
  LeftOutPoints left_out_;
};

// Chart 3: memory in use over the selected plan's step: HBM of one GPU (left axis) and pinned DRAM of its node
// (right axis), with the HBM capacity.
class StepMemoryChart : public QChartView {
  Q_OBJECT
 public:
  explicit StepMemoryChart(QWidget* parent = nullptr);
  void show_plan(const PlanDetail& detail, int gpu);
  void clear();
  int points() const;  // samples drawn (both series)

 private:
  QLineSeries* hbm_ = nullptr;
  QLineSeries* dram_ = nullptr;
  QLineSeries* capacity_ = nullptr;
  QValueAxis* x_ = nullptr;
  QValueAxis* hbm_axis_ = nullptr;
  QValueAxis* dram_axis_ = nullptr;
};

// Colour of a scheme (stable across charts).
QColor scheme_color(const std::string& scheme);

}  // namespace trainyard::gui
