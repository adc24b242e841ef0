#pragma once
// Collectives as sequences of steps of point-to-point transfers between group ranks, so that they share links
// with everything else. B = bytes per GPU (the full buffer), n = group size, rank 0 = the first member.
//   all_reduce  ring:   2(n-1) steps, rank r sends B/n to r+1 (reduce-scatter, then all-gather)
//               direct: 2 steps, every rank sends B/n to every other (same two phases)
//               tree:   binary tree (parent of r is (r-1)/2): reduce up level by level, then broadcast down, B per edge
//   all_gather, reduce_scatter  ring: n-1 steps of B/n to r+1; direct: 1 step, B/n to every other rank
//   all_to_all  ring: n-1 pairwise exchanges, step s: r sends B/n to r+s; direct: 1 step, B/n to every other
//   broadcast   ring: pipelined along the chain in n-1 chunks of B/(n-1): 2n-3 steps (n = 2: one step of B)
//               direct: 1 step, the root sends B to every other rank; tree: down the binary tree, B per edge
#include <cstdint>
#include <vector>

#include "sim/task_graph.hpp"

namespace trainyard::sim {

struct Transfer {
  int src_rank = 0;
  int dst_rank = 0;
  double bytes = 0;
};

// NCCL runs a ring collective over several nodes as one ring per NIC rail (a "channel"), each carrying an equal
// share of the buffer; channel c visits every node's members rotated by c, so its node-to-node hops leave and
// enter through other GPUs, and so other rail NICs (hw::Topology::rail_nic). `member_nodes` is each member's node
// in group order. Returns the member order of each channel: min(rails, members per node) channels when the group
// spans several nodes with its members contiguous and equal per node, else one channel in the group's order.
std::vector<std::vector<int>> ring_channels(const std::vector<int>& member_nodes, int rails);

int collective_steps(CollectiveOp op, Algorithm algorithm, int n);
// The most bytes one rank sends over the whole collective (B = bytes per GPU): ring all-reduce 2(n-1)/n B,
// all-gather, reduce-scatter and all-to-all (n-1)/n B, a pipelined ring broadcast B, the direct broadcast's root
// (n-1) B, a tree's inner rank 2 B.
double bytes_sent_per_rank(CollectiveOp op, Algorithm algorithm, int n, std::int64_t bytes);
// Appends the transfers of step `step` (0-based) to `out`.
void collective_step(CollectiveOp op, Algorithm algorithm, int n, std::int64_t bytes, int step, std::vector<Transfer>& out);

}  // namespace trainyard::sim
