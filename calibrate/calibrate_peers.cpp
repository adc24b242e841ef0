#include "calibrate/calibrate_peers.hpp"

#include <unistd.h>

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>

#include "calibrate/calibrate_device.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/units.hpp"
#include "sim/collectives.hpp"

namespace trainyard::backend {

using Json = json::Json;

namespace {

constexpr const char* kOrigin = "peer measurements";
constexpr int kTag = 7000;  // the calibration's messages; nothing else runs between the ranks meanwhile
constexpr int kWarmupCalls = 2, kRepeats = 7;
constexpr double kTrialBytes = 8 << 20;  // a trial moves about this much (at least kMinCalls, at most kMaxCalls calls)
constexpr int kMinCalls = 3, kMaxCalls = 30;

int calls_for(std::int64_t bytes) {
  return static_cast<int>(std::clamp(kTrialBytes / static_cast<double>(bytes), double(kMinCalls), double(kMaxCalls)));
}

// One series' timing on this rank: warm-up calls, then trials of `calls` calls between two events on `stream`, the
// ranks lined up by a barrier before each trial; the median seconds per call.
class PeerTimer {
 public:
  PeerTimer(Device& d, Communicator& comm) : d_(d), comm_(comm), stream_(d.create_stream()), begin_(d.create_event()), end_(d.create_event()) {}

  double median_per_call(const std::function<void()>& call, int calls) {
    for (int i = 0; i < kWarmupCalls; ++i) call();
    d_.synchronize();
    std::vector<double> per_call;
    for (int r = 0; r < kRepeats; ++r) {
      throw_if_interrupted();
      comm_.barrier();
      d_.record(begin_, stream_);
      for (int i = 0; i < calls; ++i) call();
      d_.record(end_, stream_);
      d_.synchronize();
      per_call.push_back(d_.elapsed_ms(begin_, end_) * 1e-3 / calls);
    }
    return median_of(per_call);
  }
  int stream() const { return stream_; }

