// `trainyard calibrate`'s plain C++ half (calibrate/calibration.hpp), on synthetic measurements made from known
// curves with seeded noise: the fits recover the curves, the written profile loads back through hw::parse_gpu
// and the simulator's tables and costs give the fitted values, and bad inputs fail clearly without leaving a
// file. The GPU measurements themselves are tested in test_gpu_calibration.cpp (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "calibrate/calibration.hpp"
#include "calibrate/trace_calibration.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "sim/collectives.hpp"
#include "sim/cost_model.hpp"
#include "sim/task_graph.hpp"
#include "stacks/collective_library.hpp"
#include "stacks/stack_profile.hpp"
#include "test_support.hpp"

namespace trainyard::backend {

namespace fs = std::filesystem;

namespace {

// Multiplicative noise exp(N(0, sigma)): relative errors, as timings have.
class Noise {
 public:
  Noise(double sigma, std::uint32_t seed) : rng_(seed), dist_(0.0, sigma) {}
  double operator()() { return std::exp(dist_(rng_)); }

 private:
  std::mt19937 rng_;
  std::normal_distribution<double> dist_;
};

std::vector<double> log_spaced(double lo, double hi, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) out.push_back(lo * std::pow(hi / lo, i / (n - 1.0)));
  return out;
}

// What a GPU "is" in the synthetic tests: H100-like curves and rates.
struct Truth {
  SaturatingCurve gemm{0.74, 2e9, 0.9}, attention_fwd{0.55, 6e9, 1.2}, attention_bwd{0.42, 1.5e10, 1.0};
  double launch_s = 2.2e-6, host_launch_s = 4.5e-6;
  double h2d_GBps = 52.0, d2h_GBps = 53.5, h2d_pageable_GBps = 21.0, d2h_pageable_GBps = 18.0, h2d_both_GBps = 47.0, d2h_both_GBps = 49.0,
         d2d_GBps = 1450.0;  // d2d: bytes copied per second (HBM traffic is twice that)
  double copy_latency_s = 9e-6;
};

Measurements synthetic(const Truth& truth, double sigma, std::uint32_t seed, double peak_tflops = 989.4) {
  Noise noise(sigma, seed);
  const SweepPlan plan = full_sweep();
  const double peak = peak_tflops * 1e12;
  Measurements m;
  m.device.name = "NVIDIA H100 80GB HBM3";
  m.device.pci_bus_id = "00000000:1B:00.0";
  m.device.compute_capability_major = 9;
  m.device.sm_count = 132;
  m.device.memory_bytes = 85'520'809'984;
  m.device.driver_version = m.device.runtime_version = "13.0";
  m.started_utc = "2026-03-01T12:34:56Z";
  m.command = "trainyard calibrate --out hwprofiles/measured/h100-test.json";
  m.method = "synthetic points (test)";
  m.sweep = plan.name;
  m.attention_shape = "32 heads, 8 K/V heads, head_dim 128";
  m.nccl_note = "not measured: one GPU visible (test)";
  const auto kernel_time = [&](const SaturatingCurve& curve, double flops) { return (flops / (peak * curve.at(flops)) + truth.launch_s) * noise(); };
  for (const auto& g : plan.gemm) m.gemm.push_back({"gemm", gemm_flops(g), kernel_time(truth.gemm, gemm_flops(g))});
  for (const auto& c : plan.attention) {
    m.attention_fwd.push_back({"fwd", attention_flops(plan, c, false), kernel_time(truth.attention_fwd, attention_flops(plan, c, false))});
    m.attention_bwd.push_back({"bwd", attention_flops(plan, c, true), kernel_time(truth.attention_bwd, attention_flops(plan, c, true))});
  }
  for (int count : plan.launch_counts) {
    m.launch.push_back({count, (3e-6 + count * truth.launch_s) * noise()});
    m.launch_host.push_back({count, (3e-6 + count * truth.host_launch_s) * noise()});
  }
  const auto copies = [&](std::vector<CopyPoint>& out, const std::vector<std::int64_t>& sizes, double GBps) {
    for (std::int64_t bytes : sizes) {
      const double b = static_cast<double>(bytes);
      out.push_back({b, (truth.copy_latency_s + b / (GBps * 1e9)) * noise()});
    }
  };
  copies(m.h2d_pinned, plan.copy_bytes, truth.h2d_GBps);
  copies(m.d2h_pinned, plan.copy_bytes, truth.d2h_GBps);
  copies(m.h2d_pageable, plan.copy_bytes, truth.h2d_pageable_GBps);
  copies(m.d2h_pageable, plan.copy_bytes, truth.d2h_pageable_GBps);
  copies(m.h2d_both, plan.copy_bytes, truth.h2d_both_GBps);
  copies(m.d2h_both, plan.copy_bytes, truth.d2h_both_GBps);
  copies(m.d2d, plan.d2d_bytes, truth.d2d_GBps);
  return m;
}

json::Json h100_document() { return hw::load_gpu_document("h100-sxm").json; }

bool folder_is_empty(const fs::path& dir) { return fs::is_empty(dir); }

}  // namespace

