// Several ranks under mpirun (ctest runs this binary with 2, 4 and 8 processes): the MPI communicator's calls
// give what they should, a message that never comes is an error naming the rank and the tag (not a hang), and a
// step split over one rank per GPU gives the single-rank step's loss, gradients and, after AdamW, weights.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <optional>

#include "backend/cpu_device.hpp"
#include "backend/executor.hpp"
#include "backend/hotspa_step.hpp"
#include "backend/model_state.hpp"
#include "backend/mpi_communicator.hpp"
#include "backend/reference_step.hpp"
#include "calibrate/calibrate_peers.hpp"
#include "common/error.hpp"
#include "hwprofiles/catalog.hpp"
#include "planner/hotspa.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "planner/schemes/zero_family/zero.hpp"
#include "tests/backend_fixtures.hpp"

namespace trainyard::backend {

namespace {

using namespace std::chrono_literals;
const std::string kData = TRAINYARD_TEST_DATA_DIR;

// Every test's communicator: long enough for a loaded machine, short enough that a broken test ends.
MpiCommunicator& world() {
  static MpiCommunicator comm(60s);
  return comm;
}

std::vector<int> all_ranks() {
  std::vector<int> r(static_cast<std::size_t>(world().size()));
  std::iota(r.begin(), r.end(), 0);
  return r;
}

// One GPU per rank: 2 GPUs (tiny-node-2), 4 (tiny-node), 8 (two tiny-nodes: messages cross the network).
sim::Cluster cluster_for_ranks() {
  const int n = world().size();
  if (n == 2) return sim::Cluster(hw::load_node(kData + "/tiny-node-2.json"), 1);
  return sim::Cluster(hw::load_node(kData + "/tiny-node.json"), std::max(1, n / 4));
}

}  // namespace

TEST(Mpi, CollectivesOverTheWorldAndASubgroup) {
  MpiCommunicator& c = world();
  const int n = c.size(), me = c.rank();
  const auto everyone = all_ranks();
  std::vector<float> x = {static_cast<float>(me), 1.0f};
  c.all_reduce_sum(everyone, x);
  EXPECT_EQ(x[0], static_cast<float>(n * (n - 1) / 2));
  EXPECT_EQ(x[1], static_cast<float>(n));

  std::vector<float> b = {me == n - 1 ? 42.0f : 0.0f};
  c.broadcast(everyone, n - 1, b);
  EXPECT_EQ(b[0], 42.0f);

  const std::vector<float> mine = {static_cast<float>(10 * me), static_cast<float>(10 * me + 1)};
  const auto gathered = c.all_gather(everyone, mine);
  ASSERT_EQ(gathered.size(), static_cast<std::size_t>(2 * n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(gathered[static_cast<std::size_t>(2 * r + 1)], static_cast<float>(10 * r + 1));

  // Member r's block i of reduce-scatter's input is r + i: member i gets the sum over r.
  std::vector<float> blocks(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) blocks[static_cast<std::size_t>(i)] = static_cast<float>(me + i);
  const auto share = c.reduce_scatter_sum(everyone, blocks);
  ASSERT_EQ(share.size(), 1u);
  EXPECT_EQ(share[0], static_cast<float>(n * (n - 1) / 2 + n * me));

  // all-to-all: member r sends 100 r + i to member i.
  for (int i = 0; i < n; ++i) blocks[static_cast<std::size_t>(i)] = static_cast<float>(100 * me + i);
  const auto got = c.all_to_all(everyone, blocks);
  for (int r = 0; r < n; ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], static_cast<float>(100 * r + me));

  // A subgroup: the even ranks.
  if (me % 2 == 0) {
    std::vector<int> evens;
    for (int r = 0; r < n; r += 2) evens.push_back(r);
    std::vector<double> one = {1.0};
    c.all_reduce_sum(evens, one);
    EXPECT_EQ(one[0], static_cast<double>(evens.size()));
  }
  c.barrier();
}

TEST(Mpi, MessagesBetweenRanksArriveInOrder) {
  MpiCommunicator& c = world();
  const int n = c.size(), me = c.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Everyone sends before anyone receives: sends never wait for their receives.
  for (int k = 0; k < 3; ++k) send_floats(c, next, 7, std::vector<float>{static_cast<float>(me), static_cast<float>(k)});
  for (int k = 0; k < 3; ++k) {
    const auto m = recv_floats(c, prev, 7);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0], static_cast<float>(prev));
    EXPECT_EQ(m[1], static_cast<float>(k));
  }
  c.barrier();
}

