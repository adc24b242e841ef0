#pragma once
// The two device helpers `trainyard calibrate` times with (calibrate/calibrate_kernels.cu): a kernel that holds a
// stream until the host says go, so that a trial's calls are all enqueued before the first one starts and the
// host's enqueue cost stays out of the timing (the method of NVIDIA's nvbench), and an empty kernel whose cost
// back to back is the launch overhead.
#include <cuda_runtime_api.h>

namespace trainyard::backend {

// One thread spins until *release (host memory mapped for the device) is non-zero, or until `timeout_ns` has
// passed by the GPU's global timer; then it writes 1 to *timed_out. Launch errors throw InternalError.
void launch_stream_blocker(const volatile int* release, int* timed_out, unsigned long long timeout_ns, cudaStream_t stream);
void launch_empty_kernel(cudaStream_t stream);

}  // namespace trainyard::backend