TEST(CalibrationFit, LatencyBandwidthLineRecoversItsParameters) {
  Noise noise(0.02, 7);
  std::vector<std::pair<double, double>> points;
  for (double bytes : log_spaced(64.0 * 1024, 1024.0 * 1024 * 1024, 8)) {
    for (int r = 0; r < 3; ++r) points.emplace_back(bytes, (8e-6 + bytes / 50e9) * noise());
  }
  const LinearCostFit fit = fit_linear_cost(points, "h2d_pinned");
  EXPECT_NEAR(1 / fit.per_unit_s / 50e9, 1.0, 0.03);
  EXPECT_NEAR(fit.fixed_s / 8e-6, 1.0, 0.25);
  EXPECT_LT(fit.rms_relative_error, 0.04);
  EXPECT_EQ(fit.points, points.size());

  // Without noise the line is exact.
  std::vector<std::pair<double, double>> exact;
  for (double n : {4.0, 16.0, 48.0, 96.0}) exact.emplace_back(n, 3e-6 + n * 2.2e-6);
  const LinearCostFit line = fit_linear_cost(exact, "launch");
  EXPECT_NEAR(line.per_unit_s, 2.2e-6, 1e-15);
  EXPECT_NEAR(line.fixed_s, 3e-6, 1e-15);
}

TEST(CalibrationFit, SaturatingCurveRecoversKnownParameters) {
  const SaturatingCurve cases[] = {{0.72, 3e9, 0.8}, {0.55, 4e10, 1.6}, {0.9, 5e8, 1.0}};
  std::uint32_t seed = 11;
  for (const auto& truth : cases) {
    SCOPED_TRACE("e_max " + std::to_string(truth.e_max) + ", F_half " + std::to_string(truth.flops_half) + ", p " + std::to_string(truth.exponent));
    // Exact points: the parameters come back to fit precision.
    std::vector<std::pair<double, double>> exact, noisy;
    Noise noise(0.02, seed++);
    for (double f : log_spaced(1e7, 1e13, 20)) {
      exact.emplace_back(f, truth.at(f));
      noisy.emplace_back(f, truth.at(f) * noise());
    }
    const SaturatingFit e = fit_saturating(exact, "gemm");
    EXPECT_NEAR(e.curve.e_max / truth.e_max, 1.0, 1e-6);
    EXPECT_NEAR(e.curve.flops_half / truth.flops_half, 1.0, 1e-5);
    EXPECT_NEAR(e.curve.exponent / truth.exponent, 1.0, 1e-5);
    EXPECT_LT(e.rms_log_error, 1e-8);
    // 2% noise: within a few percent, and the residual is the noise.
    const SaturatingFit n = fit_saturating(noisy, "gemm");
    EXPECT_NEAR(n.curve.e_max / truth.e_max, 1.0, 0.03);
    EXPECT_NEAR(n.curve.flops_half / truth.flops_half, 1.0, 0.15);
    EXPECT_NEAR(n.curve.exponent / truth.exponent, 1.0, 0.10);
    EXPECT_GT(n.rms_log_error, 0.01);
    EXPECT_LT(n.rms_log_error, 0.03);
    for (double f : {1e8, 1e10, 1e12}) EXPECT_NEAR(n.curve.at(f) / truth.at(f), 1.0, 0.03) << f;
  }
}

TEST(CalibrationFit, EfficiencyPointsTakeOutTheLaunchCostAndLaunchBoundPoints) {
  const double peak = 1000e12, launch = 2e-6;
  const std::vector<KernelPoint> points = {{"small", 1e6, 2.1e-6}, {"mid", 1e9, 2e-6 + 2e-6}, {"large", 1e12, 2e-6 + 2e-3}};
  std::size_t dropped = 0;
  const auto e = efficiency_points(points, peak, launch, "gemm", &dropped);
  EXPECT_EQ(dropped, 1u);  // 2.1 us of which 2 us is launch: nothing to learn about throughput
  ASSERT_EQ(e.size(), 2u);
  EXPECT_DOUBLE_EQ(e[0].first, 1e9);
  EXPECT_NEAR(e[0].second, 0.5, 1e-9);  // 1 GFLOP in 2 us of compute at 1 PFLOP/s peak
  EXPECT_NEAR(e[1].second, 0.5, 1e-9);
}

