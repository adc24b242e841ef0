#pragma once
// A GPU model as described by hwprofiles/gpus/*.json: datasheet peaks, and separately the sustained figures
// that calibration measures. Every figure keeps its source.
#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/json_reader.hpp"
#include "hwprofiles/dtype.hpp"

namespace trainyard::hw {

using json::Figure;

// Raw PCIe bandwidth per direction in GB/s for a generation and lane count (after line encoding:
// 8b/10b for Gen1-2, 128b/130b for Gen3-5), e.g. Gen4 x16 = 31.5 GB/s.
double pcie_GBps_per_direction(int generation, int lanes);

// Profile keys of bandwidths say their unit: GB/s, gigabytes per second, as `_GBps`. The keys before that
// spelling (`_gbps`, which reads as gigabits: a 400 Gb/s NIC typed as 400 would be 8x too fast) are refused with
// the new name: an InputError on `reader`'s `old_key` when it is present.
void refuse_old_bandwidth_key(const json::Reader& reader, std::string_view old_key, std::string_view new_key);

// Achieved fraction of the bf16 dense peak as a function of a kernel call's FLOPs, interpolated linearly in
// log10(FLOPs) between measured or estimated points and clamped at both ends.
struct EfficiencyTable {
  std::vector<std::pair<double, double>> points;  // (FLOPs, fraction of peak), FLOPs strictly increasing
  std::string source_id;
  json::Source source;
  double at(double flops) const;
  double best() const;  // the highest fraction any call reaches
};

// A fused attention kernel family (FlashAttention-2, FlashAttention-3, cuDNN's fused attention) as published for
// this GPU. Per pass: the fraction of the bf16 peak the kernel sustains on long sequences, by head_dim, and the
// fixed work of each thread block (loading its query tile, writing the output and log-sum-exp, or in backward
// its dK/dV) as key positions' worth of tile work. With tiles of `block_queries` rows that makes short
// sequences slow and the causal diagonal (computed whole, half masked) visible, without a per-length table.
struct AttentionKernel {
  struct Pass {
    std::vector<std::pair<double, double>> ceiling_by_head_dim;  // (head_dim, fraction of bf16 peak), increasing
    std::string source_id;
    json::Source source;
    Figure block_overhead_keys;
    // Interpolated linearly in log2(head_dim), clamped at both ends.
    double ceiling(double head_dim) const;
  };
  Figure block_queries;
  Pass forward, backward;
};

struct GpuProfile {
  std::string name;
  std::string description;
  std::string origin;                       // the file it came from
  std::array<Figure, 4> peak_dense_tflops;  // indexed by Dtype
  Figure hbm_bytes;
  Figure hbm_GBps;
  Figure sm_count;
  Figure pcie_generation;
  Figure pcie_lanes;
  Figure nvlink_GBps_per_direction;  // 0: no NVLink
  struct Sustained {
    Figure gemm_efficiency;  // fraction of the bf16 dense peak that large GEMMs reach
    Figure hbm_efficiency;   // fraction of hbm_GBps that streaming kernels reach
    Figure pcie_h2d_GBps;    // pinned host-to-device copies
    Figure pcie_d2h_GBps;    // pinned device-to-host copies
    EfficiencyTable gemm;    // by the call's FLOPs
    EfficiencyTable attention_fwd;
    EfficiencyTable attention_bwd;
    Figure kernel_launch_ns;  // fixed cost per kernel on a stream
    // The output tile one SM computes in a large bf16 GEMM: a GEMM runs in waves of sm_count tiles, and a last
    // partial wave costs a whole one (wave quantisation). 0: not modelled.
    Figure gemm_tile_rows, gemm_tile_cols;
    // The thread blocks a running NCCL collective keeps on each member GPU, one per channel: GEMM and attention
    // kernels that overlap it run on the other SMs, at (sm_count - collective_ctas) / sm_count of their rate.
    // 0 (absent): not modelled.
    Figure collective_ctas;
    // The data rate NVLink transfers reach per direction (protocol overhead off the signalling rate); when the
    // profile has none (value 0) the datasheet rate is used.
    Figure nvlink_GBps_per_direction;
    // The rates the device's elementwise kernels (norms, RoPE, activations, residuals, the loss) and its optimizer
    // step move the bytes the simulator counts for them, where they run slower than streaming copies (the CPU
    // device's reference loops, as `calibrate --device cpu` measures them). 0 (absent): hbm_GBps x hbm_efficiency.
    Figure elementwise_GBps, optimizer_GBps;
    // Published fused attention kernels by implementation name ("flash2", "flash3", "cudnn"); a stack's
    // attention runs on the first of its implementations found here, else on the `attention_*` tables above.
    std::map<std::string, AttentionKernel> attention_kernels;
  } sustained;

  double peak_tflops(Dtype dtype) const { return peak_dense_tflops[static_cast<int>(dtype)].value; }
  // The NVLink rate links are simulated at: the sustained figure where the profile has one, else the datasheet's.
  double nvlink_data_GBps() const {
    return sustained.nvlink_GBps_per_direction.value > 0 ? sustained.nvlink_GBps_per_direction.value : nvlink_GBps_per_direction.value;
  }
  double pcie_raw_GBps_per_direction() const;
  // Arithmetic intensity (FLOP per HBM byte) above which a kernel is compute-bound at peak.
  double ridge_flop_per_byte(Dtype dtype) const;
};

GpuProfile parse_gpu(const json::Json& document, const std::string& origin);

}  // namespace trainyard::hw
