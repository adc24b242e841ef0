#include "backend/measured.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "common/error.hpp"

namespace trainyard::backend {

namespace {

using Interval = std::pair<std::int64_t, std::int64_t>;

// Sorted, disjoint union of intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

std::int64_t total(const std::vector<Interval>& v) {
  std::int64_t sum = 0;
  for (const auto& [a, b] : v) sum += b - a;
  return sum;
}

}  // namespace

std::int64_t exposed_copy_ns(const sim::TaskGraph& graph, std::span<const sim::TaskTiming> timing, sim::DeviceId gpu) {
  TRAINYARD_CHECK(timing.size() == graph.size(), "one timing per task");
  std::vector<Interval> copies, compute;
  for (std::size_t i = 0; i < timing.size(); ++i) {
    const sim::Task& t = graph.task(static_cast<sim::TaskId>(i));
    if (t.device != gpu || timing[i].start_ns < 0) continue;
    const Interval span{timing[i].start_ns, timing[i].end_ns};
    if (t.kind() == sim::TaskKind::copy) copies.push_back(span);
    if (t.stream.kind == sim::StreamKind::compute && t.stream.index == 0) compute.push_back(span);
  }
  // Copy time minus the part covered by compute stream 0.
  const auto c = merged(std::move(copies)), busy = merged(std::move(compute));
  std::int64_t covered = 0;
  std::size_t j = 0;
  for (const auto& [a, b] : c) {
    while (j < busy.size() && busy[j].second <= a) ++j;
    for (std::size_t k = j; k < busy.size() && busy[k].first < b; ++k) covered += std::min(b, busy[k].second) - std::max(a, busy[k].first);
  }
  return total(c) - covered;
}

sim::SimResult measured_result(const sim::SimResult& predicted, const sim::TaskGraph& graph, std::span<const sim::TaskTiming> timing,
                               std::int64_t step_ns, std::int64_t peak_hbm_bytes) {
  sim::SimResult r = predicted;
  r.completed = true;
  r.oom.reset();
  r.stuck.clear();
  r.step_ns = step_ns;
  r.timing.assign(timing.begin(), timing.end());
  for (auto& pool : r.pools) pool.level.clear();
  if (!r.pools.empty()) r.pools.front().peak_bytes = peak_hbm_bytes;
  for (std::size_t p = 1; p < r.pools.size(); ++p) r.pools[p].peak_bytes = 0;  // not measured (see measured.hpp)
  r.links.clear();
  std::map<std::tuple<sim::DeviceId, sim::StreamKind, int>, std::vector<Interval>> busy;
  for (std::size_t i = 0; i < timing.size(); ++i) {
    const sim::Task& t = graph.task(static_cast<sim::TaskId>(i));
    if (timing[i].start_ns >= 0) busy[{t.device, t.stream.kind, t.stream.index}].push_back({timing[i].start_ns, timing[i].end_ns});
  }
  for (auto& s : r.streams) s.busy_ns = total(merged(busy[{s.device, s.stream.kind, s.stream.index}]));
  for (std::size_t g = 0; g < r.exposed_transfer_ns.size(); ++g)
    r.exposed_transfer_ns[g] = exposed_copy_ns(graph, timing, static_cast<sim::DeviceId>(g));
  r.events = 0;
  r.flow_recomputes = 0;
  r.mean_component_flows = 0;
  r.max_concurrent_flows = 0;
  r.engine_bytes = 0;
  return r;
}

}  // namespace trainyard::backend
