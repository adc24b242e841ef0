#pragma once
// Transfers as fluid flows over shared resources (a link direction, or a half-duplex link such as host DRAM).
// Active flows share resources max-min fairly (progressive filling). When a flow starts or ends, only the
// flows it can affect are recomputed: a change spreads from the flow's own resources through *saturated*
// resources only (an unsaturated resource bottlenecks nobody, so it passes nothing on). The flows reached are
// re-filled against the capacity the other flows leave them; if that would make a reached flow the loser on a
// newly saturated boundary resource, that resource's flows join and the filling is redone. The result is the
// exact max-min allocation, at a cost that follows the size of the bottleneck neighbourhood rather than the
// number of flows in flight. Only flows whose rate changed get a new completion time. Rates are in bytes/ns
// (= GB/s).
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "sim/event_queue.hpp"

namespace trainyard::sim {

class FlowNetwork {
 public:
  static constexpr int kMaxHops = 24;
  static constexpr double kUncapped = std::numeric_limits<double>::infinity();

  explicit FlowNetwork(std::vector<double> capacity_bytes_per_ns);

  // Starts a flow of `bytes` over `resources` (at most kMaxHops), at most `cap` bytes/ns (its copy engine).
  // Returns its id; ids are reused after finish().
  int start(std::span<const std::int32_t> resources, double bytes, double cap, std::int64_t now_ns, std::int32_t owner);
  void finish(int flow, std::int64_t now_ns);

  // The flows whose completion moved earlier in the last start()/finish() (a started flow included): they need
  // a new event. A flow whose completion moved later keeps its pending event; when it fires before
  // completion_ns(), push it again for completion_ns() with the same version.
  const std::vector<int>& changed() const { return changed_; }
  std::int64_t completion_ns(int flow) const { return flows_[flow].completion_ns; }
  std::uint32_t version(int flow) const { return flows_[flow].version; }
  std::int32_t owner(int flow) const { return flows_[flow].owner; }
  double rate(int flow) const { return flows_[flow].rate; }
  int active_flows() const { return active_; }

  // Accounting, per resource, up to `now_ns` (call settle(now) first for exact figures mid-run).
  void settle(std::int64_t now_ns);
  double bytes_moved(int resource) const { return resources_[resource].bytes_moved; }
  std::int64_t busy_ns(int resource) const { return resources_[resource].busy_ns; }
  double load(int resource) const;  // current sum of rates through it
  double capacity(int resource) const { return resources_[resource].capacity; }
  int resource_count() const { return static_cast<int>(resources_.size()); }
  // Work done so far, for the benchmarks: recomputations, flows and filling rounds they covered.
  struct Stats {
    std::uint64_t recomputes = 0, component_flows = 0, fill_rounds = 0, boundary_redos = 0, filling_steps = 0, filling_scans = 0,
                  max_active_flows = 0;
  };
  const Stats& stats() const { return stats_; }
  // Resources whose load changed in the last start()/finish(), for the link-usage trace.
  const std::vector<int>& touched_resources() const { return touched_resources_; }

 private:
  struct Flow {
    std::array<std::int32_t, kMaxHops> hop{};   // resources on the route
    std::array<std::int32_t, kMaxHops> slot{};  // position of this flow in each resource's flow list
    std::int32_t hops = 0;
    std::int32_t owner = -1;
    double remaining = 0;
    double rate = 0;
    double cap = kUncapped;
    double new_rate = 0;
    std::int64_t last_ns = 0;
    std::int64_t completion_ns = 0;
    std::uint32_t version = 0;
    std::uint32_t mark = 0;
    bool frozen = false;
    bool active = false;
  };
  struct Resource {
    double capacity = 0;
    std::vector<int> flows;
    double bytes_moved = 0;
    std::int64_t busy_ns = 0;
    std::int64_t busy_since = 0;
    double load = 0;                   // sum of the rates of its flows
    double remaining_capacity = 0;     // progressive-filling scratch
    double old_component_load = 0;     // scratch: the component's share of `load` before the change
    std::int32_t unfrozen = 0;         // scratch
    std::int32_t component_flows = 0;  // scratch
    std::uint32_t mark = 0;            // visited in this round
    std::uint32_t expanded = 0;        // all its flows joined this round
  };

  bool saturated(const Resource& r) const { return r.load >= r.capacity * (1 - 1e-9); }
  void visit(int resource);
  void expand(int resource);
  void close_component();
  bool boundary_violated();
  // Re-fills the flows a change can reach: `new_flow` (or -1) plus everything reachable from `expand_first`.
  void recompute(int new_flow, std::span<const std::int32_t> expand_first, std::int64_t now_ns);
  void advance(Flow& f, std::int64_t now_ns);
  void fill_rates();
  void publish(std::int64_t now_ns);

  std::vector<Flow> flows_;
  std::vector<int> free_ids_;
  std::vector<Resource> resources_;
  std::vector<int> component_flows_;
  std::vector<int> component_resources_;  // every resource a component flow crosses
  std::vector<int> expand_queue_;
  std::vector<int> active_resources_;  // filling scratch: resources with unfrozen flows
  std::vector<int> unfrozen_flows_;    // filling scratch
  std::vector<int> changed_;
  std::vector<int> touched_resources_;
  std::uint32_t epoch_ = 0;
  Stats stats_;
  int active_ = 0;
};

}  // namespace trainyard::sim
