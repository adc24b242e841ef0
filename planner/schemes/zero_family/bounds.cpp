// The ZeRO family's share of the search's lower bounds (planner/bounds.hpp).
#include "planner/schemes/zero_family/closed_form.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

SchemeBounds zero_bounds(const BoundContext& ctx, const ZeroParams& z) {
  const auto& m = ctx.in.model;
  const double L = ctx.layers;
  SchemeBounds b;
  b.attention_recompute = ctx.dense_recompute;
  const LayerSplit split = zero_layer_split(ctx.in, z);
  b.dense_s = L * static_cast<double>(zero_micro_batches(ctx.in, z)) * dense_layer_seconds(ctx.in, split, ctx.dense_recompute > 0) + ctx.head_s;
  const ZeroStateBytes states = zero_state_bytes(ctx.in, z);
  const double full = split.fpdt_chunks > 1 ? fpdt_working_bytes(m, split) : layer_activation_bytes(m, split, Recompute::none).total();
  const double ckpt = layer_activation_bytes(m, split, Recompute::full).total();
  const auto checkpointed = static_cast<double>(z.checkpointed_layers(m.layers));
  const double acts = z.offload_activations ? 0 : ckpt * checkpointed + full * (L - checkpointed);
  b.hbm_bytes = (states.weights - states.host_weights) + (z.offload_grads ? 0 : states.grads) + (z.offload_optimizer ? 0 : states.optimizer) + acts;
  double host = 0;
  if (z.offload_params) host += states.host_weights;
  if (z.offload_grads) host += states.grads;
  if (z.offload_optimizer) host += states.optimizer;
  if (z.offload_activations) host += ckpt * L;
  b.dram_bytes = host * ctx.in.cluster.topology.gpus_per_node();
  return b;
}

}  // namespace trainyard::planner