TEST(CalibrationProfile, WrittenProfileLoadsAndTheSimulatorGetsTheFittedValues) {
  test::TempDir dir;
  const Truth truth;
  const Measurements m = synthetic(truth, 0.015, 2024);
  const std::string out = (dir.path() / "measured" / "h100-test.json").string();
  check_output_path(out);
  const CalibrationFits fits = write_calibrated_profile(m, h100_document(), "hwprofiles/gpus/h100-sxm.json (built-in)", out);
  const hw::GpuProfile gpu = hw::load_gpu(out, "--gpu");  // hw::parse_gpu on the file
  EXPECT_EQ(gpu.name, "h100-test");
  EXPECT_NE(gpu.description.find("calibrated on NVIDIA H100 80GB HBM3 2026-03-01"), std::string::npos);

  // The tables are the fitted curves: exactly at their points, closely in between (linear in log10 FLOPs).
  const std::pair<const hw::EfficiencyTable*, const SaturatingFit*> tables[] = {
      {&gpu.sustained.gemm, &fits.gemm}, {&gpu.sustained.attention_fwd, &fits.attention_fwd}, {&gpu.sustained.attention_bwd, &fits.attention_bwd}};
  for (const auto& [table, fit] : tables) {
    // Over the range measured: from at most a tenth of a decade below the smallest call to above the largest.
    ASSERT_GE(table->points.size(), 20u);
    EXPECT_LE(table->points.front().first, fit->flops_min);
    EXPECT_GT(table->points.front().first, fit->flops_min / 1.27);
    EXPECT_GE(table->points.back().first, fit->flops_max);
    EXPECT_LT(table->points.back().first, fit->flops_max * 1.27);
    for (const auto& [flops, e] : table->points) EXPECT_DOUBLE_EQ(table->at(flops), std::clamp(fit->curve.at(flops), 1e-6, 1.0));
    for (double f : log_spaced(fit->flops_min, fit->flops_max, 13)) EXPECT_NEAR(table->at(f) / fit->curve.at(f), 1.0, 0.02) << f;
  }
  // The smallest GEMM (128^3, 4.19 MFLOP) starts the table at the grid point below it: 3.98, 5.01, 6.31 MFLOP, ...
  EXPECT_EQ(gpu.sustained.gemm.points[0].first, 3.98e6);
  EXPECT_EQ(gpu.sustained.gemm.points[1].first, 5.01e6);
  EXPECT_EQ(gpu.sustained.gemm.points[2].first, 6.31e6);
  EXPECT_EQ(gpu.sustained.gemm.points[4].first, 1e7);
  // ... and they are close to the truth the points were made from, over the measured range.
  for (const auto& g : full_sweep().gemm) {
    const double f = gemm_flops(g);
    EXPECT_NEAR(gpu.sustained.gemm.at(f) / truth.gemm.at(f), 1.0, f < 1e8 ? 0.10 : 0.04) << f;
  }
  EXPECT_NEAR(gpu.sustained.attention_fwd.at(1e11) / truth.attention_fwd.at(1e11), 1.0, 0.04);
  EXPECT_NEAR(gpu.sustained.attention_bwd.at(1e12) / truth.attention_bwd.at(1e12), 1.0, 0.04);

  // The scalar figures.
  EXPECT_NEAR(gpu.sustained.kernel_launch_ns.value, truth.launch_s * 1e9, 0.03 * truth.launch_s * 1e9);
  EXPECT_NEAR(gpu.sustained.pcie_h2d_GBps.value, truth.h2d_GBps, 0.02 * truth.h2d_GBps);
  EXPECT_NEAR(gpu.sustained.pcie_d2h_GBps.value, truth.d2h_GBps, 0.02 * truth.d2h_GBps);
  EXPECT_NEAR(gpu.sustained.hbm_efficiency.value, 2 * truth.d2d_GBps / 3350.0, 0.02);
  double largest_gemm = 0;
  for (const auto& p : m.gemm) largest_gemm = std::max(largest_gemm, p.flops);
  EXPECT_DOUBLE_EQ(gpu.sustained.gemm_efficiency.value, fits.gemm.curve.at(largest_gemm));
  EXPECT_DOUBLE_EQ(gpu.sustained.gemm_efficiency.value, fits.gemm_efficiency);

  // Every calibrated figure says it was measured, when, by what, on which device, and how it was fitted; the
  // datasheet figures keep their sources; the estimates the measurements replaced are gone.
  for (const hw::Figure* f : {&gpu.sustained.gemm_efficiency, &gpu.sustained.hbm_efficiency, &gpu.sustained.pcie_h2d_GBps,
                              &gpu.sustained.pcie_d2h_GBps, &gpu.sustained.kernel_launch_ns}) {
    EXPECT_EQ(f->source.kind, json::Source::Kind::measured) << f->source_id;
    EXPECT_EQ(f->source.date, "2026-03-01");
    EXPECT_EQ(f->source.command, m.command);
    EXPECT_NE(f->source.device.find("NVIDIA H100 80GB HBM3"), std::string::npos);
    EXPECT_NE(f->source.basis.find("12:34:56 UTC"), std::string::npos);
  }
  for (const auto* table : {&gpu.sustained.gemm, &gpu.sustained.attention_fwd, &gpu.sustained.attention_bwd}) {
    EXPECT_EQ(table->source.kind, json::Source::Kind::measured);
    EXPECT_NE(table->source.basis.find("e(F) = e_max / (1 + (F_half / F)^p)"), std::string::npos) << table->source_id;
    EXPECT_NE(table->source.describe().find("measured 2026-03-01 on NVIDIA H100"), std::string::npos);
  }
  EXPECT_NE(gpu.sustained.gemm.source.basis.find("cuBLASLt"), std::string::npos);
  EXPECT_NE(gpu.sustained.attention_fwd.source.basis.find("32 heads, 8 K/V heads, head_dim 128"), std::string::npos);
  EXPECT_EQ(gpu.peak_dense_tflops[0].source.kind, json::Source::Kind::datasheet);
  const auto doc = json::parse_file(out);
  EXPECT_FALSE(doc["sources"].contains("est_shape"));
  EXPECT_FALSE(doc["sources"].contains("est_pcie"));
  EXPECT_TRUE(doc["sources"].contains("whitepaper"));
  EXPECT_EQ(doc["calibration"]["nccl"]["measured"], false);
  EXPECT_EQ(doc["calibration"]["nccl"]["note"], m.nccl_note);
  EXPECT_EQ(doc["calibration"]["points"]["gemm"].size(), m.gemm.size());
  EXPECT_EQ(doc["calibration"]["device"]["name"], "NVIDIA H100 80GB HBM3");

  // The simulator's cost of a GEMM on the calibrated profile is the time it was "measured" at.
  hw::NodeProfile node = hw::load_node("dgx-h100");
  node.gpu = gpu;
  for (const GemmShape& g : {GemmShape{4096, 4096, 4096}, GemmShape{8192, 28672, 4096}, GemmShape{2048, 4096, 14336, false, false}}) {
    sim::Task task;
    task.device = 0;
    task.params = sim::Gemm{g.m, g.n, g.k, hw::Dtype::bf16};
    const double truth_s = gemm_flops(g) / (989.4e12 * truth.gemm.at(gemm_flops(g))) + truth.launch_s;
    EXPECT_NEAR(static_cast<double>(sim::ComputeModel(node, stacks::default_stack()).duration_ns(task)) * 1e-9 / truth_s, 1.0, 0.04)
        << g.m << "x" << g.n << "x" << g.k;
  }
  // Nothing else was left in the folder (the temporary file was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path() / "measured"), fs::directory_iterator()), 1);
}

