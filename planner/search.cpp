#include "planner/search.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>

#include "common/error.hpp"
#include "common/memory_budget.hpp"
#include "common/thread_pool.hpp"
#include "common/units.hpp"
#include "planner/analytic.hpp"
#include "planner/bounds.hpp"
#include "planner/estimate.hpp"
#include "planner/no_fit.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::planner {

namespace {

// Candidates simulated between pruning decisions (fixed, not the thread count: determinism). A search that stops at
// the first plan that fits (max_sequence's probes) takes smaller waves: most of its probes end with the first.
constexpr std::size_t kWave = 8, kFirstFitWave = 2;
std::size_t wave_size(const SearchOptions& o) { return o.stop_at_first_fit ? kFirstFitWave : kWave; }
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
double estimate_key(Objective o, const StepEstimate& e) { return o == Objective::min_hbm ? e.hbm_bytes : e.step_s; }

bool cancelled(const SearchOptions& o) { return o.cancel && o.cancel->load(); }

struct Candidate {
  std::size_t index;
  Bounds bounds;
  double size;                            // visits or attention blocks the graph has, roughly: what simulating it costs
  std::optional<StepEstimate> estimated;  // when pruning by the estimate
};

// The candidate's objective by the estimate; 0 when it has none (so that those sort together).
double estimate_of(const Candidate& c, Objective o) { return c.estimated ? estimate_key(o, *c.estimated) : 0; }

// What the waves have found so far: the pruning decisions of the next wave read it.
struct WaveState {
  std::vector<double> found;                     // objective keys of fitting plans, sorted
  std::map<std::string, double> scheme_best;     // objective key of each scheme's best so far
  std::map<std::string, double> scheme_skipped;  // the best floor among each scheme's skipped candidates
  std::vector<RankedPlan> fitting;
  // Pruning by the estimate, measured on these inputs: per scheme, how many simulated plans that fit it was
  // compared with and the most it was above one of them (estimate / simulation - 1); and the candidates (positions
  // in `alive`) the estimate alone ruled out, decided again once the waves are done (run_waves).
  struct Seen {
    std::size_t plans = 0;
    double most_over = 0;
  };
  std::map<std::string, Seen> over;
  std::vector<std::size_t> deferred;
};

// The estimate's error measured on the plans a search simulates replaces the corpus's once there are this many of a
// scheme, with this much added (the next plan may err a little further than any seen).
constexpr std::size_t kMarginSample = 8;
constexpr double kMarginSlack = 0.02;

// How far above the simulation the estimate is taken to err for `scheme` on these inputs (a fraction); nullopt
// when it is not to be trusted here. The corpus's margin (estimate_margin) until kMarginSample plans of the scheme
// were simulated, then the most it was above them plus kMarginSlack where that is less; not trusted once it was
// above one of them by more than the corpus's margin.
std::optional<double> margin_here(const WaveState& state, const std::string& scheme, Objective objective) {
  const EstimateMargin m = estimate_margin(scheme);
  const double corpus = objective == Objective::min_hbm ? m.hbm : m.step;
  const auto it = state.over.find(scheme);
  if (it == state.over.end()) return corpus;
  const WaveState::Seen& seen = it->second;
  if (seen.most_over > corpus) return std::nullopt;
  if (seen.plans < kMarginSample) return corpus;
  return std::min(corpus, std::max(seen.most_over, 0.0) + kMarginSlack);
}

// The least the simulation of `c` can report: its bound, or, pruning by the estimate, the estimate less its margin
// here where that is higher.
double floor_of(const Candidate& c, const std::string& scheme, Objective objective, bool by_estimate, const WaveState& state) {
  const double bound = bound_key(objective, c.bounds);
  if (!by_estimate || !c.estimated) return bound;
  const auto margin = margin_here(state, scheme, objective);
  return margin ? std::max(bound, estimate_of(c, objective) / (1 + *margin)) : bound;
}

void note_skipped(WaveState& state, const std::string& scheme, double floor) {
  auto [it, inserted] = state.scheme_skipped.emplace(scheme, floor);
  if (!inserted) it->second = std::min(it->second, floor);
}

// Best estimate first (all 0 when not pruning by it), then best bound; among equal ones the cheaper simulation first,
// then the smaller memory bound (the likelier to fit: a scheme's plans can only be skipped once one of them fits).
void sort_candidates(std::vector<Candidate>& alive, Objective objective) {
  std::stable_sort(alive.begin(), alive.end(), [&](const Candidate& a, const Candidate& b) {
    const double ea = estimate_of(a, objective), eb = estimate_of(b, objective);
    if (ea != eb) return ea < eb;
    const double ka = bound_key(objective, a.bounds), kb = bound_key(objective, b.bounds);
    if (ka != kb) return ka < kb;
    if (a.size != b.size) return a.size < b.size;
    return a.bounds.hbm_bytes < b.bounds.hbm_bytes;
  });
}

// The first `top` candidates by the estimate among those it says fit.
std::vector<EstimatedPlan> provisional_top(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs,
                                           const std::vector<Candidate>& alive) {
  const double hbm_usable = usable_hbm_bytes(in.cluster, options.hbm_headroom);
  std::vector<EstimatedPlan> top;
  for (const Candidate& c : alive) {
    if (top.size() >= static_cast<std::size_t>(std::max(1, options.top))) break;
    if (c.estimated && c.estimated->hbm_bytes <= hbm_usable) top.push_back({specs[c.index], *c.estimated});
  }
  return top;
}

// False when the estimate `e` of a plan of `scheme` shows it cannot fit even if it errs on the high side by its
// measured margin.
bool may_fit_by_estimate(const StepInputs& in, const std::string& scheme, const StepEstimate& e, double hbm_headroom) {
  const EstimateMargin margin = estimate_margin(scheme);
  return e.hbm_bytes / (1 + margin.hbm) <= usable_hbm_bytes(in.cluster, hbm_headroom) &&
         e.dram_bytes / (1 + margin.dram) <= in.cluster.node.host_dram_bytes.value;
}

// One spec screened in the bounds phase (on any thread): its graph's size, then why it was left out, or its candidate.
struct Screened {
  enum class Verdict { over_budget, known_miss, memory_miss, alive } verdict = Verdict::over_budget;
  Bounds bounds;
  Candidate candidate{};
};

Screened screen(const StepInputs& in, const SearchOptions& options, const PlanSpec& spec, std::size_t index, std::int64_t budget,
                double& graph_bytes) {
  Screened out;
  // Too large to build here: skipped before its bounds (whose cost grows with the graph's) are computed.
  graph_bytes = estimate_plan(in, spec).bytes;
  if (graph_bytes > static_cast<double>(budget)) return out;
  out.verdict = Screened::Verdict::known_miss;
  if (options.known_not_to_fit && options.known_not_to_fit(spec)) return out;
  out.bounds = lower_bounds(in, spec);
  out.verdict = Screened::Verdict::memory_miss;
  if (options.prune &&
      (out.bounds.hbm_bytes > usable_hbm_bytes(in.cluster, options.hbm_headroom) || out.bounds.dram_bytes > in.cluster.node.host_dram_bytes.value))
    return out;
  // The search cost only orders candidates whose bounds tie; nothing is decided on it.
  out.candidate = {index, out.bounds, scheme_named(spec.scheme).search_cost(in, spec), std::nullopt};
  if (options.prune_by_estimate) out.candidate.estimated = analytic_estimate(in, spec, options.hbm_headroom);
  const bool estimated_miss = options.prune_memory_by_estimate && out.candidate.estimated &&
                              !may_fit_by_estimate(in, spec.scheme, *out.candidate.estimated, options.hbm_headroom);
  out.verdict = estimated_miss ? Screened::Verdict::known_miss : Screened::Verdict::alive;
  return out;
}

// The bounds phase, on the pool: each spec's graph size (into graph_bytes), bounds and estimate. Specs too large for
// the budget, and (when pruning) those whose memory bounds cannot fit, are counted in the report (in spec order, so
// the same for any thread count) and left out; the rest come back sorted (sort_candidates). Cancelled:
// report.interrupted, and nothing.
std::vector<Candidate> bounded_candidates(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs, std::int64_t budget,
                                          ThreadPool& pool, std::vector<double>& graph_bytes, SearchReport& report) {
  std::vector<Screened> screened(specs.size());
  std::atomic<std::size_t> done{0};
  pool.for_each(
      specs.size(),
      [&](std::size_t i) {
        screened[i] = screen(in, options, specs[i], i, budget, graph_bytes[i]);
        const std::size_t n = ++done;
        if (options.bounds_progress && n % 16 == 0) options.bounds_progress(n, specs.size());
      },
      options.cancel);
  if (cancelled(options)) {
    report.interrupted = true;
    return {};
  }
  const double hbm_usable = usable_hbm_bytes(in.cluster, options.hbm_headroom);
  const double dram_capacity = in.cluster.node.host_dram_bytes.value;
  std::vector<Candidate> alive;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    switch (screened[i].verdict) {
      case Screened::Verdict::over_budget:
        if (report.over_budget++ == 0 || graph_bytes[i] < report.smallest_over_budget_bytes) report.smallest_over_budget_bytes = graph_bytes[i];
        break;
      case Screened::Verdict::known_miss: ++report.pruned_memory; break;
      case Screened::Verdict::memory_miss:
        ++report.pruned_memory;
        note_miss(report, bound_miss(specs[i], screened[i].bounds, hbm_usable, dram_capacity));
        break;
      case Screened::Verdict::alive: alive.push_back(screened[i].candidate); break;
    }
  }
  if (options.bounds_progress) options.bounds_progress(specs.size(), specs.size());
  sort_candidates(alive, options.objective);
  if (options.estimated && options.prune_by_estimate) options.estimated(provisional_top(in, options, specs, alive));
  return alive;
}

