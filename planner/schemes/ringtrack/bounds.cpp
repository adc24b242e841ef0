// Ring-track's share of the search's lower bounds (planner/bounds.hpp) and the sizes its estimate reuses.
#include <algorithm>
#include <cmath>

#include "planner/schemes/ringtrack/closed_form.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

RingSizes ring_sizes(const BoundContext& ctx, const RingTrackParams& p) {
  const auto& m = ctx.in.model;
  RingSizes r;
  r.positions = stage_positions(m.layers, p);
  r.owned = layers_per_position(r.positions, p.ring);
  r.most = *std::max_element(r.owned.begin(), r.owned.end());
  r.chunk_tokens = static_cast<double>(p.chunk);
  r.chunk_count = ctx.seq_len / r.chunk_tokens;
  r.sequences = ctx.tokens / ctx.seq_len / (ctx.gpus / p.ring);
  r.kv_token = 4.0 * static_cast<double>(m.kv_dim());
  LayerSplit split;
  split.sequence_tokens = p.chunk;
  r.kept_token = layer_activation_bytes(m, split, Recompute::none).total() / r.chunk_tokens - r.kv_token;
  r.ckpt_token = 2.0 * static_cast<double>(m.hidden + m.q_dim()) + 4.0 * static_cast<double>(m.heads);
  r.acc_chunk = 2 * r.kv_token * r.chunk_tokens;
  return r;
}

namespace {

// What a layer's backward visit allocates besides what ring_kept_bytes counts: the chunk's fp32 dK/dV, its
// activations brought back, K/V and stream buffers from DRAM.
double ring_visit_bytes(const RingTrackParams& p, const RingSizes& r) {
  double visit_extra = r.acc_chunk + (p.acts == ActivationPolicy::hbm ? 0 : r.kept_token * r.chunk_tokens);
  if (p.kv == Placement::dram && r.chunk_count > 1) {
    const double span = std::max(1.0, std::ceil(static_cast<double>(kKvBlockTokens) / r.chunk_tokens));
    // The last chunk's backward streams its C - 1 earlier chunks in blocks of at most `span` (buffers are sized for
    // the visit's largest block: fewer chunks than a block when the sequence is shorter).
    visit_extra += r.kv_token * r.chunk_tokens + std::min<double>(p.prefetch, std::ceil((r.chunk_count - 1) / span)) *
                                                     std::min(span, r.chunk_count - 1.0) * (r.kv_token * r.chunk_tokens + r.acc_chunk);
  }
  return visit_extra;
}

}  // namespace

std::vector<double> ring_kept_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r) {
  const auto& m = ctx.in.model;
  const double per_chunk = (p.kv == Placement::hbm ? r.kv_token * r.chunk_tokens : 0) +
                           (p.acts == ActivationPolicy::hbm ? r.kept_token * r.chunk_tokens : 0);
  std::vector<double> held(static_cast<std::size_t>(p.ring), 0);
  if (per_chunk <= 0 || r.chunk_count <= 1) {
    for (int pos = 0; pos < p.ring; ++pos) {
      if (r.owned[pos] > 0) held[pos] = r.owned[pos] * r.chunk_count * per_chunk;
    }
    return held;
  }
  const TrainSchedule schedule = train_schedule(m, p, ctx.in.workload.seq_len);
  const auto layers_n = static_cast<std::size_t>(m.layers), chunks_n = static_cast<std::size_t>(r.chunk_count);
  std::vector<std::size_t> at(layers_n * chunks_n, 0);  // position of B(l, j) in the backward order
  for (std::size_t i = 0; i < schedule.backward.size(); ++i) {
    const Visit& v = schedule.backward[i];
    if (v.stage < m.layers) at[static_cast<std::size_t>(v.stage) * chunks_n + static_cast<std::size_t>(v.chunk)] = i;
  }
  // Each layer's backward positions sorted, so "how many of its chunks are still held at `start`" is a binary
  // search instead of a count over every chunk (layers x layers x chunks per candidate).
  std::vector<std::size_t> sorted_at = at;
  for (std::size_t o = 0; o < layers_n; ++o) {
    std::sort(sorted_at.begin() + static_cast<std::ptrdiff_t>(o * chunks_n), sorted_at.begin() + static_cast<std::ptrdiff_t>((o + 1) * chunks_n));
  }
  for (std::size_t l = 0; l < layers_n; ++l) {
    const int pos = schedule.stage_position[l];
    const std::size_t start = at[l * chunks_n + chunks_n - 1];
    double chunks_held = 0, accumulators = 0;
    for (std::size_t o = 0; o < layers_n; ++o) {
      if (schedule.stage_position[o] != pos) continue;
      const auto first = sorted_at.begin() + static_cast<std::ptrdiff_t>(o * chunks_n), last = first + static_cast<std::ptrdiff_t>(chunks_n);
      chunks_held += static_cast<double>(last - std::lower_bound(first, last, start));
      accumulators += at[o * chunks_n + chunks_n - 1] <= start && at[o * chunks_n] >= start;
    }
    const double bytes = chunks_held * per_chunk + (p.kv == Placement::hbm ? accumulators * (r.chunk_count - 1) * r.acc_chunk : 0);
    held[pos] = std::max(held[pos], bytes);
  }
  return held;
}

