// Megatron's analytic estimate (planner/analytic.hpp) and its graph's size (planner/estimate.hpp).
#include <algorithm>
#include <cmath>

#include "planner/analytic_parts.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/megatron/closed_form.hpp"

namespace trainyard::planner {

namespace {

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

// Tasks per rank for one attention under context parallelism (transformer.cpp's LayerEmitter): p2p, a block and
// a ring pass per step of the whole ring and a merge; all_gather, the gather, the block and (backward) the
// reduce-scatter; a2a, the two all-to-alls around the block; a2a_p2p, those around a ring over the cp / a2a groups.
double cp_attention_tasks(CpComm comm, double whole_cp, int cp_a2a) {
  if (whole_cp <= 1) return 1;
  switch (comm) {
    case CpComm::p2p: return 2 * whole_cp + 1;
    case CpComm::all_gather:
    case CpComm::a2a: return 3;
    case CpComm::a2a_p2p: return 2 * whole_cp / std::max(1, cp_a2a) + 3;
  }
  return 2 * whole_cp + 1;
}

}  // namespace

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

double megatron_tasks(const StepInputs& in, const MegatronParams& p) {
  const double layers = static_cast<double>(in.model.layers);
  const double seq = static_cast<double>(in.workload.seq_len), batch = static_cast<double>(in.workload.global_batch);
  const double tp = std::max(1, p.built_tp()), pp = std::max(1, p.pp), dp = std::max(1, p.dp);  // built ranks
  const double micro = static_cast<double>(std::max<std::int64_t>(1, p.micro_batch));
  const double micro_batches = std::max(1.0, batch / (dp * micro));
  const bool recompute = p.recompute == Recompute::full;
  const double attention_again = p.recompute == Recompute::selective ? 1 : 0;  // the core attention, recomputed
  const double cp = std::max(1, p.cp), whole_cp = std::max(1, p.whole_cp());   // built ranks; the whole degree
  const double attention = cp_attention_tasks(p.cp_comm, whole_cp, p.cp_a2a);
  const double per_layer = kForwardTasks + kBackwardTasks + 2 * attention + (recompute ? kForwardTasks + attention : attention_again * attention) +
                           kLayerExtra;
  // Every rank: its layers and the pipeline messages of each slot; the last stage's ranks: the loss.
  const double ranks = tp * pp * dp * cp;
  return ranks * micro_batches * (layers / pp * per_layer + 4) + tp * dp * cp * micro_batches * loss_tasks(micro * seq / whole_cp) +
         ranks * (2 * layers / pp + 4);
}

}  // namespace trainyard::planner
