#include "planner/search.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "common/error.hpp"
#include "common/memory_budget.hpp"
#include "common/thread_pool.hpp"
#include "common/units.hpp"
#include "planner/estimate.hpp"
#include "planner/no_fit.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::planner {

namespace {

constexpr std::size_t kWave = 8;  // candidates simulated between pruning decisions (fixed: determinism)
constexpr std::int64_t kMinChunk = 1024, kMaxChunk = 256 * 1024;

}  // namespace

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

std::vector<std::int64_t> chunk_sizes(std::int64_t seq) {
  std::vector<std::int64_t> out;
  for (std::int64_t c = kMinChunk; c <= kMaxChunk && c <= seq; c *= 2) {
    if (seq % c == 0) out.push_back(c);
  }
  for (std::int64_t c = seq; c >= kMinChunk; c /= 2) {
    if (c <= kMaxChunk && seq % c == 0 && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    if (c % 2 != 0) break;
  }
  if (out.empty() && seq < kMinChunk) out.push_back(seq);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

bool valid(const StepInputs& in, const PlanSpec& spec) {
  try {
    check_plan(in, spec);
    return true;
  } catch (const InputError&) {
    return false;
  }
}

// Seconds GPU 0's compute stream spends on one layer's dense ops (everything but attention, which the bounds
// count separately at its best efficiency): forward, backward and, with `recompute`, the forward again. Exact
// for these ops, since they are the very tasks the builders emit, timed by the simulator's own cost model.
double dense_layer_seconds(const StepInputs& in, const LayerSplit& split, bool recompute) {
  sim::TaskGraph g;
  std::vector<sim::DeviceId> ranks;
  for (int r = 0; r < split.tp * split.ulysses * split.cp; ++r) ranks.push_back(r);
  LayerEmitter emitter(g, in.model, split, ranks);
  emitter.set_attention_hook([](const std::string&, bool, std::vector<sim::TaskId>&, bool) {});
  std::vector<sim::TaskId> last(ranks.size(), -1);
  emitter.forward("F", last);
  if (recompute) emitter.forward("R", last, true);
  emitter.backward("B", last);
  double ns = 0;
  const sim::ComputeModel compute(in.cluster.node, in.cluster.stack);
  for (const auto& t : g.tasks()) {
    if (t.device == 0 && t.stream.kind == sim::StreamKind::compute) {
      ns += static_cast<double>(compute.duration_ns(t));
    }
  }
  return ns * 1e-9;
}

}  // namespace

Objective parse_objective(const std::string& name) {
  if (name == "throughput") return Objective::throughput;
  if (name == "max-seq") return Objective::max_seq;
  if (name == "min-hbm") return Objective::min_hbm;
  throw InputError("--objective", "value", "throughput, max-seq or min-hbm", "\"" + name + "\"");
}

// --- enumeration -------------------------------------------------------------------------------------------

std::vector<PlanSpec> enumerate_plans(const StepInputs& in, const std::vector<std::string>& schemes) {
  std::vector<PlanSpec> out;
  const AddPlan add = [&](PlanSpec spec) {
    if (valid(in, spec)) out.push_back(std::move(spec));
  };
  for (const auto& scheme : schemes) scheme_named(scheme, "--strategies").enumerate(in, add);
  return out;
}

// --- lower bounds ------------------------------------------------------------------------------------------

Bounds lower_bounds(const StepInputs& in, const PlanSpec& spec) {
  const auto& m = in.model;
  const auto& pol = in.precision;
  const auto& gpu = in.cluster.node.gpu;
  const int gpus = in.cluster.gpus();
  const double S = static_cast<double>(in.workload.seq_len);
  const double tokens = static_cast<double>(in.workload.tokens());
  const auto pc = m.param_counts();
  const double layer_params = pc.per_layer();
  const double L = static_cast<double>(m.layers);
  const double resident_params = pc.embedding + static_cast<double>(m.vocab * m.hidden) + pc.final_norm;
  const double all_params = m.params();
  const double states_per_param = pol.master_bytes + pol.optimizer_bytes;
  Bounds b;

  // Compute: every FLOP at the best efficiency the profile's tables reach (GEMMs at the table's value for the
  // call size where the shapes are known).
  const double peak = gpu.peak_tflops(hw::Dtype::bf16) * 1e12;
  const double head_fwd = 2 * static_cast<double>(m.vocab * m.hidden) * tokens;
  const double attn_fwd = m.attention_flops_per_token_fwd(in.workload.seq_len, true) * tokens;
  // The share of layers whose forward runs again (rounded down: a sound bound). Ring-track's recompute leaves
  // attention out; Megatron's selective recompute is the core attention alone.
  const double dense_recompute = spec.recomputed_layer_share(m.layers);
  double attn_recompute = dense_recompute;
  if (spec.scheme == "ringtrack") attn_recompute = 0;
  if (spec.scheme == "megatron") attn_recompute = spec.megatron.recompute == Recompute::none ? 0 : 1;
  const double gemm_max = gpu.sustained.gemm.best();
  // Attention (and, where every GPU does the same share, the LM head): the per-GPU mean at the best efficiency.
  const sim::ComputeModel compute(in.cluster.node, in.cluster.stack);
  const auto head_dim = static_cast<double>(m.head_dim);
  const double attention_s = (attn_fwd * (1 + attn_recompute) / compute.attention_best_fraction(false, head_dim) +
                              attn_fwd * 2.5 / compute.attention_best_fraction(true, head_dim)) /
                             (peak * gpus);
  const double head_s = head_fwd * 3 / (gemm_max * peak * gpus);
  // Ring-track: the ring position of each stage and the layers each position holds.
  std::vector<int> positions, owned;
  if (spec.scheme == "ringtrack") {
    positions = stage_positions(m.layers, spec.ringtrack);
    owned = layers_per_position(positions, spec.ringtrack.ring);
  }
  // Dense ops of the busiest GPU: its layers' tasks, timed exactly (dense_layer_seconds).
  double dense_s = 0;
  if (spec.scheme == "ringtrack") {
    const auto& p = spec.ringtrack;
    LayerSplit split;
    split.seq_len = p.chunk;
    dense_s = *std::max_element(owned.begin(), owned.end()) * (S / static_cast<double>(p.chunk)) * (tokens / S / (gpus / p.ring)) *
              dense_layer_seconds(in, split, dense_recompute > 0);
  } else if (spec.scheme == "megatron") {
    const auto& p = spec.megatron;
    LayerSplit split = megatron_layer_split(in, p);
    dense_s = L / p.pp * static_cast<double>(megatron_micro_batches(in, p)) * dense_layer_seconds(in, split, dense_recompute > 0);
  } else {
    const auto& z = spec.zero;
    const LayerSplit split = zero_layer_split(in, z);
    dense_s = L * static_cast<double>(zero_micro_batches(in, z)) * dense_layer_seconds(in, split, dense_recompute > 0) + head_s;
  }
  const double compute_s = dense_s + attention_s;
  double paced_s = 0;  // bounds from how the work is paced: copy engines, critical paths, idle turns
  double serial_copy_s = 0;  // copies during which the busiest GPU's compute stream must wait

  if (spec.scheme == "ringtrack") {
    const auto& p = spec.ringtrack;
    const int P = p.ring;
    const double c = static_cast<double>(p.chunk);
    const double C = S / c;
    const double sequences = tokens / S / (gpus / P);  // per replica
    // The most layers any ring position holds; the embedding and head add to positions of their own.
    const double most = *std::max_element(owned.begin(), owned.end());
    const double kv_token = 4.0 * static_cast<double>(m.kv_dim());  // K and V, bf16
    LayerSplit split;
    split.seq_len = p.chunk;
    const double kept_token = layer_activation_bytes(m, split, Recompute::none).total() / c - kv_token;
    const double ckpt_token = 2.0 * static_cast<double>(m.hidden + m.q_dim()) + 4.0 * static_cast<double>(m.heads);
    double hbm = 0;
    const int head_pos = positions.back();
    const double head_params = static_cast<double>(m.vocab * m.hidden) + pc.final_norm;
    // HBM of each GPU when one of its layers starts its backward (the last chunk first): the model states; the K/V
    // and kept activations (when they stay in HBM) of every chunk whose backward visit has not run yet; the dK/dV
    // accumulators (K/V in HBM) of every layer between its first and last backward visit; and what that visit
    // allocates (the chunk's fp32 dK/dV, its activations brought back, K/V and stream buffers from DRAM). The
    // visit order is the builder's own (train_schedule), so this holds for the graph that will be simulated.
    const double acc_chunk = 2 * kv_token * c;
    const double per_chunk = (p.kv == Placement::hbm ? kv_token * c : 0) + (p.acts == ActivationPolicy::hbm ? kept_token * c : 0);
    double visit_extra = acc_chunk + (p.acts == ActivationPolicy::hbm ? 0 : kept_token * c);
    if (p.kv == Placement::dram && C > 1) {
      const double span = std::max(1.0, std::ceil(static_cast<double>(kKvBlockTokens) / c));
      visit_extra += kv_token * c + std::min<double>(p.prefetch, std::ceil((C - 1) / span)) * span * (kv_token * c + acc_chunk);
    }
    std::vector<double> held(static_cast<std::size_t>(P), 0);  // per position: the most bytes beyond model states
    if (per_chunk > 0 && C > 1) {
      const TrainSchedule schedule = train_schedule(m, p, in.workload.seq_len);
      const auto layers_n = static_cast<std::size_t>(m.layers), chunks_n = static_cast<std::size_t>(C);
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
        const double bytes = chunks_held * per_chunk + (p.kv == Placement::hbm ? accumulators * (C - 1) * acc_chunk : 0) + visit_extra;
        held[static_cast<std::size_t>(pos)] = std::max(held[static_cast<std::size_t>(pos)], bytes);
      }
    } else {
      for (int pos = 0; pos < P; ++pos) {
        if (owned[static_cast<std::size_t>(pos)] > 0) held[static_cast<std::size_t>(pos)] = owned[static_cast<std::size_t>(pos)] * C * per_chunk + visit_extra;
      }
    }
    for (int pos = 0; pos < P; ++pos) {
      const double layers = owned[static_cast<std::size_t>(pos)] * layer_params;
      const double extra = (pos == 0 ? pc.embedding : 0) + (pos == head_pos ? head_params : 0);
      const double states = pol.weight_bytes * ((p.weights == WeightPolicy::resident ? layers : 0) + extra) +
                            pol.grad_bytes * ((p.weights == WeightPolicy::resident ? layers : 0) + extra) +
                            (p.states == Placement::hbm ? states_per_param * (layers + extra) : 0);
      hbm = std::max(hbm, states + held[static_cast<std::size_t>(pos)]);
    }
    b.hbm_bytes = hbm;
    // Host DRAM of one node at the turn from forward to backward: everything of every layer that lives there.
    // Whole rings per node (a ring spanning nodes: no bound, to stay below the truth).
    const int per_node = in.cluster.topology.gpus_per_node();
    const double node_share = P <= per_node ? static_cast<double>(per_node / P) : 0;
    double host_per_ring = 0;
    // ... and, when K/V live in DRAM, the first backward visit's dK/dV accumulators for the earlier chunks.
    if (p.kv == Placement::dram) host_per_ring += kv_token * S * L + 2 * kv_token * c * (C - 1);
    if (p.acts == ActivationPolicy::dram) host_per_ring += kept_token * S * L;
    if (p.acts == ActivationPolicy::recompute) host_per_ring += ckpt_token * S * L;
    if (p.states == Placement::dram) host_per_ring += (states_per_param + pol.grad_bytes) * (L * layer_params + resident_params);
    if (p.weights == WeightPolicy::stream) host_per_ring += pol.weight_bytes * L * layer_params;
    b.dram_bytes = host_per_ring * node_share;
    // Copies of the GPU with the most layers: K/V of earlier chunks re-read for every later chunk (forward and
    // backward), the dK/dV accumulators read and written in backward, the activations out and back.
    if (P >= 1) {
      const double pairs = C * (C - 1) / 2;  // (chunk, earlier chunk) pairs per layer
      const double kv_chunk = kv_token * c;
      double h2d = 0, d2h = 0;
      if (p.kv == Placement::dram) {
        h2d += 2 * pairs * kv_chunk + std::max(0.0, pairs - (C - 1)) * acc_chunk;
        d2h += C * kv_chunk + pairs * acc_chunk;
      }
      const double out_token = p.acts == ActivationPolicy::dram ? kept_token : p.acts == ActivationPolicy::recompute ? ckpt_token : 0;
      h2d += out_token * S;
      d2h += out_token * S;
      if (p.weights == WeightPolicy::stream) {
        h2d += 2 * C * pol.weight_bytes * layer_params;
        d2h += C * pol.grad_bytes * layer_params;
      }
      // One prefetch buffer: a block's copy cannot start before the previous block's attention is done, and the
      // compute stream's next task is the attention that needs it, so every block after a visit's first is
      // copied while that GPU computes nothing.
      if (p.kv == Placement::dram && p.prefetch == 1) {
        const double span = std::max(1.0, std::ceil(static_cast<double>(kKvBlockTokens) / c));
        double chunks_after_first = 0, with_accumulators = 0;  // per layer, over the visits
        for (double k = 0; k < C; ++k) {
          chunks_after_first += std::max(0.0, k - span);
          if (k < C - 1) with_accumulators += std::max(0.0, k - span);
        }
        serial_copy_s = sequences * most * (2 * chunks_after_first * kv_chunk + with_accumulators * acc_chunk) /
                        (gpu.sustained.pcie_h2d_gbps.value * 1e9);
      }
      paced_s = sequences * most *
               std::max(h2d / (gpu.sustained.pcie_h2d_gbps.value * 1e9), d2h / (gpu.sustained.pcie_d2h_gbps.value * 1e9));
    }
    // Per visit at the best efficiencies: a layer's dense ops forward and backward (the forward timed on its own as
    // the recomputation pass), and its attention for chunk k.
    LayerSplit visit_split;
    visit_split.seq_len = p.chunk;
    const double both = dense_layer_seconds(in, visit_split, false);
    const double fwd = dense_layer_seconds(in, visit_split, true) - both;
    const double bwd = both - fwd;
    const double rec = p.acts == ActivationPolicy::recompute ? fwd : 0;
    auto attention_visit = [&](double k, bool backward) {
      const double flops = 4 * static_cast<double>(m.q_dim()) * (k * c * c + c * c / 2);
      return backward ? 2.5 * flops / (peak * compute.attention_best_fraction(true, head_dim))
                      : flops / (peak * compute.attention_best_fraction(false, head_dim));
    };
    // The train's critical path: chunk by chunk through layer 0, chunk C-1 through the other layers and back, then
    // chunk by chunk back through layer 0.
    double chain = 0;
    for (double k = 0; k < C; ++k) chain += fwd + attention_visit(k, false);                // layer 0, forward
    chain += (L - 1) * (fwd + attention_visit(C - 1, false));                                 // chunk C-1, forward
    chain += L * (bwd + rec + attention_visit(C - 1, true));                                   // chunk C-1, backward
    for (double k = 0; k < C - 1; ++k) chain += bwd + rec + attention_visit(k, true);        // layer 0, backward
    paced_s = std::max(paced_s, sequences * chain);
    // The turn from forward to backward: once a GPU has run its last forward visit (its deepest layer with the
    // last chunk, which needs all its other forward visits), all its backward visits wait for the last chunk to
    // go through the deeper layers, the head and back. A GPU other than the head's idles all that time.
    double per_layer_work = C * (both + rec);
    for (double k = 0; k < C; ++k) per_layer_work += attention_visit(k, false) + attention_visit(k, true);
    const double last_chunk_visit = fwd + attention_visit(C - 1, false) + bwd + rec + attention_visit(C - 1, true);
    for (int pos = 0; pos < P; ++pos) {
      if (pos == head_pos || owned[static_cast<std::size_t>(pos)] == 0) continue;
      std::int64_t deepest = 0;
      for (std::int64_t l = 0; l < m.layers; ++l) {
        if (positions[static_cast<std::size_t>(l)] == pos) deepest = l;
      }
      const double idle = static_cast<double>(m.layers - 1 - deepest) * last_chunk_visit;
      paced_s = std::max(paced_s, sequences * (owned[static_cast<std::size_t>(pos)] * per_layer_work + idle));
    }
  } else if (spec.scheme == "megatron") {
    const auto& p = spec.megatron;
    // Every rank keeps the full states of its shard of the model (the distributed optimizer splits the master
    // weights and moments dp ways); the ends of the model sit on the first and last stages.
    const double ends = p.pp == 1 ? resident_params : std::max(pc.embedding, static_cast<double>(m.vocab * m.hidden));
    const double per_param = p.distributed_optimizer ? pol.weight_bytes + pol.grad_bytes + (pol.master_bytes + pol.optimizer_bytes) / p.dp
                                                     : pol.bytes_per_param();
    b.hbm_bytes = per_param * (layer_params * L / p.pp + ends) / p.tp;
    // Activations, at least: one layer's full set while its backward runs (recomputed or kept), and the kept
    // sets (checkpoints under full recompute, unless offloaded) of the stage's other layers for one micro-batch.
    // Without this, megatron at absurd lengths (--seq 1G) passed the bound and every candidate was simulated.
    const LayerSplit split = megatron_layer_split(in, p);
    const double full = layer_activation_bytes(m, split, Recompute::none).total();
    const double kept = p.offload_activations ? 0 : layer_activation_bytes(m, split, p.recompute).total();
    b.hbm_bytes += full + kept * (L / p.pp - 1);
  } else {
    const auto& z = spec.zero;
    const double n = gpus;
    const double layers_params = layer_params * L;
    double weights = pol.weight_bytes * ((z.stage == 3 ? layers_params / n : layers_params) + resident_params);
    if (z.offload_params) weights -= pol.weight_bytes * layers_params / n;
    const double grads = z.offload_grads ? 0 : pol.grad_bytes * (z.stage >= 2 ? all_params / n : all_params);
    const double optimizer = z.offload_optimizer ? 0 : states_per_param * (z.stage >= 1 ? all_params / n : all_params);
    const LayerSplit split = zero_layer_split(in, z);
    const double full = split.fpdt_chunks > 1 ? fpdt_working_bytes(m, split) : layer_activation_bytes(m, split, Recompute::none).total();
    const double ckpt = layer_activation_bytes(m, split, Recompute::full).total();
    const auto checkpointed = static_cast<double>(z.checkpointed_layers(m.layers));
    const double acts = z.offload_activations ? 0 : ckpt * checkpointed + full * (L - checkpointed);
    b.hbm_bytes = weights + grads + optimizer + acts;
    const int per_node = in.cluster.topology.gpus_per_node();
    double host = 0;
    if (z.offload_params) host += pol.weight_bytes * layers_params / n;
    if (z.offload_grads) host += pol.grad_bytes * (z.stage >= 2 ? all_params / n : all_params);
    if (z.offload_optimizer) host += states_per_param * (z.stage >= 1 ? all_params / n : all_params);
    if (z.offload_activations) host += ckpt * L;
    b.dram_bytes = host * per_node;
  }
  b.step_s = std::max(compute_s + serial_copy_s, paced_s);
  return b;
}

