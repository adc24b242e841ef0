#include "gui/timeline_view.hpp"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>

#include <algorithm>
#include <map>

namespace trainyard::gui {

namespace {

constexpr int kLabelWidth = 110, kRowHeight = 26, kLinkRowHeight = 18, kAxisHeight = 20;

QColor class_color(const std::string& task_class) {
  static const std::map<std::string, QColor> colors{
      {"gemm", QColor(0x1f, 0x77, 0xb4)},        {"attention fwd", QColor(0xd6, 0x27, 0x28)}, {"attention bwd", QColor(0x9c, 0x1b, 0x1c)},
      {"elementwise", QColor(0x7f, 0x7f, 0x7f)}, {"optimizer", QColor(0x8c, 0x56, 0x4b)},     {"H2D", QColor(0x2c, 0xa0, 0x2c)},
      {"D2H", QColor(0x98, 0xdf, 0x8a)},         {"p2p", QColor(0xff, 0x7f, 0x0e)},           {"collective", QColor(0x94, 0x67, 0xbd)}};
  const auto it = colors.find(task_class);
  return it == colors.end() ? QColor(0xbc, 0xbd, 0x22) : it->second;
}

// "sw0->gpu3", "gpu3<->x": whether `gpu` is one end of the link.
bool link_touches(const std::string& link, const std::string& gpu) {
  for (const std::string sep : {"<->", "->"}) {
    const auto at = link.find(sep);
    if (at != std::string::npos) return link.substr(0, at) == gpu || link.substr(at + sep.size()) == gpu;
  }
  return false;
}

}  // namespace

TimelineView::TimelineView(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setMinimumHeight(120);
}

void TimelineView::set_predicted(std::shared_ptr<const sim::Timeline> timeline, std::shared_ptr<const TimelineRows> rows,
                                 std::shared_ptr<const sim::SimResult> result) {
  predicted_ = std::move(timeline);
  predicted_rows_ = std::move(rows);
  result_ = std::move(result);
  rebuild();
  show_all();
}

void TimelineView::set_measured(std::shared_ptr<const sim::Timeline> timeline, std::shared_ptr<const TimelineRows> rows) {
  measured_ = std::move(timeline);
  measured_rows_ = std::move(rows);
  rebuild();
  show_all();
}

void TimelineView::clear() {
  predicted_.reset();
  measured_.reset();
  predicted_rows_.reset();
  measured_rows_.reset();
  result_.reset();
  rebuild();
  show_all();
}

void TimelineView::set_device(int pid) {
  pid_ = pid;
  rebuild();
  update();
}

int TimelineView::predicted_slices() const {
  int n = 0;
  for (const auto& row : rows_) n += row.predicted ? static_cast<int>(row.predicted->size()) : 0;
  return n;
}

int TimelineView::measured_slices() const {
  int n = 0;
  for (const auto& row : rows_) n += row.measured ? static_cast<int>(row.measured->size()) : 0;
  return n;
}

void TimelineView::rebuild() {
  rows_.clear();
  std::map<int, Row> by_tid;
  auto add = [&](const std::shared_ptr<const sim::Timeline>& t, const std::shared_ptr<const TimelineRows>& index, bool measured) {
    if (!t || !index) return;
    const auto device = index->find(pid_);
    if (device == index->end()) return;
    for (const auto& [tid, indices] : device->second) {
      Row& row = by_tid[tid];
      row.tid = tid;
      (measured ? row.measured : row.predicted) = &indices;
      if (row.name.isEmpty()) {
        const auto it = t->stream_names.find({pid_, tid});
        row.name = it != t->stream_names.end() ? QString::fromStdString(it->second) : QString("stream %1").arg(tid);
      }
    }
  };
  add(predicted_, predicted_rows_, false);
  add(measured_, measured_rows_, true);
  for (auto& [tid, row] : by_tid) rows_.push_back(row);
  links_shown_.clear();
  const std::string gpu = "gpu" + std::to_string(pid_);
  if (result_) {
    for (std::size_t i = 0; i < result_->links.size(); ++i) {
      if (link_touches(result_->links[i].name, gpu)) links_shown_.push_back(i);
    }
  }
  setMinimumHeight(kAxisHeight + kRowHeight * static_cast<int>(rows_.size()) + kLinkRowHeight * static_cast<int>(links_shown_.size()) + 4);
}

void TimelineView::show_all() {
  double end = predicted_ ? static_cast<double>(predicted_->step_ns) : 0.0;
  if (measured_) end = std::max(end, static_cast<double>(measured_->step_ns));
  view_start_ns_ = 0;
  view_end_ns_ = std::max(end, 1.0);
  update();
}

void TimelineView::zoom(double factor, double at) {
  const double span = view_end_ns_ - view_start_ns_;
  const double pivot = view_start_ns_ + span * std::clamp(at, 0.0, 1.0);
  const double new_span = std::max(span / factor, 1000.0);  // no closer than 1 us across
  view_start_ns_ = pivot - (pivot - view_start_ns_) * new_span / span;
  view_end_ns_ = view_start_ns_ + new_span;
  update();
}

double TimelineView::time_at(double x) const {
  const double width = std::max(1, this->width() - kLabelWidth);
  return view_start_ns_ + (x - kLabelWidth) / width * (view_end_ns_ - view_start_ns_);
}

double TimelineView::x_at(double ns) const {
  const double width = std::max(1, this->width() - kLabelWidth);
  return kLabelWidth + (ns - view_start_ns_) / (view_end_ns_ - view_start_ns_) * width;
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), Qt::white);
  p.setPen(Qt::black);
  if (rows_.empty()) {
    p.drawText(rect(), Qt::AlignCenter, "no plan selected");
    return;
  }
  // Time axis.
  const double span_s = (view_end_ns_ - view_start_ns_) * 1e-9;
  p.drawText(QRect(0, 0, kLabelWidth, kAxisHeight), Qt::AlignVCenter, QString("gpu%1").arg(pid_));
  for (int i = 0; i <= 4; ++i) {
    const double x = kLabelWidth + (width() - kLabelWidth - 60) * i / 4.0;
    const double t_s = time_at(x) * 1e-9;
    p.drawText(QPointF(x, kAxisHeight - 6), QString::number(t_s, 'g', span_s < 1e-3 ? 6 : 4) + " s");
  }
  int y = kAxisHeight;
  auto draw_slices = [&](const sim::Timeline& t, const std::vector<std::size_t>* indices, int top, int height) {
    if (!indices) return;
    // Slices sorted by start: skip those ending before the view, stop at the first starting after it.
    double last_x = -1;
    for (std::size_t i : *indices) {
      const auto& s = t.slices[i];
      const double start = static_cast<double>(s.start_ns), end = start + static_cast<double>(s.duration_ns);
      if (end < view_start_ns_) continue;
      if (start > view_end_ns_) break;
      const double x0 = std::max(static_cast<double>(kLabelWidth), x_at(start)), x1 = std::min(static_cast<double>(width()), x_at(end));
      if (x1 < last_x + 0.5 && x1 - x0 < 1) continue;  // many tasks in one pixel: draw the first
      p.fillRect(QRectF(x0, top, std::max(1.0, x1 - x0), height), class_color(s.task_class));
      if (x1 - x0 > 60) {
        p.setPen(Qt::white);
        p.drawText(QRectF(x0 + 2, top, x1 - x0 - 4, height), Qt::AlignVCenter | Qt::AlignLeft, QString::fromStdString(s.name));
      }
      last_x = x1;
    }
  };
  for (const auto& row : rows_) {
    p.setPen(Qt::black);
    p.drawText(QRect(2, y, kLabelWidth - 4, kRowHeight), Qt::AlignVCenter, row.name);
    p.setPen(QColor(230, 230, 230));
    p.drawLine(kLabelWidth, y + kRowHeight - 1, width(), y + kRowHeight - 1);
    if (measured_) {
      if (predicted_) draw_slices(*predicted_, row.predicted, y + 2, kRowHeight / 2 - 2);
      draw_slices(*measured_, row.measured, y + kRowHeight / 2 + 1, kRowHeight / 2 - 3);
    } else if (predicted_) {
      draw_slices(*predicted_, row.predicted, y + 3, kRowHeight - 6);
    }
    y += kRowHeight;
  }
  // The GPU's links: load as a fraction of capacity, as a filled step curve.
  for (std::size_t i : links_shown_) {
    const auto& link = result_->links[i];
    p.setPen(Qt::black);
    p.drawText(QRect(2, y, kLabelWidth - 4, kLinkRowHeight), Qt::AlignVCenter, QString::fromStdString(link.name));
    double level = 0, from = 0;
    auto bar = [&](double t0, double t1, double load) {
      if (load <= 0 || t1 < view_start_ns_ || t0 > view_end_ns_) return;
      const double x0 = std::max(static_cast<double>(kLabelWidth), x_at(t0)), x1 = std::min(static_cast<double>(width()), x_at(t1));
      const double h = (kLinkRowHeight - 3) * std::min(1.0, load / std::max(link.capacity_GBps, 1e-9));
      p.fillRect(QRectF(x0, y + kLinkRowHeight - 1 - h, std::max(1.0, x1 - x0), h), QColor(0xff, 0x7f, 0x0e));
    };
    for (const auto& sample : link.load_GBps) {
      const double t = static_cast<double>(sample.time_ns);
      bar(from, t, level);
      from = t;
      level = sample.value;
    }
    bar(from, view_end_ns_, level);
    y += kLinkRowHeight;
  }
  if (measured_) {
    p.setPen(Qt::darkGray);
    p.drawText(QRect(kLabelWidth, y, width() - kLabelWidth, 16), Qt::AlignLeft, "upper half: predicted, lower half: measured");
  }
}

