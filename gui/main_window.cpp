#include "gui/main_window.hpp"

#include <set>

#include <QBuffer>
#include <QFileDialog>
#include <QFormLayout>
#include <QHeaderView>
#include <QMenuBar>
#include <QScrollArea>
#include <QScrollBar>
#include <QSplitter>
#include <QStatusBar>
#include <QSvgGenerator>
#include <QTabWidget>
#include <QVBoxLayout>

#include <cmath>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/analytic.hpp"
#include "sim/report.hpp"

namespace trainyard::gui {

namespace {

// A scheme's kept provisional points, given to its chart again after the chart cleared the scheme: a chart keeps
// one only until the simulated point of the same x is in, and shows it once however often it is given (charts.hpp).
template <typename Chart>
void show_estimates(Chart* chart, const std::vector<Point>& estimates, const std::string& scheme) {
  for (const Point& p : estimates) {
    if (p.scheme == scheme) chart->add_point(p);
  }
}

// The slider's positions are the powers of two of the control's range (kMinSeqLen .. kMaxSeqLen, widened down to a
// shorter length the window is given).
int seq_log2(std::int64_t tokens) { return static_cast<int>(std::lround(std::log2(static_cast<double>(std::max<std::int64_t>(1, tokens))))); }
const int kMinSeqLog2 = seq_log2(kMinSeqLen);
const int kMaxSeqLog2 = seq_log2(kMaxSeqLen);

// The slider position nearest to `tokens`.
int seq_slider_position(const QSlider* slider, std::int64_t tokens) { return std::clamp(seq_log2(tokens), slider->minimum(), slider->maximum()); }

QString tokens_text(std::int64_t tokens) { return QString::fromStdString(format_tokens(tokens)); }

QSpinBox* spin(int low, int high, int value) {
  auto* s = new QSpinBox();
  s->setRange(low, high);
  s->setValue(value);
  return s;
}

QComboBox* words(std::initializer_list<const char*> items) {
  auto* c = new QComboBox();
  for (const char* item : items) c->addItem(item);
  return c;
}

std::string chart_channel(const std::string& chart, const std::string& scheme) { return chart + "/" + scheme; }

}  // namespace

MainWindow::MainWindow(const WhatIfInputs& inputs, QWidget* parent) : QMainWindow(parent) {
  setWindowTitle("trainyard: what-if planner");
  auto* central = new QSplitter(Qt::Horizontal);
  auto* panel = new QWidget();
  build_controls(panel);
  auto* scroll = new QScrollArea();
  scroll->setWidget(panel);
  scroll->setWidgetResizable(true);
  scroll->setMinimumWidth(320);
  central->addWidget(scroll);

  auto* right = new QWidget();
  auto* layout = new QVBoxLayout(right);
  error_ = new QLabel();
  error_->setStyleSheet("QLabel { color: white; background: #b22222; padding: 4px; }");
  error_->setWordWrap(true);
  error_->hide();
  layout->addWidget(error_);
  auto* rows = new QSplitter(Qt::Vertical);
  auto* top = new QSplitter(Qt::Horizontal);
  chunk_chart_ = new ChunkChart();
  memory_chart_ = new MemoryChart();
  top->addWidget(chunk_chart_);
  top->addWidget(memory_chart_);
  auto* middle = new QSplitter(Qt::Horizontal);
  step_memory_chart_ = new StepMemoryChart();
  // The plan's long description last: the figures that rank it come first and stay in view.
  table_ = new QTableWidget(0, 10);
  table_->setHorizontalHeaderLabels(
      {"#", "scheme", "step", "tokens/s", "MFU", "peak HBM", "peak DRAM", "bottleneck", "published runs like this", "plan"});
  table_->setWordWrap(false);
  table_->setHorizontalScrollMode(QAbstractItemView::ScrollPerPixel);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->hide();
  table_->horizontalHeader()->setStretchLastSection(false);  // a stretched plan column would be cut to the view
  middle->addWidget(step_memory_chart_);
  middle->addWidget(table_);
  middle_ = middle;
  auto* bottom = new QWidget();
  auto* bottom_layout = new QVBoxLayout(bottom);
  bottom_layout->setContentsMargins(0, 0, 0, 0);
  plan_label_ = new QLabel("no plan selected");
  plan_label_->setWordWrap(true);
  bottom_layout->addWidget(plan_label_);
  auto* tabs = new QTabWidget();
  timeline_ = new TimelineView();
  auto* timeline_scroll = new QScrollArea();
  timeline_scroll->setWidget(timeline_);
  timeline_scroll->setWidgetResizable(true);
  tabs->addTab(timeline_scroll, "timeline");
  compare_ = new QPlainTextEdit();
  compare_->setReadOnly(true);
  compare_->setFont(QFont("monospace"));
  compare_->setPlainText("Open a measured trace (File > Open measured trace, from trainyard run --trace) to compare it with this plan.");
  tabs->addTab(compare_, "compare");
  bottom_layout->addWidget(tabs);
  rows->addWidget(top);
  rows->addWidget(middle);
  rows->addWidget(bottom);
  layout->addWidget(rows);
  central->addWidget(right);
  central->setStretchFactor(1, 1);
  setCentralWidget(central);

  status_ = new QLabel("ready");
  statusBar()->addWidget(status_, 1);
  connect(&jobs_, &JobRunner::pending_changed, this, [this](int) { update_status(); });
  connect(timeline_, &TimelineView::hovered, this, [this](const QString& text) { statusBar()->showMessage(text, 3000); });
  connect(table_, &QTableWidget::itemSelectionChanged, this, &MainWindow::row_selected);
  build_menus();

  debounce_.setSingleShot(true);
  debounce_.setInterval(40);
  connect(&debounce_, &QTimer::timeout, this, &MainWindow::recompute_all);
  set_inputs(inputs);
  recompute_all();
}

void MainWindow::build_controls(QWidget* panel) {
  auto* layout = new QVBoxLayout(panel);
  auto* inputs = new QGroupBox("inputs");
  auto* form = new QFormLayout(inputs);
  model_ = new QComboBox();
  model_->setEditable(true);
  for (const auto& name : model::builtin_model_names()) model_->addItem(QString::fromStdString(name));
  model_->setToolTip("a catalog model, a JSON path or custom:layers=..,hidden=..,heads=..");
  hw_ = new QComboBox();
  hw_->setEditable(true);
  for (const auto& name : hw::builtin_node_names()) hw_->addItem(QString::fromStdString(name));
  hw_->setToolTip("a node profile name or a JSON path");
  nodes_ = spin(1, 4096, 1);
  seq_ = new QSlider(Qt::Horizontal);
  seq_->setRange(kMinSeqLog2, kMaxSeqLog2);
  seq_label_ = new QLabel();
  auto* seq_row = new QWidget();
  auto* seq_layout = new QHBoxLayout(seq_row);
  seq_layout->setContentsMargins(0, 0, 0, 0);
  seq_layout->addWidget(seq_, 1);
  seq_layout->addWidget(seq_label_);
  tokens_ = new QComboBox();
  tokens_->setEditable(true);
  for (const char* t : {"one sequence", "1M", "2M", "4M", "8M", "16M"}) tokens_->addItem(t);
  tokens_->setToolTip("tokens per optimizer step; sequences per step = tokens / sequence length (at least one)");
  objective_ = words({"throughput", "min-hbm"});
  form->addRow("model", model_);
  form->addRow("hardware", hw_);
  form->addRow("nodes", nodes_);
  form->addRow("sequence", seq_row);
  form->addRow("tokens per step", tokens_);
  form->addRow("objective", objective_);
  auto* schemes = new QWidget();
  auto* schemes_layout = new QGridLayout(schemes);
  schemes_layout->setContentsMargins(0, 0, 0, 0);
  int i = 0;
  for (const auto& scheme : planner::scheme_names()) {
    auto* box = new QCheckBox(QString::fromStdString(scheme));
    box->setChecked(true);
    scheme_boxes_[scheme] = box;
    schemes_layout->addWidget(box, i / 2, i % 2);
    ++i;
    connect(box, &QCheckBox::toggled, this, &MainWindow::inputs_changed);
  }
  form->addRow("compare", schemes);
  layout->addWidget(inputs);

  auto* plan = new QGroupBox("selected plan");
  auto* plan_form = new QFormLayout(plan);
  scheme_ = new QComboBox();
  for (const auto& s : planner::scheme_names()) scheme_->addItem(QString::fromStdString(s));
  chunk_ = new QComboBox();
  chunk_->setToolTip("ring-track: tokens per chunk; FPDT: attention chunk in global tokens");
  gpu_ = spin(0, 0, 0);
  gpu_->setToolTip("the GPU charts 3 and 4 show");
  plan_form->addRow("scheme", scheme_);
  plan_form->addRow("chunk", chunk_);
  plan_form->addRow("show GPU", gpu_);
  layout->addWidget(plan);

  param_panel_ = new ParamPanel();
  layout->addWidget(param_panel_);
  layout->addStretch(1);

  for (auto* combo : {model_, hw_, tokens_}) connect(combo, &QComboBox::currentTextChanged, this, &MainWindow::inputs_changed);
  connect(objective_, &QComboBox::currentIndexChanged, this, &MainWindow::inputs_changed);
  connect(nodes_, &QSpinBox::valueChanged, this, &MainWindow::inputs_changed);
  connect(seq_, &QSlider::valueChanged, this, [this](int v) {
    seq_label_->setText(tokens_text(std::int64_t{1} << v));
    inputs_changed();
  });
  connect(scheme_, &QComboBox::currentIndexChanged, this, &MainWindow::scheme_changed);
  connect(gpu_, &QSpinBox::valueChanged, this, [this](int) { show_detail(); });
  connect(chunk_, &QComboBox::currentIndexChanged, this, &MainWindow::params_changed);
  connect(param_panel_, &ParamPanel::changed, this, &MainWindow::params_changed);
}

void MainWindow::build_menus() {
  QMenu* file = menuBar()->addMenu("&File");
  auto ask = [this](bool save, const QString& title, const QString& filter, auto&& then) {
    const QString path = save ? QFileDialog::getSaveFileName(this, title, QString(), filter)
                              : QFileDialog::getOpenFileName(this, title, QString(), filter);
    if (!path.isEmpty()) then(path);
  };
  file->addAction("&Open plan...", this, [=, this] { ask(false, "Open plan", "Plan files (*.json)", [this](const QString& p) { open_plan(p); }); });
  file->addAction("&Save plan...", this, [=, this] { ask(true, "Save plan", "Plan files (*.json)", [this](const QString& p) { save_plan(p); }); });
  file->addAction("Open &measured trace...", this,
                  [=, this] { ask(false, "Open measured trace", "Chrome traces (*.json)", [this](const QString& p) { open_measured(p); }); });
  file->addAction("Save Chrome &trace...", this,
                  [=, this] { ask(true, "Save Chrome trace", "Chrome traces (*.json)", [this](const QString& p) { save_trace(p); }); });
  QMenu* charts = file->addMenu("Save &chart as PNG or SVG");
  const std::vector<std::pair<QString, QWidget*>> targets{{"MFU and step time vs chunk", chunk_chart_},
                                                          {"memory vs sequence length", memory_chart_},
                                                          {"memory over the step", step_memory_chart_},
                                                          {"timeline", timeline_},
                                                          {"whole window", this}};
  for (const auto& [name, widget] : targets) {
    charts->addAction(name, this,
                      [=, this] { ask(true, "Save " + name, "Images (*.png *.svg)", [this, widget](const QString& p) { save_chart(widget, p); }); });
  }
  file->addSeparator();
  file->addAction("&Quit", this, &QWidget::close);
}

// --- inputs ----------------------------------------------------------------------------------------------------

void MainWindow::set_inputs(const WhatIfInputs& in) {
  const QSignalBlocker b1(model_), b2(hw_), b3(nodes_), b4(seq_), b5(tokens_), b6(objective_);
  model_->setCurrentText(QString::fromStdString(in.model));
  hw_->setCurrentText(QString::fromStdString(in.hw));
  nodes_->setValue(in.nodes);
  seq_->setMinimum(std::min(seq_->minimum(), seq_log2(in.seq_len)));  // a plan's short sequence widens the range
  seq_->setValue(seq_slider_position(seq_, in.seq_len));
  seq_label_->setText(tokens_text(std::int64_t{1} << seq_->value()));
  tokens_->setCurrentText(in.tokens_per_step > 0 ? tokens_text(in.tokens_per_step) : "one sequence");
  objective_->setCurrentIndex(in.objective == planner::Objective::min_hbm ? 1 : 0);
  hbm_headroom_ = in.hbm_headroom;
  for (auto& [scheme, box] : scheme_boxes_) {
    const QSignalBlocker block(box);
    box->setChecked(std::find(in.schemes.begin(), in.schemes.end(), scheme) != in.schemes.end());
  }
}

WhatIfInputs MainWindow::read_inputs() const {
  WhatIfInputs in;
  in.model = model_->currentText().trimmed().toStdString();
  in.hw = hw_->currentText().trimmed().toStdString();
  in.nodes = nodes_->value();
  in.seq_len = std::int64_t{1} << seq_->value();
  const QString tokens = tokens_->currentText().trimmed();
  in.tokens_per_step = tokens.isEmpty() || tokens == "one sequence" ? 0 : parse_token_count(tokens.toStdString(), "tokens per step");
  in.objective = objective_->currentIndex() == 1 ? planner::Objective::min_hbm : planner::Objective::throughput;
  in.hbm_headroom = hbm_headroom_;
  in.schemes.clear();
  for (const auto& scheme : planner::scheme_names()) {
    if (scheme_boxes_.at(scheme)->isChecked()) in.schemes.push_back(scheme);
  }
  if (in.schemes.empty()) throw InputError("compare", "schemes", "at least one scheme ticked", "none");
  return in;
}

void MainWindow::inputs_changed() { debounce_.start(); }

void MainWindow::recompute_now() {
  debounce_.stop();
  recompute_all();
}

void MainWindow::set_seq_len(std::int64_t tokens) { seq_->setValue(seq_slider_position(seq_, tokens)); }

void MainWindow::set_hw(const QString& hw) { hw_->setCurrentText(hw); }

void MainWindow::set_chunk(std::int64_t tokens) {
  const int index = chunk_->findData(QVariant::fromValue<qlonglong>(tokens));
  if (index >= 0) chunk_->setCurrentIndex(index);
}

void MainWindow::recompute_all() {
  clear_error();
  for (const auto& scheme : planner::scheme_names()) {
    jobs_.restart(chart_channel("chunk", scheme));
    jobs_.restart(chart_channel("memory", scheme));
  }
  jobs_.restart("plan");
  jobs_.restart("search");
  ranked_.clear();
  best_of_scheme_.clear();
  chart_estimates_ = {};
  table_->setRowCount(0);
  drop_detail();
  try {
    setup_ = std::make_shared<const Setup>(read_inputs());
  } catch (const std::exception& e) {
    setup_.reset();
    selected_.reset();
    chunk_chart_->reset({}, 1024, 256 * 1024);
    memory_chart_->reset({}, {}, 0, 0);
    step_memory_chart_->clear();
    timeline_->clear();
    plan_label_->setText("no plan selected");
    show_error(e.what());
    update_status();
    return;
  }
  update_panel_ranges();
  // The selected plan: the user's where it is still valid, else (on a worker) the planner's quick pick for the
  // panel's scheme; that scheme's curves start once it is known.
  // (The stored plan, not the panel: new ranges may have clamped the panel's values.)
  const std::optional<planner::PlanSpec> previous = selected_;
  selected_.reset();
  if (user_chose_ && previous) {
    try {
      planner::check_plan(setup_->at(setup_->inputs.seq_len), *previous);
      selected_ = previous;
      set_panel(*previous);
    } catch (const InputError&) {
      user_chose_ = false;
    }
  }
  const auto& schemes = setup_->inputs.schemes;
  // The scheme whose quick pick becomes the selected plan: the panel's if it is compared, else the first compared.
  std::string pick = panel_spec().scheme;
  if (std::find(schemes.begin(), schemes.end(), pick) == schemes.end()) pick = schemes.front();
  std::int64_t low = 0, high = 0;
  for (const auto& scheme : schemes) {
    for (std::int64_t c : chunk_sweep(scheme, setup_->inputs.seq_len)) {
      low = low == 0 ? c : std::min(low, c);
      high = std::max(high, c);
    }
  }
  if (low == 0) low = 1024, high = 256 * 1024;
  chunk_chart_->reset(schemes, low, high);
  for (const auto& scheme : schemes) chunk_chart_->set_error_bar(scheme, error_bar_of(*setup_, scheme));
  memory_chart_->reset(schemes, memory_sweep_lengths(setup_->inputs.seq_len), setup_->cluster.node.gpu.hbm_bytes.value,
                       setup_->cluster.node.host_dram_bytes.value);
  start_estimate(pick);
  update_status();
}

// The simulations of a set of inputs, started once the estimate is drawn (so that it has every core until then):
// the selected plan (or the quick pick of `pick`'s scheme first) with its scheme's chart points, and the search.
// The other schemes' chart points start when the search has their best plans (show_ranked), the estimate's
// standing in for them until then: simulated before, they were simulated again with those plans, and the search
// waited for the cores they took.
void MainWindow::start_simulations(const std::string& pick) {
  if (!setup_) return;
  if (selected_) {
    start_chunk_chart(selected_->scheme);
    start_memory_chart(selected_->scheme);
    start_selected_plan();
  } else {
    pick_quick_plan(pick, false);
  }
  start_search();
  update_status();
}

// Every scheme's chart points but the selected plan's scheme (select_plan draws that one).
void MainWindow::start_other_charts() {
  if (!setup_) return;
  for (const auto& scheme : setup_->inputs.schemes) {
    if (selected_ && scheme == selected_->scheme) continue;
    start_chunk_chart(scheme);
    start_memory_chart(scheme);
  }
}

void MainWindow::pick_quick_plan(const std::string& scheme, bool by_user) {
  jobs_.restart("plan");
  auto setup = setup_;
  jobs_.submit<std::optional<planner::PlanSpec>>(
      "plan", 7, [setup, scheme] { return planner::quick_plan(setup->at(setup->inputs.seq_len), scheme, setup->inputs.hbm_headroom); },
      [this, scheme, by_user](std::optional<planner::PlanSpec> spec) {
        if (!spec) {
          show_error(QString::fromStdString(scheme + " has no valid configuration for these inputs"));
          return;
        }
        set_panel(*spec);
        select_plan(*spec, by_user);
      },
      [this](const std::string& e) { show_error(QString::fromStdString(e)); });
}

void MainWindow::update_panel_ranges() {
  const int gpus = setup_->cluster.gpus();
  const int layers = static_cast<int>(setup_->model.layers);
  param_panel_->set_ranges(gpus, layers);
  {
    const QSignalBlocker block(gpu_);
    gpu_->setRange(0, gpus - 1);
  }
  // Chunks: the planner's candidates for this length.
  const std::int64_t current = chunk_->currentData().toLongLong();
  const QSignalBlocker block(chunk_);
  chunk_->clear();
  for (std::int64_t c : planner::chunk_sizes(setup_->inputs.seq_len)) chunk_->addItem(tokens_text(c), QVariant::fromValue<qlonglong>(c));
  const int index = chunk_->findData(QVariant::fromValue<qlonglong>(current));
  chunk_->setCurrentIndex(index >= 0 ? index : chunk_->count() / 2);
}

// --- the selected plan -----------------------------------------------------------------------------------------

void MainWindow::show_param_group() {
  const std::string scheme = scheme_->currentText().toStdString();
  param_panel_->show_scheme(scheme);
  chunk_->setEnabled(has_chunk(scheme));
}

planner::PlanSpec MainWindow::panel_spec() const {
  planner::PlanSpec spec = param_panel_->spec(scheme_->currentText().toStdString());
  if (has_chunk(spec.scheme)) spec = with_chunk(spec, chunk_->currentData().toLongLong());
  return spec;
}

void MainWindow::set_panel(const planner::PlanSpec& spec) {
  {
    const QSignalBlocker block_scheme(scheme_), block_chunk(chunk_);
    scheme_->setCurrentText(QString::fromStdString(spec.scheme));
    const std::int64_t chunk = chunk_of(spec);
    if (chunk > 0) {
      int index = chunk_->findData(QVariant::fromValue<qlonglong>(chunk));
      if (index < 0) {
        chunk_->addItem(tokens_text(chunk), QVariant::fromValue<qlonglong>(chunk));
        index = chunk_->count() - 1;
      }
      chunk_->setCurrentIndex(index);
    }
  }
  param_panel_->set(spec);
  show_param_group();
}

void MainWindow::select_plan(const planner::PlanSpec& spec, bool by_user) {
  const std::string previous = selected_ ? selected_->scheme : "";
  selected_ = spec;
  user_chose_ = user_chose_ || by_user;
  // The user's choice settles what the error line said; a pick of the window's own (the quick pick, the search's
  // winner) arriving later must not wipe an error the user has not seen yet (a refused plan file).
  if (by_user) clear_error();
  // The curves that use the selected plan: its scheme's (and the previously selected scheme's, which goes back
  // to the planner's quick pick).
  for (const auto& scheme : {previous, spec.scheme}) {
    if (scheme.empty() || !setup_) continue;
    const auto& schemes = setup_->inputs.schemes;
    if (std::find(schemes.begin(), schemes.end(), scheme) == schemes.end()) continue;
    start_chunk_chart(scheme);
    start_memory_chart(scheme);
  }
  start_selected_plan();
}

void MainWindow::params_changed() {
  if (!setup_) return;
  const planner::PlanSpec spec = panel_spec();
  try {
    planner::check_plan(setup_->at(setup_->inputs.seq_len), spec);
  } catch (const InputError& e) {
    show_error(QString("selected plan: ") + e.what());
    return;
  }
  select_plan(spec, true);
}

void MainWindow::scheme_changed() {
  show_param_group();
  if (!setup_) return;
  // A new scheme starts from the planner's quick pick for it.
  clear_error();
  user_chose_ = true;  // now, so a search ending before the pick does not replace the user's scheme
  pick_quick_plan(scheme_->currentText().toStdString(), true);
}

void MainWindow::row_selected() {
  const auto rows = table_->selectionModel()->selectedRows();
  if (rows.isEmpty()) return;
  const auto row = static_cast<std::size_t>(rows.front().row());
  if (row < ranked_.size()) {
    set_panel(ranked_[row].spec);
    select_plan(ranked_[row].spec, true);
  } else if (ranked_.empty() && row < provisional_.size()) {
    set_panel(provisional_[row].spec);
    select_plan(provisional_[row].spec, true);
  }
}

// --- work ------------------------------------------------------------------------------------------------------

void MainWindow::start_chunk_chart(const std::string& scheme) {
  const std::string channel = chart_channel("chunk", scheme);
  const auto cancel = jobs_.restart(channel);
  chunk_chart_->clear_scheme(scheme);
  show_estimates(chunk_chart_, chart_estimates_.chunk, scheme);
  if (!setup_) return;
  auto setup = setup_;
  const auto preferred = preferred_plans();
  jobs_.submit<std::optional<planner::PlanSpec>>(
      channel, 5, [setup, scheme, preferred] { return chart_plan(setup->at(setup->inputs.seq_len), scheme, preferred, setup->inputs.hbm_headroom); },
      [this, setup, scheme, channel, cancel](std::optional<planner::PlanSpec> spec) {
        if (!spec) return;
        const double headroom = setup->inputs.hbm_headroom;
        const auto points = chunk_points(*spec, setup->inputs.seq_len);
        // Longest chunks first: the fewest tasks, so the first points come soonest.
        for (auto it = points.rbegin(); it != points.rend(); ++it) {
          const auto& [c, point] = *it;
          jobs_.submit<Point>(
              channel, 4,
              [setup, point, headroom, c, cancel] { return simulate_point(setup->at(setup->inputs.seq_len), point, headroom, c, cancel.get()); },
              [this](Point p) {
                chunk_chart_->add_point(p);
                emit chart_updated(1);
              },
              [](const std::string&) {});
        }
      },
      [this, scheme](const std::string& e) { show_error(QString::fromStdString(scheme + ": " + e)); });
}

void MainWindow::start_memory_chart(const std::string& scheme) {
  const std::string channel = chart_channel("memory", scheme);
  const auto cancel = jobs_.restart(channel);
  memory_chart_->clear_scheme(scheme);
  show_estimates(memory_chart_, chart_estimates_.memory, scheme);
  if (!setup_) return;
  auto setup = setup_;
  const auto preferred = preferred_plans();
  for (std::int64_t length : memory_sweep_lengths(setup->inputs.seq_len)) {
    jobs_.submit<Point>(
        channel, 3,
        [setup, scheme, preferred, length, cancel] {
          const planner::StepInputs in = setup->at(length);
          const auto spec = chart_plan(in, scheme, preferred, setup->inputs.hbm_headroom);
          if (!spec) {
            Point p;
            p.scheme = scheme;
            p.x = length;
            p.skipped = "no valid configuration";
            return p;
          }
          return simulate_point(in, *spec, setup->inputs.hbm_headroom, length, cancel.get());
        },
        [this](Point p) {
          memory_chart_->add_point(p);
          emit chart_updated(2);
        },
        [](const std::string&) {});
  }
}

void MainWindow::start_selected_plan() {
  const auto cancel = jobs_.restart("plan");
  if (!setup_ || !selected_) return;
  auto setup = setup_;
  const planner::PlanSpec spec = *selected_;
  plan_label_->setText(QString::fromStdString("simulating " + spec.scheme + " (" + spec.summary() + ")..."));
  jobs_.submit<std::shared_ptr<const PlanDetail>>(
      "plan", 6, [setup, spec, cancel] { return std::make_shared<const PlanDetail>(simulate_plan_detail(setup, spec, cancel.get())); },
      [this](std::shared_ptr<const PlanDetail> d) {
        drop_detail();
        detail_ = std::move(d);
        show_detail();
      },
      [this](const std::string& e) {
        plan_label_->setText("no plan shown");
        show_error(QString("selected plan: ") + QString::fromStdString(e));
      });
}

void MainWindow::drop_detail() {
  // The view holds parts of the plan too: let go of them first, so the last reference is freed on a worker.
  timeline_->clear();
  step_memory_chart_->clear();
  if (detail_) jobs_.dispose(std::move(detail_));
  detail_.reset();
}

void MainWindow::show_detail() {
  if (!detail_) return;
  const auto& d = *detail_;
  const int gpu = std::clamp(gpu_->value(), 0, d.result->gpus - 1);
  step_memory_chart_->show_plan(d, gpu);
  timeline_->set_predicted(d.timeline, d.rows, d.result);
  timeline_->set_device(gpu);
  show_comparison();
  const auto& m = d.metrics;
  QString text = QString::fromStdString(d.spec.scheme + " (" + d.spec.summary() + "): ");
  if (m.fits) {
    text += QString("step %1 s, MFU %2%, peak HBM %3, peak DRAM %4, bottleneck %5")
                .arg(m.step_s, 0, 'g', 4)
                .arg(100 * m.mfu, 0, 'f', 1)
                .arg(QString::fromStdString(format_bytes(static_cast<double>(m.peak_hbm_bytes))))
                .arg(QString::fromStdString(format_bytes(static_cast<double>(m.peak_dram_bytes))))
                .arg(QString::fromStdString(m.bottleneck));
    if (setup_) text += QString::fromStdString("; " + error_bar_of(*setup_, d.spec.scheme).text());
  } else {
    text += "does not fit: " + QString::fromStdString(m.failure);
  }
  plan_label_->setText(text);
  emit chart_updated(3);
}

// The estimate's ranking of the same candidates (planner/analytic.hpp), and charts 1 and 2 from the estimate for
// the panel's plan and the estimate's best of each scheme, before any simulation starts (start_simulations): drawn
// as provisional until the simulated ranking and points land.
struct MainWindow::Estimated {
  std::vector<planner::EstimatedPlan> top;
  ChartEstimates charts;
};

void MainWindow::start_estimate(const std::string& pick) {
  jobs_.restart("estimate");
  auto setup = setup_;
  std::vector<planner::PlanSpec> preferred;
  if (selected_) preferred.push_back(*selected_);
  jobs_.submit<Estimated>(
      "estimate", 10,
      [setup, preferred]() mutable {
        planner::SearchOptions options;
        options.schemes = setup->inputs.schemes;
        options.objective = setup->inputs.objective;
        options.hbm_headroom = setup->inputs.hbm_headroom;
        Estimated out;
        out.top = planner::rank_by_estimate(setup->at(setup->inputs.seq_len), options);
        std::set<std::string> seen;  // the ranking is best first: each scheme's first is its best
        for (const auto& plan : out.top) {
          if (seen.insert(plan.spec.scheme).second) preferred.push_back(plan.spec);
        }
        if (out.top.size() > 10) out.top.resize(10);
        out.charts = estimate_charts(*setup, preferred);
        return out;
      },
      [this, pick](Estimated e) {
        start_simulations(pick);
        // Only while the simulated ranking of these inputs is still to come (it never gives way to the estimate).
        if (jobs_.pending("search") > 0) show_provisional(e.top);
        chart_estimates_ = std::move(e.charts);
        for (const Point& p : chart_estimates_.chunk) chunk_chart_->add_point(p);
        for (const Point& p : chart_estimates_.memory) memory_chart_->add_point(p);
        emit chart_updated(7);
      },
      [this, pick](const std::string& e) {
        start_simulations(pick);
        show_error(QString("estimate: ") + QString::fromStdString(e));
      });
}

void MainWindow::start_search() {
  auto cancel = jobs_.restart("search");
  search_progress_.clear();
  if (!setup_) return;
  auto setup = setup_;
  search_progress_ = "search: starting";
  jobs_.submit<planner::SearchReport>(
      "search", 0,
      [this, setup, cancel] {
        planner::SearchOptions options;
        options.schemes = setup->inputs.schemes;
        options.objective = setup->inputs.objective;
        options.hbm_headroom = setup->inputs.hbm_headroom;
        options.top = 10;
        // Every core: only the selected plan and its scheme's chart points run beside it (start_simulations).
        options.threads = std::max(1, QThread::idealThreadCount());
        options.cancel = cancel.get();
        options.memory_gate = &graph_memory_gate();  // with the chart points: one budget for the window
        // Posted to the window (events to a destroyed window are dropped; the runner stops the search first).
        options.progress = [this, cancel](std::size_t done, std::size_t total) {
          QMetaObject::invokeMethod(
              this,
              [this, cancel, done, total] {
                if (cancel->load()) return;
                search_progress_ = QString("search: %1/%2 plans simulated").arg(done).arg(total) +
                                   (provisional_.empty() ? "" : "; table ranked by the estimate (provisional)");
                update_status();
              },
              Qt::QueuedConnection);
        };
        return planner::search(setup->at(setup->inputs.seq_len), options);
      },
      [this](planner::SearchReport report) {
        search_progress_.clear();
        show_ranked(report);
      },
      [this](const std::string& e) {
        search_progress_.clear();
        show_error(QString("search: ") + QString::fromStdString(e));
        start_other_charts();  // with the quick picks, as without a search
      });
}

std::vector<planner::PlanSpec> MainWindow::preferred_plans() const {
  std::vector<planner::PlanSpec> out;
  if (selected_) out.push_back(*selected_);
  out.insert(out.end(), best_of_scheme_.begin(), best_of_scheme_.end());
  return out;
}

void MainWindow::fill_table_row(int row, const QStringList& cells, const QString& tooltip) {
  for (int c = 0; c < cells.size(); ++c) {
    auto* item = new QTableWidgetItem(cells[c]);
    item->setToolTip(tooltip.isEmpty() ? cells[c] : cells[c] + "\n" + tooltip);
    table_->setItem(row, c, item);
  }
}

void MainWindow::show_provisional(const std::vector<planner::EstimatedPlan>& plans) {
  if (!setup_) return;
  ranked_.clear();
  provisional_ = plans;
  const auto tokens = static_cast<double>(setup_->at(setup_->inputs.seq_len).workload.tokens());
  const QSignalBlocker block(table_);
  table_->setRowCount(static_cast<int>(plans.size()));
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const planner::StepEstimate& e = plans[i].estimate;
    const QStringList cells{"~" + QString::number(i + 1),
                            QString::fromStdString(plans[i].spec.scheme),
                            "~" + QString::number(e.step_s, 'g', 4) + " s (est.)",
                            "~" + QString::number(std::round(tokens / e.step_s), 'f', 0),
                            "~" + QString::number(100 * e.mfu, 'f', 1) + "%",
                            "~" + QString::fromStdString(format_bytes(e.hbm_bytes)),
                            "~" + QString::fromStdString(format_bytes(e.dram_bytes)),
                            "estimate",
                            "",
                            QString::fromStdString(plans[i].spec.summary())};
    fill_table_row(static_cast<int>(i), cells, "ESTIMATE (provisional): the analytic estimate, before the simulator confirms");
  }
  search_progress_ = "search: table ranked by the estimate (provisional), the simulator confirming";
  update_status();
  emit chart_updated(6);
}

