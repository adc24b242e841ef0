// `trainyard calibrate --out hwprofiles/measured/NAME.json [--device gpu|cpu] [--base GPU] [--quick]`: measures the
// GPU at hand (calibrate/calibrate_gpu.hpp) or the executor's CPU device (calibrate/calibrate_device.hpp), fits the
// profile's sustained figures from the points (calibrate/calibration.hpp) and writes a profile the simulator loads
// (`run --gpu-profile`). For a GPU: built without CUDA, or run without a usable GPU, it says so and exits.
#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <thread>

#include "app/commands.hpp"
#include "backend/cpu_device.hpp"
#include "backend/mpi_communicator.hpp"
#include "calibrate/calibrate_device.hpp"
#include "calibrate/calibrate_peers.hpp"
#include "calibrate/calibration.hpp"
#include "calibrate/trace_calibration.hpp"
#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"
#include "hwprofiles/catalog.hpp"
#include "stacks/collective_library.hpp"
#include "traces/kernel_classes.hpp"
#include "traces/kineto.hpp"
#include "traces/nsys.hpp"
#ifdef TRAINYARD_HAVE_CUDA
#include "backend/device_info.hpp"
#include "calibrate/calibrate_gpu.hpp"
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
  table.add_row({"H2D pinned", format_fixed(before.sustained.pcie_h2d_GBps.value, 1) + " GB/s",
                 format_fixed(after.sustained.pcie_h2d_GBps.value, 1) + " GB/s"});
  table.add_row({"D2H pinned", format_fixed(before.sustained.pcie_d2h_GBps.value, 1) + " GB/s",
                 format_fixed(after.sustained.pcie_d2h_GBps.value, 1) + " GB/s"});
  table.add_row({"kernel launch", format_fixed(before.sustained.kernel_launch_ns.value, 0) + " ns",
                 format_fixed(after.sustained.kernel_launch_ns.value, 0) + " ns"});
  table.print(out);
}

// Writes the profile fitted from `m` on `base` (with what `amend` adds), and says what changed.
int finish(const backend::Measurements& m, const LoadedDocument& base, const hw::GpuProfile& before, const std::string& out,
           const std::function<void(json::Json&)>& amend = nullptr) {
  const backend::CalibrationFits fits = backend::write_calibrated_profile(m, base.json, base.origin, out, amend);
  const hw::GpuProfile after = hw::load_gpu(out, "--out");
  print_summary(std::cout, before, after);
  std::cout << "\nwrote " << out << " (profile '" << after.name << "') after " << format_fixed(m.duration_s, 1) << " s of measurements\n"
            << "NCCL: " << m.nccl_note << "\n";
  for (const auto& s : m.skipped) std::cout << "skipped: " << s << "\n";
  for (const auto& w : fits.warnings) std::cout << "warning: " << w << "\n";
  return 0;
}

// Under mpirun: the ranks' messages and collectives too (calibrate/calibrate_peers.hpp), written as the GPU
// profile's link and, beside it, a node profile of the run's ranks and a collective library.
void write_peer_profiles(const backend::Measurements& m, const backend::PeerMeasurements& peers, const LoadedDocument& base,
                         const hw::GpuProfile& before, const std::string& out) {
  const backend::PeerFits peer_fits = backend::fit_peers(peers);
  const std::string name = backend::profile_name_from_path(out);
  const std::string node_path = backend::peer_node_path(out), library_path = backend::peer_library_path(out);
  const json::Json library = backend::peer_collective_library(name + "-mpi", peers, peer_fits, m.command);
  stacks::parse_collective_library(library, library_path);
  finish(m, base, before, out, [&](json::Json& doc) { backend::add_peer_link(doc, peers, peer_fits, m.command); });
  const json::Json node = backend::peer_node_profile(name + "-node", std::filesystem::path(out).filename().string(),
                                                     hw::load_gpu_document(out, "--out").json, peers, peer_fits, m.command);
  hw::node_from_document(node, node_path);  // loads the GPU profile just written beside it
  write_file_atomically(node_path, std::string_view(node.dump(2) + "\n"));
  write_file_atomically(library_path, std::string_view(library.dump(2) + "\n"));
  std::cout << "ranks: " << peers.transport << " (" << format_fixed(peers.duration_s, 1) << " s, every rank's sweep at once before): messages "
            << format_fixed(peer_fits.p2p.fixed_s * 1e6, 1) << " us + " << format_fixed(peer_fits.link_GBps, 2) << " GB/s; collectives "
            << format_fixed(peer_fits.base_latency_us, 1) << " us + " << format_fixed(peer_fits.step_latency_us, 1) << " us per step at "
            << format_fixed(100 * peer_fits.efficiency, 0) << "% of that rate (rms error "
            << format_fixed(100 * peer_fits.collective_rms_relative_error, 1) << "%)\n"
            << "wrote " << node_path << " (node of " << peers.ranks << " ranks) and " << library_path << " (collective library)\n"
            << "predict a run of this machine's ranks with: mpirun -np " << peers.ranks << " trainyard run --plan PLAN --device cpu --hw "
            << node_path << " --collectives " << library_path << "\n";
  for (const auto& w : peer_fits.warnings) std::cout << "warning: " << w << "\n";
}

