#pragma once
// `trainyard calibrate --device cpu`: times the sweep of calibrate/calibration.hpp through the executor's Device
// interface (device.hpp) on the CPU device, so the profile it writes describes the kernels, copies and queueing
// the executor really uses there; fitting and writing are calibration.hpp's, as for a GPU.
//
// How a point is timed: `warmup_calls` untimed calls, one timed call to size the trials, then `repeats` trials of n
// back-to-back calls on one stream (n chosen so a trial lasts about `trial_seconds`, at most
// `max_calls_per_trial`) between two of the device's events; the point is the median over the trials of
// (elapsed / n). Each trial is queued behind a gate (a fill on a stream of its own that the timed stream waits for,
// sized to outlast the host's queueing), as the CUDA sweep queues behind a blocking kernel (calibrate_gpu.hpp): so
// the stream runs the calls back to back, as the executor's streams run a step queued ahead of them, rather than
// sleeping and waking between calls. Pageable copies are the same memcpy as pinned ones here (both buffers are this
// process's memory); both are measured, as the fit wants both series.
#include <ostream>
#include <string>

#include "calibrate/calibration.hpp"
#include "backend/device.hpp"

namespace trainyard::backend {

// Device (or pinned) memory for a sweep, filled with `byte` (0x3C3C as bf16 is 0.0115: finite products, nothing
// denormal), released when it goes. The ranks' sweep (calibrate_peers.hpp) uses it too.
class SweepBuffer {
 public:
  SweepBuffer(Device& d, std::int64_t bytes, int byte, bool pinned = false) : d_(d), pinned_(pinned) {
    p_ = pinned ? d.allocate_pinned(bytes) : d.allocate(bytes);
    d.fill(p_, byte, bytes);
  }
  ~SweepBuffer() { pinned_ ? d_.release_pinned(p_) : d_.release(p_); }
  SweepBuffer(const SweepBuffer&) = delete;
  SweepBuffer& operator=(const SweepBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  Device& d_;
  bool pinned_;
  void* p_ = nullptr;
};

// The CPU device's sweep: the shapes of the small models it runs (hidden 32-256, chunks of 16-256 tokens),
// attention with 4 heads on 2 K/V heads of width 16, copies of 16 KiB to 16 MiB, the elementwise kernels and
// AdamW (their own rates: the reference loops run far below a copy's); about 22 s on a 2-core machine.
SweepPlan cpu_sweep();

Measurements measure_on_device(const SweepPlan& plan, Device& device, const std::string& description, const std::string& command,
                               std::ostream* progress);

}  // namespace trainyard::backend