void MainWindow::show_ranked(const planner::SearchReport& report) {
  ranked_ = report.ranked;
  provisional_.clear();
  // The charts redraw each scheme with its best plan instead of the bounds' quick pick.
  best_of_scheme_.clear();
  for (const auto& best : report.best_of_scheme) best_of_scheme_.push_back(best.spec);
  start_other_charts();  // the selected plan's scheme is drawn with it (select_plan below redraws it if it changes)
  if (ranked_.size() > 10) ranked_.resize(10);
  const QSignalBlocker block(table_);
  table_->setRowCount(static_cast<int>(ranked_.size()));
  for (std::size_t i = 0; i < ranked_.size(); ++i) {
    const auto& p = ranked_[i];
    const auto& m = p.metrics;
    const QStringList cells{QString::number(i + 1),
                            QString::fromStdString(p.spec.scheme),
                            QString::number(m.step_s, 'g', 4) + " s",
                            QString::number(std::round(m.tokens_per_s), 'f', 0),
                            QString::number(100 * m.mfu, 'f', 1) + "%",
                            QString::fromStdString(format_bytes(static_cast<double>(m.peak_hbm_bytes))),
                            QString::fromStdString(format_bytes(static_cast<double>(m.peak_dram_bytes))),
                            QString::fromStdString(m.bottleneck),
                            QString::fromStdString(error_bar_of(*setup_, p.spec.scheme).short_text()),
                            QString::fromStdString(p.spec.summary())};
    fill_table_row(static_cast<int>(i), cells, "");
  }
  table_->resizeColumnsToContents();  // every cell in full; the view scrolls sideways where the plans are long
  fit_table_width();
  emit chart_updated(5);
  if (ranked_.empty()) {
    const QString why = report.closest_miss ? QString::fromStdString(report.closest_miss->spec.scheme + ": " + report.closest_miss->metrics.failure)
                                            : QString("no scheme has a valid configuration");
    show_error("no plan fits these inputs; closest: " + why);
    return;
  }
  // Until the user picks a plan, the search's winner is the one charts 3 and 4 show.
  if (!user_chose_) {
    set_panel(ranked_.front().spec);
    select_plan(ranked_.front().spec, false);
    table_->selectRow(0);
  }
}

