#include "calibrate/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>

#include <Eigen/Dense>

#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "sim/cost_model.hpp"

namespace trainyard::backend {

using Json = json::Json;
namespace fs = std::filesystem;

namespace {

const char* const kOrigin = "calibration measurements";

std::string field(const std::string& what, std::size_t i, const char* member) { return what + "[" + std::to_string(i) + "]" + member; }

bool positive(double x) { return std::isfinite(x) && x > 0; }

std::size_t distinct_count(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return static_cast<std::size_t>(std::unique(xs.begin(), xs.end()) - xs.begin());
}

}  // namespace

// ---- the sweep -------------------------------------------------------------------------------------------

SweepPlan full_sweep() {
  SweepPlan plan;
  plan.name = "full";
  for (int size : {128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384}) plan.gemm.push_back({size, size, size});
  // A transformer layer's GEMMs (Llama-3 8B: hidden 4096, fused QKV 6144, fused gate+up 2 x 14336, down from
  // 14336) on chunks of 512 to 16K tokens, and the backward's two other forms on two chunk sizes.
  for (int tokens : {512, 2048, 8192, 16384}) {
    for (auto [n, k] : {std::pair{4096, 4096}, std::pair{6144, 4096}, std::pair{28672, 4096}, std::pair{4096, 14336}}) {
      plan.gemm.push_back({tokens, n, k});
    }
  }
  for (int tokens : {2048, 16384}) {
    plan.gemm.push_back({tokens, 4096, 14336, false, false});  // dX = dY W
    plan.gemm.push_back({14336, 4096, tokens, true, false});   // dW = dY^T X
  }
  for (int length : {256, 512, 1024, 2048, 4096, 8192, 16384}) {
    plan.attention.push_back({length, true});
    plan.attention.push_back({length, false});
  }
  for (std::int64_t bytes = std::int64_t{64} << 10; bytes <= std::int64_t{1} << 30; bytes *= 2) plan.copy_bytes.push_back(bytes);
  for (std::int64_t bytes = std::int64_t{1} << 20; bytes <= std::int64_t{1} << 30; bytes *= 2) plan.d2d_bytes.push_back(bytes);
  plan.launch_counts = {4, 8, 16, 32, 64, 96};
  plan.repeats = 11;
  plan.trial_seconds = 0.025;
  return plan;
}

SweepPlan quick_sweep() {
  SweepPlan plan;
  plan.name = "quick";
  for (int size : {256, 1024, 4096, 8192}) plan.gemm.push_back({size, size, size});
  plan.gemm.push_back({2048, 4096, 4096});
  plan.gemm.push_back({2048, 28672, 4096});
  plan.gemm.push_back({8192, 4096, 14336});
  for (int length : {512, 2048, 8192}) {
    plan.attention.push_back({length, true});
    plan.attention.push_back({length, false});
  }
  for (std::int64_t bytes = std::int64_t{256} << 10; bytes <= std::int64_t{256} << 20; bytes *= 16) plan.copy_bytes.push_back(bytes);
  plan.d2d_bytes = {std::int64_t{4} << 20, std::int64_t{64} << 20, std::int64_t{256} << 20};
  plan.launch_counts = {4, 16, 64};
  plan.repeats = 5;
  plan.trial_seconds = 0.003;
  return plan;
}

double gemm_flops(const GemmShape& shape) { return sim::compute_cost(sim::Gemm{shape.m, shape.n, shape.k, hw::Dtype::bf16}).hardware_flops; }

kernels::AttentionShape attention_shape(const SweepPlan& plan, const AttentionCase& c) {
  kernels::AttentionShape a;
  a.q_len = a.kv_len = c.length;
  a.heads = plan.attention_heads;
  a.kv_heads = plan.attention_kv_heads;
  a.head_dim = plan.attention_head_dim;
  a.causal = c.causal;
  return a;
}

std::string attention_label(const AttentionCase& c) { return "attention " + std::to_string(c.length) + (c.causal ? " causal" : " full"); }

Measurements start_measurements(const SweepPlan& plan, const std::string& command) {
  Measurements m;
  m.started_utc = utc_now();
  m.command = command;
  m.sweep = plan.name;
  m.attention_shape = std::to_string(plan.attention_heads) + " heads, " + std::to_string(plan.attention_kv_heads) + " K/V heads, head_dim " +
                      std::to_string(plan.attention_head_dim);
  return m;
}

double attention_flops(const SweepPlan& plan, const AttentionCase& c, bool backward) {
  sim::Attention a;
  a.q_len = a.kv_len = c.length;
  a.heads = plan.attention_heads;
  a.kv_heads = plan.attention_kv_heads;
  a.head_dim = plan.attention_head_dim;
  a.causal = c.causal;
  a.backward = backward;
  return sim::compute_cost(a).hardware_flops;
}

double estimated_seconds(const SweepPlan& plan, const hw::GpuProfile& gpu) {
  // The protocol of calibrate/calibrate_gpu.cpp: warm-up calls, one call to estimate, then `repeats` trials of
  // n = clamp(trial_seconds / call, 1, max_calls_per_trial) calls, each trial synchronised (~50 us).
  const double trial_overhead_s = 50e-6;
  const auto point = [&](double call_s) {
    const double n = std::clamp(std::ceil(plan.trial_seconds / call_s), 1.0, static_cast<double>(plan.max_calls_per_trial));
    return (plan.warmup_calls + 1) * call_s + plan.repeats * n * call_s + (plan.repeats + 1) * trial_overhead_s;
  };
  const double peak = gpu.peak_tflops(hw::Dtype::bf16) * 1e12, launch_s = gpu.sustained.kernel_launch_ns.value * 1e-9;
  double total = 10.0;  // CUDA context, cuBLASLt handle, pinned and pageable host buffers (~2.5 GiB), device buffers
  for (const auto& g : plan.gemm) {
    const double flops = gemm_flops(g);
    total += point(flops / (peak * gpu.sustained.gemm.at(flops)) + launch_s);
  }
  for (const auto& c : plan.attention) {
    for (bool backward : {false, true}) {
      const double flops = attention_flops(plan, c, backward);
      const auto& table = backward ? gpu.sustained.attention_bwd : gpu.sustained.attention_fwd;
      total += point(flops / (peak * table.at(flops)) + launch_s);
    }
  }
  const double h2d = gpu.sustained.pcie_h2d_GBps.value * 1e9, d2h = gpu.sustained.pcie_d2h_GBps.value * 1e9;
  for (std::int64_t bytes : plan.copy_bytes) {
    const double b = static_cast<double>(bytes), latency_s = 10e-6;
    // Pinned each way, both at once, pageable each way (the simulator's assumption: half the pinned rate).
    total += point(latency_s + b / h2d) + point(latency_s + b / d2h) + point(latency_s + b / std::min(h2d, d2h)) + point(latency_s + 2 * b / h2d) +
             point(latency_s + 2 * b / d2h);
  }
  for (std::int64_t bytes : plan.d2d_bytes) {
    total += point(5e-6 + 2 * static_cast<double>(bytes) / (gpu.hbm_GBps.value * 1e9 * gpu.sustained.hbm_efficiency.value));
  }
  for (int count : plan.launch_counts) total += 2 * (plan.repeats + 1) * (count * launch_s + trial_overhead_s);  // GPU and host
  return total;
}

// ---- fits ------------------------------------------------------------------------------------------------

namespace {

void check_points(std::span<const std::pair<double, double>> points, const std::string& what, const char* x_name, const char* y_name,
                  std::size_t min_points, std::size_t min_distinct) {
  std::vector<double> xs;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto [x, y] = points[i];
    if (!positive(x)) throw InputError(kOrigin, field(what, i, x_name), "a positive, finite number", format_number(x));
    if (!positive(y)) throw InputError(kOrigin, field(what, i, y_name), "a positive, finite number", format_number(y));
    xs.push_back(x);
  }
  const std::size_t distinct = distinct_count(xs);
  if (points.size() < min_points || distinct < min_distinct) {
    throw InputError(
        kOrigin, what,
        "at least " + std::to_string(min_points) + " points over " + std::to_string(min_distinct) + " distinct " + x_name + " values to fit",
        std::to_string(points.size()) + " points, " + std::to_string(distinct) + " distinct");
  }
}

// Weighted least squares of t = fixed + x * per_unit on relative residuals; nullopt when the slope is not positive.
std::optional<LinearCostFit> linear_fit(std::span<const std::pair<double, double>> x_seconds) {
  const auto n = static_cast<Eigen::Index>(x_seconds.size());
  Eigen::MatrixXd a(n, 2);
  const Eigen::VectorXd b = Eigen::VectorXd::Ones(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto [x, t] = x_seconds[i];
    a(i, 0) = 1 / t;
    a(i, 1) = x / t;
  }
  // Columns scaled to unit norm: x spans many decades, and QR is then well conditioned.
  const Eigen::Vector2d scale(a.col(0).norm(), a.col(1).norm());
  a.col(0) /= scale(0);
  a.col(1) /= scale(1);
  const Eigen::Vector2d solution = a.colPivHouseholderQr().solve(b);
  LinearCostFit fit;
  fit.fixed_s = solution(0) / scale(0);
  fit.per_unit_s = solution(1) / scale(1);
  if (!positive(fit.per_unit_s) || !std::isfinite(fit.fixed_s)) return std::nullopt;
  double sum = 0;
  for (const auto& [x, t] : x_seconds) sum += std::pow(fit.at(x) / t - 1, 2);
  fit.rms_relative_error = std::sqrt(sum / static_cast<double>(x_seconds.size()));
  fit.points = x_seconds.size();
  return fit;
}

double softplus(double u) { return u > 0 ? u + std::log1p(std::exp(-u)) : std::log1p(std::exp(u)); }
double sigmoid(double u) { return u >= 0 ? 1 / (1 + std::exp(-u)) : std::exp(u) / (1 + std::exp(u)); }

// Levenberg-Marquardt on theta = (ln e_max, ln F_half, ln p) minimising sum (ln e_model - ln e_i)^2, where
// ln e_model = ln e_max - softplus(p (ln F_half - ln F)). Returns the cost reached; theta is updated.
double levenberg_marquardt(const std::vector<double>& log_f, const std::vector<double>& log_e, Eigen::Vector3d& theta) {
  const double x_min = *std::min_element(log_f.begin(), log_f.end()), x_max = *std::max_element(log_f.begin(), log_f.end());
  const Eigen::Vector3d lower(std::log(1e-4), x_min - 12, std::log(0.2)), upper(std::log(10.0), x_max + 12, std::log(5.0));
  const auto n = static_cast<Eigen::Index>(log_f.size());
  const auto evaluate = [&](const Eigen::Vector3d& t, Eigen::VectorXd& r, Eigen::MatrixXd* jacobian) {
    const double p = std::exp(t(2));
    for (Eigen::Index i = 0; i < n; ++i) {
      const double u = p * (t(1) - log_f[i]);
      r(i) = t(0) - softplus(u) - log_e[i];
      if (jacobian) {
        const double s = sigmoid(u);
        (*jacobian)(i, 0) = 1;
        (*jacobian)(i, 1) = -s * p;
        (*jacobian)(i, 2) = -s * u;
      }
    }
    return r.squaredNorm();
  };
  theta = theta.cwiseMax(lower).cwiseMin(upper);
  Eigen::VectorXd r(n), r_try(n);
  Eigen::MatrixXd j(n, 3);
  double cost = evaluate(theta, r, &j), lambda = 1e-3;
  for (int iteration = 0; iteration < 500 && lambda < 1e12; ++iteration) {
    const Eigen::Matrix3d h = j.transpose() * j;
    const Eigen::Vector3d g = j.transpose() * r;
    Eigen::Matrix3d damped = h;
    damped.diagonal() += lambda * h.diagonal() + Eigen::Vector3d::Constant(1e-12);
    const Eigen::Vector3d step = damped.ldlt().solve(-g);
    const Eigen::Vector3d candidate = (theta + step).cwiseMax(lower).cwiseMin(upper);
    const double cost_try = evaluate(candidate, r_try, nullptr);
    if (std::isfinite(cost_try) && cost_try < cost) {
      const bool converged = cost - cost_try <= 1e-14 * (1 + cost) && (candidate - theta).norm() < 1e-10;
      theta = candidate;
      cost = evaluate(theta, r, &j);
      lambda = std::max(lambda / 3, 1e-12);
      if (converged) break;
    } else {
      lambda *= 4;
    }
  }
  return cost;
}

}  // namespace

