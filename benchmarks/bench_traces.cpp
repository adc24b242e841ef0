// Reading an engine's profiler trace (traces/kineto.hpp): a synthetic Kineto trace of realistic events (a
// training step's GEMMs, attention, elementwise kernels, NCCL collectives with metadata, copies, CPU ops and
// runtime calls, each with Kineto's args) of the size given in MiB, plain and gzip'd, read once per iteration.
// The target: a 1 GB trace in at most 30 s and 1 GiB of memory. Besides time, each run reports the peak
// resident memory of the process (getrusage), which must stay near the reader's GPU activity, not the file.
//   bench_traces --benchmark_filter='BM_ReadKineto/1024'   (writes a 1 GiB file in the temp folder first)
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "traces/kineto.hpp"

namespace {

// One step's events, as a PyTorch 2.x trace lays them out (about 6 KB).
std::string step_events(int step, double& t) {
  std::string out;
  char line[1024];
  const auto kernel = [&](const char* name, double dur, int stream, const char* extra) {
    std::snprintf(
        line, sizeof line,
        "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"%s\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"External id\":%d,"
        "\"queued\":0,\"device\":0,\"context\":1,\"stream\":%d,\"correlation\":%d,\"registers per thread\":168,\"shared memory\":"
        "213248,\"blocks per SM\":1.0,\"warps per SM\":12.0,\"grid\":[132,1,1],\"block\":[384,1,1],\"est. achieved occupancy %%\":19%s}},\n",
        name, stream, t, dur, step, stream, step, extra);
    out += line;
    std::snprintf(
        line, sizeof line,
        "{\"ph\":\"X\",\"cat\":\"cuda_runtime\",\"name\":\"cudaLaunchKernel\",\"pid\":4242,\"tid\":4242,\"ts\":%.3f,\"dur\":4.125,"
        "\"args\":{\"External id\":%d,\"cbid\":211,\"correlation\":%d}},\n{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"aten::mm\",\"pid\":4242,"
        "\"tid\":4242,\"ts\":%.3f,\"dur\":12.5,\"args\":{\"External id\":%d,\"Record function id\":0,\"Ev Idx\":%d}},\n",
        t - 20, step, step, t - 25, step, step);
    out += line;
    t += dur + 1;
  };
  std::snprintf(line, sizeof line,
                "{\"ph\":\"X\",\"cat\":\"user_annotation\",\"name\":\"ProfilerStep#%d\",\"pid\":4242,\"tid\":4242,\"ts\":%.3f,\"dur\":900.0},\n",
                step, t);
  out += line;
  for (int layer = 0; layer < 2; ++layer) {
    kernel("nvjet_tst_192x192_64x4_2x1_v_bz_TNN", 85.5, 7, "");
    kernel("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(flash::Flash_fwd_params)",
           140.25, 7, "");
    kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>()", 9.5, 7, "");
    kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 410.0, 20,
           ",\"Collective name\":\"allreduce\",\"In msg nelems\":8388608,\"Out msg nelems\":8388608,\"Group size\":8,\"dtype\":\"BFloat16\"");
  }
  return out;
}

// Writes a trace of about `mib` MiB (gzip'd when `gzip`) and returns its path.
std::string write_trace(int mib, bool gzip) {
  const std::string path = (std::filesystem::temp_directory_path() / ("bench-trace-" + std::to_string(mib) + (gzip ? ".json.gz" : ".json"))).string();
  if (std::filesystem::exists(path)) return path;
  gzFile out = gzopen(path.c_str(), gzip ? "wb1" : "wT");
  const std::string head = "{\"schemaVersion\":1,\"distributedInfo\":{\"backend\":\"nccl\",\"rank\":0,\"world_size\":8},\"traceEvents\":[\n";
  gzwrite(out, head.data(), static_cast<unsigned>(head.size()));
  double t = 1000;
  std::int64_t written = 0;
  for (int step = 0; written < (std::int64_t{mib} << 20); ++step) {
    const std::string events = step_events(step, t);
    gzwrite(out, events.data(), static_cast<unsigned>(events.size()));
    written += static_cast<std::int64_t>(events.size());
  }
  const std::string tail = "{\"name\":\"Record Window End\",\"ph\":\"i\",\"s\":\"g\",\"pid\":\"\",\"tid\":\"\",\"ts\":0}\n]}\n";
  gzwrite(out, tail.data(), static_cast<unsigned>(tail.size()));
  gzclose(out);
  return path;
}

void BM_ReadKineto(benchmark::State& state) {
  const int mib = static_cast<int>(state.range(0));
  const bool gzip = state.range(1) != 0;
  const std::string path = write_trace(mib, gzip);
  std::int64_t kernels = 0;
  for (auto _ : state) {
    const auto trace = trainyard::traces::read_kineto_file(path);
    kernels = static_cast<std::int64_t>(trace.activities.size());
    benchmark::DoNotOptimize(kernels);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.SetBytesProcessed(state.iterations() * (std::int64_t{mib} << 20));
  state.counters["file_MiB"] = static_cast<double>(std::filesystem::file_size(path)) / (1 << 20);
  state.counters["kernels"] = static_cast<double>(kernels);
  state.counters["peak_rss_MiB"] = static_cast<double>(usage.ru_maxrss) / 1024;  // Linux: KiB
}
// 64 MiB (every run), then 1 GiB of JSON plain and gzip'd (the figure; minutes to write the first time).
BENCHMARK(BM_ReadKineto)->Args({64, 0})->Args({64, 1})->Args({1024, 0})->Args({1024, 1})->Unit(benchmark::kSecond)->UseRealTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