// The send/recv order broken: rank 1 waits for a message rank 0 never sends. It must end in an error that names
// the rank, the peer and the tag, after the timeout; never a hang.
TEST(Mpi, AMessageThatNeverComesIsAnErrorNotAHang) {
  MpiCommunicator impatient(300ms);
  if (impatient.rank() == 1) {
    const auto start = std::chrono::steady_clock::now();
    try {
      impatient.recv(0, 424242);
      ADD_FAILURE() << "a receive with no sender returned";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 1 of"), std::string::npos) << what;
      EXPECT_NE(what.find("from rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("tag 424242"), std::string::npos) << what;
      EXPECT_NE(what.find("mpi_communicator.cpp:"), std::string::npos) << what;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  }
  world().barrier();
}

namespace {

struct Split {
  double loss = 0;
  std::unique_ptr<ModelState> state;
};

// The step on every rank (each its own GPU), gathered to rank 0; and on rank 0 alone, the same graph on one rank.
void expect_split_equals_single(const sim::TaskGraph& graph, const model::ModelConfig& m, const std::vector<std::vector<std::int32_t>>& tokens,
                                int gpus_per_node, int steps = 1) {
  ModelState split(m, 5);
  ReferenceOptions o;
  o.comm = &world();
  o.run_optimizer = steps > 1;
  double split_loss = 0;
  for (int s = 1; s <= steps; ++s) {
    o.optimizer_step = s;
    split_loss = run_reference_step(graph, split, gpus_per_node, tokens, o).loss;
  }
  gather_to_rank0(graph, split, world());
  if (world().rank() != 0) return;
  ModelState single(m, 5);
  ReferenceOptions one = o;
  one.comm = nullptr;
  double single_loss = 0;
  for (int s = 1; s <= steps; ++s) {
    one.optimizer_step = s;
    single_loss = run_reference_step(graph, single, gpus_per_node, tokens, one).loss;
  }
  // The same arithmetic but for the order gradients are summed in (over ranks, not over tasks).
  EXPECT_NEAR(split_loss, single_loss, 1e-6 * std::abs(single_loss));
  EXPECT_LT(max_gradient_difference(split, single), 1e-4);
  if (steps > 1) {
    const auto a = split.all();
    const auto b = single.all();
    for (std::size_t i = 0; i < a.size(); ++i) {
      for (std::size_t j = 0; j < a[i]->weight.size(); ++j) {
        ASSERT_NEAR(a[i]->weight[j], b[i]->weight[j], 1e-3f * (1.0f + std::abs(b[i]->weight[j]))) << a[i]->name << " [" << j << "]";
      }
    }
  }
}

// A Megatron step of `p` on one GPU per rank: 32 tokens, two sequences per data-parallel replica.
struct MegatronStep {
  sim::Cluster cluster;
  std::vector<std::vector<std::int32_t>> tokens;
  sim::TaskGraph graph;
};
MegatronStep megatron_step(const model::ModelConfig& m, const planner::MegatronParams& p, std::uint64_t token_seed) {
  MegatronStep s{cluster_for_ranks(), random_windows(m.vocab, 32, 2 * p.dp, token_seed), {}};
  s.graph = planner::build_megatron({m, s.cluster, {32, 2 * p.dp}, model::precision_policy("bf16-mixed")}, p);
  return s;
}

// The updated weights: AdamW's first step moves each weight by about lr along its gradient's sign, so a step taken
// with another gradient (a rank's own share rather than the sum) moves many of them the other way.
void expect_updated_weights_agree(const ModelState& reference, const ModelState& executed) {
  double moved = 0, agree = 0;
  for (std::size_t p = 0; p < reference.all().size(); ++p) {
    const Parameter &a = *reference.all()[p], &b = *executed.all()[p];
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::abs(a.grad[i]) < 1e-6f) continue;
      moved += 1;
      agree += std::abs(a.weight[i] - b.weight[i]) <= 1e-3f + std::abs(a.weight[i]) / 128;
    }
  }
  EXPECT_GT(agree, 0.99 * moved) << agree << " of " << moved << " updated weights agree";
}

}  // namespace

// A ring over every rank's GPU (sends between ranks), and rings of two with replicas (a gradient all-reduce).
TEST(Mpi, RingTrackStepSplitOverRanksEqualsTheSingleRankStep) {
  const int n = world().size();
  // The tiny model with 4 layers: a ring can be as long as the model has layers.
  const auto m = test::tiny_model(false, 4);
  const sim::Cluster cluster = cluster_for_ranks();
  const std::int64_t seq = 64;
  for (int ring : {n, 2, 1}) {
    if (ring > 4 || n % ring != 0) continue;  // a ring of at most the model's 4 layers
    SCOPED_TRACE("ring " + std::to_string(ring));
    const std::int64_t batch = n / ring;
    const auto tokens = random_windows(m.vocab, seq, batch, 31);
    planner::RingTrackParams p = test::chunked_offloaded();
    p.ring = ring;
    for (int i = 0; i < ring; ++i) p.ring_order.push_back(i);
    const planner::StepInputs in{m, cluster, {seq, batch}, model::precision_policy("bf16-mixed")};
    const sim::TaskGraph graph = planner::build_ringtrack(in, p).graph;
    expect_split_equals_single(graph, m, tokens, cluster.topology.gpus_per_node());
  }
}

// Pipeline stages on different ranks (activations and gradients by message) and data-parallel replicas (bucketed
// all-reduce), with checkpoints offloaded; three steps with AdamW keep the weights in step with one rank's.
TEST(Mpi, MegatronStepSplitOverRanksEqualsTheSingleRankStep) {
  const int n = world().size();
  const auto m = test::tiny_model();
  for (int pp : {1, 2}) {
    SCOPED_TRACE("pp " + std::to_string(pp));
    planner::MegatronParams p;
    p.pp = pp;
    p.dp = n / pp;
    p.recompute = pp == 2 ? planner::Recompute::full : planner::Recompute::none;
    p.offload_activations = pp == 2;
    const MegatronStep s = megatron_step(m, p, 37);
    expect_split_equals_single(s.graph, m, s.tokens, s.cluster.topology.gpus_per_node(), pp == 2 ? 3 : 1);
  }
}

// Megatron's context parallelism (a zigzag ring, as Megatron-LM balances causal CP): cp over every rank, and cp
// over half of them in each of 2 pipeline stages, whose receives from the next stage and from the ring's
// neighbour queue apart; by all-to-alls (the a2a comm type) where cp divides the heads; and hierarchically (a2a+p2p:
// all-to-alls in groups of 2, the ring over the groups) over every rank from 4.
TEST(Mpi, MegatronContextParallelSplitOverRanksEqualsTheSingleRankStep) {
  const int n = world().size();
  const auto m = test::tiny_model();
  for (const auto& [pp, comm] :
       {std::pair{1, planner::CpComm::p2p}, {2, planner::CpComm::p2p}, {2, planner::CpComm::a2a}, {1, planner::CpComm::a2a_p2p}}) {
    if (n / pp < 2 || (comm == planner::CpComm::a2a && n / pp > 2)) continue;  // a2a: the tiny model's 2 K/V heads
    if (comm == planner::CpComm::a2a_p2p && n < 4) continue;                   // at least 2 groups of 2
    SCOPED_TRACE("pp " + std::to_string(pp) + ", cp " + std::to_string(n / pp) + " " + std::string(planner::to_string(comm)));
    planner::MegatronParams p;
    p.pp = pp;
    p.cp = n / pp;
    p.cp_comm = comm;
    if (comm == planner::CpComm::a2a_p2p) p.cp_a2a = 2;
    p.recompute = pp == 2 ? planner::Recompute::selective : planner::Recompute::none;
    const MegatronStep s = megatron_step(m, p, 41);
    expect_split_equals_single(s.graph, m, s.tokens, s.cluster.topology.gpus_per_node(), 1);
  }
}

// An uneven pipeline split (5 layers: 3 on the first stage, 2 on the last), as Llama 3 405B's, against one rank.
TEST(Mpi, UnevenMegatronPipelineSplitOverRanksEqualsTheSingleRankStep) {
  const int n = world().size();
  const auto m = test::tiny_model(false, 5);
  planner::MegatronParams p;
  p.pp = 2;
  p.dp = n / 2;
  p.first_stage_layers = 3;
  p.last_stage_layers = 2;
  const MegatronStep s = megatron_step(m, p, 47);
  const int gpus_per_node = s.cluster.topology.gpus_per_node();
  expect_split_equals_single(s.graph, m, s.tokens, gpus_per_node, 3);
  if (world().rank() != 0) return;
  // The split step itself is the model's: the same as data parallelism alone on one rank (one sequence per GPU).
  planner::MegatronParams flat;
  flat.dp = n;
  const sim::TaskGraph flat_graph = planner::build_megatron({m, s.cluster, {32, n}, model::precision_policy("bf16-mixed")}, flat);
  ModelState uneven(m, 5), plain(m, 5);
  const double a = run_reference_step(s.graph, uneven, gpus_per_node, s.tokens).loss;
  const double b = run_reference_step(flat_graph, plain, gpus_per_node, s.tokens).loss;
  EXPECT_NEAR(a, b, 1e-6 * std::abs(b));
  EXPECT_LT(max_gradient_difference(uneven, plain), 1e-4);
}

// Interleaved stages (2 chunks of layers per pipeline rank) with the distributed optimizer (its reduce-scatters
// carry the gradient buckets), over the ranks, against one rank; then 3 AdamW steps.
TEST(Mpi, InterleavedMegatronWithTheDistributedOptimizerSplitOverRanksEqualsTheSingleRankStep) {
  const int n = world().size();
  const auto m = test::tiny_model(false, 4);
  planner::MegatronParams p;
  p.pp = 2;
  p.vpp = 2;
  p.dp = n / 2;
  p.distributed_optimizer = p.dp > 1;
  const MegatronStep s = megatron_step(m, p, 43);  // 2 micro-batches per replica: a multiple of the stages
  expect_split_equals_single(s.graph, m, s.tokens, s.cluster.topology.gpus_per_node(), 3);
}

// ZeRO stages 0-3, one GPU per rank (each its own sequences): the gradient reductions carry every layer, the LM
// head and the embedding. Stage 2 reduces after each of its 2 micro-batches (a group reduced twice in one step,
// over the same ranks); stage 1 runs the optimizer on the host with offloaded checkpoints; stage 3 offloads
// parameters and gradients. Three AdamW steps where the optimizer is sharded.
TEST(Mpi, ZeroStepsSplitOverRanksEqualTheSingleRankStep) {
  const int n = world().size();
  const auto m = test::tiny_model(true);
  const sim::Cluster cluster = cluster_for_ranks();
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    planner::ZeroParams p;
    p.stage = stage;
    p.offload_optimizer = stage == 1;
    p.offload_activations = stage == 1;
    p.activation_checkpointing = stage == 3;
    p.offload_params = p.offload_grads = stage == 3;
    const std::int64_t sequences = stage == 2 ? 2 * n : n;
    const planner::StepInputs in{m, cluster, {32, sequences}, model::precision_policy("bf16-mixed")};
    const sim::TaskGraph graph = planner::build_zero(in, p);
    expect_split_equals_single(graph, m, random_windows(m.vocab, 32, sequences, 53), cluster.topology.gpus_per_node(), stage == 0 ? 1 : 3);
  }
}

