#pragma once
// Hot switching (seed 004, HotSPa): moving the model's parameters and gradients from the layout of one strategy
// to another's. A layout says, for every unit of the model (each layer, the embedding, the LM head), which GPUs
// hold which fraction of it; the switch plan is the seed's Algorithm 1 over the slices where two layouts differ.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/plan.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::planner {

// The fraction [begin, end) of a unit that `holders` each keep a copy of. Tensor parallelism and ZeRO shard every
// tensor of a unit the same way, so a 1-D fraction is enough to intersect two layouts' shards.
struct Shard {
  double begin = 0, end = 1;
  std::vector<sim::DeviceId> holders;  // ascending
};
struct StateLayout {
  // units[u] partitions [0, 1) in order. Units: layers 0..L-1, then the embedding (L), then the untied LM head
  // (L + 1, with the final norm; absent when tied).
  std::vector<std::vector<Shard>> units;
};

// Where each GPU keeps its bf16 parameters, and where the gradient accumulated over a group sits once the group's
// own data-parallel reduction is done: Megatron (TP shards of each layer on the pipeline stage that runs it, every
// data-parallel replica a copy), ZeRO-family schemes (a full copy everywhere, or 1/N each from stage 3 for
// parameters and stage 2 for gradients), ring-track (each layer on its ring position in every replica).
// Offloaded copies in host DRAM are counted as their GPU's (the switch then also crosses PCIe, not modelled).
StateLayout parameter_layout(const StepInputs& in, const PlanSpec& spec);
StateLayout gradient_layout(const StepInputs& in, const PlanSpec& spec);
// What the schemes' own layouts (their HotSPa facets' `layout`, in planner/schemes/NAME/layout.cpp) are made of:
// the units of a model (its layers, the embedding, the untied LM head), every unit held whole by `holders(unit)`,
// or every unit cut into `gpus` equal shards, GPU g holding shard g (ZeRO's flat partition).
int unit_count(const model::ModelConfig& m);
StateLayout whole(const model::ModelConfig& m, const std::function<std::vector<sim::DeviceId>(int)>& holders);
StateLayout sharded(const model::ModelConfig& m, int gpus);
// Bytes of each unit at `bytes_per_param` (the layouts' unit order).
std::vector<std::int64_t> unit_bytes(const model::ModelConfig& model, double bytes_per_param);

struct Transfer {
  int unit = 0;
  double begin = 0, end = 0;
  std::int64_t bytes = 0;
  sim::DeviceId src = 0, dst = 0;
  bool inter_node = false;
};
struct SwitchPlan {
  std::vector<Transfer> transfers;
  std::vector<std::int64_t> intra_send_bytes, inter_send_bytes;  // per GPU
  std::int64_t bytes() const;
};

// Algorithm 1 (seed 004): for each slice (the common refinement of both layouts' shards, unit by unit) and each
// destination that does not already hold it, send it from a holder on the destination's node with the least
// intra-node volume sent so far, else from the holder with the least inter-node volume sent so far (ties: the
// lower GPU). Links are full duplex, so balancing what each GPU sends balances the switch.
SwitchPlan plan_switch(const StateLayout& from, const StateLayout& to, const std::vector<std::int64_t>& unit_bytes, int gpus_per_node, int gpus);

// The plan's transfers as sends (one per source and destination, on a comm stream of its own per destination so a
// GPU's sends proceed together, as in one batched NCCL group), each after `after` when given.
void add_switch_sends(sim::TaskGraph& graph, const SwitchPlan& plan, const std::string& prefix, const std::vector<sim::TaskId>& after = {});

}  // namespace trainyard::planner