 private:
  Device& d_;
  Communicator& comm_;
  int stream_, begin_, end_;
};

// Rank 0 and rank 1 pass a message back and forth; the others wait at the trials' barriers.
void measure_p2p(Device& d, Communicator& comm, PeerTimer& timer, PeerMeasurements& m) {
  const std::int64_t largest = peer_message_bytes().back();
  SweepBuffer out(d, largest, 0), in(d, largest, 0);
  for (std::int64_t bytes : peer_message_bytes()) {
    const int s = timer.stream();
    const std::function<void()> round_trip = [&] {
      if (comm.rank() == 0) {
        d.send(s, comm, 1, kTag, {{out.as<char>(), bytes}});
        d.recv(s, comm, 1, kTag, {{in.as<char>(), bytes}});
      } else if (comm.rank() == 1) {
        d.recv(s, comm, 0, kTag, {{in.as<char>(), bytes}});
        d.send(s, comm, 0, kTag, {{out.as<char>(), bytes}});
      }
    };
    const double seconds = timer.median_per_call(round_trip, calls_for(bytes));
    if (comm.rank() == 0) m.p2p.push_back({static_cast<double>(bytes), seconds / 2});
  }
}

void measure_collectives(Device& d, Communicator& comm, PeerTimer& timer, PeerMeasurements& m) {
  const std::vector<int> ranks = all_ranks(comm);
  const auto n = static_cast<std::int64_t>(ranks.size());
  const std::int64_t largest = peer_collective_bytes().back() + 4 * n;
  SweepBuffer a(d, largest, 0), b(d, largest, 0);
  for (std::int64_t requested : peer_collective_bytes()) {
    const std::int64_t floats = std::max<std::int64_t>(1, requested / 4 / n) * n;  // whole blocks of floats
    const std::int64_t bytes = floats * 4, block = bytes / n;
    const int s = timer.stream();
    const double reduce = timer.median_per_call([&] { d.all_reduce_sum(s, comm, ranks, a.as<float>(), floats); }, calls_for(bytes));
    const double exchange = timer.median_per_call(
        [&] {
          std::vector<ConstBytes> sends;
          std::vector<Bytes> recvs;
          for (std::int64_t i = 0; i < n; ++i) {
            sends.push_back({a.as<char>() + i * block, block});
            recvs.push_back({b.as<char>() + i * block, block});
          }
          d.all_to_all(s, comm, ranks, kTag, std::move(sends), std::move(recvs));
        },
        calls_for(bytes));
    if (comm.rank() != 0) continue;
    m.all_reduce.push_back({static_cast<double>(bytes), reduce});
    m.all_to_all.push_back({static_cast<double>(bytes), exchange});
  }
}

// ---- the collective fit ----------------------------------------------------------------------------------------

// Weighted least squares of t = base + steps x step + wire_s x u (u = 1 / efficiency) over `rows`, with the
// parameters in `fixed` held at the values given and the others free; nullopt when the system is singular.
std::optional<std::array<double, 3>> solve_face(const std::vector<CollectiveRow>& rows, std::array<double, 3> values, std::array<bool, 3> fixed) {
  std::vector<int> free;
  for (int j = 0; j < 3; ++j) {
    if (!fixed[j]) free.push_back(j);
  }
  if (free.empty()) return values;
  const auto count = static_cast<Eigen::Index>(rows.size());
  Eigen::MatrixXd a(count, static_cast<Eigen::Index>(free.size()));
  Eigen::VectorXd rhs(count);
  for (Eigen::Index i = 0; i < count; ++i) {
    const CollectiveRow& r = rows[static_cast<std::size_t>(i)];
    const std::array<double, 3> column = {1, r.steps, r.wire_s};
    double known = 0;
    for (int j = 0; j < 3; ++j) {
      if (fixed[j]) known += column[j] * values[j];
    }
    for (std::size_t f = 0; f < free.size(); ++f) a(i, static_cast<Eigen::Index>(f)) = column[free[f]] / r.seconds;
    rhs(i) = (r.seconds - known) / r.seconds;
  }
  Eigen::VectorXd scale = a.colwise().norm();
  for (Eigen::Index c = 0; c < a.cols(); ++c) {
    if (!(scale(c) > 0)) return std::nullopt;
    a.col(c) /= scale(c);
  }
  const auto qr = a.colPivHouseholderQr();
  if (qr.rank() < a.cols()) return std::nullopt;
  const Eigen::VectorXd x = qr.solve(rhs);
  for (std::size_t f = 0; f < free.size(); ++f) values[free[f]] = x(static_cast<Eigen::Index>(f)) / scale(static_cast<Eigen::Index>(f));
  return values;
}

double rms_relative(const std::vector<CollectiveRow>& rows, const std::array<double, 3>& p) {
  double sum = 0;
  for (const auto& r : rows) sum += std::pow((p[0] + r.steps * p[1] + r.wire_s * p[2]) / r.seconds - 1, 2);
  return std::sqrt(sum / static_cast<double>(rows.size()));
}

void check_series(const std::vector<CopyPoint>& points, const std::string& what) {
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto ok = [](double x) { return std::isfinite(x) && x > 0; };
    if (!ok(points[i].bytes))
      throw InputError(kOrigin, what + "[" + std::to_string(i) + "].bytes", "a positive, finite number", format_number(points[i].bytes));
    if (!ok(points[i].seconds)) {
      throw InputError(kOrigin, what + "[" + std::to_string(i) + "].seconds", "a positive, finite number", format_number(points[i].seconds));
    }
  }
  if (points.size() < 2) throw InputError(kOrigin, what, "at least 2 sizes to fit", std::to_string(points.size()));
}

std::string today() { return utc_now().substr(0, 10); }

Json points_json(const std::vector<CopyPoint>& points) {
  Json out = Json::array();
  for (const auto& p : points) out.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}});
  return out;
}

std::string describe_collective_fit(const PeerFits& f) {
  return "t = base + steps x step + bytes sent / (efficiency x " + format_fixed(f.link_GBps, 2) + " GB/s) over the simulator's ring " +
         "(all-reduce 2(n-1) steps, all-to-all n-1), least squares on relative error: base " + format_fixed(f.base_latency_us, 2) + " us, step " +
         format_fixed(f.step_latency_us, 2) + " us, efficiency " + format_fixed(f.efficiency, 3) + ", rms error " +
         format_fixed(100 * f.collective_rms_relative_error, 1) + "% over " + std::to_string(f.collective_points) + " points";
}

}  // namespace

std::vector<std::int64_t> peer_message_bytes() {
  std::vector<std::int64_t> sizes;
  for (std::int64_t b = 64; b <= std::int64_t{16} << 20; b *= 4) sizes.push_back(b);
  return sizes;
}

std::vector<std::int64_t> peer_collective_bytes() {
  std::vector<std::int64_t> sizes;
  for (std::int64_t b = 1024; b <= std::int64_t{16} << 20; b *= 4) sizes.push_back(b);
  return sizes;
}