// The wave of `order` (positions in `alive`) starting at order[start], decided from the results of earlier waves
// only: the positions to simulate. The others are pruned (counted, and their floors kept in scheme_skipped), or,
// when only the estimate rules them out, deferred (WaveState). `by_estimate` false: the bounds alone decide.
std::vector<std::size_t> choose_wave(const SearchOptions& options, const std::vector<PlanSpec>& specs, const std::vector<Candidate>& alive,
                                     const std::vector<std::size_t>& order, std::size_t start, bool by_estimate, WaveState& state,
                                     SearchReport& report) {
  const std::size_t top = static_cast<std::size_t>(std::max(1, options.top));
  std::vector<std::size_t> wave;
  for (std::size_t o = start; o < std::min(order.size(), start + wave_size(options)); ++o) {
    const Candidate& c = alive[order[o]];
    const std::string& scheme = specs[c.index].scheme;
    const double bound = bound_key(options.objective, c.bounds);
    const double floor = floor_of(c, scheme, options.objective, by_estimate, state);
    const bool beaten_overall = state.found.size() >= top && floor >= state.found[top - 1];
    const bool scheme_has_plan = state.scheme_best.count(scheme) > 0;
    if (!options.prune || !beaten_overall || !scheme_has_plan) {
      wave.push_back(order[o]);
    } else if (bound < state.found[top - 1]) {
      state.deferred.push_back(order[o]);
    } else {
      ++report.pruned_time;
      note_skipped(state, scheme, floor);
    }
  }
  return wave;
}

