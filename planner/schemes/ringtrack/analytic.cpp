// Ring-track's analytic estimate (planner/analytic.hpp) and its graph's size (planner/estimate.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "planner/analytic_parts.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/ringtrack/closed_form.hpp"

namespace trainyard::planner {

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

// ring-track's own count (planner/schemes/ringtrack/ringtrack.cpp reserves this much): about 60 tasks per visit (fewer when nothing
// leaves HBM) and 8 per streamed K/V block.
double ringtrack_tasks(const StepInputs& in, const RingTrackParams& p) {
  const double gpus = in.cluster.gpus(), layers = static_cast<double>(in.model.layers);
  const double ring = std::max(1, p.ring), replicas = std::max(1.0, gpus / ring);
  const double sequences = std::max(1.0, static_cast<double>(in.workload.global_batch) / replicas);
  const double chunk = static_cast<double>(std::max<std::int64_t>(1, p.chunk));
  const double chunks = std::max(1.0, static_cast<double>(in.workload.seq_len) / chunk);
  const double span = std::max(1.0, std::floor(static_cast<double>(p.kv_block_tokens) / chunk));
  const double kv_blocks = p.kv == Placement::dram ? chunks * chunks / (2 * span) : 0;
  // Everything in HBM: no copies or host buffers around a visit (measured ~30 tasks; 50 keeps the factor of 2).
  const double per_visit = p.kv == Placement::hbm && p.acts == ActivationPolicy::hbm ? 50 : 60;
  return replicas * sequences * (layers + 1) * (per_visit * chunks + 8 * kv_blocks);
}

}  // namespace trainyard::planner
