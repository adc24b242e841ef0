// The code's shape, held by CI: scheme knowledge lives in the scheme registry (planner/schemes/), and functions in
// sim/ and planner/ stay short enough to hold in one's head. Reads the source tree (TRAINYARD_SOURCE_DIR).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = TRAINYARD_SOURCE_DIR;

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<fs::path> sources(const std::vector<std::string>& folders) {
  std::vector<fs::path> out;
  for (const auto& folder : folders) {
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / folder)) {
      const auto ext = entry.path().extension();
      if (entry.is_regular_file() && (ext == ".cpp" || ext == ".hpp" || ext == ".cu" || ext == ".cuh")) out.push_back(entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string from_root(const fs::path& p) { return fs::relative(p, kRoot).generic_string(); }

// The text with comments, string and character literals blanked (newlines kept, so line numbers hold).
std::string code_only(const std::string& text) {
  std::string out = text;
  enum { code, line_comment, block_comment, string, character } state = code;
  bool line_start = true;  // only blanks since the last newline
  for (std::size_t i = 0; i < out.size(); ++i) {
    const char c = text[i], next = i + 1 < text.size() ? text[i + 1] : '\0';
    const bool was_line_start = line_start;
    line_start = c == '\n' || (line_start && (c == ' ' || c == '\t'));
    switch (state) {
      case code:
        if ((c == '/' && next == '/') || (c == '#' && was_line_start)) state = line_comment;  // preprocessor lines too
        else if (c == '/' && next == '*') state = block_comment;
        else if (c == '"') state = string;
        else if (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(text[i - 1])))) state = character;  // 1'000 separators
        continue;
      case line_comment:
        if (c == '\n') state = code;
        break;
      case block_comment:
        if (c == '*' && next == '/') {
          out[i] = out[i + 1] = ' ';
          ++i;
          state = code;
          continue;
        }
        break;
      case string:
      case character:
        if (c == '\\') {
          out[i] = ' ';
          if (i + 1 < out.size() && text[i + 1] != '\n') out[++i] = ' ';
          continue;
        }
        if ((state == string && c == '"') || (state == character && c == '\'')) {
          state = code;
          continue;
        }
        break;
    }
    if (out[i] != '\n') out[i] = ' ';
  }
  return out;
}

struct Function {
  std::string where;  // file:line
  std::string name;
  int lines = 0;
};

// The name of the function whose definition `head` (the code before a '{') begins, if it is one: the identifier
// before its first '(' ("Engine::run", "operator=="), unless an '=' comes first (an initializer).
std::string function_name(const std::string& head) {
  const auto paren = head.find('(');
  if (paren == std::string::npos) return "";
  const auto eq = head.find('=');
  if (eq < paren && head.find("operator") == std::string::npos) return "";
  auto end = paren;
  while (end > 0 && std::isspace(static_cast<unsigned char>(head[end - 1]))) --end;
  auto start = end;
  auto part_of_name = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == ':' || ch == '~'; };
  while (start > 0 && part_of_name(head[start - 1])) --start;
  return head.substr(start, end - start);
}

// Definitions of functions at namespace level and in class bodies (free functions, members defined in or out of
// their class) with their length in lines from the signature's opening brace to the closing one.
std::vector<Function> functions_in(const fs::path& path) {
  const std::string text = code_only(read(path));
  std::vector<Function> out;
  struct Open {
    bool definition;  // a function (else a namespace, a class body, an initializer...)
    int line;
    std::string name;  // the function's; "namespace" or "type" for those bodies
  };
  std::vector<Open> stack;
  std::string head;  // the code since the last ';', '{' or '}'
  int line = 1;
  auto outside_functions = [&] {
    return std::all_of(stack.begin(), stack.end(), [](const Open& o) { return !o.definition && (o.name == "namespace" || o.name == "type"); });
  };
  for (char c : text) {
    if (c == '\n') ++line;
    if (c == '{') {
      Open open{false, line, ""};
      static const std::regex kNamespace(R"(\bnamespace\s*[\w:]*\s*$)");
      static const std::regex kType(R"(\b(struct|class|union|enum)\b[^()]*$)");
      const bool outside = outside_functions();
      if (std::regex_search(head, kNamespace)) {
        open.name = "namespace";
      } else if (outside && std::regex_search(head, kType)) {
        open.name = "type";
      } else if (outside) {
        open.name = function_name(head);
        open.definition = !open.name.empty();
      }
      stack.push_back(open);
      head.clear();
    } else if (c == '}') {
      if (!stack.empty()) {
        const Open open = stack.back();
        stack.pop_back();
        if (open.definition) out.push_back({from_root(path) + ":" + std::to_string(open.line), open.name, line - open.line + 1});
      }
      head.clear();
    } else if (c == ';') {
      head.clear();
    } else {
      head += c;
    }
  }
  return out;
}

