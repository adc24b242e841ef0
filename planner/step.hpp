#pragma once
// What every scheme builder gets: the model, the cluster, the workload of one optimizer step, and the
// precision policy of the model states.
#include <cstdint>

#include "models/model.hpp"
#include "sim/cluster.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::planner {

struct Workload {
  std::int64_t seq_len = 0;       // tokens per sequence
  std::int64_t global_batch = 1;  // sequences per optimizer step
  std::int64_t tokens() const { return seq_len * global_batch; }
};

struct StepInputs {
  const model::ModelConfig& model;
  const sim::Cluster& cluster;
  Workload workload;
  model::PrecisionPolicy precision;
};

// The optimizer step's memory traffic per parameter, as the simulator counts it (sim/cost_model.hpp).
inline constexpr double kAdamBytesPerParam = sim::kAdamBytesPerParam;

}  // namespace trainyard::planner
