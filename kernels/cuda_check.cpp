#include <cuda_runtime_api.h>

#include <string>

#include "common/error.hpp"
#include "kernels/kernels.hpp"

namespace trainyard::kernels {

void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw InternalError(std::string(call) + " failed: " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status), file, line);
}

}  // namespace trainyard::kernels
