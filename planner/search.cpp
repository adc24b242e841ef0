#include "planner/search.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "common/error.hpp"
#include "common/memory_budget.hpp"
#include "common/thread_pool.hpp"
#include "common/units.hpp"
#include "planner/bounds.hpp"
#include "planner/estimate.hpp"
#include "planner/no_fit.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::planner {

namespace {

constexpr std::size_t kWave = 8;  // candidates simulated between pruning decisions (fixed: determinism)
constexpr std::int64_t kMinChunk = 1024, kMaxChunk = 256 * 1024;

}  // namespace

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

std::vector<std::int64_t> chunk_sizes(std::int64_t seq) {
  std::vector<std::int64_t> out;
  for (std::int64_t c = kMinChunk; c <= kMaxChunk && c <= seq; c *= 2) {
    if (seq % c == 0) out.push_back(c);
  }
  for (std::int64_t c = seq; c >= kMinChunk; c /= 2) {
    if (c <= kMaxChunk && seq % c == 0 && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    if (c % 2 != 0) break;
  }
  if (out.empty() && seq < kMinChunk) out.push_back(seq);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

bool valid(const StepInputs& in, const PlanSpec& spec) {
  try {
    check_plan(in, spec);
    return true;
  } catch (const InputError&) {
    return false;
  }
}

}  // namespace

Objective parse_objective(const std::string& name) {
  if (name == "throughput") return Objective::throughput;
  if (name == "max-seq") return Objective::max_seq;
  if (name == "min-hbm") return Objective::min_hbm;
  throw InputError("--objective", "value", "throughput, max-seq or min-hbm", "\"" + name + "\"");
}

// --- enumeration -------------------------------------------------------------------------------------------

std::vector<PlanSpec> enumerate_plans(const StepInputs& in, const std::vector<std::string>& schemes) {
  std::vector<PlanSpec> out;
  const AddPlan add = [&](PlanSpec spec) {
    if (valid(in, spec)) out.push_back(std::move(spec));
  };
  for (const auto& scheme : schemes) scheme_named(scheme, "--strategies").enumerate(in, add);
  return out;
}

// --- lower bounds ------------------------------------------------------------------------------------------

Bounds lower_bounds(const StepInputs& in, const PlanSpec& spec) {
  const BoundContext ctx(in, spec);
  const SchemeBounds own = scheme_named(spec.scheme).bounds(ctx, spec);
  const double compute_s = own.dense_s + ctx.best_attention_s(own.attention_recompute);
  Bounds b;
  b.hbm_bytes = own.hbm_bytes;
  b.dram_bytes = own.dram_bytes;
  b.step_s = std::max(compute_s + own.serial_copy_s, own.paced_s);
  return b;
}

// --- measuring a simulated plan ------------------------------------------------------------------------------

double usable_hbm_bytes(const sim::Cluster& cluster, double hbm_headroom) {
  return cluster.stack.allocatable_bytes(cluster.node.gpu.hbm_bytes.value * (1 - hbm_headroom));
}

PlanMetrics measure(const sim::SimResult& r, const StepInputs& in, double hbm_headroom) {
  PlanMetrics pm;
  const int gpus = in.cluster.gpus();
  const double usable = usable_hbm_bytes(in.cluster, hbm_headroom);
  for (int g = 0; g < gpus && g < static_cast<int>(r.pools.size()); ++g) {
    pm.peak_hbm_bytes = std::max(pm.peak_hbm_bytes, r.pools[g].peak_bytes);
  }
  for (std::size_t i = static_cast<std::size_t>(gpus); i < r.pools.size(); ++i)
    pm.peak_dram_bytes = std::max(pm.peak_dram_bytes, r.pools[i].peak_bytes);
  pm.step_s = static_cast<double>(r.step_ns) * 1e-9;
  if (!r.completed) {
    if (r.oom) {
      pm.failure = "out of memory in " + r.oom->pool + ": " + format_bytes(static_cast<double>(r.oom->excess_bytes)) + " over";
      pm.shortfall_bytes = r.oom->excess_bytes;
      pm.short_of = r.oom->pool.ends_with("dram") ? "host DRAM per node" : "HBM per GPU";
    } else {
      pm.failure = r.stuck.empty() ? "did not finish" : r.stuck;
    }
    return pm;
  }
  if (static_cast<double>(pm.peak_hbm_bytes) > usable) {
    pm.failure = "peak HBM " + format_bytes(static_cast<double>(pm.peak_hbm_bytes)) + " exceeds the " + format_bytes(usable) +
                 " left for tensors after the HBM headroom and what the " + in.cluster.stack.name + " stack reserves";
    pm.shortfall_bytes = static_cast<std::int64_t>(static_cast<double>(pm.peak_hbm_bytes) - usable);
    pm.short_of = "HBM per GPU";
    return pm;
  }
  pm.fits = true;
  pm.tokens_per_s = static_cast<double>(in.workload.tokens()) / pm.step_s;
  pm.mfu = r.mfu();
  pm.hfu = r.hfu();
  double busy_ns = 0;
  for (const auto& s : r.streams) {
    if (!sim::is_host(s.device) && s.stream.kind == sim::StreamKind::compute) busy_ns += static_cast<double>(s.busy_ns);
  }
  double exposed_ns = 0;
  for (auto e : r.exposed_transfer_ns) exposed_ns += static_cast<double>(e);
  pm.compute_s = busy_ns / gpus * 1e-9;
  pm.exposed_transfer_s = exposed_ns / gpus * 1e-9;
  pm.bubble_s = std::max(0.0, pm.step_s - pm.compute_s - pm.exposed_transfer_s);
  pm.recompute_s = r.hardware_flops > 0 ? pm.compute_s * (r.hardware_flops - r.model_flops) / r.hardware_flops : 0;
  // The busiest link by time with traffic, as a fraction of the step.
  const sim::LinkUsage* busiest = nullptr;
  for (const auto& link : r.links) {
    if (!busiest || link.busy_ns > busiest->busy_ns) busiest = &link;
  }
  if (busiest) {
    pm.busiest_link = busiest->name + " busy " + format_fixed(100.0 * static_cast<double>(busiest->busy_ns) / static_cast<double>(r.step_ns), 0) +
                      "%";
  }
  const double idle = pm.exposed_transfer_s + pm.bubble_s;
  if (idle < 0.15 * pm.step_s) {
    pm.bottleneck = "compute";
  } else if (pm.bubble_s >= pm.exposed_transfer_s) {
    pm.bottleneck = "bubble";
  } else if (busiest && busiest->type == hw::LinkType::dram) {
    pm.bottleneck = "DRAM";
  } else if (busiest && busiest->type == hw::LinkType::pcie) {
    pm.bottleneck = "PCIe";
  } else {
    pm.bottleneck = "link";
  }
  return pm;
}

nlohmann::json metrics_json(const PlanMetrics& m) {
  return {{"fits", m.fits},
          {"step_s", m.step_s},
          {"tokens_per_s", m.tokens_per_s},
          {"mfu", m.mfu},
          {"hfu", m.hfu},
          {"peak_hbm_bytes", m.peak_hbm_bytes},
          {"peak_dram_bytes", m.peak_dram_bytes},
          {"compute_s", m.compute_s},
          {"exposed_transfer_s", m.exposed_transfer_s},
          {"bubble_s", m.bubble_s},
          {"recompute_s", m.recompute_s},
          {"bottleneck", m.bottleneck},
          {"busiest_link", m.busiest_link}};
}

namespace {
sim::SimResult simulate_built(sim::TaskGraph& graph, const StepInputs& in, const std::atomic<bool>* cancel) {
  graph.finalize();
  sim::SimOptions options;
  options.record_memory = false;
  options.record_links = false;
  options.cancel = cancel;
  return sim::simulate(graph, in.cluster, options);
}
}  // namespace

sim::SimResult simulate_plan_step(const StepInputs& in, const PlanSpec& spec, const std::atomic<bool>* cancel) {
  sim::TaskGraph graph = build_plan(in, spec);
  return simulate_built(graph, in, cancel);
}

// --- the search ------------------------------------------------------------------------------------------------

namespace {

double objective_key(Objective o, const PlanMetrics& m) { return o == Objective::min_hbm ? static_cast<double>(m.peak_hbm_bytes) : m.step_s; }
double bound_key(Objective o, const Bounds& b) { return o == Objective::min_hbm ? b.hbm_bytes : b.step_s; }

bool cancelled(const SearchOptions& o) { return o.cancel && o.cancel->load(); }

struct Candidate {
  std::size_t index;
  Bounds bounds;
  double size;  // visits or attention blocks the graph has, roughly: what simulating it costs
};

// What the waves have found so far: the pruning decisions of the next wave read it.
struct WaveState {
  std::vector<double> found;                     // objective keys of fitting plans, sorted
  std::map<std::string, double> scheme_best;     // objective key of each scheme's best so far
  std::map<std::string, double> scheme_skipped;  // the best bound among each scheme's skipped candidates
  std::vector<RankedPlan> fitting;
};

// Best bound first; among equal bounds the cheaper simulation first, then the smaller memory bound (the likelier
// to fit: a scheme's plans can only be skipped once one of them fits).
void sort_by_bound(std::vector<Candidate>& alive, Objective objective) {
  std::stable_sort(alive.begin(), alive.end(), [&](const Candidate& a, const Candidate& b) {
    const double ka = bound_key(objective, a.bounds), kb = bound_key(objective, b.bounds);
    if (ka != kb) return ka < kb;
    if (a.size != b.size) return a.size < b.size;
    return a.bounds.hbm_bytes < b.bounds.hbm_bytes;
  });
}

// The bounds phase: each spec's graph size (into graph_bytes) and bounds. Specs too large for the budget, and (when
// pruning) those whose memory bounds cannot fit, are counted in the report and left out; the rest come back sorted by
// bound. Cancelled: report.interrupted, and nothing.
std::vector<Candidate> bounded_candidates(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs, std::int64_t budget,
                                          std::vector<double>& graph_bytes, SearchReport& report) {
  const double hbm_usable = usable_hbm_bytes(in.cluster, options.hbm_headroom);
  const double dram_capacity = in.cluster.node.host_dram_bytes.value;
  std::vector<Candidate> alive;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (options.bounds_progress && i % 16 == 0) options.bounds_progress(i, specs.size());
    if (cancelled(options)) {
      report.interrupted = true;
      return {};
    }
    // Too large to build here: skipped before its bounds (whose cost grows with the graph's) are computed.
    graph_bytes[i] = estimate_plan(in, specs[i]).bytes;
    if (graph_bytes[i] > static_cast<double>(budget)) {
      if (report.over_budget++ == 0 || graph_bytes[i] < report.smallest_over_budget_bytes) report.smallest_over_budget_bytes = graph_bytes[i];
      continue;
    }
    if (options.known_not_to_fit && options.known_not_to_fit(specs[i])) {
      ++report.pruned_memory;
      continue;
    }
    const Bounds b = lower_bounds(in, specs[i]);
    if (options.prune && (b.hbm_bytes > hbm_usable || b.dram_bytes > dram_capacity)) {
      ++report.pruned_memory;
      note_miss(report, bound_miss(specs[i], b, hbm_usable, dram_capacity));
      continue;
    }
    // The search cost only orders candidates whose bounds tie; nothing is decided on it.
    alive.push_back({i, b, scheme_named(specs[i].scheme).search_cost(in, specs[i])});
  }
  if (options.bounds_progress) options.bounds_progress(specs.size(), specs.size());
  sort_by_bound(alive, options.objective);
  return alive;
}

// The wave starting at alive[start], decided from the results of earlier waves only: the positions in `alive` to
// simulate; the others are pruned (counted, and their bounds kept in scheme_skipped).
std::vector<std::size_t> choose_wave(const SearchOptions& options, const std::vector<PlanSpec>& specs, const std::vector<Candidate>& alive,
                                     std::size_t start, WaveState& state, SearchReport& report) {
  const std::size_t top = static_cast<std::size_t>(std::max(1, options.top));
  std::vector<std::size_t> wave;
  for (std::size_t i = start; i < std::min(alive.size(), start + kWave); ++i) {
    const double key = bound_key(options.objective, alive[i].bounds);
    const std::string& scheme = specs[alive[i].index].scheme;
    const bool beaten_overall = state.found.size() >= top && key >= state.found[top - 1];
    const bool scheme_has_plan = state.scheme_best.count(scheme) > 0;
    if (options.prune && beaten_overall && scheme_has_plan) {
      ++report.pruned_time;
      auto [it, inserted] = state.scheme_skipped.emplace(scheme, key);
      if (!inserted) it->second = std::min(it->second, key);
    } else {
      wave.push_back(i);
    }
  }
  return wave;
}

// Simulates a wave's candidates on the pool, as many at once as fit in the budget together (the answer does not
// depend on it). A candidate whose built graph SearchOptions::runnable_graph refuses is not simulated: its entry
// stays empty and its spec goes to `refused`.
std::vector<RankedPlan> simulate_wave(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs,
                                      const std::vector<Candidate>& alive, const std::vector<std::size_t>& wave,
                                      const std::vector<double>& graph_bytes, MemoryGate& gate, ThreadPool& pool, std::vector<PlanSpec>& refused) {
  std::vector<RankedPlan> results(wave.size());
  std::vector<char> runnable(wave.size(), 1);
  pool.for_each(
      wave.size(),
      [&](std::size_t w) {
        const Candidate& c = alive[wave[w]];
        const PlanSpec& spec = specs[c.index];
        const MemoryGate::Hold hold(gate, graph_bytes[c.index]);
        if (options.before_simulate) options.before_simulate(spec);
        sim::TaskGraph graph = build_plan(in, spec);
        if (options.runnable_graph && !options.runnable_graph(in, spec, graph)) {
          runnable[w] = 0;
          return;
        }
        results[w] = {spec, measure(simulate_built(graph, in, options.cancel), in, options.hbm_headroom), c.bounds};
      },
      options.cancel);
  std::vector<RankedPlan> simulated;
  for (std::size_t w = 0; w < wave.size(); ++w) {
    if (runnable[w]) {
      simulated.push_back(std::move(results[w]));
    } else {
      refused.push_back(specs[alive[wave[w]].index]);
    }
  }
  return simulated;
}

// A wave's results into the state (the plans that fit) and the report (the misses).
void record_wave(std::vector<RankedPlan>& results, Objective objective, WaveState& state, SearchReport& report) {
  for (auto& r : results) {
    if (r.metrics.fits) {
      const double key = objective_key(objective, r.metrics);
      state.found.insert(std::upper_bound(state.found.begin(), state.found.end(), key), key);
      auto [it, inserted] = state.scheme_best.emplace(r.spec.scheme, key);
      if (!inserted) it->second = std::min(it->second, key);
      state.fitting.push_back(std::move(r));
    } else {
      report.simulated_misses.push_back(r.spec);
      note_miss(report, std::move(r));
    }
  }
}

// The simulations, wave by wave, pruning between waves (search.hpp).
void run_waves(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs, const std::vector<Candidate>& alive,
               const std::vector<double>& graph_bytes, std::int64_t budget, WaveState& state, SearchReport& report) {
  ThreadPool pool(options.threads);
  MemoryGate own_gate(static_cast<double>(budget));
  MemoryGate& gate = options.memory_gate != nullptr ? *options.memory_gate : own_gate;
  for (std::size_t start = 0; start < alive.size(); start += kWave) {
    if (cancelled(options)) {
      report.interrupted = true;
      break;
    }
    const std::vector<std::size_t> wave = choose_wave(options, specs, alive, start, state, report);
    std::vector<PlanSpec> refused;
    std::vector<RankedPlan> results = simulate_wave(in, options, specs, alive, wave, graph_bytes, gate, pool, refused);
    for (const PlanSpec& spec : refused) ++report.not_runnable_by_scheme[spec.scheme];
    // Ctrl-C: the wave's simulations that finished stay in the report (the best so far); those cut short or never
    // started are dropped.
    const bool stopped = cancelled(options);
    if (stopped) {
      report.interrupted = true;
      std::erase_if(results, [](const RankedPlan& r) { return r.spec.scheme.empty() || r.metrics.failure == "cancelled"; });
    }
    report.simulated += results.size();
    record_wave(results, options.objective, state, report);
    if (stopped || (options.stop_at_first_fit && !state.fitting.empty())) break;
    if (options.progress) options.progress(std::min(alive.size(), start + kWave) + report.pruned_memory, specs.size());
  }
}

// The fitting plans, best first, into the report, with each scheme's best and how far the candidates skipped for it
// could still be ahead (its gap).
void rank_fitting(WaveState& state, Objective objective, SearchReport& report) {
  std::vector<RankedPlan>& fitting = state.fitting;
  std::stable_sort(fitting.begin(), fitting.end(), [&](const RankedPlan& a, const RankedPlan& b) {
    return objective_key(objective, a.metrics) < objective_key(objective, b.metrics);
  });
  for (const auto& scheme : scheme_names()) {
    for (const auto& r : fitting) {
      if (r.spec.scheme == scheme) {
        report.best_of_scheme.push_back(r);
        const auto skipped = state.scheme_skipped.find(scheme);
        const double key = objective_key(objective, r.metrics);
        if (skipped != state.scheme_skipped.end() && skipped->second < key) {
          report.best_of_scheme.back().gap = (key - skipped->second) / key;
        }
        break;
      }
    }
  }
  report.ranked = std::move(fitting);
  if (!report.ranked.empty()) report.closest_miss.reset();
}

// Nothing fits, and some candidates were never tried for their size: the user has to change the inputs or the budget.
void refuse_if_only_over_budget(const SearchReport& report, const SearchOptions& options, std::int64_t budget) {
  if (report.ranked.empty() && report.over_budget > 0 && options.refuse_over_budget && !report.interrupted) {
    const std::size_t others = report.enumerated - report.over_budget;
    require_within_budget(estimate_tasks(report.smallest_over_budget_bytes / kBytesPerTask), budget,
                          "a plan whose step graph fits (" + std::to_string(report.over_budget) + " of " + std::to_string(report.enumerated) +
                              " candidates are larger" + (others ? "; none of the other " + std::to_string(others) + " fits" : "") + ")",
                          "fewer nodes, a smaller --global-batch or a shorter --seq");
  }
}

}  // namespace

