#pragma once
// Helpers shared by the tests: temporary files, running the CLI, reading built-in JSON from the source tree.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "sim/engine.hpp"
#include "stacks/stack_profile.hpp"

namespace trainyard::test {

// A fresh directory under the system temp dir, removed when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const;  // returns the file's path

 private:
  std::filesystem::path path_;
};

// tests/data/ideal-stack.json: nothing reserved, no host cost, fused ops, the profile's calibrated attention
// tables. Mechanics tests on the small test nodes use it so that their figures stay round.
const stacks::StackProfile& ideal_stack();

// Validates a builder's graph (the error names `origin`), finalizes it and simulates it on `cluster`.
sim::SimResult simulate_built(sim::TaskGraph& graph, const sim::Cluster& cluster, const std::string& origin = "test graph");

// A file of the source tree, parsed (e.g. "hwprofiles/gpus/h100-sxm.json").
nlohmann::json source_json(const std::string& relative_path);

std::string read_file(const std::string& path);

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs the built `trainyard` binary with `args` (shell-quoted by the caller where needed).
CliResult run_cli(const std::string& args);

// The message of the InputError that `f` throws; fails the test if it throws nothing.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

}  // namespace trainyard::test