PeerMeasurements measure_peers(Device& device, Communicator& comm, const std::string& transport, std::ostream* progress) {
  if (comm.size() < 2) throw InputError("calibrate: the ranks' links need at least 2 ranks (mpirun -np 2 or more)");
  const auto start = std::chrono::steady_clock::now();
  PeerMeasurements m;
  m.ranks = comm.size();
  m.transport = transport;
  m.method =
      "the executor's own calls (Device send/recv, all_reduce_sum, all_to_all on one stream of the CPU device, over the run's "
      "MPI communicator), timed on rank 0 by the device's events around n calls (n = 8 MiB / size, 3 to 30), the ranks lined up by a "
      "barrier before each trial, " +
      std::to_string(kWarmupCalls) + " warm-up calls excluded, median of " + std::to_string(kRepeats) + " trials; a message's time is " +
      "half a round trip between ranks 0 and 1";
  PeerTimer timer(device, comm);
  const auto report = [&](const std::string& what) {
    if (progress && comm.rank() == 0) {
      *progress << "calibrate: " << what << " (" << format_fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1)
                << " s)" << std::endl;
    }
  };
  measure_p2p(device, comm, timer, m);
  if (comm.rank() == 0) {
    report("messages between ranks: " + format_fixed(m.p2p.front().seconds * 1e6, 1) + " us for " + format_bytes(m.p2p.front().bytes) + ", " +
           format_fixed(m.p2p.back().bytes / m.p2p.back().seconds * 1e-9, 2) + " GB/s at " + format_bytes(m.p2p.back().bytes));
  }
  measure_collectives(device, comm, timer, m);
  if (comm.rank() == 0) {
    report("all-reduce over " + std::to_string(m.ranks) + " ranks: " + format_fixed(m.all_reduce.front().seconds * 1e6, 1) + " us at " +
           format_bytes(m.all_reduce.front().bytes) + "; all-to-all: " + format_fixed(m.all_to_all.front().seconds * 1e6, 1) + " us");
  }
  comm.barrier();
  m.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

PeerFits fit_peers(const PeerMeasurements& m) {
  if (m.ranks < 2) throw InputError(kOrigin, "ranks", "at least 2", std::to_string(m.ranks));
  check_series(m.all_reduce, "all_reduce");
  check_series(m.all_to_all, "all_to_all");
  PeerFits f;
  std::vector<std::pair<double, double>> p2p;
  for (const auto& p : m.p2p) p2p.emplace_back(p.bytes, p.seconds);
  f.p2p = fit_linear_cost(p2p, "p2p");
  f.link_GBps = 1e-9 / f.p2p.per_unit_s;
  f.hop_latency_ns = std::max(0.0, f.p2p.fixed_s) * 1e9 / 2;
  if (f.p2p.fixed_s < 0) f.warnings.push_back("the messages' fitted latency was negative; taken as 0");

  const int n = m.ranks;
  std::vector<CollectiveRow> rows;
  const auto add = [&](const std::vector<CopyPoint>& points, sim::CollectiveOp op) {
    for (const auto& p : points) {
      const auto bytes = static_cast<std::int64_t>(p.bytes);
      rows.push_back({static_cast<double>(sim::collective_steps(op, sim::Algorithm::ring, n)),
                      sim::bytes_sent_per_rank(op, sim::Algorithm::ring, n, bytes) * f.p2p.per_unit_s, p.seconds});
    }
  };
  add(m.all_reduce, sim::CollectiveOp::all_reduce);
  add(m.all_to_all, sim::CollectiveOp::all_to_all);
  const CollectiveCostFit fit = fit_collective_costs(rows, kOrigin, "all_reduce, all_to_all");
  f.base_latency_us = fit.base_s * 1e6;
  f.step_latency_us = fit.step_s * 1e6;
  f.efficiency = fit.efficiency;
  f.collective_rms_relative_error = fit.rms_relative_error;
  f.collective_points = fit.points;
  f.warnings.insert(f.warnings.end(), fit.warnings.begin(), fit.warnings.end());
  return f;
}

