#pragma once
// How long a compute task takes on a GPU under a software stack, and how many FLOPs it does.
//   GEMM: max(FLOPs / (peak(dtype) * efficiency(FLOPs) * waves), bytes / (HBM bandwidth * HBM efficiency)) + launch,
//     where `waves` is the useful share of the output tiles its waves over the SMs compute (tile and wave
//     quantisation, for GEMMs of a full wave or more)
//   attention: the stack's kernel. Fused kernels (FlashAttention-2/-3, cuDNN; hw::AttentionKernel) work in blocks
//     of query rows; each block runs over its keys (the causal diagonal block whole) plus a fixed overhead, at
//     the kernel's long-sequence fraction of peak for the head_dim. Unfused attention runs two batched GEMMs
//     over the full square of scores and the softmax as HBM passes over them. `calibrated` uses the profile's
//     per-FLOP tables.
//   elementwise: HBM bytes times the stack's passes for the op (an eager RMSNorm moves ~9x a fused one), plus
//     one launch per kernel.
#include <array>
#include <cstdint>

#include "hwprofiles/node.hpp"
#include "sim/task_graph.hpp"
#include "stacks/stack_profile.hpp"

namespace trainyard::sim {

// AdamW reads the fp32 master weights, both moments and the gradient and writes the first three back plus the
// bf16 copy: about 30 bytes of memory traffic per parameter (an OptimizerStep's bytes; calibration's convention).
inline constexpr double kAdamBytesPerParam = 30;

struct ComputeCost {
  double model_flops = 0;     // what MFU counts (attention backward: 2x forward)
  double hardware_flops = 0;  // what the kernel executes (attention backward recomputes the scores: 2.5x)
  double hbm_bytes = 0;       // bytes moved to and from HBM
};

// Attention FLOPs: 4 * head_dim * heads per (query, key) pair that is computed; causal counts only the
// unmasked pairs, with the queries at the last q_len positions of the keys.
double attention_pairs(const Attention& a);
ComputeCost compute_cost(const Task& task);  // a recomputed task counts no model FLOPs
ComputeCost compute_cost(const TaskParams& params);

stacks::ElementwiseClass elementwise_class(OpCode code);

// The parts of the compute model calibrate --from-trace inverts (calibrate/trace_calibration.hpp):
// - a GEMM's useful share of the tiles its waves compute (1 below one full wave); its time is
//   FLOPs / (peak x gemm.at(FLOPs) x gemm_wave_efficiency);
// - a fused attention kernel's work: the key positions its query blocks run over (times the mask's density) and
//   the number of query blocks, each costing the kernel's block_overhead_keys more; its time is
//   block_queries x (key_positions x density + blocks x overhead) x heads x 4 x head_dim (x 2.5 backward) /
//   (peak x ceiling(head_dim)).
double gemm_wave_efficiency(const Gemm& g, const hw::GpuProfile& gpu);
struct AttentionBlockWork {
  double key_positions = 0, blocks = 0;
};
AttentionBlockWork attention_block_work(const Attention& a, double block_queries);

// The GPU and host of one node as a stack drives them; built once per simulation.
class ComputeModel {
 public:
  ComputeModel(const hw::NodeProfile& node, const stacks::StackProfile& stack);
  // Duration in ns of a gemm/attention/elementwise/optimizer task on the GPU (GPU tasks) or on the host
  // (host optimizer steps, bound by host DRAM bandwidth).
  std::int64_t duration_ns(const Task& task) const;
  // Kernels the task launches, each costing the host the stack's dispatch time.
  int kernels(const Task& task) const;
  stacks::AttentionImpl attention_impl() const { return attention_impl_; }
  // The highest fraction of the bf16 peak an attention call reaches, counting its hardware FLOPs (backward 2.5x
  // the forward): what a sound lower bound may assume.
  double attention_best_fraction(bool backward, double head_dim) const;
  const stacks::StackProfile& stack() const { return *stack_; }

 private:
  double attention_ns(const Task& task, const ComputeCost& c) const;
  const hw::NodeProfile* node_;
  const stacks::StackProfile* stack_;
  stacks::AttentionImpl attention_impl_ = stacks::AttentionImpl::calibrated;
  const hw::AttentionKernel* attention_kernel_ = nullptr;  // for the fused implementations
};

// What the engine needs of a compute task when it launches.
struct ComputeTimes {
  ComputeCost cost;  // as compute_cost(params): the caller drops a recomputed task's model FLOPs
  std::int64_t duration_ns = 0;
  int kernels = 1;
};

// ComputeModel's answers with GEMMs memoised by shape: a step repeats a few shapes millions of times, and the
// efficiency lookup (logarithms) otherwise dominates the engine's time. Other tasks are computed each time.
class ComputeMemo {
 public:
  explicit ComputeMemo(const ComputeModel& model) : model_(&model) {}
  ComputeTimes times(const Task& task);

 private:
  ComputeTimes compute(const Task& task) const;
  struct Slot {
    Gemm shape;
    ComputeTimes times;
    bool used = false;
  };
  static constexpr std::size_t kSlots = 64;  // direct-mapped: a collision only costs a recomputation
  const ComputeModel* model_;
  std::array<Slot, kSlots> slots_{};
};

}  // namespace trainyard::sim