double ring_state_hbm_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r, int pos) {
  const auto& m = ctx.in.model;
  const auto& pol = ctx.in.precision;
  const double head_params = static_cast<double>(m.vocab * m.hidden) + ctx.params.final_norm;
  const double layers = r.owned[pos] * ctx.layer_params;
  const double extra = (pos == 0 ? ctx.params.embedding : 0) + (pos == r.positions.back() ? head_params : 0);
  return pol.weight_bytes * ((p.weights == WeightPolicy::resident ? layers : 0) + extra) +
         pol.grad_bytes * ((p.weights == WeightPolicy::resident ? layers : 0) + extra) +
         (p.states == Placement::hbm ? ctx.states_per_param * (layers + extra) : 0);
}

namespace {

// HBM of the fullest GPU: its model states, what it keeps for the backward (ring_kept_bytes) and what the visit
// allocates (ring_visit_bytes).
double ring_hbm_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r) {
  const std::vector<double> kept = ring_kept_bytes(ctx, p, r);
  const double visit = ring_visit_bytes(p, r);
  double hbm = 0;
  for (int pos = 0; pos < p.ring; ++pos) {
    hbm = std::max(hbm, ring_state_hbm_bytes(ctx, p, r, pos) + kept[pos] + (r.owned[pos] > 0 ? visit : 0));
  }
  return hbm;
}

}  // namespace

double ring_host_acts_token(const RingTrackParams& p, const RingSizes& r) {
  return p.acts == ActivationPolicy::dram ? r.kept_token : p.acts == ActivationPolicy::recompute ? r.ckpt_token : 0;
}

double ring_host_bytes_per_ring(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r) {
  const auto& pol = ctx.in.precision;
  const double S = ctx.seq_len, L = ctx.layers;
  double host = 0;
  if (p.kv == Placement::dram) host += r.kv_token * S * L + r.acc_chunk * (r.chunk_count - 1);
  host += ring_host_acts_token(p, r) * S * L;
  if (p.states == Placement::dram) host += (ctx.states_per_param + pol.grad_bytes) * (L * ctx.layer_params + ctx.resident_params);
  if (p.weights == WeightPolicy::stream) host += pol.weight_bytes * L * ctx.layer_params;
  return host;
}

double ring_dram_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r) {
  const int per_node = ctx.in.cluster.topology.gpus_per_node();
  const double rings_per_node = p.ring <= per_node ? static_cast<double>(per_node / p.ring) : 0;
  return ring_host_bytes_per_ring(ctx, p, r) * rings_per_node;
}

namespace {

// The bytes the GPU with the most layers copies to and from host DRAM per step: K/V of earlier chunks re-read for
// every later chunk (forward and backward), the dK/dV accumulators read and written in backward, the activations
// out and back, streamed weights; with one prefetch buffer, `serial_h2d` the copies the compute stream must wait for.
RingCopyBytes ring_copy_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r) {
  const auto& pol = ctx.in.precision;
  const double pairs = r.chunk_count * (r.chunk_count - 1) / 2;  // (chunk, earlier chunk) pairs per layer
  const double kv_chunk = r.kv_token * r.chunk_tokens;
  RingCopyBytes b;
  if (p.kv == Placement::dram) {
    b.h2d += 2 * pairs * kv_chunk + std::max(0.0, pairs - (r.chunk_count - 1)) * r.acc_chunk;
    b.d2h += r.chunk_count * kv_chunk + pairs * r.acc_chunk;
  }
  const double out_token = ring_host_acts_token(p, r);
  b.h2d += out_token * ctx.seq_len;
  b.d2h += out_token * ctx.seq_len;
  if (p.weights == WeightPolicy::stream) {
    b.h2d += 2 * r.chunk_count * pol.weight_bytes * ctx.layer_params;
    b.d2h += r.chunk_count * pol.grad_bytes * ctx.layer_params;
  }
  // One prefetch buffer: a block's copy cannot start before the previous block's attention is done, and the
  // compute stream's next task is the attention that needs it, so every block after a visit's first is copied
  // while that GPU computes nothing.
  if (p.kv == Placement::dram && p.prefetch == 1) {
    const double span = std::max(1.0, std::ceil(static_cast<double>(kKvBlockTokens) / r.chunk_tokens));
    double chunks_after_first = 0, with_accumulators = 0;  // per layer, over the visits
    for (double k = 0; k < r.chunk_count; ++k) {
      chunks_after_first += std::max(0.0, k - span);
      if (k < r.chunk_count - 1) with_accumulators += std::max(0.0, k - span);
    }
    b.serial_h2d = 2 * chunks_after_first * kv_chunk + with_accumulators * r.acc_chunk;
  }
  const double per_step = r.sequences * r.most;  // the busiest GPU's visits of a layer, times its layers
  b.h2d *= per_step;
  b.d2h *= per_step;
  b.serial_h2d *= per_step;
  return b;
}

