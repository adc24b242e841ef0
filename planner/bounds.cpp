#include "planner/bounds.hpp"

#include <algorithm>
#include <cmath>

#include "planner/transformer.hpp"

namespace trainyard::planner {

BoundContext::BoundContext(const StepInputs& inputs, const PlanSpec& spec)
    : in(inputs),
      gpus(inputs.cluster.gpus()),
      seq_len(static_cast<double>(inputs.workload.seq_len)),
      tokens(static_cast<double>(inputs.workload.tokens())),
      layers(static_cast<double>(inputs.model.layers)),
      params(inputs.model.param_counts()),
      compute(inputs.cluster.node, inputs.cluster.stack) {
  const auto& m = in.model;
  layer_params = params.per_layer();
  resident_params = params.embedding + static_cast<double>(m.vocab * m.hidden) + params.final_norm;
  all_params = m.params();
  states_per_param = in.precision.master_bytes + in.precision.optimizer_bytes;
  peak_flops = in.cluster.node.gpu.peak_tflops(hw::Dtype::bf16) * 1e12;
  const double head_fwd = 2 * static_cast<double>(m.vocab * m.hidden) * tokens;
  head_s = head_fwd * 3 / (in.cluster.node.gpu.sustained.gemm.best() * peak_flops * gpus);
  dense_recompute = spec.recomputed_layer_share(m.layers);
}

double BoundContext::attention_s(double flops, bool backward) const {
  const auto head_dim = static_cast<double>(in.model.head_dim);
  return (backward ? 2.5 * flops : flops) / (peak_flops * compute.attention_best_fraction(backward, head_dim));
}

LayerCompute layer_compute(const StepInputs& in, const LayerSplit& split, bool recompute, bool attention) {
  sim::TaskGraph g;
  std::vector<sim::DeviceId> ranks;
  for (int r = 0; r < split.tp * split.ulysses * split.cp; ++r) ranks.push_back(r);
  LayerEmitter emitter(g, in.model, split, ranks);
  if (!attention) emitter.set_attention_hook([](const std::string&, bool, std::vector<sim::TaskId>&, bool) {});
  std::vector<sim::TaskId> last(ranks.size(), -1);
  emitter.forward("F", last);
  if (recompute) emitter.forward("R", last, true);
  emitter.backward("B", last);
  return gpu0_compute(in, g);
}

LayerCompute gpu0_compute(const StepInputs& in, const sim::TaskGraph& g) {
  LayerCompute out;
  const sim::ComputeModel compute(in.cluster.node, in.cluster.stack);
  for (const auto& t : g.tasks()) {
    if (t.device == 0 && t.stream.kind == sim::StreamKind::compute) {
      out.seconds += static_cast<double>(compute.duration_ns(t)) * 1e-9;
      out.kernels += compute.kernels(t);
    }
  }
  return out;
}

double BoundContext::best_attention_s(double recompute_share) const {
  const double fwd = in.model.attention_flops_per_token_fwd(in.workload.seq_len, true) * tokens / gpus;
  return attention_s(fwd, false) * (1 + recompute_share) + attention_s(fwd, true);
}

double dense_layer_seconds(const StepInputs& in, const LayerSplit& split, bool recompute) {
  return layer_compute(in, split, recompute, false).seconds;
}

}  // namespace trainyard::planner
