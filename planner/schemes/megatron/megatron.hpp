#pragma once
// Megatron-LM: tensor parallelism (optionally with sequence parallelism), pipeline parallelism with the 1F1B
// schedule (interleaved when vpp > 1), data parallelism with the gradient all-reduce overlapped with the last
// micro-batch's backward in buckets, none/selective/full activation recomputation, and checkpoint offload (OC):
// the layer inputs kept under full recompute go to host DRAM after each layer's forward and come back before
// its backward.
//
// Context parallelism (cp > 1) splits each sequence over cp ranks with Megatron's load-balanced causal split; K/V
// pass round a ring (--cp-comm-type p2p), are all-gathered (all_gather), an all-to-all trades the sequence split
// for a head split (a2a), or both in two levels (a2a+p2p); gradients are reduced over dp x cp.
// Uneven pipelines (Megatron's --decoder-first/last-pipeline-num-layers) give the first and last stage their own
// layer counts and split the rest evenly.
//
// Rank layout (Megatron's default order, tensor-parallel innermost): GPU = ((pp_rank * dp + dp_rank) * cp +
// cp_rank) * tp + tp_rank, so TP groups sit inside a node on NVLink and pipeline stages split across nodes.
// Streams: compute 0; comm 0 for TP collectives, comm 1 for pipeline sends and CP passes, comm 2 for the DP
// all-reduce.
#include <cstdint>
#include <vector>

#include "planner/step.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

struct MegatronParams {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int cp = 1;                    // context-parallel degree
  CpComm cp_comm = CpComm::p2p;  // how the cp ranks exchange attention's inputs
  int cp_a2a = 0;                // a2a+p2p: the all-to-all level's size (Megatron's first
                                 // --hierarchical-context-parallel-sizes entry); 0 with other comm types
  int vpp = 1;                   // virtual stages (model chunks) per pipeline rank
  int first_stage_layers = 0;    // layers on the first / last pipeline stage; 0: an even split
  int last_stage_layers = 0;
  std::int64_t micro_batch = 1;  // sequences per micro-batch
  bool sequence_parallel = false;
  // Megatron's --tp-comm-overlap (Transformer Engine userbuffers, needs sequence parallelism): each TP all-gather
  // and reduce-scatter runs beside the GEMM that consumes or produces it instead of before or after it.
  bool tp_comm_overlap = false;
  Recompute recompute = Recompute::none;
  bool offload_activations = false;  // OC: full-recompute checkpoints kept in host DRAM (needs recompute full)
  double bucket_params = 40e6;       // DP all-reduce bucket size in parameters (Megatron's default is 40M)
  // Megatron's distributed optimizer (ZeRO-1 across the data-parallel ranks): fp32 master weights and Adam moments
  // are split dp ways, gradients are reduce-scattered instead of all-reduced, and the updated bf16 weights are
  // all-gathered after the optimizer step.
  bool distributed_optimizer = false;
  // Symmetry reduction (planner/symmetry.hpp): the dp = 2 replicas built stand for this many identical ones;
  // the data-parallel collectives run as rings of dp_represented x cp ranks and the distributed optimizer
  // shards as many ways. 0: dp is the whole data-parallel degree. Not a plan-file parameter.
  int dp_represented = 0;
  // Likewise for context parallelism: the cp = 2 ranks built stand for this many (0: cp is the whole degree).
  int cp_represented = 0;
  // And for tensor parallelism: the TP ranks built of each group (0: all tp), standing for all tp. Unlike dp and
  // cp, tp stays the whole degree (the shards' shapes); their collectives run as rings of tp ranks.
  int tp_built = 0;
  int built_tp() const { return tp_built > 0 ? tp_built : tp; }
  int whole_cp() const { return cp_represented > 0 ? cp_represented : cp; }
  int whole_dp() const { return dp_represented > 0 ? dp_represented : dp; }
};

// Checks the parameters against the model, cluster and workload; throws InputError naming the flag.
void check_megatron(const StepInputs& in, const MegatronParams& p);
// The micro-batches per step: global_batch / (dp * micro_batch).
std::int64_t megatron_micro_batches(const StepInputs& in, const MegatronParams& p);
// Model-state bytes per parameter a rank holds: weights and gradients whole; with the distributed optimizer the
// master weights and Adam moments split over the whole data-parallel x context-parallel group.
double megatron_state_bytes_per_param(const model::PrecisionPolicy& pol, const MegatronParams& p);
// One micro-batch's tokens on one TP rank: the shape every Megatron layer cost and memory figure uses.
LayerSplit megatron_layer_split(const StepInputs& in, const MegatronParams& p);
// Layers on each pipeline stage (split over its vpp model chunks by megatron_chunk_first_layers), checked by
// check_megatron.
std::vector<std::int64_t> megatron_stage_layers(std::int64_t layers, const MegatronParams& p);
// The first layer of each virtual stage v (chunk v / pp of stage v % pp), and the layer count at the end:
// virtual stage v holds layers [out[v], out[v + 1]).
std::vector<std::int64_t> megatron_chunk_first_layers(std::int64_t layers, const MegatronParams& p);

sim::TaskGraph build_megatron(const StepInputs& in, const MegatronParams& p);

// The order in which pipeline rank `stage` runs its forward and backward passes (Megatron's 1F1B and
// interleaved 1F1B): each entry is (forward?, micro-batch, model chunk).
struct PipelineSlot {
  bool forward;
  std::int64_t micro_batch;
  int chunk;
};
std::vector<PipelineSlot> pipeline_schedule(int stage, int pp, std::int64_t micro_batches, int vpp);

}  // namespace trainyard::planner
