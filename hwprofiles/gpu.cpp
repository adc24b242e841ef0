#include "hwprofiles/gpu.hpp"

#include <cmath>

#include "common/error.hpp"
#include "common/units.hpp"

namespace trainyard::hw {

std::string_view to_string(Dtype dtype) {
  switch (dtype) {
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
    case Dtype::tf32: return "tf32";
    case Dtype::fp32: return "fp32";
  }
  return "?";
}

double pcie_GBps_per_direction(int generation, int lanes) {
  // Transfer rate per lane in GT/s and encoding efficiency, PCI Express Base Specifications 1.0-6.0.
  double gtps = 0, encoding = 128.0 / 130.0;
  switch (generation) {
    case 1:
      gtps = 2.5;
      encoding = 0.8;
      break;
    case 2:
      gtps = 5.0;
      encoding = 0.8;
      break;
    case 3: gtps = 8.0; break;
    case 4: gtps = 16.0; break;
    case 5: gtps = 32.0; break;
    case 6:
      gtps = 64.0;
      encoding = 242.0 / 256.0;
      break;  // FLIT mode
    default: TRAINYARD_CHECK(false, "PCIe generation out of range: " + std::to_string(generation));
  }
  return gtps * encoding / 8.0 * lanes;
}

namespace {
// Linear in log(x) between the points (x increasing), clamped at both ends (any base gives the same line).
double interpolate_in_log(const std::vector<std::pair<double, double>>& points, double x) {
  TRAINYARD_CHECK(!points.empty(), "an empty table of points");
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  std::size_t i = 1;
  while (points[i].first < x) ++i;
  const auto& [x0, y0] = points[i - 1];
  const auto& [x1, y1] = points[i];
  const double t = (std::log10(x) - std::log10(x0)) / (std::log10(x1) - std::log10(x0));
  return y0 + t * (y1 - y0);
}
}  // namespace

double EfficiencyTable::at(double flops) const { return interpolate_in_log(points, flops); }

double EfficiencyTable::best() const {
  double b = 0;
  for (const auto& [flops, fraction] : points) b = std::max(b, fraction);
  return b;
}

double AttentionKernel::Pass::ceiling(double head_dim) const { return interpolate_in_log(ceiling_by_head_dim, head_dim); }

double GpuProfile::pcie_raw_GBps_per_direction() const {
  return pcie_GBps_per_direction(static_cast<int>(pcie_generation.value), static_cast<int>(pcie_lanes.value));
}

double GpuProfile::ridge_flop_per_byte(Dtype dtype) const { return peak_tflops(dtype) * 1e12 / (hbm_GBps.value * 1e9); }

namespace {

// `key`: a non-empty array of [x, fraction] pairs, x increasing and accepted by `x_ok`, fractions in (0, 1];
// `expected` says so in the error.
std::vector<std::pair<double, double>> fraction_points(const json::Reader& r, std::string_view key, const std::string& expected,
                                                       bool (*x_ok)(double)) {
  const json::Json& points = r.raw(key);
  if (!points.is_array() || points.empty()) r.fail(key, expected, json::describe(points));
  std::vector<std::pair<double, double>> out;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    const bool ok = p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number() && x_ok(p[0].get<double>()) && p[1].get<double>() > 0 &&
                    p[1].get<double>() <= 1 && (i == 0 || p[0].get<double>() > out.back().first);
    if (!ok) r.fail(std::string(key) + "[" + std::to_string(i) + "]", expected, p.dump());
    out.emplace_back(p[0].get<double>(), p[1].get<double>());
  }
  return out;
}

// {"source": id, "points": [[flops, fraction], ...]} with FLOPs increasing and fractions in (0, 1].
EfficiencyTable parse_table(const json::Reader& parent, std::string_view key, const json::Sources& sources) {
  json::Reader r = parent.object(key);
  EfficiencyTable table;
  table.source = r.source("source", sources, &table.source_id);
  table.points = fraction_points(r, "points", "a non-empty array of [flops, fraction] pairs, flops increasing, fraction in (0, 1]",
                                 [](double flops) { return flops > 0; });
  r.finish();
  return table;
}

// {"source": id, "ceiling_by_head_dim": [[head_dim, fraction], ...], "block_overhead_keys": figure}
AttentionKernel::Pass parse_attention_pass(const json::Reader& parent, std::string_view key, const json::Sources& sources) {
  const json::Reader r = parent.object(key);
  AttentionKernel::Pass pass;
  pass.source = r.source("source", sources, &pass.source_id);
  pass.ceiling_by_head_dim = fraction_points(r, "ceiling_by_head_dim",
                                             "a non-empty array of [head_dim, fraction of peak] pairs, head_dim increasing, fraction in (0, 1]",
                                             [](double head_dim) { return head_dim >= 8 && head_dim <= 1024; });
  pass.block_overhead_keys = r.figure("block_overhead_keys", json::Bound{0, 1e6, "key positions"}, sources);
  r.finish();
  return pass;
}

std::map<std::string, AttentionKernel> parse_attention_kernels(const json::Reader& sustained, const json::Sources& sources) {
  std::map<std::string, AttentionKernel> kernels;
  if (!sustained.has("attention_kernels")) return kernels;
  const json::Reader all = sustained.object("attention_kernels");
  for (const auto& [name, value] : sustained.raw("attention_kernels").items()) {
    if (name != "flash2" && name != "flash3" && name != "cudnn") {
      all.fail(name, "an attention implementation trainyard models (flash2, flash3 or cudnn)", "\"" + name + "\"");
    }
    const json::Reader k = all.object(name);
    AttentionKernel kernel;
    kernel.block_queries = k.figure("block_queries", json::Bound{1, 4096, "query rows", true}, sources);
    kernel.forward = parse_attention_pass(k, "forward", sources);
    kernel.backward = parse_attention_pass(k, "backward", sources);
    k.finish();
    kernels.emplace(name, std::move(kernel));
  }
  all.finish();
  return kernels;
}

}  // namespace