void MainWindow::fit_table_width() {
  if (table_width_fitted_ || table_->rowCount() == 0 || !middle_->isVisible()) return;
  // Once, when the first ranking arrives (later the user's splitter position stands): the table gets the width
  // of its figures' columns (all but the plan) and half of what is left goes to chart 3.
  int figures = table_->verticalScrollBar()->sizeHint().width() + 2 * table_->frameWidth();
  for (int c = 0; c + 1 < table_->columnCount(); ++c) figures += table_->columnWidth(c);
  const int total = middle_->width();
  if (total <= 0) return;
  const int width = std::min(total * 2 / 3, figures + (total - figures) / 2);
  middle_->setSizes({total - width, width});
  table_width_fitted_ = true;
}

// --- files -----------------------------------------------------------------------------------------------------

bool MainWindow::open_plan(const QString& path) {
  try {
    const planner::PlanFile plan = planner::read_plan_file(path.toStdString());
    WhatIfInputs in = setup_ ? setup_->inputs : WhatIfInputs{};
    in.model = plan.model;
    in.hw = plan.hw;
    in.nodes = plan.nodes;
    in.stack = plan.stack;
    in.seq_len = plan.workload.seq_len;
    in.tokens_per_step = plan.workload.global_batch > 1 ? plan.workload.tokens() : 0;
    if (std::find(in.schemes.begin(), in.schemes.end(), plan.spec.scheme) == in.schemes.end()) in.schemes.push_back(plan.spec.scheme);
    check_sequence_control_length(in.seq_len, path.toStdString(), "workload.seq_len", std::to_string(in.seq_len));
    set_inputs(in);
    set_panel(plan.spec);
    recompute_now();
    if (!setup_) return false;  // the plan's model or hardware did not load: recompute_all shows why
    set_panel(plan.spec);
    select_plan(plan.spec, true);
    return true;
  } catch (const std::exception& e) {
    show_error(e.what());
    return false;
  }
}

