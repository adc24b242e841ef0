#include "hwprofiles/node.hpp"

#include <algorithm>
#include <set>

#include "common/error.hpp"
#include "hwprofiles/topology.hpp"

namespace trainyard::hw {

std::string_view to_string(VertexType type) {
  switch (type) {
    case VertexType::gpu: return "gpu";
    case VertexType::root_complex: return "root_complex";
    case VertexType::host_memory: return "host_memory";
    case VertexType::pcie_switch: return "pcie_switch";
    case VertexType::nvswitch: return "nvswitch";
    case VertexType::nic: return "nic";
    case VertexType::fabric: return "fabric";
  }
  return "?";
}

std::string_view to_string(LinkType type) {
  switch (type) {
    case LinkType::pcie: return "pcie";
    case LinkType::nvlink: return "nvlink";
    case LinkType::dram: return "dram";
    case LinkType::socket: return "socket";
    case LinkType::network: return "network";
  }
  return "?";
}

int NodeProfile::count(VertexType type) const {
  int n = 0;
  for (const auto& v : vertices) n += v.type == type;
  return n;
}

int NodeProfile::gpu_count() const { return count(VertexType::gpu); }

double NodeProfile::host_dram_GBps() const {
  double total = 0;
  for (const auto& link : links) {
    if (link.type == LinkType::dram) total += link.GBps_per_direction;
  }
  return total;
}

const VertexSpec* NodeProfile::find_vertex(std::string_view id) const {
  for (const auto& v : vertices) {
    if (v.id == id) return &v;
  }
  return nullptr;
}

double NodeProfile::nic_GBps_per_gpu() const {
  double total = 0;
  for (const auto& v : vertices) {
    if (v.nic_GBps_per_direction) total += v.nic_GBps_per_direction->value;
  }
  return gpu_count() > 0 ? total / gpu_count() : 0;
}

namespace {

const std::vector<std::string> kVertexTypes = {"gpu", "root_complex", "host_memory", "pcie_switch", "nvswitch", "nic"};
const std::vector<std::string> kLinkTypes = {"pcie", "nvlink", "dram", "socket"};

template <typename Enum>
Enum enum_from(const std::vector<std::string>& names, const std::string& name) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  TRAINYARD_CHECK(false, "unknown enum name " + name);
}

// Which vertex types may sit at the two ends of each link type.
bool endpoints_ok(LinkType link, VertexType a, VertexType b) {
  auto is = [&](VertexType x, VertexType y) { return (a == x && b == y) || (a == y && b == x); };
  switch (link) {
    case LinkType::nvlink: return is(VertexType::gpu, VertexType::nvswitch) || is(VertexType::gpu, VertexType::gpu);
    case LinkType::dram: return is(VertexType::root_complex, VertexType::host_memory);
    case LinkType::socket: return is(VertexType::root_complex, VertexType::root_complex);
    case LinkType::pcie:
      for (VertexType t : {a, b}) {
        if (t == VertexType::host_memory || t == VertexType::nvswitch) return false;
      }
      return true;
    case LinkType::network: return false;  // added by Topology for clusters, never written in a node file
  }
  return false;
}

}  // namespace

