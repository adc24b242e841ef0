#pragma once
// The hardware as a graph: vertices are GPUs, PCIe switches, root complexes, host memories, NVSwitches, NICs and
// the inter-node fabric; edges are links with a bandwidth per direction and a latency. A cluster is N copies of a
// node whose NICs all attach to one non-blocking fabric vertex. Boost Graph does the routing inside topology.cpp;
// this header stays free of it, since every file that includes sim/engine.hpp includes this one.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hwprofiles/node.hpp"

namespace trainyard::hw {

struct TopoVertex {
  std::string id;  // as in the node file ("gpu3"); the fabric is "fabric"
  VertexType type = VertexType::gpu;
  int node = -1;  // -1 for the fabric
};

struct TopoLink {
  LinkType type = LinkType::pcie;
  double GBps_per_direction = 0;
  bool full_duplex = true;
  std::int64_t latency_ns = 0;
  double route_cost = 0;  // seconds per GB plus a small per-hop term: the fastest route wins
  int index = -1;         // 0..num_edges-1, dense, for per-link arrays in the simulator
};

// A vertex's index, 0..vertex_count-1 (the fabric first when there is one, then node by node).
using VertexId = std::size_t;

struct Route {
  std::vector<VertexId> vertices;  // from .. to
  std::vector<int> links;          // TopoLink::index of each hop; links[i] joins vertices[i] and vertices[i + 1]
  double bottleneck_GBps = 0;
  std::int64_t latency_ns = 0;
};

class Topology {
 public:
  Topology(const NodeProfile& node, int node_count);

  int node_count() const { return node_count_; }
  int gpus_per_node() const { return gpus_per_node_; }
  int gpu_count() const { return gpus_per_node_ * node_count_; }
  int vertex_count() const;
  int link_count() const;
  const TopoVertex& vertex_info(VertexId v) const;
  const TopoLink& link(int index) const;  // index: 0..link_count-1, its TopoLink::index
  // The ends in the order the link was added (the node file's a, b; a NIC, then the fabric).
  std::pair<VertexId, VertexId> link_ends(int index) const;
  VertexId other_end(int index, VertexId v) const;     // the end of the link that is not v
  const std::vector<int>& links_at(VertexId v) const;  // the links touching v, in the order they were added
  // Layout: every node's vertices and links are contiguous blocks of the same size, in the same order, so a
  // route inside node n is node 0's route shifted by n blocks (the simulator relies on this to compute each
  // route shape once). The fabric vertex, when there is one, comes first.
  VertexId first_vertex(int node) const { return first_vertex_[node]; }
  int first_link(int node) const { return first_link_[node]; }
  std::optional<VertexId> fabric() const { return fabric_; }
  bool pcie_peer_to_peer() const { return peer_to_peer_; }

  VertexId vertex(int node, std::string_view id) const;  // InternalError if absent
  VertexId gpu(int node, int index) const;
  // The NIC a GPU sends and receives through when it talks to another node (its "rail"), as NCCL pairs them:
  // among the NICs nearest the GPU (fastest route), the GPUs that share those NICs take them in turn, so two
  // GPUs and two NICs under one PCIe switch get one NIC each. nullopt on a node without NICs.
  std::optional<VertexId> rail_nic(VertexId gpu) const;
  int rail_count() const;  // distinct rail NICs of a node (0 without NICs)
  // The host memory on the GPU's nearest socket (fastest route); nullopt if none is connected.
  std::optional<VertexId> nearest_host_memory(VertexId gpu) const;
  // "gpu3" on one node, "n1.gpu3" in a cluster.
  std::string name(VertexId v) const;

  // Fastest route (least sum of 1/bandwidth); GPUs and host memories are endpoints only, never transit.
  // Throws InternalError when there is none (a validated profile always connects GPUs to host memory).
  Route route(VertexId from, VertexId to) const;
  std::optional<Route> try_route(VertexId from, VertexId to) const;
  std::string describe(const Route& route) const;  // "gpu0 -> sw0 -> cpu0 -> dram0 (31.5 GB/s, 2000 ns)"

 private:
  struct Graph;  // the Boost graph and its per-link lookups (topology.cpp)

  // Shared and const: built once in the constructor, so copies of a Topology (a copied sim::Cluster) can share it.
  std::shared_ptr<const Graph> graph_;
  int node_count_ = 0;
  int gpus_per_node_ = 0;
  bool peer_to_peer_ = false;
  void assign_rails();

  std::vector<std::vector<VertexId>> gpus_;  // [node][gpu index]
  std::vector<int> rail_offset_;             // [gpu index]: its NIC's vertex offset from the node's first vertex
  std::vector<VertexId> first_vertex_;
  std::vector<int> first_link_;
  std::optional<VertexId> fabric_;
};

}  // namespace trainyard::hw
