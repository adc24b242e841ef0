#pragma once
// `mpirun -np N trainyard calibrate --device cpu`: what the ranks' link costs. The executor's CPU device talks to
// the other ranks over MPI (its sends, receives, all-reduces and all-to-alls queued on its streams); this times
// exactly those calls, through the Device and Communicator interfaces the executor uses, and fits the figures the
// simulator needs to predict a multi-rank step on this machine:
//   - a message between two ranks, one way (half a ping-pong's round trip):  t(x) = fixed_s + x / rate
//     -> the rank-to-rank link's rate and latency. The node profile written models the ranks' shared-memory
//        transport as each rank's link to one switch (the shape of an NVSwitch node), so a message crosses two
//        links and each carries half the fixed latency; the GPU profile's nvlink_GBps_per_direction is the rate.
//   - all-reduces and all-to-alls over all N ranks, by buffer size B: t = base + steps x step + sent / (e x rate),
//     with steps and sent (bytes one rank sends) those of the simulator's ring (sim/collectives.hpp), rate the
//     link's above -> a collective library (stacks/collectives/, one protocol) with base, step latency and e.
//     Least squares on relative error, each parameter kept in range (base, step >= 0; 0 < e <= 1) by solving on
//     every face of that box and keeping the best feasible solution.
// Every rank calls measure_peers at once; rank 0's records hold the times (the others' are empty).
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "calibrate/calibration.hpp"
#include "backend/communicator.hpp"
#include "backend/device.hpp"
#include "common/json_reader.hpp"

namespace trainyard::backend {

struct PeerMeasurements {
  int ranks = 0;
  std::string transport;  // e.g. "MPI (Open MPI v4.1.4) between 2 processes on this machine"
  std::string method;     // how a point was timed
  double duration_s = 0;
  std::vector<CopyPoint> p2p;         // bytes per message, seconds one way (rank 0 <-> rank 1)
  std::vector<CopyPoint> all_reduce;  // bytes of each rank's buffer (fp32 sums), seconds per call
  std::vector<CopyPoint> all_to_all;  // bytes each rank sends and receives in all (its own block included)
};

// The sizes timed: messages of 64 B to 16 MiB, collectives of 1 KiB to 16 MiB, by factors of 4.
std::vector<std::int64_t> peer_message_bytes();
std::vector<std::int64_t> peer_collective_bytes();

// Every rank of `comm` (at least 2) calls it at once; `device` is this rank's (the executor's streams).
PeerMeasurements measure_peers(Device& device, Communicator& comm, const std::string& transport, std::ostream* progress);

struct PeerFits {
  LinearCostFit p2p;
  double link_GBps = 0;       // 1e-9 / p2p.per_unit_s
  double hop_latency_ns = 0;  // p2p.fixed_s / 2: a message crosses a rank's link to the switch and the peer's
  double base_latency_us = 0, step_latency_us = 0, efficiency = 1;
  double collective_rms_relative_error = 0;
  std::size_t collective_points = 0;
  std::vector<std::string> warnings;  // a parameter held at its bound
};
// InputError naming the series (field 'p2p[i]' ...) when one is missing or unusable.
PeerFits fit_peers(const PeerMeasurements& m);

// One collective call for the fit below: the simulator's ring steps for it, the bytes one rank sends over the
// link's rate (seconds), and the seconds it took.
struct CollectiveRow {
  double steps = 0, wire_s = 0, seconds = 0;
};
struct CollectiveCostFit {  // t = base_s + steps x step_s + wire_s / efficiency
  double base_s = 0, step_s = 0, efficiency = 1;
  double rms_relative_error = 0;
  std::size_t points = 0;
  std::vector<std::string> warnings;  // a parameter held at its bound
};
// Least squares on relative error with base, step >= 0 and 0 < efficiency <= 1 (fit_peers' collectives, and
// calibrate --from-trace's). InputError(origin, what) when nothing fits.
CollectiveCostFit fit_collective_costs(const std::vector<CollectiveRow>& rows, const std::string& origin, const std::string& what);

// The three documents `calibrate --device cpu` writes under mpirun, beside the GPU profile NAME.json:
//  - the GPU profile, amended: nvlink_GBps_per_direction is the ranks' measured link;
//  - NAME-node.json, "trainyard.node.v1": `ranks` GPUs (this device) on one switch, one socket's DRAM and its
//    root complex; the profile names its GPU by the file name `gpu_file` (resolved beside it);
//  - NAME-mpi.json, "trainyard.collectives.v1": one protocol, "mpi", with the fitted costs.
void add_peer_link(json::Json& gpu_document, const PeerMeasurements& m, const PeerFits& fits, const std::string& command);
json::Json peer_node_profile(const std::string& name, const std::string& gpu_file, const json::Json& gpu_document, const PeerMeasurements& m,
                             const PeerFits& fits, const std::string& command);
json::Json peer_collective_library(const std::string& name, const PeerMeasurements& m, const PeerFits& fits, const std::string& command);

// NAME-node.json and NAME-mpi.json beside `gpu_out` (NAME.json).
std::string peer_node_path(const std::string& gpu_out);
std::string peer_library_path(const std::string& gpu_out);

}  // namespace trainyard::backend
