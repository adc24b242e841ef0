#include "planner/switching.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "common/error.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

int unit_count(const model::ModelConfig& m) { return static_cast<int>(m.layers) + (m.tied_embeddings ? 1 : 2); }

// Every unit held whole by `holders(unit)`.
StateLayout whole(const model::ModelConfig& m, const std::function<std::vector<sim::DeviceId>(int)>& holders) {
  StateLayout layout;
  for (int u = 0; u < unit_count(m); ++u) {
    auto h = holders(u);
    std::sort(h.begin(), h.end());
    h.erase(std::unique(h.begin(), h.end()), h.end());
    layout.units.push_back({Shard{0, 1, h}});
  }
  return layout;
}

// Every unit cut into `gpus` equal shards, GPU g holding shard g (ZeRO's flat partition).
StateLayout sharded(const model::ModelConfig& m, int gpus) {
  StateLayout layout;
  for (int u = 0; u < unit_count(m); ++u) {
    std::vector<Shard> shards;
    for (int g = 0; g < gpus; ++g) shards.push_back({double(g) / gpus, double(g + 1) / gpus, {g}});
    layout.units.push_back(std::move(shards));
  }
  return layout;
}

namespace {

StateLayout layout(const StepInputs& in, const PlanSpec& spec, bool gradients) {
  check_plan(in, spec);
  return hotspa_facet(spec).layout(in, spec, gradients);
}

// The holders of the shard of `unit` that contains the point x.
const Shard& shard_at(const StateLayout& layout, int unit, double x) {
  const auto& shards = layout.units[unit];
  for (const auto& s : shards) {
    if (x >= s.begin && x < s.end) return s;
  }
  return shards.back();
}

}  // namespace

StateLayout parameter_layout(const StepInputs& in, const PlanSpec& spec) { return layout(in, spec, false); }
StateLayout gradient_layout(const StepInputs& in, const PlanSpec& spec) { return layout(in, spec, true); }

std::vector<std::int64_t> unit_bytes(const model::ModelConfig& model, double bytes_per_param) {
  const auto c = model.param_counts();
  std::vector<std::int64_t> bytes(static_cast<std::size_t>(model.layers), std::llround(c.per_layer() * bytes_per_param));
  if (model.tied_embeddings) {
    bytes.push_back(std::llround((c.embedding + c.final_norm) * bytes_per_param));
  } else {
    bytes.push_back(std::llround(c.embedding * bytes_per_param));
    bytes.push_back(std::llround((c.lm_head + c.final_norm) * bytes_per_param));
  }
  return bytes;
}

std::int64_t SwitchPlan::bytes() const {
  std::int64_t total = 0;
  for (const auto& t : transfers) total += t.bytes;
  return total;
}

SwitchPlan plan_switch(const StateLayout& from, const StateLayout& to, const std::vector<std::int64_t>& unit_bytes, int gpus_per_node, int gpus) {
  TRAINYARD_CHECK(from.units.size() == to.units.size() && from.units.size() == unit_bytes.size(), "layouts of different models");
  SwitchPlan plan;
  plan.intra_send_bytes.assign(static_cast<std::size_t>(gpus), 0);
  plan.inter_send_bytes.assign(static_cast<std::size_t>(gpus), 0);
  auto node = [&](sim::DeviceId g) { return g / gpus_per_node; };
  for (std::size_t u = 0; u < unit_bytes.size(); ++u) {
    // The slices: both layouts' shard boundaries, merged.
    std::vector<double> cuts{0, 1};
    for (const auto& s : from.units[u]) cuts.push_back(s.begin);
    for (const auto& s : to.units[u]) cuts.push_back(s.begin);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end(), [](double a, double b) { return std::abs(a - b) < 1e-12; }), cuts.end());
    const double size = static_cast<double>(unit_bytes[u]);
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      const double a = cuts[i], b = cuts[i + 1], mid = (a + b) / 2;
      // Rounding the ends (not the width) makes a unit's slices add up to its bytes exactly.
      const std::int64_t bytes = std::llround(b * size) - std::llround(a * size);
      if (bytes <= 0) continue;
      const auto& sources = shard_at(from, static_cast<int>(u), mid).holders;
      TRAINYARD_CHECK(!sources.empty(), "a slice nobody holds");
      for (sim::DeviceId dst : shard_at(to, static_cast<int>(u), mid).holders) {
        if (std::binary_search(sources.begin(), sources.end(), dst)) continue;
        sim::DeviceId src = -1;
        for (sim::DeviceId s : sources) {  // intra-node first, least intra-node volume so far
          if (node(s) == node(dst) && (src < 0 || plan.intra_send_bytes[s] < plan.intra_send_bytes[src])) src = s;
        }
        const bool inter = src < 0;
        if (inter) {
          for (sim::DeviceId s : sources) {
            if (src < 0 || plan.inter_send_bytes[s] < plan.inter_send_bytes[src]) src = s;
          }
        }
        (inter ? plan.inter_send_bytes : plan.intra_send_bytes)[src] += bytes;
        plan.transfers.push_back({static_cast<int>(u), a, b, bytes, src, dst, inter});
      }
    }
  }
  return plan;
}

void add_switch_sends(sim::TaskGraph& graph, const SwitchPlan& plan, const std::string& prefix, const std::vector<sim::TaskId>& after) {
  std::map<std::pair<sim::DeviceId, sim::DeviceId>, std::int64_t> pairs;
  for (const auto& t : plan.transfers) pairs[{t.src, t.dst}] += t.bytes;
  for (const auto& [ends, bytes] : pairs) {
    graph.send(prefix + " gpu" + std::to_string(ends.first) + "->gpu" + std::to_string(ends.second), ends.first, ends.second, bytes, after,
               ends.second % 256);
  }
}

}  // namespace trainyard::planner
