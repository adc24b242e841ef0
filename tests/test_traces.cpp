// Engines' profiler traces (traces/): the Kineto reader on hand-made fixtures in both PyTorch layouts, gzip'd and
// plain (tests/data/traces/README.md), bad input named by file and place, the kernel classes, and the comparison
// of a simulated step with an engine's measured one.
#include <gtest/gtest.h>

#include <tuple>

#include "common/error.hpp"
#include "test_support.hpp"
#include "traces/engine_compare.hpp"
#include "traces/kernel_classes.hpp"
#include "traces/kineto.hpp"

namespace trainyard::traces {
namespace {

const std::string kTraces = std::string(TRAINYARD_TEST_DATA_DIR) + "/traces/";

int count_kind(const RankTrace& r, GpuActivity::Kind kind) {
  int n = 0;
  for (const auto& a : r.activities) n += a.kind == kind;
  return n;
}

TEST(Kineto, TwoRanksOneGzippedReadWithStepsCopiesAndCollectives) {
  const auto ranks = read_kineto(kTraces + "kineto2-ranks");
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const RankTrace& t = ranks[static_cast<std::size_t>(r)];
    SCOPED_TRACE(t.origin);
    EXPECT_EQ(t.rank, r);
    EXPECT_EQ(t.world_size, 2);
    EXPECT_FALSE(t.legacy_layout);
    ASSERT_EQ(t.steps.size(), 3u);
    EXPECT_EQ(t.steps[0].number, 5);
    EXPECT_EQ(t.steps[1].start_ns - t.steps[0].start_ns, 1'600'000);
    EXPECT_EQ(t.steps[0].duration_ns, 1'500'000);
    EXPECT_EQ(t.activities.size(), 27u);  // 9 a step: 2 copies, 7 kernels
    EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_h2d), 3);
    EXPECT_EQ(count_kind(t, GpuActivity::Kind::memcpy_d2h), 3);
    // The collective's metadata: on the kernel (rank 0), through the record_param_comms op's External id (rank 1).
    int collectives = 0;
    for (const auto& a : t.activities) {
      if (a.collective < 0) continue;
      ++collectives;
      const CollectiveInfo& c = t.collectives[static_cast<std::size_t>(a.collective)];
      EXPECT_EQ(c.name, "allreduce");
      EXPECT_EQ(c.group_size, 2);
      EXPECT_EQ(c.bytes(), 16 << 20);
      EXPECT_EQ(a.stream, 20);
    }
    EXPECT_EQ(collectives, 3);
  }
  EXPECT_EQ(ranks[1].activities[1].duration_ns, 110'000);  // rank 1's kernels are 10% longer: read, not assumed
}

TEST(Kineto, PyTorch1LayoutReadWithStreamsFromTheTidText) {
  const auto t = read_kineto_file(kTraces + "kineto1-legacy.json");
  EXPECT_TRUE(t.legacy_layout);
  EXPECT_EQ(t.rank, -1);  // no distributedInfo
  ASSERT_EQ(t.steps.size(), 2u);
  ASSERT_EQ(t.activities.size(), 8u);  // the Runtime events stay on the host
  for (const auto& a : t.activities) EXPECT_EQ(a.stream, 7);
  EXPECT_EQ(count_kind(t, GpuActivity::Kind::memset), 2);
  EXPECT_EQ(t.steps[1].start_ns - t.steps[0].start_ns, 2'000'000);
}

TEST(Kineto, BadTracesAreErrorsNamingTheFileAndWhere) {
  const auto error = [](const std::string& file) { return test::error_of([&] { read_kineto_file(kTraces + file); }); };
  const std::string truncated = error("bad-truncated.json");
  EXPECT_NE(truncated.find("bad-truncated.json"), std::string::npos) << truncated;
  EXPECT_NE(truncated.find("byte "), std::string::npos) << truncated;
  // In trainyard's words, not the JSON library's exception id (issue 45).
  EXPECT_EQ(truncated.find("json.exception"), std::string::npos) << truncated;
  EXPECT_NE(truncated.find("a file cut short"), std::string::npos) << truncated;
  const std::string missing = error("bad-missing-dur.json");
  EXPECT_NE(missing.find("traceEvents[5].dur"), std::string::npos) << missing;
  EXPECT_NE(error("bad-no-events.json").find("traceEvents"), std::string::npos);
  EXPECT_NE(error("no-such-trace.json").find("no-such-trace.json"), std::string::npos);
  EXPECT_FALSE(looks_like_kineto(kTraces + "README.md"));
  EXPECT_TRUE(looks_like_kineto(kTraces + "kineto2-ranks"));
  EXPECT_TRUE(looks_like_kineto(kTraces + "kineto2-ranks/kineto2-rank1.pt.trace.json.gz"));
}

