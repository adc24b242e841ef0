#include <functional>

#include <gtest/gtest.h>

#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "test_support.hpp"

namespace trainyard::hw {

using test::source_json;
using test::TempDir;

TEST(HwProfiles, AllBuiltinNamesArePresent) {
  const std::vector<std::string> gpus = {"a100-40gb-sxm", "a100-80gb-pcie",     "a100-80gb-sxm", "a800-80gb-sxm", "cpu-device", "h100-pcie",
                                         "h100-sxm",      "h100-sxm-96gb-500w", "h200-sxm",      "l40s",          "rtx-4090"};
  const std::vector<std::string> nodes = {"dgx-a100",
                                          "dgx-h100",
                                          "grand-teton-h100",
                                          "hgx-a800",
                                          "hgx-h200",
                                          "lab-h100",
                                          "lab-h200",
                                          "osc-ascend-a100x4",
                                          "osc-ascend-a100x4-4nic",
                                          "osc-ascend-a100x4-hdr100",
                                          "pcie-4090x8",
                                          "pcie-a100x4"};
  EXPECT_EQ(builtin_gpu_names(), gpus);
  EXPECT_EQ(builtin_node_names(), nodes);
}

TEST(HwProfiles, EveryBuiltinGpuLoadsWithSourcedFigures) {
  for (const auto& name : builtin_gpu_names()) {
    SCOPED_TRACE(name);
    const GpuProfile gpu = load_gpu(name);
    EXPECT_EQ(gpu.name, name);
    EXPECT_GE(gpu.peak_tflops(Dtype::bf16), gpu.peak_tflops(Dtype::tf32));
    EXPECT_GT(gpu.peak_tflops(Dtype::tf32), 0);
    EXPECT_FALSE(gpu.hbm_bytes.source_id.empty());
    EXPECT_LE(gpu.sustained.pcie_h2d_GBps.value, gpu.pcie_raw_GBps_per_direction());
  }
}

TEST(HwProfiles, DatasheetFiguresOfKnownGpus) {
  const GpuProfile h100 = load_gpu("h100-sxm");
  EXPECT_DOUBLE_EQ(h100.peak_tflops(Dtype::bf16), 989.4);
  EXPECT_DOUBLE_EQ(h100.hbm_bytes.value, 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(h100.hbm_GBps.value, 3350);
  EXPECT_DOUBLE_EQ(h100.nvlink_GBps_per_direction.value, 450);
  EXPECT_EQ(h100.peak_dense_tflops[0].source.kind, json::Source::Kind::datasheet);
  EXPECT_EQ(h100.sustained.gemm_efficiency.source.kind, json::Source::Kind::estimate);
  // Ridge point: 989.4e12 / 3350e9 = 295 FLOP/byte.
  EXPECT_NEAR(h100.ridge_flop_per_byte(Dtype::bf16), 295.3, 0.1);
  EXPECT_DOUBLE_EQ(load_gpu("a100-80gb-sxm").peak_tflops(Dtype::bf16), 312);
  EXPECT_DOUBLE_EQ(load_gpu("rtx-4090").nvlink_GBps_per_direction.value, 0);
}

TEST(HwProfiles, EfficiencyTablesInterpolateInLogFlops) {
  EfficiencyTable t;
  t.points = {{1e6, 0.1}, {1e9, 0.4}};
  EXPECT_DOUBLE_EQ(t.at(1e3), 0.1);    // clamped below
  EXPECT_DOUBLE_EQ(t.at(1e12), 0.4);   // and above
  EXPECT_NEAR(t.at(1e7), 0.2, 1e-12);  // a third of the way in log10
  const GpuProfile h100 = load_gpu("h100-sxm");
  EXPECT_LT(h100.sustained.gemm.at(1e8), h100.sustained.gemm.at(1e11));
  EXPECT_DOUBLE_EQ(h100.sustained.gemm.at(1e13), h100.sustained.gemm_efficiency.value);
}

TEST(HwProfiles, PcieRates) {
  EXPECT_NEAR(pcie_GBps_per_direction(4, 16), 31.5, 0.01);
  EXPECT_NEAR(pcie_GBps_per_direction(5, 16), 63.02, 0.01);  // 32 GT/s x 128/130 x 16 lanes / 8
  EXPECT_NEAR(pcie_GBps_per_direction(3, 16), 15.75, 0.01);
}

TEST(HwProfiles, BuiltinNodesMatchTheirDescriptions) {
  const NodeProfile dgx = load_node("dgx-a100");
  EXPECT_EQ(dgx.gpu_count(), 8);
  EXPECT_EQ(dgx.gpu.name, "a100-80gb-sxm");
  EXPECT_EQ(dgx.count(VertexType::pcie_switch), 4);
  EXPECT_EQ(dgx.count(VertexType::nic), 8);
  EXPECT_DOUBLE_EQ(dgx.nic_GBps_per_gpu(), 25.0);  // HDR 200 Gb/s
  EXPECT_DOUBLE_EQ(dgx.host_dram_bytes.value, 2.0 * 1024 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(load_node("dgx-h100").nic_GBps_per_gpu(), 50.0);  // NDR 400 Gb/s
  EXPECT_EQ(load_node("pcie-a100x4").gpu_count(), 4);
  EXPECT_EQ(load_node("pcie-a100x4").count(VertexType::nvswitch), 0);
  EXPECT_FALSE(load_node("pcie-4090x8").pcie_peer_to_peer);
  for (const char* lab : {"lab-h100", "lab-h200"}) {
    const NodeProfile node = load_node(lab);
    EXPECT_EQ(node.gpu_count(), 1);
    EXPECT_DOUBLE_EQ(node.host_dram_bytes.value, 128.0 * 1024 * 1024 * 1024);
    EXPECT_EQ(node.gpu.pcie_generation.value, 5);
  }
}

// Bad input: each mutation of a good profile must fail with a message naming the file, the field and what
// was expected.
struct BadCase {
  std::string name;
  std::string base;  // a built-in file to start from
  std::function<void(nlohmann::json&)> mutate;
  std::vector<std::string> expected_in_message;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadProfile : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadProfile, IsRejectedWithFileFieldAndExpectation) {
  const BadCase& c = GetParam();
  nlohmann::json doc = source_json(c.base);
  c.mutate(doc);
  TempDir dir;
  const std::string path = dir.write("bad.json", doc.dump(2));
  try {
    if (c.base.find("/gpus/") != std::string::npos) {
      load_gpu(path);
    } else {
      load_node(path);
    }
    FAIL() << "accepted";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& part : c.expected_in_message) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

const std::string kGpu = "hwprofiles/gpus/h100-sxm.json";
const std::string kNode = "hwprofiles/nodes/dgx-a100.json";

INSTANTIATE_TEST_SUITE_P(
    Cases, BadProfile,
    ::testing::Values(
        BadCase{"unknown_field", kGpu, [](auto& j) { j["hbm_gb"] = 80; }, {"field 'hbm_gb'", "unknown field"}},
        BadCase{"missing_field", kGpu, [](auto& j) { j.erase("hbm_GBps"); }, {"field 'hbm_GBps'", "missing"}},
        BadCase{"hbm_in_gb", kGpu, [](auto& j) { j["hbm_bytes"]["value"] = 80; }, {"field 'hbm_bytes.value'", "bytes", "looks like GB"}},
        BadCase{
            "negative_bandwidth", kGpu, [](auto& j) { j["hbm_GBps"]["value"] = -3350; }, {"field 'hbm_GBps.value'", "GB/s", "got -3350", "positive"}},
        BadCase{"zero_peak", kGpu, [](auto& j) { j["peak_dense_tflops"]["bf16"]["value"] = 0; }, {"field 'peak_dense_tflops.bf16.value'", "TFLOP/s"}},
        BadCase{"bandwidth_in_tbps", kGpu, [](auto& j) { j["hbm_GBps"]["value"] = 3.35; }, {"field 'hbm_GBps.value'", "GB/s", "got 3.35"}},
        BadCase{"fractional_sm_count", kGpu, [](auto& j) { j["sm_count"]["value"] = 131.5; }, {"field 'sm_count.value'", "an integer"}},
        BadCase{"copy_faster_than_link",
                kGpu,
                [](auto& j) { j["sustained"]["pcie_h2d_GBps"]["value"] = 80; },
                {"field 'sustained.pcie_h2d_GBps'", "raw PCIe rate"}},
        // Bandwidth keys written before they said GB/s are refused with the new name, not read 8x off.
        BadCase{"old_bandwidth_key",
                kGpu,
                [](auto& j) {
                  j["hbm_gbps"] = j["hbm_GBps"];
                  j.erase("hbm_GBps");
                },
                {"field 'hbm_gbps'", "\"hbm_GBps\" instead", "gigabits", "old key"}},
        BadCase{"old_nic_bandwidth_key",
                kNode,
                [](auto& j) {
                  for (auto& v : j["topology"]["vertices"]) {
                    if (v["type"] == "nic") {
                      v["gbps_per_direction"] = v["GBps_per_direction"];
                      v.erase("GBps_per_direction");
                    }
                  }
                },
                {"gbps_per_direction'", "\"GBps_per_direction\" instead"}},
        BadCase{"unknown_source", kGpu, [](auto& j) { j["hbm_GBps"]["source"] = "blog"; }, {"field 'hbm_GBps.source'", "sources"}},
        BadCase{"bad_source_kind",
                kGpu,
                [](auto& j) { j["sources"]["datasheet"]["kind"] = "rumour"; },
                {"field 'sources.datasheet.kind'", "datasheet, measured, estimate"}},
        BadCase{"measured_without_date",
                kGpu,
                [](auto& j) {
                  j["sources"]["datasheet"] = {{"kind", "measured"}, {"command", "x"}};
                },
                {"field 'sources.datasheet.date'", "missing"}},
        BadCase{"efficiency_table_not_increasing",
                kGpu,
                [](auto& j) {
                  j["sustained"]["efficiency_by_flops"]["gemm"]["points"] = {{1e9, 0.5}, {1e6, 0.1}};
                },
                {"field 'sustained.efficiency_by_flops.gemm.points[1]'", "flops increasing"}},
        BadCase{"efficiency_above_one",
                kGpu,
                [](auto& j) {
                  j["sustained"]["efficiency_by_flops"]["attention_fwd"]["points"] = {{1e9, 75}};
                },
                {"field 'sustained.efficiency_by_flops.attention_fwd.points[0]'", "fraction in (0, 1]"}},
        BadCase{"wrong_schema", kGpu, [](auto& j) { j["schema"] = "trainyard.node.v1"; }, {"field 'schema'", "trainyard.gpu.v1"}},
        BadCase{"unknown_gpu", kNode, [](auto& j) { j["gpu"] = "a200"; }, {"field 'gpu'", "unknown GPU profile", "a200"}},
        BadCase{"dram_in_gb", kNode, [](auto& j) { j["host_dram_bytes"]["value"] = 2048; }, {"field 'host_dram_bytes.value'", "looks like GB"}},
        BadCase{"unknown_vertex_type",
                kNode,
                [](auto& j) { j["topology"]["vertices"][0]["type"] = "cpu"; },
                {"field 'topology.vertices[0].type'", "root_complex"}},
        BadCase{"duplicate_vertex",
                kNode,
                [](auto& j) { j["topology"]["vertices"][1]["id"] = "cpu0"; },
                {"field 'topology.vertices[1].id'", "not used by another vertex"}},
        BadCase{"link_to_nowhere", kNode, [](auto& j) { j["topology"]["links"][0]["b"] = "sw9"; }, {"field 'topology.links[0].b'", "sw9"}},
        BadCase{"gpu_ids_not_contiguous",
                kNode,
                [](auto& j) {
                  for (auto& v : j["topology"]["vertices"]) {
                    if (v["id"] == "gpu3") v["id"] = "gpu9";
                  }
                },
                {"field 'topology.vertices'", "gpu0..gpu7", "gpu3"}},
        BadCase{"dram_link_between_gpus",
                kNode,
                [](auto& j) {
                  j["topology"]["links"].push_back({{"a", "gpu0"}, {"b", "gpu1"}, {"type", "dram"}, {"GBps", {{"value", 1}, {"source", "dgx"}}}});
                },
                {"field 'topology.links[", "a link type that can join a gpu and a gpu"}},
        BadCase{"bad_pcie_lanes", kNode, [](auto& j) { j["topology"]["links"][0]["lanes"] = 0; }, {"field 'topology.links[0].lanes'", "[1, 32]"}},
        BadCase{"stray_latency",
                kNode,
                [](auto& j) {
                  j["topology"]["latency_ns"]["ethernet"] = {{"value", 1}, {"source", "dgx"}};
                },
                {"field 'topology.latency_ns.ethernet'", "unknown field"}},
        BadCase{"sockets_not_joined",
                "hwprofiles/nodes/pcie-a100x4.json",
                [](auto& j) {
                  nlohmann::json kept = nlohmann::json::array();
                  for (auto& l : j["topology"]["links"]) {
                    if (l["type"] != "socket") kept.push_back(l);
                  }
                  j["topology"]["links"] = kept;
                  j["topology"]["latency_ns"].erase("socket");
                },
                {"field 'topology.links'", "between every two GPUs", "gpu0 and gpu2"}},
        BadCase{"gpu_cut_off_from_host",
                kNode,
                [](auto& j) {
                  auto& links = j["topology"]["links"];
                  nlohmann::json kept = nlohmann::json::array();
                  for (auto& l : links) {
                    if (!(l["type"] == "pcie" && (l["a"] == "gpu0" || l["b"] == "gpu0"))) kept.push_back(l);
                  }
                  links = kept;
                },
                {"field 'topology.links'", "gpu0", "host memory"}}),
    [](const ::testing::TestParamInfo<BadCase>& param) { return param.param.name; });

TEST(HwProfiles, UnknownNameListsTheBuiltins) {
  try {
    load_node("dgx-z100", "--hw");
    FAIL() << "accepted";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--hw"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dgx-z100"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dgx-a100"), std::string::npos) << msg;
  }
}

TEST(HwProfiles, NodeFileMayReferToAGpuFileBesideIt) {
  TempDir dir;
  nlohmann::json gpu = source_json("hwprofiles/gpus/h100-sxm.json");
  gpu["name"] = "my-gpu";
  dir.write("my-gpu.json", gpu.dump());
  nlohmann::json node = source_json("hwprofiles/nodes/lab-h100.json");
  node["gpu"] = "my-gpu.json";
  const NodeProfile loaded = load_node(dir.write("node.json", node.dump()));
  EXPECT_EQ(loaded.gpu.name, "my-gpu");
}

}  // namespace trainyard::hw
