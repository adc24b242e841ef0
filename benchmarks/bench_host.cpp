// The host's kernels (the CPU side of a GPU run): AdamW over the parameters whose optimizer step runs on the host
// (ZeRO-Offload; ring-track's states in DRAM), on one thread and on every core. Bytes moved per parameter: master
// weight, moments and gradient read (16), master and moments written (12), the bf16 weight written (2).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "common/thread_pool.hpp"
#include "kernels/reference.hpp"

namespace {

void BM_HostAdamW(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const auto count = static_cast<std::size_t>(n);
  std::vector<float> master(count, 0.5f), m(count, 0.01f), v(count, 0.001f), grad(count, 0.1f);
  std::vector<std::uint16_t> weights(count);
  trainyard::kernels::AdamW opt;
  int step = 1;
  for (auto _ : state) {
    trainyard::kernels::adamw_host(opt, step++, n, master.data(), m.data(), v.data(), grad.data(), weights.data(), threads);
    benchmark::DoNotOptimize(weights.data());
  }
  state.SetBytesProcessed(state.iterations() * n * 30);
  state.counters["threads"] = trainyard::resolve_threads(threads);
}
// 4M parameters (120 MB a step); threads 1, then every core (0).
BENCHMARK(BM_HostAdamW)->Args({std::int64_t{1} << 22, 1})->Args({std::int64_t{1} << 22, 0})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
