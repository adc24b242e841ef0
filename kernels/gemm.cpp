#include "kernels/gemm.hpp"

#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "common/error.hpp"

namespace trainyard::kernels {

namespace {

void check(cublasStatus_t status, const char* call, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw InternalError(std::string(call) + " failed with cublasStatus_t " + std::to_string(static_cast<int>(status)), __FILE__, line);
  }
}
#define TRAINYARD_CUBLAS_CHECK(call) check((call), #call, __LINE__)

// cuBLASLt is opened on the first GEMM, not linked: loading it runs its static initialisers, which cost every
// trainyard command (a simulation too) 0.4-0.6 s and 200 MiB of RSS on a machine with or without a GPU.
// One row per cuBLASLt function used here: the member that holds it, and its name in the library.
#define TRAINYARD_CUBLASLT_FUNCTIONS(X)                             \
  X(create, cublasLtCreate)                                         \
  X(destroy, cublasLtDestroy)                                       \
  X(matmul, cublasLtMatmul)                                         \
  X(algo_get_heuristic, cublasLtMatmulAlgoGetHeuristic)             \
  X(desc_create, cublasLtMatmulDescCreate)                          \
  X(desc_destroy, cublasLtMatmulDescDestroy)                        \
  X(desc_set_attribute, cublasLtMatmulDescSetAttribute)             \
  X(preference_create, cublasLtMatmulPreferenceCreate)              \
  X(preference_destroy, cublasLtMatmulPreferenceDestroy)            \
  X(preference_set_attribute, cublasLtMatmulPreferenceSetAttribute) \
  X(layout_create, cublasLtMatrixLayoutCreate)                      \
  X(layout_destroy, cublasLtMatrixLayoutDestroy)

struct CublasLt {
#define TRAINYARD_CUBLASLT_MEMBER(member, function) decltype(&function) member;
  TRAINYARD_CUBLASLT_FUNCTIONS(TRAINYARD_CUBLASLT_MEMBER)
#undef TRAINYARD_CUBLASLT_MEMBER
};

#define TRAINYARD_STRINGIFY_VALUE(x) #x
#define TRAINYARD_STRINGIFY(x) TRAINYARD_STRINGIFY_VALUE(x)
constexpr const char* kCublasLtLibrary = "libcublasLt.so." TRAINYARD_STRINGIFY(CUBLAS_VER_MAJOR);  // the major version built against

CublasLt open_cublas_lt() {
  void* library = dlopen(kCublasLtLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {  // the machine's CUDA installation, not trainyard: an error the user can act on
    throw InputError(std::string("cuBLASLt cannot be loaded (") + dlerror() + "): install CUDA's cuBLAS " TRAINYARD_STRINGIFY(CUBLAS_VER_MAJOR) +
                     " or add its lib folder to LD_LIBRARY_PATH");
  }
  auto symbol = [&]<class F>(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(library, name));
    if (f == nullptr) throw InternalError(std::string(kCublasLtLibrary) + " has no " + name, __FILE__, __LINE__);
  };
  CublasLt api{};
#define TRAINYARD_CUBLASLT_LOAD(member, function) symbol(api.member, #function);
  TRAINYARD_CUBLASLT_FUNCTIONS(TRAINYARD_CUBLASLT_LOAD)
#undef TRAINYARD_CUBLASLT_LOAD
  return api;  // the library stays open for the process
}

const CublasLt& lt() {
  static const CublasLt api = open_cublas_lt();
  return api;
}

// Owns the cuBLASLt descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~Descriptors() {
    if (preference) lt().preference_destroy(preference);
    if (c) lt().layout_destroy(c);
    if (b) lt().layout_destroy(b);
    if (a) lt().layout_destroy(a);
    if (op) lt().desc_destroy(op);
  }
};

}  // namespace

Gemm::Gemm() {
  cublasLtHandle_t handle = nullptr;
  TRAINYARD_CUBLAS_CHECK(lt().create(&handle));
  handle_ = handle;
  TRAINYARD_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Gemm::~Gemm() {
  cudaFree(workspace_);
  lt().destroy(static_cast<cublasLtHandle_t>(handle_));
}

void Gemm::run(int m, int n, int k, const bf16_bits* a, bool transpose_a, const bf16_bits* b, bool transpose_b, void* c, bool c_fp32, float alpha,
               float beta, cudaStream_t stream) {
  // cuBLASLt is column-major: a row-major [r][c] matrix is a column-major c x r one. So row-major C = op(A) op(B)
  // is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand is B, its second is A.
  Descriptors d;
  TRAINYARD_CUBLAS_CHECK(lt().desc_create(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TRAINYARD_CUBLAS_CHECK(lt().desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  TRAINYARD_CUBLAS_CHECK(lt().desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  const auto u = [](int x) { return static_cast<std::uint64_t>(x); };
  // Stored shapes (column-major rows x cols, leading dimension = rows).
  if (transpose_b) {
    TRAINYARD_CUBLAS_CHECK(lt().layout_create(&d.a, CUDA_R_16BF, u(k), u(n), k));
  } else {
    TRAINYARD_CUBLAS_CHECK(lt().layout_create(&d.a, CUDA_R_16BF, u(n), u(k), n));
  }
  if (transpose_a) {
    TRAINYARD_CUBLAS_CHECK(lt().layout_create(&d.b, CUDA_R_16BF, u(m), u(k), m));
  } else {
    TRAINYARD_CUBLAS_CHECK(lt().layout_create(&d.b, CUDA_R_16BF, u(k), u(m), k));
  }
  TRAINYARD_CUBLAS_CHECK(lt().layout_create(&d.c, c_fp32 ? CUDA_R_32F : CUDA_R_16BF, u(n), u(m), n));
  TRAINYARD_CUBLAS_CHECK(lt().preference_create(&d.preference));
  TRAINYARD_CUBLAS_CHECK(
      lt().preference_set_attribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_)));
  // The heuristic assumes 256-byte-aligned operands unless told otherwise; the executor passes row blocks of a
  // weight (wqkv's k rows, wup's up rows) whose alignment is whatever the shapes make it.
  const auto alignment = [](const void* p) {
    std::uint32_t bytes = 256;
    while (bytes > 1 && reinterpret_cast<std::uintptr_t>(p) % bytes != 0) bytes /= 2;
    return bytes;
  };
  const std::uint32_t align_first = alignment(b), align_second = alignment(a), align_c = alignment(c);
  TRAINYARD_CUBLAS_CHECK(lt().preference_set_attribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first, sizeof(align_first)));
  TRAINYARD_CUBLAS_CHECK(
      lt().preference_set_attribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second, sizeof(align_second)));
  TRAINYARD_CUBLAS_CHECK(lt().preference_set_attribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  TRAINYARD_CUBLAS_CHECK(lt().preference_set_attribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  auto handle = static_cast<cublasLtHandle_t>(handle_);
  TRAINYARD_CUBLAS_CHECK(lt().algo_get_heuristic(handle, d.op, d.a, d.b, d.c, d.c, d.preference, 1, &heuristic, &found));
  if (found == 0) {
    throw InternalError("cuBLASLt has no algorithm for a " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " GEMM",
                        __FILE__, __LINE__);
  }
  TRAINYARD_CUBLAS_CHECK(
      lt().matmul(handle, d.op, &alpha, b, d.a, a, d.b, &beta, c, d.c, c, d.c, &heuristic.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace trainyard::kernels