LinearCostFit fit_linear_cost(std::span<const std::pair<double, double>> x_seconds, const std::string& what) {
  check_points(x_seconds, what, "x", "seconds", 3, 3);
  const auto fit = linear_fit(x_seconds);
  if (!fit) {
    throw InputError(kOrigin, what, "times that grow with the size (a positive cost per unit)",
                     std::to_string(x_seconds.size()) + " points that do not");
  }
  return *fit;
}

double SaturatingCurve::at(double flops) const { return e_max / (1 + std::pow(flops_half / flops, exponent)); }

SaturatingFit fit_saturating(std::span<const std::pair<double, double>> flops_efficiency, const std::string& what) {
  check_points(flops_efficiency, what, "flops", "efficiency", 4, 3);
  std::vector<double> log_f, log_e;
  std::vector<std::pair<double, double>> flops_time;  // F / e = peak * time: the p = 1 model is a line in F
  for (const auto& [f, e] : flops_efficiency) {
    log_f.push_back(std::log(f));
    log_e.push_back(std::log(e));
    flops_time.emplace_back(f, f / e);
  }
  // Starts: the p = 1 line when it is sound, else the best point as the ceiling and the middle FLOPs as F_half;
  // each with p = 1/2, 1, 2. The lowest cost wins.
  std::vector<Eigen::Vector3d> starts;
  const double mid_log_f = (log_f.front() + log_f.back()) / 2;
  const double best_log_e = *std::max_element(log_e.begin(), log_e.end());
  Eigen::Vector2d base(best_log_e + 0.05, mid_log_f);
  if (const auto line = linear_fit(flops_time); line && line->fixed_s > 0) {
    base = Eigen::Vector2d(-std::log(line->per_unit_s), std::log(line->fixed_s / line->per_unit_s));
  }
  for (const Eigen::Vector2d& b : {base, Eigen::Vector2d(best_log_e + 0.05, mid_log_f)}) {
    for (double p : {0.5, 1.0, 2.0}) starts.emplace_back(b(0), b(1), std::log(p));
  }
  double best_cost = std::numeric_limits<double>::infinity();
  Eigen::Vector3d best = starts.front();
  for (Eigen::Vector3d theta : starts) {
    const double cost = levenberg_marquardt(log_f, log_e, theta);
    if (cost < best_cost) {
      best_cost = cost;
      best = theta;
    }
  }
  SaturatingFit fit;
  fit.curve = {std::exp(best(0)), std::exp(best(1)), std::exp(best(2))};
  fit.rms_log_error = std::sqrt(best_cost / static_cast<double>(log_f.size()));
  fit.points = log_f.size();
  const auto [lo, hi] = std::minmax_element(flops_efficiency.begin(), flops_efficiency.end());
  fit.flops_min = lo->first;
  fit.flops_max = hi->first;
  return fit;
}

