#pragma once
// The order of GPUs round a ring (ring-track's layer ring): every hop of the ring is active at once, so the
// ring is as fast as its slowest hop with hops that share a link direction sharing its bandwidth.
#include <vector>

#include "sim/cluster.hpp"

namespace trainyard::planner {

// The cyclic order of GPUs `members` (cluster GPU indices) that maximises the slowest hop's bandwidth, counting
// hops that share a link direction as sharing its bandwidth; ties go to fewer node crossings, then the faster
// total, then the lexicographically smaller order. Exhaustive up to 9 GPUs; beyond that, the nodes in order and a
// greedy fastest-next-hop chain inside each node.
std::vector<int> best_ring_order(const sim::Cluster& cluster, const std::vector<int>& members);

struct RingHop {
  int from = 0, to = 0;  // cluster GPU indices
  double GBps = 0;       // bandwidth of the hop with every hop of the ring active at once
};
// The hops of a cyclic order, with the shared-bandwidth rule above.
std::vector<RingHop> ring_hops(const sim::Cluster& cluster, const std::vector<int>& order);

}  // namespace trainyard::planner
