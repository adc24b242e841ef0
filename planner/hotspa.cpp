#include "planner/hotspa.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <sstream>

#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/memory_budget.hpp"
#include "common/text_table.hpp"
#include "common/thread_pool.hpp"
#include "common/units.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

namespace {

using Json = nlohmann::json;

// A group (and static execution) tries up to this many times --per-group configurations to find ones that fit.
constexpr std::size_t kTries = 4;

std::string spec_key(const PlanSpec& spec) { return spec.scheme + parameters_json(spec).dump(); }

StepInputs inputs(const HotSpaSetting& s, Workload w) { return StepInputs{s.model, s.cluster, w, s.precision}; }

// A group under its plan: the strategy (micro-batch filled in) and the rows it runs.
struct GroupSetup {
  PlanSpec spec;
  GroupRows rows;
};

GroupSetup group_setup(const HotSpaSetting& s, const LengthGroup& group, const GroupPlan& plan) {
  GroupSetup g;
  const std::int64_t row_len = plan.row_len > 0 ? plan.row_len : group.hi;
  g.spec = plan.auto_micro_batch ? with_micro_batch(s, plan.spec, row_len) : plan.spec;
  LengthGroup rows_of = group;
  rows_of.hi = row_len;
  g.rows = group_rows(rows_of, s.batching, row_multiple(g.spec, s.cluster.gpus()));
  return g;
}

// A group's built step, the attention scaled to what packing computes.
struct BuiltGroup : GroupSetup {
  sim::TaskGraph graph;
};

std::int64_t budget_of(const HotSpaSetting& s) { return s.memory_budget_bytes > 0 ? s.memory_budget_bytes : default_memory_budget_bytes(); }

double group_bytes(const HotSpaSetting& s, const GroupSetup& g) { return estimate_plan(inputs(s, g.rows.workload), g.spec).bytes; }

// Simulations at once so that graphs of up to `largest` bytes fit in the budget together.
int parallel_within(std::int64_t budget, double largest) {
  return static_cast<int>(std::clamp(static_cast<double>(budget) / std::max(1.0, largest), 1.0, 1024.0));
}

void throw_if_cancelled(const HotSpaSetting& s) {
  if (s.cancel && s.cancel->load()) throw Interrupted();
}

BuiltGroup build_group(const HotSpaSetting& s, const LengthGroup& group, const GroupPlan& plan, bool update) {
  BuiltGroup b{group_setup(s, group, plan), {}};
  require_within_budget(estimate_plan(inputs(s, b.rows.workload), b.spec), budget_of(s),
                        "a group graph (" + b.spec.scheme + ", " + std::to_string(b.rows.workload.global_batch) + " rows of " +
                            format_tokens(b.rows.workload.seq_len) + ")",
                        "fewer --tokens-per-step, a smaller --micro-batch-tokens or a larger chunk");
  b.graph = build_plan(inputs(s, b.rows.workload), b.spec);
  for (std::size_t i = 0; i < b.graph.size(); ++i) {
    auto* a = std::get_if<sim::Attention>(&b.graph.edit(static_cast<sim::TaskId>(i)).params);
    if (a != nullptr && s.document_masks) a->density = b.rows.attention_density;
  }
  // Gradients accumulate across groups: only the last group updates the model.
  if (!update) b.graph = without_optimizer(b.graph);
  return b;  // finalized only by whoever simulates it (sends may still be added)
}

double max_end_s(const sim::SimResult& r, sim::TaskId first, sim::TaskId last) {
  std::int64_t end = 0;
  for (sim::TaskId i = first; i < last; ++i) end = std::max(end, r.timing[i].end_ns);
  return static_cast<double>(end) * 1e-9;
}

sim::SimOptions quiet(const HotSpaSetting& s) {
  sim::SimOptions o;
  o.record_links = false;
  o.cancel = s.cancel;
  o.collectives = s.collectives;
  return o;
}

// Simulates a group, with the next switch's parameter sends alongside when given; returns the group's result and,
// through `sends_end_s`, when those sends finished (when they fit in memory beside the group: else -1).
GroupResult simulate_group(const HotSpaSetting& s, const LengthGroup& group, const GroupPlan& plan, bool update, const SwitchPlan* prefetch,
                           double* sends_end_s) {
  GroupResult g;
  g.lo = group.lo;
  g.hi = group.hi;
  g.sequences = static_cast<std::int64_t>(group.lengths.size());
  g.tokens = group.tokens();
  BuiltGroup b = build_group(s, group, plan, update);
  g.rows = b.rows;
  g.spec = b.spec;
  // run --lengths runs every group without its optimizer tasks (one update after the groups, on the host)
  const bool runnable = !s.runnable_graph || s.runnable_graph(update ? without_optimizer(b.graph) : b.graph);
  if (!runnable) {
    g.failure = "the executor does not run its graph (--executable)";
    return g;
  }
  const auto group_tasks = static_cast<sim::TaskId>(b.graph.size());
  if (prefetch) {
    if (b.graph.finalized()) {  // a built graph is finalized: copy it into an open one
      sim::TaskGraph open;
      sim::append(open, b.graph);
      b.graph = std::move(open);
    }
    add_switch_sends(b.graph, *prefetch, "prefetch params");
  }
  b.graph.finalize();
  const auto all_tasks = static_cast<sim::TaskId>(b.graph.size());
  const StepInputs in = inputs(s, b.rows.workload);
  sim::SimResult r = sim::simulate(b.graph, s.cluster, quiet(s));
  throw_if_cancelled(s);  // a cancelled run is not a result
  const PlanMetrics m = measure(r, in, s.hbm_headroom);
  g.fits = m.fits;
  g.failure = m.failure;
  g.peak_hbm_bytes = m.peak_hbm_bytes;
  g.model_flops = r.model_flops;
  if (!m.fits) return g;
  g.time_s = max_end_s(r, 0, group_tasks);
  if (sends_end_s) *sends_end_s = prefetch ? max_end_s(r, group_tasks, all_tasks) : 0;
  if (prefetch) {
    std::vector<std::int64_t> incoming(static_cast<std::size_t>(s.cluster.gpus()), 0);
    for (const auto& t : prefetch->transfers) incoming[t.dst] += t.bytes;
    const double usable = usable_hbm_bytes(s.cluster, s.hbm_headroom);
    bool room = true;
    for (int gpu = 0; gpu < s.cluster.gpus(); ++gpu) {
      const auto i = static_cast<std::size_t>(gpu);
      if (static_cast<double>(r.pools[i].peak_bytes + incoming[i]) > usable) room = false;
    }
    if (!room) {  // no room to receive early: the group runs alone and the parameters move after it
      GroupResult alone = simulate_group(s, group, plan, update, nullptr, nullptr);
      if (sends_end_s) *sends_end_s = -1;
      return alone;
    }
  }
  return g;
}

double simulate_sends_s(const HotSpaSetting& s, const std::vector<const SwitchPlan*>& plans) {
  sim::TaskGraph graph;
  for (const SwitchPlan* p : plans) add_switch_sends(graph, *p, "switch");
  if (graph.size() == 0) return 0;
  graph.finalize();
  return static_cast<double>(sim::simulate(graph, s.cluster, quiet(s)).step_ns) * 1e-9;
}

std::string range_name(std::int64_t lo, std::int64_t hi) { return format_tokens(lo) + "~" + format_tokens(hi); }

}  // namespace