// A simulated candidate, with the estimate's objective (0 when not pruning by it).
struct Simulated {
  RankedPlan plan;
  double estimate = 0;
};

// One candidate built and simulated, holding its graph's bytes in the gate; nullopt where
// SearchOptions::runnable_graph refuses the built graph.
std::optional<PlanMetrics> simulate_one(const StepInputs& in, const SearchOptions& options, const PlanSpec& spec, double graph_bytes,
                                        MemoryGate& gate) {
  MemoryGate::Hold hold(gate, graph_bytes);
  if (options.before_simulate) options.before_simulate(spec);
  sim::TaskGraph graph = build_plan(in, spec);
  hold.shrink_to(built_graph_bytes(graph));  // the estimate has room for a graph twice this size
  if (options.runnable_graph && !options.runnable_graph(in, spec, graph)) return std::nullopt;
  return measure(simulate_built(graph, in, options.cancel), in, options.hbm_headroom);
}

// Simulates `specs` on the pool, as many at once as fit in the budget together (the answer does not depend on
// it). nullopt where SearchOptions::runnable_graph refuses the built graph.
WaveResults simulate_on(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs,
                        const std::vector<double>& graph_bytes, MemoryGate& gate, ThreadPool& pool) {
  WaveResults results(specs.size());
  pool.for_each(
      specs.size(), [&](std::size_t w) { results[w] = simulate_one(in, options, specs[w], graph_bytes[w], gate); }, options.cancel);
  return results;
}

