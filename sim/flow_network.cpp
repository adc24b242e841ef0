#include "sim/flow_network.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"

namespace trainyard::sim {

FlowNetwork::FlowNetwork(std::vector<double> capacity_bytes_per_ns) {
  resources_.resize(capacity_bytes_per_ns.size());
  for (std::size_t i = 0; i < resources_.size(); ++i) {
    TRAINYARD_CHECK(capacity_bytes_per_ns[i] > 0, "a resource without capacity");
    resources_[i].capacity = capacity_bytes_per_ns[i];
  }
}

double FlowNetwork::load(int resource) const {
  double sum = 0;
  for (int f : resources_[static_cast<std::size_t>(resource)].flows) sum += flows_[static_cast<std::size_t>(f)].rate;
  return sum;
}

void FlowNetwork::advance(Flow& f, std::int64_t now_ns) {
  if (now_ns <= f.last_ns) return;
  const double moved = std::min(f.remaining, f.rate * static_cast<double>(now_ns - f.last_ns));
  f.remaining -= moved;
  for (int h = 0; h < f.hops; ++h) resources_[static_cast<std::size_t>(f.hop[h])].bytes_moved += moved;
  f.last_ns = now_ns;
}

void FlowNetwork::settle(std::int64_t now_ns) {
  for (auto& f : flows_) {
    if (f.active) advance(f, now_ns);
  }
}

// Breadth-first over "shares a resource with": the flows whose rates a change at the seed can affect.
void FlowNetwork::collect_component(int seed_flow, std::span<const std::int32_t> seed_resources) {
  ++epoch_;
  component_flows_.clear();
  component_resources_.clear();
  auto add_resource = [&](int r) {
    Resource& res = resources_[static_cast<std::size_t>(r)];
    if (res.mark == epoch_) return;
    res.mark = epoch_;
    component_resources_.push_back(r);
  };
  if (seed_flow >= 0) {
    flows_[static_cast<std::size_t>(seed_flow)].mark = epoch_;
    component_flows_.push_back(seed_flow);
  }
  for (int r : seed_resources) add_resource(r);
  for (std::size_t next_resource = 0, next_flow = 0;
       next_resource < component_resources_.size() || next_flow < component_flows_.size();) {
    if (next_resource < component_resources_.size()) {
      for (int f : resources_[static_cast<std::size_t>(component_resources_[next_resource])].flows) {
        Flow& flow = flows_[static_cast<std::size_t>(f)];
        if (flow.mark == epoch_) continue;
        flow.mark = epoch_;
        component_flows_.push_back(f);
      }
      ++next_resource;
    } else {
      const Flow& flow = flows_[static_cast<std::size_t>(component_flows_[next_flow])];
      for (int h = 0; h < flow.hops; ++h) add_resource(flow.hop[h]);
      ++next_flow;
    }
  }
}

// Progressive filling: raise every unfrozen flow's rate together; a flow freezes when it reaches its own cap
// or when a resource it crosses runs out (then every unfrozen flow on that resource freezes at the share).
void FlowNetwork::fill_rates() {
  for (int r : component_resources_) {
    Resource& res = resources_[static_cast<std::size_t>(r)];
    res.remaining_capacity = res.capacity;
    res.unfrozen = static_cast<std::int32_t>(res.flows.size());
  }
  for (int f : component_flows_) flows_[static_cast<std::size_t>(f)].frozen = false;
  std::size_t unfrozen = component_flows_.size();
  auto freeze = [&](Flow& flow, double rate) {
    flow.frozen = true;
    flow.new_rate = rate;
    --unfrozen;
    for (int h = 0; h < flow.hops; ++h) {
      Resource& res = resources_[static_cast<std::size_t>(flow.hop[h])];
      res.remaining_capacity -= rate;
      --res.unfrozen;
    }
  };
  while (unfrozen > 0) {
    double share = kUncapped;
    int bottleneck = -1;
    for (int r : component_resources_) {
      const Resource& res = resources_[static_cast<std::size_t>(r)];
      if (res.unfrozen == 0) continue;
      const double s = std::max(0.0, res.remaining_capacity) / res.unfrozen;
      if (s < share) {
        share = s;
        bottleneck = r;
      }
    }
    double smallest_cap = kUncapped;
    for (int f : component_flows_) {
      const Flow& flow = flows_[static_cast<std::size_t>(f)];
      if (!flow.frozen) smallest_cap = std::min(smallest_cap, flow.cap);
    }
    if (smallest_cap <= share) {
      for (int f : component_flows_) {
        Flow& flow = flows_[static_cast<std::size_t>(f)];
        if (!flow.frozen && flow.cap <= smallest_cap) freeze(flow, flow.cap);
      }
      continue;
    }
    TRAINYARD_CHECK(bottleneck >= 0, "a flow with neither a cap nor a resource");
    for (int f : resources_[static_cast<std::size_t>(bottleneck)].flows) {
      Flow& flow = flows_[static_cast<std::size_t>(f)];
      if (!flow.frozen) freeze(flow, share);
    }
  }
}

void FlowNetwork::publish(std::int64_t now_ns) {
  changed_.clear();
  for (int f : component_flows_) {
    Flow& flow = flows_[static_cast<std::size_t>(f)];
    if (flow.new_rate == flow.rate && flow.completion_ns != 0) continue;
    flow.rate = flow.new_rate;
    TRAINYARD_CHECK(flow.rate > 0, "a flow got no bandwidth");
    flow.completion_ns = now_ns + static_cast<std::int64_t>(std::ceil(flow.remaining / flow.rate));
    ++flow.version;
    changed_.push_back(f);
  }
  touched_resources_.assign(component_resources_.begin(), component_resources_.end());
}

int FlowNetwork::start(std::span<const std::int32_t> resources, double bytes, double cap, std::int64_t now_ns,
                       std::int32_t owner) {
  TRAINYARD_CHECK(!resources.empty() && resources.size() <= static_cast<std::size_t>(kMaxHops),
                  "flow route length out of range");
  int id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int>(flows_.size());
    flows_.emplace_back();
  }
  Flow& flow = flows_[static_cast<std::size_t>(id)];
  flow.hops = static_cast<std::int32_t>(resources.size());
  flow.owner = owner;
  flow.remaining = bytes;
  flow.rate = 0;
  flow.cap = cap;
  flow.last_ns = now_ns;
  flow.completion_ns = 0;
  flow.active = true;
  ++active_;
  // Progress of the neighbours up to now at their old rates, before they change.
  collect_component(-1, resources);
  for (int f : component_flows_) advance(flows_[static_cast<std::size_t>(f)], now_ns);
  for (int h = 0; h < flow.hops; ++h) {
    Resource& res = resources_[static_cast<std::size_t>(resources[h])];
    flow.hop[h] = resources[h];
    flow.slot[h] = static_cast<std::int32_t>(res.flows.size());
    if (res.flows.empty()) res.busy_since = now_ns;
    res.flows.push_back(id);
  }
  component_flows_.push_back(id);
  flow.mark = epoch_;
  fill_rates();
  publish(now_ns);
  return id;
}