bool MainWindow::save_plan(const QString& path) {
  try {
    if (!setup_ || !selected_) throw InputError(path.toStdString(), "plan", "a selected plan to save", "none");
    const planner::PlanMetrics* predicted = detail_ && detail_->spec.summary() == selected_->summary() ? &detail_->metrics : nullptr;
    const planner::PlanFile file = plan_file(*setup_, *selected_, predicted);
    write_file_atomically(path.toStdString(), [&](std::ostream& out) { out << planner::plan_file_json(file).dump(2) << "\n"; });
    statusBar()->showMessage("plan written to " + path, 5000);
    return true;
  } catch (const std::exception& e) {
    show_error(e.what());
    return false;
  }
}

bool MainWindow::save_trace(const QString& path) {
  try {
    if (!detail_) throw InputError(path.toStdString(), "trace", "a simulated plan to save", "none yet");
    const auto& d = *detail_;
    write_file_atomically(path.toStdString(), [&](std::ostream& out) { sim::write_chrome_trace(out, *d.result, *d.graph, d.setup->cluster); });
    statusBar()->showMessage("trace written to " + path, 5000);
    return true;
  } catch (const std::exception& e) {
    show_error(e.what());
    return false;
  }
}

bool MainWindow::open_measured(const QString& path) {
  try {
    auto trace = std::make_shared<const MeasuredTrace>(read_measured_trace(path.toStdString()));
    if (detail_) {
      const std::string why = measured_mismatch(*detail_->timeline, *trace);
      if (!why.empty()) throw InputError(why);
    }
    measured_rows_ = std::make_shared<const TimelineRows>(index_timeline(trace->timeline));
    measured_ = std::move(trace);
    show_comparison();
    return true;
  } catch (const std::exception& e) {
    show_error(e.what());
    return false;
  }
}

