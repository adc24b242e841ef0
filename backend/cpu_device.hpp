#pragma once
// The CPU device (device.hpp): the executor's schedule run on this machine's cores, as it runs on a GPU.
//   - A stream is a thread with a queue; work runs in the order it was queued on its stream.
//   - An event is a generation counter under a mutex: record() queues "mark generation g complete", wait() queues
//     "block until generation g is complete", so streams order themselves exactly as the schedule's event waits
//     say and no more. A wait the schedule forgot is then a real data race between two threads on the same
//     bytes, which ThreadSanitizer reports (scripts/sanitize.sh tsan runs the executor's tests).
//   - Device memory and pinned memory are both this process's memory; copies are memcpy.
//   - Kernels are the CPU references (kernels/reference.hpp) on bf16 storage: bf16 tensors are widened to float,
//     computed, and rounded back, as the CUDA kernels store them.
// A wait that takes longer than `wait_timeout_s` (a schedule that waits for work never queued, or a stream stuck
// after another failed) and Ctrl-C end the step with an error; the first error a stream meets is rethrown by
// synchronize() and the streams drop the rest of their queues.
#include <cstdint>
#include <memory>

#include "backend/device.hpp"

namespace trainyard::backend {

struct CpuDeviceOptions {
  // The "device memory" the executor may plan for; 0: the machine's available memory at creation.
  std::int64_t memory_bytes = 0;
  double wait_timeout_s = 120;
};

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options = {});

}  // namespace trainyard::backend