const sim::TimelineSlice* TimelineView::slice_at(QPoint point) const {
  if (point.x() < kLabelWidth || point.y() < kAxisHeight) return nullptr;
  const auto r = static_cast<std::size_t>((point.y() - kAxisHeight) / kRowHeight);
  if (r >= rows_.size()) return nullptr;
  const bool lower = measured_ && (point.y() - kAxisHeight) % kRowHeight >= kRowHeight / 2;
  const sim::Timeline* t = lower ? measured_.get() : predicted_.get();
  const std::vector<std::size_t>* indices = lower ? rows_[r].measured : rows_[r].predicted;
  if (!t || !indices) return nullptr;
  const double ns = time_at(point.x()), tolerance = (view_end_ns_ - view_start_ns_) / std::max(1, width()) * 2;
  for (std::size_t i : *indices) {
    const auto& s = t->slices[i];
    if (static_cast<double>(s.start_ns) > ns + tolerance) break;
    if (static_cast<double>(s.start_ns + s.duration_ns) >= ns - tolerance) return &s;
  }
  return nullptr;
}

void TimelineView::wheelEvent(QWheelEvent* event) {
  const double steps = event->angleDelta().y() / 120.0;
  const double at = (event->position().x() - kLabelWidth) / std::max(1, width() - kLabelWidth);
  zoom(std::pow(1.25, steps), at);
  event->accept();
}