bool MainWindow::save_chart(QWidget* chart, const QString& path) {
  try {
    const bool svg = path.endsWith(".svg", Qt::CaseInsensitive);
    if (!svg && !path.endsWith(".png", Qt::CaseInsensitive)) throw InputError(path.toStdString() + ": expected a file name ending in .png or .svg");
    // Rendered in memory, then written by the project's one atomic writer (temporary, fsync, rename).
    QByteArray bytes;
    QBuffer buffer(&bytes);
    buffer.open(QIODevice::WriteOnly);
    bool rendered = false;
    if (svg) {
      QSvgGenerator generator;
      generator.setOutputDevice(&buffer);
      generator.setSize(chart->size());
      generator.setViewBox(QRect(QPoint(0, 0), chart->size()));
      generator.setTitle("trainyard");
      QPainter painter;
      if (painter.begin(&generator)) {
        chart->render(&painter);
        rendered = painter.end();
      }
    } else {
      rendered = chart->grab().save(&buffer, "PNG");
    }
    if (!rendered) throw InputError(path.toStdString() + ": the chart could not be rendered");
    write_file_atomically(path.toStdString(), std::string_view(bytes.constData(), static_cast<std::size_t>(bytes.size())));
    return true;
  } catch (const std::exception& e) {
    show_error(e.what());
    return false;
  }
}