std::vector<std::pair<double, double>> efficiency_points(std::span<const KernelPoint> points, double peak_flops_per_s, double launch_s,
                                                         const std::string& what, std::size_t* dropped) {
  std::vector<std::pair<double, double>> out;
  std::size_t launch_bound = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    if (!positive(p.flops)) throw InputError(kOrigin, field(what, i, ".flops"), "a positive, finite FLOP count", format_number(p.flops));
    if (!positive(p.seconds)) {
      throw InputError(kOrigin, field(what, i, ".seconds"), "a positive, finite time per call (" + p.shape + ")", format_number(p.seconds));
    }
    const double compute_s = p.seconds - launch_s;
    if (compute_s < 0.2 * p.seconds) {
      ++launch_bound;
      continue;
    }
    out.emplace_back(p.flops, p.flops / (peak_flops_per_s * compute_s));
  }
  if (dropped) *dropped = launch_bound;
  return out;
}

CalibrationFits fit_calibration(const Measurements& m, const hw::GpuProfile& base) {
  CalibrationFits fits;
  const auto launch_pairs = [](const std::vector<LaunchPoint>& points) {
    std::vector<std::pair<double, double>> out;
    for (const auto& p : points) out.emplace_back(p.kernels, p.seconds);
    return out;
  };
  const auto copy_fit = [](const std::vector<CopyPoint>& points, const std::string& what) {
    std::vector<std::pair<double, double>> pairs;
    for (const auto& p : points) pairs.emplace_back(p.bytes, p.seconds);
    return fit_linear_cost(pairs, what);
  };
  fits.launch = fit_linear_cost(launch_pairs(m.launch), "launch");
  fits.launch_host = fit_linear_cost(launch_pairs(m.launch_host), "launch_host");
  fits.kernel_launch_ns = fits.launch.per_unit_s * 1e9;
  fits.h2d_pinned = copy_fit(m.h2d_pinned, "h2d_pinned");
  fits.d2h_pinned = copy_fit(m.d2h_pinned, "d2h_pinned");
  fits.h2d_pageable = copy_fit(m.h2d_pageable, "h2d_pageable");
  fits.d2h_pageable = copy_fit(m.d2h_pageable, "d2h_pageable");
  fits.h2d_both = copy_fit(m.h2d_both, "h2d_both");
  fits.d2h_both = copy_fit(m.d2h_both, "d2h_both");
  fits.d2d = copy_fit(m.d2d, "d2d");
  if (!m.elementwise.empty()) fits.elementwise = copy_fit(m.elementwise, "elementwise");
  if (!m.optimizer.empty()) fits.optimizer = copy_fit(m.optimizer, "optimizer");

  // A measured rate above what the base profile allows means the base profile is the wrong one; a few percent
  // over is clock or rounding slack, clipped with a warning.
  const auto within = [&](double measured, double limit, const std::string& field_name, const std::string& expected) {
    if (measured <= limit) return measured;
    if (measured <= 1.03 * limit) {
      fits.warnings.push_back(field_name + ": measured " + format_fixed(measured, 3) + " is above " + format_fixed(limit, 3) + " (" + expected +
                              "); clipped");
      return limit;
    }
    throw InputError(base.origin, field_name, expected + " (is this the right base profile? see --base)", "a measured " + format_fixed(measured, 3));
  };
  const double raw_pcie = base.pcie_raw_GBps_per_direction();
  const std::string pcie_limit = "at most the raw PCIe Gen" + format_number(base.pcie_generation.value) + " x" +
                                 format_number(base.pcie_lanes.value) + " rate of " + format_fixed(raw_pcie, 1) + " GB/s";
  fits.pcie_h2d_GBps = within(1e-9 / fits.h2d_pinned.per_unit_s, raw_pcie, "pcie_generation", pcie_limit);
  fits.pcie_d2h_GBps = within(1e-9 / fits.d2h_pinned.per_unit_s, raw_pcie, "pcie_generation", pcie_limit);
  const double hbm_GBps = 2e-9 / fits.d2d.per_unit_s;
  fits.hbm_efficiency = within(hbm_GBps, base.hbm_GBps.value, "hbm_GBps", "at least the device-to-device copy's HBM traffic (read + write)") /
                        base.hbm_GBps.value;

  const double peak = base.peak_tflops(hw::Dtype::bf16) * 1e12, launch_s = fits.launch.per_unit_s;
  const auto kernel_fit = [&](const std::vector<KernelPoint>& points, const std::string& what, std::size_t& dropped) {
    const auto pairs = efficiency_points(points, peak, launch_s, what, &dropped);
    const auto above = std::count_if(pairs.begin(), pairs.end(), [](const auto& p) { return p.second > 1; });
    if (above > 0) {
      fits.warnings.push_back(what + ": " + std::to_string(above) + " point(s) above the profile's bf16 peak of " + format_fixed(peak * 1e-12, 1) +
                              " TFLOP/s (table clipped at 1)");
    }
    return fit_saturating(pairs, what);
  };
  fits.gemm = kernel_fit(m.gemm, "gemm", fits.gemm_dropped);
  fits.attention_fwd = kernel_fit(m.attention_fwd, "attention_fwd", fits.attention_fwd_dropped);
  fits.attention_bwd = kernel_fit(m.attention_bwd, "attention_bwd", fits.attention_bwd_dropped);
  double largest = 0;
  for (const auto& p : m.gemm) largest = std::max(largest, p.flops);
  fits.gemm_efficiency = std::min(1.0, fits.gemm.curve.at(largest));
  return fits;
}

