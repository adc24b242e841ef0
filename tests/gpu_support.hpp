#pragma once
// Helpers for the GPU tests: skip with the reason when there is no usable GPU, device buffers poisoned before use
// (every byte 0xFF: NaN in fp32 and bf16), bf16 conversions and a comparison that never lets NaN pass.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/device_info.hpp"
#include "kernels/kernels.hpp"

namespace trainyard::test {

#define TRAINYARD_REQUIRE_GPU()                                                        \
  do {                                                                                 \
    const auto found = ::trainyard::backend::query_cuda_devices();                     \
    if (found.devices.empty()) GTEST_SKIP() << "no usable CUDA GPU: " << found.reason; \
  } while (0)

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    TRAINYARD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(1, n) * sizeof(T)));
    TRAINYARD_CUDA_CHECK(cudaMemset(ptr_, 0xFF, std::max<std::size_t>(1, n) * sizeof(T)));  // poison
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& host) { TRAINYARD_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    TRAINYARD_CUDA_CHECK(cudaDeviceSynchronize());
    TRAINYARD_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() { return ptr_; }
  const T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

// Random values already representable in bf16 (so CPU and GPU start from the same numbers).
inline std::vector<float> random_bf16_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (auto& x : out) x = kernels::round_bf16(dist(rng));
  return out;
}
inline std::vector<std::uint16_t> bits(const std::vector<float>& x) {
  std::vector<std::uint16_t> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = kernels::to_bf16(x[i]);
  return out;
}
inline std::vector<float> floats(const std::vector<std::uint16_t>& x) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = kernels::from_bf16(x[i]);
  return out;
}

// Every value finite and within abs_tol + rel_tol * |expected| of the reference; reports the worst miss.
inline ::testing::AssertionResult close_to(const std::vector<float>& got, const std::vector<float>& expected, double abs_tol, double rel_tol) {
  if (got.size() != expected.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << expected.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], e = expected[i];
    if (!std::isfinite(g) && std::isfinite(e)) return ::testing::AssertionFailure() << "element " << i << " is " << g << ", expected " << e;
    if (std::abs(g - e) > abs_tol + rel_tol * std::abs(e)) {
      return ::testing::AssertionFailure() << "element " << i << ": " << g << " vs " << e << " (tolerance " << abs_tol << " + " << rel_tol
                                           << " relative)";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace trainyard::test
