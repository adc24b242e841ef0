#pragma once
// Transfers as fluid flows over shared resources (a link direction, or a half-duplex link such as host DRAM).
// Active flows share resources max-min fairly (progressive filling); whenever a flow starts or ends, the rates
// of the flows connected to it through shared resources (its component) are recomputed, and only the flows
// whose rate changed get a new completion time. Rates are in bytes/ns (= GB/s).
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

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

  // The flows whose completion time changed in the last start()/finish() (the started flow included).
  const std::vector<int>& changed() const { return changed_; }
  std::int64_t completion_ns(int flow) const { return flows_[static_cast<std::size_t>(flow)].completion_ns; }
  std::uint32_t version(int flow) const { return flows_[static_cast<std::size_t>(flow)].version; }
  std::int32_t owner(int flow) const { return flows_[static_cast<std::size_t>(flow)].owner; }
  double rate(int flow) const { return flows_[static_cast<std::size_t>(flow)].rate; }
  int active_flows() const { return active_; }

  // Accounting, per resource, up to `now_ns` (call settle(now) first for exact figures mid-run).
  void settle(std::int64_t now_ns);
  double bytes_moved(int resource) const { return resources_[static_cast<std::size_t>(resource)].bytes_moved; }
  std::int64_t busy_ns(int resource) const { return resources_[static_cast<std::size_t>(resource)].busy_ns; }
  double load(int resource) const;  // current sum of rates through it
  double capacity(int resource) const { return resources_[static_cast<std::size_t>(resource)].capacity; }
  int resource_count() const { return static_cast<int>(resources_.size()); }
  // Resources whose load changed in the last start()/finish(), for the link-usage trace.
  const std::vector<int>& touched_resources() const { return touched_resources_; }

 private:
  struct Flow {
    std::array<std::int32_t, kMaxHops> hop{};      // resources on the route
    std::array<std::int32_t, kMaxHops> slot{};     // position of this flow in each resource's flow list
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
    double remaining_capacity = 0;  // progressive-filling scratch
    std::int32_t unfrozen = 0;      // progressive-filling scratch
    std::uint32_t mark = 0;
  };

  void collect_component(int seed_flow, std::span<const std::int32_t> seed_resources);
  void advance(Flow& f, std::int64_t now_ns);
  void fill_rates();
  void publish(std::int64_t now_ns);

  std::vector<Flow> flows_;
  std::vector<int> free_ids_;
  std::vector<Resource> resources_;
  std::vector<int> component_flows_;
  std::vector<int> component_resources_;
  std::vector<int> changed_;
  std::vector<int> touched_resources_;
  std::uint32_t epoch_ = 0;
  int active_ = 0;
};

}  // namespace trainyard::sim
