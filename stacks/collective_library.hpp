#pragma once
// The collective library's own costs (stacks/collectives/*.json, schema trainyard.collectives.v1): per protocol,
// a collective's fixed latency, the latency each step adds by link class, and the share of a link's rate the
// protocol's wire format leaves for data. The simulator picks the protocol with the lowest predicted time, as
// NCCL's tuner does, and runs the data as flows on the links (sim/engine.cpp). Plain C++.
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "common/json_reader.hpp"

namespace trainyard::stacks {

enum class LinkClass { nvlink, pcie, network };
enum class Pattern { ring, tree };  // rings also stand for direct exchanges and broadcasts

struct Protocol {
  std::string name;
  json::Figure efficiency;                                     // data bytes per wire byte
  std::array<json::Figure, 2> base_latency_us;                 // by Pattern
  std::array<std::array<json::Figure, 3>, 2> step_latency_us;  // by Pattern, then LinkClass

  double base_ns(Pattern p) const { return 1e3 * base_latency_us[static_cast<int>(p)].value; }
  double step_ns(Pattern p, LinkClass c) const { return 1e3 * step_latency_us[static_cast<int>(p)][static_cast<int>(c)].value; }
};

// NVLink SHARP all-reduce (NCCL's NVLS) inside a node whose NVSwitch reduces (hw::NodeProfile::nvlink_sharp):
// each GPU sends its buffer to the switch and receives the sum, at `efficiency` of its NVLink rate.
struct Nvls {
  json::Figure efficiency;
  json::Figure latency_us;
};

struct CollectiveLibrary {
  std::string name;
  std::string description;
  std::string origin;
  std::vector<Protocol> protocols;
  std::optional<Nvls> nvls;  // none: the library has no in-switch all-reduce
};

CollectiveLibrary parse_collective_library(const json::Json& document, const std::string& origin);
// The built-in library (stacks/collectives/NAME.json) or a file by path.
CollectiveLibrary load_collective_library(std::string_view name_or_path, const std::string& origin);
// NCCL, what every stack trainyard models uses; loaded once.
const CollectiveLibrary& default_collective_library();

}  // namespace trainyard::stacks