// Simulations done ahead of their wave, by position in `alive`. A wave ends when its slowest simulation does,
// and the threads that finish first would wait for it; instead each takes one of the candidates the next wave
// would hold as the search stands (choose_wave on a copy of the state). The next wave is still chosen from the
// finished wave's results and takes only its own members' results from here, so what is simulated, counted and
// answered is the same as without it; a result no wave takes is dropped. An error is kept and rethrown by the
// wave that takes it, as if it had been thrown there.
class Lookahead {
 public:
  bool has(std::size_t pos) {
    std::lock_guard lock(mutex_);
    return done_.count(pos) > 0;
  }
  void put(std::size_t pos, std::optional<PlanMetrics> result, std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    done_[pos] = {std::move(result), std::move(error)};
  }
  // The result for `pos` if it was simulated ahead (removed from here), rethrowing its error.
  std::optional<std::optional<PlanMetrics>> take(std::size_t pos) {
    std::lock_guard lock(mutex_);
    const auto it = done_.find(pos);
    if (it == done_.end()) return std::nullopt;
    Done d = std::move(it->second);
    done_.erase(it);
    if (d.error) std::rethrow_exception(d.error);
    return std::move(d.result);
  }

 private:
  struct Done {
    std::optional<PlanMetrics> result;
    std::exception_ptr error;
  };
  std::mutex mutex_;
  std::map<std::size_t, Done> done_;
};

// The wave's candidates (positions in `alive`) on the pool, taking those simulated ahead from `ahead`; the threads
// left without a wave simulation to start simulate `next` ahead (Lookahead).
WaveResults simulate_wave_here(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs,
                               const std::vector<Candidate>& alive, const std::vector<std::size_t>& wave, const std::vector<std::size_t>& next,
                               const std::vector<double>& graph_bytes, MemoryGate& gate, ThreadPool& pool, Lookahead& ahead) {
  WaveResults results(wave.size());
  std::vector<std::size_t> to_simulate;  // indices into `wave`
  for (std::size_t w = 0; w < wave.size(); ++w) {
    if (auto done = ahead.take(wave[w])) {
      results[w] = std::move(*done);
    } else {
      to_simulate.push_back(w);
    }
  }
  std::vector<std::size_t> extra;
  for (std::size_t pos : next) {
    if (!ahead.has(pos)) extra.push_back(pos);
  }
  std::atomic<std::size_t> unfinished{to_simulate.size()};
  pool.for_each(
      to_simulate.size() + extra.size(),
      [&](std::size_t i) {
        if (i < to_simulate.size()) {  // for_each hands these out first
          const std::size_t index = alive[wave[to_simulate[i]]].index;
          try {
            results[to_simulate[i]] = simulate_one(in, options, specs[index], graph_bytes[index], gate);
          } catch (...) {
            --unfinished;
            throw;
          }
          --unfinished;
          return;
        }
        if (unfinished.load() == 0) return;  // the wave is done: nothing more starts on its account
        const std::size_t pos = extra[i - to_simulate.size()];
        const std::size_t index = alive[pos].index;
        try {
          std::optional<PlanMetrics> r = simulate_one(in, options, specs[index], graph_bytes[index], gate);
          if (!(r && r->failure == "cancelled")) ahead.put(pos, std::move(r), nullptr);
        } catch (...) {
          ahead.put(pos, std::nullopt, std::current_exception());
        }
      },
      options.cancel);
  return results;
}

