#pragma once
// What a simulation says, for people (text), for programs (JSON) and for Perfetto (Chrome trace).
#include <functional>
#include <ostream>
#include <string>

#include "common/json_reader.hpp"
#include "sim/engine.hpp"

namespace trainyard::sim {

json::Json metrics_json(const SimResult& result, const TaskGraph& graph, const Cluster& cluster);
void print_metrics(std::ostream& out, const SimResult& result, const TaskGraph& graph, const Cluster& cluster);

// Chrome trace JSON: a process per GPU and per host, a track per stream/engine, memory pools as counter tracks,
// and a "links" process with each loaded link's GB/s as a counter track.
void write_chrome_trace(std::ostream& out, const SimResult& result, const TaskGraph& graph, const Cluster& cluster);
// Writes to `path` through a temporary file renamed into place, so a failed run leaves no half-written trace.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace trainyard::sim
