#include "calibrate/calibrate_gpu.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>

#include "calibrate/calibrate_kernels.hpp"
#include "calibrate/sweep_timer.hpp"
#include "common/error.hpp"
#include "common/units.hpp"
#include "kernels/gemm.hpp"
#include "kernels/kernels.hpp"

namespace trainyard::backend {

namespace {

using kernels::bf16_bits;

// ---- owners of CUDA resources ----------------------------------------------------------------------------

class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes, int fill_byte) : bytes_(std::max<std::size_t>(bytes, 1)) {
    TRAINYARD_CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
    TRAINYARD_CUDA_CHECK(cudaMemset(ptr_, fill_byte, bytes_));
  }
  ~DeviceMemory() { cudaFree(ptr_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  std::size_t bytes_;
  void* ptr_ = nullptr;
};

class PinnedMemory {
 public:
  explicit PinnedMemory(std::size_t bytes) {
    TRAINYARD_CUDA_CHECK(cudaMallocHost(&ptr_, std::max<std::size_t>(bytes, 1)));
    std::memset(ptr_, 0x3C, bytes);  // touched, so no first-use cost lands in a timing
  }
  ~PinnedMemory() { cudaFreeHost(ptr_); }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

class Stream {
 public:
  Stream() { TRAINYARD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { TRAINYARD_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

double elapsed_s(const Event& from, const Event& to) {
  float ms = 0;
  TRAINYARD_CUDA_CHECK(cudaEventElapsedTime(&ms, from.get(), to.get()));
  return static_cast<double>(ms) * 1e-3;
}

// Holds a stream with launch_stream_blocker until release(); the flags live in mapped pinned memory.
class Blocker {
 public:
  Blocker() {
    TRAINYARD_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped));
    TRAINYARD_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flags_), flags_, 0));
    // Loads the kernel's module now: with lazy loading, a first launch while another stream spins could wait.
    set(0, 1);
    set(1, 0);
    launch_stream_blocker(device_flags_, device_flags_ + 1, kTimeoutNs, nullptr);
    TRAINYARD_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Blocker() { cudaFreeHost(flags_); }
  Blocker(const Blocker&) = delete;
  Blocker& operator=(const Blocker&) = delete;
  void hold(cudaStream_t stream) {
    set(0, 0);
    set(1, 0);
    launch_stream_blocker(device_flags_, device_flags_ + 1, kTimeoutNs, stream);
  }
  void release() { set(0, 1); }
  bool timed_out() const { return std::atomic_ref<int>(flags_[1]).load() != 0; }  // once the stream passed it

 private:
  void set(int i, int value) { std::atomic_ref<int>(flags_[i]).store(value); }
  static constexpr unsigned long long kTimeoutNs = 2'000'000'000ULL;  // the host has 2 s to enqueue a trial
  int* flags_ = nullptr;
  int* device_flags_ = nullptr;
};

// ---- timing ----------------------------------------------------------------------------------------------

// Seconds per call of `calls` back-to-back calls on `stream`, between two events; behind `blocker` when given.
class Trials {
 public:
  Trials(cudaStream_t stream, Blocker* blocker) : stream_(stream), blocker_(blocker) {}
  double run(const std::function<void()>& call, int calls) {
    for (int attempt = 0; attempt < 4; ++attempt) {
      if (blocker_) blocker_->hold(stream_);
      TRAINYARD_CUDA_CHECK(cudaEventRecord(start_.get(), stream_));
      for (int i = 0; i < calls; ++i) call();
      TRAINYARD_CUDA_CHECK(cudaEventRecord(stop_.get(), stream_));
      if (blocker_) blocker_->release();
      TRAINYARD_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
      if (blocker_ && blocker_->timed_out()) {  // the host could not enqueue them all in time: fewer
        calls = std::max(1, calls / 2);
        continue;
      }
      return elapsed_s(start_, stop_) / calls;
    }
    throw InternalError("the blocking kernel timed out four times: the host could not enqueue a trial within 2 s", __FILE__, __LINE__);
  }

 private:
  cudaStream_t stream_;
  Blocker* blocker_;
  Event start_, stop_;
};

// A point timed by the sweep's one driver (sweep_timer.hpp) with these trials on `stream`.
std::optional<double> point(SweepTimer& sweep, Trials& trials, const std::function<void()>& call) {
  return sweep.point([&](const std::function<void()>& c, int calls) { return trials.run(c, calls); }, call);
}

// ---- the series ------------------------------------------------------------------------------------------

void measure_gemm(SweepTimer& sweep, cudaStream_t stream, Blocker& blocker) {
  auto shapes = sweep.plan().gemm;
  std::stable_sort(shapes.begin(), shapes.end(), [](const auto& a, const auto& b) { return gemm_flops(a) < gemm_flops(b); });
  std::size_t a_elems = 1, b_elems = 1, c_elems = 1;
  const auto z = [](int x) { return static_cast<std::size_t>(x); };
  for (const auto& s : shapes) {
    a_elems = std::max(a_elems, z(s.m) * z(s.k));
    b_elems = std::max(b_elems, z(s.k) * z(s.n));
    c_elems = std::max(c_elems, z(s.m) * z(s.n));
  }
  // 0x3C3C as bf16 is 0.0115: finite products, nothing denormal.
  DeviceMemory a(a_elems * sizeof(bf16_bits), 0x3C), b(b_elems * sizeof(bf16_bits), 0x3C), c(c_elems * sizeof(bf16_bits), 0);
  kernels::Gemm gemm;
  Trials trials(stream, &blocker);
  const auto label = [](const GemmShape& s) {
    return "gemm " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + (s.transpose_a ? " A^T" : "") +
           (s.transpose_b ? " B^T" : "");
  };
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const GemmShape s = shapes[i];
    const auto time = point(sweep, trials, [&] {
      gemm.run(s.m, s.n, s.k, a.as<bf16_bits>(), s.transpose_a, b.as<bf16_bits>(), s.transpose_b, c.as<void>(), false, 1.0f, 0.0f, stream);
    });
    if (!time) {
      for (std::size_t j = i; j < shapes.size(); ++j) sweep.skip(label(shapes[j]));
      break;
    }
    sweep.measurements().gemm.push_back({label(s), gemm_flops(s), *time});
  }
  sweep.report("GEMM (cuBLASLt bf16): " + rate_range(sweep.measurements().gemm, "TFLOP/s"));
}

void measure_attention(SweepTimer& sweep, cudaStream_t stream, Blocker& blocker) {
  const SweepPlan& plan = sweep.plan();
  auto cases = plan.attention;
  std::stable_sort(cases.begin(), cases.end(),
                   [&](const auto& x, const auto& y) { return attention_flops(plan, x, false) < attention_flops(plan, y, false); });
  int longest = 1;
  for (const auto& c : cases) longest = std::max(longest, c.length);
  const auto z = [](int x) { return static_cast<std::size_t>(x); };
  const std::size_t q = z(longest) * z(plan.attention_heads) * z(plan.attention_head_dim);
  const std::size_t kv = z(longest) * z(plan.attention_kv_heads) * z(plan.attention_head_dim);
  const std::size_t rows = z(longest) * z(plan.attention_heads);
  DeviceMemory dq_(q * 4, 0), dk_(kv * 4, 0), dv_(kv * 4, 0), lse_(rows * 4, 0), delta_(rows * 4, 0);
  DeviceMemory q_(q * 2, 0x3C), k_(kv * 2, 0x3C), v_(kv * 2, 0x3C), o_(q * 2, 0), do_(q * 2, 0x3C);
  Trials trials(stream, &blocker);
  bool forward_on = true, backward_on = true;
  for (const auto& c : cases) {
    const kernels::AttentionShape s = attention_shape(plan, c);
    const std::string label = attention_label(c);
    const auto forward = [&] {
      kernels::attention_forward(s, q_.as<bf16_bits>(), k_.as<bf16_bits>(), v_.as<bf16_bits>(), o_.as<bf16_bits>(), lse_.as<float>(), stream);
    };
    if (forward_on) {
      if (const auto time = point(sweep, trials, forward)) {
        sweep.measurements().attention_fwd.push_back({label + " fwd", attention_flops(plan, c, false), *time});
      } else {
        forward_on = false;
        sweep.skip(label + " forward");
      }
    }
    if (backward_on) {
      forward();  // o and lse of this shape, then D, as the backward reads them
      kernels::attention_backward_prep(c.length, s.heads, s.head_dim, o_.as<bf16_bits>(), do_.as<bf16_bits>(), delta_.as<float>(), stream);
      const auto time = point(sweep, trials, [&] {
        kernels::attention_backward(s, q_.as<bf16_bits>(), k_.as<bf16_bits>(), v_.as<bf16_bits>(), do_.as<bf16_bits>(), lse_.as<float>(),
                                    delta_.as<float>(), dq_.as<float>(), dk_.as<float>(), dv_.as<float>(), stream);
      });
      if (time) {
        sweep.measurements().attention_bwd.push_back({label + " bwd", attention_flops(plan, c, true), *time});
      } else {
        backward_on = false;
        sweep.skip(label + " backward");
      }
    }
  }
  sweep.report("attention forward: " + rate_range(sweep.measurements().attention_fwd, "TFLOP/s") +
               "; backward: " + rate_range(sweep.measurements().attention_bwd, "TFLOP/s"));
}

void measure_launch(SweepTimer& sweep, cudaStream_t stream, Blocker& blocker) {
  launch_empty_kernel(stream);  // module loading
  TRAINYARD_CUDA_CHECK(cudaStreamSynchronize(stream));
  Trials behind(stream, &blocker), alone(stream, nullptr);
  for (int count : sweep.plan().launch_counts) {
    for (auto [trials, out] : {std::pair{&behind, &sweep.measurements().launch}, std::pair{&alone, &sweep.measurements().launch_host}}) {
      std::vector<double> totals;
      for (int r = 0; r < sweep.plan().repeats; ++r) totals.push_back(trials->run([&] { launch_empty_kernel(stream); }, count) * count);
      out->push_back({count, median_of(totals)});
    }
  }
  const auto& gpu = sweep.measurements().launch;
  sweep.report("launch: " + format_fixed(gpu.back().seconds / gpu.back().kernels * 1e9, 0) + " ns per empty kernel queued (" +
               std::to_string(gpu.back().kernels) + " back to back)");
}

// The sweep's copy buffers: pinned and pageable host memory and two device buffers, each as large as the
// largest copy of the plan.
struct CopyBuffers {
  static std::int64_t host_max(const SweepPlan& plan) {
    std::int64_t most = 1;
    for (auto b : plan.copy_bytes) most = std::max(most, b);
    return most;
  }
  static std::int64_t device_max(const SweepPlan& plan) {
    std::int64_t most = host_max(plan);
    for (auto b : plan.d2d_bytes) most = std::max(most, b);
    return most;
  }
  explicit CopyBuffers(const SweepPlan& plan)
      : pinned_src(z(host_max(plan))),
        pinned_dst(z(host_max(plan))),
        pageable(new std::byte[z(host_max(plan))]),
        dev_a(z(device_max(plan)), 0x3C),
        dev_b(z(device_max(plan)), 0x3C) {
    std::memset(pageable.get(), 0x3C, z(host_max(plan)));
  }
  static std::size_t z(std::int64_t x) { return static_cast<std::size_t>(x); }
  PinnedMemory pinned_src, pinned_dst;
  std::unique_ptr<std::byte[]> pageable;
  DeviceMemory dev_a, dev_b;
};

// H2D and D2H, pinned (behind the blocker) and pageable (not: a pageable copy is staged by the host), one direction at a time.
void measure_one_way_copies(SweepTimer& sweep, cudaStream_t stream, Blocker& blocker, CopyBuffers& b) {
  Measurements& m = sweep.measurements();
  Trials behind(stream, &blocker), alone(stream, nullptr);
  struct Series {
    const char* name;
    std::vector<CopyPoint>* out;
    Trials* trials;
    void* dst;
    const void* src;
    cudaMemcpyKind kind;
  };
  const Series series[] = {
      {"h2d pinned", &m.h2d_pinned, &behind, b.dev_a.as<void>(), b.pinned_src.get(), cudaMemcpyHostToDevice},
      {"d2h pinned", &m.d2h_pinned, &behind, b.pinned_dst.get(), b.dev_b.as<void>(), cudaMemcpyDeviceToHost},
      {"h2d pageable", &m.h2d_pageable, &alone, b.dev_a.as<void>(), b.pageable.get(), cudaMemcpyHostToDevice},
      {"d2h pageable", &m.d2h_pageable, &alone, b.pageable.get(), b.dev_b.as<void>(), cudaMemcpyDeviceToHost},
  };
  for (const auto& s : series) {
    for (std::int64_t bytes : sweep.plan().copy_bytes) {
      const auto time = point(sweep, *s.trials, [&] { TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(s.dst, s.src, CopyBuffers::z(bytes), s.kind, stream)); });
      if (!time) {
        sweep.skip(std::string(s.name) + " copy of " + format_bytes(static_cast<double>(bytes)));
        break;
      }
      s.out->push_back({static_cast<double>(bytes), *time});
    }
  }
}

