#pragma once
// `trainyard calibrate`, its plain C++ half: the sweep to measure, what the GPU measurements record, the least-
// squares fits (Eigen) that turn them into a GPU profile's sustained figures, and writing that profile. No CUDA
// here (calibrate/calibrate_gpu.hpp measures), so the fits and the profile are built and tested everywhere.
//
// The two curves fitted:
//  - a transfer of x bytes, or x kernels back to back:   t(x) = fixed_s + x * per_unit_s
//    (the latency-bandwidth model), by linear least squares on relative residuals (each row divided by its
//    measured t, so a 64 KiB copy weighs as much as a 1 GiB one). 1 / per_unit_s is the sustained bandwidth;
//    for kernels, per_unit_s is the cost of one more kernel on the stream.
//  - the fraction of peak a kernel call of F FLOPs reaches:   e(F) = e_max / (1 + (F_half / F)^p)
//    a saturating (Hill) curve: e_max the large-call ceiling, F_half the FLOPs where half of it is reached, p how
//    sharply it rises. p = 1 is exactly "fixed overhead + peak rate" (t = t0 + F / (e_max * peak), F_half =
//    t0 * e_max * peak), the usual first model of a kernel; p lets the rise be steeper (wave quantization) or
//    gentler. Fitted by Gauss-Newton with Levenberg-Marquardt damping on log(e) (relative errors in time),
//    started from the p = 1 line fitted as above; three parameters, so a handful of shapes pins it down.
//
// The simulator computes a call's time as FLOPs / (peak * e(FLOPs)) + kernel_launch_ns (sim/cost_model.hpp),
// so a measured call of t seconds is the point e = FLOPs / (peak * (t - launch)); points whose time is mostly
// launch cost say nothing about throughput and are left out of the fit (counted in the record).
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/json_reader.hpp"
#include "hwprofiles/gpu.hpp"
#include "kernels/reference.hpp"

