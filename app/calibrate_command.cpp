// `trainyard calibrate --out hwprofiles/measured/NAME.json [--device gpu|cpu] [--base GPU] [--quick]`: measures the
// GPU at hand (backend/calibrate_gpu.hpp) or the executor's CPU device (backend/calibrate_device.hpp), fits the
// profile's sustained figures from the points (backend/calibration.hpp) and writes a profile the simulator loads
// (`run --gpu-profile`). For a GPU: built without CUDA, or run without a usable GPU, it says so and exits.
#include <iostream>
#include <optional>
#include <thread>

#include "app/commands.hpp"
#include "backend/calibrate_device.hpp"
#include "backend/calibration.hpp"
#include "backend/cpu_device.hpp"
#include "common/error.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#ifdef TRAINYARD_HAVE_CUDA
#include "backend/calibrate_gpu.hpp"
#include "backend/device_info.hpp"
#endif

namespace po = boost::program_options;

namespace trainyard::app {

namespace {

// The figures the simulator reads, before (the base profile) and after calibration (the file written).
void print_summary(std::ostream& out, const hw::GpuProfile& before, const hw::GpuProfile& after) {
  TextTable table({"figure", before.name, after.name}, {false, true, true});
  const auto percent = [](double x) { return format_fixed(100 * x, 1) + "%"; };
  table.add_row({"GEMM efficiency (large)", percent(before.sustained.gemm_efficiency.value), percent(after.sustained.gemm_efficiency.value)});
  for (double flops : {1e9, 1e11, 1e12}) {
    table.add_row({"GEMM at " + format_flops(flops), percent(before.sustained.gemm.at(flops)), percent(after.sustained.gemm.at(flops))});
  }
  for (double flops : {1e10, 1e12}) {
    table.add_row({"attention fwd at " + format_flops(flops), percent(before.sustained.attention_fwd.at(flops)),
                   percent(after.sustained.attention_fwd.at(flops))});
    table.add_row({"attention bwd at " + format_flops(flops), percent(before.sustained.attention_bwd.at(flops)),
                   percent(after.sustained.attention_bwd.at(flops))});
  }
  table.add_row({"HBM efficiency", percent(before.sustained.hbm_efficiency.value), percent(after.sustained.hbm_efficiency.value)});
  table.add_row({"H2D pinned", format_fixed(before.sustained.pcie_h2d_gbps.value, 1) + " GB/s",
                 format_fixed(after.sustained.pcie_h2d_gbps.value, 1) + " GB/s"});
  table.add_row({"D2H pinned", format_fixed(before.sustained.pcie_d2h_gbps.value, 1) + " GB/s",
                 format_fixed(after.sustained.pcie_d2h_gbps.value, 1) + " GB/s"});
  table.add_row({"kernel launch", format_fixed(before.sustained.kernel_launch_ns.value, 0) + " ns",
                 format_fixed(after.sustained.kernel_launch_ns.value, 0) + " ns"});
  table.print(out);
}

// Writes the profile fitted from `m` on `base`, and says what changed.
int finish(const backend::Measurements& m, const LoadedDocument& base, const hw::GpuProfile& before, const std::string& out) {
  const backend::CalibrationFits fits = backend::write_calibrated_profile(m, base.json, base.origin, out);
  const hw::GpuProfile after = hw::load_gpu(out, "--out");
  print_summary(std::cout, before, after);
  std::cout << "\nwrote " << out << " (profile '" << after.name << "') after " << format_fixed(m.duration_s, 1) << " s of measurements\n"
            << "NCCL: " << m.nccl_note << "\n";
  for (const auto& s : m.skipped) std::cout << "skipped: " << s << "\n";
  for (const auto& w : fits.warnings) std::cout << "warning: " << w << "\n";
  return 0;
}

// The CPU device: its own sweep, from the built-in cpu-device profile unless --base says otherwise.
int calibrate_cpu(const std::vector<std::string>& args, std::optional<LoadedDocument> base, const std::string& out) {
  if (!base) base = hw::load_gpu_document("cpu-device", "--base");
  const hw::GpuProfile before = hw::gpu_from_document(base->json, base->origin);
  backend::check_output_path(out);
  std::string command = "trainyard calibrate";
  for (const auto& a : args) command += " " + a;
  const auto device = backend::make_cpu_device();
  const std::string description = "trainyard CPU device on " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
  std::cerr << "calibrate: " << description << ", starting from " << base->origin << "\n";
  const backend::Measurements m = backend::measure_on_device(backend::cpu_sweep(), *device, description, command, &std::cerr);
  return finish(m, *base, before, out);
}

}  // namespace

int run_calibrate(const std::vector<std::string>& args) {
  po::options_description options("calibrate options");
  // clang-format off
  options.add_options()
      ("out", po::value<std::string>()->value_name("path"), "the GPU profile to write (NAME.json; its folder is made if missing)")
      ("base", po::value<std::string>()->value_name("gpu"),
       "the profile to start from: a built-in GPU name or a .json path (default: the built-in that matches the device)")
      ("device", po::value<std::string>()->default_value("gpu")->value_name("gpu|cpu"),
       "gpu: the first CUDA GPU; cpu: the executor's CPU device (run --device cpu), from the built-in cpu-device profile")
      ("quick", po::bool_switch(), "GPU: a sweep of about 15 s (fewer shapes, sizes and repeats) instead of the full one (under a minute on an H100; at most 5)");
  // clang-format on
  po::variables_map vm;
  if (parse(args, "trainyard calibrate --out hwprofiles/measured/NAME.json [--device gpu|cpu] [--base GPU] [--quick]", options, {}, vm)) return 0;
  if (!vm.count("out")) {
    throw InputError("--out", "value", "the profile file to write, e.g. hwprofiles/measured/h100-lab.json", "nothing");
  }
  const std::string out = vm["out"].as<std::string>();
  backend::profile_name_from_path(out);
  std::optional<LoadedDocument> base;
  if (vm.count("base")) {
    base = hw::load_gpu_document(vm["base"].as<std::string>(), "--base");
    hw::gpu_from_document(base->json, base->origin);
  }
  const std::string device_kind = vm["device"].as<std::string>();
  if (device_kind != "gpu" && device_kind != "cpu") throw InputError("--device", "value", "gpu or cpu", "\"" + device_kind + "\"");
  if (device_kind == "cpu") {
    if (vm["quick"].as<bool>()) throw InputError("--quick", "value", "--device gpu (the CPU device has one sweep, about 18 s)", "given");
    return calibrate_cpu(args, std::move(base), out);
  }
  const backend::SweepPlan plan = vm["quick"].as<bool>() ? backend::quick_sweep() : backend::full_sweep();
#ifndef TRAINYARD_HAVE_CUDA
  (void)plan;
  throw InputError(
      "trainyard calibrate needs CUDA, and this trainyard was built without it (TRAINYARD_CUDA=OFF: no CUDA toolkit at "
      "configure time); nothing was written");
#else
  const backend::CudaDevices found = backend::query_cuda_devices();
  if (found.devices.empty()) {
    throw InputError("trainyard calibrate needs a usable CUDA GPU, and there is none (" + found.reason + "); nothing was written");
  }
  const backend::CudaDevice& device = found.devices.front();
  if (!base) {
    const auto match = backend::builtin_gpu_for_device(device.name);
    if (!match) {
      throw InputError(
          "--base", "value",
          "the GPU profile to start from (a built-in name or a .json path): no built-in profile matches the device \"" + device.name + "\"",
          "nothing");
    }
    base = hw::load_gpu_document(*match, "--base");
  }
  const hw::GpuProfile before = hw::gpu_from_document(base->json, base->origin);
  backend::check_output_path(out);
  std::string command = "trainyard calibrate";
  for (const auto& a : args) command += " " + a;
  std::cerr << "calibrate: " << device.name << " (GPU " << device.index << "), starting from " << base->origin << "; the '" << plan.name
            << "' sweep should take about " << format_fixed(backend::estimated_seconds(plan, before), 0) << " s if the profile's figures hold\n";
  const backend::Measurements m = backend::measure_on_gpu(plan, device, static_cast<int>(found.devices.size()), command, &std::cerr);
  return finish(m, *base, before, out);
#endif
}

}  // namespace trainyard::app
