#pragma once
// Sorting a profiler trace's GPU kernels into the simulator's task classes (sim/report.hpp task_class: "gemm",
// "attention fwd", ..., "collective") by their names: the rules in traces/kernel_classes.json (compiled in), after
// any the user adds with --kernel-classes FILE. A kernel no rule matches is "unclassified".
#include <memory>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/json_reader.hpp"

namespace trainyard::traces {

inline constexpr const char* kUnclassified = "unclassified";

class KernelClassifier {
 public:
  // The built-in rules, after those of `extra_path` when not empty (InputError naming the file and the rule).
  explicit KernelClassifier(const std::string& extra_path = "");
  // The class of a kernel named `name` (cached: traces repeat a few hundred names millions of times).
  const std::string& classify(const std::string& name) const;

 private:
  struct Rule {
    std::string task_class;
    std::regex pattern;
  };
  void add_rules(const json::Json& document, const std::string& origin);
  std::vector<Rule> rules_;
  mutable std::unordered_map<std::string, std::string> cache_;
};

}  // namespace trainyard::traces
