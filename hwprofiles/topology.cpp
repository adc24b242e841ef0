#include "hwprofiles/topology.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>

#include <type_traits>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/dijkstra_shortest_paths.hpp>
#include <boost/graph/filtered_graph.hpp>

#include "common/error.hpp"
#include "common/units.hpp"

namespace trainyard::hw {

namespace {

using TopologyGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, TopoVertex, TopoLink>;
using LinkId = TopologyGraph::edge_descriptor;
// With vecS vertex storage a vertex descriptor is its index, so the header's VertexId is Boost's as it is.
static_assert(std::is_same_v<TopologyGraph::vertex_descriptor, VertexId>);

constexpr double kHopCost = 1e-6;  // breaks ties between equally fast routes in favour of fewer hops

TopoLink make_link(LinkType type, double GBps, bool full_duplex, std::int64_t latency_ns) {
  return TopoLink{type, GBps, full_duplex, latency_ns, 1.0 / GBps + kHopCost, -1};
}

bool endpoint_only(VertexType type) { return type == VertexType::gpu || type == VertexType::host_memory; }

}  // namespace

struct Topology::Graph {
  TopologyGraph g;
  std::vector<LinkId> edges;               // [TopoLink::index]
  std::vector<std::vector<int>> links_at;  // [vertex]: its links' indices, as Boost's out_edges lists them