// ---- the profile -----------------------------------------------------------------------------------------

std::vector<std::pair<double, double>> curve_table(const SaturatingFit& fit) {
  TRAINYARD_CHECK(positive(fit.flops_min) && fit.flops_max >= fit.flops_min, "curve_table of a fit without a FLOP range");
  const auto first = static_cast<int>(std::floor(10 * std::log10(fit.flops_min) + 1e-9));
  const auto last = static_cast<int>(std::ceil(10 * std::log10(fit.flops_max) - 1e-9));
  std::vector<std::pair<double, double>> out;
  for (int i = first; i <= last; ++i) {
    // 10^(i/10) to three significant digits: 1, 1.26, 1.58, 2, 2.51, 3.16, 3.98, 5.01, 6.31, 7.94 per decade.
    const double exact = std::pow(10.0, i / 10.0), scale = std::pow(10.0, std::floor(std::log10(exact) + 1e-12) - 2);
    const double flops = std::round(exact / scale) * scale;
    out.emplace_back(flops, std::clamp(fit.curve.at(flops), 1e-6, 1.0));
  }
  return out;
}

double median_of(std::vector<double> values) {
  TRAINYARD_CHECK(!values.empty(), "median of nothing");
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string DeviceDescription::describe() const {
  if (driver_version.empty()) return name + " (" + format_bytes(static_cast<double>(memory_bytes)) + " available)";  // not a CUDA device
  return name + " (GPU " + std::to_string(index) + " of " + std::to_string(visible_gpus) + (pci_bus_id.empty() ? "" : ", " + pci_bus_id) + ", sm_" +
         std::to_string(compute_capability_major) + std::to_string(compute_capability_minor) + ", " + std::to_string(sm_count) + " SMs, " +
         format_bytes(static_cast<double>(memory_bytes)) + ", CUDA driver " + driver_version + ", runtime " + runtime_version + ")";
}

namespace {

std::string describe_rate(const LinearCostFit& fit) {
  return "t = latency + bytes / rate fitted by least squares on relative error: rate " + format_fixed(1e-9 / fit.per_unit_s, 2) + " GB/s, latency " +
         format_fixed(fit.fixed_s * 1e6, 2) + " us, rms error " + format_fixed(100 * fit.rms_relative_error, 1) + "% over " +
         std::to_string(fit.points) + " sizes";
}

// The smallest and largest `field` of the points (infinity and 0 for none).
template <typename Point>
std::pair<double, double> extent(const std::vector<Point>& points, double Point::*field) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const auto& p : points) {
    lo = std::min(lo, p.*field);
    hi = std::max(hi, p.*field);
  }
  return {lo, hi};
}

