// The ranks' links as `mpirun -np N trainyard calibrate --device cpu` fits and writes them (backend/
// calibrate_peers.hpp): the fits recover known costs from exact points and keep their parameters in range, bad
// points are named, and the node profile and collective library written make the simulator predict the times the
// points were made from. Measuring itself runs under mpirun (test_mpi.cpp).
#include <gtest/gtest.h>

#include <filesystem>

#include "calibrate/calibrate_peers.hpp"
#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "sim/collectives.hpp"
#include "sim/engine.hpp"
#include "stacks/collective_library.hpp"
#include "test_support.hpp"

namespace trainyard::backend {

namespace {

struct PeerTruth {
  int ranks = 4;
  double fixed_s = 20e-6, GBps = 2.0;                      // one message
  double base_s = 5e-6, step_s = 30e-6, efficiency = 0.8;  // a collective
};

double collective_seconds(const PeerTruth& t, sim::CollectiveOp op, double bytes) {
  const auto b = static_cast<std::int64_t>(bytes);
  return t.base_s + sim::collective_steps(op, sim::Algorithm::ring, t.ranks) * t.step_s +
         sim::bytes_sent_per_rank(op, sim::Algorithm::ring, t.ranks, b) / (t.efficiency * t.GBps * 1e9);
}

PeerMeasurements exact_points(const PeerTruth& t) {
  PeerMeasurements m;
  m.ranks = t.ranks;
  m.transport = "test transport";
  m.method = "made from known costs";
  for (std::int64_t b : peer_message_bytes()) m.p2p.push_back({double(b), t.fixed_s + double(b) / (t.GBps * 1e9)});
  for (std::int64_t b : peer_collective_bytes()) {
    m.all_reduce.push_back({double(b), collective_seconds(t, sim::CollectiveOp::all_reduce, double(b))});
    m.all_to_all.push_back({double(b), collective_seconds(t, sim::CollectiveOp::all_to_all, double(b))});
  }
  return m;
}

}  // namespace

TEST(PeerFit, RecoversTheLinkAndTheCollectiveCostsFromExactPoints) {
  const PeerTruth t;
  const PeerFits f = fit_peers(exact_points(t));
  EXPECT_NEAR(f.link_GBps, t.GBps, 1e-6 * t.GBps);
  EXPECT_NEAR(f.hop_latency_ns, t.fixed_s * 1e9 / 2, 1e-3);
  EXPECT_NEAR(f.base_latency_us, t.base_s * 1e6, 1e-3);
  EXPECT_NEAR(f.step_latency_us, t.step_s * 1e6, 1e-3);
  EXPECT_NEAR(f.efficiency, t.efficiency, 1e-6);
  EXPECT_LT(f.collective_rms_relative_error, 1e-9);
  EXPECT_EQ(f.collective_points, 2 * peer_collective_bytes().size());
  EXPECT_TRUE(f.warnings.empty());
}

TEST(PeerFit, ParametersOutsideTheirRangeAreHeldAtTheBoundAndSaySo) {
  PeerTruth t;
  t.efficiency = 1.6;  // collectives faster than one message: an efficiency above 1 is no wire format
  t.base_s = 0;
  PeerFits f = fit_peers(exact_points(t));
  EXPECT_EQ(f.efficiency, 1.0);
  EXPECT_GE(f.base_latency_us, 0.0);
  EXPECT_GE(f.step_latency_us, 0.0);
  bool said = false;
  for (const auto& w : f.warnings) said |= w.find("efficiency is held at 1") != std::string::npos;
  EXPECT_TRUE(said);

  PeerMeasurements m = exact_points(PeerTruth{});
  for (auto& p : m.all_reduce) p.seconds -= 4e-6;  // negative base: the small all-reduces cost less than the model's floor
  f = fit_peers(m);
  EXPECT_GE(f.base_latency_us, 0.0);
  EXPECT_LE(f.efficiency, 1.0);
}

TEST(PeerFit, BadPointsNameTheirField) {
  PeerMeasurements m = exact_points(PeerTruth{});
  m.all_reduce[1].seconds = 0;
  try {
    fit_peers(m);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce[1].seconds"), std::string::npos) << e.what();
  }
  m = exact_points(PeerTruth{});
  m.p2p.resize(2);
  EXPECT_THROW(fit_peers(m), InputError);  // too few sizes for a line
  m = exact_points(PeerTruth{});
  m.ranks = 1;
  EXPECT_THROW(fit_peers(m), InputError);
}

// The written documents load, and the simulator, on them, takes the times the points were made from.
TEST(PeerProfiles, NodeAndLibraryLoadAndTheSimulatorPredictsTheMeasuredTimes) {
  test::TempDir dir;
  const PeerTruth t;
  const PeerMeasurements m = exact_points(t);
  const PeerFits f = fit_peers(m);
  const std::string gpu_path = (dir.path() / "cpu-test.json").string();
  json::Json gpu = hw::load_gpu_document("cpu-device").json;
  gpu["name"] = "cpu-test";
  add_peer_link(gpu, m, f, "trainyard calibrate --device cpu --out cpu-test.json");
  write_file_atomically(gpu_path, std::string_view(gpu.dump(2)));
  const json::Json node_doc = peer_node_profile("cpu-test-node", "cpu-test.json", gpu, m, f, "the command");
  write_file_atomically(peer_node_path(gpu_path), std::string_view(node_doc.dump(2)));
  EXPECT_EQ(peer_node_path(gpu_path), (dir.path() / "cpu-test-node.json").string());
  EXPECT_EQ(peer_library_path(gpu_path), (dir.path() / "cpu-test-mpi.json").string());

  const hw::NodeProfile node = hw::load_node(peer_node_path(gpu_path), "--hw");
  EXPECT_EQ(node.gpu_count(), t.ranks);
  EXPECT_EQ(node.gpu.name, "cpu-test");
  EXPECT_NEAR(node.gpu.nvlink_data_GBps(), t.GBps, 1e-6);
  EXPECT_EQ(node.gpu.nvlink_GBps_per_direction.source.kind, json::Source::Kind::measured);
  EXPECT_EQ(node.latency_ns.at(hw::LinkType::nvlink).source.kind, json::Source::Kind::measured);
  const stacks::CollectiveLibrary library = stacks::parse_collective_library(peer_collective_library("cpu-test-mpi", m, f, "the command"), "test");
  ASSERT_EQ(library.protocols.size(), 1u);
  EXPECT_FALSE(library.nvls.has_value());

  const sim::Cluster cluster(node, 1);
  sim::SimOptions options;
  options.collectives = &library;
  const double message_bytes = 1 << 20, collective_bytes = 4 << 20;
  const auto predicted_s = [&](sim::TaskGraph g) {
    g.finalize();
    const sim::SimResult r = sim::simulate(g, cluster, options);
    EXPECT_TRUE(r.completed) << r.stuck;
    return static_cast<double>(r.step_ns) * 1e-9;
  };
  sim::TaskGraph send;
  send.send("message", 1, 2, static_cast<std::int64_t>(message_bytes));
  EXPECT_NEAR(predicted_s(std::move(send)) / (t.fixed_s + message_bytes / (t.GBps * 1e9)), 1.0, 1e-3);
  for (auto op : {sim::CollectiveOp::all_reduce, sim::CollectiveOp::all_to_all}) {
    sim::TaskGraph g;
    g.collective("collective", {op, sim::Algorithm::ring, g.add_group({0, 1, 2, 3}), static_cast<std::int64_t>(collective_bytes)});
    EXPECT_NEAR(predicted_s(std::move(g)) / collective_seconds(t, op, collective_bytes), 1.0, 1e-3) << static_cast<int>(op);
  }
}

}  // namespace trainyard::backend
