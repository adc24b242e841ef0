// `trainyard compare predicted.json measured`: the simulator's timeline against a measured one: the executor's
// (trainyard run --trace: matched task by task), or an engine's PyTorch profiler traces (a file, or a directory of
// one per rank, plain or gzip), or Nsight Systems SQLite exports (a file or a directory of one per rank): compared per
// class, per stream kind and per step (traces/engine_compare.hpp).
#include <iostream>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "sim/compare.hpp"
#include "traces/engine_compare.hpp"
#include "traces/kineto.hpp"
#include "traces/nsys.hpp"

namespace po = boost::program_options;

namespace trainyard::app {

int run_compare(const std::vector<std::string>& args) {
  po::options_description options("compare options");
  // clang-format off
  options.add_options()
      ("predicted", po::value<std::string>()->value_name("path"), "the simulated timeline (trainyard simulate --trace)")
      ("measured", po::value<std::string>()->value_name("path"),
       "the measured timeline: trainyard run --trace, an engine's PyTorch profiler trace (a file or a directory of one per rank, .json or .json.gz), "
       "or an Nsight Systems SQLite export (nsys export --type sqlite: a file or a directory of one per rank, .sqlite)")
      ("kernel-classes", po::value<std::string>()->value_name("path"),
       "with an engine's trace: more kernel-name rules, tried before the built-in ones (traces/kernel_classes.json's format)")
      ("json", po::bool_switch(), "print JSON instead of text");
  // clang-format on
  po::positional_options_description positional;
  positional.add("predicted", 1).add("measured", 1);
  po::variables_map vm;
  if (parse(args, "trainyard compare PREDICTED.json MEASURED [--kernel-classes FILE] [--json]", options, positional, vm)) return 0;
  if (!vm.count("predicted") || !vm.count("measured")) {
    throw InputError("compare", "arguments", "two timelines: PREDICTED.json MEASURED", vm.count("predicted") ? "one" : "none");
  }
  const auto predicted = sim::read_timeline(vm["predicted"].as<std::string>());
  const std::string measured_path = vm["measured"].as<std::string>();
  const bool as_json = vm["json"].as<bool>();
  const bool nsys = traces::looks_like_sqlite(measured_path);  // first: looks_like_kineto takes any directory
  if (nsys || traces::looks_like_kineto(measured_path)) {
    const traces::KernelClassifier classes(vm.count("kernel-classes") ? vm["kernel-classes"].as<std::string>() : "");
    const auto c = nsys
                       ? traces::compare_with_engine(predicted, traces::read_each(traces::nsys_files(measured_path), traces::read_nsys_file), classes)
                       : traces::compare_with_engine(predicted, traces::read_each(traces::kineto_files(measured_path), traces::read_kineto_file),
                                                     classes);
    if (as_json) {
      // Kernel names from an Nsight export are raw bytes, not always UTF-8: replaced, never an abort.
      std::cout << traces::engine_comparison_json(c).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::cout << c.predicted_origin << " (simulated) against " << c.measured_origin << " (an engine's profiler trace)\n";
      traces::print_engine_comparison(std::cout, c);
    }
    return 0;
  }
  if (vm.count("kernel-classes"))
    throw InputError("--kernel-classes", "value", "an engine's profiler trace to compare with", "trainyard's own timeline");
  const auto measured = sim::read_timeline(measured_path);
  const auto comparison = sim::compare(predicted, measured);
  if (as_json) {
    std::cout << sim::comparison_json(comparison).dump(2) << "\n";
  } else {
    std::cout << predicted.origin << " (" << predicted.source << ") against " << measured.origin << " (" << measured.source << ")\n";
    sim::print_comparison(std::cout, comparison);
  }
  return 0;
}

}  // namespace trainyard::app
