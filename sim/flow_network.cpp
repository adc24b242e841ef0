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

double FlowNetwork::load(int resource) const { return resources_[resource].load; }

void FlowNetwork::advance(Flow& f, std::int64_t now_ns) {
  if (now_ns <= f.last_ns) return;
  const double moved = std::min(f.remaining, f.rate * static_cast<double>(now_ns - f.last_ns));
  f.remaining -= moved;
  for (int h = 0; h < f.hops; ++h) resources_[f.hop[h]].bytes_moved += moved;
  f.last_ns = now_ns;
}

void FlowNetwork::settle(std::int64_t now_ns) {
  for (auto& f : flows_) {
    if (f.active) advance(f, now_ns);
  }
}

void FlowNetwork::visit(int r) {
  Resource& res = resources_[r];
  if (res.mark == epoch_) return;
  res.mark = epoch_;
  res.old_component_load = 0;
  res.component_flows = 0;
  component_resources_.push_back(r);
}

// Every flow on `r` joins the component; their other resources are visited, and expanded when saturated.
void FlowNetwork::expand(int r) {
  visit(r);
  Resource& res = resources_[r];
  if (res.expanded == epoch_) return;
  res.expanded = epoch_;
  expand_queue_.push_back(r);
}

void FlowNetwork::close_component() {
  while (!expand_queue_.empty()) {
    const int r = expand_queue_.back();
    expand_queue_.pop_back();
    for (int f : resources_[r].flows) {
      Flow& flow = flows_[f];
      if (flow.mark == epoch_) continue;
      flow.mark = epoch_;
      component_flows_.push_back(f);
      for (int h = 0; h < flow.hops; ++h) {
        const int other = flow.hop[h];
        Resource& res = resources_[other];
        visit(other);
        res.old_component_load += flow.rate;
        ++res.component_flows;
        if (saturated(res)) expand(other);
      }
    }
  }
}

// Progressive filling of the component's flows against what the other flows leave on each resource: raise
// every unfrozen flow's rate together; a flow freezes at its own cap, or when a resource it crosses runs out
// (then every unfrozen component flow on that resource freezes at the share).
void FlowNetwork::fill_rates() {
  active_resources_.clear();
  for (int r : component_resources_) {
    Resource& res = resources_[r];
    res.remaining_capacity = res.capacity - (res.load - res.old_component_load);
    res.unfrozen = res.component_flows;
    if (res.unfrozen > 0) active_resources_.push_back(r);
  }
  unfrozen_flows_.assign(component_flows_.begin(), component_flows_.end());
  for (int f : component_flows_) flows_[f].frozen = false;
  auto freeze = [&](Flow& flow, double rate) {
    flow.frozen = true;
    flow.new_rate = rate;
    for (int h = 0; h < flow.hops; ++h) {
      Resource& res = resources_[flow.hop[h]];
      res.remaining_capacity -= rate;
      --res.unfrozen;
    }
  };
  // Both lists shrink as flows freeze (swap-remove while scanning), so later rounds scan less.
  while (!unfrozen_flows_.empty()) {
    double share = kUncapped;
    int bottleneck = -1;
    for (std::size_t i = 0; i < active_resources_.size();) {
      const int r = active_resources_[i];
      const Resource& res = resources_[r];
      if (res.unfrozen == 0) {
        active_resources_[i] = active_resources_.back();
        active_resources_.pop_back();
        continue;
      }
      const double s = std::max(0.0, res.remaining_capacity) / res.unfrozen;
      if (s < share || (s == share && r < bottleneck)) {
        share = s;
        bottleneck = r;
      }
      ++i;
    }
    double smallest_cap = kUncapped;
    for (std::size_t i = 0; i < unfrozen_flows_.size();) {
      const Flow& flow = flows_[unfrozen_flows_[i]];
      if (flow.frozen) {
        unfrozen_flows_[i] = unfrozen_flows_.back();
        unfrozen_flows_.pop_back();
        continue;
      }
      smallest_cap = std::min(smallest_cap, flow.cap);
      ++i;
    }
    if (unfrozen_flows_.empty()) break;
    ++stats_.filling_steps;
    stats_.filling_scans += active_resources_.size();
    if (smallest_cap <= share) {
      for (int f : unfrozen_flows_) {
        Flow& flow = flows_[f];
        if (!flow.frozen && flow.cap <= smallest_cap) freeze(flow, flow.cap);
      }
      continue;
    }
    TRAINYARD_CHECK(bottleneck >= 0, "a flow with neither a cap nor a resource");
    for (int f : resources_[bottleneck].flows) {
      Flow& flow = flows_[f];
      if (flow.mark == epoch_ && !flow.frozen) freeze(flow, share);
    }
  }
}