// The CPU device's elementwise kernels and AdamW run far below its copy rate; where the sweep measures them, the
// profile carries their own rates and the simulator times those tasks by them (else by the HBM rate, as before).
TEST(CalibrationProfile, ElementwiseAndOptimizerRatesWhereMeasuredTimeThoseTasks) {
  test::TempDir dir;
  Measurements m = synthetic(Truth{}, 0.0, 7);
  const double elementwise_GBps = 0.5, optimizer_GBps = 2.0;
  for (double bytes : {16e3, 64e3, 256e3, 1e6}) {
    m.elementwise.push_back({bytes, 3e-6 + bytes / (elementwise_GBps * 1e9)});
    m.optimizer.push_back({30 * bytes, 1e-6 + 30 * bytes / (optimizer_GBps * 1e9)});
  }
  const std::string out = (dir.path() / "with-elementwise.json").string();
  write_calibrated_profile(m, h100_document(), "h100-sxm", out);
  const hw::GpuProfile gpu = hw::load_gpu(out, "--gpu");
  EXPECT_NEAR(gpu.sustained.elementwise_GBps.value, elementwise_GBps, 1e-6);
  EXPECT_NEAR(gpu.sustained.optimizer_GBps.value, optimizer_GBps, 1e-6);
  EXPECT_EQ(gpu.sustained.elementwise_GBps.source.kind, json::Source::Kind::measured);

  hw::NodeProfile node = hw::load_node("dgx-h100");
  const auto duration_s = [&](const hw::GpuProfile& profile, sim::TaskParams params) {
    node.gpu = profile;
    sim::Task task;
    task.device = 0;
    task.params = params;
    return static_cast<double>(sim::ComputeModel(node, stacks::default_stack()).duration_ns(task)) * 1e-9 -
           profile.sustained.kernel_launch_ns.value * 1e-9;
  };
  EXPECT_NEAR(duration_s(gpu, sim::Elementwise{500'000, 500'000}), 1e6 / (elementwise_GBps * 1e9), 1e-8);
  EXPECT_NEAR(duration_s(gpu, sim::OptimizerStep{30'000'000}), 3e7 / (optimizer_GBps * 1e9), 1e-8);
  // Without the series (a GPU's sweep): no such figures, and elementwise work streams at the HBM rate.
  const std::string plain = (dir.path() / "plain.json").string();
  write_calibrated_profile(synthetic(Truth{}, 0.0, 7), h100_document(), "h100-sxm", plain);
  const hw::GpuProfile gpu_plain = hw::load_gpu(plain, "--gpu");
  EXPECT_EQ(gpu_plain.sustained.elementwise_GBps.value, 0);
  EXPECT_NEAR(duration_s(gpu_plain, sim::Elementwise{500'000, 500'000}),
              1e6 / (gpu_plain.hbm_GBps.value * gpu_plain.sustained.hbm_efficiency.value * 1e9), 1e-8);
}

TEST(CalibrationProfile, BadMeasurementsFailClearlyAndWriteNothing) {
  test::TempDir dir;
  const std::string out = (dir.path() / "h100-bad.json").string();
  const auto expect_failure = [&](Measurements m, const std::string& needle) {
    try {
      write_calibrated_profile(m, h100_document(), "h100-sxm", out);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(out));
    EXPECT_TRUE(folder_is_empty(dir.path()));
  };
  const Measurements good = synthetic(Truth{}, 0.01, 5);

  Measurements few = good;
  few.gemm.resize(3);
  expect_failure(few, "field 'gemm': expected at least 4 points");
  Measurements zero_time = good;
  zero_time.gemm[1].seconds = 0;
  expect_failure(zero_time, "field 'gemm[1].seconds': expected a positive, finite time");
  Measurements negative_flops = good;
  negative_flops.attention_bwd[2].flops = -1;
  expect_failure(negative_flops, "field 'attention_bwd[2].flops'");
  Measurements no_copies = good;
  no_copies.d2h_pageable.clear();
  expect_failure(no_copies, "field 'd2h_pageable': expected at least 3 points");
  Measurements flat = good;  // copies that take the same time whatever their size: no rate
  for (auto& p : flat.h2d_pinned) p.seconds = 1e-3 * (p.bytes < 1e6 ? 2 : 1);
  expect_failure(flat, "field 'h2d_pinned': expected times that grow with the size");
  // Faster than the base profile's PCIe link allows: the wrong base profile.
  Truth fast;
  fast.h2d_GBps = 80;
  expect_failure(synthetic(fast, 1e-6, 1), "at most the raw PCIe Gen5 x16 rate of 63.0 GB/s");

  // An existing profile is left as it was when a later run fails.
  std::ofstream(out) << "previous";
  EXPECT_THROW(write_calibrated_profile(few, h100_document(), "h100-sxm", out), InputError);
  EXPECT_EQ(test::read_file(out), "previous");
}