// Ring attention with one rank per GPU: K/V blocks and the dK | dV accumulators are MPI messages between the cp
// ranks. cp over every rank (one sequence), and cp 2 on n / 2 replicas with ZeRO-3 and checkpointed layers.
TEST(Mpi, RingAttentionSplitOverRanksEqualsTheSingleRankStep) {
  const int n = world().size();
  const auto m = test::tiny_model(true);
  const sim::Cluster cluster = cluster_for_ranks();
  for (const auto& [cp, zigzag] : {std::pair{n, false}, {2, false}, {n, true}, {2, true}}) {
    SCOPED_TRACE("cp " + std::to_string(cp) + (zigzag ? " zigzag" : ""));
    planner::ZeroParams p;
    p.cp = cp;
    p.zigzag = zigzag;
    p.stage = cp == n ? 1 : 3;
    p.activation_checkpointing = cp != n;
    const std::int64_t sequences = n / cp;
    const planner::StepInputs in{m, cluster, {32, sequences}, model::precision_policy("bf16-mixed")};
    const sim::TaskGraph graph = planner::build_zero(in, p);
    expect_split_equals_single(graph, m, random_windows(m.vocab, 32, sequences, 73), cluster.topology.gpus_per_node(), 2);
  }
}

// Ulysses over 2 ranks per sequence (the tiny model's 2 K/V heads split no further), replicas on the rest: its
// all-to-alls are MPI all-to-alls over each sp group. FPDT on top (its attention in chunks of 8 of the 32 tokens,
// each sp rank holding a run of 2).
TEST(Mpi, UlyssesSplitOverRanksEqualsTheSingleRankStep) {
  const int n = world().size();
  const auto m = test::tiny_model(true);
  const sim::Cluster cluster = cluster_for_ranks();
  for (const auto& [stage, fpdt_chunk] : {std::pair{1, 0}, {3, 0}, {3, 8}}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage) + (fpdt_chunk > 0 ? ", FPDT" : ""));
    planner::ZeroParams p;
    p.sp = 2;
    p.stage = stage;
    p.activation_checkpointing = stage == 3;
    p.fpdt_chunk = fpdt_chunk;
    const std::int64_t sequences = n / 2;
    const planner::StepInputs in{m, cluster, {32, sequences}, model::precision_policy("bf16-mixed")};
    expect_split_equals_single(planner::build_zero(in, p), m, random_windows(m.vocab, 32, sequences, 97), cluster.topology.gpus_per_node(), 2);
  }
}

