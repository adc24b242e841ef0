#pragma once
// The selected plan's parameters: one group of controls per registered scheme, generated from its parameter
// descriptions (planner::Param in planner/schemes/scheme.hpp), so a new scheme or parameter needs no GUI code.
// Only the current scheme's group is shown. Chunks have the window's shared chunk control (chart 1 sweeps it).
#include <QCheckBox>
#include <QGroupBox>
#include <QWidget>
#include <map>
#include <string>
#include <vector>

#include "planner/schemes/scheme.hpp"

namespace trainyard::gui {

class ParamPanel : public QWidget {
  Q_OBJECT

 public:
  explicit ParamPanel(QWidget* parent = nullptr);
  void show_scheme(const std::string& scheme);
  // `scheme`'s parameters as the controls say; what the panel does not show keeps PlanSpec's defaults.
  planner::PlanSpec spec(const std::string& scheme) const;
  // Sets `spec.scheme`'s controls to `spec` without emitting changed().
  void set(const planner::PlanSpec& spec);
  // Upper bounds of the parameters bounded by the cluster's GPUs or the model's layers.
  void set_ranges(int gpus, int layers);

 signals:
  void changed();

 private:
  struct Control {
    const planner::Param* param;
    QWidget* widget;                // QSpinBox, QCheckBox or QComboBox; for a set, the box holding `items`
    std::vector<QCheckBox*> items;  // a set's choices, in order
  };
  Control make_control(const planner::Param& p);
  nlohmann::json value(const Control& c) const;
  void show_value(const Control& c, const nlohmann::json& v);

  std::map<std::string, QGroupBox*> boxes_;
  std::map<std::string, std::vector<Control>> controls_;
};

}  // namespace trainyard::gui