// A wave's candidates simulated, here or on the farm; those refused by runnable_graph go to `refused`, those a
// Ctrl-C left unsimulated are dropped.
std::vector<Simulated> simulate_wave(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs,
                                     const std::vector<Candidate>& alive, const std::vector<std::size_t>& wave, const std::vector<std::size_t>& next,
                                     const std::vector<double>& graph_bytes, MemoryGate& gate, ThreadPool& pool, Lookahead& ahead,
                                     std::vector<PlanSpec>& refused) {
  std::vector<PlanSpec> wave_specs;
  for (std::size_t pos : wave) wave_specs.push_back(specs[alive[pos].index]);
  const WaveResults results = options.farm ? options.farm(in, wave_specs)
                                           : simulate_wave_here(in, options, specs, alive, wave, next, graph_bytes, gate, pool, ahead);
  std::vector<Simulated> simulated;
  for (std::size_t w = 0; w < wave.size(); ++w) {
    const Candidate& c = alive[wave[w]];
    if (results[w]) {
      simulated.push_back({{wave_specs[w], *results[w], c.bounds}, estimate_of(c, options.objective)});
    } else if (!cancelled(options)) {
      refused.push_back(wave_specs[w]);
    }
  }
  return simulated;
}

// A wave's results into the state (the plans that fit, and how far above them the estimate was) and the report
// (the misses).
void record_wave(std::vector<Simulated>& results, Objective objective, WaveState& state, SearchReport& report) {
  for (auto& [r, estimate] : results) {
    if (r.metrics.fits) {
      const double key = objective_key(objective, r.metrics);
      state.found.insert(std::upper_bound(state.found.begin(), state.found.end(), key), key);
      auto [it, inserted] = state.scheme_best.emplace(r.spec.scheme, key);
      if (!inserted) it->second = std::min(it->second, key);
      if (estimate > 0 && key > 0) {
        WaveState::Seen& seen = state.over[r.spec.scheme];
        seen.most_over = seen.plans++ == 0 ? estimate / key - 1 : std::max(seen.most_over, estimate / key - 1);
      }
      state.fitting.push_back(std::move(r));
    } else {
      report.simulated_misses.push_back(r.spec);
      note_miss(report, std::move(r));
    }
  }
}

// The waves over `order` (positions in `alive`; search.hpp). False when interrupted or done (stop_at_first_fit).
bool run_waves_over(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs, const std::vector<Candidate>& alive,
                    const std::vector<std::size_t>& order, bool by_estimate, const std::vector<double>& graph_bytes, MemoryGate& gate,
                    ThreadPool& pool, Lookahead& ahead, WaveState& state, SearchReport& report) {
  for (std::size_t start = 0; start < order.size(); start += wave_size(options)) {
    if (cancelled(options)) {
      report.interrupted = true;
      return false;
    }
    const std::vector<std::size_t> wave = choose_wave(options, specs, alive, order, start, by_estimate, state, report);
    std::vector<std::size_t> next;  // the next wave as the search stands now, for the threads left idle
    if (!options.farm && pool.size() > 1) {
      WaveState now = state;
      SearchReport scratch;
      next = choose_wave(options, specs, alive, order, start + wave_size(options), by_estimate, now, scratch);
    }
    std::vector<PlanSpec> refused;
    std::vector<Simulated> results = simulate_wave(in, options, specs, alive, wave, next, graph_bytes, gate, pool, ahead, refused);
    for (const PlanSpec& spec : refused) ++report.not_runnable_by_scheme[spec.scheme];
    // Ctrl-C: the wave's simulations that finished stay in the report (the best so far); those cut short or never
    // started are dropped.
    const bool stopped = cancelled(options);
    if (stopped) {
      report.interrupted = true;
      std::erase_if(results, [](const Simulated& r) { return r.plan.metrics.failure == "cancelled"; });
    }
    report.simulated += results.size();
    record_wave(results, options.objective, state, report);
    if (stopped || (options.stop_at_first_fit && !state.fitting.empty())) return false;
    if (options.progress) options.progress(std::min(order.size(), start + wave_size(options)) + report.pruned_memory, specs.size());
  }
  return true;
}

