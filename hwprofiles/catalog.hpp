#pragma once
// The built-in hardware profiles (hwprofiles/gpus/*.json, hwprofiles/nodes/*.json, compiled in) and loading
// of user files by path.
#include <string>
#include <vector>

#include "common/catalog.hpp"
#include "hwprofiles/node.hpp"

namespace trainyard::hw {

std::vector<std::string> builtin_gpu_names();
std::vector<std::string> builtin_node_names();
bool is_builtin_gpu(std::string_view name);
bool is_builtin_node(std::string_view name);

// `origin` names where the reference came from ("--hw"), for the unknown-name error.
GpuProfile load_gpu(std::string_view name_or_path, const std::string& origin = "--gpu");
NodeProfile load_node(std::string_view name_or_path, const std::string& origin = "--hw");
// --nodes: a count in [1, 100000], and more than one only for nodes that have NICs to join a cluster; InputError
// naming --nodes otherwise.
void check_node_count(int nodes);
void check_node_count(int nodes, const NodeProfile& node);
// The document of a GPU profile as written (built-in or file), not yet parsed: what calibration starts from.
LoadedDocument load_gpu_document(std::string_view name_or_path, const std::string& origin = "--gpu");
// Parses an already-read document whose "schema" says it is a GPU or a node.
GpuProfile gpu_from_document(const json::Json& document, const std::string& origin);
NodeProfile node_from_document(const json::Json& document, const std::string& origin);

}  // namespace trainyard::hw
