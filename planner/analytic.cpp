#include "planner/analytic.hpp"

#include <algorithm>
#include <optional>

#include "common/memory_budget.hpp"
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
  r.pcie = std::min(sustained.pcie_h2d_gbps.value, sustained.pcie_d2h_gbps.value);
  const int switches = node.count(hw::VertexType::pcie_switch);
  if (switches > 0) r.pcie /= std::max(1.0, static_cast<double>(node.gpu_count()) / switches);
  r.intra = sustained.nvlink_gbps_per_direction.value > 0 ? sustained.nvlink_gbps_per_direction.value : r.pcie;
  r.nic = node.nic_gbps_per_gpu();
  r.inter = r.nic > 0 ? std::min(r.intra, r.nic) : r.intra;
  return r;
}
// A group of `size` consecutive GPUs (every `stride`-th) is within one node unless it is longer than a node. Across
// nodes, a GPU's own transfers (all-to-all, ring passes) cross at its NIC's rate; a ring collective (all-gather,
// reduce-scatter, all-reduce) enters each node once and runs one channel per NIC, so its members on a node share
// their NICs (nccl-tests' multi-node busbw: about the node's NIC total, up to NVLink's rate).
double group_gbps(const BoundContext& ctx, const Rates& r, int size, int stride = 1, bool ring_collective = false) {
  const int per_node = ctx.in.cluster.topology.gpus_per_node();
  if (ctx.in.cluster.nodes <= 1 || size * stride <= per_node) return r.intra;
  if (!ring_collective || r.nic <= 0) return r.inter;
  const double members_per_node = std::max(1, per_node / stride);
  return std::min(r.intra, r.nic * members_per_node);
}
double seconds(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e9) : 0; }

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
  const double gbps = group_gbps(ctx, r, cp, stride);
  const LayerAttention attention = layer_attention(ctx, layers, micro_batches);
  const double forward = seconds((cp - 1) * 2 * kv_elements * 2, gbps),
               backward = seconds((cp - 1) * (2 * kv_elements * 2 + 2 * kv_elements * 4), gbps);
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
  const double everyone = group_gbps(ctx, r, static_cast<int>(n), 1, true);
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
  exposed += z.offload_optimizer ? seconds(shard * kAdamBytesPerParam * in.cluster.topology.gpus_per_node(), in.cluster.node.host_dram_gbps())
                                 : optimizer_seconds(in, shard);
  return exposed;
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
    exposed += seconds(bytes, group_gbps(ctx, r, z.sp)) * passes * ctx.layers * mbs;
  }
  exposed += ring_exposed_s(ctx, r, z.cp, z.sp, tokens * static_cast<double>(m.kv_dim()), ctx.layers, mbs, recompute);
  if (split.fpdt_chunks > 1) {
    const double forward = seconds(fpdt_copy_bytes(m, split, false), r.pcie), backward = seconds(fpdt_copy_bytes(m, split, true), r.pcie);
    exposed += (std::max(0.0, forward - attention.forward) * (recompute ? 2 : 1) + std::max(0.0, backward - attention.backward)) * ctx.layers * mbs;
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
    exposed += seconds(tp_bytes_per_layer_forward(m, split), group_gbps(ctx, r, p.tp, 1, true)) * passes * stage_layers * mbs;
  const double kv_elements = static_cast<double>(split.local_tokens()) *
                             static_cast<double>(std::max<std::int64_t>(1, m.kv_heads / p.tp) * m.head_dim);
  if (p.cp_comm == CpComm::p2p) {
    exposed += ring_exposed_s(ctx, r, p.cp, p.tp, kv_elements, stage_layers, mbs, p.recompute != Recompute::none);
  } else if (p.cp > 1) {
    const double exchange = seconds((p.cp - 1) * 2 * kv_elements * 2, group_gbps(ctx, r, p.cp, p.tp));
    exposed += exchange * (passes + 1) * stage_layers * mbs;  // backward also returns dK, dV
  }
  if (p.offload_activations) {
    const double copy = seconds(layer_activation_bytes(m, split, p.recompute).total(), r.pcie);
    const double waited = in.cluster.stack.checkpoint_offload.blocking ? copy : std::max(0.0, copy - layer_s);
    exposed += 2 * waited * stage_layers * mbs;
  }
  const int dp = p.whole_dp() * p.whole_cp();
  const double dp_gbps = group_gbps(ctx, r, dp, p.tp * p.pp, true);
  if (dp > 1) {
    const double ring = p.distributed_optimizer ? static_cast<double>(dp - 1) / dp : 2.0 * (dp - 1) / dp;
    const double reduce = seconds(in.precision.grad_bytes * stage_params * ring, dp_gbps);
    exposed += std::max(0.0, reduce - dense_s / mbs * 2 / passes);  // beside the last micro-batch's backward
    if (p.distributed_optimizer) exposed += seconds(in.precision.weight_bytes * stage_params * (dp - 1) / dp, dp_gbps);
  }
  exposed += optimizer_seconds(in, p.distributed_optimizer ? stage_params / dp : stage_params);
  return exposed;
}

