#pragma once
// How `list` and `show` present profiles and models: as JSON (--json) and as text for people.
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "hwprofiles/node.hpp"
#include "models/model.hpp"

namespace trainyard::app {

struct ModelReportOptions {
  std::int64_t seq_len = 4096;
  model::PrecisionPolicy precision;
  const hw::NodeProfile* hw = nullptr;  // when given, model states are set against this hardware
  int nodes = 1;
};

nlohmann::json gpu_json(const hw::GpuProfile& gpu);
nlohmann::json node_json(const hw::NodeProfile& node, int nodes);
nlohmann::json model_json(const model::ModelConfig& model, const ModelReportOptions& options);

void print_gpu(std::ostream& out, const hw::GpuProfile& gpu);
void print_node(std::ostream& out, const hw::NodeProfile& node, int nodes);
void print_model(std::ostream& out, const model::ModelConfig& model, const ModelReportOptions& options);

}  // namespace trainyard::app
