#pragma once
// What a simulation says, for people (text), for programs (JSON) and for Perfetto (Chrome trace).
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/atomic_file.hpp"
#include "common/json_reader.hpp"
#include "sim/compare.hpp"
#include "sim/engine.hpp"

namespace trainyard::sim {

json::Json metrics_json(const SimResult& result, const TaskGraph& graph, const Cluster& cluster);
void print_metrics(std::ostream& out, const SimResult& result, const TaskGraph& graph, const Cluster& cluster);

// Chrome trace JSON: a process per GPU and per host, a track per stream/engine, memory pools as counter tracks,
// and a "links" process with each loaded link's GB/s as a counter track. Each task slice carries its kind and
// class (task_class) in args; "otherData" holds what `trainyard compare` needs beside the slices: the source
// ("simulated" or "measured"), the step time and each GPU's peak HBM. The executor writes its measured
// timeline with this same function.
//
// `selection` keeps part of it (a 1M-token step has millions of slices): the tracks of some GPUs (with their
// nodes' hosts), the slices and counter samples of a time window, and the memory and link counters or none.
// What was kept and how many slices were left out go in otherData.selection, so a partial trace says so.
struct TraceSelection {
  std::vector<int> gpus;  // the GPUs whose tracks are written; empty: every GPU
  std::int64_t start_ns = 0;
  std::int64_t end_ns = -1;  // -1: to the end of the step
  bool counters = true;      // HBM/DRAM levels and link loads
  bool everything() const { return gpus.empty() && start_ns == 0 && end_ns < 0 && counters; }
};
// One line for people: "GPUs 0 of 8, 0-120.5 ms, counters on".
std::string describe(const TraceSelection& selection, int gpus);
void write_chrome_trace(std::ostream& out, const SimResult& result, const TaskGraph& graph, const Cluster& cluster,
                        std::string_view source = "simulated", const TraceSelection& selection = {});
// Every slice and counter sample write_chrome_trace would write for `selection`, unordered (a slice at its start),
// with about how many bytes of JSON it takes: how large a trace gets, and where a window must end to stay small.
struct TraceEvent {
  std::int64_t time_ns = 0;
  std::int64_t bytes = 0;
};
std::vector<TraceEvent> trace_events(const SimResult& result, const TaskGraph& graph, const Cluster& cluster, const TraceSelection& selection);

// The timeline the Chrome trace above holds (same task names, processes and streams), without the JSON: what
// the GUI draws and compares with a measured trace.
Timeline to_timeline(const SimResult& result, const TaskGraph& graph, std::string_view source = "simulated");

// The classes a comparison groups tasks by: "gemm", "attention fwd", "attention bwd", "elementwise",
// "optimizer", "H2D", "D2H", "p2p", "collective" ("alloc"/"free" have no time).
std::string task_class(const Task& task);
// Files are written by the one atomic writer, common/atomic_file.hpp (this name stays for older callers).
using trainyard::write_file_atomically;

}  // namespace trainyard::sim
