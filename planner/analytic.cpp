#include "planner/analytic.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include "common/memory_budget.hpp"
#include "common/thread_pool.hpp"
#include "planner/analytic_parts.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

double logits_bytes(const LossMemory& memory, double tokens, double vocab_shard) {
  const double chunk = memory.chunk_tokens > 0 ? std::min(tokens, static_cast<double>(memory.chunk_tokens)) : tokens;
  return chunk * vocab_shard * memory.bytes_per_logit;
}

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
double group_GBps(const BoundContext& ctx, const Rates& r, int size, int stride, bool ring_collective) {
  const int per_node = ctx.in.cluster.topology.gpus_per_node();
  if (ctx.in.cluster.nodes <= 1 || size * stride <= per_node) return r.intra;
  if (!ring_collective || r.nic <= 0) return r.inter;
  const double members_per_node = std::max(1, per_node / stride);
  return std::min(r.intra, r.nic * members_per_node);
}
double seconds(double bytes, double GBps) { return GBps > 0 ? bytes / (GBps * 1e9) : 0; }

double optimizer_seconds(const StepInputs& in, double params) {
  const sim::Task step(0, {sim::StreamKind::compute, 0}, false, sim::OptimizerStep{static_cast<std::int64_t>(params * kAdamBytesPerParam)});
  return static_cast<double>(sim::ComputeModel(in.cluster.node, in.cluster.stack).duration_ns(step)) * 1e-9;
}

LayerAttention layer_attention(const BoundContext& ctx, double layers, double micro_batches) {
  const double fwd = ctx.in.model.attention_flops_per_token_fwd(ctx.in.workload.seq_len, true) * ctx.tokens / ctx.gpus / layers / micro_batches;
  return {ctx.attention_s(fwd, false), ctx.attention_s(fwd, true)};
}

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

std::optional<LayerExtras> layer_extras(const StepInputs& in, const LayerSplit& split, bool recompute) {
  if (split.fpdt_chunks > kMostEmittedBlocks || split.cp > kMostEmittedBlocks) return std::nullopt;
  const LayerCompute whole = layer_compute(in, split, recompute, true);
  return LayerExtras{whole.seconds - dense_layer_seconds(in, split, recompute),
                     whole.kernels * in.cluster.stack.host.dispatch_us_per_kernel.value * 1e-6};
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