// Both directions at once: H2D on `stream`, D2H on a second stream that starts with it.
class TwoWayCopies {
 public:
  TwoWayCopies(cudaStream_t stream, Blocker& blocker, CopyBuffers& b) : stream_(stream), blocker_(blocker), b_(b) {}
  // Seconds per copy of each direction, `calls` copies each way.
  std::pair<double, double> run(std::int64_t bytes, int calls) {
    for (int attempt = 0; attempt < 4; ++attempt) {
      blocker_.hold(stream_);
      TRAINYARD_CUDA_CHECK(cudaEventRecord(start_.get(), stream_));
      TRAINYARD_CUDA_CHECK(cudaStreamWaitEvent(second_.get(), start_.get(), 0));
      for (int i = 0; i < calls; ++i) {
        TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(b_.dev_a.as<void>(), b_.pinned_src.get(), CopyBuffers::z(bytes), cudaMemcpyHostToDevice, stream_));
        TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(b_.pinned_dst.get(), b_.dev_b.as<void>(), CopyBuffers::z(bytes), cudaMemcpyDeviceToHost, second_.get()));
      }
      TRAINYARD_CUDA_CHECK(cudaEventRecord(stop_h2d_.get(), stream_));
      TRAINYARD_CUDA_CHECK(cudaEventRecord(stop_d2h_.get(), second_.get()));
      blocker_.release();
      TRAINYARD_CUDA_CHECK(cudaEventSynchronize(stop_h2d_.get()));
      TRAINYARD_CUDA_CHECK(cudaEventSynchronize(stop_d2h_.get()));
      if (blocker_.timed_out()) {
        calls = std::max(1, calls / 2);
        continue;
      }
      return {elapsed_s(start_, stop_h2d_) / calls, elapsed_s(start_, stop_d2h_) / calls};
    }
    throw InternalError("the blocking kernel timed out four times while enqueueing copies in both directions", __FILE__, __LINE__);
  }

 private:
  cudaStream_t stream_;
  Blocker& blocker_;
  CopyBuffers& b_;
  Stream second_;
  Event start_, stop_h2d_, stop_d2h_;
};

