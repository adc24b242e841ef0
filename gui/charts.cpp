#include "gui/charts.hpp"

#include <QtCharts/QChart>
#include <QtCharts/QLegendMarker>

#include <algorithm>
#include <cmath>

#include "common/units.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::gui {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// The legend's key for hollow markers (chart 2's sit at what the step needed when it ran out: gui/README.md).
const QString kMiss = "does not fit";
const QString kEstimated = "faded: estimate, until simulated";

QChart* new_chart(const QString& title) {
  auto* chart = new QChart();
  chart->setTitle(title);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setMargins(QMargins(4, 4, 4, 4));
  chart->setAnimationOptions(QChart::NoAnimation);
  return chart;
}

QLineSeries* new_line(QChart* chart, const QString& name, QColor color, Qt::PenStyle style, double width, const std::vector<QAbstractAxis*>& axes) {
  auto* s = new QLineSeries();
  s->setName(name);
  QPen pen(color);
  pen.setWidthF(width);
  pen.setStyle(style);
  s->setPen(pen);
  chart->addSeries(s);
  for (auto* axis : axes) s->attachAxis(axis);
  return s;
}

// A scheme's markers: filled where the plan fits, hollow (white inside) where it does not.
QScatterSeries* new_markers(QChart* chart, const QString& name, const SchemeStyle& style, bool hollow, const std::vector<QAbstractAxis*>& axes) {
  auto* s = new QScatterSeries();
  s->setName(name);
  s->setMarkerShape(style.shape);
  s->setMarkerSize(style.marker_size);
  s->setColor(hollow ? QColor(Qt::white) : style.color);
  QPen pen(style.color);
  pen.setWidthF(hollow ? 2 : 1);
  s->setPen(pen);
  chart->addSeries(s);
  for (auto* axis : axes) s->attachAxis(axis);
  return s;
}

// The analytic estimate's provisional points: the scheme's marker, smaller and faded.
QScatterSeries* new_estimate_markers(QChart* chart, const QString& name, SchemeStyle style, const std::vector<QAbstractAxis*>& axes) {
  style.color.setAlpha(70);
  style.marker_size *= 0.8;
  QScatterSeries* s = new_markers(chart, name, style, false, axes);
  s->setPen(QPen(style.color));
  return s;
}

// The legend: one entry per scheme (its filled marker, in its colour) and the keys saying what hollow and faded
// markers mean.
void set_legend(QChart* chart, const std::map<std::string, QScatterSeries*>& scheme_markers) {
  chart->legend()->setMarkerShape(QLegend::MarkerShapeFromSeries);
  for (auto* marker : chart->legend()->markers()) {
    bool shown = false;
    for (const auto& [scheme, series] : scheme_markers) shown = shown || marker->series() == series;
    marker->setVisible(shown || marker->label() == kMiss || marker->label() == kEstimated);
  }
}

// One scheme's series on a chart of two measures per point: a solid line (the first measure, on `first_axes`),
// a dashed one (the second), and markers and hollow "does not fit" markers on the first measure's points.
struct SchemeSeries {
  QLineSeries *solid = nullptr, *dashed = nullptr;
  QScatterSeries *markers = nullptr, *misses = nullptr, *estimated = nullptr;
};
SchemeSeries add_scheme_series(QChart* c, const std::string& scheme, std::size_t index, std::size_t schemes, const QString& first,
                               const std::vector<QAbstractAxis*>& first_axes, const QString& second, const std::vector<QAbstractAxis*>& second_axes) {
  const SchemeStyle style = scheme_style(scheme, index, schemes);
  const QString name = QString::fromStdString(scheme);
  SchemeSeries s;
  s.solid = new_line(c, name + " " + first, style.color, Qt::SolidLine, style.line_width, first_axes);
  s.dashed = new_line(c, name + " " + second, style.color, Qt::DashLine, style.line_width, second_axes);
  s.markers = new_markers(c, name, style, false, first_axes);
  s.misses = new_markers(c, name + " does not fit", style, true, first_axes);
  s.estimated = new_estimate_markers(c, name + " (estimate)", style, first_axes);
  return s;
}