// --- measuring a simulated plan ------------------------------------------------------------------------------

double usable_hbm_bytes(const sim::Cluster& cluster, double hbm_headroom) {
  return cluster.stack.allocatable_bytes(cluster.node.gpu.hbm_bytes.value * (1 - hbm_headroom));
}

PlanMetrics measure(const sim::SimResult& r, const StepInputs& in, double hbm_headroom) {
  PlanMetrics pm;
  const int gpus = in.cluster.gpus();
  const double usable = usable_hbm_bytes(in.cluster, hbm_headroom);
  for (int g = 0; g < gpus && g < static_cast<int>(r.pools.size()); ++g) {
    pm.peak_hbm_bytes = std::max(pm.peak_hbm_bytes, r.pools[static_cast<std::size_t>(g)].peak_bytes);
  }
  for (std::size_t i = static_cast<std::size_t>(gpus); i < r.pools.size(); ++i) pm.peak_dram_bytes = std::max(pm.peak_dram_bytes, r.pools[i].peak_bytes);
  pm.step_s = static_cast<double>(r.step_ns) * 1e-9;
  if (!r.completed) {
    if (r.oom) {
      pm.failure = "out of memory in " + r.oom->pool + ": " + format_bytes(static_cast<double>(r.oom->excess_bytes)) + " over";
      pm.shortfall_bytes = r.oom->excess_bytes;
      pm.short_of = r.oom->pool.ends_with("dram") ? "host DRAM per node" : "HBM per GPU";
    } else {
      pm.failure = r.stuck.empty() ? "did not finish" : r.stuck;
    }
    return pm;
  }
  if (static_cast<double>(pm.peak_hbm_bytes) > usable) {
    pm.failure = "peak HBM " + format_bytes(static_cast<double>(pm.peak_hbm_bytes)) + " exceeds the " + format_bytes(usable) +
                 " left for tensors after the HBM headroom and what the " + in.cluster.stack.name + " stack reserves";
    pm.shortfall_bytes = static_cast<std::int64_t>(static_cast<double>(pm.peak_hbm_bytes) - usable);
    pm.short_of = "HBM per GPU";
    return pm;
  }
  pm.fits = true;
  pm.tokens_per_s = static_cast<double>(in.workload.tokens()) / pm.step_s;
  pm.mfu = r.mfu();
  pm.hfu = r.hfu();
  double busy_ns = 0;
  for (const auto& s : r.streams) {
    if (!sim::is_host(s.device) && s.stream.kind == sim::StreamKind::compute) busy_ns += static_cast<double>(s.busy_ns);
  }
  double exposed_ns = 0;
  for (auto e : r.exposed_transfer_ns) exposed_ns += static_cast<double>(e);
  pm.compute_s = busy_ns / gpus * 1e-9;
  pm.exposed_transfer_s = exposed_ns / gpus * 1e-9;
  pm.bubble_s = std::max(0.0, pm.step_s - pm.compute_s - pm.exposed_transfer_s);
  pm.recompute_s = r.hardware_flops > 0 ? pm.compute_s * (r.hardware_flops - r.model_flops) / r.hardware_flops : 0;
  // The busiest link by time with traffic, as a fraction of the step.
  const sim::LinkUsage* busiest = nullptr;
  for (const auto& link : r.links) {
    if (!busiest || link.busy_ns > busiest->busy_ns) busiest = &link;
  }
  if (busiest) {
    pm.busiest_link = busiest->name + " busy " + format_fixed(100.0 * static_cast<double>(busiest->busy_ns) / static_cast<double>(r.step_ns), 0) + "%";
  }
  const double idle = pm.exposed_transfer_s + pm.bubble_s;
  if (idle < 0.15 * pm.step_s) {
    pm.bottleneck = "compute";
  } else if (pm.bubble_s >= pm.exposed_transfer_s) {
    pm.bottleneck = "bubble";
  } else if (busiest && busiest->type == hw::LinkType::dram) {
    pm.bottleneck = "DRAM";
  } else if (busiest && busiest->type == hw::LinkType::pcie) {
    pm.bottleneck = "PCIe";
  } else {
    pm.bottleneck = "link";
  }
  return pm;
}

