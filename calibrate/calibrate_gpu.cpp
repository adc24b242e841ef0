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

class Sweep {
 public:
  Sweep(const SweepPlan& plan, Measurements& m, std::ostream* progress)
      : plan_(plan), m_(m), progress_(progress), start_(std::chrono::steady_clock::now()) {}

  int calls_per_trial(double call_s) const {
    const double n = std::ceil(plan_.trial_seconds / std::max(call_s, 1e-9));
    return static_cast<int>(std::clamp(n, 1.0, static_cast<double>(plan_.max_calls_per_trial)));
  }

  // The median seconds per call; nullopt when one call takes longer than the plan allows.
  std::optional<double> point(Trials& trials, cudaStream_t stream, const std::function<void()>& call) {
    for (int i = 0; i < plan_.warmup_calls; ++i) call();
    TRAINYARD_CUDA_CHECK(cudaStreamSynchronize(stream));
    const double one = trials.run(call, 1);
    if (one > plan_.max_call_seconds) return std::nullopt;
    const int calls = calls_per_trial(one);
    std::vector<double> per_call;
    for (int r = 0; r < plan_.repeats; ++r) per_call.push_back(trials.run(call, calls));
    return median_of(per_call);
  }

  void skip(const std::string& what, const std::string& why) { m_.skipped.push_back(what + ": " + why); }

  void report(const std::string& line) {
    if (progress_) *progress_ << "calibrate: " << line << " (" << format_fixed(elapsed(), 1) << " s)" << std::endl;
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  const SweepPlan& plan() const { return plan_; }
  Measurements& measurements() { return m_; }

 private:
  const SweepPlan& plan_;
  Measurements& m_;
  std::ostream* progress_;
  std::chrono::steady_clock::time_point start_;
};

std::string too_slow(double limit_s) { return "one call took longer than " + format_number(limit_s) + " s; larger ones skipped"; }

std::string throughput_range(const std::vector<KernelPoint>& points) {
  if (points.empty()) return "no points";
  double lo = 1e300, hi = 0;
  for (const auto& p : points) {
    lo = std::min(lo, p.flops / p.seconds);
    hi = std::max(hi, p.flops / p.seconds);
  }
  return std::to_string(points.size()) + " points, " + format_fixed(lo * 1e-12, 1) + " to " + format_fixed(hi * 1e-12, 1) + " TFLOP/s";
}

std::string bandwidth_range(const std::vector<CopyPoint>& points) {
  double hi = 0;
  for (const auto& p : points) hi = std::max(hi, p.bytes / p.seconds);
  return "up to " + format_fixed(hi * 1e-9, 1) + " GB/s";
}

// ---- the series ------------------------------------------------------------------------------------------

void measure_gemm(Sweep& sweep, cudaStream_t stream, Blocker& blocker) {
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
    const auto time = sweep.point(trials, stream, [&] {
      gemm.run(s.m, s.n, s.k, a.as<bf16_bits>(), s.transpose_a, b.as<bf16_bits>(), s.transpose_b, c.as<void>(), false, 1.0f, 0.0f, stream);
    });
    if (!time) {
      for (std::size_t j = i; j < shapes.size(); ++j) sweep.skip(label(shapes[j]), too_slow(sweep.plan().max_call_seconds));
      break;
    }
    sweep.measurements().gemm.push_back({label(s), gemm_flops(s), *time});
  }
  sweep.report("GEMM (cuBLASLt bf16): " + throughput_range(sweep.measurements().gemm));
}

void measure_attention(Sweep& sweep, cudaStream_t stream, Blocker& blocker) {
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
      if (const auto time = sweep.point(trials, stream, forward)) {
        sweep.measurements().attention_fwd.push_back({label + " fwd", attention_flops(plan, c, false), *time});
      } else {
        forward_on = false;
        sweep.skip(label + " forward", too_slow(plan.max_call_seconds));
      }
    }
    if (backward_on) {
      forward();  // o and lse of this shape, then D, as the backward reads them
      kernels::attention_backward_prep(c.length, s.heads, s.head_dim, o_.as<bf16_bits>(), do_.as<bf16_bits>(), delta_.as<float>(), stream);
      const auto time = sweep.point(trials, stream, [&] {
        kernels::attention_backward(s, q_.as<bf16_bits>(), k_.as<bf16_bits>(), v_.as<bf16_bits>(), do_.as<bf16_bits>(), lse_.as<float>(),
                                    delta_.as<float>(), dq_.as<float>(), dk_.as<float>(), dv_.as<float>(), stream);
      });
      if (time) {
        sweep.measurements().attention_bwd.push_back({label + " bwd", attention_flops(plan, c, true), *time});
      } else {
        backward_on = false;
        sweep.skip(label + " backward", too_slow(plan.max_call_seconds));
      }
    }
  }
  sweep.report("attention forward: " + throughput_range(sweep.measurements().attention_fwd) +
               "; backward: " + throughput_range(sweep.measurements().attention_bwd));
}