// Legend-only series explaining hollow and faded markers.
void add_marker_keys(QChart* chart, const std::vector<QAbstractAxis*>& axes) {
  const SchemeStyle key{QColor(Qt::darkGray), QScatterSeries::MarkerShapeCircle, 2, 8};
  new_markers(chart, kMiss, key, true, axes);
  new_estimate_markers(chart, kEstimated, key, axes);
}

// Whether `series` has a point at `x` (any point when x is 0: a plan without a chunk spans the axis).
bool has_point_at(const QXYSeries* series, double x) {
  const QList<QPointF> points = series->points();
  return std::any_of(points.begin(), points.end(), [&](QPointF p) { return x == 0 || p.x() == x; });
}

// Removes the points of `series` at `x` (every point when x is 0, as has_point_at).
void remove_at(QXYSeries* series, double x) {
  QList<QPointF> kept;
  for (const QPointF& p : series->points()) {
    if (x > 0 && p.x() != x) kept.push_back(p);
  }
  if (kept.size() != series->count()) series->replace(kept);
}

// Empties a chart for a new set of series and axes.
void remove_series_and_axes(QChart* chart) {
  chart->removeAllSeries();
  for (auto* axis : chart->axes()) {
    chart->removeAxis(axis);
    delete axis;
  }
}

// Log axes want a positive range that is not a single point.
void set_log_range(QLogValueAxis* axis, double low, double high) {
  if (!(low > 0)) low = 1;
  if (high <= low) high = low * 2;
  axis->setRange(low, high);
}

// A scheme's place in the registry's list picks its colour and marker (cycling past the end): the same scheme
// looks the same in every chart.
std::size_t scheme_index(const std::string& scheme) {
  const auto& names = planner::scheme_names();
  return static_cast<std::size_t>(std::find(names.begin(), names.end(), scheme) - names.begin());
}

}  // namespace

QColor scheme_color(const std::string& scheme) {
  static const QColor kPalette[] = {QColor(0xd6, 0x27, 0x28), QColor(0x1f, 0x77, 0xb4), QColor(0x2c, 0xa0, 0x2c),
                                    QColor(0x94, 0x67, 0xbd), QColor(0xff, 0x7f, 0x0e), QColor(0x8c, 0x56, 0x4b)};
  const std::size_t i = scheme_index(scheme);
  return i == planner::scheme_names().size() ? QColor(Qt::gray) : kPalette[i % std::size(kPalette)];
}

SchemeStyle scheme_style(const std::string& scheme, std::size_t index, std::size_t count) {
  static const QScatterSeries::MarkerShape kShapes[] = {QScatterSeries::MarkerShapeCircle,   QScatterSeries::MarkerShapeRectangle,
                                                        QScatterSeries::MarkerShapeTriangle, QScatterSeries::MarkerShapeRotatedRectangle,
                                                        QScatterSeries::MarkerShapeStar,     QScatterSeries::MarkerShapePentagon};
  SchemeStyle style;
  style.color = scheme_color(scheme);
  const std::size_t i = scheme_index(scheme);
  if (i < planner::scheme_names().size()) style.shape = kShapes[i % std::size(kShapes)];
  // Drawn in list order, so later schemes lie on top: earlier ones are wider and larger by a step each.
  const double below = static_cast<double>(count > index ? count - 1 - index : 0);
  style.line_width = 2 + 0.8 * below;
  style.marker_size = 9 + 1.5 * below;
  return style;
}

void insert_sorted(QXYSeries* series, QPointF point) {
  const QList<QPointF> points = series->points();
  const auto at = std::lower_bound(points.begin(), points.end(), point, [](QPointF a, QPointF b) { return a.x() < b.x(); });
  series->insert(static_cast<int>(at - points.begin()), point);
}

// --- left-out points -------------------------------------------------------------------------------------------

void LeftOutPoints::set_chart(QChart* chart, const QString& title) {
  chart_ = chart;
  title_ = title;
  chart_->setTitle(title_);
}

void LeftOutPoints::add(const std::string& scheme) {
  ++per_scheme_[scheme];
  show();
}

void LeftOutPoints::clear(const std::string& scheme) {
  per_scheme_.erase(scheme);
  show();
}

void LeftOutPoints::clear_all() {
  per_scheme_.clear();
  show();
}

int LeftOutPoints::count() const {
  int n = 0;
  for (const auto& [scheme, points] : per_scheme_) n += points;
  return n;
}

