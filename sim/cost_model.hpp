#pragma once
// How long a compute task takes on a GPU, and how many FLOPs it does: the roofline of the profile, with the
// achieved fraction of peak looked up by the call's FLOPs in the profile's efficiency tables:
//   time = max(FLOPs / (peak(dtype) * efficiency(FLOPs)), bytes / (HBM bandwidth * HBM efficiency)) + launch
#include <cstdint>

#include "hwprofiles/node.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::sim {

struct ComputeCost {
  double model_flops = 0;     // what MFU counts (attention backward: 2x forward)
  double hardware_flops = 0;  // what the kernel executes (attention backward recomputes the scores: 2.5x)
  double hbm_bytes = 0;       // bytes moved to and from HBM
};

// Attention FLOPs: 4 * head_dim * heads per (query, key) pair that is computed; causal counts only the
// unmasked pairs, with the queries at the last q_len positions of the keys.
double attention_pairs(const Attention& a);
ComputeCost compute_cost(const Task& task);
// Duration in ns of a gemm/attention/elementwise/optimizer task on `gpu` (GPU tasks) or on the host of `node`
// (host optimizer steps, bound by host DRAM bandwidth).
std::int64_t compute_duration_ns(const Task& task, const hw::GpuProfile& gpu, const hw::NodeProfile& node);

}  // namespace trainyard::sim
