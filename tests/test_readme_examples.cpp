// Every `trainyard ...` example in README.md runs as printed and exits 0: the commands of
// its code blocks and its inline examples, run from the source directory with output files sent to a temp dir.
// Usage templates (`trainyard plan --model M [--nodes N] ...`) and bare mentions (`trainyard simulate --plan`)
// are not examples.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <regex>
#include <sstream>

#include "test_support.hpp"

namespace trainyard::test {

namespace {

// Splits a command line as a shell would for the examples' needs: spaces, and double- or single-quoted words.
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char c : line) {
    if (quote) {
      if (c == quote) quote = 0;
      else word += c;
    } else if (c == '"' || c == '\'') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) out.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) out.push_back(word);
  return out;
}

// A template or a mention rather than a command to run.
bool is_example(const std::string& command) {
  if (command.find_first_of("[]<>|") != std::string::npos || command.find("...") != std::string::npos) return false;
  const auto w = words(command);
  if (w.size() < 3) return false;
  for (std::size_t i = 2; i < w.size(); ++i) {
    if (w[i].rfind("--", 0) != 0) return true;  // some flag has a value
  }
  return false;
}

std::vector<std::string> readme_commands() {
  std::istringstream readme(read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md"));
  std::vector<std::string> out;
  std::string line, pending;
  bool fenced = false;
  static const std::regex inline_command("`(trainyard [^`]+)`");
  while (std::getline(readme, line)) {
    if (line.rfind("```", 0) == 0) {
      fenced = !fenced;
      continue;
    }
    const bool indented = !fenced && line.rfind("    ", 0) == 0;
    if (fenced || indented || !pending.empty()) {
      const auto first = line.find_first_not_of(' ');
      std::string text = pending + (first == std::string::npos ? "" : line.substr(first));
      pending.clear();
      if (!text.empty() && text.back() == '\\') {  // continued on the next line
        text.back() = ' ';
        pending = text;
        continue;
      }
      if (text.rfind("trainyard ", 0) == 0 && is_example(text)) out.push_back(text);
      continue;
    }
    for (std::sregex_iterator m(line.begin(), line.end(), inline_command), end; m != end; ++m) {
      if (is_example((*m)[1])) out.push_back((*m)[1]);
    }
  }
  return out;
}

std::string single_quoted(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct ExampleRun {
  int exit_code = -1;
  std::string err;
  double seconds = 0;
};

// Runs `command` from the source directory; the files it writes (--out, --trace, --loss-curve) go to `dir`.
ExampleRun run_example(const std::string& command, const TempDir& dir) {
  auto w = words(command);
  std::string args;
  for (std::size_t i = 1; i < w.size(); ++i) {
    if (i > 1 && (w[i - 1] == "--out" || w[i - 1] == "--trace" || w[i - 1] == "--loss-curve")) {
      w[i] = (dir.path() / std::filesystem::path(w[i]).filename()).string();
    }
    args += " " + single_quoted(w[i]);
  }
  const auto err = dir.path() / "stderr";
  const std::string shell = "cd " + single_quoted(TRAINYARD_SOURCE_DIR) + " && " + single_quoted(TRAINYARD_BINARY) + args + " >/dev/null 2>" +
                            single_quoted(err.string());
  const auto started = std::chrono::steady_clock::now();
  const int status = std::system(shell.c_str());
  ExampleRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err.string());
  return r;
}

class ReadmeExample : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST(ReadmeExamples, TheExtractorFindsTheKnownExamples) {
  const auto commands = readme_commands();
  auto has = [&](const std::string& prefix) {
    return std::any_of(commands.begin(), commands.end(), [&](const std::string& c) { return c.rfind(prefix, 0) == 0; });
  };
  EXPECT_TRUE(has("trainyard plan --model llama3-8b --hw dgx-a100 --seq 1M --explain --out build/plan.json")) << "the main job";
  EXPECT_TRUE(has("trainyard plan --lengths dist:github")) << "the HotSPa plan example";
  EXPECT_TRUE(has("trainyard simulate --lengths dist:commoncrawl")) << "a continued line of a code block";
  EXPECT_TRUE(has("trainyard simulate --graph examples/two-gpu-offload.json --trace t.json"));
  for (const auto& c : commands) {
    EXPECT_EQ(c.find_first_of("[]<>|"), std::string::npos) << c;
    EXPECT_NE(c, "trainyard simulate --plan");
  }
}

// The accuracy section is generated from validate's recorded figures, never typed by hand.
TEST(ReadmeExamples, TheAccuracySectionIsWhatValidateRecorded) {
  const std::string readme = read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md");
  const std::string begin = "<!-- accuracy:begin -->\n", end = "<!-- accuracy:end -->";
  const auto b = readme.find(begin), e = readme.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  const auto r = run_cli("validate --accuracy-summary " + std::string(TRAINYARD_SOURCE_DIR) + "/validation/baseline.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(readme.substr(b + begin.size(), e - b - begin.size()), r.out) << "run scripts/validation_doc.sh";
}

TEST_P(ReadmeExample, ExitsZero) {
  TempDir dir;
  const ExampleRun r = run_example(GetParam(), dir);
  std::cout << "[ example  ] " << r.seconds << " s: " << GetParam() << "\n";
  EXPECT_EQ(r.exit_code, 0) << GetParam() << "\n" << r.err;
}

INSTANTIATE_TEST_SUITE_P(Readme, ReadmeExample, ::testing::ValuesIn(readme_commands()), [](const ::testing::TestParamInfo<std::string>& example) {
  std::string name = std::to_string(example.index) + "_";
  for (const auto& w : words(example.param)) {
    if (w == "trainyard") continue;
    name += w;  // the subcommand
    break;
  }
  return name;
});

}  // namespace trainyard::test