TEST(Structure, SchemeNamesAreComparedOnlyInTheRegistry) {
  // A scheme's knowledge is its registry entry's (planner/schemes/scheme.hpp): elsewhere a name is looked up,
  // never compared.
  // A comparison with a scheme variable, or any comparison with a built-in scheme's name.
  const std::regex kComparison(
      R"re((scheme|strategy)\w*(\.\w+)*\s*[!=]=\s*"|"[\w-]+"\s*[!=]=\s*\w*(scheme|strategy)|[!=]=\s*"(ringtrack|megatron|zero|ulysses|ring-attention|fpdt)")re");
  std::vector<std::string> found;
  for (const auto& path : sources({"app", "backend", "gui", "planner", "sim", "kernels"})) {
    if (from_root(path).starts_with("planner/schemes/")) continue;
    std::istringstream text(read(path));
    std::string line_text;
    for (int line = 1; std::getline(text, line_text); ++line) {
      if (std::regex_search(line_text, kComparison)) found.push_back(from_root(path) + ":" + std::to_string(line) + ": " + line_text);
    }
  }
  for (const auto& f : found) ADD_FAILURE() << f;
  EXPECT_TRUE(found.empty());
}

TEST(Structure, ASchemesOwnCodeLivesInItsFolder) {
  // planner/schemes/NAME/ holds a scheme's entry, builder, bounds, estimate, layout and symmetry; the planner's other
  // files keep only what every scheme shares, so they name no scheme's parameter struct (plan.hpp lists them in
  // SchemeParams), and no scheme's folder reaches into another's (issue 44, move 4).
  const std::regex kParams(R"re(\b(MegatronParams|ZeroParams|RingTrackParams)\b)re");
  const std::regex kInclude(R"re(#\s*include\s*"planner/schemes/(\w+)/)re");
  std::vector<std::string> found;
  for (const auto& path : sources({"planner"})) {
    const std::string name = from_root(path);
    const std::string text = read(path);
    if (path.parent_path() == kRoot / "planner" && name != "planner/plan.hpp" && std::regex_search(code_only(text), kParams)) {
      found.push_back(name + " names a scheme's parameter struct");
    }
    if (!name.starts_with("planner/schemes/") || path.parent_path() == kRoot / "planner/schemes") continue;
    const std::string folder = path.parent_path().filename().string();
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kInclude); it != std::sregex_iterator(); ++it) {
      if ((*it)[1] != folder) found.push_back(name + " includes planner/schemes/" + (*it)[1].str() + "/");
    }
  }
  for (const auto& f : found) ADD_FAILURE() << f;
  EXPECT_TRUE(found.empty());
}

// Every header a source file pulls in, transitively: project headers ("dir/file.hpp") are followed, system ones
// (<...>) listed.
std::set<std::string> includes_of(const std::string& file) {
  std::set<std::string> seen;
  std::vector<std::string> to_read{file};  // project headers found but not read yet
  static const std::regex kInclude(R"re(^\s*#\s*include\s*([<"])([^>"]+)[>"])re");
  while (!to_read.empty()) {
    const std::string at = to_read.back();
    to_read.pop_back();
    std::istringstream text(read(kRoot / at));
    std::string line;
    while (std::getline(text, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, kInclude)) continue;
      const std::string name = m[2];
      if (!seen.insert(name).second) continue;
      if (m[1] == "\"" && fs::exists(kRoot / name)) to_read.push_back(name);
    }
  }
  return seen;
}

TEST(Structure, TheTaskGraphNeedsNoJsonAndTheGuiNoCommandLine) {
  // The IR every layer uses is plain data: reading and writing it as JSON is sim/graph_json's business.
  ASSERT_EQ(includes_of("hwprofiles/gpu.hpp").count("nlohmann/json.hpp"), 1U) << "the include walker misses what it must find";
  const auto graph = includes_of("sim/task_graph.hpp");
  EXPECT_EQ(graph.count("nlohmann/json.hpp"), 0U) << "sim/task_graph.hpp pulls in nlohmann/json";
  // The GUI uses the libraries, not the command-line program's internals.
  for (const auto& path : sources({"gui"})) {
    EXPECT_EQ(includes_of(from_root(path)).count("app/commands.hpp"), 0U) << from_root(path) << " includes app/commands.hpp";
  }
}

