#include "planner/schemes/ringtrack/ring_order.hpp"

#include <algorithm>
#include <map>

namespace trainyard::planner {

namespace {

constexpr int kExhaustiveRingLimit = 9;  // every cyclic order is scored up to this many GPUs (8! = 40320 orders)

// Routes between GPUs of a ring, computed once per pair (the order search scores thousands of cycles).
class HopScorer {
 public:
  explicit HopScorer(const sim::Cluster& cluster) : cluster_(cluster) {}

  // The hops of a cyclic order: each hop's bandwidth with every hop of the ring active at once, hops that share a
  // link direction sharing its bandwidth (a half-duplex link counts both directions together).
  std::vector<RingHop> hops(const std::vector<int>& order) {
    const auto& topo = cluster_.topology;
    const std::size_t n = order.size();
    load_.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const hw::Route& r = route(order[i], order[(i + 1) % n]);
      for (std::size_t j = 0; j < r.links.size(); ++j) ++load_[key(r, j)];
    }
    std::vector<RingHop> out;
    for (std::size_t i = 0; i < n; ++i) {
      const hw::Route& r = route(order[i], order[(i + 1) % n]);
      double GBps = r.bottleneck_GBps;
      for (std::size_t j = 0; j < r.links.size(); ++j) GBps = std::min(GBps, topo.link(r.links[j]).GBps_per_direction / load_[key(r, j)]);
      out.push_back({order[i], order[(i + 1) % n], GBps});
    }
    return out;
  }

 private:
  const hw::Route& route(int a, int b) {
    auto [it, inserted] = routes_.try_emplace({a, b});
    if (inserted) {
      const auto& topo = cluster_.topology;
      const int per_node = topo.gpus_per_node();
      it->second = topo.route(topo.gpu(a / per_node, a % per_node), topo.gpu(b / per_node, b % per_node));
    }
    return it->second;
  }
  std::pair<int, int> key(const hw::Route& r, std::size_t i) const {
    const auto& link = cluster_.topology.link(r.links[i]);
    return {r.links[i], link.full_duplex ? static_cast<int>(r.vertices[i] < r.vertices[i + 1]) : 2};
  }

  const sim::Cluster& cluster_;
  std::map<std::pair<int, int>, hw::Route> routes_;
  std::map<std::pair<int, int>, int> load_;
};

}  // namespace

std::vector<RingHop> ring_hops(const sim::Cluster& cluster, const std::vector<int>& order) { return HopScorer(cluster).hops(order); }

std::vector<int> best_ring_order(const sim::Cluster& cluster, const std::vector<int>& members) {
  if (members.size() <= 2) return members;
  const int per_node = cluster.topology.gpus_per_node();
  HopScorer scorer(cluster);
  struct Score {
    double slowest = 0;
    int crossings = 0;
    double seconds_per_gb = 0;
  };
  auto score = [&](const std::vector<int>& order) {
    Score s;
    const auto hops = scorer.hops(order);
    s.slowest = hops.front().GBps;
    for (const auto& h : hops) {
      s.slowest = std::min(s.slowest, h.GBps);
      s.crossings += h.from / per_node != h.to / per_node;
      s.seconds_per_gb += 1.0 / h.GBps;
    }
    return s;
  };
  auto better = [](const Score& a, const Score& b) {
    if (a.slowest != b.slowest) return a.slowest > b.slowest * (1 + 1e-9);
    if (a.crossings != b.crossings) return a.crossings < b.crossings;
    return a.seconds_per_gb < b.seconds_per_gb * (1 - 1e-9);
  };
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.size() <= static_cast<std::size_t>(kExhaustiveRingLimit)) {
    // Cycles: fix the first member, try every order of the rest (lexicographic, so ties keep the smallest).
    std::vector<int> order = sorted, best = sorted;
    Score best_score = score(best);
    while (std::next_permutation(order.begin() + 1, order.end())) {
      const Score s = score(order);
      if (better(s, best_score)) {
        best = order;
        best_score = s;
      }
    }
    return best;
  }
  // Large rings: nodes in order (one crossing per node boundary), a greedy fastest-next-hop chain in each node.
  std::vector<int> order;
  std::map<int, std::vector<int>> by_node;
  for (int g : sorted) by_node[g / per_node].push_back(g);
  for (auto& [node, gpus] : by_node) {
    std::vector<int> left = gpus;
    int at = left.front();
    left.erase(left.begin());
    order.push_back(at);
    while (!left.empty()) {
      std::size_t pick = 0;
      double pick_GBps = -1;
      for (std::size_t i = 0; i < left.size(); ++i) {
        const double GBps = scorer.hops({at, left[i]}).front().GBps;
        if (GBps > pick_GBps) {
          pick = i;
          pick_GBps = GBps;
        }
      }
      at = left[pick];
      left.erase(left.begin() + static_cast<std::ptrdiff_t>(pick));
      order.push_back(at);
    }
  }
  return order;
}

}  // namespace trainyard::planner
