// The inputs the fuzzers (tests/fuzz/) found, kept in tests/data/fuzz/<target>/: each must now be rejected with
// a clean InputError by the same loader the fuzz target calls (tests/fuzz/fuzz_loaders.hpp), not crash, abort
// or throw anything else. The seed corpora go through the same loaders and must load or give an InputError.
#include <filesystem>
#include <functional>
#include <map>

#include <gtest/gtest.h>

#include "common/error.hpp"
#include "test_support.hpp"
#include "tests/fuzz/fuzz_loaders.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using Loader = std::function<void(std::string_view)>;

const std::map<std::string, Loader>& loaders() {
  static const std::map<std::string, Loader> all = {{"gpu_profile", fuzz::load_gpu_profile},     {"node_profile", fuzz::load_node_profile},
                                                    {"model_file", fuzz::load_model_file},       {"custom_model", fuzz::load_custom_model},
                                                    {"plan_file", fuzz::load_plan_file},         {"task_graph", fuzz::load_task_graph},
                                                    {"lengths_file", fuzz::load_lengths_file},   {"lengths_histogram", fuzz::load_lengths_histogram},
                                                    {"compare_trace", fuzz::load_compare_trace}, {"kineto_trace", fuzz::load_kineto_trace},
                                                    {"nsys_export", fuzz::load_nsys_export},     {"cli_args", fuzz::load_cli_args}};
  return all;
}

// Files under <dir>/<target>/, sorted, with the loader for <target>.
std::vector<std::pair<fs::path, Loader>> inputs_under(const fs::path& dir) {
  std::vector<std::pair<fs::path, Loader>> out;
  for (const auto& target : fs::directory_iterator(dir)) {
    const auto it = loaders().find(target.path().filename().string());
    EXPECT_NE(it, loaders().end()) << "no loader for " << target.path();
    if (it == loaders().end()) continue;
    for (const auto& file : fs::directory_iterator(target.path())) out.emplace_back(file.path(), it->second);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

TEST(FuzzRegressions, EveryFoundInputIsACleanInputError) {
  const auto inputs = inputs_under(fs::path(TRAINYARD_TEST_DATA_DIR) / "fuzz");
  ASSERT_FALSE(inputs.empty());
  for (const auto& [path, load] : inputs) {
    SCOPED_TRACE(path.string());
    EXPECT_THROW(load(test::read_file(path.string())), InputError);
  }
}

// Inputs the fuzzers found that are valid after the fix (tests/data/fuzz-loads/<target>/): they load and report,
// and never throw (an Nsight export whose kernel names are not UTF-8 once aborted `compare --json`).
TEST(FuzzRegressions, FoundInputsThatAreValidLoad) {
  const auto inputs = inputs_under(fs::path(TRAINYARD_TEST_DATA_DIR) / "fuzz-loads");
  ASSERT_FALSE(inputs.empty());
  for (const auto& [path, load] : inputs) {
    SCOPED_TRACE(path.string());
    EXPECT_NO_THROW(load(test::read_file(path.string())));
  }
}

TEST(FuzzRegressions, EveryFuzzTargetHasASeedCorpusThatLoads) {
  const fs::path corpus = fs::path(TRAINYARD_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  for (const auto& [target, load] : loaders()) EXPECT_TRUE(fs::is_directory(corpus / target)) << target;
  int loaded = 0;
  for (const auto& [path, load] : inputs_under(corpus)) {
    SCOPED_TRACE(path.string());
    try {
      load(test::read_file(path.string()));
      ++loaded;
    } catch (const InputError&) {  // seeds include the test suite's bad files on purpose
    }
  }
  EXPECT_GT(loaded, 20);  // the repo's own profiles, models, plans and examples load
}

}  // namespace
}  // namespace trainyard