// A boundary resource (visited, not expanded) that the new rates saturate must not leave a component flow
// with less than an outside flow there: max-min gives the bottlenecked flow the largest share. If it would,
// the outside flows join and the filling is redone.
bool FlowNetwork::boundary_violated() {
  bool violated = false;
  const std::size_t count = component_resources_.size();
  for (std::size_t i = 0; i < count; ++i) {
    const int r = component_resources_[i];
    Resource& res = resources_[r];
    if (res.expanded == epoch_ || res.remaining_capacity > res.capacity * 1e-9) continue;
    double smallest_inside = kUncapped, largest_outside = 0;
    for (int f : res.flows) {
      const Flow& flow = flows_[f];
      if (flow.mark == epoch_) smallest_inside = std::min(smallest_inside, flow.new_rate);
      else largest_outside = std::max(largest_outside, flow.rate);
    }
    if (largest_outside > smallest_inside * (1 + 1e-9)) {
      expand(r);
      violated = true;
    }
  }
  if (violated) close_component();
  return violated;
}

void FlowNetwork::recompute(int new_flow, std::span<const std::int32_t> expand_first, std::int64_t now_ns) {
  ++epoch_;
  component_flows_.clear();
  component_resources_.clear();
  expand_queue_.clear();
  if (new_flow >= 0) {
    // The new flow joins alone; its resources pass the change on only where they are already saturated (or,
    // via the boundary check, where its share would undercut the flows already there).
    Flow& flow = flows_[new_flow];
    flow.mark = epoch_;
    component_flows_.push_back(new_flow);
    for (int h = 0; h < flow.hops; ++h) {
      visit(flow.hop[h]);
      ++resources_[flow.hop[h]].component_flows;
    }
    for (int h = 0; h < flow.hops; ++h) {
      if (saturated(resources_[flow.hop[h]])) expand(flow.hop[h]);
    }
  }
  for (int r : expand_first) expand(r);
  close_component();
  ++stats_.recomputes;
  do {
    fill_rates();
    ++stats_.fill_rounds;
  } while (boundary_violated() && ++stats_.boundary_redos);
  stats_.component_flows += component_flows_.size();
  for (int f : component_flows_) advance(flows_[f], now_ns);
  publish(now_ns);
}

void FlowNetwork::publish(std::int64_t now_ns) {
  changed_.clear();
  for (int f : component_flows_) {
    Flow& flow = flows_[f];
    const bool fresh = flow.completion_ns == 0;
    if (flow.new_rate == flow.rate && !fresh) continue;
    for (int h = 0; h < flow.hops; ++h) resources_[flow.hop[h]].load += flow.new_rate - flow.rate;
    flow.rate = flow.new_rate;
    TRAINYARD_CHECK(flow.rate > 0, "a flow got no bandwidth");
    const double duration_ns = std::ceil(flow.remaining / flow.rate);
    if (duration_ns > kMaxTimeNs - static_cast<double>(now_ns)) {
      throw InputError("a transfer would end after the simulator's time range (" + std::to_string(kMaxTimeNs) +
                       " ns, about 146 years): check the task sizes");
    }
    const std::int64_t completion = now_ns + static_cast<std::int64_t>(duration_ns);
    // Only an earlier completion needs a new event; a later one is found when the pending event fires early
    // and is pushed again then (see the engine), which saves heap traffic when rates only ever go down.
    const bool earlier = fresh || completion < flow.completion_ns;
    flow.completion_ns = completion;
    if (earlier) {
      ++flow.version;
      changed_.push_back(f);
    }
  }
  touched_resources_.assign(component_resources_.begin(), component_resources_.end());
}

