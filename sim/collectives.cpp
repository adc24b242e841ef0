#include "sim/collectives.hpp"

#include <algorithm>

#include "common/error.hpp"

namespace trainyard::sim {

namespace {

int tree_depth(int n) {  // levels below the root in a heap-ordered binary tree of n ranks
  int depth = 0;
  while ((2 << depth) - 1 < n) ++depth;  // ranks at level d are [2^d - 1, 2^(d+1) - 2]
  return depth;
}

}  // namespace

std::vector<std::vector<int>> ring_channels(const std::vector<int>& member_nodes, int rails) {
  const int n = static_cast<int>(member_nodes.size());
  std::vector<int> identity(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) identity[i] = i;
  // Contiguous runs of equal length, one per node, no node twice.
  std::vector<int> run_starts{0};
  for (int i = 1; i < n; ++i) {
    if (member_nodes[i] != member_nodes[i - 1]) run_starts.push_back(i);
  }
  const int nodes = static_cast<int>(run_starts.size());
  const int per_node = n / nodes;
  std::vector<int> seen = member_nodes;
  std::sort(seen.begin(), seen.end());
  const bool even = nodes > 1 && per_node * nodes == n && std::unique(seen.begin(), seen.end()) - seen.begin() == nodes &&
                    std::all_of(run_starts.begin(), run_starts.end(), [&](int start) { return start % per_node == 0; });
  const int channels = even ? std::min(rails, per_node) : 1;
  if (channels <= 1) return {identity};
  std::vector<std::vector<int>> orders;
  for (int c = 0; c < channels; ++c) {
    std::vector<int> order;
    for (int k = 0; k < nodes; ++k) {
      for (int j = 0; j < per_node; ++j) order.push_back(k * per_node + (j + c) % per_node);
    }
    orders.push_back(std::move(order));
  }
  return orders;
}

double bytes_sent_per_rank(CollectiveOp op, Algorithm algorithm, int n, std::int64_t bytes) {
  const double b = static_cast<double>(bytes), share = static_cast<double>(n - 1) / n;
  if (algorithm == Algorithm::tree) return 2 * b;
  switch (op) {
    case CollectiveOp::all_reduce: return 2 * share * b;
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_to_all: return share * b;
    case CollectiveOp::broadcast: return algorithm == Algorithm::direct ? (n - 1) * b : b;
  }
  return b;
}

int collective_steps(CollectiveOp op, Algorithm algorithm, int n) {
  TRAINYARD_CHECK(n >= 2, "a collective needs at least two ranks");
  switch (op) {
    case CollectiveOp::all_reduce: return algorithm == Algorithm::ring ? 2 * (n - 1) : algorithm == Algorithm::direct ? 2 : 2 * tree_depth(n);
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_to_all:
      TRAINYARD_CHECK(algorithm != Algorithm::tree, "tree is only modelled for all_reduce and broadcast");
      return algorithm == Algorithm::ring ? n - 1 : 1;
    case CollectiveOp::broadcast: return algorithm == Algorithm::ring ? (n == 2 ? 1 : 2 * n - 3) : algorithm == Algorithm::direct ? 1 : tree_depth(n);
  }
  return 0;
}

void collective_step(CollectiveOp op, Algorithm algorithm, int n, std::int64_t bytes, int step, std::vector<Transfer>& out) {
  const double b = static_cast<double>(bytes);
  const double slice = b / n;
  auto all_pairs = [&](double each) {
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) {
        if (q != r) out.push_back({r, q, each});
      }
    }
  };
  // Tree edges between `level` and `level + 1`, upwards (child -> parent) or downwards.
  auto tree_level = [&](int level, bool up) {
    for (int r = (1 << (level + 1)) - 1; r < n && r <= (2 << (level + 1)) - 2; ++r) {
      const int parent = (r - 1) / 2;
      out.push_back(up ? Transfer{r, parent, b} : Transfer{parent, r, b});
    }
  };
  switch (op) {
    case CollectiveOp::all_reduce:
      if (algorithm == Algorithm::ring) {
        for (int r = 0; r < n; ++r) out.push_back({r, (r + 1) % n, slice});
      } else if (algorithm == Algorithm::direct) {
        all_pairs(slice);
      } else {
        const int depth = tree_depth(n);
        if (step < depth) tree_level(depth - 1 - step, true);  // deepest level first
        else tree_level(step - depth, false);
      }
      return;
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
      if (algorithm == Algorithm::ring) {
        for (int r = 0; r < n; ++r) out.push_back({r, (r + 1) % n, slice});
      } else {
        all_pairs(slice);
      }
      return;
    case CollectiveOp::all_to_all:
      if (algorithm == Algorithm::ring) {
        for (int r = 0; r < n; ++r) out.push_back({r, (r + step + 1) % n, slice});
      } else {
        all_pairs(slice);
      }
      return;
    case CollectiveOp::broadcast:
      if (algorithm == Algorithm::direct) {
        for (int q = 1; q < n; ++q) out.push_back({0, q, b});
      } else if (algorithm == Algorithm::tree) {
        tree_level(step, false);
      } else if (n == 2) {
        out.push_back({0, 1, b});
      } else {
        // Hop j carries rank j -> j+1; at step s it forwards chunk s - j if that chunk exists.
        const double chunk = b / (n - 1);
        for (int j = 0; j < n - 1; ++j) {
          const int c = step - j;
          if (c >= 0 && c < n - 1) out.push_back({j, j + 1, chunk});
        }
      }
      return;
  }
}

}  // namespace trainyard::sim