// The simulations, wave by wave, pruning between waves; then the candidates the estimate alone ruled out, either
// skipped (its error on these inputs stayed within its measured margin) or simulated after all (it did not).
void run_waves(const StepInputs& in, const SearchOptions& options, const std::vector<PlanSpec>& specs, const std::vector<Candidate>& alive,
               const std::vector<double>& graph_bytes, std::int64_t budget, ThreadPool& pool, WaveState& state, SearchReport& report) {
  MemoryGate own_gate(static_cast<double>(budget));
  MemoryGate& gate = options.memory_gate != nullptr ? *options.memory_gate : own_gate;
  std::vector<std::size_t> order(alive.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  Lookahead ahead;
  if (!run_waves_over(in, options, specs, alive, order, options.prune_by_estimate, graph_bytes, gate, pool, ahead, state, report)) return;
  // The estimate's margin as measured over all the waves decides again: within it, skipped; else simulated.
  const std::size_t top = static_cast<std::size_t>(std::max(1, options.top));
  std::vector<std::size_t> again;
  for (std::size_t pos : state.deferred) {
    const std::string& scheme = specs[alive[pos].index].scheme;
    const double floor = floor_of(alive[pos], scheme, options.objective, true, state);
    if (state.found.size() >= top && floor >= state.found[top - 1]) {
      ++report.pruned_time;
      ++report.pruned_estimate;
      note_skipped(state, scheme, floor);
    } else {
      again.push_back(pos);
    }
  }
  SearchOptions quiet = options;  // the progress already counted these
  quiet.progress = nullptr;
  run_waves_over(in, quiet, specs, alive, again, false, graph_bytes, gate, pool, ahead, state, report);
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
  report.runnable_keeps = options.runnable_keeps;
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
  ThreadPool pool(options.threads);
  const std::vector<Candidate> alive = bounded_candidates(in, options, specs, budget, pool, graph_bytes, report);
  if (report.interrupted) return report;
  WaveState state;
  run_waves(in, options, specs, alive, graph_bytes, budget, pool, state, report);
  rank_fitting(state, options.objective, report);
  refuse_if_only_over_budget(report, options, budget);
  return report;
}

WaveResults simulate_here(const StepInputs& in, const std::vector<PlanSpec>& specs, const SearchOptions& options) {
  const std::int64_t budget = options.memory_budget_bytes > 0 ? options.memory_budget_bytes : default_memory_budget_bytes();
  ThreadPool pool(options.threads);
  MemoryGate own_gate(static_cast<double>(budget));
  MemoryGate& gate = options.memory_gate != nullptr ? *options.memory_gate : own_gate;
  std::vector<double> graph_bytes;
  for (const PlanSpec& spec : specs) graph_bytes.push_back(std::min(estimate_plan(in, spec).bytes, static_cast<double>(budget)));
  return simulate_on(in, options, specs, graph_bytes, gate, pool);
}

nlohmann::json metrics_record(const PlanMetrics& m) {
  nlohmann::json j = metrics_json(m);
  j["failure"] = m.failure;
  j["shortfall_bytes"] = m.shortfall_bytes;
  j["short_of"] = m.short_of;
  j["bound_only"] = m.bound_only;
  return j;
}

nlohmann::json plan_spec_record(const PlanSpec& spec) { return {{"scheme", spec.scheme}, {"parameters", parameters_json(spec)}}; }

PlanSpec plan_spec_from_record(const nlohmann::json& j, const std::string& origin) {
  return parse_parameters(j.at("scheme").get<std::string>(), j.at("parameters"), origin);
}

PlanMetrics metrics_from_record(const nlohmann::json& j, const std::string& origin) {
  try {
    PlanMetrics m;
    m.fits = j.at("fits").get<bool>();
    for (auto [field, value] : {std::pair{"step_s", &m.step_s},
                                {"tokens_per_s", &m.tokens_per_s},
                                {"mfu", &m.mfu},
                                {"hfu", &m.hfu},
                                {"compute_s", &m.compute_s},
                                {"exposed_transfer_s", &m.exposed_transfer_s},
                                {"bubble_s", &m.bubble_s},
                                {"recompute_s", &m.recompute_s}})
      *value = j.at(field).get<double>();
    m.peak_hbm_bytes = j.at("peak_hbm_bytes").get<std::int64_t>();
    m.peak_dram_bytes = j.at("peak_dram_bytes").get<std::int64_t>();
    m.shortfall_bytes = j.at("shortfall_bytes").get<std::int64_t>();
    m.bottleneck = j.at("bottleneck").get<std::string>();
    m.busiest_link = j.at("busiest_link").get<std::string>();
    m.failure = j.at("failure").get<std::string>();
    m.short_of = j.at("short_of").get<std::string>();
    m.bound_only = j.at("bound_only").get<bool>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(origin, "metrics",
                     "a simulated plan's metrics (every field of plan --json's, and failure, shortfall_bytes, short_of, bound_only)", e.what());
  }
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

namespace {

// Whether the estimate's HBM and DRAM stayed within their measured margins above the simulator on these simulated
// plans.
bool memory_estimate_held(const StepInputs& in, const std::vector<RankedPlan>& simulated, double hbm_headroom) {
  return std::all_of(simulated.begin(), simulated.end(), [&](const RankedPlan& p) {
    const StepEstimate e = analytic_estimate(in, p.spec, hbm_headroom);
    const EstimateMargin margin = estimate_margin(p.spec.scheme);
    const auto dram = static_cast<double>(p.metrics.peak_dram_bytes);
    return e.hbm_bytes / static_cast<double>(p.metrics.peak_hbm_bytes) - 1 <= margin.hbm && (dram <= 0 || e.dram_bytes / dram - 1 <= margin.dram);
  });
}

// Whether some configuration fits at a length: nullopt when the scheme has no valid configuration there at all (FPDT
// below its smallest chunk, say), which does not end the doubling.
using FitsAt = std::function<std::optional<bool>(std::int64_t seq)>;

// The fitting length found and the shortest length above it shown not to (0: none; good 0: not even the shortest).
struct Bracket {
  std::int64_t good = 0, bad = 0;
};

// Doubling from 1K, then bisection to within 1/64 of the length (at least 1K): beyond that, the probes near the
// limit, where every candidate must be simulated to show that none fits, cost more than the answer gains. The
// probes it makes depend only on the answers `fits` gives, so two `fits` that agree give the same bracket.
Bracket bracket_longest(const FitsAt& fits_at, const SearchOptions& options) {
  constexpr std::int64_t kStep = 1024, kLimit = std::int64_t{64} << 20, kResolutionDivisor = 64;
  Bracket b;
  for (std::int64_t seq = kStep; seq <= kLimit; seq *= 2) {
    if (cancelled(options)) break;
    const auto fits = fits_at(seq);
    if (!fits) continue;
    if (!*fits) {
      if (b.good == 0) return {};  // the shortest length it can run does not fit
      b.bad = seq;
      break;
    }
    b.good = seq;
  }
  if (b.good == 0) return {};
  while (b.bad != 0 && b.bad - b.good > std::max(kStep, b.good / kResolutionDivisor)) {
    if (cancelled(options)) break;
    const std::int64_t mid = (b.good + b.bad) / 2 / kStep * kStep;
    if (mid <= b.good) break;
    (fits_at(mid).value_or(false) ? b.good : b.bad) = mid;
  }
  return b;
}

// The estimate's answer for a length: some configuration within the memory budget that the estimate says fits.
std::optional<bool> fits_by_estimate(const StepInputs& in, const SearchOptions& probe) {
  std::vector<PlanSpec> specs = enumerate_plans(in, probe.schemes);
  if (specs.empty()) return std::nullopt;
  return !rank_estimated(in, std::move(specs), probe).empty();
}

// One of max_sequence's own searches: one scheme, its best plan only, quiet, never refusing for the memory budget.
SearchOptions inner_search(const SearchOptions& options, const std::string& scheme, Objective objective) {
  SearchOptions o = options;
  o.schemes = {scheme};
  o.objective = objective;
  o.top = 1;
  o.progress = nullptr;
  o.bounds_progress = nullptr;
  o.estimated = nullptr;
  o.refuse_over_budget = false;
  return o;
}

// max_sequence's probes: whether some configuration of one scheme fits at a length, by the simulator (each length
// searched once) or by the estimate, with what the simulated probes learnt.
class SequenceProbes {
 public:
  SequenceProbes(const StepInputs& in, const std::string& scheme, const SearchOptions& options)
      : in_(in), options_(options), probe_(inner_search(options, scheme, Objective::min_hbm)) {
    probe_.stop_at_first_fit = true;
    probe_.prune_memory_by_estimate = true;  // takes effect with prune_by_estimate
    probe_.known_not_to_fit = [this](const PlanSpec& spec) { return missed_by(spec, probing_seq_); };
  }

  StepInputs at(std::int64_t seq) const { return StepInputs{in_.model, in_.cluster, {seq, in_.workload.global_batch}, in_.precision}; }

  // A configuration that did not fit at some length is not tried at longer ones: its memory only grows with the
  // sequence.
  bool missed_by(const PlanSpec& spec, std::int64_t seq) const {
    const auto it = missed_at_.find(spec.summary());
    return it != missed_at_.end() && it->second <= seq;
  }

  // By the simulator. A length where every candidate is too large for the memory budget counts as not fitting (and
  // over_budget_at says so).
  std::optional<bool> simulated(std::int64_t seq) {
    if (const auto known = simulated_at_.find(seq); known != simulated_at_.end()) return known->second;
    probing_seq_ = seq;
    SearchReport r = search(at(seq), probe_);
    for (const PlanSpec& miss : r.simulated_misses) {
      auto [it, inserted] = missed_at_.emplace(miss.summary(), seq);
      if (!inserted) it->second = std::min(it->second, seq);
    }
    count_probe();
    std::optional<bool> fits;
    if (r.enumerated > 0) {
      over_budget_at_[seq] = r.ranked.empty() && r.over_budget > 0;
      fits = !r.ranked.empty();
    }
    if (!r.interrupted) simulated_at_[seq] = fits;
    return fits;
  }

  std::optional<bool> estimated(std::int64_t seq) {
    count_probe();
    return fits_by_estimate(at(seq), probe_);
  }

  bool over_budget_at(std::int64_t seq) const {
    const auto it = over_budget_at_.find(seq);
    return it != over_budget_at_.end() && it->second;
  }

 private:
  void count_probe() {
    // At most 16 doublings (1K to 64M) and 16 halvings of the gap, by the estimate and then by the simulator.
    constexpr std::size_t kMostProbes = 64;
    if (options_.progress) options_.progress(++probes_, kMostProbes);
  }

  const StepInputs& in_;
  const SearchOptions& options_;
  SearchOptions probe_;
  std::int64_t probing_seq_ = 0;                   // the length being probed
  std::map<std::string, std::int64_t> missed_at_;  // a configuration's summary: the shortest length it missed at
  std::map<std::int64_t, bool> over_budget_at_;    // nothing fit, and some candidate was too large
  std::map<std::int64_t, std::optional<bool>> simulated_at_;
  std::size_t probes_ = 0;
};

}  // namespace

std::optional<MaxSeqResult> max_sequence(const StepInputs& in, const std::string& scheme, const SearchOptions& options) {
  SequenceProbes probes(in, scheme, options);
  const FitsAt simulated = [&](std::int64_t seq) { return probes.simulated(seq); };
  // Bisection on the estimate, the simulator confirming the two lengths that bound the answer. Since a longer
  // sequence never needs less memory, every other probe's answer follows from theirs: when both agree, the
  // simulator's own bisection would have made the same probes and found the same answer. When not, it runs.
  Bracket b;
  if (options.prune_by_estimate) {
    const Bracket guess = bracket_longest([&](std::int64_t seq) { return probes.estimated(seq); }, options);
    const bool confirmed = guess.good > 0 && simulated(guess.good).value_or(false) && (guess.bad == 0 || simulated(guess.bad) == false);
    if (confirmed) b = guess;
  }
  if (b.good == 0) b = bracket_longest(simulated, options);
  if (b.good == 0) return std::nullopt;
  // The best throughput plan at that length.
  const StepInputs at = probes.at(b.good);
  SearchOptions best = inner_search(options, scheme, Objective::throughput);
  best.cancel = nullptr;  // one search at a length known to fit: finish it, so an interrupted probe still has a plan
  best.known_not_to_fit = [&](const PlanSpec& spec) { return probes.missed_by(spec, b.good); };  // the probes simulated them
  best.prune_memory_by_estimate = true;  // as the probes: near the limit most candidates do not fit
  SearchReport r = search(at, best);
  if (options.prune_by_estimate && !memory_estimate_held(at, r.ranked, options.hbm_headroom)) {
    // The estimate erred on these inputs beyond its measured margin, so its "does not fit" may have been wrong: the
    // simulator alone decides.
    SearchOptions exact = options;
    exact.prune_by_estimate = false;
    return max_sequence(in, scheme, exact);
  }
  if (r.ranked.empty()) return std::nullopt;
  return MaxSeqResult{b.good, r.ranked.front(), b.bad != 0 && probes.over_budget_at(b.bad)};
}

}  // namespace trainyard::planner