// The executor on the CPU device, one rank per GPU (streams as threads; the gradient reductions are MPI
// all-reduces queued on their streams, sends MPI messages from a stream to a receive stream): data-parallel steps
// of ZeRO (stages 0 and 1), Megatron and ring-track replicas, and steps that send between ranks (ring attention
// over every rank, plain and zigzag, Megatron's pipeline of 2 stages and its context parallelism, Ulysses' all-to-alls and FPDT's on top, ring-track
// rings of 2 GPUs) against the CPU reference on one rank, with an AdamW step; and ZeRO-2 and -3 with 2 micro-batches, which reduce each group every
// micro-batch. The model ties its embeddings (the pipeline sums the first stage's and the last stage's copy after the data-parallel reduction).
TEST(Mpi, TheExecutorOnCpuRanksEqualsTheSingleRankReference) {
  const int n = world().size();
  const auto m = test::tiny_model(true);
  const sim::Cluster cluster = cluster_for_ranks();
  const planner::StepInputs in{m, cluster, {32, n}, model::precision_policy("bf16-mixed")};
  planner::ZeroParams zero1;
  zero1.stage = 1;
  zero1.activation_checkpointing = true;
  planner::MegatronParams megatron;
  megatron.dp = n;
  planner::RingTrackParams replicas = test::chunked_offloaded();
  planner::ZeroParams ring_attention;
  ring_attention.cp = n;
  ring_attention.stage = 1;
  planner::ZeroParams zigzag = ring_attention;
  zigzag.zigzag = true;
  planner::MegatronParams pipeline;
  pipeline.pp = 2;
  pipeline.dp = n / 2;
  planner::ZeroParams ulysses;  // sp 2 (the tiny model's 2 K/V heads), checkpointed: its all-to-alls run again in backward
  ulysses.sp = 2;
  ulysses.stage = 1;
  ulysses.activation_checkpointing = true;
  planner::ZeroParams fpdt = ulysses;  // FPDT: attention in 4 chunks, each sp rank's ops over its run of 2
  fpdt.fpdt_chunk = 8;
  planner::ZeroParams fpdt_replicas = zero1;  // sp 1: every rank's ops over all 4 chunks
  fpdt_replicas.fpdt_chunk = 8;
  planner::MegatronParams megatron_cp;  // zigzag, as Megatron-LM's
  megatron_cp.cp = n;
  planner::MegatronParams piped_cp = megatron_cp;  // its receives from the next stage and the ring's neighbour apart
  piped_cp.pp = 2;
  piped_cp.cp = n / 2;
  planner::MegatronParams piped_a2a = piped_cp;  // cp 2 by all-to-alls: each rank's two zigzag chunks to a head group
  piped_a2a.cp_comm = planner::CpComm::a2a;
  planner::RingTrackParams rings = replicas;
  rings.ring = 2;
  planner::RingTrackParams rings_states_on_host = rings;  // each GPU's gradients out, its optimizer step on its host
  rings_states_on_host.states = planner::Placement::dram;
  planner::RingTrackParams rings_streamed = rings_states_on_host;  // each visit's weights in, its gradients out
  rings_streamed.weights = planner::WeightPolicy::stream;
  struct Case {
    std::string name;
    const model::ModelConfig& model;
    sim::TaskGraph graph;
    std::int64_t sequences = 0;                              // 0: n, one per rank
    std::optional<sim::TaskGraph> reference = std::nullopt;  // the graph the reference runs (else `graph`): TP's, without TP
  };
  planner::MegatronParams tensor_parallel;  // tp 2 (the tiny model's 2 K/V heads) x dp
  tensor_parallel.tp = 2;
  tensor_parallel.dp = n / 2;
  planner::MegatronParams piped_tp = tensor_parallel;
  piped_tp.pp = 2;
  piped_tp.dp = n / 4;
  planner::MegatronParams tp_cp = tensor_parallel;  // TP inside each cp rank's slice, the K/V ring zigzag across
  tp_cp.dp = 1;
  tp_cp.cp = n / 2;
  planner::MegatronParams recomputed_tp = tensor_parallel;  // its TP sums rerun in the recomputed forward
  recomputed_tp.recompute = planner::Recompute::full;
  planner::ZeroParams zero2 = zero1, zero3;
  zero2.stage = 2;
  zero3.stage = 3;
  planner::ZeroParams offloaded1 = zero1, offloaded2 = zero2, offloaded3 = zero3;  // ZeRO-Offload: each rank's optimizer on its host
  offloaded1.offload_optimizer = offloaded2.offload_optimizer = offloaded3.offload_optimizer = true;
  offloaded2.offload_grads = true;            // each layer's reduced gradients copied out to it
  planner::ZeroParams infinity = offloaded3;  // ZeRO-Infinity: the gradients out, each layer's weights in from the host
  infinity.offload_grads = infinity.offload_params = true;
  const planner::StepInputs twice{m, cluster, {32, 2 * n}, model::precision_policy("bf16-mixed")};
  planner::ZeroParams zero1_batched = zero1;  // each rank's 2 sequences in one micro-batch
  zero1_batched.micro_batch = 2;
  planner::MegatronParams piped_batched = pipeline;  // 2 stages, each micro-batch 2 sequences, sent between the stages together
  piped_batched.micro_batch = 2;
  std::vector<Case> cases = {
      {"zero-0", m, planner::build_zero(in, planner::ZeroParams{})},
      {"zero-1", m, planner::build_zero(in, zero1)},
      {"megatron dp", m, planner::build_megatron(in, megatron)},
      {"ring-track replicas", m, planner::build_ringtrack(in, replicas).graph},
      {"ring attention", m, planner::build_zero(in, ring_attention)},
      {"ring attention, zigzag", m, planner::build_zero(in, zigzag)},
      {"megatron pp 2", m, planner::build_megatron(in, pipeline)},
      {"ring-track rings of 2", m, planner::build_ringtrack(in, rings).graph},
      {"zero-2, 2 micro-batches", m, planner::build_zero(twice, zero2), 2 * n},
      {"zero-1, micro-batches of 2", m, planner::build_zero(twice, zero1_batched), 2 * n},
      {"megatron pp 2, micro-batches of 2", m, planner::build_megatron(twice, piped_batched), 2 * n},
      {"zero-3, 2 micro-batches", m, planner::build_zero(twice, zero3), 2 * n},
      {"megatron cp", m, planner::build_megatron(in, megatron_cp)},
      {"ulysses sp 2", m, planner::build_zero(in, ulysses)},
      {"fpdt sp 2", m, planner::build_zero(in, fpdt)},
      {"fpdt sp 1", m, planner::build_zero(in, fpdt_replicas)},
      {"zero-1, optimizer on the host", m, planner::build_zero(in, offloaded1)},
      {"zero-3, optimizer on the host", m, planner::build_zero(in, offloaded3)},
      {"zero-2, gradients to the optimizer on the host", m, planner::build_zero(in, offloaded2)},
      {"zero-3, gradients and parameters offloaded, optimizer on the host", m, planner::build_zero(in, infinity)},
      {"ring-track rings of 2, gradients to the optimizer on the host", m, planner::build_ringtrack(in, rings_states_on_host).graph},
      {"ring-track rings of 2, weights streamed in, gradients to the optimizer on the host", m, planner::build_ringtrack(in, rings_streamed).graph}};
  if (n >= 4) cases.push_back({"megatron pp 2, cp", m, planner::build_megatron(in, piped_cp)});
  // Tensor parallelism shards the vocabulary evenly (as Megatron pads it to): the tiny model's 61 made 64.
  model::ModelConfig even_vocab = m;
  even_vocab.vocab = 64;
  const planner::StepInputs tp_in{even_vocab, cluster, {32, n}, model::precision_policy("bf16-mixed")};
  const sim::TaskGraph data_parallel = planner::build_megatron(tp_in, megatron);
  cases.push_back({"megatron tp 2", even_vocab, planner::build_megatron(tp_in, tensor_parallel), 0, data_parallel});
  cases.push_back({"megatron tp 2, full recompute", even_vocab, planner::build_megatron(tp_in, recomputed_tp), 0, data_parallel});
  planner::MegatronParams batched_tp = tensor_parallel;  // each replica's 2 sequences in one micro-batch, with SP
  batched_tp.micro_batch = 2;
  batched_tp.sequence_parallel = true;
  cases.push_back({"megatron tp 2, sp, micro-batches of 2", even_vocab, planner::build_megatron(tp_in, batched_tp), 0, data_parallel});
  if (n >= 4) cases.push_back({"megatron tp 2, pp 2", even_vocab, planner::build_megatron(tp_in, piped_tp), 0, data_parallel});
  if (n >= 4) cases.push_back({"megatron tp 2, cp", even_vocab, planner::build_megatron(tp_in, tp_cp), 0, data_parallel});
  planner::MegatronParams gathered_cp = megatron_cp;  // K/V all-gathered over the cp ranks, dK|dV reduce-scattered
  gathered_cp.cp_comm = planner::CpComm::all_gather;
  cases.push_back({"megatron cp all-gather", even_vocab, planner::build_megatron(tp_in, gathered_cp), 0, data_parallel});
  planner::MegatronParams gathered_tp_cp = tp_cp;
  gathered_tp_cp.cp_comm = planner::CpComm::all_gather;
  if (n >= 4) cases.push_back({"megatron tp 2, cp all-gather", even_vocab, planner::build_megatron(tp_in, gathered_tp_cp), 0, data_parallel});
  if (n == 4) cases.push_back({"megatron pp 2, cp 2 a2a", m, planner::build_megatron(in, piped_a2a)});
  planner::MegatronParams hierarchical = megatron_cp;  // a2a+p2p: all-to-alls in groups of 2, the K/V ring over the groups
  hierarchical.cp_comm = planner::CpComm::a2a_p2p;
  hierarchical.cp_a2a = 2;
  if (n >= 4) cases.push_back({"megatron cp a2a+p2p", m, planner::build_megatron(in, hierarchical)});
  // Sequence parallelism: each rank's rows between the TP regions, gathered before the column-parallel GEMMs (and
  // again for their weight gradients), reduce-scattered after the row-parallel ones, the norms' gradients summed.
  for (planner::MegatronParams sp : {tensor_parallel, recomputed_tp, piped_tp, tp_cp}) {
    if ((sp.pp > 1 || sp.cp > 1) && n < 4) continue;
    sp.sequence_parallel = true;
    const std::string what = std::string("megatron tp 2, sp") + (sp.recompute == planner::Recompute::full ? ", full recompute" : "") +
                             (sp.pp > 1 ? ", pp 2" : "") + (sp.cp > 1 ? ", cp" : "");
    cases.push_back({what, even_vocab, planner::build_megatron(tp_in, sp), 0, data_parallel});
  }
  for (auto& [name, model, graph, sequences, reference_graph] : cases) {
    SCOPED_TRACE(name);
    const auto tokens = random_windows(m.vocab, 32, sequences > 0 ? sequences : n, 59);
    graph.finalize();
    int gradients_out = 0, weights_in = 0;  // the offloaded cases' copies of model states, which the executor runs
    for (const sim::Task& t : graph.tasks()) {
      const auto* copy = std::get_if<sim::Copy>(&t.params);
      if (copy == nullptr || !t.op.carries_gradients()) continue;
      (copy->direction == sim::Copy::Direction::d2h ? gradients_out : weights_in) += 1;
    }
    if (name.find("gradients") != std::string::npos) {
      EXPECT_GT(gradients_out, 0);
    }
    if (name.find("parameters offloaded") != std::string::npos) {
      EXPECT_GT(weights_in, 0);
    }
    ExecutorOptions eo;
    eo.comm = &world();
    eo.run_optimizer = true;
    eo.adam.lr = 1e-2f;
    ModelState executed(model, 6);
    const auto device = make_cpu_device();
    Executor executor(*device, graph, executed, cluster.topology.gpus_per_node(), {}, eo);
    executor.upload(executed);
    const double loss = executor.run_step(tokens, 1).loss;
    executor.download(executed);
    // With the optimizer on the host, every rank updated its weights there and has them back on its device.
    for (const Parameter* p : executed.all()) {
      if (!name.ends_with("on the host")) break;
      for (std::size_t i = 0; i < p->size(); ++i) ASSERT_EQ(p->weight[i], kernels::round_bf16(p->master[i])) << p->name << " " << i;
    }
    gather_to_rank0(graph, executed, world());
    if (world().rank() != 0) continue;
    ModelState reference(model, 6);
    ReferenceOptions ro;
    ro.run_optimizer = true;
    ro.adam = eo.adam;
    const double expected =
        run_reference_step(reference_graph ? *reference_graph : graph, reference, cluster.topology.gpus_per_node(), tokens, ro).loss;
    EXPECT_NEAR(loss, expected, 2e-3 * expected);
    EXPECT_LT(max_gradient_difference(executed, reference), 0.03);
    expect_updated_weights_agree(reference, executed);
  }
}