void FlowNetwork::finish(int id, std::int64_t now_ns) {
  Flow& flow = flows_[static_cast<std::size_t>(id)];
  TRAINYARD_CHECK(flow.active, "finishing a flow that is not active");
  advance(flow, now_ns);
  for (int h = 0; h < flow.hops; ++h) {
    Resource& res = resources_[static_cast<std::size_t>(flow.hop[h])];
    // Swap-remove, then fix the slot of the entry that moved (possibly this flow's own entry for another hop,
    // when a route crosses a half-duplex resource twice, e.g. GPU -> DRAM -> GPU staging).
    const std::int32_t slot = flow.slot[h];
    const auto last = static_cast<std::int32_t>(res.flows.size() - 1);
    const int moved = res.flows[static_cast<std::size_t>(last)];
    res.flows[static_cast<std::size_t>(slot)] = moved;
    res.flows.pop_back();
    Flow& other = flows_[static_cast<std::size_t>(moved)];
    for (int k = 0; k < other.hops; ++k) {
      if (other.hop[k] == flow.hop[h] && other.slot[k] == last) {
        other.slot[k] = slot;
        break;
      }
    }
    if (res.flows.empty()) res.busy_ns += now_ns - res.busy_since;
  }
  flow.active = false;
  flow.rate = 0;
  ++flow.version;
  --active_;
  free_ids_.push_back(id);
  collect_component(-1, std::span<const std::int32_t>(flow.hop.data(), static_cast<std::size_t>(flow.hops)));
  for (int f : component_flows_) advance(flows_[static_cast<std::size_t>(f)], now_ns);
  fill_rates();
  publish(now_ns);
}

}  // namespace trainyard::sim