// The CPU device: its own sweep, from the built-in cpu-device profile unless --base says otherwise. Under mpirun
// every rank runs the sweep at once (so the profile holds what one rank's device does while the others compute,
// as in a run), then the ranks' links; rank 0 writes.
int calibrate_cpu(const std::vector<std::string>& args, std::optional<LoadedDocument> base, const std::string& out) {
  if (!base) base = hw::load_gpu_document("cpu-device", "--base");
  const hw::GpuProfile before = hw::gpu_from_document(base->json, base->origin);
  std::string command = "trainyard calibrate";
  for (const auto& a : args) command += " " + a;
  backend::MpiSession mpi;
  if (!mpi.active()) {
    backend::check_output_path(out);
    const auto device = backend::make_cpu_device();
    const std::string description = "trainyard CPU device on " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
    std::cerr << "calibrate: " << description << ", starting from " << base->origin << "\n";
    backend::Measurements m = backend::measure_on_device(backend::cpu_sweep(), *device, description, command, &std::cerr);
    m.nccl_note = "not measured: one rank; under mpirun -np N (N >= 2) calibrate also times the ranks' MPI messages and collectives";
    return finish(m, *base, before, out);
  }
  backend::MpiCommunicator comm(std::chrono::seconds(300));
  try {
    if (comm.size() < 2) throw InputError("mpirun -np", "value", "at least 2 ranks (or no mpirun: one rank)", "1");
    const bool root = comm.rank() == 0;
    if (root) {
      backend::check_output_path(out);
      check_writable(backend::peer_node_path(out), "--out");
      check_writable(backend::peer_library_path(out), "--out");
    }
    comm.barrier();
    const auto device = backend::make_cpu_device();
    const std::string description = "trainyard CPU device on " + std::to_string(std::thread::hardware_concurrency()) +
                                    " hardware threads, rank 0 of " + std::to_string(comm.size()) + " measuring at once";
    if (root) std::cerr << "calibrate: " << description << ", starting from " << base->origin << "\n";
    backend::Measurements m = backend::measure_on_device(backend::cpu_sweep(), *device, description, command, root ? &std::cerr : nullptr);
    const std::string transport = backend::MpiSession::library_version() + " between " + std::to_string(comm.size()) + " processes on this machine";
    const backend::PeerMeasurements peers = backend::measure_peers(*device, comm, transport, &std::cerr);
    m.nccl_note = "not NCCL: the CPU device's ranks talk over MPI, measured (calibration.peers)";
    if (root) write_peer_profiles(m, peers, *base, before, out);
    comm.barrier();
    return 0;
  } catch (const std::exception& e) {
    backend::MpiSession::abort_all_after(e, comm.rank(), comm.size());
  }
}

// What calibrate --from-trace fitted and wrote, and how to predict with it.
void print_trace_calibration(std::ostream& out, const hw::GpuProfile& before, const hw::GpuProfile& after, const backend::TracePoints& points,
                             const backend::TraceFits& fits, std::size_t traces, const std::string& profile_path, const std::string& library_path) {
  print_summary(out, before, after);
  out << "\nfrom " << traces << " trace(s) of " << (points.device_name.empty() ? "an unnamed GPU" : points.device_name) << ": " << points.calls
      << " GEMM and attention calls in " << points.gemm.size() << " GEMM and " << points.attention.size() << " attention shapes; "
      << points.collectives.size() << " collective sizes\n";
  for (const auto& f : fits.attention) {
    out << "attention " << f.family << (f.backward ? " backward" : " forward") << ", head_dim " << f.head_dim << ": ceiling "
        << format_fixed(100 * f.base_ceiling, 1) << "% -> " << format_fixed(100 * f.ceiling, 1) << "% of peak, block overhead "
        << format_fixed(f.block_overhead_keys, 0) << " keys" << (f.overhead_fitted ? " (fitted)" : " (the base's)") << ", rms error "
        << format_fixed(100 * f.rms_relative_error, 1) << "% over " << f.points << " shape(s)\n";
  }
  out << "wrote " << profile_path << " (profile '" << after.name << "')";
  if (!library_path.empty()) {
    out << " and " << library_path << " (collectives: " << format_fixed(fits.collectives->base_s * 1e6, 1) << " us + "
        << format_fixed(fits.collectives->step_s * 1e6, 1) << " us per step at " << format_fixed(100 * fits.collectives->efficiency, 0) << "% of "
        << fits.link << ")";
  }
  out << "\npredict with: trainyard simulate --plan PLAN --gpu-profile " << profile_path
      << (library_path.empty() ? "" : " --collectives " + library_path) << "\n";
  for (const auto& n : fits.notes) out << "note: " << n << "\n";
  for (const auto& w : fits.warnings) out << "warning: " << w << "\n";
}