TEST(Structure, TheBackendReadsNoTracesAndOnlyCalibrationFitsWithEigen) {
  // calibrate/ measures through the backend and fits profiles, some from engines' traces; the executor itself needs
  // neither the trace readers nor the least-squares library (issue 44, move 3).
  ASSERT_EQ(includes_of("calibrate/trace_calibration.hpp").count("traces/kineto.hpp"), 1U) << "the include walker misses what it must find";
  for (const auto& path : sources({"backend"})) {
    for (const auto& name : includes_of(from_root(path))) {
      EXPECT_FALSE(name.starts_with("traces/")) << from_root(path) << " includes " << name;
      EXPECT_FALSE(name.starts_with("Eigen")) << from_root(path) << " includes " << name;
    }
  }
  for (const auto& path : sources({"sim", "planner", "app", "gui", "hwprofiles", "models", "stacks", "common"})) {
    for (const auto& name : includes_of(from_root(path))) EXPECT_FALSE(name.starts_with("Eigen")) << from_root(path) << " includes " << name;
  }
}

std::vector<std::string> boost_graph_headers(const std::set<std::string>& includes) {
  std::vector<std::string> out;
  for (const auto& name : includes) {
    if (name.starts_with("boost/graph/")) out.push_back(name);
  }
  return out;
}

TEST(Structure, BoostGraphStaysInsideTopologyCpp) {
  // Boost.Graph is the topology's implementation (hwprofiles/topology.cpp), not its interface: every file that
  // includes sim/engine.hpp would otherwise compile the adjacency_list templates.
  ASSERT_FALSE(boost_graph_headers(includes_of("hwprofiles/topology.cpp")).empty()) << "the include walker misses what it must find";
  std::vector<fs::path> headers = {kRoot / "hwprofiles/topology.hpp", kRoot / "sim/engine.hpp"};
  for (const auto& path : sources({"sim", "planner"})) {
    if (path.extension() == ".hpp" || path.extension() == ".cuh") headers.push_back(path);
  }
  for (const auto& path : headers) {
    for (const auto& name : boost_graph_headers(includes_of(from_root(path)))) ADD_FAILURE() << from_root(path) << " pulls in " << name;
  }
}

TEST(Structure, TheLineCounterFindsFunctionsAndSkipsCommentsAndStrings) {
  const fs::path path = fs::path(::testing::TempDir()) / "structure_probe.cpp";
  std::ofstream(path) << "namespace a {\nstruct S { int f() { return 1; } };\n"
                         "int g(int x) {\n  // }\n  const char* s = \"}\";\n  return x;\n}\n"
                         "int h() { return '}'; }\n}  // namespace a\n";
  const auto found = functions_in(path);
  ASSERT_EQ(found.size(), 3U);
  EXPECT_EQ(found[0].name, "f");  // defined in its class's body
  EXPECT_EQ(found[0].lines, 1);
  EXPECT_EQ(found[1].name, "g");
  EXPECT_EQ(found[1].lines, 5);
  EXPECT_EQ(found[2].name, "h");
  EXPECT_EQ(found[2].lines, 1);
}

// No function in sim/, planner/, backend/, calibrate/, app/ or gui/ over kMaxLines (functions defined in class
// bodies included): one a newcomer can hold in their head. The longest are printed whatever happens.
constexpr int kMaxLines = 80;

TEST(Structure, FunctionsAreShort) {
  std::vector<Function> all;
  for (const auto& path : sources({"sim", "planner", "backend", "calibrate", "app", "gui"})) {
    for (auto& f : functions_in(path)) all.push_back(std::move(f));
  }
  ASSERT_GT(all.size(), 100U) << "the counter found too few functions to be trusted";
  std::sort(all.begin(), all.end(), [](const Function& a, const Function& b) { return a.lines > b.lines; });
  std::cout << "longest functions:\n";
  for (std::size_t i = 0; i < std::min<std::size_t>(10, all.size()); ++i) {
    std::cout << "  " << all[i].lines << " lines  " << all[i].name << "  (" << all[i].where << ")\n";
  }
  for (const auto& f : all) {
    EXPECT_LE(f.lines, kMaxLines) << f.name << " (" << f.where << ") has " << f.lines << " lines: split it";
  }
}

}  // namespace