nlohmann::json metrics_json(const PlanMetrics& m) {
  return {{"fits", m.fits},
          {"step_s", m.step_s},
          {"tokens_per_s", m.tokens_per_s},
          {"mfu", m.mfu},
          {"hfu", m.hfu},
          {"peak_hbm_bytes", m.peak_hbm_bytes},
          {"peak_dram_bytes", m.peak_dram_bytes},
          {"compute_s", m.compute_s},
          {"exposed_transfer_s", m.exposed_transfer_s},
          {"bubble_s", m.bubble_s},
          {"recompute_s", m.recompute_s},
          {"bottleneck", m.bottleneck},
          {"busiest_link", m.busiest_link}};
}

// --- the search ------------------------------------------------------------------------------------------------

namespace {

double objective_key(Objective o, const PlanMetrics& m) {
  return o == Objective::min_hbm ? static_cast<double>(m.peak_hbm_bytes) : m.step_s;
}
double bound_key(Objective o, const Bounds& b) { return o == Objective::min_hbm ? b.hbm_bytes : b.step_s; }

RankedPlan simulate_plan(const StepInputs& in, const PlanSpec& spec, const Bounds& bounds, double headroom,
                         const std::atomic<bool>* cancel) {
  sim::TaskGraph graph = build_plan(in, spec);
  graph.finalize();
  sim::SimOptions options;
  options.record_memory = false;
  options.record_links = false;
  options.cancel = cancel;
  const sim::SimResult r = sim::simulate(graph, in.cluster, options);
  return {spec, measure(r, in, headroom), bounds};
}

bool cancelled(const SearchOptions& o) { return o.cancel && o.cancel->load(); }

}  // namespace

