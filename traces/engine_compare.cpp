#include "traces/engine_compare.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "common/error.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"

namespace trainyard::traces {

namespace {

using sim::ComparisonRow;

// The simulator's classes, then the time no rule classifies.
std::vector<std::string> class_order() {
  std::vector<std::string> order = sim::task_classes();
  order.emplace_back(kUnclassified);
  return order;
}
const std::vector<std::string> kKindOrder = {"compute", "communication", "copies in", "copies out"};
// A count or size this far from the plan's (either way) is reported as a contradiction, not as noise.
constexpr double kCountRatio = 1.5;
constexpr double kSizeTolerance = 0.1;

const char* kind_of_class(const std::string& c) {
  if (c == "collective" || c == "p2p") return "communication";
  if (c == "H2D") return "copies in";
  if (c == "D2H") return "copies out";
  return "compute";
}
const char* kind_of_stream(const std::string& label) {  // trainyard's stream names: compute0, comm, comm1, h2d, d2h
  if (label.starts_with("comm")) return "communication";
  if (label.starts_with("h2d")) return "copies in";
  if (label.starts_with("d2h")) return "copies out";
  return "compute";
}

std::string class_of(const GpuActivity& a, const RankTrace& r, const KernelClassifier& classes) {
  switch (a.kind) {
    case GpuActivity::Kind::kernel: return classes.classify(r.names[a.name]);
    case GpuActivity::Kind::memcpy_h2d: return "H2D";
    case GpuActivity::Kind::memcpy_d2h: return "D2H";
    case GpuActivity::Kind::memcpy_p2p: return "p2p";
    default: return "elementwise";  // device-to-device copies and memsets run on the SMs or the copy engine at HBM speed
  }
}

// Per GPU per step: time (ns, as double before rounding) and count.
struct Tally {
  double ns = 0, count = 0;
};

struct Measured {
  std::map<std::string, Tally> by_class, by_kind;
  std::map<std::string, Tally> unclassified;                           // by kernel name
  std::map<std::pair<std::string, std::int64_t>, double> collectives;  // (name, bytes) -> per GPU per step
  std::vector<std::int64_t> step_ns;
  int steps = 0;
  bool annotated = true;
};

// The step windows a rank's activities are counted in, each from its step's start to the next one's (the last to
// the end of the rank's last kernel, or of its own span): the GPU's own ProfilerStep spans where the trace has
// them, else the host's steps. The GPU's span of a step is cut short where a nested annotation begins (PyTorch 2.x
// records "Optimizer.step#AdamW.step" as a span of its own on the GPU), so a GPU step runs to the next one's start,
// not to its span's end, and that length is the step's time (a host step's is its span). The profiler's schedule
// keeps warm-up steps out of the trace. No steps at all: the whole trace is one step.
std::vector<std::pair<std::int64_t, std::int64_t>> windows(const RankTrace& r, Measured& m) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = 0;
  for (const auto& a : r.activities) first = std::min(first, a.start_ns), last = std::max(last, a.start_ns + a.duration_ns);
  std::int64_t last_kernel = 0;  // the last GPU step ends with its kernels, not with a trailing copy
  for (const auto& a : r.activities) {
    if (a.kind == GpuActivity::Kind::kernel) last_kernel = std::max(last_kernel, a.start_ns + a.duration_ns);
  }
  if (r.steps.empty() && r.gpu_steps.empty()) {
    m.annotated = false;
    m.step_ns.push_back(last - first);
    out.emplace_back(std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
    return out;
  }
  const std::vector<ProfilerStep>& steps = r.gpu_steps.empty() ? r.steps : r.gpu_steps;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const ProfilerStep& s = steps[i];
    const std::int64_t end = i + 1 < steps.size() ? steps[i + 1].start_ns
                                                  : std::max(s.start_ns + s.duration_ns, r.gpu_steps.empty() ? 0 : last_kernel);
    out.emplace_back(s.start_ns, end);
    m.step_ns.push_back(r.gpu_steps.empty() ? s.duration_ns : end - s.start_ns);  // the host's spans are whole steps
  }
  return out;
}

// One rank's activities in its windows, added to `m` divided by the rank's steps (per_rank divides by the ranks).
void tally_rank(const RankTrace& r, const KernelClassifier& classes, Measured& m) {
  const auto steps = windows(r, m);
  m.steps += static_cast<int>(steps.size());
  const double share = 1.0 / static_cast<double>(steps.size());
  std::map<std::pair<int, int>, std::map<std::string, double>> stream_classes;  // (device, stream) -> class -> ns
  for (const GpuActivity& a : r.activities) {
    const bool counted = std::any_of(steps.begin(), steps.end(), [&](const auto& w) { return a.start_ns >= w.first && a.start_ns < w.second; });
    if (!counted) continue;
    const std::string c = class_of(a, r, classes);
    const auto ns = static_cast<double>(a.duration_ns);
    m.by_class[c].ns += ns * share;
    m.by_class[c].count += share;
    stream_classes[{a.device, a.stream}][c] += ns;
    if (c == kUnclassified) {
      m.unclassified[r.names[a.name]].ns += ns * share;
      m.unclassified[r.names[a.name]].count += share;
    }
    if (a.collective >= 0) {
      const CollectiveInfo& info = r.collectives[static_cast<std::size_t>(a.collective)];
      m.collectives[{info.name, info.bytes()}] += share;
    }
  }
  for (const auto& [stream, by_class] : stream_classes) {
    const auto dominant = std::max_element(by_class.begin(), by_class.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    double total = 0;
    for (const auto& [c, ns] : by_class) total += ns;
    m.by_kind[kind_of_class(dominant->first)].ns += total * share;
  }
}

// Sums over `ranks` ranks as the mean per rank (per GPU).
void per_rank(Measured& m, int ranks) {
  const double share = 1.0 / ranks;
  for (auto* tallies : {&m.by_class, &m.by_kind, &m.unclassified}) {
    for (auto& [key, t] : *tallies) t.ns *= share, t.count *= share;
  }
  for (auto& [key, per_step] : m.collectives) per_step *= share;
}

std::int64_t median(std::vector<std::int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Predicted {
  int gpus = 0;
  std::map<std::string, Tally> by_class, by_kind;
  std::vector<std::int64_t> collective_bytes;  // every collective slice's bytes
};

Predicted tally_predicted(const sim::Timeline& t) {
  Predicted p;
  std::set<int> gpus;
  for (const auto& s : t.slices) {
    if (t.device_label(s.pid).starts_with("gpu")) gpus.insert(s.pid);
  }
  p.gpus = static_cast<int>(gpus.size());
  if (p.gpus == 0) throw InputError(t.origin, "traceEvents", "tasks on GPUs (a timeline of `trainyard simulate --trace`)", "none");
  const double share = 1.0 / p.gpus;
  for (const auto& s : t.slices) {
    if (!gpus.count(s.pid)) continue;
    p.by_class[s.task_class].ns += static_cast<double>(s.duration_ns) * share;
    p.by_class[s.task_class].count += share;
    const std::string stream = t.stream_label(s.pid, s.tid);
    p.by_kind[kind_of_stream(stream.substr(stream.find(' ') + 1))].ns += static_cast<double>(s.duration_ns) * share;
    if ((s.task_class == "collective" || s.task_class == "p2p") && s.bytes > 0)
      p.collective_bytes.push_back(s.bytes);  // NCCL's sends carry metadata too
  }
  return p;
}

ComparisonRow row(const std::string& what, const Tally& predicted, const Tally& measured) {
  return {what, std::llround(predicted.ns), std::llround(measured.ns), static_cast<int>(std::lround(predicted.count)),
          static_cast<int>(std::lround(measured.count))};
}

std::vector<ComparisonRow> rows(const std::vector<std::string>& order, const std::map<std::string, Tally>& predicted,
                                const std::map<std::string, Tally>& measured) {
  std::vector<ComparisonRow> out;
  for (const std::string& what : order) {
    const auto p = predicted.find(what);
    const auto m = measured.find(what);
    if (p == predicted.end() && m == measured.end()) continue;
    out.push_back(row(what, p != predicted.end() ? p->second : Tally{}, m != measured.end() ? m->second : Tally{}));
  }
  return out;
}

void count_contradiction(const char* what, const Tally& predicted, const Tally& measured, std::vector<std::string>& out) {
  const double p = predicted.count, m = measured.count;
  if (p <= 0 && m <= 0) return;
  if (p > 0 && m > 0 && m / p <= kCountRatio && p / m <= kCountRatio) return;
  out.push_back("the plan runs " + format_fixed(p, 1) + " " + what + " per GPU per step, the trace " + format_fixed(m, 1) +
                ": the engine fuses, splits or schedules them otherwise than the plan's step");
}

// Collectives of the trace whose size no collective of the plan has (within 10%).
void size_contradictions(const Predicted& p, const Measured& m, std::vector<std::string>& out) {
  if (p.collective_bytes.empty()) return;  // a timeline without sizes (written before they were recorded): nothing to hold
  for (const auto& [key, per_step] : m.collectives) {
    const std::string& name = key.first;
    const std::int64_t bytes = key.second;  // not a structured binding: clang 14 cannot capture one in the lambda below
    if (bytes <= 0) continue;
    const bool planned = std::any_of(p.collective_bytes.begin(), p.collective_bytes.end(), [&](std::int64_t b) {
      return std::abs(static_cast<double>(b - bytes)) <= kSizeTolerance * static_cast<double>(bytes);
    });
    if (planned) continue;
    out.push_back("the trace has " + format_fixed(per_step, 1) + " " + (name.empty() ? "collective" : name) + " of " +
                  format_bytes(static_cast<double>(bytes)) + " per GPU per step, a size no collective or send of the plan has");
  }
}

}  // namespace

EngineComparison compare_with_engine(const sim::Timeline& predicted, const std::vector<RankTrace>& measured, const KernelClassifier& classes) {
  return compare_with_engine(predicted, each_rank(measured), classes);
}

EngineComparison compare_with_engine(const sim::Timeline& predicted, const RankSource& next_rank, const KernelClassifier& classes) {
  sim::require_whole_step(predicted);
  EngineComparison c;
  c.predicted_origin = predicted.origin;
  const Predicted p = tally_predicted(predicted);
  Measured m;
  int ranks = 0;
  while (const RankTrace* r = next_rank()) {
    if (ranks == 0) c.measured_origin = r->origin;
    tally_rank(*r, classes, m);
    ++ranks;
  }
  TRAINYARD_CHECK(ranks > 0, "a measured trace");
  if (ranks > 1) c.measured_origin += " and " + std::to_string(ranks - 1) + " more";
  per_rank(m, ranks);
  c.predicted_gpus = p.gpus;
  c.measured_ranks = ranks;
  c.measured_steps = m.steps;
  c.steps_annotated = m.annotated;
  c.step = {"step", predicted.step_ns, median(m.step_ns), 1, 1};
  c.by_class = rows(class_order(), p.by_class, m.by_class);
  c.by_stream_kind = rows(kKindOrder, p.by_kind, m.by_kind);
  for (const auto& [name, t] : m.unclassified) c.unclassified.push_back({name, std::llround(t.ns), static_cast<int>(std::lround(t.count))});
  std::sort(c.unclassified.begin(), c.unclassified.end(), [](const auto& a, const auto& b) { return a.ns > b.ns; });
  if (c.unclassified.size() > 10) c.unclassified.resize(10);
  c.largest = c.by_class;
  std::sort(c.largest.begin(), c.largest.end(),
            [](const auto& a, const auto& b) { return std::llabs(a.predicted_ns - a.measured_ns) > std::llabs(b.predicted_ns - b.measured_ns); });
  if (c.largest.size() > 3) c.largest.resize(3);
  const auto tally = [](const std::map<std::string, Tally>& in, const char* k) {
    const auto it = in.find(k);
    return it == in.end() ? Tally{} : it->second;
  };
  count_contradiction("GEMMs", tally(p.by_class, "gemm"), tally(m.by_class, "gemm"), c.contradictions);
  count_contradiction("collectives", tally(p.by_class, "collective"), tally(m.by_class, "collective"), c.contradictions);
  size_contradictions(p, m, c.contradictions);
  if (!m.annotated) c.contradictions.push_back("the traces mark no ProfilerStep#N: the whole trace counts as one step");
  const double unclassified = tally(m.by_class, kUnclassified).ns;
  double total = 0;
  for (const auto& [what, t] : m.by_class) total += t.ns;
  if (total > 0 && unclassified > 0.1 * total) {
    c.contradictions.push_back(format_fixed(100 * unclassified / total, 0) +
                               "% of the measured GPU time is in kernels no rule classifies: add rules with --kernel-classes");
  }
  return c;
}

void print_engine_comparison(std::ostream& out, const EngineComparison& c) {
  const auto ms = [](std::int64_t ns) { return format_fixed(static_cast<double>(ns) * 1e-6, 3); };
  const auto pct = [](double e) { return std::isfinite(e) ? format_fixed(100 * e, 1) + "%" : std::string("-"); };
  out << "step time: predicted " << ms(c.step.predicted_ns) << " ms, measured " << ms(c.step.measured_ns) << " ms (median of " << c.measured_steps
      << " step" << (c.measured_steps == 1 ? "" : "s") << " over " << c.measured_ranks << " rank" << (c.measured_ranks == 1 ? "" : "s") << "), error "
      << pct(c.step.error()) << "\n"
      << "per GPU per step: " << c.predicted_gpus << " GPUs predicted, " << c.measured_ranks << " ranks measured\n";
  for (const auto& [title, rows] : {std::pair{"task class", &c.by_class}, std::pair{"stream kind", &c.by_stream_kind}}) {
    out << "\n";
    TextTable table({title, "predicted ms", "measured ms", "error", "predicted n", "measured n"}, {false, true, true, true, true, true});
    for (const auto& r : *rows) {
      const bool counted = std::string(title) == "task class";
      table.add_row({r.what, ms(r.predicted_ns), ms(r.measured_ns), pct(r.error()), counted ? std::to_string(r.predicted_count) : "",
                     counted ? std::to_string(r.measured_count) : ""});
    }
    table.print(out);
  }
  if (!c.unclassified.empty()) {
    out << "\nunclassified kernels (per GPU per step):\n";
    for (const auto& k : c.unclassified) out << "  " << ms(k.ns) << " ms  x" << k.count << "  " << k.name.substr(0, 120) << "\n";
  }
  if (!c.largest.empty()) {
    out << "\nlargest differences:";
    for (const auto& r : c.largest) out << " " << r.what << " " << ms(r.predicted_ns - r.measured_ns) << " ms;";
    out << "\n";
  }
  if (!c.contradictions.empty()) {
    out << "\nwhat the trace contradicts in the plan:\n";
    for (const auto& s : c.contradictions) out << "  - " << s << "\n";
  }
}

json::Json engine_comparison_json(const EngineComparison& c) {
  const auto rows_json = [](const std::vector<ComparisonRow>& rows) {
    json::Json out = json::Json::array();
    for (const auto& r : rows) {
      out.push_back({{"what", r.what},
                     {"predicted_ns", r.predicted_ns},
                     {"measured_ns", r.measured_ns},
                     {"predicted_count", r.predicted_count},
                     {"measured_count", r.measured_count},
                     {"error", std::isfinite(r.error()) ? json::Json(r.error()) : json::Json()}});
    }
    return out;
  };
  json::Json unclassified = json::Json::array();
  for (const auto& k : c.unclassified) unclassified.push_back({{"name", k.name}, {"ns", k.ns}, {"count", k.count}});
  return {{"predicted", c.predicted_origin},
          {"measured", c.measured_origin},
          {"predicted_gpus", c.predicted_gpus},
          {"measured_ranks", c.measured_ranks},
          {"measured_steps", c.measured_steps},
          {"steps_annotated", c.steps_annotated},
          {"step", rows_json({c.step}).front()},
          {"by_class", rows_json(c.by_class)},
          {"by_stream_kind", rows_json(c.by_stream_kind)},
          {"unclassified", unclassified},
          {"largest", rows_json(c.largest)},
          {"contradictions", c.contradictions},
          {"per", "GPU per step"}};
}

}  // namespace trainyard::traces
