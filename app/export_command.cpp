// `trainyard export --plan plan.json --to megatron|deepspeed|torchtitan [--out DIR]`: the plan as the engine's launch
// script and configuration files (planner/engines/launch.hpp).
#include <sys/stat.h>

#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "planner/engines/launch.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

namespace {

constexpr const char* kScriptName = "launch.sh";

Json launch_json(const planner::EngineLaunch& l, const planner::Engine& engine, const std::string& script) {
  Json files = Json::object();
  for (const auto& f : l.files) files[f.name] = f.text;
  Json env = Json::object();
  for (const auto& [name, value] : l.env) env[name] = value;
  return {{"engine", engine.name}, {"version", engine.version}, {"launcher", l.launcher}, {"program", l.program}, {"env", env}, {"args", l.args},
          {"files", files},        {"notes", l.notes},          {"script", script}};
}

// DIR/launch.sh (executable) and the configuration files beside it, each written atomically; the folder is made.
void write_launch(const std::string& dir, const planner::EngineLaunch& l, const std::string& script) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError("--out", "value", "a folder that can be created", "\"" + dir + "\" (" + ec.message() + ")");
  const std::filesystem::path folder(dir);
  std::vector<std::pair<std::string, std::string>> outputs = {{kScriptName, script}};
  for (const auto& f : l.files) outputs.emplace_back(f.name, f.text);
  for (const auto& [name, text] : outputs) check_writable((folder / name).string(), "--out");
  for (const auto& [name, text] : outputs) write_file_atomically((folder / name).string(), text);
  const std::string script_path = (folder / kScriptName).string();
  if (::chmod(script_path.c_str(), 0755) != 0) throw InputError("--out", "value", "a launch script that can be made executable", script_path);
}

}  // namespace

int run_export(const std::vector<std::string>& args) {
  po::options_description options("export options");
  // clang-format off
  options.add_options()
      ("plan", po::value<std::string>()->value_name("path"), "plan file (trainyard plan --out)")
      ("to", po::value<std::string>()->value_name("megatron|deepspeed|torchtitan"), "the engine to run the plan on")
      ("out", po::value<std::string>()->value_name("dir"), "write launch.sh and the engine's configuration files into this folder (default: print them)")
      ("json", po::bool_switch(), "print the launch as JSON");
  // clang-format on
  add_memory_budget_option(options);
  po::positional_options_description positional;
  po::variables_map vm;
  if (parse(args, "trainyard export --plan FILE --to megatron|deepspeed|torchtitan [--out DIR] [--json]", options, positional, vm)) return 0;
  if (!vm.count("plan")) throw InputError("--plan", "value", "a plan file", "nothing");
  if (!vm.count("to")) throw InputError("--to", "value", "megatron, deepspeed or torchtitan", "nothing");
  const planner::Engine& engine = planner::engine_named(vm["to"].as<std::string>());
  const LoadedPlan l = load_plan(vm["plan"].as<std::string>(), memory_budget(vm));
  const planner::StepInputs in{l.model, *l.cluster, l.plan.workload, model::precision_policy(l.plan.precision, l.origin + ": field 'precision'")};
  const planner::EngineLaunch launch = planner::export_plan(in, l.plan.spec, engine.name);
  const std::string script = planner::launch_script(launch, *l.cluster);
  if (vm.count("out")) write_launch(vm["out"].as<std::string>(), launch, script);
  if (vm["json"].as<bool>()) {
    std::cout << launch_json(launch, engine, script).dump(2) << "\n";
    return 0;
  }
  if (vm.count("out")) {
    std::cout << "wrote " << (std::filesystem::path(vm["out"].as<std::string>()) / kScriptName).string();
    for (const auto& f : launch.files) std::cout << ", " << f.name;
    std::cout << " for " << engine.program << " (" << engine.version << ")\n";
    for (const auto& note : launch.notes) std::cout << "  " << note << "\n";
    return 0;
  }
  std::cout << "# ---- " << kScriptName << "\n" << script;
  for (const auto& f : launch.files) std::cout << "# ---- " << f.name << "\n" << f.text;
  return 0;
}

}  // namespace trainyard::app
