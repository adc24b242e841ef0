#include "gui/charts.hpp"

#include <QtCharts/QChart>
#include <QtCharts/QLegendMarker>

#include <algorithm>
#include <cmath>

#include "common/units.hpp"

namespace trainyard::gui {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

QChart* new_chart(const QString& title) {
  auto* chart = new QChart();
  chart->setTitle(title);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setMargins(QMargins(4, 4, 4, 4));
  chart->setAnimationOptions(QChart::NoAnimation);
  return chart;
}

QLineSeries* new_line(QChart* chart, const QString& name, QColor color, Qt::PenStyle style, const std::vector<QAbstractAxis*>& axes) {
  auto* s = new QLineSeries();
  s->setName(name);
  QPen pen(color);
  pen.setWidthF(2);
  pen.setStyle(style);
  s->setPen(pen);
  chart->addSeries(s);
  for (auto* axis : axes) s->attachAxis(axis);
  return s;
}

// Empties a chart for a new set of series and axes.
void remove_series_and_axes(QChart* chart) {
  chart->removeAllSeries();
  for (auto* axis : chart->axes()) {
    chart->removeAxis(axis);
    delete axis;
  }
}

// The legend names each scheme once (its solid line): the dashed line of the same colour, named with `suffix`,
// has no entry.
void hide_legend_entries(QChart* chart, const QString& suffix) {
  for (auto* marker : chart->legend()->markers()) {
    if (marker->label().endsWith(suffix)) marker->setVisible(false);
  }
}

// Log axes want a positive range that is not a single point.
void set_log_range(QLogValueAxis* axis, double low, double high) {
  if (!(low > 0)) low = 1;
  if (high <= low) high = low * 2;
  axis->setRange(low, high);
}

}  // namespace

QColor scheme_color(const std::string& scheme) {
  static const std::map<std::string, QColor> colors{
      {"ringtrack", QColor(0xd6, 0x27, 0x28)}, {"fpdt", QColor(0x1f, 0x77, 0xb4)},     {"ulysses", QColor(0x2c, 0xa0, 0x2c)},
      {"ring-attention", QColor(0x94, 0x67, 0xbd)}, {"megatron", QColor(0xff, 0x7f, 0x0e)}, {"zero", QColor(0x8c, 0x56, 0x4b)}};
  const auto it = colors.find(scheme);
  return it == colors.end() ? QColor(Qt::gray) : it->second;
}

void insert_sorted(QXYSeries* series, QPointF point) {
  const QList<QPointF> points = series->points();
  const auto at = std::lower_bound(points.begin(), points.end(), point, [](QPointF a, QPointF b) { return a.x() < b.x(); });
  series->insert(static_cast<int>(at - points.begin()), point);
}

// --- chart 1 ---------------------------------------------------------------------------------------------------

ChunkChart::ChunkChart(QWidget* parent) : QChartView(parent) {
  setRenderHint(QPainter::Antialiasing);
  setChart(new_chart("MFU (solid) and step time (dashed) vs chunk length"));
  reset({}, 1024, 256 * 1024);
}

void ChunkChart::reset(const std::vector<std::string>& schemes, std::int64_t min_chunk, std::int64_t max_chunk) {
  QChart* c = chart();
  remove_series_and_axes(c);
  series_.clear();
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
  for (const auto& scheme : schemes) {
    Series s;
    s.mfu = new_line(c, QString::fromStdString(scheme), scheme_color(scheme), Qt::SolidLine, {x_, mfu_axis_});
    s.step = new_line(c, QString::fromStdString(scheme) + " step", scheme_color(scheme), Qt::DashLine, {x_, step_axis_});
    series_[scheme] = s;
  }
  misses_ = new QScatterSeries();
  misses_->setName("does not fit");
  misses_->setMarkerShape(QScatterSeries::MarkerShapeRectangle);
  misses_->setMarkerSize(7);
  misses_->setColor(Qt::black);
  c->addSeries(misses_);
  misses_->attachAxis(x_);
  misses_->attachAxis(mfu_axis_);
  hide_legend_entries(c, " step");
}

void ChunkChart::clear_scheme(const std::string& scheme) {
  const auto it = series_.find(scheme);
  if (it == series_.end()) return;
  it->second.mfu->clear();
  it->second.step->clear();
  it->second.points = 0;
  it->second.misses.clear();
  show_misses();
}

void ChunkChart::show_misses() {
  QList<QPointF> all;
  for (const auto& [scheme, s] : series_) all.append(s.misses);
  misses_->replace(all);
}

