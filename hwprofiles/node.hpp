#pragma once
// A server (hwprofiles/nodes/*.json): its GPUs, host DRAM, and the topology that connects them, kept as
// data (vertices and links) and turned into a Boost graph by Topology (topology.hpp).
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hwprofiles/gpu.hpp"

namespace trainyard::hw {

enum class VertexType { gpu, root_complex, host_memory, pcie_switch, nvswitch, nic, fabric };
enum class LinkType { pcie, nvlink, dram, socket, network };
std::string_view to_string(VertexType type);
std::string_view to_string(LinkType type);

struct VertexSpec {
  std::string id;
  VertexType type = VertexType::gpu;
  std::optional<Figure> nic_GBps_per_direction;  // NICs only
};

struct LinkSpec {
  std::string a;
  std::string b;
  LinkType type = LinkType::pcie;
  int pcie_generation = 0;        // pcie links
  int pcie_lanes = 0;             // pcie links
  std::optional<Figure> GBps;     // dram: total of both directions; socket: per direction
  double GBps_per_direction = 0;  // resolved for every link type (dram: the shared total)
  bool full_duplex = true;        // DRAM bandwidth is shared by reads and writes
};

struct NodeProfile {
  std::string name;
  std::string description;
  std::string origin;
  GpuProfile gpu;
  Figure host_dram_bytes;
  bool pcie_peer_to_peer = false;
  // 1: the NVSwitch reduces and multicasts in the switch (NVLink SHARP, third-generation NVSwitch), so an
  // all-reduce among the node's GPUs can run as NCCL's NVLS algorithm; 0 (or absent): it cannot.
  Figure nvlink_sharp;
  std::vector<VertexSpec> vertices;
  std::vector<LinkSpec> links;
  std::map<LinkType, Figure> latency_ns;

  int gpu_count() const;
  int count(VertexType type) const;
  double host_dram_GBps() const;  // sum over the sockets' DRAM links
  const VertexSpec* find_vertex(std::string_view id) const;
  // The per-GPU NIC rate (mean over NICs, GB/s per direction); 0 without NICs.
  double nic_GBps_per_gpu() const;
};

// `load_gpu` resolves the node's "gpu" field (a built-in name, or a .json path relative to the node file).
using GpuLoader = GpuProfile (*)(const std::string& name_or_path, const std::string& relative_to);
NodeProfile parse_node(const json::Json& document, const std::string& origin, GpuLoader load_gpu);

}  // namespace trainyard::hw