std::string flops_range(const std::vector<KernelPoint>& points) {
  const auto [lo, hi] = extent(points, &KernelPoint::flops);
  return format_flops(lo) + " to " + format_flops(hi);
}

std::string bytes_range(const std::vector<CopyPoint>& points) {
  const auto [lo, hi] = extent(points, &CopyPoint::bytes);
  return format_bytes(lo) + " to " + format_bytes(hi);
}

Json copy_points_json(const std::vector<CopyPoint>& points) {
  Json out = Json::array();
  for (const auto& p : points) {  // "gbps": the old spelling, kept for one release (docs/taskgraph.md, "Renamed keys")
    const double GBps = p.bytes / p.seconds * 1e-9;
    out.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}, {"GBps", GBps}, {"gbps", GBps}});
  }
  return out;
}

Json launch_points_json(const std::vector<LaunchPoint>& points) {
  Json out = Json::array();
  for (const auto& p : points) out.push_back({{"kernels", p.kernels}, {"seconds", p.seconds}});
  return out;
}

// A rate fit (x in bytes) also shows its GB/s; a launch fit (x in kernels) its ns per kernel.
Json linear_json(const LinearCostFit& fit, bool bytes) {
  Json out = {{"curve", "t(x) = fixed_s + x * per_unit_s"},
              {"fixed_s", fit.fixed_s},
              {"per_unit_s", fit.per_unit_s},
              {"rms_relative_error", fit.rms_relative_error},
              {"points", fit.points}};
  if (bytes) {
    out["GBps"] = 1e-9 / fit.per_unit_s;
    out["gbps"] = out["GBps"];  // the old spelling, kept for one release (docs/taskgraph.md, "Renamed keys")
  } else {
    out["ns_per_kernel"] = fit.per_unit_s * 1e9;
  }
  return out;
}

}  // namespace

// Every "source" id a figure or table refers to (outside "sources" and "calibration").
static void collect_source_ids(const Json& j, std::set<std::string>& ids, bool top = false) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if (top && (key == "sources" || key == "calibration")) continue;
      if (key == "source" && value.is_string()) ids.insert(value.get<std::string>());
      collect_source_ids(value, ids);
    }
  } else if (j.is_array()) {
    for (const auto& value : j) collect_source_ids(value, ids);
  }
}

