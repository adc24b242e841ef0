#pragma once
// What a simulation says, for people (text), for programs (JSON) and for Perfetto (Chrome trace).
#include <functional>
#include <ostream>
#include <string>

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
void write_chrome_trace(std::ostream& out, const SimResult& result, const TaskGraph& graph, const Cluster& cluster,
                        std::string_view source = "simulated");

// The timeline the Chrome trace above holds (same task names, processes and streams), without the JSON: what
// the GUI draws and compares with a measured trace.
Timeline to_timeline(const SimResult& result, const TaskGraph& graph, std::string_view source = "simulated");

// The classes a comparison groups tasks by: "gemm", "attention fwd", "attention bwd", "elementwise",
// "optimizer", "H2D", "D2H", "p2p", "collective" ("alloc"/"free" have no time).
std::string task_class(const Task& task);
// Writes to `path` through a temporary file renamed into place, so a failed run leaves no half-written trace.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace trainyard::sim
