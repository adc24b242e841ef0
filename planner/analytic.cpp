#include "planner/analytic.hpp"

#include <algorithm>

#include "planner/megatron.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"
#include "planner/zero.hpp"

namespace trainyard::planner {

namespace {

// The loss's logits buffer one GPU holds at once: `tokens` of its share in chunks of the stack's (emit_loss).
double logits_bytes(const stacks::StackProfile& stack, double tokens, double vocab_shard, double chunk_tokens = 0) {
  LossMemory memory = loss_memory(stack);
  if (chunk_tokens > 0) memory.chunk_tokens = static_cast<std::int64_t>(chunk_tokens);
  const double chunk = memory.chunk_tokens > 0 ? std::min(tokens, static_cast<double>(memory.chunk_tokens)) : tokens;
  return chunk * vocab_shard * memory.bytes_per_logit;
}

// The busiest GPU's attention: every FLOP at the best efficiency the profile reaches, per GPU (forward, the share
// of layers whose attention runs again, backward), as the search's lower bound counts it.
double attention_seconds(const BoundContext& ctx, double recompute_share) {
  const double fwd = ctx.in.model.attention_flops_per_token_fwd(ctx.in.workload.seq_len, true) * ctx.tokens / ctx.gpus;
  return ctx.attention_s(fwd, false) * (1 + recompute_share) + ctx.attention_s(fwd, true);
}

}  // namespace

// ZeRO family: the HBM peak is the largest of three moments the builder's allocations pass through, over the
// resident states and the step's rotary tables: the last layer's forward (the others' kept activations, its own
// full set and, when checkpointed, its checkpoint), the loss (every layer's kept activations and the logits), and
// the last layer's backward (kept activations and, when checkpointed, its recomputed set). Stage 3 holds two
// gathered layers throughout.
SchemeEstimate zero_estimate(const BoundContext& ctx, const ZeroParams& z) {
  const StepInputs& in = ctx.in;
  const SchemeBounds b = zero_bounds(ctx, z);
  SchemeEstimate e;
  e.dense_s = b.dense_s;
  e.attention_recompute = b.attention_recompute;
  e.paced_s = b.paced_s;
  const ZeroStateBytes states = zero_state_bytes(in, z);
  const ZeroLayerBytes layer = zero_layer_bytes(in, z);
  const LayerSplit split = zero_layer_split(in, z);
  const double resident = (states.weights - states.host_weights) + (z.offload_grads ? 0 : states.grads) +
                          (z.offload_optimizer ? 0 : states.optimizer);
  const std::int64_t layers = in.model.layers;
  const double checkpointed = static_cast<double>(z.checkpointed_layers(layers));
  const double kept_checkpoint = z.offload_activations ? 0 : layer.checkpoint;
  const bool last_checkpointed = z.checkpoints_layer(layers - 1);
  const double kept_last = last_checkpointed ? kept_checkpoint : layer.forward;
  const double kept = kept_checkpoint * checkpointed + layer.forward * (ctx.layers - checkpointed);
  const double gathered = z.stage == 3 ? 2 * in.precision.weight_bytes * ctx.layer_params : 0;
  const auto& tables = in.cluster.stack.rotary_tables;
  const double table_elements = ctx.seq_len * static_cast<double>(in.model.head_dim);
  const double rotary = tables.step_bytes_per_token_dim.value * table_elements;
  const double rotary_forward = tables.forward_bytes_per_token_dim.value * table_elements;
  const auto tokens = static_cast<double>(split.local_tokens());
  const double loss_chunk = split.fpdt_chunks > 1 ? std::max(1.0, tokens / static_cast<double>(split.fpdt_chunks)) : 0;
  const double logits = logits_bytes(in.cluster.stack, tokens, static_cast<double>(in.model.vocab), loss_chunk);
  const double last_forward = kept - kept_last + layer.forward + (last_checkpointed ? layer.checkpoint : 0) + rotary_forward;
  const double at_loss = kept + logits;
  const double last_backward = kept + (last_checkpointed ? layer.recomputed : 0);
  e.hbm_bytes = resident + rotary + gathered + std::max({last_forward, at_loss, last_backward});
  e.dram_bytes = b.dram_bytes + layer.fpdt_host * in.cluster.topology.gpus_per_node();
  return e;
}

// Megatron: every stage's GPU keeps the activations of the micro-batches in flight under 1F1B (the first stage
// the most: pp of them, or the interleaved schedule's warm-up plus one) beside its states; the last stage also
// holds the loss's logits. The pipeline idles (pp - 1) / (vpp x micro-batches) of the busiest stage's time.
SchemeEstimate megatron_estimate(const BoundContext& ctx, const MegatronParams& p) {
  const StepInputs& in = ctx.in;
  const SchemeBounds b = megatron_bounds(ctx, p);
  SchemeEstimate e;
  e.dense_s = b.dense_s + ctx.head_s * p.pp;  // the LM head on the last stage's GPUs alone
  e.attention_recompute = b.attention_recompute;
  e.paced_s = b.paced_s;
  const auto mbs = static_cast<double>(megatron_micro_batches(in, p));
  e.bubble_fraction = static_cast<double>(p.pp - 1) / (static_cast<double>(p.vpp) * mbs);
  const LayerSplit split = megatron_layer_split(in, p);
  const double kept_per_layer = layer_activation_bytes(in.model, split, p.recompute).total();
  const double working = p.recompute == Recompute::full ? layer_activation_bytes(in.model, split, Recompute::none).total() : 0;
  const std::vector<std::int64_t> stage_layers = megatron_stage_layers(in.model.layers, p);
  const model::ParamCounts counts = in.model.param_counts();
  const double states_per_param = megatron_state_bytes_per_param(in.precision, p);
  const double layer_params = counts.per_layer() / p.tp;
  const double total_chunks = mbs * p.vpp;
  double hbm = 0, offloaded = 0;
  for (int stage = 0; stage < p.pp; ++stage) {
    double params = layer_params * static_cast<double>(stage_layers[static_cast<std::size_t>(stage)]);
    if (stage == 0) params += counts.embedding / p.tp;
    const bool last = stage == p.pp - 1;
    if (last) params += static_cast<double>(in.model.vocab * in.model.hidden) / p.tp + counts.final_norm;
    const double in_flight = p.vpp == 1 ? std::min<double>(p.pp - stage, mbs)
                                        : std::min<double>(2.0 * (p.pp - stage - 1) + (p.vpp - 1.0) * p.pp + 1, total_chunks);
    const double chunk_layers = static_cast<double>(stage_layers[static_cast<std::size_t>(stage)]) / p.vpp;
    const double acts = in_flight * chunk_layers * kept_per_layer;
    const double logits = last ? logits_bytes(in.cluster.stack, static_cast<double>(split.local_tokens()),
                                              static_cast<double>((in.model.vocab + p.tp - 1) / p.tp))
                               : 0;
    hbm = std::max(hbm, params * states_per_param + (p.offload_activations ? 0 : acts) + working + logits);
    offloaded = std::max(offloaded, p.offload_activations ? acts : 0);
  }
  e.hbm_bytes = hbm;
  e.dram_bytes = offloaded * in.cluster.topology.gpus_per_node();
  return e;
}

SchemeEstimate ringtrack_estimate(const BoundContext& ctx, const RingTrackParams& p) {
  const SchemeBounds b = ringtrack_bounds(ctx, p);
  SchemeEstimate e;
  e.dense_s = b.dense_s;
  e.attention_recompute = b.attention_recompute;
  e.exposed_s = b.serial_copy_s;
  e.paced_s = b.paced_s;
  e.hbm_bytes = b.hbm_bytes;
  e.dram_bytes = b.dram_bytes;
  return e;
}

StepEstimate analytic_estimate(const StepInputs& in, const PlanSpec& spec, double hbm_headroom) {
  const BoundContext ctx(in, spec);
  const SchemeEstimate own = scheme_named(spec.scheme).analytic(ctx, spec);
  const double compute_s = own.dense_s + attention_seconds(ctx, own.attention_recompute);
  StepEstimate e;
  e.step_s = std::max(compute_s * (1 + own.bubble_fraction) + own.exposed_s, own.paced_s);
  e.hbm_bytes = own.hbm_bytes;
  e.dram_bytes = own.dram_bytes;
  const double flops = in.model.training_flops_per_token(in.workload.seq_len, true) * ctx.tokens;
  e.mfu = flops / (e.step_s * ctx.peak_flops * ctx.gpus);
  e.fits = e.hbm_bytes <= usable_hbm_bytes(in.cluster, hbm_headroom) && e.dram_bytes <= in.cluster.node.host_dram_bytes.value;
  return e;
}

}  // namespace trainyard::planner
