// The software stack profiles (stacks/frameworks/*.json): every built-in loads with its sources, a bad file names
// its field, and each part of a stack shows in the simulation as its docs (docs/stacks.md) say: reserved memory
// takes HBM from the allocator, the host issues kernels at its dispatch cost, unfused attention keeps its scores,
// and plan files record the stack.
#include <cmath>

#include <gtest/gtest.h>

#include "hwprofiles/catalog.hpp"
#include "models/catalog.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/schemes/zero_family/zero.hpp"
#include "planner/transformer.hpp"
#include "sim/engine.hpp"
#include "stacks/stack_profile.hpp"
#include "test_support.hpp"

namespace trainyard {
namespace {

TEST(Stacks, EveryBuiltInLoadsAndTheDefaultIsMegatron) {
  const std::vector<std::string> names = stacks::stack_names();
  for (const char* expected : {"deepspeed", "megatron-lm", "megatron-lm-unfused", "torchtitan", "torchtitan-compile", "trainyard"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  for (const auto& name : names) {
    const stacks::StackProfile s = stacks::load_stack(name, "test");
    EXPECT_EQ(s.name, name);
    EXPECT_FALSE(s.attention.preference.empty());
    EXPECT_GE(s.norm.hbm_passes.value, 1);
    EXPECT_FALSE(s.memory.cuda_context_bytes.source_id.empty()) << name;
  }
  EXPECT_EQ(stacks::default_stack().name, "megatron-lm");
}

TEST(Stacks, ABadFileNamesTheFieldAndWhatWasExpected) {
  nlohmann::json doc = test::source_json("stacks/frameworks/torchtitan.json");
  doc["attention"]["implementations"] = {"flash9"};
  test::TempDir dir;
  const std::string path = dir.write("bad.json", doc.dump());
  const std::string message = test::error_of([&] { stacks::load_stack(path, "--stack"); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("attention.implementations[0]"), std::string::npos) << message;
  EXPECT_NE(message.find("flash9"), std::string::npos) << message;
  doc = test::source_json("stacks/frameworks/torchtitan.json");
  doc["memory"]["allocator_overhead"]["value"] = 3;
  const std::string over = dir.write("over.json", doc.dump());
  EXPECT_NE(test::error_of([&] { stacks::load_stack(over, "--stack"); }).find("memory.allocator_overhead"), std::string::npos);
  EXPECT_NE(test::error_of([&] { stacks::load_stack("pytorch-lightning", "--stack"); }).find("--stack"), std::string::npos);
}

TEST(Stacks, ReservedMemoryComesOffWhatTheAllocatorCanHandOut) {
  const stacks::StackProfile ds = stacks::load_stack("deepspeed", "test");
  const hw::NodeProfile node = hw::load_node("dgx-a100");
  const double hbm = node.gpu.hbm_bytes.value;
  const double allocatable = (hbm - ds.memory.fixed_bytes()) / (1 + ds.memory.allocator_overhead.value);
  EXPECT_DOUBLE_EQ(ds.allocatable_bytes(hbm), allocatable);
  EXPECT_NEAR(ds.reserved_bytes(allocatable), hbm, 1);  // all of it handed out = all of HBM reserved

  // The simulator's HBM pool is the allocatable part: an allocation that fits an ideal stack fails here.
  const auto one_alloc = [&](const stacks::StackProfile& stack, std::int64_t bytes) {
    sim::TaskGraph g;
    g.alloc("a", 0, sim::Pool::hbm, bytes, "tensor");
    g.finalize();
    return sim::simulate(g, sim::Cluster(node, 1, stack));
  };
  const auto bytes = static_cast<std::int64_t>(allocatable) + (1 << 20);
  EXPECT_TRUE(one_alloc(test::ideal_stack(), bytes).completed);
  const sim::SimResult r = one_alloc(ds, bytes);
  ASSERT_TRUE(r.oom);
  EXPECT_EQ(r.oom->capacity_bytes, static_cast<std::int64_t>(allocatable));
  const sim::SimResult fits = one_alloc(ds, 1 << 30);
  EXPECT_DOUBLE_EQ(fits.hbm_reserved_bytes(1 << 30), ds.reserved_bytes(1 << 30));
}

// Kernels shorter than the host's dispatch cost wait for the host; long ones hide it.
TEST(Stacks, TheHostIssuesKernelsAtTheDispatchCost) {
  const hw::NodeProfile node = hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json");
  stacks::StackProfile slow_host = test::ideal_stack();
  slow_host.host.dispatch_us_per_kernel.value = 100;
  auto chain = [&](const stacks::StackProfile& stack, std::int64_t bytes, int n) {
    sim::TaskGraph g;
    sim::TaskId last = -1;
    for (int i = 0; i < n; ++i) {
      std::vector<sim::TaskId> deps;
      if (last >= 0) deps.push_back(last);
      last = g.elementwise("e" + std::to_string(i), 0, {bytes, 0}, deps);
    }
    g.finalize();
    return sim::simulate(g, sim::Cluster(node, 1, stack));
  };
  // 10 kernels of 1 us each (1 MB at 1000 GB/s): the host issues one every 100 us.
  const sim::SimResult ideal = chain(test::ideal_stack(), 1'000'000, 10);
  const sim::SimResult host_bound = chain(slow_host, 1'000'000, 10);
  EXPECT_EQ(ideal.step_ns, 10'000);
  EXPECT_EQ(host_bound.step_ns, 10 * 100'000 + 1'000);
  EXPECT_GT(host_bound.host_wait_ns, 0);
  // 10 kernels of 1 ms each: the host runs ahead after the first; only the first issue shows.
  const sim::SimResult long_kernels = chain(slow_host, 1'000'000'000, 10);
  EXPECT_EQ(long_kernels.step_ns, 100'000 + 10 * 1'000'000);
}

TEST(Stacks, UnfusedAttentionKeepsItsScoresAndTakesLonger) {
  const model::ModelConfig m = model::load_model("llama3-8b", "test");
  const sim::Cluster fused(hw::load_node("dgx-a100"), 1), unfused(hw::load_node("dgx-a100"), 1, stacks::load_stack("megatron-lm-unfused", "test"));
  const planner::StepInputs in_fused{m, fused, {8192, 1}, model::precision_policy("bf16-mixed")};
  const planner::StepInputs in_unfused{m, unfused, {8192, 1}, model::precision_policy("bf16-mixed")};
  planner::MegatronParams p;
  p.tp = 8;
  const planner::LayerSplit split_f = planner::megatron_layer_split(in_fused, p), split_u = planner::megatron_layer_split(in_unfused, p);
  EXPECT_EQ(split_f.score_bytes, 0);
  EXPECT_EQ(split_u.score_bytes, 2);
  // 4 heads per GPU x 8192^2 scores x 2 bytes, kept when nothing is recomputed, recomputed under selective.
  const double scores = 4.0 * 8192 * 8192 * 2;
  EXPECT_DOUBLE_EQ(planner::layer_activation_bytes(m, split_u, planner::Recompute::none).total() -
                       planner::layer_activation_bytes(m, split_f, planner::Recompute::none).total(),
                   scores);
  EXPECT_DOUBLE_EQ(planner::layer_activation_bytes(m, split_u, planner::Recompute::selective).total(),
                   planner::layer_activation_bytes(m, split_f, planner::Recompute::selective).total());
  sim::TaskGraph gf = planner::build_megatron(in_fused, p), gu = planner::build_megatron(in_unfused, p);
  gf.finalize();
  gu.finalize();
  const sim::SimResult rf = sim::simulate(gf, fused), ru = sim::simulate(gu, unfused);
  ASSERT_TRUE(rf.completed && ru.completed);
  EXPECT_GT(ru.step_ns, rf.step_ns);
  EXPECT_EQ(rf.attention_impl, "flash2");
  EXPECT_EQ(ru.attention_impl, "unfused");
  EXPECT_GT(ru.pools[0].peak_bytes, rf.pools[0].peak_bytes);
}

// Megatron's selective recompute checkpoints the core attention: its forward runs again before its backward, with
// fused kernels too (it then only costs time).
TEST(Stacks, SelectiveRecomputeRerunsTheCoreAttention) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=1024,heads=8,kv_heads=8,vocab=1024");
  const sim::Cluster c(hw::load_node("dgx-a100"), 1);
  const planner::StepInputs in{m, c, {4096, 2}, model::precision_policy("bf16-mixed")};
  planner::MegatronParams p;
  p.tp = 8;
  auto attention_recomputes = [&](planner::Recompute r) {
    p.recompute = r;
    const sim::TaskGraph g = planner::build_megatron(in, p);
    int n = 0;
    for (const auto& t : g.tasks()) n += t.kind() == sim::TaskKind::attention && t.recompute;
    return n;
  };
  EXPECT_EQ(attention_recomputes(planner::Recompute::none), 0);
  EXPECT_EQ(attention_recomputes(planner::Recompute::selective), 2 * 2 * 8);  // layers x micro-batches x TP ranks
  EXPECT_EQ(attention_recomputes(planner::Recompute::full), 2 * 2 * 8);       // inside the recomputed forward
}

// FSDP2 copies each gathered layer's parameters out of the all-gather buffer on the compute stream; ZeRO-3 as
// DeepSpeed runs it points the parameters into the buffer instead.
TEST(Stacks, Fsdp2CopiesGatheredParametersOut) {
  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=1024,heads=8,kv_heads=8,vocab=1024");
  auto copies = [&](const char* stack) {
    const sim::Cluster c(hw::load_node("dgx-a100"), 1, stacks::load_stack(stack, "test"));
    const planner::StepInputs in{m, c, {4096, 8}, model::precision_policy("bf16-mixed")};
    planner::ZeroParams z;
    z.stage = 3;
    const sim::TaskGraph g = planner::build_zero(in, z);
    std::int64_t bytes = 0, n = 0;
    for (const auto& t : g.tasks()) {
      if (g.name_of(t).find("copy out gathered params") == std::string::npos) continue;
      ++n;
      bytes = std::get<sim::Elementwise>(t.params).bytes_read;
    }
    return std::pair{n, bytes};
  };
  const auto [n, bytes] = copies("torchtitan");
  EXPECT_EQ(n, 2 * 2 * 8);                                                        // layers x (forward, backward) x GPUs
  EXPECT_EQ(bytes, static_cast<std::int64_t>(2 * m.param_counts().per_layer()));  // bf16 parameters, read once
  EXPECT_EQ(copies("deepspeed").first, 0);
}

TEST(Stacks, Fsdp2ReducesGradientsInFp32AfterCopyingThemIn) {
  // torchtitan: mixed_precision_reduce = float32, so each layer's reduce-scatter moves 4 bytes per parameter and
  // each GPU first copies the bf16 gradients into the fp32 input (read 2, write 4 bytes per parameter);
  // DeepSpeed reduces the precision policy's bf16 gradients in place.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=1024,heads=8,kv_heads=8,vocab=1024");
  const double layer_params = m.param_counts().per_layer();
  auto reduction = [&](const char* stack) {
    const sim::Cluster c(hw::load_node("dgx-a100"), 1, stacks::load_stack(stack, "test"));
    const planner::StepInputs in{m, c, {4096, 8}, model::precision_policy("bf16-mixed")};
    planner::ZeroParams z;
    z.stage = 3;
    const sim::TaskGraph g = planner::build_zero(in, z);
    std::int64_t scatter_bytes = 0, copies = 0, copy_written = 0;
    for (const auto& t : g.tasks()) {
      const bool layer = g.name_of(t).find(" L") != std::string::npos;  // a layer's (not the head's or the embedding's)
      if (const auto* coll = std::get_if<sim::Collective>(&t.params); coll && coll->op == sim::CollectiveOp::reduce_scatter && layer)
        scatter_bytes = coll->bytes;
      if (g.name_of(t).find("copy in grads") != std::string::npos) {
        ++copies;
        copy_written = std::get<sim::Elementwise>(t.params).bytes_written;
      }
    }
    return std::tuple{scatter_bytes, copies, copy_written};
  };
  const auto [tt_bytes, tt_copies, tt_written] = reduction("torchtitan");
  EXPECT_NEAR(static_cast<double>(tt_bytes), 4 * layer_params, 8);
  EXPECT_EQ(tt_copies, 2 * 8);  // layers x GPUs (8 sequences on 8 GPUs: one micro-batch each)
  EXPECT_NEAR(static_cast<double>(tt_written), 4 * layer_params, 1);
  const auto [ds_bytes, ds_copies, ds_written] = reduction("deepspeed");
  EXPECT_NEAR(static_cast<double>(ds_bytes), 2 * layer_params, 8);
  EXPECT_EQ(ds_copies, 0);
}

TEST(Stacks, DeepSpeedCheckpointOffloadBlocksTheComputeStream) {
  // DeepSpeed's cpu_checkpointing copies each checkpoint out with a pageable .to() on the compute stream: the next
  // layer waits for it. Megatron-LM (Transformer Engine's offload context) copies from pinned buffers beside it.
  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=1024,heads=8,kv_heads=8,vocab=1024");
  auto build = [&](const char* stack) {
    const sim::Cluster c(hw::load_node("dgx-a100"), 1, stacks::load_stack(stack, "test"));
    const planner::StepInputs in{m, c, {32768, 8}, model::precision_policy("bf16-mixed")};
    planner::ZeroParams z;
    z.stage = 1;
    z.activation_checkpointing = true;
    z.offload_activations = true;
    sim::TaskGraph g = planner::build_zero(in, z);
    const sim::SimResult r = test::simulate_built(g, c, "zero");
    EXPECT_TRUE(r.completed);
    // Does layer 1's first forward task on GPU 0 wait for layer 0's copy out?
    bool waits = false, pinned = true;
    for (sim::TaskId t = 0; t < static_cast<sim::TaskId>(g.size()); ++t) {
      if (g.task(t).device != 0 || std::string(g.name(t)).find("F L0") != 0 || std::string(g.name(t)).find("D2H checkpoint") == std::string::npos)
        continue;
      pinned = std::get<sim::Copy>(g.task(t).params).pinned;
      for (sim::TaskId next : g.successors(t)) waits = waits || std::string(g.name(next)).find("F L1") == 0;
    }
    return std::pair{waits, pinned};
  };
  const stacks::StackProfile ds = stacks::load_stack("deepspeed", "test");
  EXPECT_TRUE(ds.checkpoint_offload.blocking);
  EXPECT_FALSE(ds.checkpoint_offload.pinned);
  const auto [ds_waits, ds_pinned] = build("deepspeed");
  EXPECT_TRUE(ds_waits);
  EXPECT_FALSE(ds_pinned);
  const auto [mlm_waits, mlm_pinned] = build("megatron-lm");
  EXPECT_FALSE(mlm_waits);
  EXPECT_TRUE(mlm_pinned);
}

TEST(Stacks, MegatronHoldsTheWholeMicroBatchsLogitsForItsLoss) {
  // Megatron-LM casts the LM head's bf16 output to fp32 for the whole micro-batch (6 bytes per logit held);
  // trainyard's own loss runs in 8K-token chunks of fp32 logits.
  EXPECT_EQ(planner::loss_memory(stacks::load_stack("trainyard", "test")).chunk_tokens, 8192);
  const planner::LossMemory mlm = planner::loss_memory(stacks::load_stack("megatron-lm", "test"));
  EXPECT_EQ(mlm.chunk_tokens, 0);
  EXPECT_DOUBLE_EQ(mlm.bytes_per_logit, 6);
  sim::TaskGraph g;
  planner::emit_loss(g, 0, "t", 20000, 64, 1000, -1, {}, mlm);
  std::vector<std::int64_t> allocs;
  for (const auto& t : g.tasks()) {
    if (const auto* a = std::get_if<sim::Alloc>(&t.params)) allocs.push_back(a->bytes);
  }
  EXPECT_EQ(allocs, (std::vector<std::int64_t>{20000 * 1000 * 6}));
}

TEST(StacksCli, PlanFilesRecordTheStackAndSimulateReportsIt) {
  test::TempDir dir;
  const std::string plan = (dir.path() / "p.json").string();
  const auto planned = test::run_cli(
      "plan --model custom:layers=2,hidden=256,heads=4,kv_heads=4,vocab=1024 --hw dgx-a100 --seq 8K "
      "--strategies megatron --stack torchtitan --out " +
      plan);
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  EXPECT_EQ(nlohmann::json::parse(test::read_file(plan))["stack"], "torchtitan");
  const auto sim = test::run_cli("simulate --plan " + plan + " --json");
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  const auto out = nlohmann::json::parse(sim.out);
  EXPECT_EQ(out["stack"]["name"], "torchtitan");
  EXPECT_TRUE(out["stack"]["as_logged"]["mfu"].is_number());
  EXPECT_TRUE(out["compute_classes"]["gemm"]["efficiency"].is_number());
  const auto refused = test::run_cli("simulate --plan " + plan + " --stack deepspeed");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("--stack"), std::string::npos) << refused.err;
  const auto text = test::run_cli(
      "simulate --strategy megatron --tp 8 --model llama3-8b --hw dgx-h100 --seq 4K --global-batch 1 --stack megatron-lm");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("stack          megatron-lm: attention cudnn"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("as megatron-lm logs it: MFU"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace trainyard