void drop_unreferenced_sources(Json& doc) {
  std::set<std::string> used;
  collect_source_ids(doc, used, true);
  Json& sources = doc["sources"];
  for (auto it = sources.begin(); it != sources.end();) {
    if (used.count(it.key()) == 0) {
      it = sources.erase(it);
    } else {
      ++it;
    }
  }
}

Json measured_source(const std::string& date, const std::string& command, const std::string& device, const std::string& basis) {
  return {{"kind", "measured"}, {"date", date}, {"command", command}, {"device", device}, {"basis", basis}};
}

std::string path_beside(const std::string& gpu_out, const std::string& suffix) {
  const fs::path p(gpu_out);
  return (p.parent_path() / (p.stem().string() + suffix)).string();
}

Json efficiency_table_json(const SaturatingFit& fit) {
  Json points = Json::array();
  for (const auto& [f, e] : curve_table(fit)) points.push_back({f, e});
  return points;
}

std::string describe_curve(const SaturatingFit& fit) {
  return "e(F) = e_max / (1 + (F_half / F)^p) fitted by least squares on log e: e_max = " + format_fixed(fit.curve.e_max, 4) +
         ", F_half = " + format_flops(fit.curve.flops_half) + ", p = " + format_fixed(fit.curve.exponent, 3) + ", rms error " +
         format_fixed(100 * fit.rms_log_error, 1) + "% over " + std::to_string(fit.points) + " points";
}

Json kernel_points_json(std::span<const KernelPoint> points) {
  Json out = Json::array();
  for (const auto& p : points) {
    out.push_back({{"shape", p.shape}, {"flops", p.flops}, {"seconds", p.seconds}, {"tflops", p.flops / p.seconds * 1e-12}});
  }
  return out;
}

Json saturating_json(const SaturatingFit& fit, std::size_t dropped) {
  return {{"curve", "e(F) = e_max / (1 + (flops_half / F)^exponent)"},
          {"e_max", fit.curve.e_max},
          {"flops_half", fit.curve.flops_half},
          {"exponent", fit.curve.exponent},
          {"rms_log_error", fit.rms_log_error},
          {"points", fit.points},
          {"points_launch_bound_left_out", dropped}};
}