GpuProfile parse_gpu(const json::Json& document, const std::string& origin) {
  using json::Bound;
  json::Reader top(document, origin);
  GpuProfile gpu;
  json::read_header(top, "trainyard.gpu.v1", gpu);
  const json::Sources sources = top.sources("sources");

  json::Reader peaks = top.object("peak_dense_tflops");
  for (Dtype dtype : kAllDtypes) {
    gpu.peak_dense_tflops[static_cast<int>(dtype)] = peaks.figure(to_string(dtype), Bound{0.1, 100000, "TFLOP/s"}, sources);
  }
  peaks.finish();
  // Bounds are wide but catch unit slips: HBM in GB instead of bytes, bandwidth in TB/s instead of GB/s.
  gpu.hbm_bytes = top.figure("hbm_bytes", Bound{1073741824.0, 17592186044416.0, "bytes", true, true}, sources);
  refuse_old_bandwidth_key(top, "hbm_gbps", "hbm_GBps");
  refuse_old_bandwidth_key(top, "nvlink_gbps_per_direction", "nvlink_GBps_per_direction");
  gpu.hbm_GBps = top.figure("hbm_GBps", Bound{50, 100000, "GB/s"}, sources);
  gpu.sm_count = top.figure("sm_count", Bound{1, 10000, "SMs", true}, sources);
  gpu.pcie_generation = top.figure("pcie_generation", Bound{1, 6, "", true}, sources);
  gpu.pcie_lanes = top.figure("pcie_lanes", Bound{1, 32, "lanes", true}, sources);
  gpu.nvlink_GBps_per_direction = top.figure("nvlink_GBps_per_direction", Bound{0, 10000, "GB/s"}, sources);

  json::Reader sustained = top.object("sustained");
  // Down to 0.01%: the CPU device's profile (cpu-device.json) measures plain loops against a nominal peak, and in
  // a sanitizer build on a busy machine they run below a tenth of a percent of it. Percent typed as a fraction (85)
  // still fails.
  gpu.sustained.gemm_efficiency = sustained.figure("gemm_efficiency", Bound{1e-4, 1, "(fraction of peak)"}, sources);
  gpu.sustained.hbm_efficiency = sustained.figure("hbm_efficiency", Bound{1e-4, 1, "(fraction of peak)"}, sources);
  for (const auto& [old_key, new_key] : {std::pair{"pcie_h2d_gbps", "pcie_h2d_GBps"}, std::pair{"pcie_d2h_gbps", "pcie_d2h_GBps"},
                                         std::pair{"nvlink_gbps_per_direction", "nvlink_GBps_per_direction"}}) {
    refuse_old_bandwidth_key(sustained, old_key, new_key);
  }
  gpu.sustained.pcie_h2d_GBps = sustained.figure("pcie_h2d_GBps", Bound{0.1, 1000, "GB/s"}, sources);
  gpu.sustained.pcie_d2h_GBps = sustained.figure("pcie_d2h_GBps", Bound{0.1, 1000, "GB/s"}, sources);
  json::Reader tables = sustained.object("efficiency_by_flops");
  gpu.sustained.gemm = parse_table(tables, "gemm", sources);
  gpu.sustained.attention_fwd = parse_table(tables, "attention_fwd", sources);
  gpu.sustained.attention_bwd = parse_table(tables, "attention_bwd", sources);
  tables.finish();
  gpu.sustained.kernel_launch_ns = sustained.figure("kernel_launch_ns", Bound{0, 1e6, "ns"}, sources);
  if (sustained.has("nvlink_GBps_per_direction")) {
    gpu.sustained.nvlink_GBps_per_direction = sustained.figure("nvlink_GBps_per_direction", Bound{0, 10000, "GB/s"}, sources);
    if (gpu.sustained.nvlink_GBps_per_direction.value > gpu.nvlink_GBps_per_direction.value) {
      sustained.fail("nvlink_GBps_per_direction",
                     "at most the datasheet's nvlink_GBps_per_direction (" + format_fixed(gpu.nvlink_GBps_per_direction.value, 1) + " GB/s)",
                     format_fixed(gpu.sustained.nvlink_GBps_per_direction.value, 1));
    }
  }
  gpu.sustained.attention_kernels = parse_attention_kernels(sustained, sources);
  for (auto [key, figure] :
       {std::pair{"elementwise_GBps", &gpu.sustained.elementwise_GBps}, std::pair{"optimizer_GBps", &gpu.sustained.optimizer_GBps}}) {
    if (sustained.has(key)) *figure = sustained.figure(key, Bound{1e-3, 100000, "GB/s"}, sources);
  }
  if (sustained.has("gemm_tile_rows") || sustained.has("gemm_tile_cols")) {
    gpu.sustained.gemm_tile_rows = sustained.figure("gemm_tile_rows", Bound{1, 4096, "rows", true}, sources);
    gpu.sustained.gemm_tile_cols = sustained.figure("gemm_tile_cols", Bound{1, 4096, "columns", true}, sources);
  }
  if (sustained.has("collective_ctas")) {
    gpu.sustained.collective_ctas = sustained.figure("collective_ctas", Bound{0, gpu.sm_count.value - 1, "thread blocks (fewer than sm_count)", true},
                                                     sources);
  }
  sustained.finish();
  // What `trainyard calibrate` measured and fitted (calibrate/calibration.hpp): a record for people, not read here.
  if (top.has("calibration") && !top.raw("calibration").is_object()) {
    top.fail("calibration", "an object (the record trainyard calibrate writes)", json::describe(top.raw("calibration")));
  }
  top.finish();

  // A sustained copy rate above the link's raw rate is a unit or transcription mistake.
  const double raw = gpu.pcie_raw_GBps_per_direction();
  const std::pair<const char*, double> copies[] = {{"pcie_h2d_GBps", gpu.sustained.pcie_h2d_GBps.value},
                                                   {"pcie_d2h_GBps", gpu.sustained.pcie_d2h_GBps.value}};
  for (const auto& [key, value] : copies) {
    if (value > raw) {
      sustained.fail(key,
                     "at most the raw PCIe rate of Gen" + std::to_string(int(gpu.pcie_generation.value)) + " x" +
                         std::to_string(int(gpu.pcie_lanes.value)) + " (" + format_fixed(raw, 1) + " GB/s)",
                     format_fixed(value, 1));
    }
  }
  return gpu;
}

void refuse_old_bandwidth_key(const json::Reader& reader, std::string_view old_key, std::string_view new_key) {
  if (!reader.has(old_key)) return;
  reader.fail(old_key,
              "the key \"" + std::string(new_key) + "\" instead, with the same value in GB/s (gigabytes per second; a datasheet's Gb/s, " +
                  "gigabits, is 8 times that number)",
              "the old key \"" + std::string(old_key) + "\"");
}

}  // namespace trainyard::hw