void TimelineView::mousePressEvent(QMouseEvent* event) {
  drag_from_ = event->pos();
  drag_start_ns_ = view_start_ns_;
}

void TimelineView::mouseMoveEvent(QMouseEvent* event) {
  if (drag_from_ && (event->buttons() & Qt::LeftButton)) {
    const double span = view_end_ns_ - view_start_ns_;
    const double shift = (event->pos().x() - drag_from_->x()) / std::max(1.0, static_cast<double>(width() - kLabelWidth)) * span;
    view_start_ns_ = drag_start_ns_ - shift;
    view_end_ns_ = view_start_ns_ + span;
    update();
    return;
  }
  if (const auto* s = slice_at(event->pos())) {
    const QString text = QString("%1  [%2]  start %3 ms, %4 ms")
                             .arg(QString::fromStdString(s->name), QString::fromStdString(s->task_class))
                             .arg(static_cast<double>(s->start_ns) * 1e-6, 0, 'f', 3)
                             .arg(static_cast<double>(s->duration_ns) * 1e-6, 0, 'f', 3);
    QToolTip::showText(event->globalPosition().toPoint(), text, this);
    emit hovered(text);
  } else {
    QToolTip::hideText();
  }
}

void TimelineView::mouseReleaseEvent(QMouseEvent*) { drag_from_.reset(); }

void TimelineView::mouseDoubleClickEvent(QMouseEvent*) { show_all(); }

}  // namespace trainyard::gui