namespace {

// A profile source for what this calibration measured: the date, command, device and start time, with `basis`.
struct MeasuredSource {
  std::string date, time, command, device;
  Json operator()(const std::string& basis) const { return measured_source(date, command, device, "started " + time + "; " + basis); }
};

// The sources of the kernels', copies' and launches' figures.
void add_measured_sources(Json& doc, const Measurements& m, const CalibrationFits& fits, const MeasuredSource& measured) {
  Json& sources = doc["sources"];
  const double peak_tflops = doc["peak_dense_tflops"]["bf16"]["value"].get<double>();
  const std::string efficiency = "; e = FLOPs / (bf16 peak " + format_fixed(peak_tflops, 1) +
                                 " TFLOP/s x (time per call - kernel_launch_ns)), FLOPs in the simulator's convention";
  const auto dropped = [](std::size_t n) { return n == 0 ? std::string() : "; " + std::to_string(n) + " launch-bound point(s) left out"; };
  sources["calib_gemm"] = measured("cuBLASLt bf16 GEMMs (kernels::Gemm: fp32 accumulation, bf16 C) on " + std::to_string(m.gemm.size()) +
                                   " shapes of " + flops_range(m.gemm) + "; " + m.method + efficiency + dropped(fits.gemm_dropped) + "; " +
                                   describe_curve(fits.gemm) + kCurveTableBasis);
  const std::string attention = "kernels::attention_* (tensor cores) on " + std::to_string(m.attention_fwd.size()) +
                                " chunk pairs (diagonal causal and full; " + m.attention_shape + ")";
  sources["calib_attention_fwd"] = measured(attention + " forward, " + flops_range(m.attention_fwd) + "; " + m.method + efficiency +
                                            dropped(fits.attention_fwd_dropped) + "; " + describe_curve(fits.attention_fwd) + kCurveTableBasis);
  sources["calib_attention_bwd"] = measured(attention + " backward (without the D = rowsum(dO o) prep), FLOPs = 2.5x forward, " +
                                            flops_range(m.attention_bwd) + "; " + m.method + efficiency + dropped(fits.attention_bwd_dropped) + "; " +
                                            describe_curve(fits.attention_bwd) + kCurveTableBasis);
  sources["calib_hbm"] = measured("cudaMemcpyAsync device to device, " + bytes_range(m.d2d) + "; " + m.method + "; " + describe_rate(fits.d2d) +
                                  "; HBM traffic = 2 x the rate (read + write)");
  sources["calib_pcie"] = measured("cudaMemcpyAsync between pinned host memory and HBM, " + bytes_range(m.h2d_pinned) + ", each direction alone; " +
                                   m.method + "; H2D: " + describe_rate(fits.h2d_pinned) + "; D2H: " + describe_rate(fits.d2h_pinned));
  sources["calib_launch"] = measured(
      "empty kernels back to back on one stream, enqueued behind a blocking kernel (the GPU's cost per "
      "kernel, host launch rate hidden as the executor's queued work hides it); t = fixed + kernels x "
      "per_kernel fitted by least squares on relative error over " +
      std::to_string(fits.launch.points) + " counts; " + m.method);
}

// The sustained figures the simulator reads, each naming its source; elementwise and optimizer rates where measured.
void set_sustained(Json& doc, const Measurements& m, const CalibrationFits& fits, const MeasuredSource& measured) {
  Json& sources = doc["sources"];
  Json& sustained = doc["sustained"];
  sustained["gemm_efficiency"] = {
      {"value", fits.gemm_efficiency},
      {"source", "calib_gemm"},
      {"note", "the fitted GEMM curve at the largest GEMM measured; the curve's ceiling e_max is " + format_fixed(fits.gemm.curve.e_max, 3)}};
  sustained["hbm_efficiency"] = {
      {"value", fits.hbm_efficiency},
      {"source", "calib_hbm"},
      {"note", format_fixed(fits.hbm_efficiency * doc["hbm_GBps"]["value"].get<double>(), 0) + " GB/s of HBM traffic in device-to-device copies"}};
  const auto rate = [](const LinearCostFit& fit) { return format_fixed(1e-9 / fit.per_unit_s, 1) + " GB/s"; };
  sustained["pcie_h2d_GBps"] = {{"value", fits.pcie_h2d_GBps},
                                {"source", "calib_pcie"},
                                {"note", "pinned; pageable " + rate(fits.h2d_pageable) + "; with D2H at the same time " + rate(fits.h2d_both)}};
  sustained["pcie_d2h_GBps"] = {{"value", fits.pcie_d2h_GBps},
                                {"source", "calib_pcie"},
                                {"note", "pinned; pageable " + rate(fits.d2h_pageable) + "; with H2D at the same time " + rate(fits.d2h_both)}};
  sustained["efficiency_by_flops"] = {{"gemm", {{"source", "calib_gemm"}, {"points", efficiency_table_json(fits.gemm)}}},
                                      {"attention_fwd", {{"source", "calib_attention_fwd"}, {"points", efficiency_table_json(fits.attention_fwd)}}},
                                      {"attention_bwd", {{"source", "calib_attention_bwd"}, {"points", efficiency_table_json(fits.attention_bwd)}}}};
  // Where measured: the rates elementwise kernels and the optimizer step move the bytes the simulator counts.
  for (const auto& [key, fit, points, what] :
       {std::tuple{"elementwise_GBps", &fits.elementwise, &m.elementwise, "RMSNorm, SwiGLU, add and RoPE (bytes: read + written)"},
        std::tuple{"optimizer_GBps", &fits.optimizer, &m.optimizer, "AdamW (bytes: 30 per parameter, the simulator's OptimizerStep)"}}) {
    if (!fit->has_value()) continue;
    const std::string source = std::string("calib_") + key;
    sources[source] = measured(std::string(what) + ", " + bytes_range(*points) + "; " + m.method + "; " + describe_rate(**fit));
    sustained[key] = {{"value", 1e-9 / (*fit)->per_unit_s}, {"source", source}};
  }
  sustained["kernel_launch_ns"] = {
      {"value", fits.kernel_launch_ns},
      {"source", "calib_launch"},
      {"note", "host-bound launch rate (nothing queued ahead): " + format_fixed(fits.launch_host.per_unit_s * 1e9, 0) + " ns per kernel"}};
}

// The record for people (not read by the simulator): the device, the sweep, every point and every fit.
Json calibration_record(const Measurements& m, const CalibrationFits& fits) {
  return {
      {"tool", "trainyard calibrate"},
      {"command", m.command},
      {"sweep", m.sweep},
      {"started_utc", m.started_utc},
      {"duration_s", m.duration_s},
      {"device",
       {{"index", m.device.index},
        {"name", m.device.name},
        {"pci_bus_id", m.device.pci_bus_id},
        {"compute_capability", std::to_string(m.device.compute_capability_major) + "." + std::to_string(m.device.compute_capability_minor)},
        {"sm_count", m.device.sm_count},
        {"memory_bytes", m.device.memory_bytes},
        {"driver_version", m.device.driver_version},
        {"runtime_version", m.device.runtime_version},
        {"visible_gpus", m.device.visible_gpus}}},
      {"method", m.method},
      {"attention_shape", m.attention_shape},
      {"nccl", {{"measured", m.nccl_measured}, {"note", m.nccl_note}}},
      {"skipped", m.skipped},
      {"warnings", fits.warnings},
      {"points",
       {{"gemm", kernel_points_json(m.gemm)},
        {"attention_fwd", kernel_points_json(m.attention_fwd)},
        {"attention_bwd", kernel_points_json(m.attention_bwd)},
        {"launch", launch_points_json(m.launch)},
        {"launch_host", launch_points_json(m.launch_host)},
        {"h2d_pinned", copy_points_json(m.h2d_pinned)},
        {"d2h_pinned", copy_points_json(m.d2h_pinned)},
        {"h2d_pageable", copy_points_json(m.h2d_pageable)},
        {"d2h_pageable", copy_points_json(m.d2h_pageable)},
        {"h2d_both", copy_points_json(m.h2d_both)},
        {"d2h_both", copy_points_json(m.d2h_both)},
        {"d2d", copy_points_json(m.d2d)},
        {"elementwise", copy_points_json(m.elementwise)},
        {"optimizer", copy_points_json(m.optimizer)}}},
      {"fits",
       {{"gemm", saturating_json(fits.gemm, fits.gemm_dropped)},
        {"attention_fwd", saturating_json(fits.attention_fwd, fits.attention_fwd_dropped)},
        {"attention_bwd", saturating_json(fits.attention_bwd, fits.attention_bwd_dropped)},
        {"launch", linear_json(fits.launch, false)},
        {"launch_host", linear_json(fits.launch_host, false)},
        {"h2d_pinned", linear_json(fits.h2d_pinned, true)},
        {"d2h_pinned", linear_json(fits.d2h_pinned, true)},
        {"h2d_pageable", linear_json(fits.h2d_pageable, true)},
        {"d2h_pageable", linear_json(fits.d2h_pageable, true)},
        {"h2d_both", linear_json(fits.h2d_both, true)},
        {"d2h_both", linear_json(fits.d2h_both, true)},
        {"d2d", linear_json(fits.d2d, true)},
        {"elementwise", fits.elementwise ? linear_json(*fits.elementwise, true) : Json()},
        {"optimizer", fits.optimizer ? linear_json(*fits.optimizer, true) : Json()}}}};
}

}  // namespace

