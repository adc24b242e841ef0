#pragma once
#include <functional>
#include <string>
#include <vector>

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

}  // namespace trainyard::app
