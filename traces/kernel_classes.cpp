#include "traces/kernel_classes.hpp"

#include <algorithm>

#include "common/embedded.hpp"
#include "common/error.hpp"
#include "sim/compare.hpp"

namespace trainyard {
const std::vector<EmbeddedFile>& embedded_kernel_classes();  // traces/kernel_classes.json, by cmake/EmbedJson.cmake
}

namespace trainyard::traces {

KernelClassifier::KernelClassifier(const std::string& extra_path) {
  if (!extra_path.empty()) add_rules(json::parse_file(extra_path), extra_path);
  const EmbeddedFile& builtin = embedded_kernel_classes().front();
  add_rules(json::parse(builtin.text, std::string(builtin.path)), std::string(builtin.path));
}

void KernelClassifier::add_rules(const json::Json& document, const std::string& origin) {
  const json::Reader top(document, origin);
  top.expect_string("schema", "trainyard.kernel_classes.v1");
  top.optional_string("description");
  for (const json::Reader& r : top.objects("rules")) {
    Rule rule;
    rule.task_class = r.choice("class", sim::task_classes());  // another class would make a row nothing predicts
    const std::string match = r.string("match");
    r.optional_string("why");
    try {
      rule.pattern = std::regex(match, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      r.fail("match", "an ECMAScript regular expression", "\"" + match + "\" (" + e.what() + ")");
    }
    r.finish();
    rules_.push_back(std::move(rule));
  }
  top.finish();
}

const std::string& KernelClassifier::classify(const std::string& name) const {
  if (const auto found = cache_.find(name); found != cache_.end()) return found->second;
  std::string task_class = kUnclassified;
  for (const Rule& rule : rules_) {
    if (std::regex_search(name, rule.pattern)) {
      task_class = rule.task_class;
      break;
    }
  }
  return cache_.emplace(name, std::move(task_class)).first->second;
}

}  // namespace trainyard::traces
