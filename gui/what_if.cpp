#include "gui/what_if.hpp"

#include <algorithm>
#include <set>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/json_reader.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/analytic.hpp"
#include "planner/estimate.hpp"
#include "sim/report.hpp"

namespace trainyard::gui {

namespace {

hw::NodeProfile checked_node(const WhatIfInputs& inputs) {
  hw::NodeProfile node = hw::load_node(inputs.hw, "--hw");
  hw::check_node_count(inputs.nodes, node);
  return node;
}

}  // namespace

Setup::Setup(const WhatIfInputs& in)
    : inputs(in),
      model(model::load_model(in.model, "--model")),
      cluster(checked_node(in), in.nodes, stacks::load_stack(in.stack, "--stack")),
      precision(model::precision_policy("bf16-mixed")) {
  if (in.seq_len < 1) throw InputError("--seq", "value", "a positive token count", std::to_string(in.seq_len));
  if (in.tokens_per_step < 0) {
    throw InputError("--tokens-per-step", "value", "a positive token count (or 0: one sequence per step)", std::to_string(in.tokens_per_step));
  }
  if (!(in.hbm_headroom >= 0 && in.hbm_headroom < 1)) {
    throw InputError("--hbm-headroom", "value", "a fraction in [0, 1)", std::to_string(in.hbm_headroom));
  }
}

planner::StepInputs Setup::at(std::int64_t seq_len) const {
  const std::int64_t sequences = std::max<std::int64_t>(1, inputs.tokens_per_step / seq_len);
  return {model, cluster, {seq_len, sequences}, precision};
}

app::ErrorBar error_bar_of(const Setup& setup, const std::string& scheme) {
  return app::error_bar(app::step_kind(scheme, setup.cluster, setup.at(setup.inputs.seq_len).workload, setup.cluster.gpus()));
}

void check_sequence_control_length(std::int64_t seq_len, const std::string& origin, const std::string& field, const std::string& as_given) {
  if (seq_len < 1 || seq_len > kMaxSeqLen || (seq_len & (seq_len - 1)) != 0) {
    throw InputError(origin, field, "a power of two up to 16M (the GUI's sequence control; trainyard simulate --plan takes any length)", as_given);
  }
}

std::vector<std::int64_t> memory_sweep_lengths(std::int64_t seq_len) {
  std::vector<std::int64_t> out;
  const std::int64_t low = std::max(std::min(kMinSeqLen, seq_len), seq_len / 64), high = std::min(kMaxSeqLen, seq_len * 4);
  std::int64_t s = 1;
  while (s < low) s *= 2;
  for (; s <= high; s *= 2) out.push_back(s);
  return out;
}

bool has_chunk(const std::string& scheme) {
  const planner::Scheme* s = planner::find_scheme(scheme);
  return s != nullptr && s->chunk.has_value();
}

std::int64_t chunk_of(const planner::PlanSpec& spec) { return has_chunk(spec.scheme) ? planner::scheme_named(spec.scheme).chunk->tokens(spec) : 0; }

planner::PlanSpec with_chunk(planner::PlanSpec spec, std::int64_t chunk) {
  if (has_chunk(spec.scheme)) planner::scheme_named(spec.scheme).chunk->set_tokens(spec, chunk);
  return spec;
}

std::string too_large_to_simulate(const planner::PlanSpec& spec, std::int64_t seq_len) {
  const std::int64_t chunk = chunk_of(spec);
  if (chunk <= 0) return "";
  const std::int64_t chunks = seq_len / chunk;
  const std::int64_t limit = planner::scheme_named(spec.scheme).chunk->interactive_chunks;
  if (chunks <= limit) return "";
  return std::to_string(chunks) + " chunks per sequence: more than the " + std::to_string(limit) +
         " the charts sweep (the selected plan and trainyard simulate run it)";
}

std::vector<std::int64_t> chunk_sweep(const std::string& scheme, std::int64_t seq_len) {
  std::vector<std::int64_t> out;
  if (!has_chunk(scheme)) return out;
  const planner::PlanSpec probe = planner::scheme_named(scheme).blank();
  for (std::int64_t c : planner::chunk_sizes(seq_len)) {
    if (too_large_to_simulate(with_chunk(probe, c), seq_len).empty()) out.push_back(c);
  }
  return out;
}

MemoryGate& graph_memory_gate() {
  static MemoryGate gate(static_cast<double>(default_memory_budget_bytes()));
  return gate;
}

Point simulate_point(const planner::StepInputs& in, const planner::PlanSpec& spec, double hbm_headroom, std::int64_t x,
                     const std::atomic<bool>* cancel) {
  Point p;
  p.scheme = spec.scheme;
  p.x = x;
  p.summary = spec.summary();
  p.skipped = too_large_to_simulate(spec, in.workload.seq_len);
  if (!p.skipped.empty()) return p;
  // A point whose graph alone is over the window's budget is left out, not run alone past it: the charts sweep to
  // 4M tokens, where such graphs took the window to several GiB (the selected plan still runs whatever its size).
  const planner::GraphEstimate estimate = planner::estimate_plan(in, spec);
  if (estimate.bytes > graph_memory_gate().budget_bytes()) {
    p.skipped = "its step graph, an estimated " + format_count(estimate.tasks) + " tasks (" + format_bytes(estimate.bytes) +
                "), is over the window's memory budget (" + format_bytes(graph_memory_gate().budget_bytes()) +
                "): trainyard simulate --memory-budget runs it";
    return p;
  }
  sim::SimResult r;
  try {
    const MemoryGate::Hold hold(graph_memory_gate(), estimate.bytes);
    r = planner::simulate_plan_step(in, spec, cancel);
  } catch (const InputError& e) {  // a plan that cannot be built
    p.skipped = e.what();
    return p;
  }
  p.metrics = planner::measure(r, in, hbm_headroom);
  p.hbm_needed_bytes = p.metrics.peak_hbm_bytes;
  p.dram_needed_bytes = p.metrics.peak_dram_bytes;
  if (r.oom) {
    p.out_of_memory = true;
    const std::int64_t needed = r.oom->in_use_bytes + r.oom->requested_bytes;
    auto& pool_peak = r.oom->pool.find("hbm") != std::string::npos ? p.hbm_needed_bytes : p.dram_needed_bytes;
    pool_peak = std::max(pool_peak, needed);
  }
  return p;
}

namespace {

// The first of `preferred` that is of `scheme` and valid at this step.
std::optional<planner::PlanSpec> first_valid(const planner::StepInputs& in, const std::string& scheme,
                                             const std::vector<planner::PlanSpec>& preferred) {
  for (const auto& p : preferred) {
    if (p.scheme != scheme) continue;
    try {
      planner::check_plan(in, p);
      return p;
    } catch (const InputError&) {
      // not valid at this length (a batch the degrees do not divide, say): the next choice
    }
  }
  return std::nullopt;
}

// `spec` with a chunk the charts can use at this length (see chart_plan).
std::optional<planner::PlanSpec> with_chart_chunk(const planner::StepInputs& in, std::optional<planner::PlanSpec> spec) {
  if (!spec || !has_chunk(spec->scheme)) return spec;
  const std::int64_t S = in.workload.seq_len;
  // The chunk must divide this length and keep the graph small enough; otherwise the nearest one that does.
  const std::vector<std::int64_t> chunks = chunk_sweep(spec->scheme, S);
  if (chunks.empty()) return std::nullopt;
  const std::int64_t chunk = chunk_of(*spec);
  if (std::find(chunks.begin(), chunks.end(), chunk) != chunks.end()) return spec;
  const auto above = std::lower_bound(chunks.begin(), chunks.end(), chunk);
  return with_chunk(*spec, above == chunks.end() ? chunks.back() : *above);
}

}  // namespace

std::optional<planner::PlanSpec> chart_plan(const planner::StepInputs& in, const std::string& scheme, const std::vector<planner::PlanSpec>& preferred,
                                            double hbm_headroom) {
  std::optional<planner::PlanSpec> spec = first_valid(in, scheme, preferred);
  if (!spec) spec = planner::quick_plan(in, scheme, hbm_headroom);
  return with_chart_chunk(in, spec);
}

std::vector<std::pair<std::int64_t, planner::PlanSpec>> chunk_points(const planner::PlanSpec& spec, std::int64_t seq_len) {
  std::vector<std::pair<std::int64_t, planner::PlanSpec>> out;
  for (std::int64_t c : chunk_sweep(spec.scheme, seq_len)) out.emplace_back(c, with_chunk(spec, c));
  if (out.empty()) out.emplace_back(0, spec);
  return out;
}

Point estimate_point(const planner::StepInputs& in, const planner::PlanSpec& spec, double hbm_headroom, std::int64_t x) {
  Point p;
  p.scheme = spec.scheme;
  p.x = x;
  p.summary = spec.summary();
  p.provisional = true;
  const planner::StepEstimate e = planner::analytic_estimate(in, spec, hbm_headroom);
  p.metrics.fits = e.fits;
  p.metrics.step_s = e.step_s;
  p.metrics.mfu = e.mfu;
  p.metrics.tokens_per_s = e.step_s > 0 ? static_cast<double>(in.workload.tokens()) / e.step_s : 0;
  p.metrics.peak_hbm_bytes = static_cast<std::int64_t>(e.hbm_bytes);
  p.metrics.peak_dram_bytes = static_cast<std::int64_t>(e.dram_bytes);
  p.hbm_needed_bytes = p.metrics.peak_hbm_bytes;
  p.dram_needed_bytes = p.metrics.peak_dram_bytes;
  return p;
}

ChartEstimates estimate_charts(const Setup& setup, const std::vector<planner::PlanSpec>& preferred) {
  ChartEstimates out;
  const double headroom = setup.inputs.hbm_headroom;
  const planner::StepInputs at_seq = setup.at(setup.inputs.seq_len);
  for (const auto& scheme : setup.inputs.schemes) {
    const std::optional<planner::PlanSpec> spec = with_chart_chunk(at_seq, first_valid(at_seq, scheme, preferred));
    if (spec) {
      for (const auto& [c, point] : chunk_points(*spec, setup.inputs.seq_len)) {
        if (first_valid(at_seq, scheme, {point})) out.chunk.push_back(estimate_point(at_seq, point, headroom, c));
      }
    }
    for (std::int64_t length : memory_sweep_lengths(setup.inputs.seq_len)) {
      const planner::StepInputs in = setup.at(length);
      if (const auto here = with_chart_chunk(in, first_valid(in, scheme, preferred)))
        out.memory.push_back(estimate_point(in, *here, headroom, length));
    }
  }
  return out;
}

PlanDetail simulate_plan_detail(std::shared_ptr<const Setup> setup, const planner::PlanSpec& spec, const std::atomic<bool>* cancel) {
  PlanDetail d;
  d.setup = setup;
  d.spec = spec;
  const planner::StepInputs in = setup->at(setup->inputs.seq_len);
  // Held while built and simulated; the plan kept for the window afterwards is not counted (one at a time).
  const MemoryGate::Hold hold(graph_memory_gate(), planner::estimate_plan(in, spec).bytes);
  auto graph = std::make_shared<sim::TaskGraph>(planner::build_plan(in, spec));
  graph->finalize();
  sim::SimOptions options;
  options.cancel = cancel;
  auto result = std::make_shared<sim::SimResult>(sim::simulate(*graph, setup->cluster, options));
  d.metrics = planner::measure(*result, in, setup->inputs.hbm_headroom);
  auto timeline = std::make_shared<sim::Timeline>(sim::to_timeline(*result, *graph));
  d.rows = std::make_shared<TimelineRows>(index_timeline(*timeline));
  d.timeline = std::move(timeline);
  d.graph = std::move(graph);
  d.result = std::move(result);
  return d;
}

MeasuredTrace read_measured_trace(const std::string& path) {
  const json::Json document = json::parse_file(path, kTraceFileCapBytes);  // the cap `trainyard compare` reads traces with
  MeasuredTrace m{sim::parse_timeline(document, path)};
  // Written by write_chrome_trace when the trace keeps part of the step; older traces hold all of it.
  const auto other = document.find("otherData");
  if (other != document.end() && other->is_object() && other->contains("selection")) {
    const json::Reader selection((*other)["selection"], path, "otherData.selection");
    const double start_ns = selection.number("start_ns", {0, 1e18, "ns", true});
    const double end_ns = selection.number("end_ns", {-1, 1e18, "ns", true});
    m.whole_step = start_ns == 0 && (end_ns < 0 || end_ns >= static_cast<double>(m.timeline.step_ns));
  }
  return m;
}

std::string measured_mismatch(const sim::Timeline& predicted, const MeasuredTrace& measured) {
  const sim::Timeline& m = measured.timeline;
  const std::string file = m.origin.empty() ? "the measured trace" : m.origin;
  if (m.peak_hbm_bytes.size() != predicted.peak_hbm_bytes.size()) {
    return file + " is a step on " + std::to_string(m.peak_hbm_bytes.size()) + " GPUs; the selected plan runs on " +
           std::to_string(predicted.peak_hbm_bytes.size());
  }
  if (m.slices.empty()) return file + " holds no task";
  using Key = std::pair<std::string, std::string>;  // task name, device: how compare matches tasks
  std::set<Key> planned, seen;
  std::set<std::string> devices;
  for (const auto& s : predicted.slices) planned.insert({s.name, predicted.device_label(s.pid)});
  const Key* foreign = nullptr;
  std::size_t foreign_count = 0;
  for (const auto& s : m.slices) {
    const auto& key = *seen.insert({s.name, m.device_label(s.pid)}).first;
    devices.insert(key.second);
    if (!planned.count(key)) foreign = foreign ? foreign : &key, ++foreign_count;
  }
  if (foreign) {
    return file + " is not a trace of the selected plan: " + std::to_string(foreign_count) + " of its " + std::to_string(m.slices.size()) +
           " tasks are not in the plan (first: \"" + foreign->first + "\" on " + foreign->second + ")";
  }
  if (!measured.whole_step) return "";  // a window: the plan's tasks outside it are missing by design
  std::size_t missing = 0;
  const sim::TimelineSlice* first = nullptr;
  for (const auto& s : predicted.slices) {
    const std::string device = predicted.device_label(s.pid);
    if (devices.count(device) && !seen.count({s.name, device})) first = first ? first : &s, ++missing;
  }
  if (!first) return "";
  return file + " is not a trace of the selected plan: " + std::to_string(missing) +
         " of the plan's tasks on the GPUs it covers are not in it (first: \"" + first->name + "\" on " + predicted.device_label(first->pid) + ")";
}

TimelineRows index_timeline(const sim::Timeline& t) {
  TimelineRows rows;
  for (std::size_t i = 0; i < t.slices.size(); ++i) rows[t.slices[i].pid][t.slices[i].tid].push_back(i);
  for (auto& [pid, streams] : rows) {
    for (auto& [tid, indices] : streams) {
      std::stable_sort(indices.begin(), indices.end(), [&t](std::size_t a, std::size_t b) { return t.slices[a].start_ns < t.slices[b].start_ns; });
    }
  }
  return rows;
}

planner::PlanFile plan_file(const Setup& setup, const planner::PlanSpec& spec, const planner::PlanMetrics* predicted) {
  planner::PlanFile f;
  f.model = setup.inputs.model;
  f.hw = setup.inputs.hw;
  f.nodes = setup.inputs.nodes;
  f.stack = setup.inputs.stack;
  f.workload = setup.at(setup.inputs.seq_len).workload;
  f.spec = spec;
  if (predicted) f.predicted = planner::metrics_json(*predicted);
  return f;
}

}  // namespace trainyard::gui