void LeftOutPoints::show() const {
  if (chart_ == nullptr) return;
  const int n = count();
  chart_->setTitle(
      n == 0
          ? title_
          : title_ + QString("<br><small>%1 point%2 left out: too large to simulate here, or no valid plan</small>").arg(n).arg(n == 1 ? "" : "s"));
}

// --- chart 1 ---------------------------------------------------------------------------------------------------

ChunkChart::ChunkChart(QWidget* parent) : QChartView(parent) {
  setRenderHint(QPainter::Antialiasing);
  setChart(new_chart(""));
  left_out_.set_chart(chart(), "MFU (solid) and step time (dashed) vs chunk length");
  reset({}, 1024, 256 * 1024);
}

void ChunkChart::reset(const std::vector<std::string>& schemes, std::int64_t min_chunk, std::int64_t max_chunk) {
  QChart* c = chart();
  remove_series_and_axes(c);
  series_.clear();
  left_out_.clear_all();
  min_chunk_ = min_chunk;
  max_chunk_ = std::max(max_chunk, min_chunk);
  step_max_s_ = 0;
  x_ = new QLogValueAxis();
  x_->setBase(2);
  x_->setTitleText("chunk length (tokens)");
  x_->setLabelFormat("%.0f");
  set_log_range(x_, static_cast<double>(min_chunk_) / 1.5, static_cast<double>(max_chunk_) * 1.5);
  mfu_axis_ = new QValueAxis();
  mfu_axis_->setTitleText("MFU (%)");
  mfu_axis_->setRange(0, 100);
  step_axis_ = new QValueAxis();
  step_axis_->setTitleText("step time (s)");
  step_axis_->setLabelFormat("%.3g");
  step_axis_->setRange(0, 1);
  c->addAxis(x_, Qt::AlignBottom);
  c->addAxis(mfu_axis_, Qt::AlignLeft);
  c->addAxis(step_axis_, Qt::AlignRight);
  std::map<std::string, QScatterSeries*> legend;
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    const auto added = add_scheme_series(c, schemes[i], i, schemes.size(), "MFU", {x_, mfu_axis_}, "step", {x_, step_axis_});
    legend[schemes[i]] = added.markers;
    series_[schemes[i]] = {added.solid, added.dashed, added.markers, added.misses, added.estimated};
  }
  add_marker_keys(c, {x_, mfu_axis_});
  set_legend(c, legend);
}

void ChunkChart::clear_scheme(const std::string& scheme) {
  left_out_.clear(scheme);
  const auto it = series_.find(scheme);
  if (it == series_.end()) return;
  for (QXYSeries* s : std::initializer_list<QXYSeries*>{it->second.mfu, it->second.step, it->second.markers, it->second.misses, it->second.estimated})
    s->clear();
  if (it->second.band) {
    it->second.band->upperSeries()->clear();
    it->second.band->lowerSeries()->clear();
  }
  it->second.points = 0;
}

void ChunkChart::set_error_bar(const std::string& scheme, const app::ErrorBar& bar) {
  const auto it = series_.find(scheme);
  if (it == series_.end() || bar.cases == 0 || it->second.band) return;
  Series& s = it->second;
  // error = (predicted - published) / published, so the published step is the predicted over 1 + error.
  s.band_low = 1 / (1 + bar.high);
  s.band_high = 1 / (1 + bar.low);
  s.band = new QAreaSeries(new QLineSeries(), new QLineSeries());
  s.band->setName(QString::fromStdString(scheme + " step: published runs like this"));
  QColor fill = s.step->pen().color();
  fill.setAlpha(40);
  s.band->setBrush(fill);
  s.band->setPen(Qt::NoPen);
  chart()->addSeries(s.band);
  s.band->attachAxis(x_);
  s.band->attachAxis(step_axis_);
  for (const QPointF& p : s.step->points()) add_to_band(s, p);
  for (auto* marker : chart()->legend()->markers(s.band)) marker->setVisible(false);  // the legend keys schemes by their markers
  step_axis_->setRange(0, std::max(step_max_s_, 1e-9) * 1.1);
}

void ChunkChart::add_to_band(Series& s, const QPointF& step_point) {
  if (!s.band) return;
  insert_sorted(s.band->upperSeries(), {step_point.x(), step_point.y() * s.band_high});
  insert_sorted(s.band->lowerSeries(), {step_point.x(), step_point.y() * s.band_low});
  step_max_s_ = std::max(step_max_s_, step_point.y() * s.band_high);
}

