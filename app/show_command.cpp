// trainyard show: one GPU, node or model profile (built in, custom:..., or a JSON file) in full, as text or JSON.
#include <iostream>
#include <optional>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/report.hpp"
#include "common/catalog.hpp"
#include "common/error.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

namespace {

enum class Kind { gpu, node, model };

// What a JSON file's "schema" says it holds.
Kind kind_of_document(const Json& document, const std::string& path) {
  const std::string schema = document.is_object() && document.contains("schema") && document["schema"].is_string()
                                 ? document["schema"].get<std::string>()
                                 : "";
  if (schema == "trainyard.gpu.v1") return Kind::gpu;
  if (schema == "trainyard.node.v1") return Kind::node;
  if (schema == "trainyard.model.v1") return Kind::model;
  throw InputError(path, "schema", "\"trainyard.gpu.v1\", \"trainyard.node.v1\" or \"trainyard.model.v1\"",
                   schema.empty() ? "nothing" : "\"" + schema + "\"");
}

// What kind of thing `name` is: a file says so in its "schema" (read into `document`, its path into `origin`);
// a name is looked up in each catalog.
Kind kind_of(const std::string& name, Json& document, std::string& origin) {
  if (looks_like_path(name)) {
    document = trainyard::json::parse_file(name);
    origin = name;
    return kind_of_document(document, name);
  }
  if (hw::is_builtin_gpu(name)) return Kind::gpu;
  if (hw::is_builtin_node(name)) return Kind::node;
  if (model::is_builtin_model(name) || name.starts_with("custom:")) return Kind::model;
  std::string known;
  for (const auto& list : {hw::builtin_gpu_names(), hw::builtin_node_names(), model::builtin_model_names()}) {
    for (const auto& n : list) known += (known.empty() ? "" : ", ") + n;
  }
  throw InputError("show: unknown name \"" + name + "\": expected a built-in GPU, node or model (" + known +
                   "), custom:..., or a path to a .json file");
}

void check_flags_for(Kind kind, const po::variables_map& vm, int nodes) {
  if (kind != Kind::model && vm.count("hw")) {
    throw InputError("--hw", "value", "--hw only together with a model (show MODEL --hw NODE)",
                     "--hw with a " + std::string(kind == Kind::gpu ? "GPU" : "node") + " profile");
  }
  if (kind != Kind::node && kind != Kind::model && nodes != 1) {
    throw InputError("--nodes", "value", "--nodes only with a node profile or a model with --hw", std::to_string(nodes));
  }
}

// A model, with its states set against --hw when given.
void show_model(const po::variables_map& vm, const std::string& name, const Json& document, const std::string& origin, int nodes, bool as_json) {
  std::vector<std::string> defaults;
  const auto m = origin.empty() ? model::load_model(name, "show", &defaults) : model::parse_model(document, origin);
  ModelReportOptions report;
  report.seq_len = parse_token_count(vm["seq"].as<std::string>(), "--seq");
  report.precision = model::precision_policy(vm["precision"].as<std::string>());
  report.nodes = nodes;
  std::optional<hw::NodeProfile> node;
  if (vm.count("hw")) {
    node = hw::load_node(vm["hw"].as<std::string>(), "--hw");
    check_node_count(nodes, *node);
    report.hw = &*node;
  } else if (nodes != 1) {
    throw InputError("--nodes", "value", "--nodes with a model only together with --hw", std::to_string(nodes));
  }
  if (as_json) {
    Json out = model_json(m, report);
    if (!defaults.empty()) out["defaults_used"] = defaults;
    std::cout << out.dump(2) << "\n";
    return;
  }
  if (!defaults.empty()) {
    std::cout << "custom model: defaults used for";
    for (const auto& d : defaults) std::cout << " " << d;
    std::cout << "\n\n";
  }
  print_model(std::cout, m, report);
}

po::options_description show_options() {
  po::options_description options("show options");
  // clang-format off
  options.add_options()
      ("name", po::value<std::string>()->value_name("name|path"), "a built-in GPU, node or model name, custom:..., or a JSON file")
      ("hw", po::value<std::string>()->value_name("name|path"), "with a model: set its states against this node profile")
      ("nodes", po::value<int>()->default_value(1)->value_name("int"), "number of nodes (cluster of identical nodes)")
      ("seq", po::value<std::string>()->default_value("4K")->value_name("tokens"), "sequence length for attention FLOPs (e.g. 32K, 1M)")
      ("precision", po::value<std::string>()->default_value("bf16-mixed")->value_name("name"), "precision policy for model states (trainyard list precisions)")
      ("json", po::bool_switch(), "print JSON instead of text");
  // clang-format on
  return options;
}

}  // namespace

int run_show(const std::vector<std::string>& args) {
  po::options_description options = show_options();
  po::positional_options_description positional;
  positional.add("name", 1);
  po::variables_map vm;
  if (parse(args, "trainyard show <name|path> [--hw NODE] [--nodes N] [--seq S] [--precision P] [--json]", options, positional, vm)) {
    return 0;
  }
  if (!vm.count("name")) throw InputError("show", "name", "a GPU, node or model name or a JSON path", "nothing");
  const std::string name = vm["name"].as<std::string>();
  const bool as_json = vm["json"].as<bool>();
  const int nodes = vm["nodes"].as<int>();
  check_node_count(nodes);
  Json document;
  std::string origin;
  const Kind kind = kind_of(name, document, origin);
  check_flags_for(kind, vm, nodes);
  if (kind == Kind::gpu) {
    const auto gpu = origin.empty() ? hw::load_gpu(name) : hw::gpu_from_document(document, origin);
    if (as_json) std::cout << gpu_json(gpu).dump(2) << "\n";
    else print_gpu(std::cout, gpu);
  } else if (kind == Kind::node) {
    const auto node = origin.empty() ? hw::load_node(name) : hw::node_from_document(document, origin);
    check_node_count(nodes, node);
    if (as_json) std::cout << node_json(node, nodes).dump(2) << "\n";
    else print_node(std::cout, node, nodes);
  } else {
    show_model(vm, name, document, origin, nodes, as_json);
  }
  return 0;
}

}  // namespace trainyard::app
