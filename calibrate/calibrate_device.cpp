#include "calibrate/calibrate_device.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <optional>
#include <thread>

#include "calibrate/sweep_timer.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/units.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::backend {

namespace {

// The gate (see calibrate_device.hpp): a fill of this many bytes per call queued, within these bounds.
constexpr std::int64_t kGateBytesPerCall = 16 << 10, kGateMinBytes = 1 << 20, kGateMaxBytes = 64 << 20;

// The CPU device's side of the timing (sweep_timer.hpp drives it): trials on the sweep's stream behind a gate.
class Sweep {
 public:
  Sweep(const SweepPlan& plan, Measurements& m, Device& d, std::ostream* progress)
      : plan_(plan), m_(m), d_(d), timer_(plan, m, progress, [&d] { d.synchronize(); }), gate_(d, kGateMaxBytes, 0) {
    gate_stream_ = d.create_stream();
    gate_event_ = d.create_event();
    stream_ = d.create_stream();
    second_ = d.create_stream();
    begin_ = d.create_event();
    end_ = d.create_event();
    end_second_ = d.create_event();
  }

  // Holds the sweep's stream until `calls` calls are queued behind it: a fill on a stream of its own, sized to
  // outlast the host's queueing, which the sweep's stream waits for. Without it a stream thread that runs faster
  // than the host queues sleeps and wakes between calls, and a small call's time would be mostly that.
  void gate(int calls) {
    const std::int64_t bytes = std::clamp<std::int64_t>(std::int64_t{calls} * kGateBytesPerCall, kGateMinBytes, kGateMaxBytes);
    d_.fill(gate_stream_, gate_.as<void>(), 0, bytes);
    d_.record(gate_event_, gate_stream_);
    d_.wait(stream_, gate_event_);
  }

  // Seconds per call of `calls` calls queued back to back on the sweep's stream.
  double trial(const std::function<void()>& call, int calls) {
    throw_if_interrupted();
    gate(calls);
    d_.record(begin_, stream_);
    for (int i = 0; i < calls; ++i) call();
    d_.record(end_, stream_);
    d_.synchronize();
    return d_.elapsed_ms(begin_, end_) * 1e-3 / calls;
  }

  std::optional<double> point(const std::function<void()>& call) {
    return timer_.point([this](const std::function<void()>& c, int calls) { return trial(c, calls); }, call);
  }

  // H2D on the sweep's stream and D2H on a second one that starts with it: seconds per copy of each.
  std::pair<double, double> both_ways(void* h2d_dst, const void* h2d_src, void* d2h_dst, const void* d2h_src, std::int64_t bytes, int calls) {
    throw_if_interrupted();
    gate(2 * calls);
    d_.record(begin_, stream_);
    d_.wait(second_, begin_);
    for (int i = 0; i < calls; ++i) {
      d_.copy(stream_, h2d_dst, h2d_src, bytes);
      d_.copy(second_, d2h_dst, d2h_src, bytes);
    }
    d_.record(end_, stream_);
    d_.record(end_second_, second_);
    d_.synchronize();
    return {d_.elapsed_ms(begin_, end_) * 1e-3 / calls, d_.elapsed_ms(begin_, end_second_) * 1e-3 / calls};
  }

  void skip(const std::string& what) { timer_.skip(what); }
  void report(const std::string& line) { timer_.report(line); }
  double elapsed() const { return timer_.elapsed(); }

