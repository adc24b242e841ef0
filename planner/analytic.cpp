#include "planner/analytic.hpp"

#include "planner/search.hpp"

namespace trainyard::planner {

StepEstimate analytic_estimate(const StepInputs& in, const PlanSpec& spec, double hbm_headroom) {
  const Bounds b = lower_bounds(in, spec);
  StepEstimate e;
  e.step_s = b.step_s;
  e.hbm_bytes = b.hbm_bytes;
  e.dram_bytes = b.dram_bytes;
  const double flops = in.model.training_flops_per_token(in.workload.seq_len, true) * static_cast<double>(in.workload.tokens());
  e.mfu = flops / (e.step_s * in.cluster.node.gpu.peak_tflops(hw::Dtype::bf16) * 1e12 * in.cluster.gpus());
  e.fits = e.hbm_bytes <= usable_hbm_bytes(in.cluster, hbm_headroom) && e.dram_bytes <= in.cluster.node.host_dram_bytes.value;
  return e;
}

}  // namespace trainyard::planner
