#include <gtest/gtest.h>

#include <set>

#include "hwprofiles/catalog.hpp"
#include "hwprofiles/topology.hpp"

namespace trainyard::hw {

namespace {
std::vector<std::string> names(const Topology& topo, const Route& route) {
  std::vector<std::string> out;
  for (VertexId v : route.vertices) out.push_back(topo.name(v));
  return out;
}
}  // namespace

TEST(Topology, DgxA100GpuToHostGoesThroughItsSwitch) {
  const Topology topo(load_node("dgx-a100"), 1);
  const VertexId gpu0 = topo.gpu(0, 0);
  const auto host = topo.nearest_host_memory(gpu0);
  ASSERT_TRUE(host.has_value());
  const Route r = topo.route(gpu0, *host);
  EXPECT_EQ(names(topo, r), (std::vector<std::string>{"gpu0", "sw0", "cpu0", "dram0"}));
  EXPECT_NEAR(r.bottleneck_GBps, 31.5, 0.01);  // Gen4 x16
  // gpu7 sits on the other socket.
  EXPECT_EQ(topo.name(*topo.nearest_host_memory(topo.gpu(0, 7))), "dram1");
}

TEST(Topology, GpuToGpuPrefersNvlinkOverASharedSwitch) {
  const Topology topo(load_node("dgx-a100"), 1);
  const Route r = topo.route(topo.gpu(0, 0), topo.gpu(0, 1));  // also share PCIe switch sw0
  EXPECT_EQ(names(topo, r), (std::vector<std::string>{"gpu0", "nvswitch", "gpu1"}));
  EXPECT_DOUBLE_EQ(r.bottleneck_GBps, 240);  // NVLink's data rate (NCCL: 12 lanes x 20 GB/s), not the 300 signalled
}

// Between nodes each GPU uses its own NIC, as NCCL pairs them: on DGX A100 two GPUs and two NICs share each PCIe
// switch, so the 8 GPUs get the 8 NICs; a ring over nodes then runs one channel per rail.
TEST(Topology, EachGpuOfADgxGetsItsOwnRailNic) {
  const Topology topo(load_node("dgx-a100"), 2);
  EXPECT_EQ(topo.rail_count(), 8);
  std::set<std::string> nics;
  for (int g = 0; g < 8; ++g) {
    const auto nic = topo.rail_nic(topo.gpu(1, g));
    ASSERT_TRUE(nic.has_value());
    const auto same_switch = topo.route(topo.gpu(1, g), *nic);
    EXPECT_EQ(same_switch.links.size(), 2u) << topo.name(*nic);  // gpu -> its PCIe switch -> the NIC
    nics.insert(topo.name(*nic));
  }
  EXPECT_EQ(nics.size(), 8u);
}

TEST(Topology, PcieOnlyServerRoutesAcrossSwitchesAndSockets) {
  const Topology topo(load_node("pcie-4090x8"), 1);
  EXPECT_FALSE(topo.pcie_peer_to_peer());
  const Route same_switch = topo.route(topo.gpu(0, 0), topo.gpu(0, 1));
  EXPECT_EQ(names(topo, same_switch), (std::vector<std::string>{"gpu0", "sw0", "gpu1"}));
  const Route other_socket = topo.route(topo.gpu(0, 0), topo.gpu(0, 7));
  EXPECT_EQ(names(topo, other_socket), (std::vector<std::string>{"gpu0", "sw0", "cpu0", "cpu1", "sw3", "gpu7"}));
}

TEST(Topology, GpusAndHostMemoryAreNeverTransit) {
  const Topology topo(load_node("dgx-a100"), 1);
  const Route r = topo.route(topo.gpu(0, 0), topo.gpu(0, 5));
  for (std::size_t i = 1; i + 1 < r.vertices.size(); ++i) {
    const auto type = topo.vertex_info(r.vertices[i]).type;
    EXPECT_NE(type, VertexType::gpu);
    EXPECT_NE(type, VertexType::host_memory);
  }
}

TEST(Topology, ClusterJoinsNodesThroughNicsAndFabric) {
  const Topology topo(load_node("dgx-h100"), 2);
  EXPECT_EQ(topo.node_count(), 2);
  const Route r = topo.route(topo.gpu(0, 0), topo.gpu(1, 0));
  // Either NIC under gpu0's switch is equally fast; which GPU uses which NIC (rails) is the simulator's choice.
  const auto path = names(topo, r);
  ASSERT_EQ(path.size(), 7u);
  EXPECT_EQ(path[0], "n0.gpu0");
  EXPECT_EQ(path[1], "n0.sw0");
  EXPECT_TRUE(path[2] == "n0.nic0" || path[2] == "n0.nic1") << path[2];
  EXPECT_EQ(path[3], "fabric");
  EXPECT_TRUE(path[4] == "n1.nic0" || path[4] == "n1.nic1") << path[4];
  EXPECT_EQ(path[5], "n1.sw0");
  EXPECT_EQ(path[6], "n1.gpu0");
  EXPECT_DOUBLE_EQ(r.bottleneck_GBps, 50);  // NDR 400 Gb/s
  EXPECT_GT(r.latency_ns, 0);
}

TEST(Topology, DramLinksAreHalfDuplex) {
  const Topology topo(load_node("lab-h100"), 1);
  const Route r = topo.route(topo.gpu(0, 0), *topo.nearest_host_memory(topo.gpu(0, 0)));
  ASSERT_FALSE(r.links.empty());
  EXPECT_FALSE(topo.link(r.links.back()).full_duplex);
  EXPECT_TRUE(topo.link(r.links.front()).full_duplex);
}

}  // namespace trainyard::hw
