// Every `trainyard ...` example in README.md and in the commands' manuals (docs/) runs as printed and exits 0: the
// commands of their code blocks and their inline examples, run from the source directory with output files sent
// to a temp dir (one per code block, so a block's later command reads what an earlier one wrote). Usage templates
// (`trainyard plan --model M [--nodes N] ...`) and bare mentions (`trainyard simulate --plan`) are not examples.
// The README's first screen, its command table and the answer it shows are held to what trainyard prints.
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

// The pages whose examples run: the README and one manual per command (README's command table links them).
const std::vector<std::string> kPages = {"README.md", "docs/run.md", "docs/compare.md", "docs/export.md", "docs/calibrate.md", "docs/simulate.md"};

// An example: the commands of one code block (run in order, sharing their output folder), or one inline command.
struct Example {
  std::string page;
  std::vector<std::string> commands;
};

// How a test's parameter is named in its output (gtest prints the bytes otherwise).
void PrintTo(const Example& e, std::ostream* os) { *os << e.page << ": " << e.commands.front() << (e.commands.size() > 1 ? " ..." : ""); }

std::vector<Example> examples_of(const std::string& page) {
  std::istringstream text(read_file(std::string(TRAINYARD_SOURCE_DIR) + "/" + page));
  std::vector<Example> out;
  Example block{page, {}};
  std::string line, pending;
  bool fenced = false;
  static const std::regex inline_command("`(trainyard [^`]+)`");
  auto end_block = [&] {
    if (!block.commands.empty()) out.push_back(block);
    block.commands.clear();
  };
  while (std::getline(text, line)) {
    if (line.rfind("```", 0) == 0) {
      if (fenced) end_block();
      fenced = !fenced;
      continue;
    }
    const bool indented = !fenced && line.rfind("    ", 0) == 0;
    if (fenced || indented || !pending.empty()) {
      const auto first = line.find_first_not_of(' ');
      std::string command = pending + (first == std::string::npos ? "" : line.substr(first));
      pending.clear();
      if (!command.empty() && command.back() == '\\') {  // continued on the next line
        command.back() = ' ';
        pending = command;
        continue;
      }
      if (command.rfind("trainyard ", 0) == 0 && is_example(command)) block.commands.push_back(command);
      continue;
    }
    if (line.find_first_not_of(' ') != std::string::npos) end_block();  // prose ends an indented block
    for (std::sregex_iterator m(line.begin(), line.end(), inline_command), end; m != end; ++m) {
      if (is_example((*m)[1])) out.push_back({page, {(*m)[1]}});
    }
  }
  end_block();
  return out;
}