NodeProfile parse_node(const json::Json& document, const std::string& origin, GpuLoader load_gpu) {
  using json::Bound;
  json::Reader top(document, origin);
  NodeProfile node;
  json::read_header(top, "trainyard.node.v1", node);
  const json::Sources sources = top.sources("sources");
  const std::string gpu_ref = top.string("gpu");
  try {
    node.gpu = load_gpu(gpu_ref, origin);
  } catch (const InputError& e) {
    throw InputError(origin + ": field 'gpu': cannot load GPU profile \"" + gpu_ref + "\": " + e.what());
  }
  // 1 GiB .. 1 PiB: catches DRAM written in GB ("2048") instead of bytes.
  node.host_dram_bytes = top.figure("host_dram_bytes", Bound{1073741824.0, 1125899906842624.0, "bytes", true, true}, sources);
  node.pcie_peer_to_peer = top.boolean("pcie_peer_to_peer");
  if (top.has("nvlink_sharp")) node.nvlink_sharp = top.figure("nvlink_sharp", Bound{0, 1, "(1: yes, 0: no)", true}, sources);

  json::Reader topology = top.object("topology");
  std::set<std::string, std::less<>> ids;
  for (const json::Reader& v : topology.objects("vertices")) {
    VertexSpec spec;
    spec.id = v.string("id");
    spec.type = enum_from<VertexType>(kVertexTypes, v.choice("type", kVertexTypes));
    if (!ids.insert(spec.id).second) v.fail("id", "an id not used by another vertex", "\"" + spec.id + "\" again");
    if (spec.type == VertexType::nic) {
      refuse_old_bandwidth_key(v, "gbps_per_direction", "GBps_per_direction");
      spec.nic_GBps_per_direction = v.figure("GBps_per_direction", Bound{0.1, 1000, "GB/s (200 Gb/s = 25 GB/s)"}, sources);
    }
    v.finish();
    node.vertices.push_back(std::move(spec));
  }
  // GPU ids are gpu0..gpuN-1 so that "GPU k" means the same thing in every file and output.
  const int gpus = node.gpu_count();
  if (gpus == 0) topology.fail("vertices", "at least one vertex of type \"gpu\"", "none");
  for (int i = 0; i < gpus; ++i) {
    const VertexSpec* v = node.find_vertex("gpu" + std::to_string(i));
    if (v == nullptr || v->type != VertexType::gpu) {
      topology.fail("vertices", "GPU vertices named gpu0..gpu" + std::to_string(gpus - 1), "no gpu vertex named \"gpu" + std::to_string(i) + "\"");
    }
  }

  std::set<LinkType> link_types;
  for (const json::Reader& l : topology.objects("links")) {
    LinkSpec link;
    link.a = l.string("a");
    link.b = l.string("b");
    link.type = enum_from<LinkType>(kLinkTypes, l.choice("type", kLinkTypes));
    const VertexSpec* a = node.find_vertex(link.a);
    const VertexSpec* b = node.find_vertex(link.b);
    if (a == nullptr) l.fail("a", "the id of a vertex listed in topology.vertices", "\"" + link.a + "\"");
    if (b == nullptr) l.fail("b", "the id of a vertex listed in topology.vertices", "\"" + link.b + "\"");
    if (a == b) l.fail("b", "a vertex other than \"a\"", "\"" + link.b + "\"");
    if (!endpoints_ok(link.type, a->type, b->type)) {
      l.fail("type", "a link type that can join a " + std::string(to_string(a->type)) + " and a " + std::string(to_string(b->type)),
             "\"" + std::string(to_string(link.type)) + "\"");
    }
    switch (link.type) {
      case LinkType::pcie: {
        link.pcie_generation = static_cast<int>(l.integer("generation", 1, 6));
        link.pcie_lanes = static_cast<int>(l.integer("lanes", 1, 32));
        link.GBps_per_direction = pcie_GBps_per_direction(link.pcie_generation, link.pcie_lanes);
        break;
      }
      case LinkType::nvlink:
        if (node.gpu.nvlink_GBps_per_direction.value <= 0) {
          l.fail("type", "no nvlink links: GPU profile \"" + node.gpu.name + "\" has nvlink_GBps_per_direction 0", "\"nvlink\"");
        }
        link.GBps_per_direction = node.gpu.nvlink_data_GBps();
        break;
      case LinkType::dram:
        refuse_old_bandwidth_key(l, "gbps", "GBps");
        link.GBps = l.figure("GBps", Bound{1, 100000, "GB/s (reads and writes together)"}, sources);
        link.GBps_per_direction = link.GBps->value;
        link.full_duplex = false;
        break;
      case LinkType::socket:
        refuse_old_bandwidth_key(l, "gbps_per_direction", "GBps_per_direction");
        link.GBps = l.figure("GBps_per_direction", Bound{1, 100000, "GB/s"}, sources);
        link.GBps_per_direction = link.GBps->value;
        break;
      case LinkType::network: break;
    }
    l.finish();
    link_types.insert(link.type);
    node.links.push_back(std::move(link));
  }

  json::Reader latency = topology.object("latency_ns");
  std::vector<LinkType> needed(link_types.begin(), link_types.end());
  if (node.count(VertexType::nic) > 0) needed.push_back(LinkType::network);
  for (LinkType type : needed) {
    node.latency_ns[type] = latency.figure(to_string(type), Bound{0, 1e7, "ns"}, sources);
  }
  latency.finish();  // a latency for a link type the node does not have is a mistake
  topology.finish();
  top.finish();

  // Every GPU must reach host memory, or offload plans would silently have nowhere to go.
  Topology graph(node, 1);
  for (int i = 0; i < gpus; ++i) {
    const VertexId gpu = graph.gpu(0, i);
    if (!graph.nearest_host_memory(gpu)) {
      topology.fail("links", "a path of links from gpu" + std::to_string(i) + " to a host_memory vertex",
                    "none (gpu" + std::to_string(i) + " is not connected to host memory)");
    }
  }
  // GPUs must reach each other (messages, collectives) and, when the node has NICs, a NIC (other nodes).
  std::vector<VertexId> nics;
  for (const auto& v : node.vertices) {
    if (v.type == VertexType::nic) nics.push_back(graph.vertex(0, v.id));
  }
  for (int i = 0; i < gpus; ++i) {
    const VertexId a = graph.gpu(0, i);
    for (int j = i + 1; j < gpus; ++j) {
      if (!graph.try_route(a, graph.gpu(0, j))) {
        topology.fail("links", "a path of links between every two GPUs", "none between gpu" + std::to_string(i) + " and gpu" + std::to_string(j));
      }
    }
    const bool reaches_nic = nics.empty() || std::any_of(nics.begin(), nics.end(), [&](VertexId nic) { return graph.try_route(a, nic).has_value(); });
    if (!reaches_nic) {
      topology.fail("links", "a path of links from every GPU to a NIC", "none from gpu" + std::to_string(i));
    }
  }
  return node;
}

}  // namespace trainyard::hw
