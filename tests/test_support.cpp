#include "test_support.hpp"

#include <sys/wait.h>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace trainyard::test {

namespace {
std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

std::string read_file(const std::string& path) { return slurp(path); }

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() / ("trainyard-test-" + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& name, const std::string& text) const {
  const auto file = path_ / name;
  std::ofstream(file) << text;
  return file.string();
}

nlohmann::json source_json(const std::string& relative_path) {
  return nlohmann::json::parse(slurp(std::filesystem::path(TRAINYARD_SOURCE_DIR) / relative_path));
}

CliResult run_cli(const std::string& args) {
  TempDir dir;
  const auto out = dir.path() / "out", err = dir.path() / "err";
  // COLUMNS cleared: output to a file is never fitted to a terminal, whatever the environment running the tests says.
  const std::string command = "COLUMNS= " + std::string(TRAINYARD_BINARY) + " " + args + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(command.c_str());
  CliResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = slurp(out);
  result.err = slurp(err);
  return result;
}

const stacks::StackProfile& ideal_stack() {
  static const stacks::StackProfile s = stacks::load_stack(std::string(TRAINYARD_TEST_DATA_DIR) + "/ideal-stack.json", "test");
  return s;
}

sim::SimResult simulate_built(sim::TaskGraph& graph, const sim::Cluster& cluster, const std::string& origin) {
  sim::validate(graph, cluster.gpus(), cluster.nodes, origin);
  graph.finalize();
  return sim::simulate(graph, cluster);
}

}  // namespace trainyard::test