TEST(KernelClasses, NamesFromTheLibrariesLandInTheSimulatorsClasses) {
  const KernelClassifier c;
  EXPECT_EQ(c.classify("nvjet_tst_192x192_64x4_2x1_v_bz_TNN"), "gemm");
  EXPECT_EQ(c.classify("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"),
            "gemm");
  EXPECT_EQ(c.classify(
                "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(flash::Flash_fwd_params)"),
            "attention fwd");
  EXPECT_EQ(c.classify("void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
                       "cutlass::bfloat16_t>>()"),
            "attention bwd");
  EXPECT_EQ(c.classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"), "collective");
  EXPECT_EQ(c.classify("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)"), "collective");
  EXPECT_EQ(c.classify("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"), "p2p");
  EXPECT_EQ(c.classify("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, int>, float>()"), "optimizer");
  EXPECT_EQ(c.classify("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>()"), "elementwise");
  EXPECT_EQ(c.classify("triton_poi_fused_add_mul_0"), "elementwise");
  EXPECT_EQ(c.classify("my_custom_kernel"), kUnclassified);
  // Rules of a file come first; a bad one is named.
  const test::TempDir dir;
  const KernelClassifier extended(dir.write("rules.json", R"({"schema": "trainyard.kernel_classes.v1", "rules": [
      {"class": "gemm", "match": "^my_custom"}]})"));
  EXPECT_EQ(extended.classify("my_custom_kernel"), "gemm");
  const std::string bad_class = test::error_of(
      [&] { KernelClassifier(dir.write("bad.json", R"({"schema": "trainyard.kernel_classes.v1", "rules": [{"class": "matmul", "match": "x"}]})")); });
  EXPECT_NE(bad_class.find("rules[0].class"), std::string::npos) << bad_class;
  const std::string bad_regex = test::error_of([&] {
    KernelClassifier(dir.write("regex.json", R"({"schema": "trainyard.kernel_classes.v1", "rules": [{"class": "gemm", "match": "(["}]})"));
  });
  EXPECT_NE(bad_regex.find("match"), std::string::npos) << bad_regex;
}

// A simulated step of one GPU: two GEMMs, attention, and one all-reduce of `collective_bytes`.
sim::Timeline predicted_step(std::int64_t collective_bytes, int gemms) {
  sim::Timeline t;
  t.origin = "predicted";
  t.step_ns = 1'200'000;
  t.process_names[0] = "gpu0";
  t.stream_names[{0, 0}] = "compute0";
  t.stream_names[{0, 1}] = "comm";
  std::int64_t at = 0;
  const auto add = [&](const std::string& name, const std::string& task_class, int tid, std::int64_t ns, std::int64_t bytes = 0) {
    t.slices.push_back({name, 0, tid, task_class, at, ns, bytes});
    at += ns;
  };
  for (int g = 0; g < gemms; ++g) add("L0 gemm " + std::to_string(g), "gemm", 0, 90'000);
  add("L0 attn", "attention fwd", 0, 140'000);
  add("L0 attn bwd", "attention bwd", 0, 280'000);
  add("dp all-reduce", "collective", 1, 350'000, collective_bytes);
  return t;
}

TEST(EngineCompare, PerClassAndStepPerGpuWithTheAssumptionsTheTraceContradicts) {
  const auto ranks = read_kineto(kTraces + "kineto2-ranks");
  const KernelClassifier classes;
  const EngineComparison c = compare_with_engine(predicted_step(16 << 20, 2), ranks, classes);
  EXPECT_EQ(c.measured_ranks, 2);
  EXPECT_EQ(c.measured_steps, 6);  // 3 steps each (the profiler's schedule keeps warm-up out of a trace)
  EXPECT_EQ(c.step.measured_ns, 1'500'000);
  EXPECT_EQ(c.step.predicted_ns, 1'200'000);
  const auto row = [&](const std::string& what) {
    for (const auto& r : c.by_class) {
      if (r.what == what) return r;
    }
    ADD_FAILURE() << what;
    return sim::ComparisonRow{};
  };
  EXPECT_EQ(row("gemm").measured_ns, 210'000);  // (2 x 100 + 2 x 110) / 2 ranks
  EXPECT_EQ(row("gemm").predicted_ns, 180'000);
  EXPECT_EQ(row("gemm").measured_count, 2);
  EXPECT_EQ(row("collective").measured_ns, 420'000);
  EXPECT_EQ(row(kUnclassified).measured_ns, 5'250);
  ASSERT_EQ(c.unclassified.size(), 1u);
  EXPECT_EQ(c.unclassified[0].name, "my_custom_kernel");
  EXPECT_TRUE(c.contradictions.empty()) << c.contradictions.front();  // same GEMM count, an all-reduce of the plan's size
  // Another plan: 8 GEMMs and an all-reduce of half the size.
  const EngineComparison d = compare_with_engine(predicted_step(8 << 20, 8), ranks, classes);
  ASSERT_EQ(d.contradictions.size(), 2u);
  EXPECT_NE(d.contradictions[0].find("8.0 GEMMs per GPU per step, the trace 2.0"), std::string::npos) << d.contradictions[0];
  EXPECT_NE(d.contradictions[1].find("allreduce of 16.0 MiB"), std::string::npos) << d.contradictions[1];
  const auto j = engine_comparison_json(d);
  EXPECT_EQ(j["by_class"][0]["what"], "gemm");
  EXPECT_EQ(j["contradictions"].size(), 2u);
}

// Where the GPU records its own ProfilerStep spans, a kernel that runs after its host step ended (the host runs
// ahead) still counts in its step; with host steps only, work after the last host step ends is not counted.
TEST(EngineCompare, KernelsCountInTheGpusOwnStepSpans) {
  RankTrace r;
  r.origin = "lagging";
  r.names = {"nvjet_gemm"};
  r.steps = {{1, 0, 1000}, {2, 1000, 1000}};
  for (std::int64_t start : {1500, 2500}) r.activities.push_back({GpuActivity::Kind::kernel, 0, 0, 7, start, 400, 0, -1});  // each 500 ns late
  const KernelClassifier classes;
  sim::Timeline predicted = predicted_step(0, 1);
  const auto gemm = [&](const EngineComparison& c) { return c.by_class.front(); };
  EXPECT_EQ(gemm(compare_with_engine(predicted, {r}, classes)).measured_ns, 200);  // host windows: the last kernel is lost
  r.gpu_steps = {{1, 1200, 900}, {2, 2200, 900}};
  EXPECT_EQ(gemm(compare_with_engine(predicted, {r}, classes)).measured_ns, 400);
}

// A real PyTorch 2.11 trace (an H200, scripts/kineto_capture.py; tests/data/traces/README.md): the device, the
// steps on both sides, and the shapes of the GEMM and attention ops (their "Concrete Inputs" come before their
// "Input Dims" in the file), tied to their kernels by External id.
TEST(Kineto, ARealPyTorchTraceWithShapesRecorded) {
  const RankTrace r = read_kineto_file(kTraces + "real/kineto-h2048-s8192.json.gz");
  EXPECT_EQ(r.device_name, "NVIDIA H200");
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.steps.size(), 4u);
  EXPECT_EQ(r.gpu_steps.size(), 4u);  // ProfilerStep#3-#6; the GPU's Optimizer.step spans are not steps
  const ShapedOp* forward = nullptr;
  int mm = 0;
  for (const auto& op : r.shaped_ops) {
    mm += op.name == "aten::mm";
    if (op.name == "aten::_cudnn_attention_forward" && forward == nullptr) forward = &op;
  }
  EXPECT_GE(mm, 4 * 51);  // every GEMM of 4 steps
  ASSERT_NE(forward, nullptr);
  ASSERT_GE(forward->concrete_inputs.size(), 11u);
  EXPECT_EQ(forward->concrete_inputs[10], "True");  // is_causal
  EXPECT_EQ(forward->input_dims[0], (std::vector<std::int64_t>{1, 16, 8192, 128}));
  int tied = 0;
  for (const auto& a : r.activities) tied += a.kind == GpuActivity::Kind::kernel && a.external_id == forward->external_id;
  EXPECT_EQ(tied, 1);  // cuDNN's forward is one kernel
}

// On the real trace: each GPU step runs to the next one's start (the GPU's ProfilerStep span stops where the
// optimizer's own span begins), so the optimizer's kernels count and the step is the GPU's period; every kernel of
// the job lands in a class.
TEST(EngineCompare, ARealTracesStepsRunFromOneGpuStepToTheNext) {
  const KernelClassifier classes;
  const EngineComparison c = compare_with_engine(predicted_step(0, 51), read_kineto(kTraces + "real/kineto-h2048-s8192.json.gz"), classes);
  EXPECT_EQ(c.measured_steps, 4);
  EXPECT_GT(c.step.measured_ns, 37'000'000);  // 37.0-37.6 ms from one GPU step's start to the next
  EXPECT_LT(c.step.measured_ns, 37'700'000);
  bool optimizer = false;
  for (const auto& row : c.by_class) {
    if (row.what == "optimizer") optimizer = row.measured_count == 17 && row.measured_ns > 1'500'000;  // fused AdamW, ~1.8 ms
    if (row.what == "gemm") {
      EXPECT_EQ(row.measured_count, 51);
    }
  }
  EXPECT_TRUE(optimizer);
  EXPECT_TRUE(c.unclassified.empty()) << c.unclassified.front().name;
}

// Kineto writes a step's GPU span once per stream that ran its work (here the compute stream and NCCL's): the
// reader merges them into one step each, from the earliest start to the latest end.
TEST(Kineto, AStepsGpuSpansOnSeveralStreamsAreOneStep) {
  const test::TempDir dir;
  std::string events;
  for (int step : {1, 2}) {
    const int base = step * 1000;
    for (const auto& [tid, start, dur] : {std::tuple{7, base, 900}, std::tuple{20, base + 300, 650}}) {
      events += R"({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#)" + std::to_string(step) + R"(", "pid": 0, "tid": )" +
                std::to_string(tid) + R"(, "ts": )" + std::to_string(start) + R"(, "dur": )" + std::to_string(dur) + "},\n";
    }
    events += R"({"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "pid": 0, "tid": 7, "ts": )" + std::to_string(base + 10) +
              R"(, "dur": 800, "args": {"device": 0, "stream": 7}},)" + "\n";
  }
  events.pop_back();
  events.pop_back();
  const std::string path = dir.write("two-streams.json", R"({"schemaVersion": 1, "traceEvents": [)" + events + "]}");
  const RankTrace r = read_kineto_file(path);
  ASSERT_EQ(r.gpu_steps.size(), 2u);
  EXPECT_EQ(r.gpu_steps[0].start_ns, 1'000'000);
  EXPECT_EQ(r.gpu_steps[0].duration_ns, 950'000);  // to the NCCL stream's end at 1950 us
  const EngineComparison c = compare_with_engine(predicted_step(0, 1), {r}, KernelClassifier());
  EXPECT_EQ(c.measured_steps, 2);
  EXPECT_EQ(c.step.measured_ns, 975'000);  // the median of 1000 us (start to start) and the last step's own 950
}

// A simulated timeline trimmed to a window (simulate --trace-window) holds part of the step: its per-step totals
// would be short, so it is refused, naming the file.
TEST(EngineCompare, ATrimmedSimulatedTimelineIsRefused) {
  sim::Timeline predicted = predicted_step(0, 1);
  predicted.window_end_ns = predicted.step_ns / 2;
  try {
    compare_with_engine(predicted, read_kineto(kTraces + "kineto1-legacy.json"), KernelClassifier());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--trace-window"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trainyard::traces