void measure_launch(Sweep& sweep, cudaStream_t stream, Blocker& blocker) {
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

void measure_copies(Sweep& sweep, cudaStream_t stream, Blocker& blocker) {
  const SweepPlan& plan = sweep.plan();
  Measurements& m = sweep.measurements();
  std::int64_t host_max = 1, device_max = 1;
  for (auto b : plan.copy_bytes) host_max = std::max(host_max, b);
  for (auto b : plan.d2d_bytes) device_max = std::max(device_max, b);
  device_max = std::max(device_max, host_max);
  const auto z = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  PinnedMemory pinned_src(z(host_max)), pinned_dst(z(host_max));
  std::unique_ptr<std::byte[]> pageable(new std::byte[z(host_max)]);
  std::memset(pageable.get(), 0x3C, z(host_max));
  DeviceMemory dev_a(z(device_max), 0x3C), dev_b(z(device_max), 0x3C);
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
      {"h2d pinned", &m.h2d_pinned, &behind, dev_a.as<void>(), pinned_src.get(), cudaMemcpyHostToDevice},
      {"d2h pinned", &m.d2h_pinned, &behind, pinned_dst.get(), dev_b.as<void>(), cudaMemcpyDeviceToHost},
      {"h2d pageable", &m.h2d_pageable, &alone, dev_a.as<void>(), pageable.get(), cudaMemcpyHostToDevice},
      {"d2h pageable", &m.d2h_pageable, &alone, pageable.get(), dev_b.as<void>(), cudaMemcpyDeviceToHost},
  };
  for (const auto& s : series) {
    for (std::int64_t bytes : plan.copy_bytes) {
      const auto time = sweep.point(*s.trials, stream, [&] { TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(s.dst, s.src, z(bytes), s.kind, stream)); });
      if (!time) {
        sweep.skip(std::string(s.name) + " copy of " + format_bytes(static_cast<double>(bytes)), too_slow(plan.max_call_seconds));
        break;
      }
      s.out->push_back({static_cast<double>(bytes), *time});
    }
  }

  // Both directions at once: H2D on `stream`, D2H on a second stream that starts with it.
  Stream second;
  Event start, stop_h2d, stop_d2h;
  const auto both = [&](std::int64_t bytes, int calls) {
    for (int attempt = 0; attempt < 4; ++attempt) {
      blocker.hold(stream);
      TRAINYARD_CUDA_CHECK(cudaEventRecord(start.get(), stream));
      TRAINYARD_CUDA_CHECK(cudaStreamWaitEvent(second.get(), start.get(), 0));
      for (int i = 0; i < calls; ++i) {
        TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(dev_a.as<void>(), pinned_src.get(), z(bytes), cudaMemcpyHostToDevice, stream));
        TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(pinned_dst.get(), dev_b.as<void>(), z(bytes), cudaMemcpyDeviceToHost, second.get()));
      }
      TRAINYARD_CUDA_CHECK(cudaEventRecord(stop_h2d.get(), stream));
      TRAINYARD_CUDA_CHECK(cudaEventRecord(stop_d2h.get(), second.get()));
      blocker.release();
      TRAINYARD_CUDA_CHECK(cudaEventSynchronize(stop_h2d.get()));
      TRAINYARD_CUDA_CHECK(cudaEventSynchronize(stop_d2h.get()));
      if (blocker.timed_out()) {
        calls = std::max(1, calls / 2);
        continue;
      }
      return std::pair{elapsed_s(start, stop_h2d) / calls, elapsed_s(start, stop_d2h) / calls};
    }
    throw InternalError("the blocking kernel timed out four times while enqueueing copies in both directions", __FILE__, __LINE__);
  };
  for (std::int64_t bytes : plan.copy_bytes) {
    for (int i = 0; i < plan.warmup_calls; ++i) both(bytes, 1);
    const auto [h2d_one, d2h_one] = both(bytes, 1);
    if (std::max(h2d_one, d2h_one) > plan.max_call_seconds) {
      sweep.skip("copies both ways of " + format_bytes(static_cast<double>(bytes)), too_slow(plan.max_call_seconds));
      break;
    }
    const int calls = sweep.calls_per_trial(std::max(h2d_one, d2h_one));
    std::vector<double> h2d, d2h;
    for (int r = 0; r < plan.repeats; ++r) {
      const auto [a, b] = both(bytes, calls);
      h2d.push_back(a);
      d2h.push_back(b);
    }
    m.h2d_both.push_back({static_cast<double>(bytes), median_of(h2d)});
    m.d2h_both.push_back({static_cast<double>(bytes), median_of(d2h)});
  }

  for (std::int64_t bytes : plan.d2d_bytes) {
    const auto time = sweep.point(behind, stream, [&] {
      TRAINYARD_CUDA_CHECK(cudaMemcpyAsync(dev_b.as<void>(), dev_a.as<void>(), z(bytes), cudaMemcpyDeviceToDevice, stream));
    });
    if (!time) {
      sweep.skip("device-to-device copy of " + format_bytes(static_cast<double>(bytes)), too_slow(plan.max_call_seconds));
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

  Sweep sweep(plan, m, progress);
  sweep.report("sweep '" + plan.name + "' on " + d.describe());
  {
    Stream stream;
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
