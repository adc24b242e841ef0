// Throughput of the CUDA kernels on the device (CUDA events around each launch): attention chunk pairs in TFLOP/s
// (causal FLOPs counted for the unmasked pairs only), elementwise kernels in GB/s beside a device-to-device copy
// of the same bytes measured in the same run. Without a usable GPU every benchmark reports an error and runs
// nothing. The comparison with PyTorch's SDPA on the same shapes is scripts/gpu_check.sh, which runs this
// binary and scripts/sdpa_bench.py on the GPU machine and writes the table.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "backend/device_info.hpp"
#include "kernels/kernels.hpp"

namespace {

using namespace trainyard;

bool have_gpu(benchmark::State& state) {
  const auto found = backend::query_cuda_devices();
  if (found.devices.empty()) {
    state.SkipWithError(("no usable CUDA GPU: " + found.reason).c_str());
    return false;
  }
  return true;
}

struct Buffer {
  explicit Buffer(std::size_t bytes) {
    TRAINYARD_CUDA_CHECK(cudaMalloc(&ptr, bytes));
    TRAINYARD_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
  }
  ~Buffer() { cudaFree(ptr); }
  template <typename T>
  T* as() {
    return static_cast<T*>(ptr);
  }
  void* ptr = nullptr;
};

// Times `launch` with CUDA events; reports it as the iteration time.
template <typename F>
void timed(benchmark::State& state, F launch) {
  cudaEvent_t start, stop;
  TRAINYARD_CUDA_CHECK(cudaEventCreate(&start));
  TRAINYARD_CUDA_CHECK(cudaEventCreate(&stop));
  launch();  // warm-up
  for (auto _ : state) {
    TRAINYARD_CUDA_CHECK(cudaEventRecord(start));
    launch();
    TRAINYARD_CUDA_CHECK(cudaEventRecord(stop));
    TRAINYARD_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TRAINYARD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

kernels::AttentionPath path_of(benchmark::State& state) {
  return state.range(1) == 0 ? kernels::AttentionPath::tensor_cores : kernels::AttentionPath::cuda_cores;
}

// q = kv = range(0) tokens, 32 heads, head_dim 128, causal diagonal block (a 16K-token chunk); range(1):
// 0 tensor cores, 1 CUDA cores.
void BM_AttentionForward(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int n = static_cast<int>(state.range(0)), heads = 32, dim = 128;
  const auto path = path_of(state);
  const kernels::AttentionShape s{n, n, heads, heads, dim, true, 0, 0};
  const std::size_t elems = static_cast<std::size_t>(n) * heads * dim;
  Buffer q(elems * 2), k(elems * 2), v(elems * 2), o(elems * 2), lse(static_cast<std::size_t>(n) * heads * 4);
  timed(state, [&] {
    kernels::attention_forward(s, q.as<std::uint16_t>(), k.as<std::uint16_t>(), v.as<std::uint16_t>(), o.as<std::uint16_t>(), lse.as<float>(),
                               nullptr, path);
  });
  const double flops = 4.0 * heads * dim * (static_cast<double>(n) * (n + 1) / 2);
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionForward)->Args({16384, 0})->Args({4096, 0})->Args({4096, 1})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_AttentionBackward(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int n = static_cast<int>(state.range(0)), heads = 32, dim = 128;
  const auto path = path_of(state);
  const kernels::AttentionShape s{n, n, heads, heads, dim, true, 0, 0};
  const std::size_t elems = static_cast<std::size_t>(n) * heads * dim;
  Buffer q(elems * 2), k(elems * 2), v(elems * 2), d_o(elems * 2), lse(static_cast<std::size_t>(n) * heads * 4),
      delta(static_cast<std::size_t>(n) * heads * 4), dq(elems * 4), dk(elems * 4), dv(elems * 4);
  timed(state, [&] {
    kernels::attention_backward(s, q.as<std::uint16_t>(), k.as<std::uint16_t>(), v.as<std::uint16_t>(), d_o.as<std::uint16_t>(), lse.as<float>(),
                                delta.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), nullptr, path);
  });
  const double flops = 2.5 * 4.0 * heads * dim * (static_cast<double>(n) * (n + 1) / 2);
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionBackward)->Args({16384, 0})->Args({4096, 0})->Args({4096, 1})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

// Elementwise kernels against a device-to-device copy of the bytes they read and write.
void BM_CopyDeviceToDevice(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  Buffer a(bytes), b(bytes);
  timed(state, [&] { TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice)); });
  state.counters["GB/s"] = benchmark::Counter(2.0 * static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CopyDeviceToDevice)->Arg(std::int64_t{1} << 28)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_SwiGluForward(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const std::int64_t n = state.range(0);
  Buffer g(static_cast<std::size_t>(n) * 2), u(static_cast<std::size_t>(n) * 2), y(static_cast<std::size_t>(n) * 2);
  timed(state, [&] { kernels::swiglu_forward(n, g.as<std::uint16_t>(), u.as<std::uint16_t>(), y.as<std::uint16_t>(), nullptr); });
  state.counters["GB/s"] = benchmark::Counter(6.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SwiGluForward)->Arg(std::int64_t{1} << 27)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_RmsNormForward(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = static_cast<int>(state.range(0)), cols = 4096;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  Buffer x(n * 2), w(static_cast<std::size_t>(cols) * 2), y(n * 2);
  timed(state, [&] { kernels::rmsnorm_forward(rows, cols, 1e-5f, x.as<std::uint16_t>(), w.as<std::uint16_t>(), y.as<std::uint16_t>(), nullptr); });
  state.counters["GB/s"] = benchmark::Counter(4.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_RmsNormForward)->Arg(16384)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

// The backward reads x and dy and writes dx (dw's reads of x and dy again count too): 8 B per element.
void BM_RmsNormBackward(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = static_cast<int>(state.range(0)), cols = 4096;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  Buffer x(n * 2), w(static_cast<std::size_t>(cols) * 2), dy(n * 2), dx(n * 2), dw(static_cast<std::size_t>(cols) * 4);
  timed(state, [&] {
    kernels::rmsnorm_backward(rows, cols, 1e-5f, x.as<std::uint16_t>(), w.as<std::uint16_t>(), dy.as<std::uint16_t>(), dx.as<std::uint16_t>(),
                              dw.as<float>(), nullptr);
  });
  state.counters["GB/s"] = benchmark::Counter(10.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_RmsNormBackward)->Arg(16384)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

// RoPE in place on a 16K-token chunk of 32 heads of 128 at a position offset of 1M: 4 B per pair of elements.
void BM_Rope(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = static_cast<int>(state.range(0)), heads = 32, head_dim = 128;
  const std::size_t n = static_cast<std::size_t>(rows) * heads * head_dim;
  Buffer x(n * 2);
  timed(state, [&] { kernels::rope(rows, heads, head_dim, std::int64_t{1} << 20, 500000.0f, false, x.as<std::uint16_t>(), nullptr); });
  state.counters["GB/s"] = benchmark::Counter(4.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Rope)->Arg(16384)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_Add(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const std::int64_t n = state.range(0);
  Buffer a(static_cast<std::size_t>(n) * 2), b(static_cast<std::size_t>(n) * 2), y(static_cast<std::size_t>(n) * 2);
  timed(state, [&] { kernels::add(n, a.as<std::uint16_t>(), b.as<std::uint16_t>(), y.as<std::uint16_t>(), nullptr); });
  state.counters["GB/s"] = benchmark::Counter(6.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Add)->Arg(std::int64_t{1} << 27)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_AxpyF32(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const std::int64_t n = state.range(0);
  Buffer x(static_cast<std::size_t>(n) * 4), y(static_cast<std::size_t>(n) * 4);
  timed(state, [&] { kernels::axpy_f32(n, 1.0f, x.as<float>(), y.as<float>(), nullptr); });
  state.counters["GB/s"] = benchmark::Counter(12.0 * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AxpyF32)->Arg(std::int64_t{1} << 26)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

// Llama-3 8B's embedding rows for a 16K-token chunk (token ids are zero: every row reads the same table row).
void BM_EmbeddingForward(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = static_cast<int>(state.range(0)), hidden = 4096;
  Buffer table(std::size_t{1024} * hidden * 2), tokens(static_cast<std::size_t>(rows) * 4), y(static_cast<std::size_t>(rows) * hidden * 2);
  TRAINYARD_CUDA_CHECK(cudaMemset(tokens.ptr, 0, static_cast<std::size_t>(rows) * 4));
  timed(state,
        [&] { kernels::embedding_forward(rows, hidden, table.as<std::uint16_t>(), tokens.as<std::int32_t>(), y.as<std::uint16_t>(), nullptr); });
  state.counters["GB/s"] = benchmark::Counter(4.0 * rows * hidden * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_EmbeddingForward)->Arg(16384)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

// The vocab-parallel loss's merge of 8 shards' statistics for an 8K-token piece (reads 64 B, writes 8 B per row).
void BM_VocabParallelMerge(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = static_cast<int>(state.range(0)), shards = 8;
  Buffer stats(static_cast<std::size_t>(rows) * shards * 8), loss(static_cast<std::size_t>(rows) * 4), lse(static_cast<std::size_t>(rows) * 4);
  timed(state, [&] { kernels::vocab_parallel_merge(rows, shards, stats.as<float>(), loss.as<float>(), lse.as<float>(), nullptr); });
  state.counters["GB/s"] = benchmark::Counter((8.0 * shards + 8.0) * rows * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_VocabParallelMerge)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

}  // namespace

BENCHMARK_MAIN();