PlanSpec parse_strategy(const std::string& text, const std::string& origin, int gpus, bool* micro_batch_given) {
  const auto colon = text.find(':');
  const std::string scheme = text.substr(0, colon);
  const Scheme* entry = find_scheme(scheme);
  if (entry == nullptr) throw InputError(origin, "scheme", "one of " + scheme_list() + " (e.g. megatron:tp=8,pp=2)", "\"" + text + "\"");
  if (!entry->hotspa) throw InputError(origin, "scheme", "a scheme HotSPa switches between", "\"" + scheme + "\" (it has no HotSPa facet)");
  if (micro_batch_given) *micro_batch_given = false;
  Json params = params_json(*entry, entry->blank());
  std::vector<std::string> given;
  if (colon != std::string::npos) {
    for (const std::string& item : split_commas(text.substr(colon + 1))) {
      const auto eq = item.find('=');
      const std::string key = item.substr(0, eq);
      if (eq == std::string::npos || !params.contains(key) || params[key].is_array() || params[key].is_object()) {
        std::string keys;
        for (auto it = params.begin(); it != params.end(); ++it) {
          if (!it.value().is_array()) keys += (keys.empty() ? "" : ", ") + it.key();
        }
        throw InputError(origin, scheme, "key=value pairs with keys among " + keys, "\"" + item + "\"");
      }
      const std::string value = item.substr(eq + 1);
      Json& slot = params[key];
      if (slot.is_boolean()) {
        if (value != "true" && value != "false") throw InputError(origin, scheme + "." + key, "true or false", "\"" + value + "\"");
        slot = value == "true";
      } else if (slot.is_number()) {
        // A count whose default is 0 ("not set": cp_a2a, first_stage_layers) may be given as 0, as plan files write it.
        slot = value == "0" && slot == 0 ? Json(0) : Json(parse_token_count(value, origin + " " + scheme + "." + key));
      } else {
        slot = value;
      }
      given.push_back(key);
      if (micro_batch_given && key == "micro_batch") *micro_batch_given = true;
    }
  }
  entry->hotspa->complete_strategy(params, given, gpus);
  return parse_parameters(scheme, params, origin);
}

std::vector<GroupPlan> parse_group_plans(const std::string& text, const std::string& origin, int gpus) {
  std::vector<GroupPlan> plans;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto end = std::min(text.find(';', start), text.size());
    const std::string item = text.substr(start, end - start);
    const auto eq = item.find('=');
    if (eq == std::string::npos) throw InputError(origin, "group", "UPPER=SCHEME:key=value,... (e.g. 4K=megatron:tp=2,pp=4)", "\"" + item + "\"");
    GroupPlan p;
    p.upper = parse_token_count(item.substr(0, eq), origin);
    bool micro_batch_given = false;
    p.spec = parse_strategy(item.substr(eq + 1), origin, gpus, &micro_batch_given);
    p.auto_micro_batch = !micro_batch_given;
    if (!plans.empty() && p.upper <= plans.back().upper) {
      throw InputError(origin, "group", "ascending upper bounds", format_tokens(p.upper) + " after " + format_tokens(plans.back().upper));
    }
    plans.push_back(p);
    start = end + 1;
  }
  return plans;
}