Json calibrated_profile(const Json& base_document, const std::string& name, const Measurements& m, const CalibrationFits& fits) {
  Json doc = base_document;
  const std::string date = m.started_utc.substr(0, std::min<std::size_t>(10, m.started_utc.size()));
  const std::string time = m.started_utc.size() >= 19 ? m.started_utc.substr(11, 8) + " UTC" : m.started_utc;
  const MeasuredSource measured{date, time, m.command, m.device.describe()};
  add_measured_sources(doc, m, fits, measured);
  set_sustained(doc, m, fits, measured);
  doc["name"] = name;
  doc["description"] = doc["description"].get<std::string>() + ", calibrated on " + m.device.name + " " + date;
  doc["calibration"] = calibration_record(m, fits);
  drop_unreferenced_sources(doc);
  return doc;
}

// ---- writing -----------------------------------------------------------------------------------------------

std::string profile_name_from_path(const std::string& out_path) {
  const fs::path path(out_path);
  if (path.extension() != ".json" || path.stem().empty() || path.stem() == ".") {
    throw InputError("--out", "path", "a file name ending in .json (its name becomes the profile's name)", "\"" + out_path + "\"");
  }
  return path.stem().string();
}

void check_output_path(const std::string& out_path) {
  std::error_code ec;
  const fs::path folder = fs::path(out_path).parent_path();
  if (!folder.empty() && !fs::is_directory(folder)) fs::create_directories(folder, ec);
  if (ec) {
    throw InputError("--out", "path", "a file that can be written (its folder exists or can be made, and is writable)",
                     "\"" + out_path + "\": " + ec.message());
  }
  check_writable(out_path, "--out");
}

CalibrationFits write_calibrated_profile(const Measurements& m, const Json& base_document, const std::string& base_origin,
                                         const std::string& out_path, const std::function<void(Json&)>& amend) {
  const std::string name = profile_name_from_path(out_path);
  const hw::GpuProfile base = hw::parse_gpu(base_document, base_origin);
  CalibrationFits fits = fit_calibration(m, base);
  Json doc = calibrated_profile(base_document, name, m, fits);
  if (amend) amend(doc);
  hw::parse_gpu(doc, out_path);  // what the simulator will read: must load before it is written
  check_writable(out_path, "--out");
  write_file_atomically(out_path, std::string_view(doc.dump(2) + "\n"));
  return fits;
}

std::optional<std::string> builtin_gpu_for_device(std::string_view device_name) {
  std::string name(device_name);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto has = [&](std::string_view part) { return name.find(part) != std::string::npos; };
  std::optional<std::string> match;
  if (has("nvl")) {
    match = std::nullopt;  // H100 NVL, H200 NVL: PCIe cards with other memory and clocks than any built-in
  } else if (has("h200")) {
    match = "h200-sxm";
  } else if (has("h100")) {
    if (has("pcie")) match = "h100-pcie";
    else if (has("hbm3") || has("sxm")) match = "h100-sxm";  // "NVIDIA H100 80GB HBM3" is the SXM5 part
  } else if (has("a100")) {
    if (has("80gb") && has("pcie")) match = "a100-80gb-pcie";
    else if (has("80gb") && has("sxm")) match = "a100-80gb-sxm";
    else if (has("40gb") && has("sxm")) match = "a100-40gb-sxm";
  } else if (has("l40s")) {
    match = "l40s";
  } else if (has("rtx 4090") && !has("4090 d")) {
    match = "rtx-4090";
  }
  if (match && !hw::is_builtin_gpu(*match)) return std::nullopt;
  return match;
}

}  // namespace trainyard::backend
