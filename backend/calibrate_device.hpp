#pragma once
// `trainyard calibrate --device cpu`: times the sweep of backend/calibration.hpp through the executor's Device
// interface (device.hpp) on the CPU device, so the profile it writes describes the kernels, copies and queueing
// the executor really uses there; fitting and writing are calibration.hpp's, as for a GPU.
//
// How a point is timed: `warmup_calls` untimed calls, one timed call to size the trials, then `repeats` trials of n
// back-to-back calls on one stream (n chosen so a trial lasts about `trial_seconds`, at most
// `max_calls_per_trial`) between two of the device's events; the point is the median over the trials of
// (elapsed / n). Queueing a call costs microseconds against the milliseconds of the references' kernels, so no
// blocking kernel is needed (the CUDA sweep, calibrate_gpu.hpp, has one). Pageable copies are the same memcpy as
// pinned ones here (both buffers are this process's memory); both are measured, as the fit wants both series.
#include <ostream>
#include <string>

#include "backend/calibration.hpp"
#include "backend/device.hpp"

namespace trainyard::backend {

// The CPU device's sweep: the shapes of the small models it runs (hidden 32-256, chunks of 16-256 tokens),
// attention with 4 heads on 2 K/V heads of width 16, copies of 16 KiB to 16 MiB; about 17 s on a 2-core machine.
SweepPlan cpu_sweep();

Measurements measure_on_device(const SweepPlan& plan, Device& device, const std::string& description, const std::string& command,
                               std::ostream* progress);

}  // namespace trainyard::backend
