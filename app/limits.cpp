// --memory-budget, shared by the commands that build task graphs or tensors (plan, simulate, run).
#include "app/commands.hpp"
#include "common/memory_budget.hpp"

namespace po = boost::program_options;

namespace trainyard::app {

void add_memory_budget_option(po::options_description& options) {
  options.add_options()("memory-budget", po::value<std::string>()->value_name("size"),
                        "memory for what the command builds, e.g. 8G (default: half the available memory, at most 1.5G); "
                        "larger work is refused before it starts");
}

std::int64_t memory_budget(const po::variables_map& vm) {
  if (vm.count("memory-budget")) return parse_memory_size(vm["memory-budget"].as<std::string>(), "--memory-budget");
  return default_memory_budget_bytes();
}

}  // namespace trainyard::app
