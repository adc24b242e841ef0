#pragma once
// The what-if planner's window: inputs on the left, the five charts on the right. Every change restarts the work
// it makes stale (JobRunner channels) and the charts fill in as points arrive; nothing here waits on a
// simulation.
#include <QCheckBox>
#include <QComboBox>
#include <QGroupBox>
#include <QLabel>
#include <QMainWindow>
#include <QPlainTextEdit>
#include <QSlider>
#include <QSpinBox>
#include <QSplitter>
#include <QTableWidget>
#include <QTimer>

#include <map>
#include <memory>
#include <optional>

#include "gui/charts.hpp"
#include "gui/job_runner.hpp"
#include "gui/param_panel.hpp"
#include "gui/timeline_view.hpp"
#include "gui/what_if.hpp"

namespace trainyard::gui {

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(const WhatIfInputs& inputs, QWidget* parent = nullptr);

  // For tests, the benchmark and --screenshot.
  JobRunner& jobs() { return jobs_; }
  ChunkChart* chunk_chart() const { return chunk_chart_; }
  MemoryChart* memory_chart() const { return memory_chart_; }
  StepMemoryChart* step_memory_chart() const { return step_memory_chart_; }
  TimelineView* timeline() const { return timeline_; }
  QTableWidget* plan_table() const { return table_; }
  QString error_text() const;  // empty when no error is shown
  QString status_text() const { return status_->text(); }
  const std::optional<planner::PlanSpec>& selected_plan() const { return selected_; }
  const std::shared_ptr<const PlanDetail>& selected_detail() const { return detail_; }
  std::shared_ptr<const Setup> setup() const { return setup_; }

  // What the controls do, callable without them (the menu's dialogs end here too). The file functions return
  // false, with the error shown, when they fail; nothing is half-written.
  void set_seq_len(std::int64_t tokens);  // moves the slider (to the nearest power of two)
  void set_chunk(std::int64_t tokens);    // the selected plan's chunk, where it has one
  void set_hw(const QString& hw);
  void recompute_now();  // instead of waiting for the controls' short debounce
  bool open_plan(const QString& path);
  bool save_plan(const QString& path);
  bool save_trace(const QString& path);
  bool open_measured(const QString& path);
  bool save_chart(QWidget* chart, const QString& path);  // .png or .svg
  // The search's estimate ranking (SearchOptions::estimated), shown while it simulates: every row marked "~" and
  // "(est.)" until the simulated ranking replaces it.
  void show_provisional(const std::vector<planner::EstimatedPlan>& plans);

 signals:
  // New data reached a chart: 1 (chunk sweep), 2 (memory vs length), 3 (the selected plan: charts 3 and 4),
  // 5 (the ranked table), 6 (the ranked table by the estimate, provisional), 7 (charts 1 and 2 by the estimate,
  // provisional). The benchmark times the controls with it.
  void chart_updated(int chart);

 private:
  void build_controls(QWidget* panel);
  void build_menus();
  void set_inputs(const WhatIfInputs& inputs);
  WhatIfInputs read_inputs() const;
  void inputs_changed();  // a control of the inputs moved: debounced recompute_all
  void params_changed();  // the selected plan's parameters changed
  void scheme_changed();  // the selected plan's scheme changed
  void row_selected();
  void recompute_all();
  void update_panel_ranges();
  void show_param_group();
  void set_panel(const planner::PlanSpec& spec);
  planner::PlanSpec panel_spec() const;
  void select_plan(const planner::PlanSpec& spec, bool by_user);
  void pick_quick_plan(const std::string& scheme, bool by_user);  // on a worker, then select_plan

  void start_chunk_chart(const std::string& scheme);
  void start_memory_chart(const std::string& scheme);
  void start_selected_plan();
  void start_search();
  struct Estimated;  // the estimate job's answer
  void start_estimate(const std::string& pick);
  void start_simulations(const std::string& pick);
  void start_other_charts();
  void show_detail();
  void show_comparison();  // the compare tab and the timeline's overlay: the selected plan against the measured trace
  void show_ranked(const planner::SearchReport& report);
  void fill_table_row(int row, const QStringList& cells, const QString& tooltip);
  void fit_table_width();  // the middle row's split, so the table's figures are in view
  void show_error(const QString& text);
  void clear_error();
  void update_status();

  JobRunner jobs_;
  std::shared_ptr<const Setup> setup_;
  std::optional<planner::PlanSpec> selected_;
  std::shared_ptr<const PlanDetail> detail_;
  std::shared_ptr<const MeasuredTrace> measured_;
  std::shared_ptr<const TimelineRows> measured_rows_;
  void drop_detail();  // frees the old plan's graph and result on a worker: freeing a large one takes long
  std::vector<planner::RankedPlan> ranked_;
  std::vector<planner::EstimatedPlan> provisional_;  // the table's rows while ranked_ is empty and a search runs
  ChartEstimates chart_estimates_;                   // charts 1 and 2 by the estimate for these inputs
  std::vector<planner::PlanSpec> best_of_scheme_;    // the last search's best plan of each scheme
  // What the charts draw for each scheme: the selected plan, then the search's best of the scheme.
  std::vector<planner::PlanSpec> preferred_plans() const;
  // The user picked or edited the selected plan: it stays selected while valid, and the search's winner does not
  // replace it.
  bool user_chose_ = false;
  QString search_progress_;
  QTimer debounce_;
  double hbm_headroom_ = 0.05;  // --hbm-headroom (no control: kept from the inputs the window started with)

  // Inputs.
  QComboBox* model_ = nullptr;
  QComboBox* hw_ = nullptr;
  QSpinBox* nodes_ = nullptr;
  QSlider* seq_ = nullptr;
  QLabel* seq_label_ = nullptr;
  QComboBox* tokens_ = nullptr;
  std::map<std::string, QCheckBox*> scheme_boxes_;
  QComboBox* objective_ = nullptr;
  QSpinBox* gpu_ = nullptr;
  // The selected plan's parameters.
  QComboBox* scheme_ = nullptr;
  QComboBox* chunk_ = nullptr;
  ParamPanel* param_panel_ = nullptr;  // generated from the schemes' parameter descriptions

  // Outputs.
  QLabel* error_ = nullptr;
  QLabel* plan_label_ = nullptr;
  QLabel* status_ = nullptr;
  ChunkChart* chunk_chart_ = nullptr;
  MemoryChart* memory_chart_ = nullptr;
  StepMemoryChart* step_memory_chart_ = nullptr;
  TimelineView* timeline_ = nullptr;
  QTableWidget* table_ = nullptr;
  QSplitter* middle_ = nullptr;  // chart 3 | the table
  bool table_width_fitted_ = false;
  QPlainTextEdit* compare_ = nullptr;
};

}  // namespace trainyard::gui
