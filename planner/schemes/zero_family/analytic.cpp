// The ZeRO family's analytic estimate (planner/analytic.hpp) and its graph's size (planner/estimate.hpp).
#include <algorithm>
#include <cmath>

#include "planner/analytic_parts.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/zero_family/closed_form.hpp"

namespace trainyard::planner {

namespace {

// The ZeRO family's model states' waits. Stage 3's gathers and the gradient reductions queue on the links beside
// the passes they overlap: a pass waits for what its layers' compute does not cover, and for the one layer's
// transfer nothing can cover (the first gather, the last reduction); a stack that does not overlap its reductions
// waits for all of them. Then the optimizer step (on the GPU, or on the host over host DRAM with the node's GPUs in
// turn).
double zero_state_waits(const BoundContext& ctx, const ZeroParams& z, const Rates& r, double mbs, double layer_s) {
  const StepInputs& in = ctx.in;
  const double n = z.whole_gpus(in.cluster.gpus());
  const double everyone = group_GBps(ctx, r, static_cast<int>(n), 1, true);
  const double gather = z.stage == 3 && n > 1 ? seconds(in.precision.weight_bytes * ctx.layer_params * (n - 1) / n, everyone) : 0;
  double reduce = 0;
  if (n > 1) {
    const double reduce_bytes_per_param = in.cluster.stack.gradient_reduce_bytes.value > 0 ? in.cluster.stack.gradient_reduce_bytes.value
                                                                                           : in.precision.grad_bytes;
    const double ring = z.stage == 0 ? 2 * (n - 1) / n : (n - 1) / n;  // all-reduce, or reduce-scatter
    reduce = seconds(reduce_bytes_per_param * ctx.layer_params * ring, everyone);
  }
  const double reducing_passes = z.stage >= 2 ? mbs : 1;  // stages 2-3 reduce every micro-batch, 0-1 after the last
  const auto queued = [&](double per_layer, double times) {
    return times * (std::max(0.0, ctx.layers * (per_layer - layer_s)) + std::min(per_layer, layer_s));
  };
  double exposed = queued(gather, mbs);  // forward
  if (in.cluster.stack.zero_overlap_comm.overlaps(z.stage)) {
    exposed += queued(gather + reduce, reducing_passes) + queued(gather, mbs - reducing_passes);  // backward
  } else {
    exposed += queued(gather, mbs) + reduce * ctx.layers * reducing_passes;
  }
  const double shard = z.stage >= 1 ? ctx.all_params / n : ctx.all_params;
  exposed += z.offload_optimizer ? seconds(shard * kAdamBytesPerParam * in.cluster.topology.gpus_per_node(), in.cluster.node.host_dram_GBps())
                                 : optimizer_seconds(in, shard);
  return exposed;
}

// FPDT's attention of one layer on one rank, ordered as LayerEmitter::fpdt_attention orders it: the compute
// stream's blocks (a diagonal block half a full one's work), the H2D and D2H copy engines each in order, two
// buffers for the blocks' inputs. The time beyond the blocks' own, forward and backward.
struct FpdtWaits {
  double forward = 0, backward = 0;
};
FpdtWaits fpdt_waits(const LayerAttention& attention, int u, const FpdtCopySizes& sizes, double GBps) {
  const double blocks = u * u / 2.0;  // u diagonal blocks of half a full one's work and u (u - 1) / 2 full ones
  const double kv = seconds(sizes.kv_bytes, GBps), pair_in = seconds(sizes.pair_in_bytes, GBps);
  const auto two_back = [](const std::vector<double>& ends) { return ends.size() >= 2 ? ends[ends.size() - 2] : 0.0; };
  FpdtWaits w;
  // Forward: every chunk's K/V go out at the start, in order; chunk i's queries attend to themselves, then to each
  // earlier chunk j, whose K/V come back once out and once the block two back has freed a buffer.
  double full = attention.forward / blocks, compute = 0, h2d = 0;
  for (int i = 0; i < u; ++i) {
    std::vector<double> ends{compute += full / 2};
    for (int j = 0; j < i; ++j) {
      h2d = std::max({h2d, (j + 1) * kv, two_back(ends)}) + kv;
      compute = std::max(compute, h2d) + full;
      ends.push_back(compute);
    }
  }
  w.forward = compute - attention.forward;
  // Backward: kv chunk i comes in after the previous block, then for each query chunk j >= i its inputs, once the
  // block two back has freed a buffer (dq goes out on the other engine, which no block waits for).
  full = attention.backward / blocks, compute = 0, h2d = 0;
  for (int i = u - 1; i >= 0; --i) {
    h2d = std::max(h2d, compute) + kv;
    std::vector<double> ends;
    for (int j = i; j < u; ++j) {
      h2d = std::max(h2d, two_back(ends)) + pair_in;
      compute = std::max(compute, h2d) + (j == i ? full / 2 : full);
      ends.push_back(compute);
    }
  }
  w.backward = compute - attention.backward;
  return w;
}

// The ZeRO family's waits: Ulysses' all-to-alls (on the compute stream's path), ring attention's K/V passes, FPDT's
// chunk copies and offloaded checkpoints beyond what the layer's compute covers, and the model states' (above).
double zero_exposed_s(const BoundContext& ctx, const ZeroParams& z, double dense_s) {
  const StepInputs& in = ctx.in;
  const model::ModelConfig& m = in.model;
  const Rates r = rates_of(in.cluster);
  const LayerSplit split = zero_layer_split(in, z);
  const auto mbs = static_cast<double>(zero_micro_batches(in, z));
  const bool recompute = ctx.dense_recompute > 0;
  const double passes = recompute ? 3 : 2;  // forward, backward, and the recomputed forward
  const auto tokens = static_cast<double>(split.local_tokens());
  const LayerAttention attention = layer_attention(ctx, ctx.layers, mbs);
  const double layer_s = dense_s / ctx.layers / mbs / passes + (attention.forward + attention.backward) / 2;  // one pass of one layer
  double exposed = 0;
  if (z.sp > 1) {
    const double bytes = 2 * tokens * static_cast<double>(2 * m.q_dim() + 2 * m.kv_dim()) * (z.sp - 1) / z.sp;
    exposed += seconds(bytes, group_GBps(ctx, r, z.sp)) * passes * ctx.layers * mbs;
  }
  exposed += ring_exposed_s(ctx, r, z.cp, z.sp, tokens * static_cast<double>(m.kv_dim()), ctx.layers, mbs, recompute);
  if (split.fpdt_chunks > 1) {
    const FpdtWaits w = fpdt_waits(attention, split.fpdt_chunks, fpdt_copy_sizes(m, split), r.pcie);
    exposed += (w.forward * (recompute ? 2 : 1) + w.backward) * ctx.layers * mbs;
  }
  if (z.offload_activations) {
    const double copy = seconds(zero_layer_bytes(in, z).checkpoint, r.pcie);
    const double waited = in.cluster.stack.checkpoint_offload.blocking ? copy : std::max(0.0, copy - layer_s);
    exposed += 2 * waited * ctx.layers * mbs;  // out after the forward, back before the backward
  }
  exposed += zero_state_waits(ctx, z, r, mbs, layer_s);
  return exposed;
}

// Attention tasks per rank and layer, forward and backward: plain, ring attention over cp ranks (a pass and a block
// per step), or FPDT over u chunks (a copy and a block per chunk pair; backward also streams dq back).
std::pair<double, double> attention_tasks(const ZeroParams& z, double seq) {
  if (z.cp > 1) return {2.0 * z.cp + 1, 2.0 * z.cp + 1};
  if (z.fpdt_chunk > 0) {
    const double u = std::max(1.0, seq / static_cast<double>(z.fpdt_chunk));
    if (u > 1) return {u * u + u + 1, 1.5 * u * u + 2.5 * u + 1};
  }
  return {1, 1};
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
  const LayerSplit split = zero_layer_split(in, z);
  const auto mbs = static_cast<double>(zero_micro_batches(in, z));
  const LossMemory loss = zero_loss_memory(in, z);
  e.dense_s = b.dense_s - ctx.head_s + mbs * ends_seconds(in, split.local_tokens(), in.model.vocab, loss);
  e.attention_recompute = b.attention_recompute;
  e.paced_s = b.paced_s;
  e.exposed_s = zero_exposed_s(ctx, z, b.dense_s - ctx.head_s);
  if (const auto extras = layer_extras(in, split, ctx.dense_recompute > 0)) {
    const double layer_visits = ctx.layers * mbs;
    e.attention_s = extras->attention_s * layer_visits;
    e.host_s = extras->issue_s * layer_visits;
  }
  const ZeroStateBytes states = zero_state_bytes(in, z);
  const ZeroLayerBytes layer = zero_layer_bytes(in, z);
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
  const double logits = logits_bytes(loss, static_cast<double>(split.local_tokens()), static_cast<double>(in.model.vocab));
  const double last_forward = kept - kept_last + layer.forward + (last_checkpointed ? layer.checkpoint : 0) + rotary_forward;
  const double at_loss = kept + logits;
  const double last_backward = kept + (last_checkpointed ? layer.recomputed : 0);
  e.hbm_bytes = resident + rotary + gathered + std::max({last_forward, at_loss, last_backward});
  e.dram_bytes = b.dram_bytes + layer.fpdt_host * in.cluster.topology.gpus_per_node();
  return e;
}

double zero_tasks(const StepInputs& in, const ZeroParams& z) {
  const double gpus = in.cluster.gpus(), layers = static_cast<double>(in.model.layers);
  const double seq = static_cast<double>(in.workload.seq_len), batch = static_cast<double>(in.workload.global_batch);
  const double group = std::max(1.0, static_cast<double>(z.sp) * z.cp);
  const double groups = std::max(1.0, gpus / group);
  const double micro_batches = std::max(1.0, batch / (groups * static_cast<double>(std::max<std::int64_t>(1, z.micro_batch))));
  const auto [attn_f, attn_b] = attention_tasks(z, seq);
  const double recomputed = static_cast<double>(z.checkpointed_layers(in.model.layers)) / layers;  // share of layers
  const double per_layer = kForwardTasks + attn_f + kBackwardTasks + attn_b + recomputed * (kForwardTasks + attn_f) + kLayerExtra;
  const double local_tokens = static_cast<double>(std::max<std::int64_t>(1, z.micro_batch)) * seq / group;
  return gpus * micro_batches * (layers * per_layer + loss_tasks(local_tokens) + 2) + gpus * (2 * layers + 4);
}

}  // namespace trainyard::planner