  VertexId add_vertex(TopoVertex v) {
    links_at.emplace_back();
    return boost::add_vertex(std::move(v), g);
  }
  void add_link(VertexId a, VertexId b, TopoLink link) {
    link.index = static_cast<int>(edges.size());
    links_at[a].push_back(link.index);
    if (b != a) links_at[b].push_back(link.index);
    edges.push_back(boost::add_edge(a, b, link, g).first);
  }
};

Topology::Topology(const NodeProfile& node, int node_count)
    : node_count_(node_count), gpus_per_node_(node.gpu_count()), peer_to_peer_(node.pcie_peer_to_peer) {
  TRAINYARD_CHECK(node_count >= 1, "a cluster needs at least one node");
  auto graph = std::make_shared<Graph>();  // filled here, then only read
  graph_ = graph;
  const bool has_nics = node.count(VertexType::nic) > 0;
  VertexId fabric{};
  if (node_count > 1) {
    TRAINYARD_CHECK(has_nics, "a multi-node cluster of a node without NICs");
    fabric = graph->add_vertex(TopoVertex{"fabric", VertexType::fabric, -1});
    fabric_ = fabric;
  }
  auto latency = [&](LinkType type) -> std::int64_t {
    auto it = node.latency_ns.find(type);
    return it == node.latency_ns.end() ? 0 : static_cast<std::int64_t>(it->second.value);
  };
  gpus_.resize(node_count);
  for (int n = 0; n < node_count; ++n) {
    const auto first = boost::num_vertices(graph->g);
    first_vertex_.push_back(first);
    first_link_.push_back(link_count());
    for (const auto& v : node.vertices) graph->add_vertex(TopoVertex{v.id, v.type, n});
    auto local = [&](const std::string& id) {
      for (std::size_t i = 0; i < node.vertices.size(); ++i) {
        if (node.vertices[i].id == id) return static_cast<VertexId>(first + i);
      }
      TRAINYARD_CHECK(false, "link to unknown vertex " + id);
    };
    for (const auto& l : node.links) {
      graph->add_link(local(l.a), local(l.b), make_link(l.type, l.GBps_per_direction, l.full_duplex, latency(l.type)));
    }
    for (int g = 0; g < gpus_per_node_; ++g) gpus_[n].push_back(local("gpu" + std::to_string(g)));
    if (node_count > 1) {
      for (const auto& v : node.vertices) {
        if (v.type != VertexType::nic) continue;
        graph->add_link(local(v.id), fabric, make_link(LinkType::network, v.nic_GBps_per_direction->value, true, latency(LinkType::network)));
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
  const TopologyGraph& graph = graph_->g;
  for (auto [it, end] = boost::vertices(graph); it != end; ++it) {
    if (graph[*it].type == VertexType::nic && graph[*it].node == 0) nics.push_back(*it);
  }
  std::map<std::vector<VertexId>, int> taken;  // nearest set -> GPUs already given one of its NICs
  for (int g = 0; g < gpus_per_node_; ++g) {
    std::vector<std::pair<double, VertexId>> costs;
    for (VertexId nic : nics) {
      if (const auto r = try_route(gpus_[0][g], nic)) {
        double cost = 0;
        for (int index : r->links) cost += link(index).route_cost;
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
  const int node = vertex_info(gpu).node;
  for (int g = 0; g < gpus_per_node_; ++g) {
    if (gpus_[node][g] == gpu) {
      const int offset = rail_offset_[g];
      if (offset < 0) return std::nullopt;
      return first_vertex(node) + static_cast<VertexId>(offset);
    }
  }
  TRAINYARD_CHECK(false, "rail_nic of a vertex that is not a GPU: " + name(gpu));
}

int Topology::vertex_count() const { return static_cast<int>(boost::num_vertices(graph_->g)); }

int Topology::link_count() const { return static_cast<int>(graph_->edges.size()); }

const TopoVertex& Topology::vertex_info(VertexId v) const { return graph_->g[v]; }

const TopoLink& Topology::link(int index) const { return graph_->g[graph_->edges[index]]; }

std::pair<VertexId, VertexId> Topology::link_ends(int index) const {
  const LinkId e = graph_->edges[index];
  return {boost::source(e, graph_->g), boost::target(e, graph_->g)};
}

VertexId Topology::other_end(int index, VertexId v) const {
  const auto [a, b] = link_ends(index);
  return a == v ? b : a;
}

const std::vector<int>& Topology::links_at(VertexId v) const { return graph_->links_at[v]; }

VertexId Topology::vertex(int node, std::string_view id) const {
  const TopologyGraph& g = graph_->g;
  for (auto [it, end] = boost::vertices(g); it != end; ++it) {
    if (g[*it].node == node && g[*it].id == id) return *it;
  }
  TRAINYARD_CHECK(false, "no vertex " + std::string(id) + " on node " + std::to_string(node));
}

VertexId Topology::gpu(int node, int index) const {
  TRAINYARD_CHECK(node >= 0 && node < node_count_ && index >= 0 && index < gpus_per_node_, "GPU index out of range");
  return gpus_[node][index];
}

std::string Topology::name(VertexId v) const {
  const TopoVertex& vertex = vertex_info(v);
  if (node_count_ == 1 || vertex.node < 0) return vertex.id;
  return "n" + std::to_string(vertex.node) + "." + vertex.id;
}

std::optional<Route> Topology::try_route(VertexId from, VertexId to) const {
  const TopologyGraph& g = graph_->g;
  auto may_visit = [&g, from, to](VertexId v) { return v == from || v == to || !endpoint_only(g[v].type); };
  boost::filtered_graph<TopologyGraph, boost::keep_all, std::function<bool(VertexId)>> view(g, boost::keep_all(), may_visit);
  const auto n = boost::num_vertices(g);
  std::vector<VertexId> predecessor(n);
  std::vector<double> distance(n, std::numeric_limits<double>::infinity());
  boost::dijkstra_shortest_paths(view, from,
                                 boost::predecessor_map(boost::make_iterator_property_map(predecessor.begin(), boost::get(boost::vertex_index, g)))
                                     .distance_map(boost::make_iterator_property_map(distance.begin(), boost::get(boost::vertex_index, g)))
                                     .weight_map(boost::get(&TopoLink::route_cost, g)));
  if (from != to && predecessor[to] == to) return std::nullopt;

  Route route;
  route.bottleneck_GBps = std::numeric_limits<double>::infinity();
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
    route.links.insert(route.links.begin(), g[best].index);
    route.vertices.insert(route.vertices.begin(), v);
    route.bottleneck_GBps = std::min(route.bottleneck_GBps, g[best].GBps_per_direction);
    route.latency_ns += g[best].latency_ns;
  }
  route.vertices.insert(route.vertices.begin(), from);
  if (route.links.empty()) route.bottleneck_GBps = 0;
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
  const TopologyGraph& g = graph_->g;
  for (auto [it, end] = boost::vertices(g); it != end; ++it) {
    if (g[*it].type != VertexType::host_memory || g[*it].node != g[gpu].node) continue;
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
  out += " (" + format_fixed(route.bottleneck_GBps, 1) + " GB/s, " + std::to_string(route.latency_ns) + " ns)";
  return out;
}

}  // namespace trainyard::hw