  const SweepPlan& plan_;
  Measurements& m_;
  Device& d_;
  SweepTimer timer_;
  SweepBuffer gate_;
  int gate_stream_ = 0, gate_event_ = 0, stream_ = 0, second_ = 0, begin_ = 0, end_ = 0, end_second_ = 0;
};

void measure_launch(Sweep& s) {
  // An empty fill is the device's empty kernel: queued, woken, done.
  SweepBuffer b(s.d_, 256, 0);
  for (int count : s.plan_.launch_counts) {
    std::vector<double> totals;
    for (int r = 0; r < s.plan_.repeats; ++r) totals.push_back(s.trial([&] { s.d_.fill(s.stream_, b.as<void>(), 0, 0); }, count) * count);
    s.m_.launch.push_back({count, median_of(totals)});
    s.m_.launch_host.push_back({count, median_of(totals)});  // the host queues as fast as the stream runs: one series
  }
  s.report("launch: " + format_fixed(s.m_.launch.back().seconds / s.m_.launch.back().kernels * 1e9, 0) + " ns per empty operation");
}

void measure_gemm(Sweep& s) {
  auto shapes = s.plan_.gemm;
  std::stable_sort(shapes.begin(), shapes.end(), [](const auto& a, const auto& b) { return gemm_flops(a) < gemm_flops(b); });
  std::int64_t a_elems = 1, b_elems = 1, c_elems = 1;
  for (const auto& g : shapes) {
    a_elems = std::max<std::int64_t>(a_elems, std::int64_t{g.m} * g.k);
    b_elems = std::max<std::int64_t>(b_elems, std::int64_t{g.k} * g.n);
    c_elems = std::max<std::int64_t>(c_elems, std::int64_t{g.m} * g.n);
  }
  SweepBuffer a(s.d_, a_elems * 2, 0x3C), b(s.d_, b_elems * 2, 0x3C), c(s.d_, c_elems * 2, 0);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const GemmShape g = shapes[i];
    const std::string label = "gemm " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) + (g.transpose_a ? " A^T" : "") +
                              (g.transpose_b ? " B^T" : "");
    const auto time = s.point(
        [&] { s.d_.gemm(s.stream_, g.m, g.n, g.k, a.as<bf16_bits>(), g.transpose_a, b.as<bf16_bits>(), g.transpose_b, c.as<void>(), false, 1, 0); });
    if (!time) {
      s.skip(label);
      break;
    }
    s.m_.gemm.push_back({label, gemm_flops(g), *time});
  }
  s.report("GEMM: " + rate_range(s.m_.gemm, "GFLOP/s"));
}

void measure_attention(Sweep& s) {
  const SweepPlan& plan = s.plan_;
  int longest = 1;
  for (const auto& c : plan.attention) longest = std::max(longest, c.length);
  const std::int64_t q = std::int64_t{longest} * plan.attention_heads * plan.attention_head_dim;
  const std::int64_t kv = std::int64_t{longest} * plan.attention_kv_heads * plan.attention_head_dim;
  const std::int64_t rows = std::int64_t{longest} * plan.attention_heads;
  SweepBuffer qb(s.d_, q * 2, 0x3C), kb(s.d_, kv * 2, 0x3C), vb(s.d_, kv * 2, 0x3C), ob(s.d_, q * 2, 0), dob(s.d_, q * 2, 0x3C);
  SweepBuffer lse(s.d_, rows * 4, 0), delta(s.d_, rows * 4, 0), dq(s.d_, q * 4, 0), dk(s.d_, kv * 4, 0), dv(s.d_, kv * 4, 0);
  for (const auto& c : plan.attention) {
    const kernels::AttentionShape a = attention_shape(plan, c);
    const std::string label = attention_label(c);
    const auto forward = [&] {
      s.d_.attention_forward(s.stream_, a, qb.as<bf16_bits>(), kb.as<bf16_bits>(), vb.as<bf16_bits>(), ob.as<bf16_bits>(), lse.as<float>());
    };
    const auto fwd = s.point(forward);
    if (!fwd) {
      s.skip(label);
      break;
    }
    s.m_.attention_fwd.push_back({label + " fwd", attention_flops(plan, c, false), *fwd});
    forward();  // o and lse of this shape, then D, as the backward reads them
    s.d_.attention_backward_prep(s.stream_, c.length, a.heads, a.head_dim, ob.as<bf16_bits>(), dob.as<bf16_bits>(), delta.as<float>());
    const auto bwd = s.point([&] {
      s.d_.attention_backward(s.stream_, a, qb.as<bf16_bits>(), kb.as<bf16_bits>(), vb.as<bf16_bits>(), dob.as<bf16_bits>(), lse.as<float>(),
                              delta.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>());
    });
    if (!bwd) {
      s.skip(label + " backward");
      break;
    }
    s.m_.attention_bwd.push_back({label + " bwd", attention_flops(plan, c, true), *bwd});
  }
  s.report("attention forward: " + rate_range(s.m_.attention_fwd, "GFLOP/s") + "; backward: " + rate_range(s.m_.attention_bwd, "GFLOP/s"));
}