// HotSPa (backend/hotspa_step.hpp): length groups each under its own strategy on the executor, the parameters and
// the accumulated gradients moved between their layouts by plan_switch's transfers, one update in the last
// group's layout. Two mini-batches (the second's first switch carries updated weights out of the home layout):
// the loss and gradients of both, and the weights after the first update, equal the single-rank reference's; the
// result is gathered to rank 0 by a switch too. Two cases: ZeRO-3, then (4 ranks or more) Megatron pp 2, then
// Megatron tp 2 at home; and Megatron tp 2 into a pp 2 home, where the tied embedding lives on both end stages.
TEST(Mpi, HotSpaMinibatchesSwitchedBetweenStrategiesEqualTheSingleRankReference) {
  const int n = world().size();
  model::ModelConfig m = test::tiny_model(true);
  m.vocab = 64;  // tensor parallelism shards the vocabulary evenly
  const sim::Cluster cluster = cluster_for_ranks();
  const int gpn = cluster.topology.gpus_per_node();
  const auto inputs = [&](std::int64_t seq, std::int64_t rows) {
    return planner::StepInputs{m, cluster, {seq, rows}, model::precision_policy("bf16-mixed")};
  };
  planner::ZeroParams zero3;
  zero3.stage = 3;
  planner::MegatronParams piped;  // pp 2 x dp
  piped.pp = 2;
  piped.dp = n / 2;
  planner::MegatronParams tensor_parallel;  // tp 2 x dp
  tensor_parallel.tp = 2;
  tensor_parallel.dp = n / 2;
  planner::MegatronParams plain;  // the reference's step for each group: data parallelism alone
  plain.dp = n;
  struct Group {
    std::int64_t seq;
    sim::TaskGraph graph, reference;
  };
  const auto group = [&](std::int64_t seq, const sim::TaskGraph& built) {
    Group g{seq, planner::without_optimizer(built), planner::build_megatron(inputs(seq, n), plain)};
    g.graph.finalize();
    return g;
  };
  std::vector<std::vector<Group>> cases(2);
  cases[0].push_back(group(8, planner::build_zero(inputs(8, n), zero3)));
  if (n >= 4) cases[0].push_back(group(16, planner::build_megatron(inputs(16, n), piped)));
  cases[0].push_back(group(32, planner::build_megatron(inputs(32, n), tensor_parallel)));
  cases[1].push_back(group(16, planner::build_megatron(inputs(16, n), tensor_parallel)));
  cases[1].push_back(group(32, planner::build_megatron(inputs(32, n), piped)));

  const auto device = make_cpu_device();
  HotSpaOptions o;
  o.comm = &world();
  o.adam.lr = 1e-2f;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    const std::vector<Group>& groups = cases[c];
    ModelState executed(m, 6), reference(m, 6);
    const planner::StateLayout home = executor_layout(groups.back().graph, m);
    for (int step = 1; step <= 2; ++step) {
      SCOPED_TRACE("mini-batch " + std::to_string(step));
      std::vector<std::vector<std::vector<std::int32_t>>> tokens;
      std::vector<HotSpaGroupRun> runs, reference_runs;
      for (std::size_t k = 0; k < groups.size(); ++k) tokens.push_back(random_windows(m.vocab, groups[k].seq, n, 97 * step + k));
      for (std::size_t k = 0; k < groups.size(); ++k) {
        runs.push_back({&groups[k].graph, tokens[k]});
        reference_runs.push_back({&groups[k].reference, tokens[k]});
      }
      const HotSpaStepResult r = run_hotspa_step(*device, runs, executed, gpn, step, o);
      EXPECT_GT(r.sent_bytes, 0);
      EXPECT_GT(r.planned_param_bytes, 0);
      if (n >= 4 || c == 1) {
        EXPECT_GT(r.planned_grad_bytes, 0);  // into a pp 2 layout (at 2 ranks ZeRO-3's layout holds tp 2's)
      }
      EXPECT_EQ(r.group_step_ns.size(), groups.size());
      gather_switched(executed, home, gpn, world());
      if (world().rank() != 0) continue;
      const double expected = hotspa_reference_step(reference_runs, reference, gpn, step, true, o.adam);
      EXPECT_NEAR(r.loss, expected, 2e-3 * expected);
      std::int64_t missed = 0;  // counted, not asserted element by element: rank 0 must not leave the others waiting
      for (const Parameter* p : executed.all()) {
        for (std::size_t i = 0; i < p->size(); ++i) missed += !(std::isfinite(p->grad[i]) && std::isfinite(p->weight[i]));
      }
      EXPECT_EQ(missed, 0) << "elements a switch never delivered";
      EXPECT_LT(max_gradient_difference(executed, reference), 0.03);
      if (step > 1) continue;
      expect_updated_weights_agree(reference, executed);
      // AdamW's first step moves a weight whose gradient is near zero by lr either way, so the two runs' weights
      // differ there by up to 2 lr, and the second mini-batch's gradients would differ by what that does. The
      // reference starts it from the weights the switches gathered instead: its gradients then check the second
      // mini-batch's switches (which carry the updated weights out of the home layout) and the groups' steps on them.
      for (std::size_t p = 0; p < reference.all().size(); ++p) reference.all()[p]->weight = executed.all()[p]->weight;
    }
  }
}

