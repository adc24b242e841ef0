#include "sim/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "common/error.hpp"
#include "common/input_file.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"

namespace trainyard::sim {

namespace {

using json::Json;

std::int64_t microseconds_to_ns(double us) { return std::llround(us * 1000.0); }

// Accepted ranges: times up to 1e13 us (about 116 days; no step is longer), pids and tids that fit an int.
const json::Bound kTime{0, 1e13, "us"};
const json::Bound kId{0, 2147483647, "", true};

std::string percent(double fraction) { return (fraction >= 0 ? "+" : "") + format_fixed(100 * fraction, 1) + "%"; }

std::string ms(std::int64_t ns) { return format_fixed(static_cast<double>(ns) / 1e6, 3); }

void add_row(std::vector<ComparisonRow>& rows, const std::string& what, const TimelineSlice& s, bool predicted) {
  auto it = std::find_if(rows.begin(), rows.end(), [&](const ComparisonRow& r) { return r.what == what; });
  if (it == rows.end()) {
    rows.push_back({what});
    it = rows.end() - 1;
  }
  (predicted ? it->predicted_ns : it->measured_ns) += s.duration_ns;
  ++(predicted ? it->predicted_count : it->measured_count);
}

Json row_json(const ComparisonRow& r) {
  return {{"what", r.what},     {"predicted_ns", r.predicted_ns},       {"measured_ns", r.measured_ns},
          {"error", r.error()}, {"predicted_tasks", r.predicted_count}, {"measured_tasks", r.measured_count}};
}

}  // namespace

std::string Timeline::device_label(int pid) const {
  const auto p = process_names.find(pid);
  return p != process_names.end() ? p->second : "pid" + std::to_string(pid);
}

std::string Timeline::stream_label(int pid, int tid) const {
  const auto s = stream_names.find({pid, tid});
  return device_label(pid) + " " + (s != stream_names.end() ? s->second : "tid" + std::to_string(tid));
}

const std::vector<std::string>& task_classes() {
  static const std::vector<std::string> order = {"gemm", "attention fwd", "attention bwd", "elementwise", "optimizer",
                                                 "H2D",  "D2H",           "p2p",           "collective"};
  return order;
}

Timeline parse_timeline(const Json& document, const std::string& origin) {
  Timeline t;
  t.origin = origin;
  json::refuse_plan_file(document, origin, "a timeline (simulate --trace or run --trace)");
  const json::Reader top(document, origin);
  const json::Reader other = top.object("otherData");
  other.expect_string("trainyard", "timeline.v1");
  t.source = other.string("source");
  t.step_ns = static_cast<std::int64_t>(other.number("step_ns", {0, 1e16, "ns", true}));
  const Json& peaks = other.raw("peak_hbm_bytes");
  if (!peaks.is_array()) other.fail("peak_hbm_bytes", "an array of bytes per GPU", json::describe(peaks));
  for (std::size_t g = 0; g < peaks.size(); ++g) {
    // Bounded before the cast: a double past int64's range converts to garbage (UB), found by the fuzzer.
    constexpr double kMaxPeakBytes = 1e18;
    if (!peaks[g].is_number() || !(peaks[g].get<double>() >= 0 && peaks[g].get<double>() <= kMaxPeakBytes)) {
      throw InputError(origin, "otherData.peak_hbm_bytes[" + std::to_string(g) + "]", "bytes (a number from 0 to 1e18)", json::describe(peaks[g]));
    }
    t.peak_hbm_bytes.push_back(static_cast<std::int64_t>(peaks[g].get<double>()));
  }
  if (other.has("selection")) {
    const json::Reader selection = other.object("selection");
    t.window_start_ns = static_cast<std::int64_t>(selection.number("start_ns", {0, 1e16, "ns", true}));
    t.window_end_ns = static_cast<std::int64_t>(selection.number("end_ns", {0, 1e16, "ns", true}));
  }
  const Json& events = top.raw("traceEvents");
  if (!events.is_array()) top.fail("traceEvents", "an array of trace events", json::describe(events));
  for (std::size_t i = 0; i < events.size(); ++i) {
    const json::Reader e(events[i], origin, "traceEvents[" + std::to_string(i) + "]");
    const std::string ph = e.string("ph");
    if (ph == "M") {
      const std::string name = e.string("name");
      const std::string value = e.object("args").string("name");
      const int pid = static_cast<int>(e.number("pid", kId));
      if (name == "process_name") {
        // "A100 SXM (gpu0)" -> "gpu0": the device is what identifies a track across two runs.
        const auto open = value.rfind('('), close = value.rfind(')');
        t.process_names[pid] = open != std::string::npos && close > open ? value.substr(open + 1, close - open - 1) : value;
      } else if (name == "thread_name") {
        t.stream_names[{pid, static_cast<int>(e.number("tid", kId))}] = value;
      }
    } else if (ph == "X") {
      TimelineSlice s;
      s.name = e.string("name");
      s.pid = static_cast<int>(e.number("pid", kId));
      s.tid = static_cast<int>(e.number("tid", kId));
      s.start_ns = microseconds_to_ns(e.number("ts", kTime));
      s.duration_ns = microseconds_to_ns(e.number("dur", kTime));
      const json::Reader args = e.object("args");
      s.task_class = args.string("class");
      if (args.has("bytes")) s.bytes = static_cast<std::int64_t>(args.number("bytes", {0, 1e18, "bytes", true}));
      t.slices.push_back(std::move(s));
    }
  }
  return t;
}

Timeline read_timeline(const std::string& path) { return parse_timeline(json::parse_file(path, kTraceFileCapBytes), path); }

double ComparisonRow::error() const {
  if (measured_ns == 0) return predicted_ns == 0 ? 0.0 : INFINITY;
  return static_cast<double>(predicted_ns - measured_ns) / static_cast<double>(measured_ns);
}

double Comparison::peak_hbm_error() const {
  if (measured_peak_hbm_bytes == 0) return predicted_peak_hbm_bytes == 0 ? 0.0 : INFINITY;
  return static_cast<double>(predicted_peak_hbm_bytes - measured_peak_hbm_bytes) / static_cast<double>(measured_peak_hbm_bytes);
}

void require_whole_step(const Timeline& t) {
  if (t.whole_step()) return;
  throw InputError(t.origin, "otherData.selection", "a timeline of the whole step (written without --trace-window)",
                   "the window " + format_fixed(static_cast<double>(t.window_start_ns) * 1e-6, 3) + " to " +
                       format_fixed(static_cast<double>(t.window_end_ns) * 1e-6, 3) + " ms of a " +
                       format_fixed(static_cast<double>(t.step_ns) * 1e-6, 3) + " ms step");
}

Comparison compare(const Timeline& predicted, const Timeline& measured) {
  require_whole_step(predicted);
  require_whole_step(measured);
  Comparison c;
  c.step = {"step", predicted.step_ns, measured.step_ns, 1, 1};
  for (auto b : predicted.peak_hbm_bytes) c.predicted_peak_hbm_bytes = std::max(c.predicted_peak_hbm_bytes, b);
  for (auto b : measured.peak_hbm_bytes) c.measured_peak_hbm_bytes = std::max(c.measured_peak_hbm_bytes, b);

  std::vector<ComparisonRow> classes;
  for (const auto& s : predicted.slices) {
    add_row(classes, s.task_class, s, true);
    add_row(c.by_stream, predicted.stream_label(s.pid, s.tid), s, true);
  }
  for (const auto& s : measured.slices) {
    add_row(classes, s.task_class, s, false);
    add_row(c.by_stream, measured.stream_label(s.pid, s.tid), s, false);
  }
  const auto& order = task_classes();
  for (const std::string& name : order) {
    for (const auto& r : classes) {
      if (r.what == name) c.by_class.push_back(r);
    }
  }
  for (const auto& r : classes) {  // classes this version does not know go last, not nowhere
    if (std::find(order.begin(), order.end(), r.what) == order.end()) c.by_class.push_back(r);
  }
  std::sort(c.by_stream.begin(), c.by_stream.end(), [](const auto& a, const auto& b) { return a.what < b.what; });

  // Tasks match by name and device (the device's name, so pids may differ between the files).
  std::map<std::pair<std::string, std::string>, const TimelineSlice*> measured_by_key;
  for (const auto& s : measured.slices) measured_by_key[{s.name, measured.device_label(s.pid)}] = &s;
  std::set<const TimelineSlice*> matched;
  for (const auto& s : predicted.slices) {
    const auto it = measured_by_key.find({s.name, predicted.device_label(s.pid)});
    if (it == measured_by_key.end()) {
      ++c.only_predicted;
      continue;
    }
    matched.insert(it->second);
    c.largest.push_back({s.name, predicted.stream_label(s.pid, s.tid), s.duration_ns, it->second->duration_ns});
  }
  c.only_measured = static_cast<int>(measured.slices.size() - matched.size());
  if (matched.empty()) {
    throw InputError("no task of " + predicted.origin + " appears in " + measured.origin +
                     " (expected timelines of the same plan: tasks match by name and device)");
  }
  const auto gap = [](const Comparison::Difference& d) { return std::llabs(d.predicted_ns - d.measured_ns); };
  const std::size_t keep = std::min<std::size_t>(10, c.largest.size());
  std::partial_sort(c.largest.begin(), c.largest.begin() + static_cast<std::ptrdiff_t>(keep), c.largest.end(),
                    [&](const auto& a, const auto& b) { return gap(a) != gap(b) ? gap(a) > gap(b) : a.name < b.name; });
  c.largest.resize(keep);
  return c;
}

void print_comparison(std::ostream& out, const Comparison& c) {
  out << "step time: predicted " << ms(c.step.predicted_ns) << " ms, measured " << ms(c.step.measured_ns) << " ms, error " << percent(c.step.error())
      << "\n";
  out << "peak HBM (largest GPU): predicted " << format_bytes(static_cast<double>(c.predicted_peak_hbm_bytes)) << ", measured "
      << format_bytes(static_cast<double>(c.measured_peak_hbm_bytes)) << ", error " << percent(c.peak_hbm_error()) << "\n";
  if (c.only_predicted + c.only_measured > 0) {
    out << "unmatched tasks: " << c.only_predicted << " only predicted, " << c.only_measured << " only measured\n";
  }
  for (const auto& [title, rows] : {std::pair{"task class", &c.by_class}, std::pair{"stream", &c.by_stream}}) {
    out << "\n";
    TextTable table({title, "tasks", "predicted ms", "measured ms", "error"});
    for (const auto& r : *rows) {
      table.add_row(
          {r.what, std::to_string(std::max(r.predicted_count, r.measured_count)), ms(r.predicted_ns), ms(r.measured_ns), percent(r.error())});
    }
    table.print(out);
  }
  out << "\nlargest differences\n";
  TextTable table({"task", "stream", "predicted ms", "measured ms", "difference ms"});
  for (const auto& d : c.largest) table.add_row({d.name, d.stream, ms(d.predicted_ns), ms(d.measured_ns), ms(d.predicted_ns - d.measured_ns)});
  table.print(out);
}

Json comparison_json(const Comparison& c) {
  Json classes = Json::array(), streams = Json::array(), largest = Json::array();
  for (const auto& r : c.by_class) classes.push_back(row_json(r));
  for (const auto& r : c.by_stream) streams.push_back(row_json(r));
  for (const auto& d : c.largest) {
    largest.push_back({{"task", d.name}, {"stream", d.stream}, {"predicted_ns", d.predicted_ns}, {"measured_ns", d.measured_ns}});
  }
  return {
      {"step", row_json(c.step)},
      {"peak_hbm", {{"predicted_bytes", c.predicted_peak_hbm_bytes}, {"measured_bytes", c.measured_peak_hbm_bytes}, {"error", c.peak_hbm_error()}}},
      {"by_class", classes},
      {"by_stream", streams},
      {"largest_differences", largest},
      {"unmatched", {{"only_predicted", c.only_predicted}, {"only_measured", c.only_measured}}}};
}

}  // namespace trainyard::sim