std::string describe(const std::vector<GroupPlan>& plans) {
  std::string out;
  for (const auto& p : plans) out += (out.empty() ? "" : "; ") + format_tokens(p.upper) + "=" + p.spec.scheme + " " + p.spec.summary();
  return out;
}

std::string switch_text(const std::vector<GroupPlan>& plans) {
  std::string out;
  for (const auto& p : plans) {
    std::string params;
    const Json values = parameters_json(p.spec);
    for (auto it = values.begin(); it != values.end(); ++it) {
      if (it.value().is_array() || it.value().is_object()) continue;  // lists (a ring order) have no --switch form
      params += (params.empty() ? "" : ",") + it.key() + "=" + (it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
    }
    out += (out.empty() ? "" : ";") + std::to_string(p.upper) + "=" + p.spec.scheme + (params.empty() ? "" : ":" + params);
  }
  return out;
}

PlanSpec with_micro_batch(const HotSpaSetting& s, PlanSpec spec, std::int64_t row_len) {
  // ffd-padded: each packed row is one micro-batch (the artifact's micro_batch_size = 1, "already packed").
  const std::int64_t mb = s.batching == Batching::ffd_padded ? 1
                                                             : std::max<std::int64_t>(1, s.micro_batch_tokens / std::max<std::int64_t>(1, row_len));
  hotspa_facet(spec).set_micro_batch(spec, mb);
  return spec;
}

std::int64_t row_multiple(const PlanSpec& spec, int gpus) { return hotspa_facet(spec).row_multiple(spec, gpus); }

double MinibatchResult::mfu(const sim::Cluster& cluster) const {
  double flops = 0;
  for (const auto& g : groups) flops += g.model_flops;
  if (!(total_s > 0)) return 0;
  return flops / (total_s * cluster.gpus() * cluster.node.gpu.peak_tflops(hw::Dtype::bf16) * 1e12);
}

GroupResult run_group(const HotSpaSetting& s, const LengthGroup& group, const GroupPlan& plan, bool update) {
  return simulate_group(s, group, plan, update, nullptr, nullptr);
}

namespace {

// A mini-batch cut at the plans' bounds: its non-empty groups, shortest first (the last is home), each with its plan.
struct Minibatch {
  std::vector<LengthGroup> all;   // one per plan, the empty ones too
  std::vector<std::size_t> used;  // the non-empty groups
  const std::vector<GroupPlan>& plans;
  const std::string& origin;

  std::size_t size() const { return used.size(); }
  const LengthGroup& group(std::size_t k) const { return all[used[k]]; }
  const GroupPlan& plan(std::size_t k) const { return plans[used[k]]; }
  // A strategy the group cannot take is the user's error: say which group.
  void in_group(std::size_t k, const std::function<void()>& work) const {
    try {
      work();
    } catch (const InputError& e) {
      throw InputError(origin + ": group " + range_name(group(k).lo, group(k).hi) + " (" + plan(k).spec.scheme + "): " + e.what());
    }
  }
};

// Empty groups are skipped, except under ffd-padded: the artifact runs every bucket, an empty one on dummy rows.
Minibatch cut_minibatch(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const std::vector<GroupPlan>& plans,
                        const std::string& origin) {
  if (lengths.empty()) throw InputError(origin, "lengths", "at least one sequence", "an empty mini-batch");
  std::vector<std::int64_t> bounds;
  for (const auto& p : plans) bounds.push_back(p.upper);
  Minibatch mb{group_lengths(lengths, bounds), {}, plans, origin};
  const bool run_empty = s.batching == Batching::ffd_padded;
  for (std::size_t i = 0; i < mb.all.size(); ++i) {
    if (run_empty || !mb.all[i].lengths.empty()) mb.used.push_back(i);
  }
  return mb;
}

struct SwitchPlans {
  std::vector<SwitchPlan> params, grads;  // [k]: into group k
};

// Layouts and switch plans: before group 0 the parameters come from home; between groups i and i+1 the
// gradients, and the parameters unless i+1 is home (whose parameters never left).
SwitchPlans plan_switches(const HotSpaSetting& s, const Minibatch& mb) {
  const std::size_t n = mb.size();
  const std::size_t home = n - 1;
  std::vector<StateLayout> params(n), grads(n);
  for (std::size_t k = 0; k < n; ++k) {
    mb.in_group(k, [&] {
      const GroupSetup g = group_setup(s, mb.group(k), mb.plan(k));
      const StepInputs in = inputs(s, g.rows.workload);
      params[k] = parameter_layout(in, g.spec);
      grads[k] = gradient_layout(in, g.spec);
    });
  }
  const auto gpn = s.cluster.topology.gpus_per_node();
  const auto param_units = unit_bytes(s.model, s.precision.weight_bytes);
  const auto grad_units = unit_bytes(s.model, s.precision.grad_bytes);
  SwitchPlans out{std::vector<SwitchPlan>(n), std::vector<SwitchPlan>(n)};
  for (std::size_t k = 0; k < n; ++k) {
    if (k != home) out.params[k] = plan_switch(params[k == 0 ? home : k - 1], params[k], param_units, gpn, s.cluster.gpus());
    if (k > 0) out.grads[k] = plan_switch(grads[k - 1], grads[k], grad_units, gpn, s.cluster.gpus());
  }
  return out;
}

// Groups (each with the next group's parameters in flight) in parallel, into out.groups; the first that does not
// fit fails the mini-batch. Returns when each group's prefetch sends ended (simulate_group's sends_end_s).
std::vector<double> simulate_groups(const HotSpaSetting& s, const Minibatch& mb, const SwitchPlans& switches, MinibatchResult& out) {
  const std::size_t n = mb.size();
  const std::size_t home = n - 1;
  out.groups.resize(n);
  std::vector<double> prefetch_end(n, 0);
  double largest = 1;
  for (std::size_t k = 0; k < n; ++k) {
    mb.in_group(k, [&] { largest = std::max(largest, group_bytes(s, group_setup(s, mb.group(k), mb.plan(k)))); });
  }
  ThreadPool pool(s.threads);
  pool.for_each(
      n,
      [&](std::size_t k) {
        const SwitchPlan* next = k + 1 < n && !switches.params[k + 1].transfers.empty() ? &switches.params[k + 1] : nullptr;
        mb.in_group(k, [&] { out.groups[k] = simulate_group(s, mb.group(k), mb.plan(k), k == home, next, &prefetch_end[k]); });
      },
      s.cancel, parallel_within(budget_of(s), largest));
  throw_if_cancelled(s);
  for (const auto& g : out.groups) {
    if (!g.fits && out.fits) {
      out.fits = false;
      out.failure = "group " + range_name(g.lo, g.hi) + " (" + g.spec.scheme + " " + g.spec.summary() + "): " + g.failure;
    }
  }
  return prefetch_end;
}

// Switches: what is left after the previous group.
void add_switches(const HotSpaSetting& s, const SwitchPlans& switches, const std::vector<double>& prefetch_end, MinibatchResult& out) {
  const std::size_t n = switches.params.size();
  const std::size_t home = n - 1;
  for (std::size_t k = 0; k < n; ++k) {
    SwitchResult sw;
    sw.from = k == 0 ? home : k - 1;
    sw.to = k;
    sw.param_bytes = switches.params[k].bytes();
    sw.grad_bytes = switches.grads[k].bytes();
    if (sw.param_bytes == 0 && sw.grad_bytes == 0) continue;
    std::vector<const SwitchPlan*> after{&switches.grads[k]};
    double overhang = 0;
    if (k > 0 && prefetch_end[k - 1] >= 0 && sw.param_bytes > 0) {
      sw.params_overlapped = true;
      overhang = std::max(0.0, prefetch_end[k - 1] - out.groups[k - 1].time_s);
    } else {
      after.push_back(&switches.params[k]);
    }
    sw.exposed_s = overhang + simulate_sends_s(s, after);
    out.others_s += sw.exposed_s;
    out.switches.push_back(sw);
  }
}

}  // namespace

MinibatchResult run_minibatch(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const std::vector<GroupPlan>& plans,
                              const std::string& origin) {
  const Minibatch mb = cut_minibatch(s, lengths, plans, origin);
  const SwitchPlans switches = plan_switches(s, mb);
  MinibatchResult out;
  const std::vector<double> prefetch_end = simulate_groups(s, mb, switches, out);
  add_switches(s, switches, prefetch_end, out);
  out.total_s = out.others_s;
  for (const auto& g : out.groups) out.total_s += g.time_s;
  return out;
}

sim::TaskGraph without_optimizer(const sim::TaskGraph& step) {
  return sim::without_tasks(step, [](const sim::Task& t) { return t.kind() == sim::TaskKind::optimizer; });
}

std::vector<ExecutableGroup> minibatch_groups(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const std::vector<GroupPlan>& plans,
                                              const std::string& origin) {
  const Minibatch mb = cut_minibatch(s, lengths, plans, origin);
  std::vector<ExecutableGroup> out(mb.size());
  for (std::size_t k = 0; k < mb.size(); ++k) {
    mb.in_group(k, [&] {
      BuiltGroup b = build_group(s, mb.group(k), mb.plan(k), false);
      out[k] = {mb.group(k).lo, mb.group(k).hi, b.spec, b.rows.workload, std::move(b.graph)};
    });
  }
  return out;
}

std::vector<GroupPlan> static_plans(const std::vector<std::int64_t>& bounds, const PlanSpec& spec, bool auto_micro_batch) {
  std::vector<GroupPlan> plans;
  for (std::int64_t b : bounds) plans.push_back({b, spec, auto_micro_batch, bounds.back()});
  return plans;
}

MinibatchResult run_static(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const std::vector<std::int64_t>& bounds,
                           const PlanSpec& spec, bool auto_micro_batch, const std::string& origin) {
  const std::vector<GroupPlan> plans = static_plans(bounds, spec, auto_micro_batch);
  MinibatchResult r = run_minibatch(s, lengths, plans, origin);
  LengthGroup all;
  all.hi = bounds.back();
  all.lengths = lengths;
  std::sort(all.lengths.begin(), all.lengths.end(), std::greater<>());
  const GroupResult whole = run_group(s, all, plans.back(), true);
  r.total_s = whole.time_s;
  r.whole_rows = whole.rows.workload.global_batch;
  if (!whole.fits && r.fits) {
    r.fits = false;
    r.failure = "the whole mini-batch (" + spec.scheme + " " + whole.spec.summary() + "): " + whole.failure;
  }
  return r;
}

namespace {

// What the phases of search_hotspa share: the setting, the bounds searched and the mini-batch cut at them.
struct HotSpaSearch {
  const HotSpaSetting& s;
  const HotSpaSearchOptions& options;
  const std::vector<std::int64_t>& lengths;
  std::vector<std::int64_t> bounds;  // options.bounds, those whose finest group is empty merged into the next one
  std::vector<LengthGroup> finest;   // the lengths cut at every bound
  double hbm_usable = 0;
  std::int64_t budget_bytes = 0;
  std::size_t per_group = 1;
  double largest_bytes = 1;  // the largest graph among the candidates
};

HotSpaSearch prepare_search(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const HotSpaSearchOptions& options) {
  // Bounds whose finest group is empty merge into the next one.
  std::vector<std::int64_t> bounds;
  {
    const auto finest = group_lengths(lengths, options.bounds);
    for (std::size_t i = 0; i < finest.size(); ++i) {
      if (!finest[i].lengths.empty() || i + 1 == finest.size()) bounds.push_back(finest[i].hi);
    }
  }
  std::vector<LengthGroup> finest = group_lengths(lengths, bounds);
  return {s,
          options,
          lengths,
          std::move(bounds),
          std::move(finest),
          usable_hbm_bytes(s.cluster, s.hbm_headroom),
          budget_of(s),
          static_cast<std::size_t>(std::max(1, options.per_group))};
}

// Finest groups i..j-1 as one group.
LengthGroup merged(const HotSpaSearch& h, std::size_t i, std::size_t j) {
  LengthGroup g;
  g.lo = h.finest[i].lo;
  g.hi = h.finest[j - 1].hi;
  for (std::size_t k = i; k < j; ++k) g.lengths.insert(g.lengths.end(), h.finest[k].lengths.begin(), h.finest[k].lengths.end());
  std::sort(g.lengths.begin(), g.lengths.end(), std::greater<>());
  return g;
}

// The `limit` configurations with the best time bounds for a group, rows at `row_len` (h.largest_bytes grows to
// the largest graph among them).
std::vector<PlanSpec> candidates(HotSpaSearch& h, const LengthGroup& g, std::int64_t row_len, std::size_t limit) {
  const HotSpaSetting& s = h.s;
  throw_if_cancelled(s);
  std::vector<std::string> schemes;
  for (const auto& name : h.options.schemes) {
    const Scheme& scheme = scheme_named(name);
    if (scheme.hotspa && row_len >= scheme.hotspa->min_row_tokens) schemes.push_back(name);  // HotSPa switches between schemes with the facet
  }
  const Workload probe{row_len, std::int64_t{s.cluster.gpus()} * 64};
  std::map<std::string, std::pair<double, PlanSpec>> ranked;
  for (const PlanSpec& enumerated : enumerate_plans(inputs(s, probe), schemes)) {
    const GroupSetup setup = group_setup(s, g, {row_len, enumerated, true, row_len});
    const PlanSpec& spec = setup.spec;
    const std::string key = spec_key(spec);
    if (ranked.count(key)) continue;
    const StepInputs in = inputs(s, setup.rows.workload);
    try {
      check_plan(in, spec);
    } catch (const InputError&) {
      continue;
    }
    if (s.runnable && !s.runnable(in, spec)) continue;
    const double bytes = estimate_plan(in, spec).bytes;
    if (bytes > static_cast<double>(h.budget_bytes)) continue;  // too large to simulate here
    h.largest_bytes = std::max(h.largest_bytes, bytes);
    const Bounds b = lower_bounds(in, spec);
    if (b.hbm_bytes > h.hbm_usable) continue;
    ranked[key] = {b.step_s, spec};
  }
  std::vector<std::pair<double, PlanSpec>> order;
  for (auto& [key, v] : ranked) order.push_back(v);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<PlanSpec> out;
  for (std::size_t i = 0; i < order.size() && i < limit; ++i) out.push_back(order[i].second);
  return out;
}

// Candidate groups (i, j] and their configurations. The best time bounds often belong to configurations that run
// out of HBM once simulated (the memory bound is a lower bound), so a group none of whose configurations fit
// tries the next `per_group` down its list, for up to kTries rounds; static execution likewise tries until
// `per_group` fit. (The README's HotSPa example found neither among the first three of each.)
struct Job {
  std::size_t i, j;
  PlanSpec spec;
  GroupResult result;
  std::size_t range = 0;  // index into RangeCandidates::ranges
};

struct RangeCandidates {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;  // every contiguous range of the bounds
  std::vector<std::vector<PlanSpec>> lists;                 // each range's configurations, best bound first
};

RangeCandidates range_candidates(HotSpaSearch& h) {
  RangeCandidates c;
  const std::size_t nb = h.bounds.size();
  for (std::size_t i = 0; i < nb; ++i) {
    for (std::size_t j = i + 1; j <= nb; ++j) {
      c.ranges.push_back({i, j});
      c.lists.push_back(candidates(h, merged(h, i, j), h.bounds[j - 1], kTries * h.per_group));
    }
  }
  return c;
}

// Simulations done of those planned, for options.progress.
struct SearchProgress {
  const std::function<void(std::size_t done, std::size_t total)>& report;
  std::size_t total = 0;  // grows by each round's jobs
  std::atomic<std::size_t> done{0};

  void tick() {
    const std::size_t d = ++done;
    if (report) report(d, total);
  }
};

// Round `round`'s jobs: the next `per_group` configurations of each range none of whose configurations fit yet.
void add_round_jobs(const RangeCandidates& c, const std::vector<bool>& range_fits, std::size_t round, std::size_t per_group, std::vector<Job>& jobs) {
  for (std::size_t r = 0; r < c.ranges.size(); ++r) {
    if (range_fits[r]) continue;
    for (std::size_t k = round * per_group; k < std::min(c.lists[r].size(), (round + 1) * per_group); ++k) {
      jobs.push_back({c.ranges[r].first, c.ranges[r].second, c.lists[r][k], {}, r});
    }
  }
}

// Range jobs simulated here, each on one thread of the setting's (as many at once as the memory budget allows).
std::vector<GroupResult> simulate_jobs_here(const HotSpaSearch& h, const std::vector<RangeJob>& jobs, SearchProgress* progress) {
  std::vector<GroupResult> out(jobs.size());
  ThreadPool pool(h.s.threads);
  pool.for_each(
      jobs.size(),
      [&](std::size_t n) {
        HotSpaSetting one = h.s;
        one.threads = 1;
        out[n] = run_group(one, merged(h, jobs[n].i, jobs[n].j), {h.bounds[jobs[n].j - 1], jobs[n].spec, false, 0}, false);
        if (progress) progress->tick();
      },
      h.s.cancel, parallel_within(h.budget_bytes, h.largest_bytes));
  return out;
}

// The candidate groups simulated round by round (see Job), here or on options.farm; the jobs come back ordered by i.
std::vector<Job> simulate_ranges(const HotSpaSearch& h, const RangeCandidates& c, SearchProgress& progress) {
  std::vector<Job> jobs;
  std::vector<bool> range_fits(c.ranges.size(), false);
  for (std::size_t round = 0; round < kTries; ++round) {
    const std::size_t first = jobs.size();
    add_round_jobs(c, range_fits, round, h.per_group, jobs);
    if (jobs.size() == first) break;
    progress.total += jobs.size() - first;
    std::vector<RangeJob> wave;
    for (std::size_t k = first; k < jobs.size(); ++k) wave.push_back({jobs[k].i, jobs[k].j, jobs[k].spec});
    const std::vector<GroupResult> results = h.options.farm ? h.options.farm(wave) : simulate_jobs_here(h, wave, &progress);
    TRAINYARD_CHECK(results.size() == wave.size(), "the range farm answered every job");
    for (std::size_t k = 0; k < wave.size(); ++k) {
      jobs[first + k].result = results[k];
      if (h.options.farm) progress.tick();
    }
    throw_if_cancelled(h.s);
    for (std::size_t k = first; k < jobs.size(); ++k) range_fits[jobs[k].range] = range_fits[jobs[k].range] || jobs[k].result.fits;
  }
  // The shortest path below needs jobs ordered by i.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.i < b.i; });
  return jobs;
}

// Static: each candidate on the finest groups, rows at the longest bound, until `per_group` fit; the best into the
// report.
void run_statics(const HotSpaSearch& h, const std::vector<PlanSpec>& statics, SearchProgress& progress, HotSpaSearchReport& report) {
  std::optional<MinibatchResult> best_static, first_miss;
  std::size_t static_fits = 0;
  for (const PlanSpec& spec : statics) {
    if (static_fits >= h.per_group) break;
    throw_if_cancelled(h.s);
    MinibatchResult r = run_static(h.s, h.lengths, h.bounds, spec, false, "static " + spec.scheme);
    report.simulated += r.groups.size() + 1;
    progress.tick();
    if (!r.fits && !first_miss) first_miss = r;
    if (!r.fits) continue;
    ++static_fits;
    if (!best_static || r.total_s < best_static->total_s) {
      best_static = r;
      report.best_static = static_plans(h.bounds, spec, false);
    }
  }
  if (h.options.progress) h.options.progress(progress.total, progress.total);
  // Without a fitting static plan, the result says why the best-bounded one missed.
  if (best_static) report.static_result = *best_static;
  else if (first_miss) report.static_result = *first_miss;
}

// The simulated time of the switch between two jobs' layouts: Algorithm 1's plan for the parameters and the
// gradients, nothing overlapped. Layouts and times are memoised by strategy and row length.
class SwitchCosts {
 public:
  explicit SwitchCosts(const HotSpaSetting& s)
      : s_(s),
        gpn_(s.cluster.topology.gpus_per_node()),
        param_units_(unit_bytes(s.model, s.precision.weight_bytes)),
        grad_units_(unit_bytes(s.model, s.precision.grad_bytes)) {}
  double between(const Job& a, const Job& b);

 private:
  std::string layouts_of(const Job& job);  // the key of the job's layouts, computed on first use

  const HotSpaSetting& s_;
  int gpn_;
  std::vector<std::int64_t> param_units_, grad_units_;
  std::map<std::string, StateLayout> param_layouts_, grad_layouts_;
  std::map<std::pair<std::string, std::string>, double> switch_s_;
};

std::string SwitchCosts::layouts_of(const Job& job) {
  const std::string key = spec_key(job.spec) + std::to_string(job.result.rows.workload.seq_len);
  if (!param_layouts_.count(key)) {
    const StepInputs in = inputs(s_, job.result.rows.workload);
    param_layouts_[key] = parameter_layout(in, job.spec);
    grad_layouts_[key] = gradient_layout(in, job.spec);
  }
  return key;
}

double SwitchCosts::between(const Job& a, const Job& b) {
  const std::string ka = layouts_of(a), kb = layouts_of(b);
  if (ka == kb) return 0.0;
  auto it = switch_s_.find({ka, kb});
  if (it != switch_s_.end()) return it->second;
  const SwitchPlan p = plan_switch(param_layouts_[ka], param_layouts_[kb], param_units_, gpn_, s_.cluster.gpus());
  const SwitchPlan g = plan_switch(grad_layouts_[ka], grad_layouts_[kb], grad_units_, gpn_, s_.cluster.gpus());
  const double t = simulate_sends_s(s_, {&p, &g});
  switch_s_[{ka, kb}] = t;
  return t;
}

// Shortest path over the bounds: state (bound j, job ending there), a switch between neighbours costs the
// simulated transfers of Algorithm 1's plan (parameters and gradients, nothing overlapped). Returns the plans of
// the path, first group first; none when no path of fitting groups covers the bounds.
std::vector<GroupPlan> shortest_path(const HotSpaSearch& h, const std::vector<Job>& jobs) {
  SwitchCosts switch_cost(h.s);
  constexpr double kNone = 1e300;
  std::vector<double> cost(jobs.size(), kNone);
  std::vector<int> back(jobs.size(), -1);
  for (std::size_t k = 0; k < jobs.size(); ++k) {  // jobs are ordered by i, so predecessors come first
    if (!jobs[k].result.fits) continue;
    if (jobs[k].i == 0) {
      cost[k] = jobs[k].result.time_s;
      continue;
    }
    for (std::size_t p = 0; p < k; ++p) {
      if (jobs[p].j != jobs[k].i || cost[p] >= kNone) continue;
      const double c = cost[p] + switch_cost.between(jobs[p], jobs[k]) + jobs[k].result.time_s;
      if (c < cost[k]) {
        cost[k] = c;
        back[k] = static_cast<int>(p);
      }
    }
  }
  int best = -1;
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    const bool ends_last = jobs[k].j == h.bounds.size();
    if (ends_last && cost[k] < kNone && (best < 0 || cost[k] < cost[best])) best = static_cast<int>(k);
  }
  std::vector<GroupPlan> plans;
  for (int k = best; k >= 0; k = back[k]) {
    const Job& job = jobs[k];
    plans.insert(plans.begin(), GroupPlan{h.bounds[job.j - 1], job.spec, false, 0});
  }
  return plans;
}

}  // namespace