int FlowNetwork::start(std::span<const std::int32_t> resources, double bytes, double cap, std::int64_t now_ns, std::int32_t owner) {
  TRAINYARD_CHECK(!resources.empty() && resources.size() <= static_cast<std::size_t>(kMaxHops), "flow route length out of range");
  int id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int>(flows_.size());
    flows_.emplace_back();
  }
  Flow& flow = flows_[id];
  flow.hops = static_cast<std::int32_t>(resources.size());
  flow.owner = owner;
  flow.remaining = bytes;
  flow.rate = 0;
  flow.cap = cap;
  flow.last_ns = now_ns;
  flow.completion_ns = 0;
  flow.active = true;
  ++active_;
  stats_.max_active_flows = std::max<std::uint64_t>(stats_.max_active_flows, static_cast<std::uint64_t>(active_));
  for (int h = 0; h < flow.hops; ++h) {
    Resource& res = resources_[resources[h]];
    flow.hop[h] = resources[h];
    flow.slot[h] = static_cast<std::int32_t>(res.flows.size());
    if (res.flows.empty()) res.busy_since = now_ns;
    res.flows.push_back(id);
  }
  // Fast path: a capped flow that fits under its cap on every resource takes nothing from anyone.
  bool fits = flow.cap < kUncapped;
  for (int h = 0; h < flow.hops && fits; ++h) {
    const Resource& res = resources_[flow.hop[h]];
    const auto uses = std::count(flow.hop.begin(), flow.hop.begin() + flow.hops, flow.hop[h]);  // DRAM twice
    fits = res.capacity - res.load >= static_cast<double>(uses) * flow.cap * (1 + 1e-12);
  }
  if (fits) {
    ++epoch_;
    component_flows_.assign(1, id);
    component_resources_.assign(flow.hop.begin(), flow.hop.begin() + flow.hops);
    flow.new_rate = flow.cap;
    publish(now_ns);
    return id;
  }
  recompute(id, {}, now_ns);
  return id;
}

void FlowNetwork::finish(int id, std::int64_t now_ns) {
  Flow& flow = flows_[id];
  TRAINYARD_CHECK(flow.active, "finishing a flow that is not active");
  advance(flow, now_ns);
  for (int h = 0; h < flow.hops; ++h) {
    Resource& res = resources_[flow.hop[h]];
    // Swap-remove, then fix the slot of the entry that moved (possibly this flow's own entry for another hop,
    // when a route crosses a half-duplex resource twice, e.g. GPU -> DRAM -> GPU staging).
    const std::int32_t slot = flow.slot[h];
    const auto last = static_cast<std::int32_t>(res.flows.size() - 1);
    const int moved = res.flows[last];
    res.flows[slot] = moved;
    res.flows.pop_back();
    flow.slot[h] = -1;  // removed: must not match the fix-up below when the route crosses `res` again
    Flow& other = flows_[moved];
    for (int k = 0; k < other.hops; ++k) {
      if (other.hop[k] == flow.hop[h] && other.slot[k] == last) {
        other.slot[k] = slot;
        break;
      }
    }
    if (res.flows.empty()) res.busy_ns += now_ns - res.busy_since;
  }
  // Only resources it saturated can have held other flows back: the change spreads from those alone (and if
  // there are none, nobody's rate changes).
  std::array<std::int32_t, kMaxHops> held_back{};
  std::size_t held = 0;
  for (int h = 0; h < flow.hops; ++h) {
    Resource& res = resources_[flow.hop[h]];
    if (saturated(res) && !res.flows.empty()) held_back[held++] = flow.hop[h];
  }
  for (int h = 0; h < flow.hops; ++h) resources_[flow.hop[h]].load -= flow.rate;
  for (int h = 0; h < flow.hops; ++h) {
    Resource& res = resources_[flow.hop[h]];
    if (res.flows.empty()) res.load = 0;  // no drift survives an idle moment
  }
  flow.active = false;
  flow.rate = 0;
  ++flow.version;
  --active_;
  free_ids_.push_back(id);
  if (held == 0) {
    changed_.clear();
    touched_resources_.assign(flow.hop.begin(), flow.hop.begin() + flow.hops);
    return;
  }
  recompute(-1, std::span<const std::int32_t>(held_back.data(), held), now_ns);
  touched_resources_.insert(touched_resources_.end(), flow.hop.begin(), flow.hop.begin() + flow.hops);
}

}  // namespace trainyard::sim
