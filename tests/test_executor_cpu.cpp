// The executor (backend/executor.hpp) on the CPU device (backend/cpu_device.hpp): the schedule the GPU runs, with
// streams as threads and real event waits, against the CPU reference executor on the same graph, weights and
// tokens; and `calibrate --device cpu`'s sweep through the same device. scripts/sanitize.sh tsan runs this file
// under ThreadSanitizer: a wait the schedule lacks is a race there.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu_device.hpp"
#include "backend/executor.hpp"
#include "backend/reference_step.hpp"
#include "calibrate/calibrate_device.hpp"
#include "common/error.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "planner/schemes/zero_family/zero.hpp"
#include "tests/backend_fixtures.hpp"
#include "tests/executor_checks.hpp"
#include "tests/test_support.hpp"

namespace trainyard::backend {

namespace {

using test::chunked_offloaded;
using test::one_gpu;
using test::tiny_model;

// An AdamW step of lr 1e-2 on both sides: what the optimizer tests compare.
std::pair<ReferenceOptions, ExecutorOptions> adam_step_options() {
  ReferenceOptions ro;
  ro.run_optimizer = true;
  ro.adam.lr = 1e-2f;
  ExecutorOptions eo;
  eo.run_optimizer = true;
  eo.adam = ro.adam;
  return {ro, eo};
}

const std::string kData = TRAINYARD_TEST_DATA_DIR;

}  // namespace

TEST(CpuDevice, AWaitOrdersAStreamAfterAnotherStreamsWork) {
  const auto dev = make_cpu_device();
  const int a = dev->create_stream(), b = dev->create_stream(), done = dev->create_event();
  const std::int64_t n = 8 << 20;
  auto* src = static_cast<unsigned char*>(dev->allocate(n));
  auto* dst = static_cast<unsigned char*>(dev->allocate(n));
  dev->fill(src, 0, n);
  dev->fill(a, src, 7, n);  // long enough that stream b would overtake it without the wait
  dev->record(done, a);
  dev->wait(b, done);
  dev->copy(b, dst, src, n);
  dev->synchronize();
  EXPECT_EQ(dst[0], 7);
  EXPECT_EQ(dst[n - 1], 7);
  EXPECT_GE(dev->elapsed_ms(done, done), 0.0);
  dev->release(src);
  dev->release(dst);
}

TEST(CpuDevice, AnErrorOnAStreamComesBackFromSynchronizeAndTheDeviceRunsOn) {
  const auto dev = make_cpu_device();
  const int s = dev->create_stream();
  int not_scratch = 0;
  dev->release_scratch(s, &not_scratch);  // fails on the stream's thread
  EXPECT_THROW(dev->synchronize(), std::exception);
  const int e = dev->create_event();
  dev->record(e, s);
  EXPECT_NO_THROW(dev->synchronize());
  EXPECT_GE(dev->elapsed_ms(e, e), 0.0);
}

TEST(CpuDevice, AccumulatesInFp32OnItsStream) {
  const auto dev = make_cpu_device();
  const int s = dev->create_stream();
  auto* x = static_cast<float*>(dev->allocate(3 * sizeof(float)));
  auto* y = static_cast<float*>(dev->allocate(3 * sizeof(float)));
  const float xs[3] = {1.5f, -2, 0.0009765625f}, ys[3] = {1, 2, 1};  // 2^-10: lost in bf16, kept in fp32
  dev->upload(x, xs, sizeof xs);
  dev->upload(y, ys, sizeof ys);
  dev->axpy_f32(s, 3, 1.0f, x, y);
  dev->synchronize();
  float out[3];
  dev->download(out, y, sizeof out);
  EXPECT_EQ(out[0], 2.5f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 1.0009765625f) << "fp32, not rounded to bf16";
  dev->release(x);
  dev->release(y);
}

// A column block of a row-major tensor out and back (Ulysses' head groups): 3 rows of 4 bytes, columns 1..2.
TEST(CpuDevice, CopiesAColumnBlockOfRows) {
  const auto dev = make_cpu_device();
  const int s = dev->create_stream();
  auto* whole = static_cast<char*>(dev->allocate(12));
  auto* block = static_cast<char*>(dev->allocate(6));
  const char rows[12] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l'};
  dev->upload(whole, rows, sizeof rows);
  dev->copy_2d(s, block, 2, whole + 1, 4, 2, 3);
  dev->synchronize();
  char out[6];
  dev->download(out, block, sizeof out);
  EXPECT_EQ(std::string(out, 6), "bcfgjk");
  dev->fill(whole, 0, 12);
  dev->copy_2d(s, whole + 2, 4, block, 2, 2, 3);
  dev->synchronize();
  char back[12];
  dev->download(back, whole, sizeof back);
  EXPECT_EQ(std::string(back, 12), std::string("\0\0bc\0\0fg\0\0jk", 12));
  dev->release(whole);
  dev->release(block);
}

TEST(CpuDevice, RefusesMoreMemoryThanItWasGiven) {
  CpuDeviceOptions o;
  o.memory_bytes = 1 << 20;
  const auto dev = make_cpu_device(o);
  void* p = dev->allocate(512 << 10);
  EXPECT_THROW(dev->allocate(768 << 10), InputError);
  dev->release(p);
  EXPECT_NO_THROW(dev->release(dev->allocate(768 << 10)));
}

TEST(CpuExecutor, ChunkedOffloadedStepMatchesTheReference) {
  const auto m = tiny_model();
  const std::int64_t seq = 64;
  const auto g = test::ringtrack_graph(one_gpu(), m, seq, 2, chunked_offloaded());
  const auto dev = make_cpu_device();
  // Every dependency holds exactly: the streams are threads on one clock.
  const MeasuredStep measured = test::expect_step_matches_reference(*dev, g, m, random_windows(m.vocab, seq, 2, 5), 3, 0);
  EXPECT_GT(measured.pinned_bytes, 0) << "K/V and activations go to host memory";
  EXPECT_GT(measured.scratch_peak_bytes, 0) << "attention's partials";
}

TEST(CpuExecutor, StepsRepeatAndAnOptimizerStepMatchesTheReference) {
  const auto m = tiny_model(true);
  const auto g = test::ringtrack_graph(one_gpu(), m, 48, 1, chunked_offloaded(planner::ActivationPolicy::recompute));
  ModelState reference(m, 4), executed(m, 4);
  // Not a structured binding: the lambda below captures it, which clang 14 (the sanitizer builds) refuses.
  const auto options = adam_step_options();
  ReferenceOptions ro = options.first;
  const ExecutorOptions& eo = options.second;
  const auto dev = make_cpu_device();
  Executor executor(*dev, g, executed, 1, {}, eo);
  executor.upload(executed);
  auto step = [&](int t) {
    const auto tokens = random_windows(m.vocab, 48, 1, 9 + static_cast<std::uint64_t>(t));
    ro.optimizer_step = t;
    const double expected = run_reference_step(g, reference, 1, tokens, ro).loss;
    EXPECT_NEAR(executor.run_step(tokens, t).loss, expected, 2e-3 * expected) << "step " << t;
  };
  step(1);
  executor.download(executed);
  // After one AdamW step of lr 1e-2 the weights moved by about lr per entry (Adam's first step is sign-like): the
  // same way on both sides wherever the gradient is not near zero.
  const auto [agree, moved] = test::adam_agreement(reference, executed);
  ASSERT_GT(moved, 1000);
  EXPECT_GT(agree, 0.99);
  // The same executor again: its events and arenas serve every step.
  step(2);
  step(3);
}

void expect_host_optimizer_step_matches_the_reference(const sim::TaskGraph& g, const model::ModelConfig& m, std::int64_t seq);

// The optimizer step on the host: ZeRO-Offload's (the gradients copied out by the step itself) and ring-track's with
// its states in DRAM (by the graph's copy out); AdamW on pinned memory, the weights copied back by the graph's own
// copy. The master weights move as the reference's, and the device's weights are their bf16 rounding: the copy back
// happened, after the step. (ZeRO's gradients copied out after each layer's reduction and weights copied in from the
// host take several ranks: tests/test_mpi.cpp.)
TEST(CpuExecutor, TheOptimizerStepOnTheHostMatchesTheReference) {
  planner::ZeroParams offload;
  offload.stage = 1;
  offload.offload_optimizer = true;
  offload.activation_checkpointing = true;
  const auto m = tiny_model(true);
  const std::int64_t seq = 32;
  sim::TaskGraph zero = planner::build_zero({m, one_gpu(), {seq, 2}, model::precision_policy("bf16-mixed")}, offload);
  zero.finalize();
  planner::RingTrackParams states_on_host = chunked_offloaded();
  states_on_host.states = planner::Placement::dram;
  planner::RingTrackParams streamed = states_on_host;  // each visit's weights in, its gradients out to the host's sums
  streamed.weights = planner::WeightPolicy::stream;
  for (const sim::TaskGraph& g :
       {zero, test::ringtrack_graph(one_gpu(), m, seq, 2, states_on_host), test::ringtrack_graph(one_gpu(), m, seq, 2, streamed)}) {
    expect_host_optimizer_step_matches_the_reference(g, m, seq);
  }
}

void expect_host_optimizer_step_matches_the_reference(const sim::TaskGraph& g, const model::ModelConfig& m, std::int64_t seq) {
  ASSERT_FALSE(executor_refusal(g)) << executor_refusal(g)->task << ": " << executor_refusal(g)->found;
  int host_steps = 0, copies_back = 0;
  for (const sim::Task& t : g.tasks()) {
    host_steps += sim::is_host(t.device) && t.op.code == sim::OpCode::optimizer;
    copies_back += t.op.is_updated_weights();
  }
  ASSERT_EQ(host_steps, 1);
  ASSERT_EQ(copies_back, 1);
  ModelState reference(m, 8), executed(m, 8);
  const auto [ro, eo] = adam_step_options();
  const auto tokens = random_windows(m.vocab, seq, 2, 17);
  const double expected = run_reference_step(g, reference, 1, tokens, ro).loss;
  const auto dev = make_cpu_device();
  Executor executor(*dev, g, executed, 1, {}, eo);
  executor.upload(executed);
  const MeasuredStep measured = executor.run_step(tokens, 1);
  EXPECT_NEAR(measured.loss, expected, 2e-3 * expected);
  executor.download(executed);
  const auto [agree, moved] = test::adam_agreement(reference, executed);
  ASSERT_GT(moved, 1000);
  EXPECT_GT(agree, 0.99);
  for (const Parameter* p : executed.all()) {
    for (std::size_t i = 0; i < p->size(); ++i) ASSERT_EQ(p->weight[i], kernels::round_bf16(p->master[i])) << p->name << " " << i;
  }
  // The next step, on the same tokens, computes with the updated weights (streamed ones: copied in again from the
  // host's): the loss the first step's update lowered, as in the reference.
  const double expected_next = run_reference_step(g, reference, 2, tokens, ro).loss;
  EXPECT_LT(expected_next, expected - 0.05);
  EXPECT_NEAR(executor.run_step(tokens, 2).loss, expected_next, 2e-3 * expected_next);
}

// The other builders' one-GPU plans: Megatron with two micro-batches, full recompute and checkpoints offloaded to
// host memory; ZeRO with activation checkpointing. The executor's step equals the reference's.
TEST(CpuExecutor, MegatronAndZeroStepsOnOneGpuMatchTheReference) {
  const auto m = tiny_model(true);
  const std::int64_t seq = 32;
  const auto tokens = random_windows(m.vocab, seq, 2, 71);
  const planner::StepInputs in{m, one_gpu(), {seq, 2}, model::precision_policy("bf16-mixed")};
  planner::MegatronParams megatron;
  megatron.recompute = planner::Recompute::full;
  megatron.offload_activations = true;
  planner::ZeroParams zero;
  zero.activation_checkpointing = true;
  planner::ZeroParams fpdt = zero;  // attention in 4 chunks of 8 tokens, each rank op over all 4, the streams' bytes carried
  fpdt.fpdt_chunk = 8;
  planner::MegatronParams batched = megatron;  // one micro-batch of both sequences
  batched.micro_batch = 2;
  planner::ZeroParams zero_batched = zero;
  zero_batched.micro_batch = 2;
  for (auto [name, graph] :
       {std::pair{"megatron", planner::build_megatron(in, megatron)}, std::pair{"zero", planner::build_zero(in, zero)},
        std::pair{"fpdt", planner::build_zero(in, fpdt)}, std::pair{"megatron, micro-batch 2", planner::build_megatron(in, batched)},
        std::pair{"zero, micro-batch 2", planner::build_zero(in, zero_batched)}}) {
    SCOPED_TRACE(name);
    graph.finalize();
    ASSERT_FALSE(executor_refusal(graph)) << executor_refusal(graph)->task << ": " << executor_refusal(graph)->found;
    const auto& tasks = graph.tasks();
    const auto streamed = std::count_if(tasks.begin(), tasks.end(), [](const sim::Task& t) { return t.op.code == sim::OpCode::fpdt_buffers; });
    EXPECT_EQ(streamed > 0, std::string(name) == "fpdt");
    const auto dev = make_cpu_device();
    test::expect_step_matches_reference(*dev, graph, m, tokens, 8, 0);
  }
}

TEST(CpuExecutor, RefusesWhatItDoesNotRunYet) {
  const auto m = tiny_model();
  const sim::Cluster four(hw::load_node(kData + "/tiny-node.json"), 1);
  planner::RingTrackParams ring = chunked_offloaded();
  ring.ring = 2;
  ring.ring_order = {0, 1};
  const auto g = test::ringtrack_graph(four, m, 64, 2, ring);
  ModelState shapes(m, 1);
  const auto dev = make_cpu_device();
  try {
    Executor executor(*dev, g, shapes, four.topology.gpus_per_node(), {}, {});
    FAIL() << "a two-GPU step was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("one GPU"), std::string::npos) << e.what();
  }
}

}  // namespace trainyard::backend