// A switch that misses a transfer leaves the destination's slice NaN (what a rank does not hold is NaN), so the
// step that reads it fails rather than run on stale values; the whole plan delivers every held element.
TEST(Mpi, ASwitchDeliversEverySliceAndOneMissingLeavesItNaN) {
  const int n = world().size();
  model::ModelConfig m = test::tiny_model(true);
  m.vocab = 64;
  const sim::Cluster cluster = cluster_for_ranks();
  const planner::StepInputs in{m, cluster, {32, n}, model::precision_policy("bf16-mixed")};
  planner::MegatronParams piped;
  piped.pp = 2;
  piped.dp = n / 2;
  planner::MegatronParams tensor_parallel;
  tensor_parallel.tp = 2;
  tensor_parallel.dp = n / 2;
  planner::MegatronParams plain;
  plain.dp = n;
  const planner::StateLayout from = executor_layout(planner::build_megatron(in, tensor_parallel), m);
  const planner::StateLayout to = executor_layout(planner::build_megatron(in, n >= 4 ? piped : plain), m);
  const auto plan = planner::plan_switch(from, to, layout_unit_bytes(m, 2), cluster.topology.gpus_per_node(), n);
  ASSERT_FALSE(plan.transfers.empty());  // each TP rank holds half of what the destination layout needs whole
  const ModelState seeded(m, 3);
  for (bool drop_one : {false, true}) {
    SCOPED_TRACE(drop_one ? "one transfer dropped" : "the whole plan");
    planner::SwitchPlan run = plan;
    if (drop_one) run.transfers.erase(run.transfers.begin());  // a layer's slice (the head's last ones may hold only the norm, whole on every slice)
    ModelState state(m, 3);
    poison_unheld(state, from, world().rank(), SwitchedValues::weights);
    run_switch(state, run, SwitchedValues::weights, &world());
    int missing = 0;
    ModelState wanted(m, 3);
    poison_unheld(wanted, to, world().rank(), SwitchedValues::weights);  // NaN where this rank needs nothing
    for (std::size_t p = 0; p < state.all().size(); ++p) {
      const auto& got = state.all()[p]->weight;
      const auto& need = wanted.all()[p]->weight;
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(need[i])) continue;
        if (std::isnan(got[i])) ++missing;
        else EXPECT_EQ(got[i], seeded.all()[p]->weight[i]);
      }
    }
    const bool dropped_here = drop_one && plan.transfers.front().dst == world().rank();
    if (dropped_here) {
      EXPECT_GT(missing, 0);
    } else {
      EXPECT_EQ(missing, 0);
    }
  }
}