void measure_copies(Sweep& s) {
  const SweepPlan& plan = s.plan_;
  std::int64_t largest = 1;
  for (auto b : plan.copy_bytes) largest = std::max(largest, b);
  for (auto b : plan.d2d_bytes) largest = std::max(largest, b);
  SweepBuffer dev_a(s.d_, largest, 0x3C), dev_b(s.d_, largest, 0x3C), host_a(s.d_, largest, 0x3C, true), host_b(s.d_, largest, 0x3C, true);
  struct Series {
    std::vector<CopyPoint>* out;
    void* dst;
    const void* src;
  };
  // Pinned and pageable are the same memory on this device (see calibrate_device.hpp).
  const Series series[] = {{&s.m_.h2d_pinned, dev_a.as<void>(), host_a.as<void>()},
                           {&s.m_.d2h_pinned, host_b.as<void>(), dev_b.as<void>()},
                           {&s.m_.h2d_pageable, dev_a.as<void>(), host_a.as<void>()},
                           {&s.m_.d2h_pageable, host_b.as<void>(), dev_b.as<void>()},
                           {&s.m_.d2d, dev_b.as<void>(), dev_a.as<void>()}};
  for (const auto& series_i : series) {
    const bool d2d = series_i.out == &s.m_.d2d;
    for (std::int64_t bytes : d2d ? plan.d2d_bytes : plan.copy_bytes) {
      const auto time = s.point([&] { s.d_.copy(s.stream_, series_i.dst, series_i.src, bytes); });
      if (!time) {
        s.skip("copy of " + format_bytes(static_cast<double>(bytes)));
        break;
      }
      series_i.out->push_back({static_cast<double>(bytes), *time});
    }
  }
  for (std::int64_t bytes : plan.copy_bytes) {
    const auto both = s.timer_.two_way_point(
        [&](int calls) { return s.both_ways(dev_a.as<void>(), host_a.as<void>(), host_b.as<void>(), dev_b.as<void>(), bytes, calls); });
    if (!both) {
      s.skip("copies both ways of " + format_bytes(static_cast<double>(bytes)));
      break;
    }
    s.m_.h2d_both.push_back({static_cast<double>(bytes), both->first});
    s.m_.d2h_both.push_back({static_cast<double>(bytes), both->second});
  }
  s.report("copies: H2D " + bandwidth_range(s.m_.h2d_pinned) + ", D2H " + bandwidth_range(s.m_.d2h_pinned) + ", device to device " + bandwidth_range(s.m_.d2d));
}

// The elementwise kernels the executor runs, each at every size: the bytes the simulator counts for the op (what
// it reads and writes in bf16) against the time per call; and AdamW at 30 bytes per parameter.
void measure_elementwise(Sweep& s) {
  const SweepPlan& plan = s.plan_;
  if (plan.elementwise_elements.empty() && plan.optimizer_params.empty()) return;
  std::int64_t largest = 64;
  for (auto n : plan.elementwise_elements) largest = std::max(largest, n);
  for (auto n : plan.optimizer_params) largest = std::max(largest, n);
  SweepBuffer a(s.d_, largest * 2, 0x3C), b(s.d_, largest * 2, 0x3C), y(s.d_, largest * 2, 0), w(s.d_, 64 * 2, 0x3C);
  constexpr int kCols = 64, kHeads = 4, kHeadDim = 16;  // a row of the sweep's attention shape
  for (std::int64_t n : plan.elementwise_elements) {
    const int rows = static_cast<int>(n / kCols);
    const std::int64_t elems = std::int64_t{rows} * kCols;
    const std::pair<std::int64_t, std::function<void()>> kernels[] = {
        {4 * elems, [&] { s.d_.rmsnorm_forward(s.stream_, rows, kCols, 1e-5f, a.as<bf16_bits>(), w.as<bf16_bits>(), y.as<bf16_bits>()); }},
        {6 * elems, [&] { s.d_.swiglu_forward(s.stream_, elems, a.as<bf16_bits>(), b.as<bf16_bits>(), y.as<bf16_bits>()); }},
        {6 * elems, [&] { s.d_.add(s.stream_, elems, a.as<bf16_bits>(), b.as<bf16_bits>(), y.as<bf16_bits>()); }},
        {4 * elems, [&] { s.d_.rope(s.stream_, rows, kHeads, kHeadDim, 0, 10000.0f, false, y.as<bf16_bits>()); }}};
    for (const auto& [bytes, call] : kernels) {
      const auto time = s.point(call);
      if (!time) {
        s.skip("elementwise kernel of " + format_bytes(static_cast<double>(bytes)));
        break;
      }
      s.m_.elementwise.push_back({static_cast<double>(bytes), *time});
    }
  }
  SweepBuffer master(s.d_, largest * 4, 0x3C), m1(s.d_, largest * 4, 0), m2(s.d_, largest * 4, 0), grad(s.d_, largest * 4, 0x3C);
  kernels::AdamW adam;
  for (std::int64_t n : plan.optimizer_params) {
    const auto time = s.point(
        [&] { s.d_.adamw(s.stream_, adam, 1, n, master.as<float>(), m1.as<float>(), m2.as<float>(), grad.as<float>(), a.as<bf16_bits>()); });
    if (!time) {
      s.skip("AdamW on " + std::to_string(n) + " parameters");
      break;
    }
    s.m_.optimizer.push_back({static_cast<double>(n) * sim::kAdamBytesPerParam, *time});
  }
  s.report("elementwise: " + bandwidth_range(s.m_.elementwise) + ", AdamW " + bandwidth_range(s.m_.optimizer));
}

}  // namespace

