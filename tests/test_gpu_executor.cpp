// The CUDA executor against the CPU reference executor: the same graph, weights and tokens give the same loss and
// gradients (within bf16 rounding of differently ordered work), the measured timeline respects the graph's
// dependencies, and an optimizer step matches the reference's. Skips without a GPU (run on one H100: benchmarks/results/gpu.md;
// backend/executor.hpp). What the executor refuses is checked before it touches the GPU, so that test runs
// everywhere.
#include <gtest/gtest.h>

#include "backend/executor.hpp"
#include "backend/reference_step.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "tests/backend_fixtures.hpp"
#include "tests/executor_checks.hpp"
#include "tests/gpu_support.hpp"

namespace trainyard::backend {

namespace {

using test::one_gpu;

const std::string kData = TRAINYARD_TEST_DATA_DIR;

// head_dim 64: the tensor-core attention's smallest; chunks of 64 tokens.
model::ModelConfig small_model() {
  return model::parse_custom_model("custom:layers=2,hidden=256,heads=4,kv_heads=2,head_dim=64,ffn_hidden=512,vocab=256");
}

planner::RingTrackParams offloaded() {
  planner::RingTrackParams p;
  p.chunk = 64;
  p.kv = planner::Placement::dram;
  p.acts = planner::ActivationPolicy::dram;
  p.prefetch = 2;
  return p;
}

}  // namespace

TEST(GpuExecutor, ChunkedOffloadedStepMatchesTheCpuReference) {
  TRAINYARD_REQUIRE_GPU();
  const auto m = small_model();
  const std::int64_t seq = 256;
  const auto g = test::ringtrack_graph(one_gpu(), m, seq, 2, offloaded());
  const auto device = make_cuda_device();
  const MeasuredStep measured = test::expect_step_matches_reference(*device, g, m, random_windows(m.vocab, seq, 2, 5), 3, 1000);
  EXPECT_GT(measured.pinned_bytes, 0) << "K/V and activations go to host memory";
}

TEST(GpuExecutor, AnOptimizerStepMatchesTheReference) {
  TRAINYARD_REQUIRE_GPU();
  const auto m = small_model();
  const auto g = test::ringtrack_graph(one_gpu(), m, 128, 1, offloaded());
  const auto tokens = random_windows(m.vocab, 128, 1, 9);
  ModelState cpu(m, 4), gpu(m, 4);
  ReferenceOptions ro;
  ro.run_optimizer = true;
  ro.adam.lr = 1e-2f;
  run_reference_step(g, cpu, 1, tokens, ro);
  ExecutorOptions eo;
  eo.run_optimizer = true;
  eo.adam = ro.adam;
  const auto device = make_cuda_device();
  Executor executor(*device, g, gpu, 1, {}, eo);
  executor.upload(gpu);
  executor.run_step(tokens, 1);
  executor.download(gpu);
  const auto [agree, moved] = test::adam_agreement(cpu, gpu);
  ASSERT_GT(moved, 1000);
  EXPECT_GT(agree, 0.99);
}

TEST(GpuExecutor, RefusesWhatItDoesNotRunYetBeforeTouchingTheGpu) {
  const auto m = small_model();
  const sim::Cluster four(hw::load_node(kData + "/tiny-node.json"), 1);
  planner::RingTrackParams ring = offloaded();
  ring.ring = 2;
  ring.ring_order = {0, 1};
  const auto g = test::ringtrack_graph(four, m, 256, 2, ring);
  ModelState shapes(m, 1);
  try {
    const auto device = make_cuda_device();
    Executor executor(*device, g, shapes, four.topology.gpus_per_node(), {}, {});
    FAIL() << "a two-GPU step was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("one rank per GPU"), std::string::npos) << e.what();
  }
  // A head width the attention kernels are not written for (examples/tiny-ringtrack.plan.json's 16).
  const auto narrow = model::parse_custom_model("custom:layers=2,hidden=64,heads=4,kv_heads=2,head_dim=16,ffn_hidden=192,vocab=256");
  const auto narrow_graph = test::ringtrack_graph(one_gpu(), narrow, 256, 1, offloaded());
  ModelState narrow_shapes(narrow, 1);
  try {
    const auto device = make_cuda_device();
    Executor executor(*device, narrow_graph, narrow_shapes, 1, {}, {});
    FAIL() << "head_dim 16 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}

}  // namespace trainyard::backend