namespace trainyard::backend {

// ---- the sweep -------------------------------------------------------------------------------------------

struct GemmShape {  // row-major C[m][n] = op(A) op(B), bf16 in and out, fp32 accumulation (kernels::Gemm)
  int m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = true;  // the layer's forward is C = X W^T
};
struct AttentionCase {  // one chunk pair of `length` queries and `length` keys
  int length = 0;
  bool causal = true;  // the diagonal pair (half the pairs computed); false: an earlier chunk (all of them)
};

struct SweepPlan {
  std::string name;  // "full" or "quick"
  std::vector<GemmShape> gemm;
  int attention_heads = 32, attention_kv_heads = 8, attention_head_dim = 128;  // Llama-3 8B's attention
  std::vector<AttentionCase> attention;
  std::vector<std::int64_t> copy_bytes;  // H2D and D2H, pinned and pageable, one and both directions
  std::vector<std::int64_t> d2d_bytes;   // device-to-device copies
  std::vector<int> launch_counts;        // empty kernels back to back
  // Elementwise kernels (RMSNorm, SwiGLU, add, RoPE) on this many elements each, and AdamW on this many
  // parameters; empty: not measured (the GPU's fused kernels stream near the copy rate the profile has).
  std::vector<std::int64_t> elementwise_elements, optimizer_params;
  int warmup_calls = 2;           // untimed, before anything is timed (and module loading)
  int repeats = 7;                // timed trials per point; the median is kept
  double trial_seconds = 0.004;   // a trial repeats the call until it lasts about this long...
  int max_calls_per_trial = 100;  // ...but enqueues at most this many calls behind the blocking kernel
  double max_call_seconds = 1.0;  // a call slower than this ends its series (larger ones are skipped)
};
// The sweeps. Estimated on the built-in H100 SXM profile (estimated_seconds, 10 s of setup included): full about
// 37 s (11 GEMM squares 128..16384 and 20 layer shapes, 14 attention pairs 256..16K each way, 15 copy sizes
// 64 KiB..1 GiB in five series, 11 device-to-device sizes, 6 launch counts; 11 trials of ~25 ms per point), quick
// about 11 s. The limit is 5 minutes: the margin absorbs kernels slower than the profile says.
SweepPlan full_sweep();
SweepPlan quick_sweep();
// What the sweep should take on `gpu` if the profile's figures hold: every point's warm-up, estimate and trials,
// plus a fixed allowance for the CUDA context, cuBLASLt and the host buffers. Sizes the sweeps (tested).
double estimated_seconds(const SweepPlan& plan, const hw::GpuProfile& gpu);

// FLOPs of one call in the simulator's convention (sim::compute_cost): 2mnk for a GEMM; for attention
// 4 * pairs * head_dim * heads forward, 2.5x that backward (the scores are recomputed).
double gemm_flops(const GemmShape& shape);
double attention_flops(const SweepPlan& plan, const AttentionCase& c, bool backward);

// ---- what the GPU measurements record --------------------------------------------------------------------

struct KernelPoint {  // one shape: its FLOPs and the median seconds per call
  std::string shape;  // e.g. "gemm 4096x4096x4096 B^T", "attention 8192 causal"
  double flops = 0;
  double seconds = 0;
};
struct CopyPoint {  // one size: bytes per transfer (per direction) and the median seconds per transfer
  double bytes = 0;
  double seconds = 0;
};
struct LaunchPoint {  // `kernels` empty kernels back to back and the median seconds from the first to the last
  int kernels = 0;
  double seconds = 0;
};

struct DeviceDescription {
  int index = 0;
  std::string name;  // cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;
  int compute_capability_major = 0, compute_capability_minor = 0;
  int sm_count = 0;
  std::int64_t memory_bytes = 0;
  std::string driver_version, runtime_version;  // "13.0"
  int visible_gpus = 1;
  std::string describe() const;  // "NVIDIA H100 80GB HBM3 (GPU 0 of 1, 0000:1b:00.0, sm_90, 132 SMs, CUDA driver 13.0)"
};

struct Measurements {
  DeviceDescription device;
  std::string started_utc;      // "2026-03-01T12:34:56Z"
  std::string command;          // the command line that ran
  std::string method;           // how a point was timed, for the sources' basis
  std::string sweep;            // "full" or "quick"
  std::string attention_shape;  // "32 heads, 8 K/V heads, head_dim 128"
  double duration_s = 0;
  std::vector<KernelPoint> gemm, attention_fwd, attention_bwd;
  std::vector<std::string> skipped;      // points not measured and why
  std::vector<LaunchPoint> launch;       // enqueued behind a blocking kernel: the GPU's cost per kernel
  std::vector<LaunchPoint> launch_host;  // enqueued while the GPU is idle: bound by the host's launch rate
  std::vector<CopyPoint> h2d_pinned, d2h_pinned, h2d_pageable, d2h_pageable;
  std::vector<CopyPoint> h2d_both, d2h_both;  // pinned, both directions at once (bytes per direction)
  std::vector<CopyPoint> d2d;                 // bytes copied (HBM traffic is twice that: read and write)
  // Bytes as the simulator counts them for the call (an elementwise task's read + written; the optimizer step's
  // sim::kAdamBytesPerParam per parameter) and the median seconds per call; empty where not measured.
  std::vector<CopyPoint> elementwise, optimizer;
  bool nccl_measured = false;
  std::string nccl_note;  // why NCCL was not measured, or what was
};

// The sweeps' small helpers (the CUDA and the CPU device's measurements share them).
double median_of(std::vector<double> values);  // InternalError for none
std::string utc_now();                         // "2026-03-01T12:34:56Z"
// A sweep's record before its first point: started now (utc_now), by `command`, the plan's name and attention shape.
Measurements start_measurements(const SweepPlan& plan, const std::string& command);
// One case's shape as the attention kernels take it, and its label in the measurement records (both sweeps).
kernels::AttentionShape attention_shape(const SweepPlan& plan, const AttentionCase& c);
std::string attention_label(const AttentionCase& c);

// ---- fits ------------------------------------------------------------------------------------------------

struct LinearCostFit {  // t(x) = fixed_s + x * per_unit_s
  double fixed_s = 0, per_unit_s = 0;
  double rms_relative_error = 0;  // of the fitted times against the measured ones
  std::size_t points = 0;
  double at(double x) const { return fixed_s + x * per_unit_s; }
};
// (x, seconds) pairs, x > 0 and seconds > 0, at least 3 distinct x. `what` names the series in errors
// (InputError "calibration measurements: field '<what>[i]' ...").
LinearCostFit fit_linear_cost(std::span<const std::pair<double, double>> x_seconds, const std::string& what);

struct SaturatingCurve {  // e(F) = e_max / (1 + (flops_half / F)^exponent)
  double e_max = 0, flops_half = 0, exponent = 1;
  double at(double flops) const;
};
struct SaturatingFit {
  SaturatingCurve curve;
  double rms_log_error = 0;  // rms of ln(measured e / fitted e): ~ the relative error in time
  std::size_t points = 0;
  double flops_min = 0, flops_max = 0;  // the range of the points fitted
};
// (FLOPs, efficiency) pairs, both > 0, at least 4 points over at least 3 distinct FLOP counts.
SaturatingFit fit_saturating(std::span<const std::pair<double, double>> flops_efficiency, const std::string& what);

// Kernel points as (FLOPs, e = FLOPs / (peak * (seconds - launch))), without those whose time is mostly launch
// cost (seconds - launch < 20% of seconds); `dropped` counts them. Non-positive FLOPs or seconds are errors.
std::vector<std::pair<double, double>> efficiency_points(std::span<const KernelPoint> points, double peak_flops_per_s, double launch_s,
                                                         const std::string& what, std::size_t* dropped);

struct CalibrationFits {
  LinearCostFit launch, launch_host;
  LinearCostFit h2d_pinned, d2h_pinned, h2d_pageable, d2h_pageable, h2d_both, d2h_both, d2d;
  SaturatingFit gemm, attention_fwd, attention_bwd;
  std::optional<LinearCostFit> elementwise, optimizer;  // where measured: the profile's elementwise_GBps, optimizer_GBps
  std::size_t gemm_dropped = 0, attention_fwd_dropped = 0, attention_bwd_dropped = 0;
  // The profile's figures.
  double kernel_launch_ns = 0;
  double gemm_efficiency = 0;                   // the GEMM curve at the largest GEMM measured
  double hbm_efficiency = 0;                    // 2 x the device-to-device copy rate / the profile's hbm_GBps
  double pcie_h2d_GBps = 0, pcie_d2h_GBps = 0;  // pinned
  std::vector<std::string> warnings;            // e.g. efficiencies above 1 clipped
};
// Fits every series. Throws InputError when a series is missing or unusable, and when a figure contradicts the
// base profile (a copy faster than its PCIe link, HBM faster than its datasheet: the wrong base profile).
CalibrationFits fit_calibration(const Measurements& m, const hw::GpuProfile& base);

// ---- the profile -----------------------------------------------------------------------------------------

// The efficiency table written for a fit: the curve at 10 points per decade (FLOPs 1, 1.26, 1.58, 2, 2.51, ...
// x 10^k) over the range measured, from the grid point at or below the smallest call to the one at or above the
// largest; values clipped to [1e-6, 1]. Ten per decade keeps the simulator's interpolation (linear in log FLOPs)
// within ~1% of the curve where it rises. Not extrapolated further: the simulator clamps outside the table, and
// below the smallest measured call a curve with p > 1 would predict calls slower than larger ones.
std::vector<std::pair<double, double>> curve_table(const SaturatingFit& fit);

// Pieces of a calibrated profile, shared by the sweep's (below) and the trace's (trace_calibration.hpp).
inline constexpr const char* kCurveTableBasis = "; the table is the curve at 10 points per decade over the FLOPs measured (clamped outside it)";
std::string describe_curve(const SaturatingFit& fit);        // "e(F) = ... e_max = ..., rms error ...% over N points"
json::Json efficiency_table_json(const SaturatingFit& fit);  // curve_table as [[FLOPs, e], ...]
json::Json kernel_points_json(std::span<const KernelPoint> points);
json::Json saturating_json(const SaturatingFit& fit, std::size_t dropped);
// Removes the "sources" entries no figure or table refers to any more (the estimates a calibration replaced).
void drop_unreferenced_sources(json::Json& doc);
// A "measured" source: when, by which command, on what, and how it was measured and fitted.
json::Json measured_source(const std::string& date, const std::string& command, const std::string& device, const std::string& basis);
// NAME<suffix> beside NAME.json, for the files a calibration writes next to its GPU profile ("-node.json", ...).
std::string path_beside(const std::string& gpu_out, const std::string& suffix);

// `base_document` (trainyard.gpu.v1) named `name`, with its sustained figures and tables replaced by the fitted
// ones, each with a measured source (date, command, device, basis: how it was measured and fitted), sources
// nothing refers to any more dropped, and the points, fits and NCCL status under "calibration".
json::Json calibrated_profile(const json::Json& base_document, const std::string& name, const Measurements& m, const CalibrationFits& fits);

// NAME of --out NAME.json (InputError naming --out unless it ends in .json with a non-empty name).
std::string profile_name_from_path(const std::string& out_path);
// Makes --out's folder (if missing) and checks a file can be written there (common/atomic_file's check_writable),
// before anything is measured.
void check_output_path(const std::string& out_path);

// Fits `m`, builds the profile on `base_document`, lets `amend` add to it (the ranks' link, calibrate_peers.hpp),
// checks it loads (hw::parse_gpu) and writes it to `out_path` with common/atomic_file. Nothing is written when any
// step fails.
CalibrationFits write_calibrated_profile(const Measurements& m, const json::Json& base_document, const std::string& base_origin,
                                         const std::string& out_path, const std::function<void(json::Json&)>& amend = nullptr);

// The built-in profile a CUDA device name is, e.g. "NVIDIA H100 80GB HBM3" -> "h100-sxm"; none for devices
// without one (H100 NVL, A100 40GB PCIe, ...): --base then says which profile to start from.
std::optional<std::string> builtin_gpu_for_device(std::string_view device_name);

}  // namespace trainyard::backend