SearchReport search(const StepInputs& in, const SearchOptions& options) {
  SearchReport report;
  const std::vector<PlanSpec> specs = enumerate_plans(in, options.schemes);
  report.enumerated = specs.size();
  for (const auto& spec : specs) ++report.enumerated_by_scheme[spec.scheme];
  const double hbm_usable = usable_hbm_bytes(in.cluster, options.hbm_headroom);
  const double dram_capacity = in.cluster.node.host_dram_bytes.value;

  struct Candidate {
    std::size_t index;
    Bounds bounds;
    double size;  // visits or attention blocks the graph has, roughly: what simulating it costs
  };
  // Only orders candidates whose bounds tie; nothing is decided on it.
  auto graph_size = [&](const PlanSpec& spec) {
    const double layers = static_cast<double>(in.model.layers), S = static_cast<double>(in.workload.seq_len);
    if (spec.scheme == "ringtrack") return layers * S / static_cast<double>(spec.ringtrack.chunk);
    if (spec.zero.fpdt_chunk > 0) {
      const double u = S / static_cast<double>(spec.zero.fpdt_chunk);
      return layers * u * u;
    }
    return layers;
  };
  const std::int64_t budget = options.memory_budget_bytes > 0 ? options.memory_budget_bytes : default_memory_budget_bytes();
  std::vector<double> graph_bytes(specs.size(), 0);
  std::vector<Candidate> alive;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (options.bounds_progress && i % 16 == 0) options.bounds_progress(i, specs.size());
    if (cancelled(options)) {
      report.interrupted = true;
      return report;
    }
    // Too large to build here: skipped before its bounds (whose cost grows with the graph's) are computed.
    graph_bytes[i] = estimate_plan(in, specs[i]).bytes;
    if (graph_bytes[i] > static_cast<double>(budget)) {
      if (report.over_budget++ == 0 || graph_bytes[i] < report.smallest_over_budget_bytes) report.smallest_over_budget_bytes = graph_bytes[i];
      continue;
    }
    const Bounds b = lower_bounds(in, specs[i]);
    if (options.prune && (b.hbm_bytes > hbm_usable || b.dram_bytes > dram_capacity)) {
      ++report.pruned_memory;
      note_miss(report, bound_miss(specs[i], b, hbm_usable, dram_capacity));
      continue;
    }
    alive.push_back({i, b, graph_size(specs[i])});
  }
  if (options.bounds_progress) options.bounds_progress(specs.size(), specs.size());
  // Best bound first; among equal bounds the cheaper simulation first, then the smaller memory bound (the likelier
  // to fit: a scheme's plans can only be skipped once one of them fits).
  std::stable_sort(alive.begin(), alive.end(), [&](const Candidate& a, const Candidate& b) {
    const double ka = bound_key(options.objective, a.bounds), kb = bound_key(options.objective, b.bounds);
    if (ka != kb) return ka < kb;
    if (a.size != b.size) return a.size < b.size;
    return a.bounds.hbm_bytes < b.bounds.hbm_bytes;
  });

  const std::size_t top = static_cast<std::size_t>(std::max(1, options.top));
  std::vector<double> found;                 // objective keys of fitting plans, sorted
  std::map<std::string, double> scheme_best;     // objective key of each scheme's best so far
  std::map<std::string, double> scheme_skipped;  // the best bound among each scheme's skipped candidates
  ThreadPool pool(options.threads);
  std::vector<RankedPlan> fitting;
  for (std::size_t start = 0; start < alive.size(); start += kWave) {
    if (cancelled(options)) {
      report.interrupted = true;
      break;
    }
    // Decide the wave from the results of earlier waves only.
    std::vector<std::size_t> wave;  // positions in `alive`
    for (std::size_t i = start; i < std::min(alive.size(), start + kWave); ++i) {
      const double key = bound_key(options.objective, alive[i].bounds);
      const std::string& scheme = specs[alive[i].index].scheme;
      const bool beaten_overall = found.size() >= top && key >= found[top - 1];
      const bool scheme_has_plan = scheme_best.count(scheme) > 0;
      if (options.prune && beaten_overall && scheme_has_plan) {
        ++report.pruned_time;
        auto [it, inserted] = scheme_skipped.emplace(scheme, key);
        if (!inserted) it->second = std::min(it->second, key);
      } else {
        wave.push_back(i);
      }
    }
    std::vector<RankedPlan> results(wave.size());
    // As many at once as fit in the budget together (the answer does not depend on it).
    double largest = 1;
    for (std::size_t w : wave) largest = std::max(largest, graph_bytes[alive[w].index]);
    const int parallel = static_cast<int>(std::clamp(static_cast<double>(budget) / largest, 1.0, static_cast<double>(pool.size())));
    pool.for_each(
        wave.size(),
        [&](std::size_t w) {
          const Candidate& c = alive[wave[w]];
          if (options.before_simulate) options.before_simulate(specs[c.index]);
          results[w] = simulate_plan(in, specs[c.index], c.bounds, options.hbm_headroom, options.cancel);
        },
        options.cancel, parallel);
    // Ctrl-C: the wave's simulations that finished stay in the report (the best so far); those cut short or never
    // started are dropped.
    const bool stopped = cancelled(options);
    if (stopped) {
      report.interrupted = true;
      std::erase_if(results, [](const RankedPlan& r) { return r.spec.scheme.empty() || r.metrics.failure == "cancelled"; });
    }
    report.simulated += results.size();
    for (auto& r : results) {
      if (r.metrics.fits) {
        const double key = objective_key(options.objective, r.metrics);
        found.insert(std::upper_bound(found.begin(), found.end(), key), key);
        auto [it, inserted] = scheme_best.emplace(r.spec.scheme, key);
        if (!inserted) it->second = std::min(it->second, key);
        fitting.push_back(std::move(r));
      } else {
        note_miss(report, std::move(r));
      }
    }
    if (stopped) break;
    if (options.progress) options.progress(std::min(alive.size(), start + kWave) + report.pruned_memory, specs.size());
  }
  std::stable_sort(fitting.begin(), fitting.end(), [&](const RankedPlan& a, const RankedPlan& b) {
    return objective_key(options.objective, a.metrics) < objective_key(options.objective, b.metrics);
  });
  for (const auto& scheme : scheme_names()) {
    for (const auto& r : fitting) {
      if (r.spec.scheme == scheme) {
        report.best_of_scheme.push_back(r);
        const auto skipped = scheme_skipped.find(scheme);
        const double key = objective_key(options.objective, r.metrics);
        if (skipped != scheme_skipped.end() && skipped->second < key) report.best_of_scheme.back().gap = (key - skipped->second) / key;
        break;
      }
    }
  }
  report.ranked = std::move(fitting);
  if (!report.ranked.empty()) report.closest_miss.reset();
  // Nothing fits, and some candidates were never tried for their size: the user has to change the inputs or the budget.
  if (report.ranked.empty() && report.over_budget > 0 && options.refuse_over_budget && !report.interrupted) {
    const std::size_t others = report.enumerated - report.over_budget;
    require_within_budget(estimate_tasks(report.smallest_over_budget_bytes / kBytesPerTask), budget,
                          "a plan whose step graph fits (" + std::to_string(report.over_budget) + " of " + std::to_string(report.enumerated) +
                              " candidates are larger" + (others ? "; none of the other " + std::to_string(others) + " fits" : "") + ")",
                          "fewer nodes, a smaller --global-batch or a shorter --seq");
  }
  return report;
}

