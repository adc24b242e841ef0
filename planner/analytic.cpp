#include "planner/analytic.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include "common/memory_budget.hpp"
#include "common/thread_pool.hpp"
#include "planner/estimate.hpp"
#include "planner/megatron.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"
#include "planner/zero.hpp"

namespace trainyard::planner {

namespace {

// The loss's logits buffer one GPU holds at once: `tokens` of its share in `memory`'s chunks (emit_loss).
double logits_bytes(const LossMemory& memory, double tokens, double vocab_shard) {
  const double chunk = memory.chunk_tokens > 0 ? std::min(tokens, static_cast<double>(memory.chunk_tokens)) : tokens;
  return chunk * vocab_shard * memory.bytes_per_logit;
}

// Per-GPU rates the estimate moves bytes at, GB/s per direction: within a node (NVLink at the rate NCCL reaches,
// else PCIe), across nodes (the node's NICs shared by its GPUs, never above the in-node rate), and to and from
// host DRAM (the GPU's pinned-copy rate, shared by the GPUs behind one PCIe switch).
struct Rates {
  double intra = 0, inter = 0, pcie = 0, nic = 0;
};
Rates rates_of(const sim::Cluster& cluster) {
  const hw::NodeProfile& node = cluster.node;
  const auto& sustained = node.gpu.sustained;
  Rates r;
  r.pcie = std::min(sustained.pcie_h2d_GBps.value, sustained.pcie_d2h_GBps.value);
  const int switches = node.count(hw::VertexType::pcie_switch);
  if (switches > 0) r.pcie /= std::max(1.0, static_cast<double>(node.gpu_count()) / switches);
  r.intra = sustained.nvlink_GBps_per_direction.value > 0 ? sustained.nvlink_GBps_per_direction.value : r.pcie;
  r.nic = node.nic_GBps_per_gpu();
  r.inter = r.nic > 0 ? std::min(r.intra, r.nic) : r.intra;
  return r;
}
// A group of `size` consecutive GPUs (every `stride`-th) is within one node unless it is longer than a node. Across
// nodes, a GPU's own transfers (all-to-all, ring passes) cross at its NIC's rate; a ring collective (all-gather,
// reduce-scatter, all-reduce) enters each node once and runs one channel per NIC, so its members on a node share
// their NICs (nccl-tests' multi-node busbw: about the node's NIC total, up to NVLink's rate).
double group_GBps(const BoundContext& ctx, const Rates& r, int size, int stride = 1, bool ring_collective = false) {
  const int per_node = ctx.in.cluster.topology.gpus_per_node();
  if (ctx.in.cluster.nodes <= 1 || size * stride <= per_node) return r.intra;
  if (!ring_collective || r.nic <= 0) return r.inter;
  const double members_per_node = std::max(1, per_node / stride);
  return std::min(r.intra, r.nic * members_per_node);
}
double seconds(double bytes, double GBps) { return GBps > 0 ? bytes / (GBps * 1e9) : 0; }

// The optimizer step over `params` on GPU 0, timed as the simulator times the builders' OptimizerStep task.
double optimizer_seconds(const StepInputs& in, double params) {
  const sim::Task step(0, {sim::StreamKind::compute, 0}, false, sim::OptimizerStep{static_cast<std::int64_t>(params * kAdamBytesPerParam)});
  return static_cast<double>(sim::ComputeModel(in.cluster.node, in.cluster.stack).duration_ns(step)) * 1e-9;
}

// One layer's attention time on one GPU, per micro-batch: forward (or a recomputed forward) and backward.
struct LayerAttention {
  double forward = 0, backward = 0;
};
LayerAttention layer_attention(const BoundContext& ctx, double layers, double micro_batches) {
  const double fwd = ctx.in.model.attention_flops_per_token_fwd(ctx.in.workload.seq_len, true) * ctx.tokens / ctx.gpus / layers / micro_batches;
  return {ctx.attention_s(fwd, false), ctx.attention_s(fwd, true)};
}

// Context parallelism's K/V ring beside the attention blocks it feeds: each of the cp - 1 passes of a layer's
// forward moves a rank's K and V, backward also their fp32 gradients; what the attention does not cover waits.
double ring_exposed_s(const BoundContext& ctx, const Rates& r, int cp, int stride, double kv_elements, double layers, double micro_batches,
                      bool recompute) {
  if (cp <= 1) return 0;
  const double GBps = group_GBps(ctx, r, cp, stride);
  const LayerAttention attention = layer_attention(ctx, layers, micro_batches);
  const double forward = seconds((cp - 1) * 2 * kv_elements * 2, GBps),
               backward = seconds((cp - 1) * (2 * kv_elements * 2 + 2 * kv_elements * 4), GBps);
  const double per_layer = std::max(0.0, forward - attention.forward) * (recompute ? 2 : 1) + std::max(0.0, backward - attention.backward);
  return per_layer * layers * micro_batches;
}

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

// Megatron's waits on the busiest stage: TP's collectives (on the compute stream's path unless they overlap their
// GEMMs), CP's K/V exchange beyond the attention it feeds (the ring's passes; all-gather and all-to-all exchanges
// wait whole), offloaded checkpoints, the data-parallel gradient reduction beyond the last micro-batch's backward,
// the optimizer step, and the distributed optimizer's all-gather of the updated weights.
double megatron_exposed_s(const BoundContext& ctx, const MegatronParams& p, double stage_layers, double stage_params, double dense_s) {
  const StepInputs& in = ctx.in;
  const model::ModelConfig& m = in.model;
  const Rates r = rates_of(in.cluster);
  const LayerSplit split = megatron_layer_split(in, p);
  const auto mbs = static_cast<double>(megatron_micro_batches(in, p));
  const bool recompute = p.recompute == Recompute::full;
  const double passes = recompute ? 3 : 2;
  const double layer_s = dense_s / stage_layers / mbs / passes;  // one pass of one layer's dense ops
  double exposed = 0;
  if (p.tp > 1 && !p.tp_comm_overlap)
    exposed += seconds(tp_bytes_per_layer_forward(m, split), group_GBps(ctx, r, p.tp, 1, true)) * passes * stage_layers * mbs;
  const double kv_elements = static_cast<double>(split.local_tokens()) *
                             static_cast<double>(std::max<std::int64_t>(1, m.kv_heads / p.tp) * m.head_dim);
  if (p.cp_comm == CpComm::p2p) {
    exposed += ring_exposed_s(ctx, r, p.cp, p.tp, kv_elements, stage_layers, mbs, p.recompute != Recompute::none);
  } else if (p.cp > 1) {
    const double exchange = seconds((p.cp - 1) * 2 * kv_elements * 2, group_GBps(ctx, r, p.cp, p.tp));
    exposed += exchange * (passes + 1) * stage_layers * mbs;  // backward also returns dK, dV
  }
  if (p.offload_activations) {
    const double copy = seconds(layer_activation_bytes(m, split, p.recompute).total(), r.pcie);
    const double waited = in.cluster.stack.checkpoint_offload.blocking ? copy : std::max(0.0, copy - layer_s);
    exposed += 2 * waited * stage_layers * mbs;
  }
  const int dp = p.whole_dp() * p.whole_cp();
  const double dp_GBps = group_GBps(ctx, r, dp, p.tp * p.pp, true);
  if (dp > 1) {
    const double ring = p.distributed_optimizer ? static_cast<double>(dp - 1) / dp : 2.0 * (dp - 1) / dp;
    const double reduce = seconds(in.precision.grad_bytes * stage_params * ring, dp_GBps);
    exposed += std::max(0.0, reduce - dense_s / mbs * 2 / passes);  // beside the last micro-batch's backward
    if (p.distributed_optimizer) exposed += seconds(in.precision.weight_bytes * stage_params * (dp - 1) / dp, dp_GBps);
  }
  exposed += optimizer_seconds(in, p.distributed_optimizer ? stage_params / dp : stage_params);
  return exposed;
}

// The embedding's forward and backward, and the LM head with the loss, for one micro-batch of `tokens` on GPU 0
// over a vocabulary shard: their tasks as the builders emit them (emit_embedding, emit_loss), timed by the cost
// model. Not at the best GEMM rate, as the search's bound takes them: for a 1B model with a 128K vocabulary the
// head is a fifth of the FLOPs.
double embedding_seconds(const StepInputs& in, std::int64_t tokens) {
  sim::TaskGraph g;
  const sim::TaskId at = emit_embedding(g, 0, "est", tokens, in.model.hidden, false, -1, {});
  emit_embedding(g, 0, "est", tokens, in.model.hidden, true, at, {});
  return gpu0_compute(in, g).seconds;
}

double head_seconds(const StepInputs& in, std::int64_t tokens, std::int64_t vocab_shard, const LossMemory& memory) {
  sim::TaskGraph g;
  emit_loss(g, 0, "est", tokens, in.model.hidden, vocab_shard, -1, {}, memory);
  return gpu0_compute(in, g).seconds;
}

double ends_seconds(const StepInputs& in, std::int64_t tokens, std::int64_t vocab_shard, const LossMemory& memory) {
  return embedding_seconds(in, tokens) + head_seconds(in, tokens, vocab_shard, memory);
}

// One layer on GPU 0, one micro-batch (forward, the recomputed forward when `recompute`, backward): its attention's
// time, and the host's time to issue all its kernels.
struct LayerExtras {
  double attention_s = 0, issue_s = 0;
};
// A layer's attention is emitted only up to this many blocks a side (FPDT's chunks, CP's ranks: the blocks grow
// as their square); beyond, the estimate takes every attention FLOP at the profile's best rate, as the bound does,
// so that no length makes it slow or large.
constexpr int kMostEmittedBlocks = 64;

// nullopt: too many blocks to emit (kMostEmittedBlocks).
std::optional<LayerExtras> layer_extras(const StepInputs& in, const LayerSplit& split, bool recompute) {
  if (split.fpdt_chunks > kMostEmittedBlocks || split.cp > kMostEmittedBlocks) return std::nullopt;
  const LayerCompute whole = layer_compute(in, split, recompute, true);
  return LayerExtras{whole.seconds - dense_layer_seconds(in, split, recompute),
                     whole.kernels * in.cluster.stack.host.dispatch_us_per_kernel.value * 1e-6};
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

// The fullest node's host DRAM: the builder numbers GPUs stage by stage (dp x cp x tp of them each), so a node
// holds the GPUs of one stage, or of several consecutive ones.
double megatron_node_dram_bytes(const StepInputs& in, const MegatronParams& p, const std::vector<double>& per_stage_gpu_bytes) {
  const int per_node = in.cluster.topology.gpus_per_node(), stage_gpus = p.dp * p.cp * p.tp;
  double most = 0;
  for (int first = 0; first < in.cluster.gpus(); first += per_node) {
    double node = 0;
    for (int gpu = first; gpu < first + per_node && gpu < in.cluster.gpus(); ++gpu)
      node += per_stage_gpu_bytes[static_cast<std::size_t>(gpu / stage_gpus)];
    most = std::max(most, node);
  }
  return most;
}

// Megatron: one micro-batch on each pipeline stage takes its layers, the embedding on the first stage, the LM head
// and the loss on the last (with one stage, both). 1F1B runs the busiest stage's micro-batches back to back and
// every other stage's once around them (the fill and the drain, divided by vpp when interleaved). Every stage's GPU
// keeps the activations of the micro-batches in flight (the first stage the most: pp of them, or the interleaved
// schedule's warm-up plus one) beside its states; the last stage also holds the loss's logits.
SchemeEstimate megatron_estimate(const BoundContext& ctx, const MegatronParams& p) {
  const StepInputs& in = ctx.in;
  const SchemeBounds b = megatron_bounds(ctx, p);
  SchemeEstimate e;
  const LayerSplit split = megatron_layer_split(in, p);
  const auto mbs = static_cast<double>(megatron_micro_batches(in, p));
  const std::int64_t vocab_shard = (in.model.vocab + p.tp - 1) / p.tp;
  const double layer_dense_s = dense_layer_seconds(in, split, ctx.dense_recompute > 0);
  const std::optional<LayerExtras> extras = layer_extras(in, split, ctx.dense_recompute > 0);
  const double embedding_s = embedding_seconds(in, split.local_tokens());
  const LossMemory loss = loss_memory(in.cluster.stack);
  const double head_s = head_seconds(in, split.local_tokens(), vocab_shard, loss);
  const std::vector<std::int64_t> stage_layers = megatron_stage_layers(in.model.layers, p);
  const auto stage_dense_s = [&](std::size_t s) {
    return static_cast<double>(stage_layers[s]) * layer_dense_s + (s == 0 ? embedding_s : 0) + (s + 1 == stage_layers.size() ? head_s : 0);
  };
  std::size_t busiest = 0;
  double all_stages_s = 0, busiest_s = 0;
  for (std::size_t s = 0; s < stage_layers.size(); ++s) {
    const double stage_s = stage_dense_s(s) + static_cast<double>(stage_layers[s]) * (extras ? extras->attention_s : 0);
    all_stages_s += stage_s;
    if (stage_s > busiest_s) {
      busiest_s = stage_s;
      busiest = s;
    }
  }
  const auto busiest_stage_layers = static_cast<double>(stage_layers[busiest]);
  e.dense_s = mbs * stage_dense_s(busiest);
  e.attention_recompute = b.attention_recompute;
  e.paced_s = b.paced_s;
  e.bubble_fraction = busiest_s > 0 ? (all_stages_s - busiest_s) / (static_cast<double>(p.vpp) * mbs * busiest_s) : 0;
  if (extras) {
    e.attention_s = extras->attention_s * busiest_stage_layers * mbs;
    e.host_s = extras->issue_s * busiest_stage_layers * mbs;
  }
  const model::ParamCounts counts = in.model.param_counts();
  const double layer_params = counts.per_layer() / p.tp;
  const double busiest_stage_params = layer_params * busiest_stage_layers + static_cast<double>(in.model.vocab * in.model.hidden) / p.tp;
  e.exposed_s = megatron_exposed_s(ctx, p, busiest_stage_layers, busiest_stage_params, mbs * busiest_stage_layers * layer_dense_s);
  const double kept_per_layer = layer_activation_bytes(in.model, split, p.recompute).total();
  const double working = p.recompute == Recompute::full ? layer_activation_bytes(in.model, split, Recompute::none).total() : 0;
  const double states_per_param = megatron_state_bytes_per_param(in.precision, p);
  const double total_chunks = mbs * p.vpp;
  double hbm = 0;
  std::vector<double> offloaded(static_cast<std::size_t>(p.pp), 0);  // per GPU of each stage
  for (int stage = 0; stage < p.pp; ++stage) {
    double params = layer_params * static_cast<double>(stage_layers[static_cast<std::size_t>(stage)]);
    if (stage == 0) params += counts.embedding / p.tp;
    const bool last = stage == p.pp - 1;
    if (last) params += static_cast<double>(in.model.vocab * in.model.hidden) / p.tp + counts.final_norm;
    const double in_flight = p.vpp == 1 ? std::min<double>(p.pp - stage, mbs)
                                        : std::min<double>(2.0 * (p.pp - stage - 1) + (p.vpp - 1.0) * p.pp + 1, total_chunks);
    const double chunk_layers = static_cast<double>(stage_layers[static_cast<std::size_t>(stage)]) / p.vpp;
    const double acts = in_flight * chunk_layers * kept_per_layer;
    const double logits = last ? logits_bytes(loss, static_cast<double>(split.local_tokens()), static_cast<double>(vocab_shard)) : 0;
    hbm = std::max(hbm, params * states_per_param + (p.offload_activations ? 0 : acts) + working + logits);
    offloaded[static_cast<std::size_t>(stage)] = p.offload_activations ? acts : 0;
  }
  e.hbm_bytes = hbm;
  e.dram_bytes = megatron_node_dram_bytes(in, p, offloaded);
  return e;
}

// --- ring-track ------------------------------------------------------------------------------------------------

namespace {

// A GPU's copy rates to and from host DRAM, GB/s, while the other GPUs behind its PCIe switch copy too (ring-track's
// GPUs run the same visits one visit apart, so their copies overlap): its sustained pinned-copy rates, capped by an
// even share of its switch's uplink and of its socket's DRAM link (which reads and writes share). The slowest GPU's.
// The simulator shares the same links between the flows (a GPU alone on its switch copies faster: this is the rate
// of the busy stretches, where the copies pace the step).
struct HostCopyRates {
  double h2d = 0, d2h = 0;
};
HostCopyRates shared_host_rates(const hw::NodeProfile& node) {
  const auto& sustained = node.gpu.sustained;
  const auto is = [&](const std::string& id, hw::VertexType type) {
    const hw::VertexSpec* v = node.find_vertex(id);
    return v != nullptr && v->type == type;
  };
  std::map<std::string, std::string> parent;  // a GPU's switch (or root complex), a switch's root complex
  std::map<std::string, double> uplink_GBps, dram_GBps;
  for (const hw::LinkSpec& l : node.links) {
    for (const auto& [child, up] : {std::pair{l.a, l.b}, std::pair{l.b, l.a}}) {
      const bool gpu_up = is(child, hw::VertexType::gpu) && (is(up, hw::VertexType::pcie_switch) || is(up, hw::VertexType::root_complex));
      if (l.type == hw::LinkType::pcie && (gpu_up || (is(child, hw::VertexType::pcie_switch) && is(up, hw::VertexType::root_complex)))) {
        parent[child] = up;
        uplink_GBps[child] = l.GBps_per_direction;
      }
      if (l.type == hw::LinkType::dram && is(child, hw::VertexType::root_complex)) dram_GBps[child] = l.GBps_per_direction;
    }
  }
  std::map<std::string, int> behind;  // GPUs behind each switch and root complex
  for (const auto& [child, up] : parent) {
    if (!is(child, hw::VertexType::gpu)) continue;
    ++behind[up];
    if (parent.count(up)) ++behind[parent[up]];
  }
  double share = std::numeric_limits<double>::infinity();
  for (const auto& [child, up] : parent) {
    if (!is(child, hw::VertexType::gpu)) continue;
    const bool switched = is(up, hw::VertexType::pcie_switch);
    const std::string root = switched && parent.count(up) ? parent[up] : up;
    const std::string& link = switched ? up : child;  // the link its copies share with the GPUs behind it
    if (uplink_GBps.count(link) && uplink_GBps[link] > 0) share = std::min(share, uplink_GBps[link] / (switched ? behind[up] : 1));
    if (dram_GBps.count(root)) share = std::min(share, dram_GBps[root] / (2.0 * behind[root]));
  }
  return {std::min(sustained.pcie_h2d_GBps.value, share), std::min(sustained.pcie_d2h_GBps.value, share)};
}

// One visit of a layer by one chunk on its GPU: its compute stream's time (the waits for streamed K/V included), the
// part of it that is compute, the bytes its copies move each way, and its pace when the GPU is never idle: then what
// the visit brings in (activations, K/V, weights, allocated a visit ahead) has only the visit's time to come in.
struct RingVisit {
  double time_s = 0, dense_s = 0, attention_s = 0, h2d_bytes = 0, d2h_bytes = 0, paced_s = 0;
};

// Ring-track's visits, as the builder emits them (RingTrackBuilder::forward_visit, backward_visit), timed by the
// simulator's cost model; the K/V blocks streamed from DRAM pace the attention through `prefetch` buffers.
class RingVisits {
 public:
  RingVisits(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r);
  RingVisit forward(int k) const;
  RingVisit backward(int k) const;
  const HostCopyRates& rates() const { return rates_; }

 private:
  double attention_call_s(std::int64_t kv_len, bool causal, bool backward) const;
  double task_s(const sim::TaskParams& params) const;
  // The blocks of chunks 0..k-1 streamed through the prefetch buffers after the diagonal block, `ready_s` after
  // the visit began (what its compute before them covers): the compute stream's time from the diagonal block on.
  double streamed_s(int k, bool backward, double ready_s, RingVisit& v) const;

  const StepInputs& in_;
  const RingTrackParams& p_;
  sim::ComputeModel compute_;
  HostCopyRates rates_;
  int chunk_count_ = 0, span_ = 1;
  double kv_chunk_ = 0, acc_chunk_ = 0, kept_ = 0, checkpoint_ = 0, weights_ = 0, grads_ = 0;
  double dense_fwd_s_ = 0, dense_bwd_s_ = 0, recompute_s_ = 0;
  double before_attention_ = 0;                         // the share of a layer's dense FLOPs before its attention (norm, QKV, RoPE)
  double full_block_fwd_s_ = 0, full_block_bwd_s_ = 0;  // attention of a chunk against a whole streamed block
};

RingVisits::RingVisits(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r)
    : in_(ctx.in), p_(p), compute_(ctx.in.cluster.node, ctx.in.cluster.stack), rates_(shared_host_rates(ctx.in.cluster.node)) {
  const model::ModelConfig& m = in_.model;
  chunk_count_ = static_cast<int>(r.chunk_count);
  span_ = static_cast<int>(std::max<std::int64_t>(1, (p.kv_block_tokens + p.chunk - 1) / p.chunk));
  kv_chunk_ = r.kv_token * r.chunk_tokens;
  acc_chunk_ = r.acc_chunk;
  kept_ = r.kept_token * r.chunk_tokens;
  checkpoint_ = r.ckpt_token * r.chunk_tokens;
  weights_ = in_.precision.weight_bytes * ctx.layer_params;
  grads_ = in_.precision.grad_bytes * ctx.layer_params;
  LayerSplit split;
  split.sequence_tokens = p.chunk;
  const double both = dense_layer_seconds(in_, split, false);
  dense_fwd_s_ = dense_layer_seconds(in_, split, true) - both;
  dense_bwd_s_ = both - dense_fwd_s_;
  recompute_s_ = p.acts == ActivationPolicy::recompute ? dense_fwd_s_ : 0;
  before_attention_ = static_cast<double>(m.hidden * (m.q_dim() + 2 * m.kv_dim())) / ctx.layer_params;
  full_block_fwd_s_ = attention_call_s(p.chunk * span_, false, false);
  full_block_bwd_s_ = attention_call_s(p.chunk * span_, false, true);
}

double RingVisits::task_s(const sim::TaskParams& params) const {
  return static_cast<double>(compute_.duration_ns(sim::Task(0, {sim::StreamKind::compute, 0}, false, params))) * 1e-9;
}

double RingVisits::attention_call_s(std::int64_t kv_len, bool causal, bool backward) const {
  const model::ModelConfig& m = in_.model;
  return task_s(sim::Attention{p_.chunk, kv_len, static_cast<std::int32_t>(m.heads), static_cast<std::int32_t>(m.kv_heads),
                               static_cast<std::int32_t>(m.head_dim), causal, backward});
}

// Block j's copies in (K/V, and backward the dK/dV accumulators but for the last chunk's) wait for its buffer,
// which is free once block j - prefetch is computed and (backward) its dK/dV copied out: per block the copy
// engines and the attention take turns, max(A, R, W, (A + R + W) / prefetch). The first block's copy began with
// the visit, `ready_s` before its diagonal block ended.
double RingVisits::streamed_s(int k, bool backward, double ready_s, RingVisit& v) const {
  const bool accumulated = backward && k < chunk_count_ - 1;  // the last chunk writes the accumulators first
  double time_s = 0;
  // The blocks are alike but the last (fewer chunks): one timing per size, `count` of them.
  const auto add = [&](int chunks, double count, bool first) {
    const double attention_s = chunks == span_ ? (backward ? full_block_bwd_s_ : full_block_fwd_s_)
                                               : attention_call_s(p_.chunk * chunks, false, backward);
    const double in_bytes = chunks * (kv_chunk_ + (accumulated ? acc_chunk_ : 0)), out_bytes = backward ? chunks * acc_chunk_ : 0;
    const double in_s = seconds(in_bytes, rates_.h2d), out_s = seconds(out_bytes, rates_.d2h);
    v.attention_s += count * attention_s;
    v.h2d_bytes += count * in_bytes;
    v.d2h_bytes += count * out_bytes;
    time_s += count * (first ? std::max(0.0, in_s - ready_s) + attention_s
                             : std::max({attention_s, in_s, out_s, (attention_s + in_s + out_s) / p_.prefetch}));
  };
  const int full = k / span_, rest = k % span_;
  add(full > 0 ? span_ : rest, 1, true);
  if (full > 1) add(span_, full - 1, false);
  if (full > 0 && rest > 0) add(rest, 1, false);
  return time_s;
}

RingVisit RingVisits::forward(int k) const {
  RingVisit v;
  v.dense_s = dense_fwd_s_;
  const double diagonal_s = attention_call_s(p_.chunk, true, false);
  v.attention_s = diagonal_s;
  double time_s = dense_fwd_s_ + diagonal_s;
  if (k > 0) {
    const double q_bytes = 2.0 * static_cast<double>(p_.chunk * in_.model.q_dim());
    v.dense_s += task_s(sim::Elementwise{static_cast<std::int64_t>(2 * q_bytes), static_cast<std::int64_t>(q_bytes)});  // the merge
    if (p_.kv == Placement::hbm) {
      v.attention_s += attention_call_s(p_.chunk * k, false, false);
      time_s = v.dense_s + v.attention_s;
    } else {
      time_s = v.dense_s + diagonal_s + streamed_s(k, false, dense_fwd_s_ * before_attention_ + diagonal_s, v);
    }
  }
  if (p_.kv == Placement::dram) v.d2h_bytes += kv_chunk_;
  if (p_.acts != ActivationPolicy::hbm) v.d2h_bytes += p_.acts == ActivationPolicy::recompute ? checkpoint_ : kept_;
  if (p_.weights == WeightPolicy::stream) v.h2d_bytes += weights_;
  v.time_s = time_s;
  v.paced_s = std::max(time_s, seconds(v.h2d_bytes, rates_.h2d));
  return v;
}

RingVisit RingVisits::backward(int k) const {
  RingVisit v;
  v.dense_s = dense_bwd_s_ + recompute_s_;
  const double diagonal_s = attention_call_s(p_.chunk, true, true);
  v.attention_s = diagonal_s;
  double time_s = v.dense_s + diagonal_s;
  if (p_.acts != ActivationPolicy::hbm) v.h2d_bytes += p_.acts == ActivationPolicy::recompute ? checkpoint_ : kept_;
  if (p_.kv == Placement::dram && p_.acts != ActivationPolicy::recompute) v.h2d_bytes += kv_chunk_;
  if (p_.weights == WeightPolicy::stream) {
    v.h2d_bytes += weights_;
    v.d2h_bytes += grads_;
  }
  if (k > 0 && p_.kv == Placement::hbm) {
    v.attention_s += attention_call_s(p_.chunk * k, false, true);
    time_s = v.dense_s + v.attention_s;
  } else if (k > 0) {
    const double own_in = k < chunk_count_ - 1 ? acc_chunk_ : 0;  // this chunk's dK/dV, accumulated by the later chunks
    v.h2d_bytes += own_in;
    const double ready_s = recompute_s_ + dense_bwd_s_ * (1 - before_attention_) + diagonal_s - seconds(own_in, rates_.h2d);
    time_s += streamed_s(k, true, ready_s, v);
  }
  v.time_s = time_s;
  v.paced_s = std::max(time_s, seconds(v.h2d_bytes, rates_.h2d));
  return v;
}

void add_visit(RingVisit& sum, const RingVisit& v) {
  sum.time_s += v.time_s;
  sum.dense_s += v.dense_s;
  sum.attention_s += v.attention_s;
  sum.h2d_bytes += v.h2d_bytes;
  sum.d2h_bytes += v.d2h_bytes;
  sum.paced_s += v.paced_s;
}

// One layer's visits over the chunks of a sequence, summed; the last chunk's (every stage deeper than a GPU's
// deepest runs it between that GPU's forward and its backward) and the first's (the train's fill and drain).
struct RingLayer {
  RingVisit forward, backward;
  double last_forward_s = 0, last_backward_s = 0, first_forward_s = 0, first_backward_s = 0;
  HostCopyRates rates;  // the rates its copies move at
};
RingLayer ring_layer(const RingVisits& visits, int chunks) {
  RingLayer out;
  out.rates = visits.rates();
  for (int k = 0; k < chunks; ++k) {
    const RingVisit f = visits.forward(k), b = visits.backward(k);
    add_visit(out.forward, f);
    add_visit(out.backward, b);
    if (k == 0) out.first_forward_s = f.time_s, out.first_backward_s = b.time_s;
    if (k == chunks - 1) out.last_forward_s = f.time_s, out.last_backward_s = b.time_s;
  }
  return out;
}

// Per chunk on GPU 0: the embedding's forward and backward (ring position 0) and the LM head with the loss (the
// head's stop), as the builder emits them (emit_embedding, emit_loss with its default logits chunks).
struct RingEnds {
  double embedding_forward_s = 0, embedding_backward_s = 0, loss_s = 0;
};
RingEnds ring_ends(const StepInputs& in, std::int64_t chunk) {
  sim::TaskGraph forward, backward, loss;
  emit_embedding(forward, 0, "est", chunk, in.model.hidden, false, -1, {});
  emit_embedding(backward, 0, "est", chunk, in.model.hidden, true, -1, {});
  emit_loss(loss, 0, "est", chunk, in.model.hidden, in.model.vocab, -1, {});
  return {gpu0_compute(in, forward).seconds, gpu0_compute(in, backward).seconds, gpu0_compute(in, loss).seconds};
}

// The first and the deepest layer a ring position holds (first = layers, deepest = -1: none).
std::pair<int, int> layer_range(const RingSizes& r, int layers, int pos) {
  int first = layers, deepest = -1;
  for (int l = 0; l < layers; ++l) {
    if (r.positions[l] != pos) continue;
    first = std::min(first, l);
    deepest = l;
  }
  return {first, deepest};
}

// One ring position's train through a step: its compute and how long until its last visit ends.
struct RingPosition {
  double train_s = 0, dense_s = 0, attention_s = 0;
};
// Per sequence a position runs its forward visits, waits at the turn while the last chunk goes through the deeper
// stages and back, and runs its backward visits; the copies out (activations, dK/dV, streamed gradients) pace it
// when they take longer. Chunk 0 reaches its first layer after the shallower stages (fill) and leaves it to them
// at the end (drain).
RingPosition ring_position(const BoundContext& ctx, const RingSizes& r, const RingLayer& layer, const RingEnds& ends, int pos) {
  const HostCopyRates& rates = layer.rates;
  const int L = static_cast<int>(ctx.in.model.layers), head = r.positions.back();
  const auto [first, deepest] = layer_range(r, L, pos);
  const double owned = r.owned[pos], embedding = pos == r.positions[0] ? r.chunk_count : 0, loss = pos == head ? r.chunk_count : 0;
  if (owned == 0 && loss == 0) return {};
  const double ends_s = embedding * (ends.embedding_forward_s + ends.embedding_backward_s) + loss * ends.loss_s;
  const double turn = pos == head ? 0 : (L - 1 - deepest) * (layer.last_forward_s + layer.last_backward_s) + ends.loss_s;
  const double forward = std::max(owned * layer.forward.paced_s, seconds(owned * layer.forward.d2h_bytes, rates.d2h));
  const double backward = std::max(owned * layer.backward.paced_s, seconds(owned * layer.backward.d2h_bytes, rates.d2h));
  const double per_sequence = forward + backward + ends_s + turn;
  RingPosition out;
  out.dense_s = r.sequences * (owned * (layer.forward.dense_s + layer.backward.dense_s) +
                               embedding * (ends.embedding_forward_s + ends.embedding_backward_s) + loss * ends.loss_s);
  out.attention_s = r.sequences * owned * (layer.forward.attention_s + layer.backward.attention_s);
  out.train_s = r.sequences * per_sequence + (first < L ? first : 0) * (layer.first_forward_s + layer.first_backward_s);
  return out;
}

// The train's critical path per sequence (a sequence's forward begins on position 0 once the previous one's
// backward has left it): every chunk through layer 0, the last chunk through the other layers, the head and back,
// then every other chunk back through layer 0. What visits bring in comes while their GPU waits on this path.
double ring_chain_s(const BoundContext& ctx, const RingLayer& layer, const RingEnds& ends, double chunks) {
  const double later_layers = ctx.layers - 1;
  return layer.forward.time_s + later_layers * layer.last_forward_s + ends.loss_s + later_layers * layer.last_backward_s + layer.backward.time_s +
         chunks * (ends.embedding_forward_s + ends.embedding_backward_s);
}

// Streamed weights: every backward visit's gradients are added on the host, on the node's one host stream, in the
// order the builder emits them: replica by replica. The first replica's sums keep pace with its backward or queue
// behind it (from its first backward visit on, after a sequence's forward); those of the node's other replicas
// all follow its last one.
double ring_host_stream_end_s(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r, const RingLayer& layer, double train_s) {
  if (p.weights != WeightPolicy::stream) return train_s;
  const StepInputs& in = ctx.in;
  const double node_replicas = std::max(1, in.cluster.topology.gpus_per_node() / p.ring);
  const double sum_bytes = 3 * in.precision.grad_bytes * ctx.layer_params;  // the sum read, the visit's added, the sum written
  const double replica_s = ctx.layers * r.chunk_count * r.sequences * sum_bytes / (in.cluster.node.host_dram_GBps() * 1e9);
  const double first_forward_s = layer.forward.time_s + (ctx.layers - 1) * layer.last_forward_s;
  return std::max(train_s, first_forward_s + replica_s) + (node_replicas - 1) * replica_s;
}

// After position 0's last visit (layer 0's backward of chunk 0 ends the train): the replicas' all-reduce of what the
// backward has not covered, then the optimizer step: on the GPU, or on the host, where the node's GPUs' steps run one
// after another on its host stream behind position 0's gradients out and before the last GPU's weights back (alone
// on the PCIe links by then: at the sustained rates).
double ring_tail_s(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r, double backward_s) {
  const StepInputs& in = ctx.in;
  const auto& pol = in.precision;
  const int replicas = ctx.gpus / p.ring, per_node = in.cluster.topology.gpus_per_node();
  const auto params_of = [&](int pos) {
    return ctx.layer_params * r.owned[pos] + (pos == r.positions[0] ? ctx.params.embedding : 0) +
           (pos == r.positions.back() ? static_cast<double>(in.model.vocab * in.model.hidden) + ctx.params.final_norm : 0);
  };
  const auto resident_of = [&](int pos) { return params_of(pos) - ctx.layer_params * r.owned[pos]; };
  const bool stream = p.weights == WeightPolicy::stream;
  double tail = 0;
  if (replicas > 1) {
    const double GBps = group_GBps(ctx, rates_of(in.cluster), replicas, p.ring, true), ring = 2.0 * (replicas - 1) / replicas;
    const double layer_s = seconds(ring * pol.grad_bytes * ctx.layer_params, GBps),
                 embedding_s = seconds(ring * pol.grad_bytes * ctx.params.embedding, GBps);
    // Streamed weights: every all-reduce waits for all the host's sums (ring_host_stream_end_s), so none is hidden.
    tail += std::max(layer_s + embedding_s, r.owned[0] * layer_s + embedding_s - (stream ? 0 : backward_s));
  }
  if (p.states == Placement::hbm) return tail + optimizer_seconds(in, params_of(0));
  const auto& sustained = in.cluster.node.gpu.sustained;
  double host_steps_bytes = 0;
  for (int g = 0; g < std::min(per_node, ctx.gpus); ++g) host_steps_bytes += params_of(g % p.ring) * kAdamBytesPerParam;
  const int last = (std::min(per_node, ctx.gpus) - 1) % p.ring;
  return tail + seconds(pol.grad_bytes * (stream ? resident_of(0) : params_of(0)), sustained.pcie_d2h_GBps.value) +
         host_steps_bytes / (in.cluster.node.host_dram_GBps() * 1e9) +
         seconds(pol.weight_bytes * (stream ? resident_of(last) : params_of(last)), sustained.pcie_h2d_GBps.value);
}

// The fullest GPU's HBM: its model states and what it keeps for the backward (the bound's rules), then the largest
// of three moments. The backward's largest visits: what a visit brings back (activations, K/V, streamed weights) is
// allocated a visit ahead, and its K/V and dK/dV stream buffers while the previous visit's last dK/dV still goes
// out, so two visits' worth, beside the chunk's own fp32 dK/dV. The end of the forward: the visit's buffers, and the
// chunks whose K/V and activations still wait for the copy engine to take them to DRAM when the forward makes them
// faster than it copies them out. The head's visits: the loss's logits. The head's stop also keeps the final hidden
// states of every chunk when activations stay in HBM.
double ring_estimate_hbm(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r, const RingLayer& layer) {
  const HostCopyRates& rates = layer.rates;
  const std::vector<double> kept = ring_kept_bytes(ctx, p, r);
  const bool kv_dram = p.kv == Placement::dram, acts_out = p.acts != ActivationPolicy::hbm, stream = p.weights == WeightPolicy::stream;
  const double kv_chunk = r.kv_token * r.chunk_tokens, acts_chunk = r.kept_token * r.chunk_tokens;
  const double span = std::max(1.0, std::ceil(static_cast<double>(p.kv_block_tokens) / r.chunk_tokens)), earlier = r.chunk_count - 1;
  const double buffered_chunks = kv_dram && earlier > 0 ? std::min<double>(p.prefetch, std::ceil(earlier / span)) * std::min(span, earlier) : 0;
  const double ahead = (acts_out ? acts_chunk : 0) + (kv_dram ? kv_chunk : 0) + (stream ? ctx.in.precision.weight_bytes * ctx.layer_params : 0);
  const double backward = r.acc_chunk + 2 * ahead + 2 * buffered_chunks * (kv_chunk + r.acc_chunk);
  const double out_per_visit = (kv_dram ? kv_chunk : 0) + (acts_out ? acts_chunk : 0);
  const double visit_forward = out_per_visit + buffered_chunks * kv_chunk + (stream ? 2 * ctx.in.precision.weight_bytes * ctx.layer_params : 0);
  const double logits = logits_bytes(LossMemory{}, r.chunk_tokens, static_cast<double>(ctx.in.model.vocab));
  const int head = r.positions.back();
  double hbm = 0;
  for (int pos = 0; pos < p.ring; ++pos) {
    const double owned = r.owned[pos];
    // The position's forward visits span its own work, or the last chunk's way from its first layer to its deepest.
    const auto [first, deepest] = layer_range(r, static_cast<int>(ctx.layers), pos);
    const double forward_s = std::max(owned * layer.forward.paced_s, layer.forward.time_s + (deepest - first) * layer.last_forward_s);
    const double out_s = seconds(owned * layer.forward.d2h_bytes, rates.d2h);
    double waiting = out_s > forward_s ? owned * r.chunk_count * (1 - forward_s / out_s) * out_per_visit : 0;
    // With K/V in DRAM a visit streams its layer's earlier chunks, whose K/V wait in the same in-order copy queue:
    // the queue drains up to the layer's previous visit. Between two visits of a layer its GPU runs the layers of its
    // block (all of them on a ring of one) and one visit of each other chunk in the train, at most its layers.
    const double run = p.ring == 1 ? ctx.layers : p.block;
    if (kv_dram && r.chunk_count > 1) waiting = std::min(waiting, std::min(owned, std::max(run, r.chunk_count)) * out_per_visit);
    double moment = owned > 0 ? std::max(backward, waiting + visit_forward) : 0;
    if (pos == head)
      moment = std::max(moment, logits + ahead) + (acts_out ? 0 : 2 * r.chunk_count * r.chunk_tokens * static_cast<double>(ctx.in.model.hidden));
    hbm = std::max(hbm, ring_state_hbm_bytes(ctx, p, r, pos) + kept[pos] + moment);
  }
  return hbm;
}

// Host DRAM of a node. At the end of the forward it holds what the bound counts (ring_dram_bytes, less its one
// layer's dK/dV accumulators) with the fp32 dK/dV accumulators (K/V in DRAM) of every ring position's first backward
// layer: the builder allocates a layer's accumulators for the earlier chunks a visit ahead of its first backward
// visit (the last chunk) and frees them after its last; each backward visit frees its chunk's K/V and checkpoint
// there as it ends. Swept over the builder's visit order (train_schedule, one sequence consistent with every GPU's
// clock). A ring spanning nodes leaves each node its GPUs' share.
double ring_estimate_dram(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r) {
  const int per_node = ctx.in.cluster.topology.gpus_per_node();
  const double accumulators = p.kv == Placement::dram && r.chunk_count > 1 ? r.acc_chunk * (r.chunk_count - 1) : 0;
  const double freed_per_visit = (p.kv == Placement::dram ? r.kv_token * r.chunk_tokens : 0) + ring_host_acts_token(p, r) * r.chunk_tokens;
  double now = ring_host_bytes_per_ring(ctx, p, r) - accumulators, most = now + accumulators;
  if (freed_per_visit > 0 || accumulators > 0) {
    const TrainSchedule schedule = train_schedule(ctx.in.model, p, ctx.in.workload.seq_len);
    const int layers = static_cast<int>(ctx.in.model.layers), last_chunk = static_cast<int>(r.chunk_count) - 1;
    // Per position, its backward visits (the head's too: a layer after it on its GPU waits for it) as indices in
    // the order.
    std::vector<std::vector<std::size_t>> visits(static_cast<std::size_t>(p.ring));
    const auto position = [&](const Visit& v) { return static_cast<std::size_t>(schedule.stage_position[static_cast<std::size_t>(v.stage)]); };
    for (std::size_t i = 0; i < schedule.backward.size(); ++i) visits[position(schedule.backward[i])].push_back(i);
    const auto opens = [&](std::size_t i) { return schedule.backward[i].stage < layers && schedule.backward[i].chunk == last_chunk; };
    for (const auto& own : visits) now += !own.empty() && opens(own.front()) ? accumulators : 0;
    most = std::max(most, now);
    std::vector<std::size_t> next(visits.size(), 0);
    for (std::size_t i = 0; i < schedule.backward.size(); ++i) {
      const Visit& v = schedule.backward[i];
      const std::size_t pos = position(v);
      if (v.stage < layers) now -= freed_per_visit + (v.chunk == 0 ? accumulators : 0);
      const std::size_t after = ++next[pos];  // this position's next visit: its accumulators come as this one ends
      if (after < visits[pos].size() && opens(visits[pos][after])) now += accumulators;
      most = std::max(most, now);
    }
  }
  const double rings_per_node = p.ring <= per_node ? static_cast<double>(per_node / p.ring) : static_cast<double>(per_node) / p.ring;
  return most * rings_per_node;
}

}  // namespace

// Ring-track: the train of visits on each ring position (visit by visit, with the K/V streaming's waits), the
// turn's and the fill's idle time, and the tail (gradients' all-reduce, optimizer step), the slowest position's;
// the memory of the fullest GPU at the backward's largest visits or at the end of the forward (ring_estimate_hbm).
SchemeEstimate ringtrack_estimate(const BoundContext& ctx, const RingTrackParams& p) {
  const RingSizes r = ring_sizes(ctx, p);
  const RingVisits visits(ctx, p, r);
  const RingLayer layer = ring_layer(visits, static_cast<int>(r.chunk_count));
  const RingEnds ends = ring_ends(ctx.in, p.chunk);
  RingPosition slowest;
  for (int pos = 0; pos < p.ring; ++pos) {
    const RingPosition at = ring_position(ctx, r, layer, ends, pos);
    if (at.train_s > slowest.train_s) slowest = at;
  }
  const double train_s = ring_host_stream_end_s(ctx, p, r, layer,
                                                std::max(slowest.train_s, r.sequences * ring_chain_s(ctx, layer, ends, r.chunk_count)));
  const double backward_s = r.owned[0] * layer.backward.paced_s;
  SchemeEstimate e;
  e.dense_s = slowest.dense_s;
  e.attention_s = slowest.attention_s;
  e.exposed_s = train_s - slowest.dense_s - slowest.attention_s + ring_tail_s(ctx, p, r, backward_s);
  e.hbm_bytes = ring_estimate_hbm(ctx, p, r, layer);
  e.dram_bytes = ring_estimate_dram(ctx, p, r);
  return e;
}

StepEstimate analytic_estimate(const StepInputs& in, const PlanSpec& spec, double hbm_headroom) {
  const BoundContext ctx(in, spec);
  const SchemeEstimate own = scheme_named(spec.scheme).analytic(ctx, spec);
  const double compute_s = own.dense_s + (own.attention_s >= 0 ? own.attention_s : ctx.best_attention_s(own.attention_recompute));
  StepEstimate e;
  e.step_s = std::max({compute_s * (1 + own.bubble_fraction) + own.exposed_s, own.paced_s, own.host_s});
  e.hbm_bytes = own.hbm_bytes;
  e.dram_bytes = own.dram_bytes;
  const double flops = in.model.training_flops_per_token(in.workload.seq_len, true) * ctx.tokens;
  e.mfu = flops / (e.step_s * ctx.peak_flops * ctx.gpus);
  e.fits = e.hbm_bytes <= usable_hbm_bytes(in.cluster, hbm_headroom) && e.dram_bytes <= in.cluster.node.host_dram_bytes.value;
  return e;
}

std::vector<EstimatedPlan> rank_by_estimate(const StepInputs& in, const SearchOptions& options) {
  return rank_estimated(in, enumerate_plans(in, options.schemes), options);
}

std::vector<EstimatedPlan> rank_estimated(const StepInputs& in, std::vector<PlanSpec> specs, const SearchOptions& options) {
  // As the search: a plan whose graph would not fit the memory budget is left out (it could never be simulated
  // here, and the bounds the estimate starts from grow with the graph).
  const auto budget = static_cast<double>(options.memory_budget_bytes > 0 ? options.memory_budget_bytes : default_memory_budget_bytes());
  if (options.runnable) std::erase_if(specs, [&](const PlanSpec& spec) { return !options.runnable(in, spec); });
  // On options.threads (each candidate's estimate on its own); kept in enumeration order, then sorted.
  std::vector<std::optional<StepEstimate>> estimates(specs.size());
  parallel_for(
      specs.size(), options.threads,
      [&](std::size_t i) {
        if (estimate_plan(in, specs[i]).bytes <= budget) estimates[i] = analytic_estimate(in, specs[i], options.hbm_headroom);
      },
      options.cancel);
  std::vector<EstimatedPlan> ranked;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (estimates[i] && estimates[i]->fits) ranked.push_back({std::move(specs[i]), *estimates[i]});
  }
  const bool by_memory = options.objective == Objective::min_hbm;
  std::sort(ranked.begin(), ranked.end(), [by_memory](const EstimatedPlan& a, const EstimatedPlan& b) {
    const double ka = by_memory ? a.estimate.hbm_bytes : a.estimate.step_s, kb = by_memory ? b.estimate.hbm_bytes : b.estimate.step_s;
    if (ka != kb) return ka < kb;
    if (a.spec.scheme != b.spec.scheme) return a.spec.scheme < b.spec.scheme;
    return a.spec.summary() < b.spec.summary();
  });
  return ranked;
}

std::optional<EstimatedMaxSeq> max_sequence_by_estimate(const StepInputs& in, const std::string& scheme, const SearchOptions& options) {
  SearchOptions one = options;
  one.schemes = {scheme};
  one.objective = Objective::throughput;
  const auto best_at = [&](std::int64_t k) -> std::optional<EstimatedPlan> {
    const StepInputs probe{in.model, in.cluster, {k * 1024, in.workload.global_batch}, in.precision};
    std::vector<EstimatedPlan> ranked = rank_by_estimate(probe, one);
    if (ranked.empty()) return std::nullopt;
    return std::move(ranked.front());
  };
  constexpr std::int64_t kMostK = std::int64_t{1} << 22;  // 4G tokens: beyond any GPU's memory
  // The shortest power of two that fits (some schemes have no valid configuration at the shortest lengths: FPDT's
  // chunks), then doubling and bisection above it.
  std::int64_t fits = 1, fails = 0;
  std::optional<EstimatedPlan> best = best_at(fits);
  while (!best && fits < kMostK && !(options.cancel && options.cancel->load())) best = best_at(fits *= 2);
  if (!best) return std::nullopt;
  while (fails == 0 && fits < kMostK && !(options.cancel && options.cancel->load())) {
    if (auto longer = best_at(fits * 2)) {
      fits *= 2;
      best = std::move(longer);
    } else {
      fails = fits * 2;
    }
  }
  while (fails > fits + 1 && !(options.cancel && options.cancel->load())) {
    const std::int64_t mid = fits + (fails - fits) / 2;
    if (auto at = best_at(mid)) {
      fits = mid;
      best = std::move(at);
    } else {
      fails = mid;
    }
  }
  return EstimatedMaxSeq{fits * 1024, std::move(*best)};
}

}  // namespace trainyard::planner
