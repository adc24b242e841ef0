#pragma once
// `trainyard calibrate --from-trace TRACE... --out NAME.json`: the GPU profile fitted from the kernels an engine's
// run recorded, not from a sweep of trainyard's own kernels. PyTorch profiler (Kineto) traces taken with
// record_shapes=True tie each kernel to the CPU op that launched it (the kernel's "External id"), and that op's
// "Input Dims" give its work. A call's time is the sum of its op's kernels' durations (cuDNN's attention backward
// is three kernels); each distinct shape is one point, the median of its calls. Each model is fitted in the form
// the simulator computes with (sim/cost_model.hpp), so the profile predicts these calls back:
//  - GEMMs (aten::mm / addmm / bmm / baddbmm, bf16 or fp16 inputs): the efficiency-by-FLOPs curve, fitted as the sweep's is
//    (calibration.hpp), on e = FLOPs / (peak x kernel time x the GEMM's wave efficiency);
//  - attention (the SDPA backends' inner ops: cuDNN's, seen in a real PyTorch 2.11 trace; FlashAttention-2's, from
//    PyTorch's native_functions.yaml): the fused kernel family's model (attention_kernels.cudnn / .flash2): the
//    ceiling at each traced head_dim and, with two shapes or more, the block overhead, by least squares on relative
//    error; the head_dims not traced have their ceilings scaled by the fits' mean ratio;
//  - collectives: NCCL kernels with their metadata (size, group size) as the simulator's ring
//    t = base + steps x step + bytes sent / (efficiency x link rate): a collective library beside the profile.
// Kernel durations are the kernels alone: the simulator adds kernel_launch_ns for the gap between kernels, so no
// launch cost is subtracted here.
// Plain C++: built and tested everywhere.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calibrate/calibrate_peers.hpp"
#include "calibrate/calibration.hpp"
#include "common/json_reader.hpp"
#include "hwprofiles/gpu.hpp"
#include "sim/task_graph.hpp"
#include "traces/kernel_classes.hpp"
#include "traces/kineto.hpp"

namespace trainyard::backend {

struct TraceGemmPoint {
  KernelPoint point;
  sim::Gemm gemm;          // one GEMM of the call (m, n, k)
  std::int64_t batch = 1;  // bmm's batch: the call is `batch` of them
};

struct TraceAttentionPoint {  // one shape: the median seconds per call
  std::string family;         // the profile's attention_kernels entry: "cudnn" or "flash2"
  std::string shape;          // e.g. "attention fwd batch 1, 16 heads (16 K/V) x 128, 8192x8192 causal"
  sim::Attention attention;
  std::int64_t batch = 1;
  double seconds = 0;
  int calls = 0;
};

struct TraceCollectivePoint {  // one (collective, group size, buffer size): the median seconds per call
  std::string collective;      // Kineto's name: "allreduce", "allgather", ...
  int group_size = 0;
  double bytes = 0;  // the full buffer per GPU (the simulator's B)
  double seconds = 0;
  int calls = 0;
};

struct TracePoints {
  std::vector<std::string> origins;  // the trace files
  std::string device_name;           // the first trace's deviceProperties name; "" when none recorded
  std::vector<TraceGemmPoint> gemm;  // by FLOPs
  std::vector<TraceAttentionPoint> attention;
  std::vector<TraceCollectivePoint> collectives;
  std::int64_t calls = 0;          // GEMM and attention calls turned into points
  std::vector<std::string> notes;  // what was read but not used, and why
};

// The points of every rank's trace. `classes` names the GEMM and attention kernels that had no shaped op (they
// are counted in the notes, never silently dropped).
TracePoints trace_points(const std::vector<traces::RankTrace>& ranks, const traces::KernelClassifier& classes);
// The same over a source of ranks (traces::read_each: one trace in memory at a time); the calls' times are kept,
// 8 bytes per call.
TracePoints trace_points(const traces::RankSource& next_rank, const traces::KernelClassifier& classes);

struct AttentionKernelFit {  // one kernel family's pass at one head_dim
  std::string family;
  bool backward = false;
  int head_dim = 0;
  double ceiling = 0, base_ceiling = 0;  // fraction of the bf16 peak: fitted, and the base profile's
  double block_overhead_keys = 0;        // fitted, or the base's when `overhead_fitted` is false
  bool overhead_fitted = false;
  double rms_relative_error = 0;
  std::size_t points = 0;
};

struct TraceFits {
  std::optional<SaturatingFit> gemm;  // none: too few shapes (the base's table kept)
  double gemm_efficiency = 0;         // the GEMM curve at the largest GEMM seen
  std::vector<AttentionKernelFit> attention;
  std::optional<CollectiveCostFit> collectives;  // none: too few sizes
  double link_GBps = 0;                          // the rate the collective fit assumed
  std::string link;                              // which link that is, in words
  std::vector<std::string> notes, warnings;
};
// InputError when nothing at all can be fitted (no shaped GEMM or attention calls, no collective sizes).
TraceFits fit_trace(const TracePoints& points, const hw::GpuProfile& base);

// `base_document` named `name`, with the fitted figures and their measured sources ("trace_gemm",
// "trace_attention_cudnn_fwd", ...: date, the command, the device, the traces), the points and fits under
// "calibration".
json::Json trace_calibrated_profile(const json::Json& base_document, const std::string& name, const TracePoints& points, const TraceFits& fits,
                                    const std::string& command);
// The collective library (trainyard.collectives.v1) of the collective fit: one protocol, "trace".
json::Json trace_collective_library(const std::string& name, const TracePoints& points, const TraceFits& fits, const std::string& command);
// NAME-collectives.json beside NAME.json.
std::string trace_library_path(const std::string& gpu_out);

}  // namespace trainyard::backend