void measure_copies(SweepTimer& sweep, cudaStream_t stream, Blocker& blocker) {
  const SweepPlan& plan = sweep.plan();
  Measurements& m = sweep.measurements();
  CopyBuffers b(plan);
  measure_one_way_copies(sweep, stream, blocker, b);
  TwoWayCopies two_way(stream, blocker, b);
  for (std::int64_t bytes : plan.copy_bytes) {
    const auto both = sweep.two_way_point([&](int calls) { return two_way.run(bytes, calls); });
    if (!both) {
      sweep.skip("copies both ways of " + format_bytes(static_cast<double>(bytes)));
      break;
    }
    m.h2d_both.push_back({static_cast<double>(bytes), both->first});
    m.d2h_both.push_back({static_cast<double>(bytes), both->second});
  }
  Trials behind(stream, &blocker);
  for (std::int64_t bytes : plan.d2d_bytes) {
    const auto time = point(sweep, behind, [&] {
      TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(b.dev_b.as<void>(), b.dev_a.as<void>(), CopyBuffers::z(bytes), cudaMemcpyDeviceToDevice, stream));
    });
    if (!time) {
      sweep.skip("device-to-device copy of " + format_bytes(static_cast<double>(bytes)));
      break;
    }
    m.d2d.push_back({static_cast<double>(bytes), *time});
  }
  sweep.report("copies: H2D pinned " + bandwidth_range(m.h2d_pinned) + ", D2H pinned " + bandwidth_range(m.d2h_pinned) + ", H2D pageable " +
               bandwidth_range(m.h2d_pageable) + ", D2H pageable " + bandwidth_range(m.d2h_pageable) + ", device to device " +
               bandwidth_range(m.d2d));
}

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

}  // namespace