CollectiveCostFit fit_collective_costs(const std::vector<CollectiveRow>& rows, const std::string& origin, const std::string& what) {
  // Bounds: base >= 0, step >= 0, u = 1 / efficiency >= 1. Every face of the box (each parameter free or at its
  // bound); the best feasible solution is the constrained least-squares optimum.
  const std::array<double, 3> bounds = {0, 0, 1};
  std::optional<std::array<double, 3>> best;
  double best_error = std::numeric_limits<double>::infinity();
  for (int face = 0; face < 8; ++face) {
    const std::array<bool, 3> fixed = {(face & 1) != 0, (face & 2) != 0, (face & 4) != 0};
    const auto p = solve_face(rows, bounds, fixed);
    if (!p || (*p)[0] < 0 || (*p)[1] < 0 || (*p)[2] < 1 || !std::isfinite((*p)[2])) continue;
    const double error = rms_relative(rows, *p);
    if (error < best_error) best_error = error, best = p;
  }
  if (!best) throw InputError(origin, what, "times a latency-bandwidth model can fit", "none fitted");
  CollectiveCostFit fit;
  fit.base_s = (*best)[0];
  fit.step_s = (*best)[1];
  fit.efficiency = 1 / (*best)[2];
  fit.rms_relative_error = best_error;
  fit.points = rows.size();
  if ((*best)[0] == 0) fit.warnings.push_back("the collectives' base latency is held at 0 (its fit was negative)");
  if ((*best)[1] == 0) fit.warnings.push_back("the collectives' step latency is held at 0 (its fit was negative)");
  if ((*best)[2] == 1) fit.warnings.push_back("the collectives' efficiency is held at 1 (they moved data faster than one message does)");
  return fit;
}

void add_peer_link(Json& gpu_document, const PeerMeasurements& m, const PeerFits& fits, const std::string& command) {
  gpu_document["sources"]["calib_peers"] = measured_source(
      today(), command, m.transport,
      "messages of " + format_bytes(m.p2p.front().bytes) + " to " + format_bytes(m.p2p.back().bytes) + " between ranks 0 and 1; " + m.method +
          "; t = latency + bytes / rate, least squares on relative error: rate " + format_fixed(fits.link_GBps, 2) + " GB/s, latency " +
          format_fixed(fits.p2p.fixed_s * 1e6, 2) + " us, rms error " + format_fixed(100 * fits.p2p.rms_relative_error, 1) + "%");
  gpu_document["nvlink_GBps_per_direction"] = {{"value", fits.link_GBps},
                                               {"source", "calib_peers"},
                                               {"note", "not NVLink: the rate of the CPU device's messages between ranks (" + m.transport +
                                                            "), the link the simulator's node gives each rank"}};
  gpu_document["sustained"].erase("nvlink_GBps_per_direction");  // the measured rate is the sustained one
  gpu_document["calibration"]["peers"] = {
      {"transport", m.transport},
      {"ranks", m.ranks},
      {"method", m.method},
      {"duration_s", m.duration_s},
      {"points", {{"p2p", points_json(m.p2p)}, {"all_reduce", points_json(m.all_reduce)}, {"all_to_all", points_json(m.all_to_all)}}},
      {"fits",
       {{"p2p", {{"fixed_s", fits.p2p.fixed_s}, {"per_unit_s", fits.p2p.per_unit_s}, {"GBps", fits.link_GBps}, {"gbps", fits.link_GBps}}},
        {"collectives", describe_collective_fit(fits)}}},
      {"warnings", fits.warnings}};
}

