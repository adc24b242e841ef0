#pragma once
// GEMMs are not written by hand: a thin cuBLASLt wrapper for row-major bf16 matrices with fp32 accumulation, the
// shapes and transposes the layer needs (C = A W^T forward, dX = dY W, dW = dY^T X).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/kernels.hpp"

namespace trainyard::kernels {

class Gemm {
 public:
  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
  Gemm();  // a cuBLASLt handle and a kWorkspaceBytes workspace on the current device
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Row-major C[m][n] = alpha * op(A) * op(B) + beta * C; A is [m][k] ([k][m] when transpose_a), B is [k][n]
  // ([n][k] when transpose_b); A and B bf16, C bf16 or fp32 (`c_fp32`), accumulation in fp32. Throws
  // InternalError (with the cuBLAS status) when cuBLASLt has no algorithm for the shape or fails.
  void run(int m, int n, int k, const bf16_bits* a, bool transpose_a, const bf16_bits* b, bool transpose_b, void* c, bool c_fp32, float alpha,
           float beta, cudaStream_t stream);

 private:
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = kWorkspaceBytes;
};

}  // namespace trainyard::kernels
