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
    throw InputError("task '" + task.name + "' would take " + format_number(ns * 1e-9) +
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
  ComputeCost c;
  switch (task.kind()) {
    case TaskKind::gemm: {
      const auto& g = std::get<Gemm>(task.params);
      const double m = static_cast<double>(g.m), n = static_cast<double>(g.n), k = static_cast<double>(g.k);
      c.model_flops = c.hardware_flops = 2 * m * n * k;
      c.hbm_bytes = (m * k + k * n + m * n) * dtype_bytes(g.dtype);
      break;
    }
    case TaskKind::attention: {
      const auto& a = std::get<Attention>(task.params);
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
      const auto& e = std::get<Elementwise>(task.params);
      c.hbm_bytes = static_cast<double>(e.bytes_read + e.bytes_written);
      break;
    }
    case TaskKind::optimizer: c.hbm_bytes = static_cast<double>(std::get<OptimizerStep>(task.params).bytes); break;
    default: break;
  }
  if (task.recompute) c.model_flops = 0;
  return c;
}

std::int64_t compute_duration_ns(const Task& task, const hw::GpuProfile& gpu, const hw::NodeProfile& node) {
  const ComputeCost c = compute_cost(task);
  // Work in ns directly (1 GB/s = 1 byte/ns, 1 TFLOP/s = 1000 FLOP/ns) so that round figures stay exact.
  if (is_host(task.device)) {
    TRAINYARD_CHECK(task.kind() == TaskKind::optimizer, "only optimizer steps run on a host");
    return checked_ns(task, std::ceil(c.hbm_bytes / node.host_dram_gbps()));
  }
  double compute_ns = 0;
  if (c.hardware_flops > 0) {
    const bool attention = task.kind() == TaskKind::attention;
    const hw::EfficiencyTable& table = !attention ? gpu.sustained.gemm
                                       : std::get<Attention>(task.params).backward ? gpu.sustained.attention_bwd
                                                                                    : gpu.sustained.attention_fwd;
    const hw::Dtype dtype = attention ? hw::Dtype::bf16 : std::get<Gemm>(task.params).dtype;
    compute_ns = c.hardware_flops / (gpu.peak_tflops(dtype) * 1e3 * table.at(c.hardware_flops));
  }
  const double memory_ns = c.hbm_bytes / (gpu.hbm_gbps.value * gpu.sustained.hbm_efficiency.value);
  return checked_ns(task, std::ceil(std::max(compute_ns, memory_ns)) + gpu.sustained.kernel_launch_ns.value);
}

}  // namespace trainyard::sim