std::optional<PlanSpec> quick_plan(const StepInputs& in, const std::string& scheme, double hbm_headroom) {
  const double hbm_usable = usable_hbm_bytes(in.cluster, hbm_headroom);
  const double dram_capacity = in.cluster.node.host_dram_bytes.value;
  std::optional<PlanSpec> best_fitting, least_hbm;
  double best_step = 0, least_hbm_bytes = 0;
  const double budget = static_cast<double>(default_memory_budget_bytes());
  for (auto& spec : enumerate_plans(in, {scheme})) {
    if (estimate_plan(in, spec).bytes > budget) continue;  // could not be simulated here; its bounds may be slow
    const Bounds b = lower_bounds(in, spec);
    if (!least_hbm || b.hbm_bytes < least_hbm_bytes) {
      least_hbm_bytes = b.hbm_bytes;
      least_hbm = spec;
    }
    if (b.hbm_bytes <= hbm_usable && b.dram_bytes <= dram_capacity && (!best_fitting || b.step_s < best_step)) {
      best_step = b.step_s;
      best_fitting = std::move(spec);
    }
  }
  return best_fitting ? best_fitting : least_hbm;
}

std::optional<MaxSeqResult> max_sequence(const StepInputs& in, const std::string& scheme, const SearchOptions& options) {
  SearchOptions probe = options;
  probe.schemes = {scheme};
  probe.objective = Objective::min_hbm;
  probe.top = 1;
  probe.progress = nullptr;
  probe.bounds_progress = nullptr;
  probe.refuse_over_budget = false;
  std::map<std::int64_t, bool> over_budget_at;  // per probed length: nothing fit, and some candidate was too large
  // At most 16 doublings (1K to 64M) and 16 halvings of the gap.
  constexpr std::size_t kMostProbes = 32;
  std::size_t probes = 0;
  // Whether some configuration fits at `seq`; nullopt when the scheme has no valid configuration there at all
  // (FPDT below its smallest chunk, say), which does not end the doubling. A length where every candidate is too
  // large for the memory budget counts as not fitting (and says so).
  auto fits_at = [&](std::int64_t seq) -> std::optional<bool> {
    const StepInputs at{in.model, in.cluster, {seq, in.workload.global_batch}, in.precision};
    SearchReport r = search(at, probe);
    if (options.progress) options.progress(++probes, kMostProbes);
    if (r.enumerated == 0) return std::nullopt;
    over_budget_at[seq] = r.ranked.empty() && r.over_budget > 0;
    return !r.ranked.empty();
  };
  constexpr std::int64_t kStep = 1024, kLimit = std::int64_t{64} << 20;
  std::int64_t good = 0, bad = 0;
  for (std::int64_t seq = kStep; seq <= kLimit; seq *= 2) {
    if (cancelled(options)) break;
    const auto fits = fits_at(seq);
    if (!fits) continue;
    if (!*fits) {
      if (good == 0) return std::nullopt;  // the shortest length it can run does not fit
      bad = seq;
      break;
    }
    good = seq;
  }
  if (good == 0) return std::nullopt;
  while (bad != 0 && bad - good > kStep) {
    if (cancelled(options)) break;
    const std::int64_t mid = (good + bad) / 2 / kStep * kStep;
    if (mid <= good) break;
    (fits_at(mid).value_or(false) ? good : bad) = mid;
  }
  // The best throughput plan at that length.
  const StepInputs at{in.model, in.cluster, {good, in.workload.global_batch}, in.precision};
  SearchOptions best = options;
  best.schemes = {scheme};
  best.objective = Objective::throughput;
  best.top = 1;
  best.progress = nullptr;
  best.bounds_progress = nullptr;
  best.refuse_over_budget = false;
  best.cancel = nullptr;  // one search at a length known to fit: finish it, so an interrupted probe still has a plan
  SearchReport r = search(at, best);
  if (r.ranked.empty()) return std::nullopt;
  return MaxSeqResult{good, r.ranked.front(), bad != 0 && over_budget_at[bad]};
}

}  // namespace trainyard::planner
