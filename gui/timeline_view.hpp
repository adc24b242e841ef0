#pragma once
// Chart 4: a Gantt of one GPU's streams (compute, copy engines, comm) with the Chrome trace's task names, and
// below them the load of that GPU's own links. A measured trace (trainyard run --trace) can be laid over the
// prediction: each stream row then shows the prediction in its upper half and the measurement in its lower half.
// Mouse wheel zooms around the pointer, dragging pans, a double click shows the whole step; hovering a task names
// it.
#include <QWidget>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gui/what_if.hpp"
#include "sim/compare.hpp"
#include "sim/engine.hpp"

namespace trainyard::gui {

class TimelineView : public QWidget {
  Q_OBJECT
 public:
  explicit TimelineView(QWidget* parent = nullptr);

  // The prediction with its index (what_if.hpp) and the simulation whose links it shows.
  void set_predicted(std::shared_ptr<const sim::Timeline> timeline, std::shared_ptr<const TimelineRows> rows,
                     std::shared_ptr<const sim::SimResult> result);
  void set_measured(std::shared_ptr<const sim::Timeline> timeline, std::shared_ptr<const TimelineRows> rows);
  void clear();
  void set_device(int pid);  // a GPU's index (the trace's process)
  int device() const { return pid_; }

  int stream_rows() const { return static_cast<int>(rows_.size()); }
  int link_rows() const { return static_cast<int>(links_shown_.size()); }
  int predicted_slices() const;  // on the shown GPU
  int measured_slices() const;
  bool has_measured() const { return measured_ != nullptr; }
  // The visible time window (ns); zoom() narrows it by `factor` around `at` (a fraction of the width).
  std::pair<double, double> view() const { return {view_start_ns_, view_end_ns_}; }
  void zoom(double factor, double at);
  void show_all();
  QSize sizeHint() const override { return {900, 260}; }

 signals:
  void hovered(const QString& text);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseDoubleClickEvent(QMouseEvent* event) override;

 private:
  struct Row {
    int tid = 0;
    QString name;
    const std::vector<std::size_t>* predicted = nullptr;  // slice indices by start time, in the rows_ indices
    const std::vector<std::size_t>* measured = nullptr;
  };
  void rebuild();
  double time_at(double x) const;
  double x_at(double ns) const;
  const sim::TimelineSlice* slice_at(QPoint p) const;

  std::shared_ptr<const sim::Timeline> predicted_, measured_;
  std::shared_ptr<const TimelineRows> predicted_rows_, measured_rows_;
  std::shared_ptr<const sim::SimResult> result_;
  std::vector<std::size_t> links_shown_;  // indices into result_->links: those with this GPU at one end
  std::vector<Row> rows_;
  int pid_ = 0;
  double view_start_ns_ = 0, view_end_ns_ = 1;
  std::optional<QPoint> drag_from_;
  double drag_start_ns_ = 0;
};

}  // namespace trainyard::gui