void ChunkChart::add_point(const Point& p) {
  const auto it = series_.find(p.scheme);
  if (it == series_.end() || !p.skipped.empty()) return;
  Series& s = it->second;
  if (!p.metrics.fits) {
    if (p.x > 0) {
      s.misses.push_back({static_cast<double>(p.x), 0});
      show_misses();
    }
    return;
  }
  const double mfu = 100 * p.metrics.mfu, step = p.metrics.step_s;
  if (p.x > 0) {
    insert_sorted(s.mfu, {static_cast<double>(p.x), mfu});
    insert_sorted(s.step, {static_cast<double>(p.x), step});
  } else {  // no chunk: the same plan at every chunk length
    s.mfu->replace(QList<QPointF>{{static_cast<double>(min_chunk_), mfu}, {static_cast<double>(max_chunk_), mfu}});
    s.step->replace(QList<QPointF>{{static_cast<double>(min_chunk_), step}, {static_cast<double>(max_chunk_), step}});
  }
  ++s.points;
  step_max_s_ = std::max(step_max_s_, step);
  step_axis_->setRange(0, step_max_s_ * 1.1);
}

int ChunkChart::points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? 0 : it->second.points;
}

// --- chart 2 ---------------------------------------------------------------------------------------------------

MemoryChart::MemoryChart(QWidget* parent) : QChartView(parent) {
  setRenderHint(QPainter::Antialiasing);
  setChart(new_chart("Peak HBM per GPU (solid) and DRAM per node (dashed) vs sequence length"));
  reset({}, {4096, 8192}, 80 * kGiB, 2048 * kGiB);
}

void MemoryChart::reset(const std::vector<std::string>& schemes, const std::vector<std::int64_t>& lengths, double hbm_capacity_bytes,
                        double dram_capacity_bytes) {
  QChart* c = chart();
  remove_series_and_axes(c);
  series_.clear();
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
  for (const auto& scheme : schemes) {
    Series s;
    s.hbm = new_line(c, QString::fromStdString(scheme), scheme_color(scheme), Qt::SolidLine, {x_, y_});
    s.dram = new_line(c, QString::fromStdString(scheme) + " DRAM", scheme_color(scheme), Qt::DashLine, {x_, y_});
    s.hbm->setPointsVisible(true);
    series_[scheme] = s;
  }
  hbm_capacity_ = new_line(c, "HBM size", Qt::black, Qt::SolidLine, {x_, y_});
  dram_capacity_ = new_line(c, "DRAM size", Qt::black, Qt::DashDotLine, {x_, y_});
  // Without inputs (an error is shown) there are no capacities to draw.
  if (hbm_capacity_bytes > 0) hbm_capacity_->replace(QList<QPointF>{{low / 1.3, hbm_capacity_bytes / kGiB}, {high * 1.3, hbm_capacity_bytes / kGiB}});
  if (dram_capacity_bytes > 0) dram_capacity_->replace(QList<QPointF>{{low / 1.3, dram_capacity_bytes / kGiB}, {high * 1.3, dram_capacity_bytes / kGiB}});
  y_min_ = hbm_capacity_bytes > 0 ? hbm_capacity_bytes / kGiB / 8 : 1;
  y_max_ = dram_capacity_bytes > 0 ? dram_capacity_bytes / kGiB * 2 : 1024;
  set_log_range(y_, y_min_, y_max_);
  hide_legend_entries(c, " DRAM");
}

void MemoryChart::clear_scheme(const std::string& scheme) {
  const auto it = series_.find(scheme);
  if (it == series_.end()) return;
  it->second.hbm->clear();
  it->second.dram->clear();
}

void MemoryChart::add_point(const Point& p) {
  const auto it = series_.find(p.scheme);
  if (it == series_.end() || !p.skipped.empty()) return;
  const double x = static_cast<double>(p.x);
  const double hbm = static_cast<double>(p.hbm_needed_bytes) / kGiB, dram = static_cast<double>(p.dram_needed_bytes) / kGiB;
  if (hbm > 0) insert_sorted(it->second.hbm, {x, hbm});
  if (dram > 0) insert_sorted(it->second.dram, {x, dram});
  for (double v : {hbm, dram}) {
    if (v > 0) y_min_ = std::min(y_min_, v / 1.5), y_max_ = std::max(y_max_, v * 1.5);
  }
  set_log_range(y_, y_min_, y_max_);
}

int MemoryChart::points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? 0 : static_cast<int>(it->second.hbm->count());
}

QList<QPointF> MemoryChart::hbm_points(const std::string& scheme) const {
  const auto it = series_.find(scheme);
  return it == series_.end() ? QList<QPointF>() : it->second.hbm->points();
}

int MemoryChart::total_points() const {
  int n = 0;
  for (const auto& [scheme, s] : series_) n += static_cast<int>(s.hbm->count());
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
  hbm_ = new_line(c, "HBM of the GPU", QColor(0xd6, 0x27, 0x28), Qt::SolidLine, {x_, hbm_axis_});
  dram_ = new_line(c, "DRAM of its node", QColor(0x1f, 0x77, 0xb4), Qt::SolidLine, {x_, dram_axis_});
  capacity_ = new_line(c, "HBM capacity", Qt::black, Qt::DashLine, {x_, hbm_axis_});
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
  const auto& hbm_pool = r.pools[static_cast<std::size_t>(gpu)];
  const auto& dram_pool = r.pools[static_cast<std::size_t>(r.gpus + cluster.node_of(gpu))];
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