// Candidate configurations for every range of bounds and for the whole, the ranges simulated, static execution,
// then the cheapest hot-switched path.
HotSpaSearchReport search_hotspa(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const HotSpaSearchOptions& options) {
  HotSpaSearchReport report;
  HotSpaSearch h = prepare_search(s, lengths, options);
  const RangeCandidates ranges = range_candidates(h);
  const LengthGroup whole = merged(h, 0, h.bounds.size());
  const std::vector<PlanSpec> statics = candidates(h, whole, h.bounds.back(), kTries * h.per_group);
  SearchProgress progress{options.progress, statics.size()};
  const std::vector<Job> jobs = simulate_ranges(h, ranges, progress);
  report.simulated = jobs.size();
  run_statics(h, statics, progress, report);
  const std::vector<GroupPlan> plans = shortest_path(h, jobs);
  if (!plans.empty()) {
    report.switched_result = run_minibatch(s, lengths, plans, "hot-switched plan");
    report.best_switched = plans;
  }
  return report;
}

struct RangeSimulator::Prepared {
  Prepared(HotSpaSetting setting, std::vector<std::int64_t> lengths_in, HotSpaSearchOptions options_in)
      : s(std::move(setting)), lengths(std::move(lengths_in)), options(std::move(options_in)), h(prepare_search(s, lengths, options)) {}
  HotSpaSetting s;
  std::vector<std::int64_t> lengths;
  HotSpaSearchOptions options;
  HotSpaSearch h;  // refers to the three above
};

