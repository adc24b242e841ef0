// `trainyard calibrate`'s measurements on a real GPU, at --quick size: every point present and positive, the
// figures plausible for a training GPU (bounds wide enough for an L40S or an H200, tight enough to catch a timing
// off by a unit or a trial that measured nothing), and the fitted profile written and loaded back.
// Skips, and says why, where no GPU is usable.
#include <filesystem>
#include <random>

#include "calibrate/calibrate_gpu.hpp"
#include "calibrate/calibration.hpp"
#include "hwprofiles/catalog.hpp"
#include "tests/gpu_support.hpp"

namespace trainyard::backend {

TEST(GpuCalibration, QuickSweepMeasuresPlausibleFiguresAndWritesAProfile) {
  TRAINYARD_REQUIRE_GPU();
  const CudaDevices found = query_cuda_devices();
  const CudaDevice& device = found.devices.front();
  const SweepPlan plan = quick_sweep();
  const Measurements m = measure_on_gpu(plan, device, static_cast<int>(found.devices.size()), "test_gpu_calibration", nullptr);

  EXPECT_EQ(m.device.name, device.name);
  EXPECT_EQ(m.gemm.size(), plan.gemm.size());
  EXPECT_EQ(m.attention_fwd.size(), plan.attention.size());
  EXPECT_EQ(m.attention_bwd.size(), plan.attention.size());
  EXPECT_TRUE(m.skipped.empty()) << m.skipped.front();
  for (const auto* series : {&m.h2d_pinned, &m.d2h_pinned, &m.h2d_pageable, &m.d2h_pageable, &m.h2d_both, &m.d2h_both}) {
    EXPECT_EQ(series->size(), plan.copy_bytes.size());
  }
  EXPECT_EQ(m.d2d.size(), plan.d2d_bytes.size());
  EXPECT_EQ(m.launch.size(), plan.launch_counts.size());
  EXPECT_EQ(m.launch_host.size(), plan.launch_counts.size());
  EXPECT_LT(m.duration_s, 60.0);
  EXPECT_FALSE(m.nccl_measured);
  EXPECT_FALSE(m.nccl_note.empty());

  // Throughput: the largest GEMM between 20 and 2000 TFLOP/s; attention above 5 TFLOP/s at its largest.
  double gemm_best = 0, fwd_best = 0, bwd_best = 0;
  for (const auto& p : m.gemm) gemm_best = std::max(gemm_best, p.flops / p.seconds);
  for (const auto& p : m.attention_fwd) fwd_best = std::max(fwd_best, p.flops / p.seconds);
  for (const auto& p : m.attention_bwd) bwd_best = std::max(bwd_best, p.flops / p.seconds);
  EXPECT_GT(gemm_best, 20e12);
  EXPECT_LT(gemm_best, 2000e12);
  EXPECT_GT(fwd_best, 5e12);
  EXPECT_GT(bwd_best, 5e12);
  EXPECT_LT(fwd_best, gemm_best * 1.5);
  // Larger GEMMs are not slower per FLOP than the smallest.
  EXPECT_GT(m.gemm.back().flops / m.gemm.back().seconds, m.gemm.front().flops / m.gemm.front().seconds);

  // Copies: PCIe between 1 and 130 GB/s each way (Gen3 x16 .. Gen6 x16); device to device above 100 GB/s.
  const auto rate = [](const std::vector<CopyPoint>& s) { return s.back().bytes / s.back().seconds; };
  for (const auto* series : {&m.h2d_pinned, &m.d2h_pinned, &m.h2d_pageable, &m.d2h_pageable, &m.h2d_both, &m.d2h_both}) {
    EXPECT_GT(rate(*series), 1e9);
    EXPECT_LT(rate(*series), 130e9);
  }
  EXPECT_GT(rate(m.d2d), 100e9);
  // Launch: 0.3 to 50 us per kernel queued; larger counts take longer.
  const auto& last = m.launch.back();
  EXPECT_GT(last.seconds / last.kernels, 0.3e-6);
  EXPECT_LT(last.seconds / last.kernels, 50e-6);
  EXPECT_GT(last.seconds, m.launch.front().seconds);

  // The fitted profile: written, loaded back, measured sources.
  const auto matched = builtin_gpu_for_device(device.name);
  if (!matched) GTEST_SKIP() << "measurements plausible; no built-in profile matches \"" << device.name << "\" to fit against";
  std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() / ("trainyard-gpu-calibration-" + std::to_string(rd()));
  const std::string out = (dir / "quick.json").string();
  check_output_path(out);
  const auto base = hw::load_gpu_document(*matched);
  write_calibrated_profile(m, base.json, base.origin, out);
  const hw::GpuProfile gpu = hw::load_gpu(out);
  EXPECT_EQ(gpu.name, "quick");
  EXPECT_EQ(gpu.sustained.gemm.source.kind, json::Source::Kind::measured);
  EXPECT_GT(gpu.sustained.gemm_efficiency.value, 0.1);
  EXPECT_GT(gpu.sustained.kernel_launch_ns.value, 300);
  std::filesystem::remove_all(dir);
}

}  // namespace trainyard::backend
