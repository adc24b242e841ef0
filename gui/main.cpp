// trainyard-gui: the what-if planner. The same inputs as `trainyard plan`; --screenshot renders the window
// offscreen once every chart is complete, writes a PNG and exits.
#include <QApplication>

#include <boost/program_options.hpp>

#include <iostream>
#include <memory>

#include "common/error.hpp"
#include "common/units.hpp"
#include "gui/main_window.hpp"
#include "planner/schemes/scheme.hpp"
#include "stacks/stack_profile.hpp"

namespace po = boost::program_options;

namespace {

trainyard::gui::WhatIfInputs inputs_from(const po::variables_map& vm) {
  using trainyard::InputError;
  trainyard::gui::WhatIfInputs in;
  in.model = vm["model"].as<std::string>();
  in.hw = vm["hw"].as<std::string>();
  in.nodes = vm["nodes"].as<int>();
  in.stack = vm["stack"].as<std::string>();
  in.seq_len = trainyard::parse_token_count(vm["seq"].as<std::string>(), "--seq");
  trainyard::gui::check_sequence_control_length(in.seq_len, "--seq", "value", vm["seq"].as<std::string>());
  if (vm.count("tokens-per-step")) in.tokens_per_step = trainyard::parse_token_count(vm["tokens-per-step"].as<std::string>(), "--tokens-per-step");
  if (vm.count("global-batch")) {
    const auto batch = vm["global-batch"].as<std::int64_t>();
    if (batch < 1) throw InputError("--global-batch", "value", "a positive integer", std::to_string(batch));
    in.tokens_per_step = batch > 1 ? batch * in.seq_len : 0;
  }
  in.schemes = trainyard::planner::schemes_from_list(vm["strategies"].as<std::string>());
  const std::string objective = vm["objective"].as<std::string>();
  if (objective != "throughput" && objective != "min-hbm") throw InputError("--objective", "value", "throughput or min-hbm", "\"" + objective + "\"");
  in.objective = trainyard::planner::parse_objective(objective);
  in.hbm_headroom = vm["hbm-headroom"].as<double>();
  return in;
}

po::options_description gui_options() {
  po::options_description options("trainyard-gui options");
  // clang-format off
  options.add_options()
      ("help", "this help")
      ("model", po::value<std::string>()->default_value("llama3-8b")->value_name("name|path|custom:..."), "model")
      ("hw", po::value<std::string>()->default_value("dgx-a100")->value_name("name|path"), "node profile")
      ("nodes", po::value<int>()->default_value(1)->value_name("int"), "number of nodes")
      ("stack", po::value<std::string>()->default_value("megatron-lm")->value_name("name|path"), trainyard::stacks::kStackFlagHelp)
      ("seq", po::value<std::string>()->default_value("1M")->value_name("tokens"), "sequence length (a power of two, 4K..16M)")
      ("global-batch", po::value<std::int64_t>()->value_name("int"), "sequences per optimizer step")
      ("tokens-per-step", po::value<std::string>()->value_name("tokens"), "tokens per optimizer step (instead of --global-batch)")
      ("strategies", po::value<std::string>()->default_value("all")->value_name("list"), "all, or a comma list of schemes to compare")
      ("objective", po::value<std::string>()->default_value("throughput")->value_name("throughput|min-hbm"), "what the ranked table sorts by")
      ("hbm-headroom", po::value<double>()->default_value(0.05)->value_name("fraction"), "fraction of each GPU's HBM kept free")
      ("plan", po::value<std::string>()->value_name("path"), "open a plan file (trainyard plan --out) as the selected plan")
      ("measured", po::value<std::string>()->value_name("path"), "lay a measured trace (trainyard run --trace) over the timeline")
      ("screenshot", po::value<std::string>()->value_name("out.png"), "render the window offscreen once complete, write a PNG, exit")
      ("width", po::value<int>()->default_value(1600)->value_name("px"), "window width")
      ("height", po::value<int>()->default_value(1000)->value_name("px"), "window height")
      ("timeout", po::value<int>()->default_value(600)->value_name("s"), "--screenshot: the longest wait for the charts");
  // clang-format on
  return options;
}

// --measured without --screenshot: opened once the selected plan is simulated (nothing pending), so the overlay has
// a prediction to compare with.
void open_measured_when_simulated(trainyard::gui::MainWindow& window, const QString& measured) {
  auto opened = std::make_shared<bool>(false);
  QObject::connect(&window.jobs(), &trainyard::gui::JobRunner::pending_changed, &window, [&window, measured, opened](int pending) {
    if (pending > 0 || *opened) return;
    *opened = true;
    window.open_measured(measured);
  });
}

// --screenshot: once every chart is complete, the window as a PNG; exit 1 when it is not or the window shows an error.
int take_screenshot(const po::variables_map& vm, trainyard::gui::MainWindow& window) {
  if (!window.jobs().wait_idle(vm["timeout"].as<int>() * 1000)) {
    std::cerr << "error: --screenshot: the charts were not complete after --timeout " << vm["timeout"].as<int>() << " s\n";
    return 1;
  }
  if (vm.count("measured")) window.open_measured(QString::fromStdString(vm["measured"].as<std::string>()));
  QApplication::processEvents();
  const QString path = QString::fromStdString(vm["screenshot"].as<std::string>());
  if (!window.save_chart(&window, path)) {
    std::cerr << "error: " << window.error_text().toStdString() << "\n";
    return 1;
  }
  std::cout << "wrote " << path.toStdString() << "\n";
  if (!window.error_text().isEmpty()) {
    std::cerr << "error shown in the window: " << window.error_text().toStdString() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const po::options_description options = gui_options();
  po::variables_map vm;
  trainyard::gui::WhatIfInputs inputs;
  try {
    po::store(po::command_line_parser(argc, argv).options(options).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << "usage: trainyard-gui [--model M] [--hw NODE] [--nodes N] [--stack S] [--seq S] [--global-batch B | --tokens-per-step T]\n"
                   "       [--strategies all|LIST] [--objective throughput|min-hbm] [--plan plan.json] [--measured trace.json]\n"
                   "       [--screenshot out.png]\n\n"
                << options;
      return 0;
    }
    if (vm.count("global-batch") && vm.count("tokens-per-step")) {
      throw trainyard::InputError("--global-batch/--tokens-per-step", "value", "at most one of them", "both");
    }
    inputs = inputs_from(vm);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  const bool screenshot = vm.count("screenshot") > 0;
  if (screenshot && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  trainyard::gui::MainWindow window(inputs);
  window.resize(vm["width"].as<int>(), vm["height"].as<int>());
  // A plan the window cannot open is refused like a bad flag, not left for the user to discover.
  if (vm.count("plan") && !window.open_plan(QString::fromStdString(vm["plan"].as<std::string>()))) {
    std::cerr << "error: --plan: " << window.error_text().toStdString() << "\n";
    return 2;
  }
  window.show();
  if (screenshot) return take_screenshot(vm, window);
  if (vm.count("measured")) open_measured_when_simulated(window, QString::fromStdString(vm["measured"].as<std::string>()));
  return QApplication::exec();
}
