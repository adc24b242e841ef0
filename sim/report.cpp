#include "sim/report.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <unordered_map>

#include "common/error.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"

namespace trainyard::sim {

namespace {

std::string stream_name(Stream s) {
  if (s.kind == StreamKind::compute || (s.kind == StreamKind::comm && s.index > 0)) {
    return std::string(to_string(s.kind)) + std::to_string(s.index);
  }
  return std::string(to_string(s.kind));
}

// What a collective, send or copy moves (a collective: its full buffer per GPU), for `trainyard compare` to hold
// an engine trace's sizes to; 0 for compute.
std::int64_t moved_bytes(const Task& task) {
  if (const auto* c = std::get_if<Collective>(&task.params)) return c->bytes;
  if (const auto* p = std::get_if<PointToPoint>(&task.params)) return p->bytes;
  if (const auto* c = std::get_if<Copy>(&task.params)) return c->bytes;
  return 0;
}

double fraction(std::int64_t part, std::int64_t whole) { return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0; }

struct GpuSummary {
  std::int64_t compute_busy_ns = 0, h2d_busy_ns = 0, d2h_busy_ns = 0, comm_busy_ns = 0;
};

std::vector<GpuSummary> gpu_summaries(const SimResult& r) {
  std::vector<GpuSummary> out(static_cast<std::size_t>(r.gpus));
  for (const auto& s : r.streams) {
    if (is_host(s.device)) continue;
    auto& g = out[s.device];
    switch (s.stream.kind) {
      case StreamKind::compute: g.compute_busy_ns = std::max(g.compute_busy_ns, s.busy_ns); break;
      case StreamKind::h2d: g.h2d_busy_ns = s.busy_ns; break;
      case StreamKind::d2h: g.d2h_busy_ns = s.busy_ns; break;
      case StreamKind::comm: g.comm_busy_ns = std::max(g.comm_busy_ns, s.busy_ns); break;
      default: break;
    }
  }
  return out;
}

// How many collectives ran with each protocol of the collective library (NCCL: LL, LL128, Simple, NVLS).
std::map<std::string, int> protocol_counts(const SimResult& r) {
  std::map<std::string, int> counts;
  for (const auto& [task, protocol] : r.collective_protocols) ++counts[r.protocol_names[protocol]];
  return counts;
}

}  // namespace

// Per class of compute task: busy time summed over GPUs and the efficiency it got, as a fraction of the bf16
// peak (GEMM, attention: model FLOPs over busy time) or of the HBM bandwidth (elementwise, optimizer).
json::Json compute_classes_json(const SimResult& r, const Cluster& cluster) {
  json::Json out = json::Json::object();
  for (std::size_t k = 0; k < r.compute_classes.size(); ++k) {
    const SimResult::ClassTotals& c = r.compute_classes[k];
    if (c.tasks == 0) continue;
    const auto busy_s = static_cast<double>(c.busy_ns) * 1e-9;
    const bool flops = k == static_cast<std::size_t>(TaskKind::gemm) || k == static_cast<std::size_t>(TaskKind::attention);
    json::Json entry = {{"tasks", c.tasks}, {"busy_ns", c.busy_ns}, {"model_flops", c.model_flops}, {"hbm_bytes", c.hbm_bytes}};
    if (busy_s > 0) {
      entry["efficiency"] = flops ? c.model_flops / (busy_s * r.peak_flops_per_gpu) : c.hbm_bytes / (busy_s * cluster.node.gpu.hbm_GBps.value * 1e9);
      entry["efficiency_of"] = flops ? "bf16 dense peak (model FLOPs)" : "HBM bandwidth (bytes the fused op would move)";
    }
    out[std::string(to_string(static_cast<TaskKind>(k)))] = entry;
  }
  return out;
}

json::Json metrics_json(const SimResult& r, const TaskGraph& graph, const Cluster& cluster) {
  using json::Json;
  Json out = {
      {"completed", r.completed},
      {"step_ns", r.step_ns},
      {"step_s", static_cast<double>(r.step_ns) * 1e-9},
      {"tasks", graph.size()},
      {"events", r.events},
      {"model_flops", r.model_flops},
      {"hardware_flops", r.hardware_flops},
      {"mfu", r.mfu()},
      {"hfu", r.hfu()},
      {"gpus", r.gpus},
      {"hw", cluster.node.name},
      {"nodes", cluster.nodes},
      {"flops_convention", "model FLOPs exclude recomputation; attention backward = 2x forward (2.5x in hardware FLOPs)"},
  };
  if (!r.collective_protocols.empty()) out["collectives_by_protocol"] = protocol_counts(r);
  out["stack"] = {{"name", r.stack},
                  {"attention", r.attention_impl},
                  {"hbm_reserved_fixed_bytes", r.hbm_fixed_bytes},
                  {"allocator_overhead", r.allocator_overhead},
                  {"host_wait_ns", r.host_wait_ns},
                  {"collective_sm_ns", r.collective_sm_ns}};
  out["compute_classes"] = compute_classes_json(r, cluster);
  if (!r.completed) {  // a step that did not finish has no step time or MFU, only where it stopped
    out["stopped_at_ns"] = r.step_ns;
    for (const char* key : {"step_ns", "step_s", "mfu", "hfu"}) out[key] = nullptr;
  }
  if (r.oom) {
    out["oom"] = {{"task", graph.name(r.oom->task)},           {"pool", r.oom->pool},
                  {"requested_bytes", r.oom->requested_bytes}, {"in_use_bytes", r.oom->in_use_bytes},
                  {"capacity_bytes", r.oom->capacity_bytes},   {"excess_bytes", r.oom->excess_bytes},
                  {"largest_live", r.oom->largest_live}};
  }
  if (!r.stuck.empty()) out["stuck"] = r.stuck;
  const auto summaries = gpu_summaries(r);
  Json gpus = Json::array();
  for (int g = 0; g < r.gpus; ++g) {
    const auto& s = summaries[g];
    gpus.push_back({{"gpu", g},
                    {"peak_hbm_bytes", r.pools[g].peak_bytes},
                    {"peak_hbm_reserved_bytes", r.hbm_reserved_bytes(static_cast<double>(r.pools[g].peak_bytes))},
                    {"compute_busy", fraction(s.compute_busy_ns, r.step_ns)},
                    {"h2d_busy", fraction(s.h2d_busy_ns, r.step_ns)},
                    {"d2h_busy", fraction(s.d2h_busy_ns, r.step_ns)},
                    {"comm_busy", fraction(s.comm_busy_ns, r.step_ns)},
                    {"exposed_transfer_ns", r.exposed_transfer_ns[g]}});
  }
  out["per_gpu"] = gpus;
  Json nodes = Json::array();
  for (int n = 0; n < cluster.nodes; ++n) {
    nodes.push_back({{"node", n}, {"peak_dram_bytes", r.pools[r.gpus + n].peak_bytes}});
  }
  out["per_node"] = nodes;
  Json links = Json::array();
  for (const auto& l : r.links) {
    links.push_back({{"link", l.name},
                     {"capacity_GBps", l.capacity_GBps},
                     {"capacity_gbps", l.capacity_GBps},  // the old spelling, kept for one release (docs/taskgraph.md, "Renamed keys")
                     {"bytes", l.bytes},
                     {"busy", fraction(l.busy_ns, r.step_ns)},
                     {"utilization", r.step_ns > 0 ? l.bytes / (l.capacity_GBps * static_cast<double>(r.step_ns)) : 0}});
  }
  out["links"] = links;
  return out;
}

void print_metrics(std::ostream& out, const SimResult& r, const TaskGraph& graph, const Cluster& cluster) {
  if (r.oom) out << "simulation stopped: " << r.oom->describe(graph) << "\n\n";
  if (!r.stuck.empty()) out << "simulation stopped: " << r.stuck << "\n\n";
  if (r.completed) {
    out << "step time      " << format_fixed(static_cast<double>(r.step_ns) * 1e-6, 3) << " ms (" << graph.size() << " tasks on " << r.gpus << " x "
        << cluster.node.gpu.name << ")\n"
        << "model FLOPs    " << format_flops(r.model_flops) << "; MFU " << format_fixed(100 * r.mfu(), 1) << "%, HFU "
        << format_fixed(100 * r.hfu(), 1) << "% of " << format_fixed(r.peak_flops_per_gpu * 1e-12, 1) << " TFLOP/s bf16 per GPU\n\n";
  } else {  // no step time or MFU for a step that did not finish: only how far it got
    out << "stopped at     " << format_fixed(static_cast<double>(r.step_ns) * 1e-6, 3) << " ms into the step (" << graph.size() << " tasks on "
        << r.gpus << " x " << cluster.node.gpu.name << "); no step time or MFU\n\n";
  }
  if (!r.collective_protocols.empty()) {
    out << "collectives    " << r.collective_protocols.size() << " (";
    bool first = true;
    for (const auto& [name, count] : protocol_counts(r)) {
      out << (first ? "" : ", ") << name << " " << count;
      first = false;
    }
    out << "; the protocol NCCL's cost model picks)\n\n";
  }
  out << "stack          " << r.stack << ": attention " << r.attention_impl << "; HBM reserved = allocated x "
      << format_fixed(1 + r.allocator_overhead, 2) << " + " << format_bytes(r.hbm_fixed_bytes) << " (context, workspaces, buffers)";
  if (r.host_wait_ns > 0)
    out << "; GPUs waited " << format_fixed(static_cast<double>(r.host_wait_ns) * 1e-6 / std::max(1, r.gpus), 3) << " ms each for the host";
  if (r.collective_sm_ns > 0) {
    out << "; GEMMs and attention ran " << format_fixed(static_cast<double>(r.collective_sm_ns) * 1e-6 / std::max(1, r.gpus), 3)
        << " ms longer per GPU on the SMs collectives left them";
  }
  out << "\n\n";
  const auto summaries = gpu_summaries(r);
  TextTable gpus({"gpu", "peak HBM", "reserved", "compute busy", "H2D busy", "D2H busy", "comm busy", "exposed transfer"},
                 {false, true, true, true, true, true, true, true});
  auto pct = [&](std::int64_t ns) { return format_fixed(100 * fraction(ns, r.step_ns), 1) + "%"; };
  for (int g = 0; g < r.gpus; ++g) {
    const auto& s = summaries[g];
    const auto peak = static_cast<double>(r.pools[g].peak_bytes);
    gpus.add_row({"gpu" + std::to_string(g), format_bytes(peak), format_bytes(r.hbm_reserved_bytes(peak)), pct(s.compute_busy_ns), pct(s.h2d_busy_ns),
                  pct(s.d2h_busy_ns), pct(s.comm_busy_ns), format_fixed(static_cast<double>(r.exposed_transfer_ns[g]) * 1e-6, 3) + " ms"});
  }
  gpus.print(out);
  out << "\n";
  for (int n = 0; n < cluster.nodes; ++n) {
    out << "host" << n << " peak pinned DRAM: " << format_bytes(static_cast<double>(r.pools[r.gpus + n].peak_bytes)) << "\n";
  }
  if (!r.links.empty()) {
    std::vector<const LinkUsage*> links;
    for (const auto& l : r.links) links.push_back(&l);
    std::stable_sort(links.begin(), links.end(), [](const LinkUsage* a, const LinkUsage* b) { return a->busy_ns > b->busy_ns; });
    out << "\nbusiest links\n";
    TextTable table({"link", "GB/s", "bytes", "busy", "utilization"}, {false, true, true, true, true});
    for (std::size_t i = 0; i < links.size() && i < 10; ++i) {
      const auto* l = links[i];
      table.add_row({l->name, format_fixed(l->capacity_GBps, 1), format_bytes(l->bytes), pct(l->busy_ns),
                     format_fixed(100 * (r.step_ns > 0 ? l->bytes / (l->capacity_GBps * static_cast<double>(r.step_ns)) : 0), 1) + "%"});
    }
    table.print(out);
  }
}

std::string task_class(const Task& task) {
  if (const auto* a = std::get_if<Attention>(&task.params)) return a->backward ? "attention bwd" : "attention fwd";
  if (const auto* c = std::get_if<Copy>(&task.params)) return c->direction == Copy::Direction::h2d ? "H2D" : "D2H";
  return std::string(to_string(task.kind()));
}

namespace {

// The trace's process per device (GPUs first, then hosts) and thread per stream.
int trace_pid(const SimResult& r, DeviceId d) { return is_host(d) ? r.gpus + host_node(d) : d; }
int trace_tid(Stream s) {
  switch (s.kind) {
    case StreamKind::compute: return static_cast<int>(s.index);
    case StreamKind::h2d: return 100;
    case StreamKind::d2h: return 101;
    case StreamKind::comm: return 102 + s.index;
    case StreamKind::host: return 150;
    default: return 199;
  }
}

// Calls `slice(task, device)` for every timed task slice of the trace: a collective has one per member.
template <typename Slice>
void for_each_slice(const SimResult& r, const TaskGraph& graph, Slice&& slice) {
  for (TaskId t = 0; t < static_cast<TaskId>(graph.size()); ++t) {
    if (r.timing[t].end_ns < 0) continue;
    const Task& task = graph.task(t);
    if (task.stream.kind == StreamKind::none) continue;  // alloc/free show as memory counters
    if (const auto* c = std::get_if<Collective>(&task.params)) {
      for (DeviceId m : graph.groups()[c->group]) slice(t, m);
    } else {
      slice(t, task.device);
    }
  }
}

}  // namespace

Timeline to_timeline(const SimResult& r, const TaskGraph& graph, std::string_view source) {
  Timeline t;
  t.source = source;
  t.step_ns = r.step_ns;
  for (int g = 0; g < r.gpus; ++g) t.peak_hbm_bytes.push_back(r.pools[g].peak_bytes);
  for (const auto& s : r.streams) {
    const int pid = trace_pid(r, s.device);
    t.process_names[pid] = device_name(s.device);
    t.stream_names[{pid, trace_tid(s.stream)}] = stream_name(s.stream);
  }
  for_each_slice(r, graph, [&](TaskId id, DeviceId device) {
    const Task& task = graph.task(id);
    const auto& timing = r.timing[id];
    t.slices.push_back({std::string(graph.name(id)), trace_pid(r, device), trace_tid(task.stream), task_class(task), timing.start_ns,
                        timing.end_ns - timing.start_ns});
  });
  return t;
}

namespace {

// What a selection keeps: per trace pid (GPUs, then hosts), and the window's bounds.
struct Keep {
  std::vector<bool> pid;
  std::int64_t start_ns = 0, end_ns = 0;
  bool overlaps(std::int64_t start, std::int64_t end) const { return end >= start_ns && start <= end_ns; }
};

Keep keep_of(const TraceSelection& sel, const SimResult& r, const Cluster& cluster) {
  Keep k;
  k.pid.assign(static_cast<std::size_t>(r.gpus + cluster.nodes), sel.gpus.empty());
  for (int g : sel.gpus) {
    TRAINYARD_CHECK(g >= 0 && g < r.gpus, "trace GPU " + std::to_string(g) + " out of range");
    k.pid[g] = true;
    k.pid[r.gpus + cluster.node_of(g)] = true;  // its host: copies and pinned DRAM
  }
  k.start_ns = sel.start_ns;
  k.end_ns = sel.end_ns < 0 ? std::numeric_limits<std::int64_t>::max() : sel.end_ns;
  return k;
}

// The samples of a counter inside the window; the level at the window's start is carried in from before it.
template <typename Emit>
void window_samples(const std::vector<Sample>& samples, const Keep& k, Emit&& emit) {
  const Sample* before = nullptr;
  for (const auto& s : samples) {
    if (s.time_ns < k.start_ns) {
      before = &s;
      continue;
    }
    if (s.time_ns > k.end_ns) break;
    if (before && s.time_ns > k.start_ns) emit(k.start_ns, before->value);
    before = nullptr;
    emit(s.time_ns, s.value);
  }
  if (before) emit(k.start_ns, before->value);
}

}  // namespace

std::vector<TraceEvent> trace_events(const SimResult& r, const TaskGraph& graph, const Cluster& cluster, const TraceSelection& selection) {
  // The JSON around a slice's name and a sample's value (pid, tid, ts, dur, args), measured on written traces.
  constexpr std::int64_t kSliceBytes = 110, kSampleBytes = 75;
  const Keep keep = keep_of(selection, r, cluster);
  std::vector<TraceEvent> events;
  for_each_slice(r, graph, [&](TaskId id, DeviceId device) {
    const auto& timing = r.timing[id];
    if (keep.pid[trace_pid(r, device)] && keep.overlaps(timing.start_ns, timing.end_ns)) {
      const Task& task = graph.task(id);
      events.push_back({timing.start_ns, kSliceBytes + static_cast<std::int64_t>(graph.name(id).size() + 2 * task_class(task).size())});
    }
  });
  if (!selection.counters) return events;
  for (std::size_t p = 0; p < r.pools.size(); ++p) {
    if (keep.pid[p]) window_samples(r.pools[p].level, keep, [&](std::int64_t ns, double) { events.push_back({ns, kSampleBytes}); });
  }
  for (const auto& l : r.links) {
    const auto bytes = kSampleBytes + static_cast<std::int64_t>(l.name.size());
    window_samples(l.load_GBps, keep, [&](std::int64_t ns, double) { events.push_back({ns, bytes}); });
  }
  return events;
}

std::string describe(const TraceSelection& sel, int gpus) {
  std::string text;
  if (sel.gpus.empty()) {
    text = "all " + std::to_string(gpus) + " GPUs";
  } else {
    text = sel.gpus.size() > 1 ? "GPUs " : "GPU ";
    for (std::size_t i = 0; i < sel.gpus.size(); ++i) text += (i ? "," : "") + std::to_string(sel.gpus[i]);
    text += " of " + std::to_string(gpus) + (sel.gpus.size() > 1 ? " with their hosts" : " with its host");
  }
  text += ", ";
  if (sel.start_ns == 0 && sel.end_ns < 0) {
    text += "the whole step";
  } else {
    text += format_fixed(static_cast<double>(sel.start_ns) * 1e-6, 3) + " ms to " +
            (sel.end_ns < 0 ? std::string("the end") : format_fixed(static_cast<double>(sel.end_ns) * 1e-6, 3) + " ms");
  }
  return text + ", memory and link counters " + (sel.counters ? "on" : "off");
}

void write_chrome_trace(std::ostream& out, const SimResult& r, const TaskGraph& graph, const Cluster& cluster, std::string_view source,
                        const TraceSelection& selection) {
  using json::Json;
  constexpr int kLinksPid = 1000000;
  const Keep keep = keep_of(selection, r, cluster);
  auto kept = [&](int pid) { return keep.pid[pid]; };
  auto pid_of = [&](DeviceId d) { return trace_pid(r, d); };
  auto tid_of = trace_tid;
  auto us = [](std::int64_t ns) { return format_fixed(static_cast<double>(ns) / 1000.0, 3); };
  bool first = true;
  auto emit = [&](const std::string& event) {
    out << (first ? "\n" : ",\n") << event;
    first = false;
  };
  out << "{\"displayTimeUnit\": \"ns\", \"traceEvents\": [";
  for (int g = 0; g < r.gpus; ++g) {
    if (!kept(g)) continue;
    emit("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(g) + ",\"args\":{\"name\":" +
         Json(cluster.topology.name(cluster.topology.gpu(cluster.node_of(g), cluster.slot_of(g))) + " (gpu" + std::to_string(g) + ")").dump() + "}}");
  }
  for (int n = 0; n < cluster.nodes; ++n) {
    if (!kept(r.gpus + n)) continue;
    emit("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(r.gpus + n) + ",\"args\":{\"name\":\"host" + std::to_string(n) + "\"}}");
  }
  emit("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(kLinksPid) + ",\"args\":{\"name\":\"links\"}}");
  for (const auto& s : r.streams) {
    if (!kept(pid_of(s.device))) continue;
    emit("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(pid_of(s.device)) + ",\"tid\":" + std::to_string(tid_of(s.stream)) +
         ",\"args\":{\"name\":\"" + stream_name(s.stream) + "\"}}");
  }
  std::int64_t slices_written = 0, slices_left_out = 0;
  std::unordered_map<TaskId, std::uint8_t> protocol_of(r.collective_protocols.begin(), r.collective_protocols.end());
  for_each_slice(r, graph, [&](TaskId id, DeviceId device) {
    const Task& task = graph.task(id);
    const auto& timing = r.timing[id];
    if (!kept(pid_of(device)) || !keep.overlaps(timing.start_ns, timing.end_ns)) {
      ++slices_left_out;
      return;
    }
    ++slices_written;
    std::string args = "{\"kind\":\"" + std::string(to_string(task.kind())) + "\",\"class\":\"" + task_class(task) + "\"";
    if (const auto it = protocol_of.find(id); it != protocol_of.end()) args += ",\"protocol\":\"" + r.protocol_names[it->second] + "\"";
    if (const std::int64_t bytes = moved_bytes(task); bytes > 0) args += ",\"bytes\":" + std::to_string(bytes);
    args += "}";
    emit("{\"ph\":\"X\",\"name\":" + Json(graph.name(id)).dump() + ",\"pid\":" + std::to_string(pid_of(device)) +
         ",\"tid\":" + std::to_string(tid_of(task.stream)) + ",\"ts\":" + us(timing.start_ns) + ",\"dur\":" + us(timing.end_ns - timing.start_ns) +
         ",\"args\":" + args + "}");
  });
  if (selection.counters) {
    for (std::size_t p = 0; p < r.pools.size(); ++p) {
      const int pid = static_cast<int>(p);  // GPU pools first, then hosts: the same numbering as the pids
      if (!kept(pid)) continue;
      const std::string head = "{\"ph\":\"C\",\"name\":\"" + std::string(pid < r.gpus ? "HBM bytes" : "pinned DRAM bytes") +
                               "\",\"pid\":" + std::to_string(pid) + ",\"ts\":";
      window_samples(r.pools[p].level, keep,
                     [&](std::int64_t ns, double value) { emit(head + us(ns) + ",\"args\":{\"bytes\":" + format_fixed(value, 0) + "}}"); });
    }
    for (const auto& l : r.links) {
      const std::string head = "{\"ph\":\"C\",\"name\":" + Json(l.name).dump() + ",\"pid\":" + std::to_string(kLinksPid) + ",\"ts\":";
      window_samples(l.load_GBps, keep,
                     [&](std::int64_t ns, double value) { emit(head + us(ns) + ",\"args\":{\"GB/s\":" + format_fixed(value, 3) + "}}"); });
    }
  }
  Json peaks = Json::array(), gpus = Json::array();
  for (int g = 0; g < r.gpus; ++g) {
    peaks.push_back(r.pools[g].peak_bytes);
    if (kept(g)) gpus.push_back(g);
  }
  const Json chosen{{"gpus", gpus},
                    {"gpus_total", r.gpus},
                    {"start_ns", selection.start_ns},
                    {"end_ns", selection.end_ns < 0 ? r.step_ns : selection.end_ns},
                    {"counters", selection.counters},
                    {"slices_written", slices_written},
                    {"slices_left_out", slices_left_out}};
  const Json other{{"trainyard", "timeline.v1"}, {"source", source}, {"step_ns", r.step_ns}, {"peak_hbm_bytes", peaks}, {"selection", chosen}};
  out << "\n],\n\"otherData\": " << other.dump() << "}\n";
}

}  // namespace trainyard::sim
