#pragma once
// What CUDA devices this process can use. Without a driver, cudaGetDeviceCount returns an error rather than
// 0: any error there means "no GPU", and `reason` says which error it was.
#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::backend {

struct CudaDevice {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  std::int64_t memory_bytes = 0;
  int sm_count = 0;
};

struct CudaDevices {
  std::vector<CudaDevice> devices;
  std::string reason;  // why `devices` is empty, e.g. "cudaGetDeviceCount: no CUDA-capable device is detected"
};

CudaDevices query_cuda_devices();

}  // namespace trainyard::backend