Measurements measure_on_gpu(const SweepPlan& plan, const CudaDevice& device, int visible_gpus, const std::string& command, std::ostream* progress) {
  Measurements m = start_measurements(plan, command);
  m.method = "CUDA events around n back-to-back calls (n sized from one timed call so a trial lasts about " +
             format_number(plan.trial_seconds * 1e3) + " ms, at most " + std::to_string(plan.max_calls_per_trial) +
             "), enqueued behind a blocking kernel (pageable copies: not), " + std::to_string(plan.warmup_calls) +
             " warm-up calls excluded, median of " + std::to_string(plan.repeats) + " trials";
  TRAINYARD_CUDA_CHECK(cudaSetDevice(device.index));
  DeviceDescription& d = m.device;
  d.index = device.index;
  d.name = device.name;
  d.compute_capability_major = device.compute_capability_major;
  d.compute_capability_minor = device.compute_capability_minor;
  d.sm_count = device.sm_count;
  d.memory_bytes = device.memory_bytes;
  d.visible_gpus = visible_gpus;
  char bus[32] = {};
  TRAINYARD_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), device.index));
  d.pci_bus_id = bus;
  int version = 0;
  TRAINYARD_CUDA_CHECK(cudaDriverGetVersion(&version));
  d.driver_version = version_string(version);
  TRAINYARD_CUDA_CHECK(cudaRuntimeGetVersion(&version));
  d.runtime_version = version_string(version);
  m.nccl_measured = false;
  m.nccl_note = visible_gpus < 2
                    ? "not measured: one GPU visible (" + device.name + "); NCCL collectives need at least two"
                    : "not measured: " + std::to_string(visible_gpus) +
                          " GPUs visible, but trainyard calibrate does not link NCCL yet (the executor's multi-GPU part is not written yet)";

  Stream stream;
  SweepTimer sweep(plan, m, progress, [&stream] { TRAINYARD_CUDA_CHECK(cudaStreamSynchronize(stream.get())); });
  sweep.report("sweep '" + plan.name + "' on " + d.describe());
  {
    Blocker blocker;
    measure_launch(sweep, stream.get(), blocker);
    measure_gemm(sweep, stream.get(), blocker);
    measure_attention(sweep, stream.get(), blocker);
    measure_copies(sweep, stream.get(), blocker);
    TRAINYARD_CUDA_CHECK(cudaDeviceSynchronize());
  }
  m.duration_s = sweep.elapsed();
  return m;
}

}  // namespace trainyard::backend
