#include "gui/param_panel.hpp"

#include <QComboBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QVBoxLayout>
#include <algorithm>
#include <climits>
#include <memory>

#include "common/units.hpp"

namespace trainyard::gui {

namespace {

bool shown(const planner::Param& p) { return p.in_panel && p.kind != planner::Param::Kind::tokens && p.kind != planner::Param::Kind::custom; }

int clamp_int(std::int64_t v) { return static_cast<int>(std::clamp<std::int64_t>(v, INT_MIN, INT_MAX)); }

}  // namespace

ParamPanel::ParamPanel(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  for (const auto& name : planner::scheme_names()) {
    const planner::Scheme& scheme = planner::scheme_named(name);
    auto* box = new QGroupBox(QString::fromStdString(name));
    box->setToolTip(QString::fromStdString(scheme.description));
    auto* form = new QFormLayout(box);
    for (const planner::Param& p : scheme.params) {
      if (!shown(p)) continue;
      Control c = make_control(p);
      if (p.kind == planner::Param::Kind::boolean) {
        form->addRow(c.widget);
      } else {
        form->addRow(QString::fromStdString(p.label), c.widget);
      }
      controls_[name].push_back(std::move(c));
    }
    boxes_[name] = box;
    layout->addWidget(box);
  }
}

ParamPanel::Control ParamPanel::make_control(const planner::Param& p) {
  using Kind = planner::Param::Kind;
  Control c{&p, nullptr, {}};
  switch (p.kind) {
    case Kind::integer: {
      auto* spin = new QSpinBox();
      spin->setRange(clamp_int(p.min), clamp_int(p.max));
      connect(spin, &QSpinBox::valueChanged, this, &ParamPanel::changed);
      c.widget = spin;
      break;
    }
    case Kind::boolean: {
      auto* check = new QCheckBox(QString::fromStdString(p.label));
      connect(check, &QCheckBox::toggled, this, &ParamPanel::changed);
      c.widget = check;
      break;
    }
    case Kind::choice: {
      auto* combo = new QComboBox();
      for (const auto& choice : p.choices) combo->addItem(QString::fromStdString(choice));
      connect(combo, &QComboBox::currentIndexChanged, this, &ParamPanel::changed);
      c.widget = combo;
      break;
    }
    case Kind::set: {
      auto* row = new QWidget();
      auto* items = new QHBoxLayout(row);
      items->setContentsMargins(0, 0, 0, 0);
      for (const auto& choice : p.choices) {
        auto* check = new QCheckBox(QString::fromStdString(choice));
        connect(check, &QCheckBox::toggled, this, &ParamPanel::changed);
        items->addWidget(check);
        c.items.push_back(check);
      }
      c.widget = row;
      break;
    }
    case Kind::tokens:
    case Kind::custom: break;  // not shown (see shown())
  }
  return c;
}

nlohmann::json ParamPanel::value(const Control& c) const {
  using Kind = planner::Param::Kind;
  switch (c.param->kind) {
    case Kind::integer: return static_cast<QSpinBox*>(c.widget)->value();
    case Kind::boolean: return static_cast<QCheckBox*>(c.widget)->isChecked();
    case Kind::choice: return static_cast<QComboBox*>(c.widget)->currentText().toStdString();
    case Kind::set: {
      std::string list;
      for (std::size_t i = 0; i < c.items.size(); ++i) {
        if (c.items[i]->isChecked()) list += (list.empty() ? "" : ",") + c.param->choices[i];
      }
      return list.empty() ? "none" : list;
    }
    case Kind::tokens:
    case Kind::custom: break;
  }
  return nullptr;
}

void ParamPanel::show_value(const Control& c, const nlohmann::json& v) {
  using Kind = planner::Param::Kind;
  switch (c.param->kind) {
    case Kind::integer: static_cast<QSpinBox*>(c.widget)->setValue(clamp_int(v.get<std::int64_t>())); break;
    case Kind::boolean: static_cast<QCheckBox*>(c.widget)->setChecked(v.get<bool>()); break;
    case Kind::choice: static_cast<QComboBox*>(c.widget)->setCurrentText(QString::fromStdString(v.get<std::string>())); break;
    case Kind::set: {
      const auto on = split_commas(v.get<std::string>());
      for (std::size_t i = 0; i < c.items.size(); ++i) {
        c.items[i]->setChecked(std::find(on.begin(), on.end(), c.param->choices[i]) != on.end());
      }
      break;
    }
    case Kind::tokens:
    case Kind::custom: break;
  }
}

void ParamPanel::show_scheme(const std::string& scheme) {
  for (auto& [name, box] : boxes_) box->setVisible(name == scheme);
}

planner::PlanSpec ParamPanel::spec(const std::string& scheme) const {
  const auto it = controls_.find(scheme);
  if (it == controls_.end()) return planner::PlanSpec{scheme, {}};  // no such scheme: nothing to set (the caller refuses it)
  planner::PlanSpec out = planner::scheme_named(scheme).blank();
  for (const Control& c : it->second) c.param->set(out, value(c));
  return out;
}

void ParamPanel::set(const planner::PlanSpec& spec) {
  const auto it = controls_.find(spec.scheme);
  if (it == controls_.end()) return;
  for (const Control& c : it->second) {
    std::vector<std::unique_ptr<QSignalBlocker>> blocks;
    blocks.push_back(std::make_unique<QSignalBlocker>(c.widget));
    for (QCheckBox* item : c.items) blocks.push_back(std::make_unique<QSignalBlocker>(item));
    show_value(c, c.param->get(spec));
  }
}

void ParamPanel::set_ranges(int gpus, int layers) {
  using Bound = planner::Param::Bound;
  for (auto& [name, controls] : controls_) {
    for (const Control& c : controls) {
      if (c.param->kind != planner::Param::Kind::integer || c.param->gui_max == Bound::fixed) continue;
      const int high = std::max(clamp_int(c.param->min), c.param->gui_max == Bound::gpus ? gpus : std::max(1, layers));
      auto* spin = static_cast<QSpinBox*>(c.widget);
      const QSignalBlocker block(spin);
      spin->setRange(clamp_int(c.param->min), high);
    }
  }
}

}  // namespace trainyard::gui
