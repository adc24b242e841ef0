#include "sim/collective_bench.hpp"

#include <numeric>
#include <vector>

#include "common/error.hpp"
#include "sim/engine.hpp"

namespace trainyard::sim {

double busbw_factor(CollectiveOp op, int n) {
  const double ranks = n;
  switch (op) {
    case CollectiveOp::all_reduce: return 2 * (ranks - 1) / ranks;
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_to_all: return (ranks - 1) / ranks;
    case CollectiveOp::broadcast: return 1;
  }
  return 1;
}

CollectiveBenchmark benchmark_collective(const Cluster& cluster, CollectiveOp op, Algorithm algorithm, std::int64_t bytes) {
  const int n = cluster.gpus();
  if (n < 2) throw InputError("--nodes", "value", "a cluster of at least 2 GPUs for a collective", std::to_string(n) + " GPU");
  bytes -= bytes % n;  // the graph splits the buffer evenly over the ranks (nccl-tests rounds its count the same way)
  if (bytes < n) throw InputError("--bytes", "value", "at least one byte per GPU (" + std::to_string(n) + ")", std::to_string(bytes));
  TaskGraph graph;
  std::vector<DeviceId> members(static_cast<std::size_t>(n));
  std::iota(members.begin(), members.end(), 0);
  const std::int32_t group = graph.add_group(members);
  graph.collective(std::string(to_string(op)), Collective{op, algorithm, group, bytes});
  validate(graph, n, cluster.nodes, "--collective");
  graph.finalize();
  SimOptions options;
  options.record_memory = false;
  options.record_links = false;
  const SimResult result = simulate(graph, cluster, options);
  TRAINYARD_CHECK(result.completed && result.step_ns > 0, "a lone collective always completes");
  CollectiveBenchmark b{op, algorithm, "", bytes, n, result.step_ns, 0, 0};
  TRAINYARD_CHECK(result.collective_protocols.size() == 1, "one collective, one protocol");
  b.protocol = result.protocol_names[result.collective_protocols.front().second];
  b.algbw_GBps = static_cast<double>(bytes) / static_cast<double>(result.step_ns);  // bytes per ns = GB/s
  b.busbw_GBps = b.algbw_GBps * busbw_factor(op, n);
  return b;
}

}  // namespace trainyard::sim
