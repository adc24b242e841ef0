#pragma once
#include <functional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "hwprofiles/node.hpp"
#include "planner/step.hpp"

namespace trainyard::app {

struct Command {
  std::string name;
  std::string summary;
  std::function<int(const std::vector<std::string>& args)> run;  // returns the exit code
};

const std::vector<Command>& commands();

int run_list(const std::vector<std::string>& args);
int run_show(const std::vector<std::string>& args);
int run_simulate(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);     // app/plan_command.cpp
int run_compare(const std::vector<std::string>& args);  // app/compare_command.cpp
int run_run(const std::vector<std::string>& args);      // app/run_command.cpp
int run_calibrate(const std::vector<std::string>& args);  // app/calibrate_command.cpp

// Shared by the commands. Parses `args` against `options` (+ positionals); true when --help was printed.
bool parse(const std::vector<std::string>& args, const std::string& usage, boost::program_options::options_description& options,
           const boost::program_options::positional_options_description& positional, boost::program_options::variables_map& vm);
// --seq with exactly one of --global-batch or --tokens-per-step (a multiple of --seq).
planner::Workload workload_from_flags(const boost::program_options::variables_map& vm);
// --nodes in range, and more than one only for nodes that have NICs to join a cluster.
void check_node_count(int nodes);
void check_node_count(int nodes, const hw::NodeProfile& node);

}  // namespace trainyard::app