std::vector<Example> all_examples() {
  std::vector<Example> out;
  for (const auto& page : kPages) {
    const auto found = examples_of(page);
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

std::vector<std::string> readme_commands() {
  std::vector<std::string> out;
  for (const auto& e : examples_of("README.md")) out.insert(out.end(), e.commands.begin(), e.commands.end());
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

// Runs `command` from the source directory; the files it writes (--out, --trace, --loss-curve) go to `dir`, and
// an argument naming a file an earlier command of the block wrote there reads it from `dir`.
ExampleRun run_example(const std::string& command, const TempDir& dir) {
  auto w = words(command);
  std::string args;
  for (std::size_t i = 1; i < w.size(); ++i) {
    const auto in_dir = dir.path() / std::filesystem::path(w[i]).filename();
    const bool output = i > 1 && (w[i - 1] == "--out" || w[i - 1] == "--trace" || w[i - 1] == "--loss-curve");
    if (output ||
        (!w[i].starts_with("-") && std::filesystem::exists(in_dir) && !std::filesystem::exists(TRAINYARD_SOURCE_DIR + std::string("/") + w[i]))) {
      w[i] = in_dir.string();
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

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

class ReadmeExample : public ::testing::TestWithParam<Example> {};

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
  for (const auto& command : GetParam().commands) {
    const ExampleRun r = run_example(command, dir);
    std::cout << "[ example  ] " << r.seconds << " s: " << command << "\n";
    EXPECT_EQ(r.exit_code, 0) << GetParam().page << ": " << command << "\n" << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Docs, ReadmeExample, ::testing::ValuesIn(all_examples()), [](const ::testing::TestParamInfo<Example>& example) {
  std::string name = std::to_string(example.index) + "_" + std::filesystem::path(example.param.page).stem().string() + "_";
  for (const auto& w : words(example.param.commands.front())) {
    if (w == "trainyard") continue;
    name += w;  // the subcommand
    break;
  }
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
});

// The first screen of the README (80 x 24) says what trainyard is, shows the main job with its answer and the
// accuracy caveat, the two set-up commands, and starts the command table.
TEST(ReadmeFirstScreen, SaysWhatItIsShowsAnAnswerAndHowToSetUp) {
  const auto lines = lines_of(read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md"));
  ASSERT_GE(lines.size(), 24U);
  std::string screen;
  for (std::size_t i = 0; i < 24; ++i) {
    EXPECT_LE(lines[i].size(), 80U) << "README line " << i + 1 << " is wider than 80 columns";
    screen += lines[i] + "\n";
  }
  for (const char* must : {"trainyard plans, simulates and executes long-context LLM training", "trainyard plan --model llama3-8b", "ringtrack",
                           "optimistic", "lower bound", "bash scripts/run.sh", "bash scripts/test.sh", "| command |"}) {
    EXPECT_NE(screen.find(must), std::string::npos) << "the README's first 24 lines lack \"" << must << "\"";
  }
}

// The rows of the answer the README shows are the main job's: each README row's figures are in the row of the same
// rank and scheme that the command prints.
TEST(ReadmeFirstScreen, TheAnswerShownIsTheMainJobs) {
  const auto lines = lines_of(read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md"));
  std::vector<std::vector<std::string>> shown;
  bool in_answer = false;
  for (const auto& line : lines) {
    if (line.rfind("rank  scheme", 0) == 0) in_answer = true;
    else if (in_answer && line.rfind("```", 0) == 0) break;
    else if (in_answer) shown.push_back(fields(line));
  }
  ASSERT_GE(shown.size(), 2U) << "the README shows no answer rows";
  const CliResult r = run_cli("plan --model llama3-8b --hw dgx-a100 --seq 1M");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& row : shown) {
    ASSERT_GE(row.size(), 2U);
    const auto printed = lines_of(r.out);
    const auto at = std::find_if(printed.begin(), printed.end(), [&](const std::string& l) {
      const auto f = fields(l);
      return f.size() > 2 && f[0] == row[0] && f[1] == row[1];
    });
    ASSERT_NE(at, printed.end()) << "no rank " << row[0] << " " << row[1] << " in:\n" << r.out;
    const std::string padded = " " + *at + " ";
    for (std::size_t i = 2; i + 1 < row.size(); i += 2) {  // value and unit pairs ("680 s", "56.0 GiB") or single figures
      const bool unit = row[i + 1] == "s" || row[i + 1] == "GiB" || row[i + 1] == "ms";
      const std::string figure = unit ? row[i] + " " + row[i + 1] : row[i];
      EXPECT_NE(padded.find(" " + figure + " "), std::string::npos) << "README shows " << figure << "; the command printed:\n" << *at;
      if (!unit) --i;
    }
  }
}

// The README's command table is `trainyard --help`'s: the same commands, in order, with the same descriptions, and
// each row links a manual that exists.
TEST(ReadmeFirstScreen, TheCommandTableIsTheHelp) {
  const CliResult help = run_cli("--help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  std::vector<std::pair<std::string, std::string>> helped, tabled;
  bool in_commands = false;
  for (const auto& line : lines_of(help.out)) {
    if (line == "commands:") in_commands = true;
    else if (in_commands && line.empty()) break;
    else if (in_commands) {
      const auto f = fields(line);
      ASSERT_FALSE(f.empty());
      helped.emplace_back(f[0], line.substr(line.find_first_not_of(' ', line.find(f[0]) + f[0].size())));
    }
  }
  static const std::regex row(R"re(^\| `(\w+)` \| ([^|]+) \| (.+) \|$)re");
  static const std::regex link(R"re(\]\(([^)]+)\))re");
  for (const auto& line : lines_of(read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md"))) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    tabled.emplace_back(m[1], m[2]);
    const std::string manuals = m[3];
    std::smatch l;
    ASSERT_TRUE(std::regex_search(manuals, l, link)) << m[1] << " links no manual";
    for (std::sregex_iterator it(manuals.begin(), manuals.end(), link), end; it != end; ++it) {
      EXPECT_TRUE(std::filesystem::exists(std::string(TRAINYARD_SOURCE_DIR) + "/" + (*it)[1].str())) << (*it)[1];
    }
  }
  ASSERT_FALSE(helped.empty());
  EXPECT_EQ(tabled, helped);
}

// No table cell in the README runs on: the details are in the manuals.
TEST(ReadmeFirstScreen, NoTableCellRunsOn) {
  for (const auto& line : lines_of(read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md"))) {
    if (line.rfind("|", 0) != 0) continue;
    std::istringstream cells(line);
    for (std::string cell; std::getline(cells, cell, '|');) EXPECT_LE(fields(cell).size(), 45U) << cell;
  }
}

}  // namespace trainyard::test
