#pragma once
// The TaskGraph's JSON form (docs/taskgraph.md), for graphs written by hand and for tests:
//   {"schema": "trainyard.taskgraph.v1", "hw": "dgx-a100", "nodes": 1, "tasks": [{...}, ...]}
// Task names are unique; dependencies refer to names and may point forward.
#include <optional>
#include <string>

#include "common/json_reader.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::sim {

struct GraphDocument {
  TaskGraph graph;
  std::optional<std::string> hw;  // the hardware the file names, if any
  std::optional<int> nodes;
};

// Parses and checks the form (names, fields, references); validate() checks it against a cluster.
GraphDocument parse_graph(const json::Json& document, const std::string& origin);
GraphDocument load_graph(const std::string& path);
json::Json graph_to_json(const TaskGraph& graph);

}  // namespace trainyard::sim