// A pipeline whose first and last stage both use the tied embedding, with the reduction between them taken out
// (it carries nothing): each rank would update its own copy with its own share. The executor refuses it before
// anything runs, as the reference does.
TEST(Mpi, TheExecutorRefusesASharedGroupNoReductionJoins) {
  const int n = world().size();
  const auto m = test::tiny_model(true);
  const sim::Cluster cluster = cluster_for_ranks();
  planner::MegatronParams pipeline;
  pipeline.pp = 2;
  pipeline.dp = n / 2;
  const sim::TaskGraph built = planner::build_megatron({m, cluster, {32, n}, model::precision_policy("bf16-mixed")}, pipeline);
  int taken_out = 0;
  const sim::TaskGraph graph = test::rebuilt(
      built,
      [&](sim::TaskId id, sim::Task& t) {
        if (!built.name(id).starts_with("embedding all-reduce")) return;
        t.op = sim::Op(sim::OpCode::states);  // model states that carry no gradients
        ++taken_out;
      },
      [](sim::TaskId, sim::TaskId) { return true; });
  ASSERT_GT(taken_out, 0);
  ExecutorOptions eo;
  eo.comm = &world();
  ModelState state(m, 6);
  const auto device = make_cpu_device();
  try {
    Executor executor(*device, graph, state, cluster.topology.gpus_per_node(), {}, eo);
    FAIL() << "the executor took a tied pipeline without an embedding reduction";
  } catch (const trainyard::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a gradient reduction over the GPUs that use it"), std::string::npos) << e.what();
  }
}