QList<QPointF> ChunkChart::band(const std::string& scheme, bool upper) const {
  const auto it = series_.find(scheme);
  if (it == series_.end() || !it->second.band) return {};
  return (upper ? it->second.band->upperSeries() : it->second.band->lowerSeries())->points();
}

void ChunkChart::add_point(const Point& p) {
  const auto it = series_.find(p.scheme);
  if (it == series_.end()) return;
  if (!p.skipped.empty()) {
    left_out_.add(p.scheme);
    return;
  }
  Series& s = it->second;
  if (p.provisional) return add_estimate(s, p);
  remove_at(s.estimated, static_cast<double>(p.x));
  if (!p.metrics.fits) {
    if (p.x > 0) insert_sorted(s.misses, {static_cast<double>(p.x), 0});
    return;
  }
  const double mfu = 100 * p.metrics.mfu, step = p.metrics.step_s;
  if (p.x > 0) {
    insert_sorted(s.mfu, {static_cast<double>(p.x), mfu});
    insert_sorted(s.step, {static_cast<double>(p.x), step});
    insert_sorted(s.markers, {static_cast<double>(p.x), mfu});
    add_to_band(s, {static_cast<double>(p.x), step});
  } else {  // no chunk: the same plan at every chunk length (markers at its ends)
    const QList<QPointF> ends{{static_cast<double>(min_chunk_), mfu}, {static_cast<double>(max_chunk_), mfu}};
    s.mfu->replace(ends);
    s.markers->replace(ends);
    s.step->replace(QList<QPointF>{{static_cast<double>(min_chunk_), step}, {static_cast<double>(max_chunk_), step}});
    if (s.band) {
      s.band->upperSeries()->clear();
      s.band->lowerSeries()->clear();
      for (const QPointF& end : s.step->points()) add_to_band(s, end);
    }
  }
  ++s.points;
  step_max_s_ = std::max(step_max_s_, step);
  step_axis_->setRange(0, step_max_s_ * 1.1);
}

// A provisional point: the estimate's MFU (0 when it says the plan does not fit), unless the simulated point is in.
void ChunkChart::add_estimate(Series& s, const Point& p) {
  const double x = static_cast<double>(p.x), mfu = p.metrics.fits ? 100 * p.metrics.mfu : 0;
  if (has_point_at(s.markers, x) || has_point_at(s.misses, x)) return;
  remove_at(s.estimated, x);
  if (p.x > 0) insert_sorted(s.estimated, {x, mfu});
  else s.estimated->replace(QList<QPointF>{{static_cast<double>(min_chunk_), mfu}, {static_cast<double>(max_chunk_), mfu}});
}

int ChunkChart::estimated_points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? 0 : static_cast<int>(it->second.estimated->count());
}

int ChunkChart::points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? 0 : it->second.points;
}

QList<QPointF> ChunkChart::misses(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? QList<QPointF>() : it->second.misses->points();
}

// --- chart 2 ---------------------------------------------------------------------------------------------------

MemoryChart::MemoryChart(QWidget* parent) : QChartView(parent) {
  setRenderHint(QPainter::Antialiasing);
  setChart(new_chart(""));
  left_out_.set_chart(chart(), "Peak HBM per GPU (solid), DRAM per node (dashed); black: their sizes");
  reset({}, {4096, 8192}, 80 * kGiB, 2048 * kGiB);
}

