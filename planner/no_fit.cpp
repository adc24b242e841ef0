#include "planner/no_fit.hpp"

#include <algorithm>

#include "common/units.hpp"

namespace trainyard::planner {

namespace {

constexpr const char* kHbm = "HBM per GPU";
constexpr const char* kDram = "host DRAM per node";

// Memory misses first, by shortfall; then misses that are not about memory.
bool closer(const PlanMetrics& a, const PlanMetrics& b) {
  if (a.short_of.empty() != b.short_of.empty()) return !a.short_of.empty();
  return a.shortfall_bytes < b.shortfall_bytes;
}

void keep_closer(std::optional<RankedPlan>& slot, const RankedPlan& miss) {
  if (!slot || closer(miss.metrics, slot->metrics)) slot = miss;
}

}  // namespace

RankedPlan bound_miss(const PlanSpec& spec, const Bounds& b, double hbm_usable_bytes, double dram_capacity_bytes) {
  const double hbm_short = b.hbm_bytes - hbm_usable_bytes, dram_short = b.dram_bytes - dram_capacity_bytes;
  const std::string hbm_text = "needs at least " + format_bytes(b.hbm_bytes) + " of HBM per GPU, " + format_bytes(hbm_usable_bytes) + " usable";
  const std::string dram_text = "needs at least " + format_bytes(b.dram_bytes) + " of host DRAM per node, the node has " +
                                format_bytes(dram_capacity_bytes);
  PlanMetrics m;
  m.bound_only = true;
  const bool dram = dram_short > hbm_short;
  m.short_of = dram ? kDram : kHbm;
  m.shortfall_bytes = static_cast<std::int64_t>(std::max(0.0, dram ? dram_short : hbm_short));
  m.failure = dram ? dram_text : hbm_text;
  if ((dram ? hbm_short : dram_short) > 0) m.failure += " (and " + (dram ? hbm_text : dram_text) + ")";
  return RankedPlan{spec, m, b};
}

void note_miss(SearchReport& report, RankedPlan miss) {
  const auto [slot, added] = report.closest_miss_by_scheme.try_emplace(miss.spec.scheme, miss);
  if (!added && closer(miss.metrics, slot->second.metrics)) slot->second = miss;
  keep_closer(report.closest_miss, miss);
}

namespace {

// "(summary): failure; short by X of memory"
std::string miss_details(const RankedPlan& miss) {
  const PlanMetrics& m = miss.metrics;
  std::string text = "(" + miss.spec.summary() + "): " + m.failure;
  if (!m.short_of.empty()) {
    text += "; short by " + std::string(m.bound_only ? "at least " : "") + format_bytes(static_cast<double>(m.shortfall_bytes)) + " of " + m.short_of;
  }
  return text;
}

}  // namespace

std::string describe_miss(const RankedPlan& miss) { return miss.spec.scheme + " " + miss_details(miss); }

std::int64_t global_batch_needed(const StepInputs& in, const std::string& scheme) {
  if (!enumerate_plans(in, {scheme}).empty()) return 0;
  // Only multiples of a divisor of the GPU count can split evenly over some data-parallel degree.
  const std::int64_t batch = in.workload.global_batch;
  std::vector<std::int64_t> tries;
  for (int d : divisors(in.cluster.gpus())) tries.push_back((batch / d + 1) * d);
  std::sort(tries.begin(), tries.end());
  for (std::int64_t b : tries) {
    const StepInputs more{in.model, in.cluster, {in.workload.seq_len, b}, in.precision};
    if (!enumerate_plans(more, {scheme}).empty()) return b;
  }
  return 0;
}

std::string SchemeNoFit::reason() const {
  if (configurations == 0 && not_runnable > 0) {
    return scheme + ": none of its " + std::to_string(not_runnable) + " configurations is one " + runnable_keeps;
  }
  if (configurations == 0 && valid_global_batch > 0) {
    return scheme + ": no valid configuration with this batch: each of its data-parallel ranks takes whole sequences; --global-batch " +
           std::to_string(valid_global_batch) + " gives it some";
  }
  if (configurations == 0) {
    return scheme +
           ": no valid configuration for this model, cluster and sequence (e.g. a sequence its chunks or heads do not divide; no larger "
           "--global-batch helps)";
  }
  const std::string count = std::to_string(configurations) + " configuration" + (configurations == 1 ? "" : "s");
  if (interrupted) {
    return scheme + ": its " + count + " were not all tried (interrupted)" + (closest ? "; closest so far " + miss_details(*closest) : "");
  }
  if (!closest) return scheme + ": none of its " + count + " was simulated (over the memory budget)";
  return scheme + ": none of its " + count + " fits; closest " + miss_details(*closest);
}

std::vector<SchemeNoFit> schemes_without_fit(const SearchReport& report, const std::vector<std::string>& schemes, const StepInputs& in) {
  std::vector<SchemeNoFit> out;
  for (const auto& scheme : schemes) {
    const bool fits = std::any_of(report.best_of_scheme.begin(), report.best_of_scheme.end(),
                                  [&](const RankedPlan& p) { return p.spec.scheme == scheme; });
    if (fits) continue;
    SchemeNoFit s{scheme, 0, 0, report.runnable_keeps, 0, std::nullopt, report.interrupted};
    if (const auto n = report.enumerated_by_scheme.find(scheme); n != report.enumerated_by_scheme.end()) s.configurations = n->second;
    if (const auto n = report.not_runnable_by_scheme.find(scheme); n != report.not_runnable_by_scheme.end()) s.not_runnable = n->second;
    if (const auto c = report.closest_miss_by_scheme.find(scheme); c != report.closest_miss_by_scheme.end()) s.closest = c->second;
    if (s.configurations == 0 && s.not_runnable == 0) s.valid_global_batch = global_batch_needed(in, scheme);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace trainyard::planner
