#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "common/units.hpp"
#include "sim/event_queue.hpp"

namespace trainyard::sim {

namespace {
// A duration must fit the simulator's clock; sizes that break it are the graph's fault.
std::int64_t checked_ns(const Task& task, double ns) {
  if (!(ns <= static_cast<double>(kMaxTimeNs))) {
    throw InputError("this " + std::string(to_string(task.kind())) + " on " + device_name(task.device) + " would take " + format_number(ns * 1e-9) +
                     " s, beyond the simulator's time range (about 146 years): check its sizes");
  }
  return static_cast<std::int64_t>(ns);
}
double dtype_bytes(hw::Dtype d) { return d == hw::Dtype::fp32 || d == hw::Dtype::tf32 ? 4 : 2; }
}  // namespace

double attention_pairs(const Attention& a) {
  const double q = static_cast<double>(a.q_len), kv = static_cast<double>(a.kv_len);
  if (!a.causal) return a.density * q * kv;
  // Query i (0-based among the q_len) sits at position kv - q + i and sees keys 0..kv - q + i.
  return a.density * (q * (kv - q) + q * (q + 1) / 2);
}

ComputeCost compute_cost(const Task& task) {
  ComputeCost c = compute_cost(task.params);
  if (task.recompute) c.model_flops = 0;
  return c;
}

ComputeCost compute_cost(const TaskParams& params) {
  ComputeCost c;
  switch (static_cast<TaskKind>(params.index())) {
    case TaskKind::gemm: {
      const auto& g = std::get<Gemm>(params);
      const double m = static_cast<double>(g.m), n = static_cast<double>(g.n), k = static_cast<double>(g.k);
      c.model_flops = c.hardware_flops = 2 * m * n * k;
      c.hbm_bytes = (m * k + k * n + m * n) * dtype_bytes(g.dtype);
      break;
    }
    case TaskKind::attention: {
      const auto& a = std::get<Attention>(params);
      const double fwd = 4 * attention_pairs(a) * a.head_dim * a.heads;
      const double q_bytes = static_cast<double>(a.q_len) * a.heads * a.head_dim * 2;
      const double kv_bytes = static_cast<double>(a.kv_len) * a.kv_heads * a.head_dim * 2;
      if (a.backward) {
        c.model_flops = 2 * fwd;
        c.hardware_flops = 2.5 * fwd;
        c.hbm_bytes = 4 * q_bytes + 4 * kv_bytes;  // read q, o, dO, k, v; write dq, dk, dv
      } else {
        c.model_flops = c.hardware_flops = fwd;
        c.hbm_bytes = 2 * q_bytes + 2 * kv_bytes;  // read q, k, v; write o
      }
      break;
    }
    case TaskKind::elementwise: {
      const auto& e = std::get<Elementwise>(params);
      c.hbm_bytes = static_cast<double>(e.bytes_read + e.bytes_written);
      break;
    }
    case TaskKind::optimizer: c.hbm_bytes = static_cast<double>(std::get<OptimizerStep>(params).bytes); break;
    default: break;
  }
  return c;
}

stacks::ElementwiseClass elementwise_class(OpCode code) {
  switch (code) {
    case OpCode::norm1:
    case OpCode::norm2:
    case OpCode::norm1_bwd:
    case OpCode::norm2_bwd:
    case OpCode::head_norm_bwd: return stacks::ElementwiseClass::norm;
    case OpCode::rope:
    case OpCode::rope_bwd: return stacks::ElementwiseClass::rope;
    case OpCode::act:
    case OpCode::act_bwd: return stacks::ElementwiseClass::activation;
    case OpCode::residual1:
    case OpCode::residual2:
    case OpCode::residual1_bwd:
    case OpCode::residual2_bwd: return stacks::ElementwiseClass::residual;
    case OpCode::head_xent:
    case OpCode::head_xent_shard:
    case OpCode::head_xent_merge: return stacks::ElementwiseClass::loss;
    default: return stacks::ElementwiseClass::other;
  }
}

ComputeModel::ComputeModel(const hw::NodeProfile& node, const stacks::StackProfile& stack) : node_(&node), stack_(&stack) {
  using stacks::AttentionImpl;
  for (AttentionImpl impl : stack.attention.preference) {
    if (impl == AttentionImpl::unfused || impl == AttentionImpl::calibrated) {
      attention_impl_ = impl;
      return;
    }
    const auto& kernels = node.gpu.sustained.attention_kernels;
    if (auto it = kernels.find(std::string(stacks::to_string(impl))); it != kernels.end()) {
      attention_impl_ = impl;
      attention_kernel_ = &it->second;
      return;
    }
  }
}

namespace {
// Key positions the query blocks of one head run over, summed over blocks: with causal masking block i stops
// at its last query's position (the diagonal block is computed whole); a partial last block costs a whole one.
double block_keys(const Attention& a, double block) {
  const double q = static_cast<double>(a.q_len), kv = static_cast<double>(a.kv_len);
  const double blocks = std::ceil(q / block);
  if (!a.causal) return blocks * kv;
  const double whole = std::floor(q / block);  // blocks that end inside the queries
  return whole * (kv - q) + block * whole * (whole + 1) / 2 + (blocks - whole) * kv;
}

}  // namespace

// Useful share of the tiles a GEMM's waves compute: partial tiles at the edges and a partial last wave cost whole
// ones. Only for GEMMs of at least one full wave: below that cuBLAS picks split-K or smaller tiles, and the
// profile's efficiency-by-FLOPs curve stands for them.
double gemm_wave_efficiency(const Gemm& g, const hw::GpuProfile& gpu) {
  const double rows = gpu.sustained.gemm_tile_rows.value, cols = gpu.sustained.gemm_tile_cols.value;
  if (rows <= 0 || cols <= 0) return 1;
  const double m = static_cast<double>(g.m), n = static_cast<double>(g.n), sms = gpu.sm_count.value;
  const double tiles = std::ceil(m / rows) * std::ceil(n / cols);
  if (tiles < sms) return 1;
  return m * n / (std::ceil(tiles / sms) * sms * rows * cols);
}

AttentionBlockWork attention_block_work(const Attention& a, double block_queries) {
  return {block_keys(a, block_queries), std::ceil(static_cast<double>(a.q_len) / block_queries)};
}

double ComputeModel::attention_ns(const Task& task, const ComputeCost& c) const {
  const auto& a = std::get<Attention>(task.params);
  const hw::GpuProfile& gpu = node_->gpu;
  const double peak_per_ns = gpu.peak_tflops(hw::Dtype::bf16) * 1e3;
  if (attention_kernel_ != nullptr) {
    const auto& pass = a.backward ? attention_kernel_->backward : attention_kernel_->forward;
    const double block = attention_kernel_->block_queries.value;
    const AttentionBlockWork work = attention_block_work(a, block);
    const double pairs = block * (work.key_positions * a.density + work.blocks * pass.block_overhead_keys.value) * a.heads;
    const double flops = pairs * 4 * a.head_dim * (a.backward ? 2.5 : 1.0);
    return flops / (peak_per_ns * pass.ceiling(a.head_dim));
  }
  if (attention_impl_ == stacks::AttentionImpl::unfused) {
    // Every score of the square is computed and goes through HBM: forward QK^T and PV, backward dV, dP, dQ, dK.
    const double scores = static_cast<double>(a.q_len) * static_cast<double>(a.kv_len) * a.heads;
    const int gemms = a.backward ? 4 : 2;
    const double gemm_flops = 2.0 * scores * a.head_dim;
    const double gemm_ns = gemms * gemm_flops / (peak_per_ns * gpu.sustained.gemm.at(gemm_flops));
    const double passes = a.backward ? stack_->attention.softmax_passes_backward.value : stack_->attention.softmax_passes_forward.value;
    return gemm_ns + 2 * scores * passes / (gpu.hbm_GBps.value * gpu.sustained.hbm_efficiency.value);
  }
  const hw::EfficiencyTable& table = a.backward ? gpu.sustained.attention_bwd : gpu.sustained.attention_fwd;
  return c.hardware_flops / (peak_per_ns * table.at(c.hardware_flops));
}

double ComputeModel::attention_best_fraction(bool backward, double head_dim) const {
  const hw::GpuProfile& gpu = node_->gpu;
  if (attention_kernel_ != nullptr) return (backward ? attention_kernel_->backward : attention_kernel_->forward).ceiling(head_dim);
  // Unfused: at least the GEMMs over the square, 2 (forward) or 4 (backward) x 2 x head_dim per score, against
  // 4 and 10 x head_dim per unmasked pair counted as hardware FLOPs.
  if (attention_impl_ == stacks::AttentionImpl::unfused) return gpu.sustained.gemm.best() / (backward ? 0.8 : 1.0);
  return (backward ? gpu.sustained.attention_bwd : gpu.sustained.attention_fwd).best();
}

int ComputeModel::kernels(const Task& task) const {
  if (task.kind() == TaskKind::elementwise) {
    const stacks::ElementwiseCost* e = stack_->elementwise(elementwise_class(task.op.code));
    return e != nullptr ? static_cast<int>(e->kernels.value) : 1;
  }
  if (task.kind() == TaskKind::attention && attention_impl_ == stacks::AttentionImpl::unfused) {
    const auto& a = std::get<Attention>(task.params);
    return (a.backward ? 4 : 2) +
           static_cast<int>(a.backward ? stack_->attention.softmax_passes_backward.value : stack_->attention.softmax_passes_forward.value);
  }
  return 1;
}

std::int64_t ComputeModel::duration_ns(const Task& task) const {
  const ComputeCost c = compute_cost(task);
  const hw::GpuProfile& gpu = node_->gpu;
  // Work in ns directly (1 GB/s = 1 byte/ns, 1 TFLOP/s = 1000 FLOP/ns) so that round figures stay exact.
  if (is_host(task.device)) {
    TRAINYARD_CHECK(task.kind() == TaskKind::optimizer, "only optimizer steps run on a host");
    return checked_ns(task, std::ceil(c.hbm_bytes / node_->host_dram_GBps()));
  }
  double compute_ns = 0, hbm_bytes = c.hbm_bytes;
  if (task.kind() == TaskKind::attention) {
    compute_ns = attention_ns(task, c);
  } else if (c.hardware_flops > 0) {
    const Gemm& g = std::get<Gemm>(task.params);
    compute_ns = c.hardware_flops / (gpu.peak_tflops(g.dtype) * 1e3 * gpu.sustained.gemm.at(c.hardware_flops) * gemm_wave_efficiency(g, gpu));
  }
  if (task.kind() == TaskKind::elementwise) {
    if (const stacks::ElementwiseCost* e = stack_->elementwise(elementwise_class(task.op.code))) hbm_bytes *= e->hbm_passes.value;
  }
  double memory_GBps = gpu.hbm_GBps.value * gpu.sustained.hbm_efficiency.value;
  const double own_GBps = task.kind() == TaskKind::elementwise ? gpu.sustained.elementwise_GBps.value
                          : task.kind() == TaskKind::optimizer ? gpu.sustained.optimizer_GBps.value
                                                               : 0;
  if (own_GBps > 0) memory_GBps = own_GBps;  // measured for these kernels (calibrate --device cpu)
  const double memory_ns = hbm_bytes / memory_GBps;
  const double launch_ns = kernels(task) * gpu.sustained.kernel_launch_ns.value;
  return checked_ns(task, std::ceil(std::max(compute_ns, memory_ns)) + launch_ns);
}

ComputeTimes ComputeMemo::compute(const Task& task) const { return {compute_cost(task.params), model_->duration_ns(task), model_->kernels(task)}; }

ComputeTimes ComputeMemo::times(const Task& task) {
  const Gemm* g = std::get_if<Gemm>(&task.params);
  if (g == nullptr || is_host(task.device)) return compute(task);
  const std::uint64_t mix = static_cast<std::uint64_t>(g->m) * 0x9E3779B97F4A7C15ULL ^ static_cast<std::uint64_t>(g->n) * 0xC2B2AE3D27D4EB4FULL ^
                            static_cast<std::uint64_t>(g->k) * 0x165667B19E3779F9ULL ^ static_cast<std::uint64_t>(g->dtype);
  Slot& slot = slots_[(mix >> 32) % kSlots];
  const bool hit = slot.used && slot.shape.m == g->m && slot.shape.n == g->n && slot.shape.k == g->k && slot.shape.dtype == g->dtype;
  if (!hit) slot = {*g, compute(task), true};
  return slot.times;
}

}  // namespace trainyard::sim