void MemoryChart::reset(const std::vector<std::string>& schemes, const std::vector<std::int64_t>& lengths, double hbm_capacity_bytes,
                        double dram_capacity_bytes) {
  QChart* c = chart();
  remove_series_and_axes(c);
  series_.clear();
  left_out_.clear_all();
  const double low = lengths.empty() ? 4096 : static_cast<double>(lengths.front());
  const double high = lengths.empty() ? 8192 : static_cast<double>(lengths.back());
  x_ = new QLogValueAxis();
  x_->setBase(2);
  x_->setTitleText("sequence length (tokens)");
  x_->setLabelFormat("%.0f");
  set_log_range(x_, low / 1.3, high * 1.3);
  y_ = new QLogValueAxis();
  y_->setBase(10);
  y_->setTitleText("GiB");
  y_->setLabelFormat("%.3g");
  c->addAxis(x_, Qt::AlignBottom);
  c->addAxis(y_, Qt::AlignLeft);
  std::map<std::string, QScatterSeries*> legend;
  for (std::size_t i = 0; i < schemes.size(); ++i) {
    const auto added = add_scheme_series(c, schemes[i], i, schemes.size(), "HBM", {x_, y_}, "DRAM", {x_, y_});
    legend[schemes[i]] = added.markers;
    series_[schemes[i]] = {added.solid, added.dashed, added.markers, added.misses, added.estimated};
  }
  add_marker_keys(c, {x_, y_});
  hbm_capacity_ = new_line(c, "HBM size", Qt::black, Qt::SolidLine, 2, {x_, y_});
  dram_capacity_ = new_line(c, "DRAM size", Qt::black, Qt::DashDotLine, 2, {x_, y_});
  // Without inputs (an error is shown) there are no capacities to draw.
  if (hbm_capacity_bytes > 0) hbm_capacity_->replace(QList<QPointF>{{low / 1.3, hbm_capacity_bytes / kGiB}, {high * 1.3, hbm_capacity_bytes / kGiB}});
  if (dram_capacity_bytes > 0)
    dram_capacity_->replace(QList<QPointF>{{low / 1.3, dram_capacity_bytes / kGiB}, {high * 1.3, dram_capacity_bytes / kGiB}});
  y_min_ = hbm_capacity_bytes > 0 ? hbm_capacity_bytes / kGiB / 8 : 1;
  y_max_ = dram_capacity_bytes > 0 ? dram_capacity_bytes / kGiB * 2 : 1024;
  set_log_range(y_, y_min_, y_max_);
  set_legend(c, legend);
}

void MemoryChart::clear_scheme(const std::string& scheme) {
  left_out_.clear(scheme);
  const auto it = series_.find(scheme);
  if (it == series_.end()) return;
  for (QXYSeries* s : std::initializer_list<QXYSeries*>{it->second.hbm, it->second.dram, it->second.markers, it->second.misses, it->second.estimated})
    s->clear();
  it->second.missed_lengths = 0;
}

void MemoryChart::add_point(const Point& p) {
  const auto it = series_.find(p.scheme);
  if (it == series_.end()) return;
  if (!p.skipped.empty()) {
    left_out_.add(p.scheme);
    return;
  }
  const double x = static_cast<double>(p.x);
  const double hbm = static_cast<double>(p.hbm_needed_bytes) / kGiB, dram = static_cast<double>(p.dram_needed_bytes) / kGiB;
  Series& s = it->second;
  if (p.provisional) {  // the estimate's HBM and DRAM, unless the simulated point is in
    if (!has_point_at(s.hbm, x) && !has_point_at(s.misses, x)) {
      remove_at(s.estimated, x);
      for (double v : {hbm, dram}) {
        if (v > 0) insert_sorted(s.estimated, {x, v});
      }
    }
    return;
  }
  remove_at(s.estimated, x);
  if (p.metrics.fits) {
    if (hbm > 0) insert_sorted(s.hbm, {x, hbm}), insert_sorted(s.markers, {x, hbm});
    if (dram > 0) insert_sorted(s.dram, {x, dram});
  } else {
    ++s.missed_lengths;
    for (double v : {hbm, dram}) {
      if (v > 0) insert_sorted(s.misses, {x, v});
    }
  }
  for (double v : {hbm, dram}) {
    if (v > 0) y_min_ = std::min(y_min_, v / 1.5), y_max_ = std::max(y_max_, v * 1.5);
  }
  set_log_range(y_, y_min_, y_max_);
}

int MemoryChart::estimated_points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? 0 : static_cast<int>(it->second.estimated->count());
}

int MemoryChart::points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? 0 : static_cast<int>(it->second.hbm->count()) + it->second.missed_lengths;
}

QList<QPointF> MemoryChart::misses(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? QList<QPointF>() : it->second.misses->points();
}

QList<QPointF> MemoryChart::hbm_points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? QList<QPointF>() : it->second.hbm->points();
}

int MemoryChart::total_points() const {
  int n = 0;
  for (const auto& [scheme, s] : series_) n += static_cast<int>(s.hbm->count()) + s.missed_lengths;
  return n;
}