// --from-trace: the curves fitted from an engine's profiler traces (calibrate/trace_calibration.hpp), from the
// built-in profile of the GPU the traces name unless --base says otherwise. Nothing is written unless the profile
// (and the collective library, where fitted) load.
int calibrate_from_traces(const std::vector<std::string>& args, const std::vector<std::string>& paths, std::optional<LoadedDocument> base,
                          const std::string& out, const std::string& kernel_classes) {
  backend::check_output_path(out);
  std::vector<std::string> files;
  for (const auto& path : paths) {
    if (traces::looks_like_sqlite(path)) {
      throw InputError(path, "--from-trace", "a PyTorch profiler (Kineto) trace taken with record_shapes=True",
                       "an Nsight Systems export: it records no op shapes, so its kernels' work is unknown");
    }
    for (auto& file : traces::kineto_files(path)) files.push_back(std::move(file));
  }
  const backend::TracePoints points = backend::trace_points(traces::read_each(files, traces::read_kineto_file),
                                                            traces::KernelClassifier(kernel_classes));
  if (!base) {
    const auto match = backend::builtin_gpu_for_device(points.device_name);
    if (!match) {
      const std::string why = points.device_name.empty() ? "the traces record no GPU name (deviceProperties)"
                                                         : "no built-in profile matches the traces' GPU \"" + points.device_name + "\"";
      throw InputError("--base", "value", "the GPU profile to start from (a built-in name or a .json path): " + why, "nothing");
    }
    base = hw::load_gpu_document(*match, "--base");
  }
  const hw::GpuProfile before = hw::gpu_from_document(base->json, base->origin);
  if (const auto match = backend::builtin_gpu_for_device(points.device_name); match && before.name != *match) {
    // Said, not refused: a user may mean to carry one GPU's kernels onto a profile of another on purpose.
    std::cerr << "warning: the traces ran on \"" << points.device_name << "\" (built-in profile " << *match << ") but --base is " << before.name
              << ": their kernels' efficiencies are fitted against that profile's peaks\n";
  }
  std::string command = "trainyard calibrate";
  for (const auto& a : args) command += " " + a;
  const backend::TraceFits fits = backend::fit_trace(points, before);
  const json::Json doc = backend::trace_calibrated_profile(base->json, backend::profile_name_from_path(out), points, fits, command);
  const hw::GpuProfile after = hw::parse_gpu(doc, out);
  const std::string library_path = backend::trace_library_path(out);
  std::optional<json::Json> library;
  if (fits.collectives) {
    library = backend::trace_collective_library(backend::profile_name_from_path(out) + "-collectives", points, fits, command);
    stacks::parse_collective_library(*library, library_path);
    check_writable(library_path, "--out");
  }
  write_file_atomically(out, std::string_view(doc.dump(2) + "\n"));
  if (library) write_file_atomically(library_path, std::string_view(library->dump(2) + "\n"));

  print_trace_calibration(std::cout, before, after, points, fits, files.size(), out, library ? library_path : "");
  return 0;
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
      ("quick", po::bool_switch(), "GPU: a sweep of about 15 s (fewer shapes, sizes and repeats) instead of the full one (under a minute on an H100; at most 5)")
      ("from-trace", po::value<std::vector<std::string>>()->multitoken()->value_name("trace..."),
       "fit GEMM, attention and collective curves from an engine's PyTorch profiler traces (files or directories, one per rank; "
       "record_shapes=True) instead of measuring; default --base: the built-in profile of the traces' GPU")
      ("kernel-classes", po::value<std::string>()->value_name("path"), "with --from-trace: more kernel-name rules (traces/kernel_classes.json's format)");
  // clang-format on
  po::variables_map vm;
  if (parse(args,
            "trainyard calibrate --out hwprofiles/measured/NAME.json [--device gpu|cpu] [--base GPU] [--quick]\n"
            "       trainyard calibrate --from-trace TRACE... --out NAME.json [--base GPU] [--kernel-classes FILE]",
            options, {}, vm)) {
    return 0;
  }
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
  if (vm.count("from-trace")) {
    if (!vm["device"].defaulted() || vm["quick"].as<bool>()) {
      throw InputError(vm["quick"].as<bool>() ? "--quick" : "--device", "value", "nothing with --from-trace (it measures nothing)", "given");
    }
    return calibrate_from_traces(args, vm["from-trace"].as<std::vector<std::string>>(), std::move(base), out,
                                 vm.count("kernel-classes") ? vm["kernel-classes"].as<std::string>() : "");
  }
  if (vm.count("kernel-classes")) throw InputError("--kernel-classes", "value", "--from-trace beside it", "no --from-trace");
  const std::string device_kind = vm["device"].as<std::string>();
  if (device_kind != "gpu" && device_kind != "cpu") throw InputError("--device", "value", "gpu or cpu", "\"" + device_kind + "\"");
  if (device_kind == "cpu") {
    if (vm["quick"].as<bool>()) throw InputError("--quick", "value", "--device gpu (the CPU device has one sweep, about 22 s)", "given");
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