RangeSimulator::RangeSimulator(const HotSpaSetting& s, const std::vector<std::int64_t>& lengths, const HotSpaSearchOptions& options)
    : prepared_(std::make_unique<Prepared>(s, lengths, options)) {}
RangeSimulator::~RangeSimulator() = default;

std::vector<GroupResult> RangeSimulator::run(const std::vector<RangeJob>& jobs) const { return simulate_jobs_here(prepared_->h, jobs, nullptr); }

Json group_result_record(const GroupResult& g) {
  const GroupRows& r = g.rows;
  return {{"lo", g.lo},
          {"hi", g.hi},
          {"sequences", g.sequences},
          {"tokens", g.tokens},
          {"rows",
           {{"seq_len", r.workload.seq_len},
            {"global_batch", r.workload.global_batch},
            {"attention_density", r.attention_density},
            {"fill", r.fill},
            {"sequences", r.sequences},
            {"packed_rows", r.packed_rows},
            {"dropped_rows", r.dropped_rows}}},
          {"plan", plan_spec_record(g.spec)},
          {"fits", g.fits},
          {"failure", g.failure},
          {"time_s", g.time_s},
          {"peak_hbm_bytes", g.peak_hbm_bytes},
          {"model_flops", g.model_flops}};
}

GroupResult group_result_from_record(const Json& j, const std::string& origin) {
  try {
    GroupResult g;
    g.lo = j.at("lo").get<std::int64_t>();
    g.hi = j.at("hi").get<std::int64_t>();
    g.sequences = j.at("sequences").get<std::int64_t>();
    g.tokens = j.at("tokens").get<std::int64_t>();
    const Json& r = j.at("rows");
    g.rows.workload = {r.at("seq_len").get<std::int64_t>(), r.at("global_batch").get<std::int64_t>()};
    g.rows.attention_density = r.at("attention_density").get<double>();
    g.rows.fill = r.at("fill").get<double>();
    g.rows.sequences = r.at("sequences").get<std::int64_t>();
    g.rows.packed_rows = r.at("packed_rows").get<std::int64_t>();
    g.rows.dropped_rows = r.at("dropped_rows").get<std::int64_t>();
    g.spec = plan_spec_from_record(j.at("plan"), origin);
    g.fits = j.at("fits").get<bool>();
    g.failure = j.at("failure").get<std::string>();
    g.time_s = j.at("time_s").get<double>();
    g.peak_hbm_bytes = j.at("peak_hbm_bytes").get<std::int64_t>();
    g.model_flops = j.at("model_flops").get<double>();
    return g;
  } catch (const Json::exception& e) {
    throw InputError(origin, "group result", "every field of a simulated length group (planner/hotspa.hpp)", e.what());
  }
}

