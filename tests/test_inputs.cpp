// Input checks (bad values, hostile files and the input-size cap): what trainyard refuses before it works,
// and how it says so.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/json_reader.hpp"
#include "planner/plan.hpp"
#include "test_support.hpp"

namespace trainyard {

namespace fs = std::filesystem;
using test::run_cli;

using test::error_of;

namespace {

const std::string kTinyPlan = TRAINYARD_SOURCE_DIR "/examples/tiny-ringtrack.plan.json";

// The tiny example plan with `from` replaced by `to` (the first occurrence), written to `dir`.
std::string edited_plan(const test::TempDir& dir, const std::string& from, const std::string& to) {
  std::string text = test::read_file(kTinyPlan);
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return dir.write("plan.json", text);
}

// Runs a shell command line; its stdout (and what it sends there).
std::string shell(const std::string& command) {
  std::string text;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return text;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
  ::pclose(pipe);
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// --- finding 6: JSON --------------------------------------------------------------------------------------------

TEST(Inputs, ARepeatedJsonKeyIsRefusedWithItsPath) {
  std::string message = error_of([] { json::parse(R"({"model": "a", "hw": "b", "model": "c"})", "p.json"); });
  EXPECT_NE(message.find("p.json: field 'model'"), std::string::npos) << message;
  EXPECT_NE(message.find("\"model\" twice"), std::string::npos) << message;
  message = error_of([] { json::parse(R"({"tasks": [{"name": "a"}, {"x": {"k": 1}, "name": "b", "name": "c"}]})", "g.json"); });
  EXPECT_NE(message.find("field 'tasks[1].name'"), std::string::npos) << message;
  // The same key in different objects is fine, and so is a large object (past the small-object scan).
  std::string large = "{";
  for (int i = 0; i < 200; ++i) large += "\"k" + std::to_string(i) + "\": {\"v\": " + std::to_string(i) + "},";
  EXPECT_EQ(json::parse(large + "\"last\": 0}", "big.json").size(), 201u);
  message = error_of([&] { json::parse(large + "\"k150\": 0}", "big.json"); });
  EXPECT_NE(message.find("field 'k150'"), std::string::npos) << message;
}

TEST(Inputs, ADirectoryAnEmptyFileAndABinaryFileAreNamedForWhatTheyAre) {
  test::TempDir dir;
  std::string message = error_of([&] { json::parse_file(dir.path().string()); });
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
  EXPECT_EQ(message.find("malformed"), std::string::npos) << message;
  message = error_of([&] { json::parse_file(dir.write("empty.json", "  \n")); });
  EXPECT_NE(message.find("empty"), std::string::npos) << message;
  message = error_of([&] {
    json::parse_file(dir.write("elf.json", std::string("\x7f"
                                                       "ELF\x02\x01\x01\0\0\0",
                                                       10)));
  });
  EXPECT_NE(message.find("elf.json:1:5: not JSON text: byte 0x02 at offset 4"), std::string::npos) << message;
  message = error_of([] { json::parse("{\"a\": \"\xff\xfe\"}", "latin.json"); });
  EXPECT_NE(message.find("byte 0xFF"), std::string::npos) << message;
  // UTF-8 text is fine.
  EXPECT_EQ(json::parse("{\"name\": \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x82\"}", "u.json")["name"].get<std::string>().size(), 14u);
}

TEST(Inputs, EveryLoaderRefusesARepeatedKey) {
  test::TempDir dir;
  // A plan with two "model" keys used to simulate the second.
  const std::string plan = edited_plan(dir, "\"hw\": \"lab-h100\",", "\"hw\": \"lab-h100\", \"model\": \"llama3-8b\",");
  auto r = run_cli("simulate --plan " + plan);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("field 'model'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("twice"), std::string::npos) << r.err;
  // A node profile (through the catalog) and a task graph.
  std::string node = test::read_file(TRAINYARD_SOURCE_DIR "/hwprofiles/nodes/lab-h100.json");
  node.insert(node.find('{') + 1, "\"name\": \"x\",");
  r = run_cli("show " + dir.write("node.json", node));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("node.json: field 'name'"), std::string::npos) << r.err;
  std::string graph = test::read_file(TRAINYARD_SOURCE_DIR "/examples/two-gpu-offload.json");
  graph.insert(graph.find('{') + 1, "\"hw\": \"lab-h100\",");
  r = run_cli("simulate --graph " + dir.write("graph.json", graph));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("graph.json: field 'hw'"), std::string::npos) << r.err;
}

TEST(Inputs, ShowOfADirectorySaysSo) {
  test::TempDir dir;
  const fs::path folder = dir.path() / "profile.json";
  fs::create_directory(folder);
  const auto r = run_cli("show " + folder.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("profile.json: is a directory"), std::string::npos) << r.err;
}

// --- finding 2: size caps ---------------------------------------------------------------------------------------

TEST(Inputs, ADeviceWithoutEndIsCutAtTheCap) {
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([] { read_input_file("/dev/zero", 1 << 20, "a JSON file"); });
  EXPECT_NE(message.find("/dev/zero"), std::string::npos) << message;
  EXPECT_NE(message.find("over the cap of 1.00 MiB"), std::string::npos) << message;
  EXPECT_LT(seconds_since(start), 5.0);
  // The command: refused at the JSON cap, within seconds, exit 2 (it used to read until memory ran out).
  const auto cli_start = std::chrono::steady_clock::now();
  const auto r = run_cli("simulate --plan /dev/zero");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/dev/zero: more than 64.0 MiB read"), std::string::npos) << r.err;
  EXPECT_LT(seconds_since(cli_start), 20.0);
}

TEST(Inputs, AHugeFileIsRefusedByItsSizeBeforeReading) {
  test::TempDir dir;
  const std::string path = (dir.path() / "huge.json").string();
  { std::ofstream touch(path); }
  ASSERT_EQ(::truncate(path.c_str(), std::int64_t{1} << 40), 0);  // 1 TiB, sparse: nothing is stored or read
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_cli("simulate --plan " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("huge.json: its size, 1099511627776 bytes (1.00 TiB), is over the cap of 64.0 MiB"), std::string::npos) << r.err;
  EXPECT_LT(seconds_since(start), 20.0);
  // At the cap exactly: read; one byte more: refused.
  const std::string small = dir.write("small.txt", std::string(1000, 'x'));
  EXPECT_EQ(read_input_file(small, 1000, "text").size(), 1000u);
  EXPECT_NE(error_of([&] { read_input_file(small, 999, "text"); }).find("1000 bytes"), std::string::npos);
  // run --text checks its file before any work.
  const auto text = run_cli("run --device cpu --plan " + kTinyPlan + " --text " + path);
  EXPECT_EQ(text.exit_code, 2);
  EXPECT_NE(text.err.find("huge.json: its size"), std::string::npos) << text.err;
  const auto device = run_cli("run --device cpu --plan " + kTinyPlan + " --text /dev/zero");
  EXPECT_EQ(device.exit_code, 2);
  EXPECT_NE(device.err.find("character device"), std::string::npos) << device.err;
}

TEST(Inputs, ALengthsFileIsCappedToo) {
  const auto r = run_cli("simulate --lengths /dev/zero --model llama3.2-1b --hw dgx-a100 --tokens-per-step 64K --max-len 32K --static megatron:tp=8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/dev/zero: more than"), std::string::npos) << r.err;
}

// --- finding 6: plan files and run flags ------------------------------------------------------------------------

TEST(Inputs, ARepeatedRingPositionIsNamedAsARepeat) {
  std::string message = error_of([] { planner::check_ring_order({0, 2, 1, 2}, 4, "p.json", "parameters.ring_order"); });
  EXPECT_NE(message.find("p.json: field 'parameters.ring_order'"), std::string::npos) << message;
  EXPECT_NE(message.find("2 twice (at indices 1 and 3)"), std::string::npos) << message;
  message = error_of([] { planner::check_ring_order({0, 1, 5, 3}, 4, "p.json", "parameters.ring_order"); });
  EXPECT_NE(message.find("got 5 at index 2"), std::string::npos) << message;
  message = error_of([] { planner::check_ring_order({0, 1}, 4, "p.json", "parameters.ring_order"); });
  EXPECT_NE(message.find("got 2 entries"), std::string::npos) << message;
  EXPECT_NO_THROW(planner::check_ring_order({3, 1, 0, 2}, 4, "p.json", "parameters.ring_order"));
  EXPECT_NO_THROW(planner::check_ring_order({}, 4, "p.json", "parameters.ring_order"));
  // In a plan file, and on the command line.
  test::TempDir dir;
  auto r = run_cli("simulate --plan " + edited_plan(dir, "\"ring_order\": []", "\"ring_order\": [0, 0]"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("field 'parameters.ring_order'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("0 twice"), std::string::npos) << r.err;
  r = run_cli(
      "simulate --strategy ringtrack --model custom:layers=8,hidden=64,heads=4,kv_heads=2,head_dim=16,ffn_hidden=192,vocab=256 "
      "--hw dgx-a100 --seq 256 --global-batch 1 --ring 8 --ring-order 0,1,2,3,4,5,6,6");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--ring-order: field 'value'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("6 twice (at indices 6 and 7)"), std::string::npos) << r.err;
}

TEST(Inputs, PlanFileErrorsNameTheFilesFieldsNotFlags) {
  test::TempDir dir;
  // A chunk that does not divide the sequence (256): used to read "--chunk: field 'value'".
  auto r = run_cli("simulate --plan " + edited_plan(dir, "\"chunk\": 64", "\"chunk\": 100"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("plan.json: field 'parameters.chunk': expected a chunk length dividing the sequence length"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--"), std::string::npos) << r.err;
  r = run_cli("simulate --plan " + edited_plan(dir, "\"nodes\": 1", "\"nodes\": 2"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("plan.json: field 'nodes'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--"), std::string::npos) << r.err;
  // The same check from the command line still names the flag.
  const InputError e("--tp/--pp", "value", "tp * pp = 8 (see --dp)", "4");
  EXPECT_STREQ(planner::plan_file_error("p.json", e).what(),
               "p.json: field 'parameters.tp/parameters.pp': expected tp * pp = 8 (see parameters.dp), got 4");
  const InputError other("m.json", "layers", "a positive integer", "0");
  EXPECT_STREQ(planner::plan_file_error("p.json", other).what(), other.what());
}

TEST(Inputs, RunRefusesBadNumbersAndIgnoredFlagsBeforeAnyWork) {
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"--lr -1", "--lr: field 'value': expected a learning rate in (0, 1], got -1"}, Case{"--lr=-1", "--lr: field 'value'"},
                        Case{"--lr nan", "--lr"}, Case{"--lr inf", "--lr"}, Case{"--lr 0", "--lr"}, Case{"--lr 5", "--lr"},
                        Case{"--steps 0", "--steps"}, Case{"--steps 1000000", "--steps"}, Case{"--warmup -1", "--warmup"},
                        Case{"--check --warmup 2", "--warmup: field 'value': expected a run without --check"},
                        Case{"--check --trace t.json", "--trace: field 'value': expected a run without --check"},
                        Case{"--check --steps 3", "--steps"}, Case{"--check --lr 0.1", "--lr"}}) {
    SCOPED_TRACE(c.args);
    const auto r = run_cli("run --device cpu --plan " + kTinyPlan + " " + c.args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("step 1"), std::string::npos) << "it trained: " << r.out;
  }
  // A plan the executor does not run (four GPUs on one rank) runs untimed on the reference: no trace to write.
  const auto r = run_cli("run --device cpu --plan " + std::string(TRAINYARD_SOURCE_DIR) + "/examples/tiny-megatron-4ranks.plan.json --trace t.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--trace: field 'value': expected a plan the executor runs (a step on one GPU"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << "it trained: " << r.out;
}

TEST(Inputs, SimulatePlanWarnsWhenTheStoredPredictionDiffers) {
  test::TempDir dir;
  const std::string out = (dir.path() / "fresh.json").string();
  const auto plan = run_cli("plan --model llama3.2-1b --hw lab-h100 --seq 8K --strategies zero --top 1 --out " + out);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  auto r = run_cli("simulate --plan " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << "a fresh plan matches its simulation: " << r.err;
  // Its prediction halved (as if written with other inputs): a warning with both numbers and the change.
  nlohmann::json doc = nlohmann::json::parse(test::read_file(out));
  const double step_s = doc["predicted"]["step_s"].get<double>();
  doc["predicted"]["step_s"] = step_s / 2;
  r = run_cli("simulate --plan " + dir.write("stale.json", doc.dump(2)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: " + (dir.path() / "stale.json").string() + ": this simulation differs from the plan's stored prediction"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("step time"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(+100.00%)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("peak HBM"), std::string::npos) << "only what differs: " << r.err;
  // Within the tolerance: quiet.
  doc["predicted"]["step_s"] = step_s * (1 + planner::kPredictionTolerance / 2);
  r = run_cli("simulate --plan " + dir.write("close.json", doc.dump(2)));
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  // Not a number: a field error.
  doc["predicted"]["step_s"] = "fast";
  r = run_cli("simulate --plan " + dir.write("bad.json", doc.dump(2)));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("field 'predicted.step_s'"), std::string::npos) << r.err;
}

// --- finding 5: output paths, checked before the work ------------------------------------------------------------

TEST(Outputs, ABadOutputPathFailsBeforeTheSearchAndNamesTheFlag) {
  test::TempDir dir;
  const std::string missing = (dir.path() / "no-such-folder" / "p.json").string();
  // The search of this command takes seconds; refused before it, nothing ranked is printed and lost.
  const std::string plan = "plan --model llama3.2-1b --hw dgx-a100 --seq 32K ";
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"--out " + missing, "--out: field 'value'"}, Case{"--trace " + missing, "--trace: field 'value'"},
                        Case{"--out /dev/full", "character device, not a regular file"}, Case{"--out " + dir.path().string(), "is a directory"},
                        Case{"--out " + (dir.path() / "a.json").string() + " --trace " + (dir.path() / "a.json").string(),
                             "--trace: field 'value': expected a file other than --out's"}}) {
    SCOPED_TRACE(c.args);
    const auto start = std::chrono::steady_clock::now();
    const auto r = run_cli(plan + c.args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("rank"), std::string::npos) << "no search ran: " << r.out;
    EXPECT_LT(seconds_since(start), 5.0) << "refused before the search";
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// A search of minutes (the 1M-token plan on one thread): a bad --out used to be found after it, losing its result;
// now it is refused in well under a second. The timeout turns the old behaviour into exit 124.
TEST(Outputs, TheCheckComesBeforeALongSearch) {
  test::TempDir dir;
  const std::string missing = (dir.path() / "no-such-folder" / "p.json").string();
  const auto start = std::chrono::steady_clock::now();
  const std::string out = shell("timeout 60 " + std::string(TRAINYARD_BINARY) + " plan --model llama3-8b --hw dgx-a100 --seq 1M --threads 1 --out " +
                                missing + " 2>&1; echo exit=$?");
  EXPECT_NE(out.find("--out: field 'value'"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
  EXPECT_EQ(out.find("rank"), std::string::npos) << out;
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(Outputs, EveryOutputFlagIsCheckedFirst) {
  test::TempDir dir;
  const std::string missing = (dir.path() / "no-such-folder" / "f").string();
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"simulate --plan " + kTinyPlan + " --trace " + missing, "--trace: field 'value'"},
                        Case{"simulate --plan " + kTinyPlan + " --trace /dev/full", "character device"},
                        Case{"run --device cpu --steps 2 --plan " + kTinyPlan + " --loss-curve " + missing, "--loss-curve: field 'value'"},
                        Case{"run --device cpu --steps 2 --plan " + kTinyPlan + " --loss-curve /dev/full", "character device"},
                        Case{"simulate --lengths dist:github --model llama3.2-1b --hw dgx-a100 --tokens-per-step 64K "
                             "--static megatron:tp=8 --trace " +
                                 (dir.path() / "t.json").string(),
                             "--trace: field 'value': expected none with --lengths"}}) {
    SCOPED_TRACE(c.args);
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("step"), std::string::npos) << "nothing ran: " << r.out;
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(Outputs, AWriteErrorAfterTheWorkIsReportedNotSuccess) {
  test::TempDir dir;
  const std::string trace = (dir.path() / "trace.json").string();
  // A file-size limit of a few KiB stands in for a full disk: the trace does not fit (SIGXFSZ ignored, so write()
  // fails with EFBIG). The error text goes to a pipe, which the limit does not cover.
  const std::string command = "ulimit -f 8; trap '' XFSZ; " + std::string(TRAINYARD_BINARY) + " simulate --plan " + kTinyPlan + " --trace " + trace +
                              " 2>&1 >/dev/null; echo exit=$?";
  const std::string err = shell(command);
  EXPECT_NE(err.find("trace.json: writing it failed"), std::string::npos) << err;
  EXPECT_NE(err.find("exit=2"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(dir.path())) << "no trace and no temporary file";
}

}  // namespace trainyard
