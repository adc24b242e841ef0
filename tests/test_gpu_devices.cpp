// Runs only where a GPU is usable; elsewhere each test skips and says why (never a silent pass).
#include <gtest/gtest.h>

#include "backend/device_info.hpp"

namespace trainyard::backend {

TEST(GpuDevices, EnumeratesUsableDevices) {
  const CudaDevices found = query_cuda_devices();
  if (found.devices.empty()) GTEST_SKIP() << "no usable CUDA GPU: " << found.reason;
  for (const auto& d : found.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.compute_capability_major, 7);
    EXPECT_GT(d.memory_bytes, std::int64_t{1} << 30);
    EXPECT_GT(d.sm_count, 0);
  }
}

TEST(GpuDevices, NoGpuComesWithAReason) {
  const CudaDevices found = query_cuda_devices();
  if (!found.devices.empty()) GTEST_SKIP() << "a GPU is present: the no-GPU path is exercised on machines without one";
  EXPECT_FALSE(found.reason.empty());
}

}  // namespace trainyard::backend
