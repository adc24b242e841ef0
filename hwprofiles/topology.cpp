#include "hwprofiles/topology.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>

#include <boost/graph/dijkstra_shortest_paths.hpp>
#include <boost/graph/filtered_graph.hpp>

#include "common/error.hpp"
#include "common/units.hpp"

namespace trainyard::hw {

namespace {

constexpr double kHopCost = 1e-6;  // breaks ties between equally fast routes in favour of fewer hops

TopoLink make_link(LinkType type, double gbps, bool full_duplex, std::int64_t latency_ns) {
  return TopoLink{type, gbps, full_duplex, latency_ns, 1.0 / gbps + kHopCost, -1};
}

bool endpoint_only(VertexType type) { return type == VertexType::gpu || type == VertexType::host_memory; }

}  // namespace

Topology::Topology(const NodeProfile& node, int node_count)
    : node_count_(node_count), gpus_per_node_(node.gpu_count()), peer_to_peer_(node.pcie_peer_to_peer) {
  TRAINYARD_CHECK(node_count >= 1, "a cluster needs at least one node");
  const bool has_nics = node.count(VertexType::nic) > 0;
  VertexId fabric{};
  if (node_count > 1) {
    TRAINYARD_CHECK(has_nics, "a multi-node cluster of a node without NICs");
    fabric = boost::add_vertex(TopoVertex{"fabric", VertexType::fabric, -1}, graph_);
    fabric_ = fabric;
  }
  auto latency = [&](LinkType type) -> std::int64_t {
    auto it = node.latency_ns.find(type);
    return it == node.latency_ns.end() ? 0 : static_cast<std::int64_t>(it->second.value);
  };
  gpus_.resize(node_count);
  for (int n = 0; n < node_count; ++n) {
    const auto first = boost::num_vertices(graph_);
    first_vertex_.push_back(first);
    first_link_.push_back(link_count());
    for (const auto& v : node.vertices) boost::add_vertex(TopoVertex{v.id, v.type, n}, graph_);
    auto local = [&](const std::string& id) {
      for (std::size_t i = 0; i < node.vertices.size(); ++i) {
        if (node.vertices[i].id == id) return static_cast<VertexId>(first + i);
      }
      TRAINYARD_CHECK(false, "link to unknown vertex " + id);
    };
    for (const auto& l : node.links) {
      add_link(local(l.a), local(l.b), make_link(l.type, l.gbps_per_direction, l.full_duplex, latency(l.type)));
    }
    for (int g = 0; g < gpus_per_node_; ++g) gpus_[n].push_back(local("gpu" + std::to_string(g)));
    if (node_count > 1) {
      for (const auto& v : node.vertices) {
        if (v.type != VertexType::nic) continue;
        add_link(local(v.id), fabric,
                 make_link(LinkType::network, v.nic_gbps_per_direction->value, true, latency(LinkType::network)));
      }
    }
  }
  if (has_nics) assign_rails();
}

void Topology::assign_rails() {
  // On node 0 (every node is a copy): each GPU's nearest NICs by route cost, then GPUs with the same nearest
  // set take its NICs in turn, in GPU order.
  const VertexId first = first_vertex(0);
  std::vector<VertexId> nics;
  for (auto [it, end] = boost::vertices(graph_); it != end; ++it) {
    if (graph_[*it].type == VertexType::nic && graph_[*it].node == 0) nics.push_back(*it);
  }
  std::map<std::vector<VertexId>, int> taken;  // nearest set -> GPUs already given one of its NICs
  for (int g = 0; g < gpus_per_node_; ++g) {
    std::vector<std::pair<double, VertexId>> costs;
    for (VertexId nic : nics) {
      if (const auto r = try_route(gpus_[0][static_cast<std::size_t>(g)], nic)) {
        double cost = 0;
        for (const auto& link : r->links) cost += graph_[link].route_cost;
        costs.emplace_back(cost, nic);
      }
    }
    if (costs.empty()) {  // a profile error that validation reports in its own words: no rail here
      rail_offset_.push_back(-1);
      continue;
    }
    const double best = std::min_element(costs.begin(), costs.end())->first;
    std::vector<VertexId> nearest;
    for (const auto& [cost, nic] : costs) {
      if (cost <= best * (1 + 1e-9)) nearest.push_back(nic);
    }
    const int turn = taken[nearest]++;
    rail_offset_.push_back(static_cast<int>(nearest[static_cast<std::size_t>(turn) % nearest.size()] - first));
  }
}

int Topology::rail_count() const {
  std::vector<int> offsets;
  for (int offset : rail_offset_) {
    if (offset >= 0) offsets.push_back(offset);
  }
  std::sort(offsets.begin(), offsets.end());
  return static_cast<int>(std::unique(offsets.begin(), offsets.end()) - offsets.begin());
}

std::optional<VertexId> Topology::rail_nic(VertexId gpu) const {
  if (rail_offset_.empty()) return std::nullopt;
  const int node = graph_[gpu].node;
  for (int g = 0; g < gpus_per_node_; ++g) {
    if (gpus_[static_cast<std::size_t>(node)][static_cast<std::size_t>(g)] == gpu) {
      const int offset = rail_offset_[static_cast<std::size_t>(g)];
      if (offset < 0) return std::nullopt;
      return first_vertex(node) + static_cast<VertexId>(offset);
    }
  }
  TRAINYARD_CHECK(false, "rail_nic of a vertex that is not a GPU: " + name(gpu));
}

void Topology::add_link(VertexId a, VertexId b, TopoLink link) {
  link.index = static_cast<int>(boost::num_edges(graph_));
  boost::add_edge(a, b, link, graph_);
}

VertexId Topology::vertex(int node, std::string_view id) const {
  for (auto [it, end] = boost::vertices(graph_); it != end; ++it) {
    if (graph_[*it].node == node && graph_[*it].id == id) return *it;
  }
  TRAINYARD_CHECK(false, "no vertex " + std::string(id) + " on node " + std::to_string(node));
}

VertexId Topology::gpu(int node, int index) const {
  TRAINYARD_CHECK(node >= 0 && node < node_count_ && index >= 0 && index < gpus_per_node_,
                  "GPU index out of range");
  return gpus_[node][index];
}

std::string Topology::name(VertexId v) const {
  const TopoVertex& vertex = graph_[v];
  if (node_count_ == 1 || vertex.node < 0) return vertex.id;
  return "n" + std::to_string(vertex.node) + "." + vertex.id;
}

std::optional<Route> Topology::try_route(VertexId from, VertexId to) const {
  const TopologyGraph& g = graph_;
  auto may_visit = [&g, from, to](VertexId v) { return v == from || v == to || !endpoint_only(g[v].type); };
  boost::filtered_graph<TopologyGraph, boost::keep_all, std::function<bool(VertexId)>> view(g, boost::keep_all(),
                                                                                          may_visit);
  const auto n = boost::num_vertices(g);
  std::vector<VertexId> predecessor(n);
  std::vector<double> distance(n, std::numeric_limits<double>::infinity());
  boost::dijkstra_shortest_paths(
      view, from,
      boost::predecessor_map(boost::make_iterator_property_map(predecessor.begin(), boost::get(boost::vertex_index, g)))
          .distance_map(boost::make_iterator_property_map(distance.begin(), boost::get(boost::vertex_index, g)))
          .weight_map(boost::get(&TopoLink::route_cost, g)));
  if (from != to && predecessor[to] == to) return std::nullopt;

  Route route;
  route.bottleneck_gbps = std::numeric_limits<double>::infinity();
  for (VertexId v = to; v != from; v = predecessor[v]) {
    const VertexId u = predecessor[v];
    // Among parallel links between u and v take the cheapest, as Dijkstra did.
    LinkId best{};
    double best_cost = std::numeric_limits<double>::infinity();
    for (auto [it, end] = boost::out_edges(u, g); it != end; ++it) {
      if (boost::target(*it, g) == v && g[*it].route_cost < best_cost) {
        best = *it;
        best_cost = g[*it].route_cost;
      }
    }
    route.links.insert(route.links.begin(), best);
    route.vertices.insert(route.vertices.begin(), v);
    route.bottleneck_gbps = std::min(route.bottleneck_gbps, g[best].gbps_per_direction);
    route.latency_ns += g[best].latency_ns;
  }
  route.vertices.insert(route.vertices.begin(), from);
  if (route.links.empty()) route.bottleneck_gbps = 0;
  return route;
}

Route Topology::route(VertexId from, VertexId to) const {
  auto found = try_route(from, to);
  TRAINYARD_CHECK(found.has_value(), "no route from " + name(from) + " to " + name(to));
  return *found;
}

std::optional<VertexId> Topology::nearest_host_memory(VertexId gpu) const {
  std::optional<VertexId> best;
  std::size_t best_hops = std::numeric_limits<std::size_t>::max();
  for (auto [it, end] = boost::vertices(graph_); it != end; ++it) {
    if (graph_[*it].type != VertexType::host_memory || graph_[*it].node != graph_[gpu].node) continue;
    if (auto r = try_route(gpu, *it); r && r->links.size() < best_hops) {
      best = *it;
      best_hops = r->links.size();
    }
  }
  return best;
}

std::string Topology::describe(const Route& route) const {
  std::string out;
  for (VertexId v : route.vertices) out += (out.empty() ? "" : " -> ") + name(v);
  out += " (" + format_fixed(route.bottleneck_gbps, 1) + " GB/s, " + std::to_string(route.latency_ns) + " ns)";
  return out;
}

}  // namespace trainyard::hw