SweepPlan cpu_sweep() {
  SweepPlan plan;
  plan.name = "cpu";
  for (int size : {16, 32, 48, 64, 96, 128, 192, 256}) plan.gemm.push_back({size, size, size});
  // The small models' layer GEMMs (hidden 32 to 256, fused QKV, gate+up, down) on chunks of 16 to 256 tokens.
  for (int tokens : {16, 64, 256}) {
    for (auto [n, k] : {std::pair{64, 64}, std::pair{128, 64}, std::pair{384, 64}, std::pair{64, 192}}) plan.gemm.push_back({tokens, n, k});
  }
  plan.gemm.push_back({64, 64, 192, false, false});  // dX = dY W
  plan.gemm.push_back({192, 64, 64, true, false});   // dW = dY^T X
  plan.attention_heads = 4;
  plan.attention_kv_heads = 2;
  plan.attention_head_dim = 16;
  for (int length : {16, 32, 64, 128, 256}) {
    plan.attention.push_back({length, true});
    plan.attention.push_back({length, false});
  }
  for (std::int64_t bytes = std::int64_t{16} << 10; bytes <= std::int64_t{16} << 20; bytes *= 4) plan.copy_bytes.push_back(bytes);
  for (std::int64_t bytes = std::int64_t{64} << 10; bytes <= std::int64_t{16} << 20; bytes *= 4) plan.d2d_bytes.push_back(bytes);
  plan.launch_counts = {64, 256, 1024, 4096};        // many: one empty operation costs microseconds, a wake-up as much
  plan.elementwise_elements = {4096, 16384, 65536};  // the small models' chunks: 16-256 tokens x hidden 32-256
  plan.optimizer_params = {16384, 65536, 262144};
  plan.repeats = 9;
  plan.trial_seconds = 0.05;
  plan.max_call_seconds = 2.0;
  return plan;
}

Measurements measure_on_device(const SweepPlan& plan, Device& device, const std::string& description, const std::string& command,
                               std::ostream* progress) {
  Measurements m = start_measurements(plan, command);
  m.method = "the device's events around n back-to-back calls on one stream (n sized from one timed call so a trial lasts about " +
             format_number(plan.trial_seconds * 1e3) + " ms, at most " + std::to_string(plan.max_calls_per_trial) + "), " +
             std::to_string(plan.warmup_calls) + " warm-up calls excluded, median of " + std::to_string(plan.repeats) + " trials";
  m.device.name = description;
  m.device.memory_bytes = device.free_bytes();
  m.nccl_note = "not measured: the CPU device's ranks talk over MPI, which this sweep does not time yet";
  Sweep sweep(plan, m, device, progress);
  sweep.report("sweep '" + plan.name + "' on " + m.device.describe());
  measure_launch(sweep);
  measure_gemm(sweep);
  measure_attention(sweep);
  measure_copies(sweep);
  measure_elementwise(sweep);
  m.duration_s = sweep.elapsed();
  return m;
}

}  // namespace trainyard::backend