// The embedding's forward and backward and the LM head with the loss, for one micro-batch of `tokens` on GPU 0 over
// a vocabulary shard: their tasks as the builders emit them (emit_embedding, emit_loss), timed by the cost model.
// Not at the best GEMM rate, as the search's bound takes them: for a 1B model with a 128K vocabulary the head is
// a fifth of the FLOPs.
double ends_seconds(const StepInputs& in, std::int64_t tokens, std::int64_t vocab_shard, const LossMemory& memory) {
  sim::TaskGraph g;
  sim::TaskId at = emit_embedding(g, 0, "est", tokens, in.model.hidden, false, -1, {});
  at = emit_loss(g, 0, "est", tokens, in.model.hidden, vocab_shard, at, {}, memory);
  emit_embedding(g, 0, "est", tokens, in.model.hidden, true, at, {});
  return gpu0_compute(in, g).seconds;
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

// Megatron: every stage's GPU keeps the activations of the micro-batches in flight under 1F1B (the first stage
// the most: pp of them, or the interleaved schedule's warm-up plus one) beside its states; the last stage also
// holds the loss's logits. The pipeline idles (pp - 1) / (vpp x micro-batches) of the busiest stage's time.
SchemeEstimate megatron_estimate(const BoundContext& ctx, const MegatronParams& p) {
  const StepInputs& in = ctx.in;
  const SchemeBounds b = megatron_bounds(ctx, p);
  SchemeEstimate e;
  const LayerSplit split = megatron_layer_split(in, p);
  const auto mbs = static_cast<double>(megatron_micro_batches(in, p));
  // The embedding on the first stage, the LM head and the loss on the last: with one stage, both on every GPU.
  const std::int64_t vocab_shard = (in.model.vocab + p.tp - 1) / p.tp;
  const LossMemory loss = loss_memory(in.cluster.stack);
  e.dense_s = b.dense_s + mbs * ends_seconds(in, split.local_tokens(), vocab_shard, loss);
  e.attention_recompute = b.attention_recompute;
  e.paced_s = b.paced_s;
  e.bubble_fraction = static_cast<double>(p.pp - 1) / (static_cast<double>(p.vpp) * mbs);
  const std::vector<std::int64_t> stage_layers = megatron_stage_layers(in.model.layers, p);
  const auto busiest_stage_layers = static_cast<double>(*std::max_element(stage_layers.begin(), stage_layers.end()));
  if (const auto extras = layer_extras(in, split, ctx.dense_recompute > 0)) {
    e.attention_s = extras->attention_s * busiest_stage_layers * mbs;
    e.host_s = extras->issue_s * busiest_stage_layers * mbs;
  }
  const model::ParamCounts counts = in.model.param_counts();
  const double layer_params = counts.per_layer() / p.tp;
  const double busiest_stage_params = layer_params * busiest_stage_layers + static_cast<double>(in.model.vocab * in.model.hidden) / p.tp;
  e.exposed_s = megatron_exposed_s(ctx, p, busiest_stage_layers, busiest_stage_params, b.dense_s);
  const double kept_per_layer = layer_activation_bytes(in.model, split, p.recompute).total();
  const double working = p.recompute == Recompute::full ? layer_activation_bytes(in.model, split, Recompute::none).total() : 0;
  const double states_per_param = megatron_state_bytes_per_param(in.precision, p);
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
    const double logits = last ? logits_bytes(loss, static_cast<double>(split.local_tokens()), static_cast<double>(vocab_shard)) : 0;
    hbm = std::max(hbm, params * states_per_param + (p.offload_activations ? 0 : acts) + working + logits);
    offloaded = std::max(offloaded, p.offload_activations ? acts : 0);
  }
  e.hbm_bytes = hbm;
  e.dram_bytes = offloaded * in.cluster.topology.gpus_per_node();
  return e;
}

// Ring-track: its bounds' compute and critical path, its host copies at the rate a GPU gets when it shares its
// PCIe switch; its memory is still its bounds' (HBM 24% low at the median: not yet the builder's own peaks).
SchemeEstimate ringtrack_estimate(const BoundContext& ctx, const RingTrackParams& p) {
  const SchemeBounds b = ringtrack_bounds(ctx, p);
  const Rates r = rates_of(ctx.in.cluster);
  SchemeEstimate e;
  e.dense_s = b.dense_s;
  e.attention_recompute = b.attention_recompute;
  e.exposed_s = seconds(b.ring_copies.serial_h2d, r.pcie);
  e.paced_s = std::max(b.paced_s, seconds(std::max(b.ring_copies.h2d, b.ring_copies.d2h), r.pcie));
  e.hbm_bytes = b.hbm_bytes;
  e.dram_bytes = b.dram_bytes;
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
  // As the search: a plan whose graph would not fit the memory budget is left out (it could never be simulated
  // here, and the bounds the estimate starts from grow with the graph).
  const auto budget = static_cast<double>(options.memory_budget_bytes > 0 ? options.memory_budget_bytes : default_memory_budget_bytes());
  std::vector<EstimatedPlan> ranked;
  for (PlanSpec& spec : enumerate_plans(in, options.schemes)) {
    if (options.runnable && !options.runnable(in, spec)) continue;
    if (estimate_plan(in, spec).bytes > budget) continue;
    const StepEstimate e = analytic_estimate(in, spec, options.hbm_headroom);
    if (e.fits) ranked.push_back({std::move(spec), e});
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