TEST(CalibrationProfile, UnwritableOutPathFailsNamingOutAndLeavesNoFile) {
  test::TempDir dir;
  const std::string file = dir.write("plain-file", "x");
  fs::create_directory(dir.path() / "folder.json");
  const Measurements m = synthetic(Truth{}, 0.01, 6);
  // Under a regular file, deeper under it, and a folder where the file should be.
  for (const std::string& out : {file + "/h100.json", file + "/sub/h100.json", (dir.path() / "folder.json").string()}) {
    SCOPED_TRACE(out);
    try {
      write_calibrated_profile(m, h100_document(), "h100-sxm", out);
      ADD_FAILURE() << "no error";
    } catch (const InputError& e) {
      EXPECT_EQ(e.origin(), "--out") << e.what();
      EXPECT_NE(std::string(e.what()).find(out), std::string::npos) << e.what();
    }
    EXPECT_THROW(check_output_path(out), InputError);
  }
  EXPECT_EQ(test::read_file(file), "x");
  EXPECT_TRUE(folder_is_empty(dir.path() / "folder.json"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);  // plain-file, folder.json

  EXPECT_EQ(profile_name_from_path("hwprofiles/measured/h100-lab.json"), "h100-lab");
  for (const char* bad : {"profile.txt", "hwprofiles/measured/", ".json", "noextension"}) {
    EXPECT_THROW(profile_name_from_path(bad), InputError) << bad;
  }
}

TEST(CalibrationProfile, CalibrationRecordMustBeAnObject) {
  auto doc = h100_document();
  doc["calibration"] = 3;
  try {
    hw::parse_gpu(doc, "x.json");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("calibration"), std::string::npos) << e.what();
  }
  doc["calibration"] = json::Json::object();
  EXPECT_NO_THROW(hw::parse_gpu(doc, "x.json"));
}

TEST(CalibrationDevice, DeviceNamesMapToBuiltinProfiles) {
  const std::pair<const char*, const char*> cases[] = {
      {"NVIDIA H100 80GB HBM3", "h100-sxm"},
      {"NVIDIA H100 PCIe", "h100-pcie"},
      {"NVIDIA H200", "h200-sxm"},
      {"NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"},
      {"NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"},
      {"NVIDIA A100 80GB PCIe", "a100-80gb-pcie"},
      {"NVIDIA L40S", "l40s"},
      {"NVIDIA GeForce RTX 4090", "rtx-4090"},
  };
  for (const auto& [device, profile] : cases) {
    const auto match = builtin_gpu_for_device(device);
    ASSERT_TRUE(match.has_value()) << device;
    EXPECT_EQ(*match, profile) << device;
  }
  for (const char* other : {"NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100-PCIE-40GB", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090 D"}) {
    EXPECT_FALSE(builtin_gpu_for_device(other).has_value()) << other;
  }
}

TEST(CalibrationSweep, SweepsFitTheirTimeBudgets) {
  // The full sweep must take <= 5 minutes on an H100 and --quick about 30 s. The estimate (from the profile's own
  // figures, 10 s of setup included) is about 37 s and 11 s: the bounds leave over 3x for kernels slower than the
  // profile says (the attention kernels are unmeasured), and hold on the slower A100 40GB too.
  const SweepPlan full = full_sweep(), quick = quick_sweep();
  const double full_h100 = estimated_seconds(full, hw::load_gpu("h100-sxm")), quick_h100 = estimated_seconds(quick, hw::load_gpu("h100-sxm"));
  EXPECT_LT(full_h100, 90.0);
  EXPECT_LT(quick_h100, 20.0);
  EXPECT_LT(estimated_seconds(full, hw::load_gpu("a100-40gb-sxm")), 100.0);
  EXPECT_LT(quick_h100, full_h100 / 2);
  // Enough points for every fit, and launch counts the blocking kernel can hold.
  for (const SweepPlan* plan : {&full, &quick}) {
    EXPECT_GE(plan->gemm.size(), 6u);
    EXPECT_GE(plan->attention.size(), 6u);
    EXPECT_GE(plan->copy_bytes.size(), 3u);
    EXPECT_GE(plan->d2d_bytes.size(), 3u);
    EXPECT_GE(plan->launch_counts.size(), 3u);
    for (int count : plan->launch_counts) EXPECT_LE(count, plan->max_calls_per_trial);
    EXPECT_GE(plan->repeats, 3);
  }
}

TEST(CalibrationCli, WithoutAGpuItSaysSoAndWritesNothing) {
  test::TempDir dir;
  const fs::path out = dir.path() / "measured" / "here.json";
  // Hide every GPU from the child, so the no-GPU path runs here whatever the machine has.
  const char* previous = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string saved = previous ? previous : "";
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  const auto r = test::run_cli("calibrate --quick --out " + out.string());
  if (previous) ::setenv("CUDA_VISIBLE_DEVICES", saved.c_str(), 1);
  else ::unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.err.find("needs a usable CUDA GPU") != std::string::npos || r.err.find("built without") != std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing was written"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out.parent_path()));

  // Flags are checked before anything else.
  const auto no_out = test::run_cli("calibrate");
  EXPECT_EQ(no_out.exit_code, 2);
  EXPECT_NE(no_out.err.find("--out"), std::string::npos) << no_out.err;
  const auto not_json = test::run_cli("calibrate --out " + (dir.path() / "x.txt").string());
  EXPECT_EQ(not_json.exit_code, 2);
  EXPECT_NE(not_json.err.find("ending in .json"), std::string::npos) << not_json.err;
  const auto bad_base = test::run_cli("calibrate --base no-such-gpu --out " + out.string());
  EXPECT_EQ(bad_base.exit_code, 2);
  EXPECT_NE(bad_base.err.find("--base"), std::string::npos) << bad_base.err;
  EXPECT_TRUE(folder_is_empty(dir.path()));
  const auto help = test::run_cli("calibrate --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--quick"), std::string::npos);
}