// Bounds for every candidate, the simulations in waves, then the ranking.
SearchReport search(const StepInputs& in, const SearchOptions& options) {
  SearchReport report;
  std::vector<PlanSpec> specs = enumerate_plans(in, options.schemes);
  if (options.runnable) {
    std::erase_if(specs, [&](const PlanSpec& spec) {
      const bool out = !options.runnable(in, spec);
      if (out) ++report.not_runnable_by_scheme[spec.scheme];
      return out;
    });
  }
  report.enumerated = specs.size();
  for (const auto& spec : specs) ++report.enumerated_by_scheme[spec.scheme];
  const std::int64_t budget = options.memory_budget_bytes > 0 ? options.memory_budget_bytes : default_memory_budget_bytes();
  std::vector<double> graph_bytes(specs.size(), 0);
  const std::vector<Candidate> alive = bounded_candidates(in, options, specs, budget, graph_bytes, report);
  if (report.interrupted) return report;
  WaveState state;
  run_waves(in, options, specs, alive, graph_bytes, budget, state, report);
  rank_fitting(state, options.objective, report);
  refuse_if_only_over_budget(report, options, budget);
  return report;
}

std::optional<PlanSpec> quick_plan(const StepInputs& in, const std::string& scheme, double hbm_headroom) {
  const double hbm_usable = usable_hbm_bytes(in.cluster, hbm_headroom);
  const double dram_capacity = in.cluster.node.host_dram_bytes.value;
  std::optional<PlanSpec> best_fitting, least_hbm;
  double best_step = 0, least_hbm_bytes = 0;
  const double budget = static_cast<double>(default_memory_budget_bytes());
  for (auto& spec : enumerate_plans(in, {scheme})) {
    if (estimate_plan(in, spec).bytes > budget) continue;  // could not be simulated here; its bounds may be slow
    const Bounds b = lower_bounds(in, spec);
    if (!least_hbm || b.hbm_bytes < least_hbm_bytes) {
      least_hbm_bytes = b.hbm_bytes;
      least_hbm = spec;
    }
    if (b.hbm_bytes <= hbm_usable && b.dram_bytes <= dram_capacity && (!best_fitting || b.step_s < best_step)) {
      best_step = b.step_s;
      best_fitting = std::move(spec);
    }
  }
  return best_fitting ? best_fitting : least_hbm;
}

