// trainyard list: the built-in GPUs, nodes, models, strategies and precisions, as tables or JSON.
#include <iostream>
#include <utility>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/report.hpp"
#include "common/error.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/scheme.hpp"

namespace po = boost::program_options;
using Json = nlohmann::json;

namespace trainyard::app {

namespace {

void list_gpus(bool as_json, Json& out) {
  TextTable table({"name", "bf16 TFLOP/s", "HBM", "HBM GB/s", "PCIe", "NVLink GB/s/dir", "description"},
                  {false, true, true, true, false, true, false});
  for (const auto& name : hw::builtin_gpu_names()) {
    const auto gpu = hw::load_gpu(name);
    if (as_json) {
      out["gpus"].push_back(gpu_json(gpu));
      continue;
    }
    table.add_row({gpu.name, format_fixed(gpu.peak_tflops(hw::Dtype::bf16), 1), format_bytes(gpu.hbm_bytes.value),
                   format_fixed(gpu.hbm_GBps.value, 0), "Gen" + format_number(gpu.pcie_generation.value) + " x" + format_number(gpu.pcie_lanes.value),
                   format_fixed(gpu.nvlink_GBps_per_direction.value, 0), gpu.description});
  }
  if (!as_json) {
    std::cout << "GPUs\n";
    table.shorten_to_terminal(table.columns() - 1);  // the description
    table.print(std::cout);
  }
}

void list_nodes(bool as_json, Json& out) {
  TextTable table({"name", "GPUs", "host DRAM", "DRAM GB/s", "NVLink", "NIC GB/s/GPU", "description"},
                  {false, false, true, true, false, true, false});
  for (const auto& name : hw::builtin_node_names()) {
    const auto node = hw::load_node(name);
    if (as_json) {
      out["nodes"].push_back(node_json(node, 1));
      continue;
    }
    const bool nvlink = node.count(hw::VertexType::nvswitch) > 0;
    table.add_row({node.name, std::to_string(node.gpu_count()) + "x " + node.gpu.name, format_bytes(node.host_dram_bytes.value),
                   format_fixed(node.host_dram_GBps(), 1), nvlink ? "NVSwitch" : "none", format_fixed(node.nic_GBps_per_gpu(), 1), node.description});
  }
  if (!as_json) {
    std::cout << "nodes\n";
    table.shorten_to_terminal(table.columns() - 1);  // the description
    table.print(std::cout);
  }
}

void list_models(bool as_json, Json& out) {
  TextTable table({"name", "params", "layers", "hidden", "heads/kv", "ffn", "vocab", "description"},
                  {false, true, true, true, true, true, true, false});
  for (const auto& name : model::builtin_model_names()) {
    const auto m = model::load_model(name);
    if (as_json) {
      out["models"].push_back(model_json(m, {4096, model::precision_policy("bf16-mixed"), nullptr, 1}));
      continue;
    }
    table.add_row({m.name, format_count(m.params()), std::to_string(m.layers), std::to_string(m.hidden),
                   std::to_string(m.heads) + "/" + std::to_string(m.kv_heads), std::to_string(m.ffn_hidden), std::to_string(m.vocab), m.description});
  }
  if (!as_json) {
    std::cout << "models\n";
    table.shorten_to_terminal(table.columns() - 1);  // the description
    table.print(std::cout);
  }
}

void list_strategies(bool as_json, Json& out) {
  TextTable table({"name", "status", "description"});
  auto add = [&](const std::string& name, const std::string& status, const std::string& summary) {
    if (as_json) {
      out["strategies"].push_back({{"name", name}, {"summary", summary}, {"status", status}});
    } else {
      table.add_row({name, status, summary});
    }
  };
  for (const auto& name : planner::scheme_names()) add(name, "simulate --strategy, plan", planner::scheme_named(name).description);
  add("hotspa", "simulate --lengths ... --switch ..., plan --lengths ...", "HotSPa: per-length-group strategies with hot switching");
  if (!as_json) {
    std::cout << "strategies\n";
    table.shorten_to_terminal(table.columns() - 1);  // the description
    table.print(std::cout);
  }
}

void list_precisions(bool as_json, Json& out) {
  TextTable table({"name", "bytes/param", "description"}, {false, true, false});
  for (const auto& p : model::precision_policies()) {
    if (as_json) {
      out["precisions"].push_back({{"name", p.name},
                                   {"description", p.description},
                                   {"weight_bytes", p.weight_bytes},
                                   {"grad_bytes", p.grad_bytes},
                                   {"master_bytes", p.master_bytes},
                                   {"optimizer_bytes", p.optimizer_bytes}});
    } else {
      table.add_row({p.name, format_number(p.bytes_per_param()), p.description});
    }
  }
  if (!as_json) {
    std::cout << "precision policies\n";
    table.shorten_to_terminal(table.columns() - 1);  // the description
    table.print(std::cout);
  }
}

}  // namespace

int run_list(const std::vector<std::string>& args) {
  po::options_description options("list options");
  options.add_options()("what", po::value<std::string>()->default_value("all")->value_name("gpus|nodes|models|strategies|precisions|all"),
                        "what to list")("json", po::bool_switch(), "print JSON instead of tables");
  po::positional_options_description positional;
  positional.add("what", 1);
  po::variables_map vm;
  if (parse(args, "trainyard list [gpus|nodes|models|strategies|precisions] [--json]", options, positional, vm)) return 0;
  const std::string what = vm["what"].as<std::string>();
  const bool as_json = vm["json"].as<bool>();

  using Lister = void (*)(bool, Json&);
  const std::pair<const char*, Lister> listers[] = {
      {"gpus", list_gpus}, {"nodes", list_nodes}, {"models", list_models}, {"strategies", list_strategies}, {"precisions", list_precisions}};
  Json out = Json::object();
  bool matched = false;
  for (const auto& [name, lister] : listers) {
    if (what != "all" && what != name) continue;
    if (matched && !as_json) std::cout << "\n";
    matched = true;
    lister(as_json, out);
  }
  if (!matched) {
    throw InputError("list", "what", "one of gpus, nodes, models, strategies, precisions, all", "\"" + what + "\"");
  }
  if (as_json) std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace trainyard::app
