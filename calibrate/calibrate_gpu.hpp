#pragma once
// `trainyard calibrate`, its CUDA half: times the sweep of calibrate/calibration.hpp on one GPU and returns the
// points; fitting them and writing the profile is the plain C++ half's business.
//
// How a point is timed: `warmup_calls` untimed calls (module loading, cuBLASLt's heuristics, page mapping),
// one timed call to size the trials, then `repeats` trials of n back-to-back calls (n chosen so a trial lasts
// about `trial_seconds`, at most `max_calls_per_trial`), timed with a CUDA event pair around them; the point is
// the median over the trials of (elapsed / n). Kernels, pinned and device-to-device copies are enqueued behind
// a blocking kernel (calibrate_kernels.hpp), so the GPU runs them back to back whatever the host's enqueue
// cost; pageable copies are not (the runtime stages them through the host, which is part of their cost).
#include <ostream>
#include <string>

#include "calibrate/calibration.hpp"
#include "backend/device_info.hpp"

namespace trainyard::backend {

// Measures `plan` on `device` (made the current device); `visible_gpus` is how many the process sees (NCCL
// needs several). Progress goes to `progress` when not null. CUDA and cuBLASLt failures throw InternalError
// with file:line.
Measurements measure_on_gpu(const SweepPlan& plan, const CudaDevice& device, int visible_gpus, const std::string& command, std::ostream* progress);

}  // namespace trainyard::backend