std::optional<MaxSeqResult> max_sequence(const StepInputs& in, const std::string& scheme, const SearchOptions& options) {
  SearchOptions probe = options;
  probe.schemes = {scheme};
  probe.objective = Objective::min_hbm;
  probe.top = 1;
  probe.progress = nullptr;
  probe.bounds_progress = nullptr;
  probe.refuse_over_budget = false;
  probe.stop_at_first_fit = true;
  // A configuration that did not fit at some length is not tried at longer ones: its memory only grows with the
  // sequence. Keyed by its summary, with the shortest length it missed at.
  std::map<std::string, std::int64_t> missed_at;
  std::int64_t probing = 0;
  auto missed_by = [&](const PlanSpec& spec, std::int64_t seq) {
    const auto it = missed_at.find(spec.summary());
    return it != missed_at.end() && it->second <= seq;
  };
  probe.known_not_to_fit = [&](const PlanSpec& spec) { return missed_by(spec, probing); };
  std::map<std::int64_t, bool> over_budget_at;  // per probed length: nothing fit, and some candidate was too large
  // At most 16 doublings (1K to 64M) and 16 halvings of the gap.
  constexpr std::size_t kMostProbes = 32;
  std::size_t probes = 0;
  // Whether some configuration fits at `seq`; nullopt when the scheme has no valid configuration there at all
  // (FPDT below its smallest chunk, say), which does not end the doubling. A length where every candidate is too
  // large for the memory budget counts as not fitting (and says so).
  auto fits_at = [&](std::int64_t seq) -> std::optional<bool> {
    const StepInputs at{in.model, in.cluster, {seq, in.workload.global_batch}, in.precision};
    probing = seq;
    SearchReport r = search(at, probe);
    for (const PlanSpec& miss : r.simulated_misses) {
      auto [it, inserted] = missed_at.emplace(miss.summary(), seq);
      if (!inserted) it->second = std::min(it->second, seq);
    }
    if (options.progress) options.progress(++probes, kMostProbes);
    if (r.enumerated == 0) return std::nullopt;
    over_budget_at[seq] = r.ranked.empty() && r.over_budget > 0;
    return !r.ranked.empty();
  };
  constexpr std::int64_t kStep = 1024, kLimit = std::int64_t{64} << 20, kResolutionDivisor = 64;
  std::int64_t good = 0, bad = 0;
  for (std::int64_t seq = kStep; seq <= kLimit; seq *= 2) {
    if (cancelled(options)) break;
    const auto fits = fits_at(seq);
    if (!fits) continue;
    if (!*fits) {
      if (good == 0) return std::nullopt;  // the shortest length it can run does not fit
      bad = seq;
      break;
    }
    good = seq;
  }
  if (good == 0) return std::nullopt;
  // To within 1/64 of the length (at least 1K): beyond that, the probes near the limit, where every candidate must
  // be simulated to show that none fits, cost more than the answer gains.
  while (bad != 0 && bad - good > std::max(kStep, good / kResolutionDivisor)) {
    if (cancelled(options)) break;
    const std::int64_t mid = (good + bad) / 2 / kStep * kStep;
    if (mid <= good) break;
    (fits_at(mid).value_or(false) ? good : bad) = mid;
  }
  // The best throughput plan at that length.
  const StepInputs at{in.model, in.cluster, {good, in.workload.global_batch}, in.precision};
  SearchOptions best = options;
  best.schemes = {scheme};
  best.objective = Objective::throughput;
  best.top = 1;
  best.progress = nullptr;
  best.bounds_progress = nullptr;
  best.refuse_over_budget = false;
  best.cancel = nullptr;  // one search at a length known to fit: finish it, so an interrupted probe still has a plan
  best.known_not_to_fit = [&](const PlanSpec& spec) { return missed_by(spec, good); };  // the probes simulated them
  SearchReport r = search(at, best);
  if (r.ranked.empty()) return std::nullopt;
  return MaxSeqResult{good, r.ranked.front(), bad != 0 && over_budget_at[bad]};
}

}  // namespace trainyard::planner