std::string table3(const MinibatchResult& st, const MinibatchResult& sw) {
  TextTable t({"group", "sequences", "tokens", "static", "hot-switched", "speedup", "hot-switched strategy"},
              {false, true, true, true, true, true, false});
  std::vector<std::vector<std::string>> rows;
  for (const GroupResult& g : st.groups) {
    rows.push_back(
        {range_name(g.lo, g.hi), std::to_string(g.sequences), format_tokens(g.tokens), g.fits ? format_seconds(g.time_s) : "no fit", "", "", ""});
  }
  // A switched group spans one or more static rows: its time goes on the first, the speedup against their sum.
  for (const GroupResult& h : sw.groups) {
    double static_s = 0;
    int first = -1;
    for (std::size_t r = 0; r < st.groups.size(); ++r) {
      if (st.groups[r].hi <= h.lo || st.groups[r].lo >= h.hi) continue;
      static_s += st.groups[r].time_s;
      if (first < 0) first = static_cast<int>(r);
    }
    if (first < 0) continue;
    auto& row = rows[first];
    row[4] = (h.fits ? format_seconds(h.time_s) : "no fit") + " (" + range_name(h.lo, h.hi) + ")";
    row[5] = h.fits && static_s > 0 ? format_fixed(static_s / h.time_s, 2) + "x" : "-";
    row[6] = h.spec.scheme + " " + h.spec.summary();
  }
  for (auto& row : rows) t.add_row(std::move(row));
  t.add_row({"Others", "", "", "-", format_seconds(sw.others_s), "",
             std::to_string(sw.switches.size()) + (sw.switches.size() == 1 ? " switch" : " switches")});
  const bool both = st.fits && sw.fits;
  t.add_row({"Total", "", "", st.fits ? format_seconds(st.total_s) : "no fit", sw.fits ? format_seconds(sw.total_s) : "no fit",
             both ? format_fixed(st.total_s / sw.total_s, 2) + "x" : "-", ""});
  std::ostringstream out;
  t.print(out);
  return out.str();
}

