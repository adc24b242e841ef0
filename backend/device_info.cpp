#include "backend/device_info.hpp"

#include <cuda_runtime_api.h>

namespace trainyard::backend {

CudaDevices query_cuda_devices() {
  CudaDevices out;
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    out.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return out;
  }
  if (count == 0) out.reason = "cudaGetDeviceCount reported 0 devices";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaError_t err = cudaGetDeviceProperties(&prop, i); err != cudaSuccess) {
      out.reason = "cudaGetDeviceProperties(" + std::to_string(i) + "): " + cudaGetErrorString(err);
      out.devices.clear();
      return out;
    }
    out.devices.push_back({i, prop.name, prop.major, prop.minor, static_cast<std::int64_t>(prop.totalGlobalMem), prop.multiProcessorCount});
  }
  return out;
}

}  // namespace trainyard::backend