// ---- calibrate --from-trace (calibrate/trace_calibration.hpp) ------------------------------------------------------

namespace {

const std::string kRealTraces = std::string(TRAINYARD_TEST_DATA_DIR) + "/traces/real/";

std::vector<traces::RankTrace> real_traces() {
  return {traces::read_kineto_file(kRealTraces + "kineto-h2048-s8192.json.gz"), traces::read_kineto_file(kRealTraces + "kineto-h1024-s4096.json.gz")};
}

const TraceGemmPoint* find_gemm(const TracePoints& p, const std::string& shape) {
  for (const auto& g : p.gemm) {
    if (g.point.shape == shape) return &g;
  }
  return nullptr;
}

// The simulator's time for a traced attention call on `gpu` (ComputeModel, its fused-kernel model), without the
// launch cost it adds to every task: what the trace's kernels took. A call's batch adds up like heads.
double modelled_attention_s(const TraceAttentionPoint& p, const hw::GpuProfile& gpu) {
  hw::NodeProfile node = hw::load_node("lab-h200");
  node.gpu = gpu;
  stacks::StackProfile stack = stacks::default_stack();
  stack.attention.preference = {*stacks::attention_impl_named(p.family)};
  const sim::ComputeModel compute(node, stack);
  sim::Attention a = p.attention;
  a.heads = static_cast<std::int32_t>(a.heads * p.batch);
  a.kv_heads = static_cast<std::int32_t>(a.kv_heads * p.batch);
  sim::TaskGraph g;
  const sim::TaskId id = g.attention("attention", 0, a);
  return (static_cast<double>(compute.duration_ns(g.task(id))) - gpu.sustained.kernel_launch_ns.value) * 1e-9;
}

double modelled_gemm_s(const TraceGemmPoint& p, const hw::GpuProfile& gpu) {
  return p.point.flops / (gpu.peak_tflops(hw::Dtype::bf16) * 1e12 * gpu.sustained.gemm.at(p.point.flops) * sim::gemm_wave_efficiency(p.gemm, gpu));
}

}  // namespace

// Two real PyTorch 2.11 traces of an H200 (scripts/kineto_capture.py; tests/data/traces/README.md): every GEMM op
// and the cuDNN attention ops give points of their recorded shapes.
TEST(TraceCalibration, RealTracesGivePointsFromTheirOpsShapes) {
  const TracePoints p = trace_points(real_traces(), traces::KernelClassifier());
  EXPECT_EQ(p.device_name, "NVIDIA H200");
  EXPECT_EQ(p.gemm.size(), 28u);  // 14 per model: 7 weights (qkv, out, gate_up, down, head) x forward, dgrad, wgrad shapes
  ASSERT_EQ(p.attention.size(), 4u);
  const TraceGemmPoint* up = find_gemm(p, "aten::mm [8192,2048]x[2048,11264]");
  ASSERT_NE(up, nullptr);
  EXPECT_DOUBLE_EQ(up->point.flops, 2.0 * 8192 * 2048 * 11264);
  EXPECT_GT(up->point.seconds, 0.2e-3);  // ~0.48 ms at ~780 TFLOP/s
  EXPECT_LT(up->point.seconds, 1.0e-3);
  int cudnn_backward = 0;
  for (const auto& a : p.attention) {
    EXPECT_EQ(a.family, "cudnn");
    EXPECT_TRUE(a.attention.causal) << a.shape;
    EXPECT_EQ(a.attention.head_dim, 128);
    cudnn_backward += a.attention.backward;
  }
  EXPECT_EQ(cudnn_backward, 2);
  EXPECT_GT(p.calls, 400);
}

// Fitted in the simulator's own forms, the profile times the traced calls back: attention exactly (two shapes, two
// parameters per pass), GEMMs closer than the built-in H200 profile does.
TEST(TraceCalibration, TheProfilePredictsTheTracedCallsBack) {
  const TracePoints p = trace_points(real_traces(), traces::KernelClassifier());
  const json::Json base_doc = hw::load_gpu_document("h200-sxm").json;
  const hw::GpuProfile base = hw::gpu_from_document(base_doc, "h200-sxm");
  const TraceFits fits = fit_trace(p, base);
  ASSERT_TRUE(fits.gemm.has_value());
  ASSERT_EQ(fits.attention.size(), 2u);
  for (const auto& f : fits.attention) EXPECT_TRUE(f.overhead_fitted) << f.family;
  const hw::GpuProfile calibrated = hw::parse_gpu(trace_calibrated_profile(base_doc, "h200-trace", p, fits, "test"), "h200-trace.json");
  for (const auto& a : p.attention) EXPECT_NEAR(modelled_attention_s(a, calibrated) / a.seconds, 1.0, 1e-4) << a.shape;  // whole ns
  double stock_error = 0, calibrated_error = 0;
  for (const auto& g : p.gemm) {
    stock_error += std::abs(std::log(modelled_gemm_s(g, base) / g.point.seconds));
    calibrated_error += std::abs(std::log(modelled_gemm_s(g, calibrated) / g.point.seconds));
  }
  EXPECT_LT(calibrated_error / static_cast<double>(p.gemm.size()), 0.06);  // 4.1% mean, the stock profile 16.8%
  EXPECT_LT(calibrated_error, 0.5 * stock_error);
  EXPECT_EQ(calibrated.sustained.attention_kernels.at("cudnn").forward.source_id, "trace_attention_cudnn_fwd");
}