Json peer_node_profile(const std::string& name, const std::string& gpu_file, const Json& gpu_document, const PeerMeasurements& m,
                       const PeerFits& fits, const std::string& command) {
  const std::string date = today();
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
  const double dram_bytes = pages > 0 && page_bytes > 0 ? static_cast<double>(pages) * static_cast<double>(page_bytes) : 0;
  if (!(dram_bytes >= 1073741824.0)) throw InputError("calibrate: this machine's memory could not be read (sysconf(_SC_PHYS_PAGES))");
  // The device's memory traffic as its own calibration measured it (copies inside the device: read + write).
  const double memory_GBps = gpu_document["hbm_GBps"]["value"].get<double>() * gpu_document["sustained"]["hbm_efficiency"]["value"].get<double>();
  Json vertices = Json::array(
      {{{"id", "cpu0"}, {"type", "root_complex"}}, {{"id", "dram0"}, {"type", "host_memory"}}, {{"id", "mpi"}, {"type", "nvswitch"}}});
  Json links = Json::array();
  for (int r = 0; r < m.ranks; ++r) {
    const std::string gpu = "gpu" + std::to_string(r);
    vertices.push_back({{"id", gpu}, {"type", "gpu"}});
    links.push_back({{"a", gpu}, {"b", "cpu0"}, {"type", "pcie"}, {"generation", 5}, {"lanes", 16}});
    links.push_back({{"a", gpu}, {"b", "mpi"}, {"type", "nvlink"}});
  }
  links.push_back({{"a", "cpu0"}, {"b", "dram0"}, {"type", "dram"}, {"GBps", {{"value", memory_GBps}, {"source", "calib_memory"}}}});
  const std::string link_basis = "the CPU device's messages between ranks 0 and 1 (" + m.transport + "), " + format_bytes(m.p2p.front().bytes) +
                                 " to " + format_bytes(m.p2p.back().bytes) + "; " + m.method + "; t = latency + bytes / rate: latency " +
                                 format_fixed(fits.p2p.fixed_s * 1e6, 2) + " us (half on each of a message's two links), rate " +
                                 format_fixed(fits.link_GBps, 2) + " GB/s (the GPU profile's nvlink_GBps_per_direction)";
  Json doc = {{"schema", "trainyard.node.v1"},
              {"name", name},
              {"description", "this machine as the executor's CPU device sees it under mpirun -np " + std::to_string(m.ranks) + ": " +
                                  std::to_string(m.ranks) + " ranks (GPUs of profile " + gpu_file +
                                  "), their messages as links to one switch (the shared-memory transport), one socket's memory; calibrated " + date},
              {"sources",
               {{"calib_link", measured_source(date, command, m.transport, link_basis)},
                {"calib_memory", measured_source(date, command, m.transport,
                                                 "the GPU profile's calibrated memory traffic (hbm_GBps x hbm_efficiency): copies inside "
                                                 "the device, which are this machine's memory")},
                {"calib_host", measured_source(date, command, m.transport, "sysconf(_SC_PHYS_PAGES) x sysconf(_SC_PAGE_SIZE)")},
                {"est_pcie",
                 {{"kind", "estimate"},
                  {"basis",
                   "the device's copies to and from host memory are memcpy in one address space: no bus, their cost is the GPU "
                   "profile's measured copy rate, so the links add no latency of their own"}}}}},
              {"gpu", gpu_file},
              {"host_dram_bytes", {{"value", dram_bytes}, {"source", "calib_host"}}},
              {"pcie_peer_to_peer", false},
              {"topology",
               {{"vertices", vertices},
                {"links", links},
                {"latency_ns",
                 {{"nvlink", {{"value", fits.hop_latency_ns}, {"source", "calib_link"}}},
                  {"pcie", {{"value", 0.0}, {"source", "est_pcie"}}},
                  {"dram", {{"value", 0.0}, {"source", "est_pcie"}}}}}}}};
  return doc;
}

Json peer_collective_library(const std::string& name, const PeerMeasurements& m, const PeerFits& fits, const std::string& command) {
  const std::string date = today();
  const Json step = {{"value", fits.step_latency_us}, {"source", "calib_collectives"}};
  const Json base = {{"value", fits.base_latency_us}, {"source", "calib_collectives"}};
  const Json by_link = {{"nvlink", step}, {"pcie", step}, {"network", step}};
  Json doc = {
      {"schema", "trainyard.collectives.v1"},
      {"name", name},
      {"description", "the CPU device's collectives over MPI (" + m.transport + ") as the executor calls them, one protocol fitted from " +
                          "all-reduces and all-to-alls over " + std::to_string(m.ranks) + " ranks; the same step latency on every link class"},
      {"sources",
       {{"calib_collectives", measured_source(date, command, m.transport,
                                              "all-reduces (fp32 sum) and all-to-alls of " + format_bytes(m.all_reduce.front().bytes) + " to " +
                                                  format_bytes(m.all_reduce.back().bytes) + " over " + std::to_string(m.ranks) + " ranks; " +
                                                  m.method + "; " + describe_collective_fit(fits))}}},
      {"protocols", Json::array({{{"name", "mpi"},
                                  {"efficiency", {{"value", fits.efficiency}, {"source", "calib_collectives"}}},
                                  {"base_latency_us", {{"ring", base}, {"tree", base}}},
                                  {"step_latency_us", {{"ring", by_link}, {"tree", by_link}}}}})}};
  return doc;
}

std::string peer_node_path(const std::string& gpu_out) { return path_beside(gpu_out, "-node.json"); }

std::string peer_library_path(const std::string& gpu_out) { return path_beside(gpu_out, "-mpi.json"); }

}  // namespace trainyard::backend