// The ranks disagree on their messages (rank 0's graph has lost a send the others' graph has): the step must end
// on every rank with an error, the receiving rank's naming the sender, the tag (the send's task id) and where,
// within the timeout; never a hang. (Its own communicator: what the failed run leaves unreceived stays there.)
TEST(Mpi, AStepWhoseRanksDisagreeOnAMessageFailsWithAClearErrorNotAHang) {
  MpiCommunicator impatient(500ms);
  const int n = impatient.size();
  const auto m = test::tiny_model();
  const sim::Cluster cluster = cluster_for_ranks();
  const std::int64_t seq = 64;
  planner::RingTrackParams p = test::chunked_offloaded();
  p.ring = 2;
  p.ring_order = {0, 1};
  const planner::StepInputs in{m, cluster, {seq, n / 2}, model::precision_policy("bf16-mixed")};
  sim::TaskGraph graph = planner::build_ringtrack(in, p).graph;
  sim::TaskId lost = -1;
  for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(graph.size()) && lost < 0; ++id) {
    const sim::Task& t = graph.task(id);
    if (t.kind() == sim::TaskKind::p2p && t.device == 0 && std::get<sim::PointToPoint>(t.params).dst == 1) lost = id;
  }
  ASSERT_GE(lost, 0);
  if (impatient.rank() == 0) graph.edit(lost).op = sim::Op{sim::OpCode::states};  // a task this rank does not send
  ModelState state(m, 5);
  ReferenceOptions o;
  o.comm = &impatient;
  const auto tokens = random_windows(m.vocab, seq, n / 2, 41);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    run_reference_step(graph, state, cluster.topology.gpus_per_node(), tokens, o);
  } catch (const CommError& e) {
    error = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  if (impatient.rank() <= 1) {
    EXPECT_FALSE(error.empty()) << "rank " << impatient.rank() << " finished a step its peer could not";
  }
  if (impatient.rank() == 1) {
    EXPECT_NE(error.find("rank 1 of"), std::string::npos) << error;
    EXPECT_NE(error.find("from rank 0 (tag " + std::to_string(lost) + ")"), std::string::npos) << error;
  }
  world().barrier();
}

// `mpirun -np N trainyard calibrate --device cpu`'s second half: every rank times the executor's own calls at once;
// rank 0 holds a positive time for every size, and the points fit.
TEST(Mpi, PeerMeasurementsTimeEverySizeOnRankZeroAndFit) {
  MpiCommunicator& c = world();
  const auto device = make_cpu_device();
  const PeerMeasurements m = measure_peers(*device, c, "test", nullptr);
  EXPECT_EQ(m.ranks, c.size());
  if (c.rank() != 0) {
    EXPECT_TRUE(m.p2p.empty() && m.all_reduce.empty() && m.all_to_all.empty());
    return;
  }
  ASSERT_EQ(m.p2p.size(), peer_message_bytes().size());
  ASSERT_EQ(m.all_reduce.size(), peer_collective_bytes().size());
  ASSERT_EQ(m.all_to_all.size(), peer_collective_bytes().size());
  for (const auto* series : {&m.p2p, &m.all_reduce, &m.all_to_all}) {
    for (const CopyPoint& p : *series) EXPECT_GT(p.seconds, 0.0) << p.bytes;
  }
  EXPECT_LT(m.p2p.front().seconds, m.p2p.back().seconds);  // 64 B against 16 MiB
  const PeerFits f = fit_peers(m);
  EXPECT_GT(f.link_GBps, 0.0);
  EXPECT_GT(f.efficiency, 0.0);
  EXPECT_LE(f.efficiency, 1.0);
}

}  // namespace trainyard::backend

int main(int argc, char** argv) {
  trainyard::backend::MpiSession session;
  if (!session.active()) {
    std::fprintf(stderr, "test_mpi runs under mpirun (ctest starts it with 2, 4 and 8 ranks)\n");
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  // Any rank's failure fails the run (mpirun returns the first non-zero exit code).
  return failed;
}