// NCCL kernels made from a known link model (NVLink of the H100 profile) give it back, and the library loads.
TEST(TraceCalibration, CollectivesRecoverTheLinkModelTheyWereMadeWith) {
  const hw::GpuProfile gpu = hw::load_gpu("h100-sxm");
  const double rate = gpu.nvlink_data_GBps() * 1e9, base_s = 20e-6, step_s = 4e-6, efficiency = 0.8;
  traces::RankTrace r;
  r.origin = "nccl.json";
  r.device_name = "NVIDIA H100 80GB HBM3";
  r.names = {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllGather_RING_LL"};
  std::int64_t start = 0;
  for (int i = 0; i < 8; ++i) {
    const bool all_reduce = i % 2 == 0;
    const std::int64_t elements = std::int64_t{1} << (16 + 2 * i);
    const auto op = all_reduce ? sim::CollectiveOp::all_reduce : sim::CollectiveOp::all_gather;
    const double seconds = base_s + sim::collective_steps(op, sim::Algorithm::ring, 8) * step_s +
                           sim::bytes_sent_per_rank(op, sim::Algorithm::ring, 8, elements * 2) / (efficiency * rate);
    r.collectives.push_back({all_reduce ? "allreduce" : "allgather", elements, elements, 8, "BFloat16"});
    const auto ns = static_cast<std::int64_t>(std::llround(seconds * 1e9));
    r.activities.push_back({traces::GpuActivity::Kind::kernel, all_reduce ? 0u : 1u, 0, 20, start, ns, 0, i});
    start += ns + 1000;
  }
  const TracePoints p = trace_points({r}, traces::KernelClassifier());
  ASSERT_EQ(p.collectives.size(), 8u);
  const TraceFits fits = fit_trace(p, gpu);
  ASSERT_TRUE(fits.collectives.has_value());
  EXPECT_NEAR(fits.collectives->base_s, base_s, 1e-8);
  EXPECT_NEAR(fits.collectives->step_s, step_s, 1e-8);
  EXPECT_NEAR(fits.collectives->efficiency, efficiency, 1e-4);
  EXPECT_FALSE(fits.gemm.has_value());
  const stacks::CollectiveLibrary library = stacks::parse_collective_library(trace_collective_library("t-collectives", p, fits, "test"),
                                                                             "t-collectives.json");
  ASSERT_EQ(library.protocols.size(), 1u);
  EXPECT_NEAR(library.protocols[0].efficiency.value, efficiency, 1e-4);
}

// GEMMs made from a known curve, each slowed by its wave quantization as the simulator slows it, give the curve
// back: the fit divides the waves out rather than folding them into the table.
TEST(TraceCalibration, GemmWavesAreDividedOutOfTheCurve) {
  const hw::GpuProfile gpu = hw::load_gpu("h200-sxm");
  const SaturatingCurve truth{0.85, 2e10, 1.3};
  TracePoints p;
  p.origins = {"synthetic"};
  double slowest_wave = 1;
  for (std::int64_t m : {512, 1024, 2048, 4096, 4224, 8192, 8320, 12288, 16512}) {
    TraceGemmPoint g;
    g.gemm = sim::Gemm{m, m + 640, 4096, hw::Dtype::bf16};
    g.point.flops = sim::compute_cost(g.gemm).hardware_flops;
    const double wave = sim::gemm_wave_efficiency(g.gemm, gpu);
    slowest_wave = std::min(slowest_wave, wave);
    g.point.seconds = g.point.flops / (gpu.peak_tflops(hw::Dtype::bf16) * 1e12 * truth.at(g.point.flops) * wave);
    g.point.shape = std::to_string(m);
    p.gemm.push_back(g);
  }
  ASSERT_LT(slowest_wave, 0.9);  // the shapes do exercise the waves
  const TraceFits fits = fit_trace(p, gpu);
  ASSERT_TRUE(fits.gemm.has_value());
  for (const auto& g : p.gemm) EXPECT_NEAR(fits.gemm->curve.at(g.point.flops) / truth.at(g.point.flops), 1.0, 1e-3) << g.point.shape;
}

// Attention traced at two head_dims, two lengths each, made from known kernel figures: each head_dim's ceiling
// comes back and every call is timed back, one fit not overwriting the other.
TEST(TraceCalibration, AttentionAtTwoHeadDimsKeepsEachFit) {
  const json::Json base_doc = hw::load_gpu_document("h200-sxm").json;
  const hw::GpuProfile base = hw::gpu_from_document(base_doc, "h200-sxm");
  json::Json truth_doc = base_doc;
  auto& cudnn = truth_doc["sustained"]["attention_kernels"]["cudnn"];
  cudnn["forward"]["ceiling_by_head_dim"] = {{64, 0.30}, {128, 0.75}, {256, 0.70}};
  cudnn["forward"]["block_overhead_keys"]["value"] = 500;
  const hw::GpuProfile truth = hw::gpu_from_document(truth_doc, "truth");
  TracePoints p;
  p.origins = {"synthetic"};
  for (int head_dim : {64, 128}) {
    for (std::int64_t length : {2048, 8192}) {
      TraceAttentionPoint a;
      a.family = "cudnn";
      a.attention = sim::Attention{length, length, 16, 16, head_dim, true, false, 1};
      a.shape = std::to_string(head_dim) + "/" + std::to_string(length);
      a.seconds = modelled_attention_s(a, truth);
      a.calls = 1;
      p.attention.push_back(a);
    }
  }
  const TraceFits fits = fit_trace(p, base);
  ASSERT_EQ(fits.attention.size(), 2u);
  const hw::GpuProfile calibrated = hw::parse_gpu(trace_calibrated_profile(base_doc, "two", p, fits, "test"), "two.json");
  for (const auto& a : p.attention) EXPECT_NEAR(modelled_attention_s(a, calibrated) / a.seconds, 1.0, 1e-4) << a.shape;  // whole ns
  const auto& forward = calibrated.sustained.attention_kernels.at("cudnn").forward;
  EXPECT_NEAR(forward.ceiling(64), 0.30, 1e-4);  // (the calls' times are whole nanoseconds)
  EXPECT_NEAR(forward.ceiling(128), 0.75, 1e-4);
  EXPECT_NEAR(forward.block_overhead_keys.value, 500, 1.0);
}

TEST(TraceCalibration, NothingToFitAndMixedGpusAreErrorsNamingTheTrace) {
  traces::RankTrace r;
  r.origin = "elementwise-only.json";
  r.device_name = "NVIDIA H200";
  r.names = {"void at::native::vectorized_elementwise_kernel<4>"};
  r.activities.push_back({traces::GpuActivity::Kind::kernel, 0, 0, 7, 0, 1000, 0, -1});
  const hw::GpuProfile gpu = hw::load_gpu("h200-sxm");
  try {
    fit_trace(trace_points({r}, traces::KernelClassifier()), gpu);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("elementwise-only.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("record_shapes"), std::string::npos) << e.what();
  }
  traces::RankTrace other = r;
  other.origin = "other.json";
  other.device_name = "NVIDIA H100 80GB HBM3";
  EXPECT_THROW(trace_points({r, other}, traces::KernelClassifier()), InputError);
}

TEST(TraceCalibration, CliWritesAProfileTheSimulatorUses) {
  test::TempDir dir;
  const fs::path out = dir.path() / "h200-trace.json";
  const auto r = test::run_cli("calibrate --from-trace " + kRealTraces + "kineto-h2048-s8192.json.gz " + kRealTraces +
                               "kineto-h1024-s4096.json.gz --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("from 2 trace(s) of NVIDIA H200"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention cudnn forward, head_dim 128"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.path() / "h200-trace-collectives.json"));  // one rank: no collective moved anything
  const auto sim = test::run_cli(
      "simulate --strategy zero --zero-stage 0 --model custom:layers=4,hidden=2048,heads=16,kv_heads=8,head_dim=128,"
      "ffn_hidden=5632,vocab=32000 --hw lab-h200 --seq 8192 --global-batch 1 --stack torchtitan --gpu-profile " +
      out.string());
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_NE(sim.out.find("h200-trace"), std::string::npos) << sim.out;
  // validate times the user's own cases on it (benchmarks/results/h200-small-llama-cases.json: this job's steps).
  const std::string cases = std::string(TRAINYARD_SOURCE_DIR) + "/benchmarks/results/h200-small-llama-cases.json";
  const auto stock = test::run_cli("validate --cases " + cases + " --json");
  const auto calibrated = test::run_cli("validate --cases " + cases + " --gpu-profile " + out.string() + " --json");
  ASSERT_EQ(stock.exit_code, 0) << stock.err;
  ASSERT_EQ(calibrated.exit_code, 0) << calibrated.err;
  const auto predicted = [](const std::string& text) {
    return nlohmann::json::parse(text)[0]["cases"][1]["figures"][0]["predicted"].get<double>();  // the 8192-token step
  };
  EXPECT_LT(predicted(calibrated.out), 0.98 * predicted(stock.out));                // faster GEMMs on the fitted curve
  EXPECT_EQ(test::run_cli("validate --gpu-profile " + out.string()).exit_code, 2);  // not with the built-in suite
  const auto refused = test::run_cli("calibrate --from-trace " + kRealTraces + "kineto-h1024-s4096.json.gz --quick --out " + out.string());
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("--quick"), std::string::npos) << refused.err;
  const auto nsys = test::run_cli("calibrate --from-trace " + std::string(TRAINYARD_TEST_DATA_DIR) + "/traces/nsys/ranks/nodeB-rank0.sqlite --out " +
                                  (dir.path() / "n.json").string());
  EXPECT_EQ(nsys.exit_code, 2);
  EXPECT_NE(nsys.err.find("records no op shapes"), std::string::npos) << nsys.err;
  EXPECT_FALSE(fs::exists(dir.path() / "n.json"));
  // A base of another GPU than the traces' is said (issue 45); the traces' own is not.
  EXPECT_EQ(r.err.find("warning: the traces ran on"), std::string::npos) << r.err;
  const auto other = test::run_cli("calibrate --from-trace " + kRealTraces + "kineto-h1024-s4096.json.gz --base a100-80gb-sxm --out " +
                                   (dir.path() / "a.json").string());
  EXPECT_EQ(other.exit_code, 0) << other.err;
  EXPECT_NE(other.err.find("the traces ran on \"NVIDIA H200\""), std::string::npos) << other.err;
}

}  // namespace trainyard::backend