// --- chart 3 ---------------------------------------------------------------------------------------------------

namespace {

// At most `buckets` points that keep each bucket's highest level (the peaks matter), as a step line.
QList<QPointF> step_line(const std::vector<sim::Sample>& samples, double step_s, std::size_t buckets) {
  QList<QPointF> out;
  if (samples.empty()) return out;
  const double t_end = std::max(step_s, static_cast<double>(samples.back().time_ns) * 1e-9);
  const double width = t_end / static_cast<double>(buckets);
  double previous = 0;
  std::size_t i = 0;
  for (std::size_t b = 0; b < buckets && i < samples.size(); ++b) {
    const double bucket_end = width * static_cast<double>(b + 1);
    double high = -1, last = previous;
    double first_t = -1;
    for (; i < samples.size() && static_cast<double>(samples[i].time_ns) * 1e-9 <= bucket_end; ++i) {
      if (first_t < 0) first_t = static_cast<double>(samples[i].time_ns) * 1e-9;
      high = std::max(high, samples[i].value);
      last = samples[i].value;
    }
    if (high < 0) continue;  // no change in this bucket
    out.push_back({first_t, previous / kGiB});
    out.push_back({first_t, high / kGiB});
    if (last != high) out.push_back({bucket_end, last / kGiB});
    previous = last;
  }
  out.push_back({t_end, previous / kGiB});
  return out;
}

}  // namespace

StepMemoryChart::StepMemoryChart(QWidget* parent) : QChartView(parent) {
  setRenderHint(QPainter::Antialiasing);
  QChart* c = new_chart("Memory over the selected plan's step");
  setChart(c);
  x_ = new QValueAxis();
  x_->setTitleText("time (s)");
  hbm_axis_ = new QValueAxis();
  hbm_axis_->setTitleText("HBM (GiB)");
  dram_axis_ = new QValueAxis();
  dram_axis_->setTitleText("pinned DRAM (GiB)");
  c->addAxis(x_, Qt::AlignBottom);
  c->addAxis(hbm_axis_, Qt::AlignLeft);
  c->addAxis(dram_axis_, Qt::AlignRight);
  hbm_ = new_line(c, "HBM of the GPU", QColor(0xd6, 0x27, 0x28), Qt::SolidLine, 2, {x_, hbm_axis_});
  dram_ = new_line(c, "DRAM of its node", QColor(0x1f, 0x77, 0xb4), Qt::SolidLine, 2, {x_, dram_axis_});
  capacity_ = new_line(c, "HBM capacity", Qt::black, Qt::DashLine, 2, {x_, hbm_axis_});
}

void StepMemoryChart::clear() {
  hbm_->clear();
  dram_->clear();
  capacity_->clear();
}

void StepMemoryChart::show_plan(const PlanDetail& d, int gpu) {
  const auto& r = *d.result;
  const auto& cluster = d.setup->cluster;
  gpu = std::clamp(gpu, 0, r.gpus - 1);
  const double step_s = static_cast<double>(r.step_ns) * 1e-9;
  constexpr std::size_t kBuckets = 800;
  const auto& hbm_pool = r.pools[gpu];
  const auto& dram_pool = r.pools[r.gpus + cluster.node_of(gpu)];
  hbm_->setName(QString("HBM of gpu%1").arg(gpu));
  dram_->setName(QString("DRAM of host%1").arg(cluster.node_of(gpu)));
  hbm_->replace(step_line(hbm_pool.level, step_s, kBuckets));
  dram_->replace(step_line(dram_pool.level, step_s, kBuckets));
  const double capacity = static_cast<double>(hbm_pool.capacity_bytes) / kGiB;
  capacity_->replace(QList<QPointF>{{0, capacity}, {step_s, capacity}});
  x_->setRange(0, std::max(step_s, 1e-9));
  hbm_axis_->setRange(0, std::max(capacity, static_cast<double>(hbm_pool.peak_bytes) / kGiB) * 1.05);
  dram_axis_->setRange(0, std::max(1.0, static_cast<double>(dram_pool.peak_bytes) / kGiB * 1.1));
}

int StepMemoryChart::points() const { return static_cast<int>(hbm_->count() + dram_->count()); }

}  // namespace trainyard::gui