// Those copies at the copy engines' sustained rates; `serial_copy_s` gets the time the compute stream waits.
double ring_copy_s(const BoundContext& ctx, const RingCopyBytes& b, double& serial_copy_s) {
  const auto& gpu = ctx.in.cluster.node.gpu;
  serial_copy_s = b.serial_h2d / (gpu.sustained.pcie_h2d_GBps.value * 1e9);
  return std::max(b.h2d / (gpu.sustained.pcie_h2d_GBps.value * 1e9), b.d2h / (gpu.sustained.pcie_d2h_GBps.value * 1e9));
}

// Per visit at the best efficiencies: the train's critical path (chunk by chunk through layer 0, chunk C-1
// through the other layers and back, then chunk by chunk back through layer 0), and the turn from forward to
// backward: once a GPU has run its last forward visit, its backward visits wait for the last chunk to go through
// the deeper layers, the head and back, so a GPU other than the head's idles all that time.
double ring_path_s(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r) {
  const auto& m = ctx.in.model;
  LayerSplit visit_split;
  visit_split.sequence_tokens = p.chunk;
  const double both = dense_layer_seconds(ctx.in, visit_split, false);
  const double fwd = dense_layer_seconds(ctx.in, visit_split, true) - both;
  const double bwd = both - fwd;
  const double rec = p.acts == ActivationPolicy::recompute ? fwd : 0;
  const double c = r.chunk_tokens, C = r.chunk_count, L = ctx.layers;  // the seed's notation: L layers, C chunks of c tokens
  auto attention_visit = [&](double k, bool backward) {
    return ctx.attention_s(4 * static_cast<double>(m.q_dim()) * (k * c * c + c * c / 2), backward);
  };
  double chain = 0;
  for (double k = 0; k < C; ++k) chain += fwd + attention_visit(k, false);           // layer 0, forward
  chain += (L - 1) * (fwd + attention_visit(C - 1, false));                          // chunk C-1, forward
  chain += L * (bwd + rec + attention_visit(C - 1, true));                           // chunk C-1, backward
  for (double k = 0; k < C - 1; ++k) chain += bwd + rec + attention_visit(k, true);  // layer 0, backward
  double paced_s = r.sequences * chain;
  double per_layer_work = C * (both + rec);
  for (double k = 0; k < C; ++k) per_layer_work += attention_visit(k, false) + attention_visit(k, true);
  const double last_chunk_visit = fwd + attention_visit(C - 1, false) + bwd + rec + attention_visit(C - 1, true);
  const int head_pos = r.positions.back();
  for (int pos = 0; pos < p.ring; ++pos) {
    if (pos == head_pos || r.owned[pos] == 0) continue;
    std::int64_t deepest = 0;
    for (std::int64_t l = 0; l < m.layers; ++l) {
      if (r.positions[l] == pos) deepest = l;
    }
    const double idle = static_cast<double>(m.layers - 1 - deepest) * last_chunk_visit;
    paced_s = std::max(paced_s, r.sequences * (r.owned[pos] * per_layer_work + idle));
  }
  return paced_s;
}

}  // namespace

SchemeBounds ringtrack_bounds(const BoundContext& ctx, const RingTrackParams& p) {
  const RingSizes r = ring_sizes(ctx, p);
  SchemeBounds b;
  b.attention_recompute = 0;  // ring-track's recompute leaves attention out
  LayerSplit split;
  split.sequence_tokens = p.chunk;
  b.dense_s = r.most * (ctx.seq_len / static_cast<double>(p.chunk)) * (ctx.tokens / ctx.seq_len / (ctx.gpus / p.ring)) *
              dense_layer_seconds(ctx.in, split, ctx.dense_recompute > 0);
  b.hbm_bytes = ring_hbm_bytes(ctx, p, r);
  b.dram_bytes = ring_dram_bytes(ctx, p, r);
  b.ring_copies = ring_copy_bytes(ctx, p, r);
  b.paced_s = std::max(ring_copy_s(ctx, b.ring_copies, b.serial_copy_s), ring_path_s(ctx, p, r));
  return b;
}

}  // namespace trainyard::planner