void MainWindow::show_comparison() {
  if (!measured_) return;
  if (!detail_) {
    compare_->setPlainText("No simulated plan to compare with yet.");
    return;
  }
  // Another plan's trace is neither laid over the timeline nor compared: its numbers would mislead.
  const std::string mismatch = measured_mismatch(*detail_->timeline, *measured_);
  if (!mismatch.empty()) {
    timeline_->set_measured(nullptr, nullptr);
    compare_->setPlainText(QString::fromStdString("The measured trace is not shown: " + mismatch));
    return;
  }
  timeline_->set_measured(std::shared_ptr<const sim::Timeline>(measured_, &measured_->timeline), measured_rows_);
  try {
    const sim::Comparison c = sim::compare(*detail_->timeline, measured_->timeline);
    std::ostringstream text;
    sim::print_comparison(text, c);
    compare_->setPlainText(QString::fromStdString(text.str()));
  } catch (const std::exception& e) {
    compare_->setPlainText(QString("The measured trace is not of the selected plan: ") + e.what());
  }
}

// --- messages --------------------------------------------------------------------------------------------------

void MainWindow::show_error(const QString& text) {
  error_->setText(text);
  error_->show();
}

void MainWindow::clear_error() {
  error_->clear();
  error_->hide();
}

QString MainWindow::error_text() const { return error_->isHidden() ? QString() : error_->text(); }

void MainWindow::update_status() {
  if (jobs_.pending() == 0) {
    status_->setText("ready");
    return;
  }
  QStringList parts;
  const int chunk = jobs_.pending("chunk/"), memory = jobs_.pending("memory/");
  if (chunk > 0) parts << QString("chart 1: %1 points to simulate").arg(chunk);
  if (memory > 0) parts << QString("chart 2: %1 points").arg(memory);
  if (jobs_.pending("plan") > 0) parts << "simulating the selected plan";
  if (jobs_.pending("search") > 0) parts << (search_progress_.isEmpty() ? QString("search running") : search_progress_);
  status_->setText(parts.join("; "));
}

}  // namespace trainyard::gui
