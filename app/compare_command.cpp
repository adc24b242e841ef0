// `trainyard compare predicted.json measured.json`: the simulator's timeline against the executor's.
#include <iostream>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "sim/compare.hpp"

namespace po = boost::program_options;

namespace trainyard::app {

int run_compare(const std::vector<std::string>& args) {
  po::options_description options("compare options");
  // clang-format off
  options.add_options()
      ("predicted", po::value<std::string>()->value_name("path"), "the simulated timeline (trainyard simulate --trace)")
      ("measured", po::value<std::string>()->value_name("path"), "the measured timeline (trainyard run --trace)")
      ("json", po::bool_switch(), "print JSON instead of text");
  // clang-format on
  po::positional_options_description positional;
  positional.add("predicted", 1).add("measured", 1);
  po::variables_map vm;
  if (parse(args, "trainyard compare PREDICTED.json MEASURED.json [--json]", options, positional, vm)) return 0;
  if (!vm.count("predicted") || !vm.count("measured")) {
    throw InputError("compare", "arguments", "two timelines: PREDICTED.json MEASURED.json", vm.count("predicted") ? "one" : "none");
  }
  const auto predicted = sim::read_timeline(vm["predicted"].as<std::string>());
  const auto measured = sim::read_timeline(vm["measured"].as<std::string>());
  const auto comparison = sim::compare(predicted, measured);
  if (vm["json"].as<bool>()) {
    std::cout << sim::comparison_json(comparison).dump(2) << "\n";
  } else {
    std::cout << predicted.origin << " (" << predicted.source << ") against " << measured.origin << " (" << measured.source << ")\n";
    sim::print_comparison(std::cout, comparison);
  }
  return 0;
}

}  // namespace trainyard::app