namespace trainyard::backend {

// `trainyard calibrate --device cpu` on a shortened sweep: every series is measured through the Device interface,
// and the fitted profile loads and predicts from what was measured.
TEST(CpuCalibration, AShortSweepMeasuresEverySeriesAndWritesAProfileTheSimulatorLoads) {
  SweepPlan plan = cpu_sweep();
  plan.gemm.resize(6);
  plan.attention.resize(6);
  // Copies of milliseconds, 8x apart, so that their times grow clearly with the size however loaded the machine is
  // (a stream thread's wake-up, which the small copies of the real sweep measure, varies by milliseconds there).
  plan.copy_bytes = {std::int64_t{1} << 20, std::int64_t{8} << 20, std::int64_t{64} << 20};
  plan.d2d_bytes = plan.copy_bytes;
  plan.launch_counts = {256, 4096, 65536};
  plan.repeats = 5;  // medians of 5: one trial slowed by another process does not move a point
  plan.trial_seconds = 0.003;
  const auto dev = make_cpu_device();
  const Measurements m = measure_on_device(plan, *dev, "test cpu device", "test", nullptr);
  EXPECT_EQ(m.gemm.size(), 6u);
  EXPECT_EQ(m.attention_fwd.size(), 6u);
  EXPECT_EQ(m.attention_bwd.size(), 6u);
  EXPECT_EQ(m.h2d_both.size(), 3u);
  EXPECT_EQ(m.d2d.size(), 3u);
  for (const auto& p : m.gemm) EXPECT_GT(p.seconds, 0) << p.shape;
  for (const auto& p : m.d2h_pinned) EXPECT_GT(p.seconds, 0);
  test::TempDir dir;
  const std::string out = (dir.path() / "cpu-test.json").string();
  const auto base = hw::load_gpu_document("cpu-device", "--base");
  write_calibrated_profile(m, base.json, base.origin, out);
  const hw::GpuProfile fitted = hw::load_gpu(out, "--out");
  // The GEMM table is the measurement's, not the base's estimate, and it lies among the measured rates (a factor of
  // 2 around them: each point is a median of a few short trials on a machine that may be busy).
  EXPECT_NE(fitted.sustained.gemm.source_id, hw::gpu_from_document(base.json, base.origin).sustained.gemm.source_id);
  double slowest = 1e300, fastest = 0;
  for (const auto& p : m.gemm) slowest = std::min(slowest, p.flops / p.seconds), fastest = std::max(fastest, p.flops / p.seconds);
  const double fitted_rate = fitted.sustained.gemm.at(m.gemm.back().flops) * fitted.peak_tflops(hw::Dtype::bf16) * 1e12;
  EXPECT_GT(fitted_rate, slowest / 2);
  EXPECT_LT(fitted_rate, fastest * 2);
  EXPECT_GT(fitted.sustained.pcie_h2d_GBps.value, 0.1);
}

}  // namespace trainyard::backend
