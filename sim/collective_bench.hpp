#pragma once
// One collective over every GPU of a cluster, simulated alone: what nccl-tests measures, in its terms
// (nccl-tests doc/PERFORMANCE.md): size S = the full buffer per GPU (all-gather: the gathered output),
// algbw = S / t, busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter and
// all-to-all, x 1 for broadcast. `trainyard simulate --collective` prints it; `trainyard validate` compares it
// with published nccl-tests curves.
#include <cstdint>
#include <string>

#include "sim/cluster.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::sim {

struct CollectiveBenchmark {
  CollectiveOp op = CollectiveOp::all_reduce;
  Algorithm algorithm = Algorithm::ring;
  std::string protocol;  // the collective library's protocol the simulator picked (NCCL: LL, LL128, Simple)
  std::int64_t bytes = 0;
  int ranks = 0;
  std::int64_t time_ns = 0;
  double algbw_GBps = 0;
  double busbw_GBps = 0;
};

// nccl-tests' bus-bandwidth factor for `op` over n ranks.
double busbw_factor(CollectiveOp op, int n);
// Simulates `op` of `bytes` per GPU (rounded down to a multiple of the GPU count) over all of `cluster`'s GPUs
// with `algorithm`. InputError for fewer than 2 GPUs, a size below one byte per GPU, or an algorithm the
// collective cannot use (tree: all-reduce and broadcast only).
CollectiveBenchmark benchmark_collective(const Cluster& cluster, CollectiveOp op, Algorithm algorithm, std::int64_t bytes);

}  // namespace trainyard::sim
