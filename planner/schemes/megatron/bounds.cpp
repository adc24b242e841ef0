// Megatron's share of the search's lower bounds (planner/bounds.hpp).
#include <algorithm>

#include "planner/schemes/megatron/closed_form.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

SchemeBounds megatron_bounds(const BoundContext& ctx, const MegatronParams& p) {
  const auto& m = ctx.in.model;
  const double L = ctx.layers;
  SchemeBounds b;
  b.attention_recompute = p.recompute == Recompute::none ? 0 : 1;  // selective recompute: the core attention alone
  const LayerSplit split = megatron_layer_split(ctx.in, p);
  b.dense_s = L / p.pp * static_cast<double>(megatron_micro_batches(ctx.in, p)) * dense_layer_seconds(ctx.in, split, ctx.dense_recompute > 0);
  // Every rank keeps the full states of its shard of the model (the distributed optimizer splits the master
  // weights and moments dp ways); the ends of the model sit on the first and last stages.
  const double ends = p.pp == 1 ? ctx.resident_params : std::max(ctx.params.embedding, static_cast<double>(m.vocab * m.hidden));
  b.hbm_bytes = megatron_state_bytes_per_param(ctx.in.precision, p) * (ctx.layer_params * L / p.pp + ends) / p.tp;
  // Activations, at least: one layer's full set while its backward runs (recomputed or kept), and the kept
  // sets (checkpoints under full recompute, unless offloaded) of the stage's other layers for one micro-batch.
  // Without this, megatron at absurd lengths (--seq 1G) passed the bound and every candidate was simulated.
  const double full = layer_activation_bytes(m, split, Recompute::none).total();
  const double kept = p.offload_activations ? 0 : layer_activation_bytes(m, split, p.recompute).total();
  b.hbm_bytes += full + kept * (L / p.pp - 1);
  return b;
}

}  // namespace trainyard::planner