Json minibatch_json(const MinibatchResult& r, const sim::Cluster& cluster) {
  Json groups = Json::array();
  for (const auto& g : r.groups) {
    groups.push_back({{"lo", g.lo},
                      {"hi", g.hi},
                      {"sequences", g.sequences},
                      {"tokens", g.tokens},
                      {"rows", g.rows.workload.global_batch},
                      {"packed_rows", g.rows.packed_rows},
                      {"dropped_rows", g.rows.dropped_rows},
                      {"row_len", g.rows.workload.seq_len},
                      {"fill", g.rows.fill},
                      {"attention_density", g.rows.attention_density},
                      {"scheme", g.spec.scheme},
                      {"parameters", parameters_json(g.spec)},
                      {"summary", g.spec.summary()},
                      {"fits", g.fits},
                      {"failure", g.failure},
                      {"time_s", g.time_s},
                      {"peak_hbm_bytes", g.peak_hbm_bytes}});
  }
  Json switches = Json::array();
  for (const auto& s : r.switches) {
    switches.push_back({{"from", s.from},
                        {"to", s.to},
                        {"param_bytes", s.param_bytes},
                        {"grad_bytes", s.grad_bytes},
                        {"params_overlapped", s.params_overlapped},
                        {"exposed_s", s.exposed_s}});
  }
  Json out = {{"groups", groups}, {"switches", switches}, {"others_s", r.others_s}, {"total_s", r.total_s},
              {"fits", r.fits},   {"failure", r.failure}, {"mfu", r.mfu(cluster)}};
  if (r.whole_rows > 0) out["whole_rows"] = r.whole_rows;
  return out;
}

}  // namespace trainyard::planner
