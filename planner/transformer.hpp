#pragma once
// One transformer layer as tasks, shared by every scheme: norm, QKV projection (GQA-aware), RoPE, flash-style
// causal attention (no S^2 scores in memory), output projection, residual, norm, MLP (SwiGLU or GELU), with
// tensor-parallel collectives (all-reduce, or all-gather + reduce-scatter with sequence parallelism), and the
// activation bytes each op keeps for backward, so that recompute policies change memory and time together.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/cluster.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::planner {

enum class Recompute { none, selective, full };
std::string_view to_string(Recompute r);

// How context-parallel ranks exchange what attention needs (Megatron's --cp-comm-type): K/V blocks passed round a
// ring (p2p), K/V all-gathered (all_gather, Llama 3's CP), or an all-to-all that trades the sequence split for a
// head split around attention (a2a, DeepSpeed-Ulysses inside the CP group), or both in two levels (a2a_p2p,
// Megatron's "a2a+p2p" with --hierarchical-context-parallel-sizes: all-to-alls inside groups of consecutive cp
// ranks, typically on NVLink, and a K/V ring across those groups).
enum class CpComm { p2p, all_gather, a2a, a2a_p2p };
std::string_view to_string(CpComm c);
std::optional<CpComm> cp_comm_named(std::string_view name);

// The slice of a layer's work one GPU does for one micro-batch.
struct LayerSplit {
  std::int64_t sequences = 1;  // micro-batch size b
  // Tokens per sequence S the layer pass sees: the sequence (or, in ring-track, one chunk, which it builds as a
  // sequence of its own: its attention against earlier chunks is added by the builder).
  std::int64_t sequence_tokens = 0;
  int tp = 1;
  bool sequence_parallel = false;
  bool dropout = false;              // GPT-3-style dropout masks (Korthikanti et al.); the built-in models train without
  int ulysses = 1;                   // DeepSpeed-Ulysses degree: tokens split across ranks, heads split for attention
  int cp = 1;                        // ring attention / context parallelism: tokens split, K/V blocks passed round
                                     // (combines with tp: ranks are [cp index][tp index], TP groups innermost)
  bool zigzag = false;               // cp: each rank holds chunks r and 2cp-1-r, balancing causal work
  CpComm cp_comm = CpComm::p2p;      // cp: how the ranks exchange attention's inputs
  int cp_a2a = 1;                    // a2a_p2p: ranks in each all-to-all group (consecutive cp ranks); the ring has cp / cp_a2a
  int cp_ranks = 0;                  // symmetry reduction: the cp ranks built, standing for all cp (0: cp); their
                                     // exchanges run as the whole ring's (needs zigzag: every rank the same work)
  int fpdt_chunks = 1;               // FPDT: the sequence's attention runs in this many chunks, K/V of earlier chunks
                                     // (and q, o, lse, dO, dq in backward) streamed from host DRAM
  bool recompute_attention = false;  // selective recompute (Megatron's recompute_modules = core_attn): the core
                                     // attention's forward runs again just before its backward, whatever the kernel
  double score_bytes = 0;            // unfused attention (stacks::AttentionImpl::unfused): bytes kept per (head, query,
                                     // key) score for backward when nothing is recomputed
  bool tp_comm_overlap = false;      // with sequence_parallel: TP all-gathers and reduce-scatters run beside their GEMMs
  int tp_ranks = 0;                  // symmetry reduction: the TP ranks built of each group (0: tp), standing for all tp;
                                     // their collectives run as the whole group's ring
  std::int64_t tokens() const { return sequences * sequence_tokens; }
  std::int64_t local_tokens() const { return tokens() / (ulysses * cp); }
  int built_cp() const { return cp_ranks > 0 ? cp_ranks : cp; }
  int built_tp() const { return tp_ranks > 0 ? tp_ranks : tp; }
  // Ring attention the executors run: K/V passed round every cp rank (p2p, no TP, no symmetry reduction); rank r
  // holds the step's chunk r, and with zigzag its mirror too.
  bool executable_ring() const { return cp > 1 && cp_comm == CpComm::p2p && built_cp() == cp && built_tp() == tp; }
  // Megatron's a2a context parallelism the executors run (Ulysses over the cp ranks, no TP): rank r holds chunk r,
  // and with zigzag its mirror too; around attention, head group r of every chunk (the heads must split evenly:
  // LayerEmitter::executable_heads_split).
  bool executable_cp_a2a() const { return cp > 1 && cp_comm == CpComm::a2a && built_cp() == cp && built_tp() == 1; }
  // Megatron's hierarchical a2a+p2p context parallelism the executors run (no TP): rank r holds chunk r and its
  // mirror; around attention, head group r % cp_a2a of its a2a group's chunks (a run of cp_a2a chunks from the
  // group's first, and their mirrors), whose K/V blocks pass round the ring of the groups.
  bool executable_cp_a2a_p2p() const { return cp > 1 && cp_comm == CpComm::a2a_p2p && built_cp() == cp && built_tp() == 1; }
  // Megatron's all_gather context parallelism the executors run: rank r holds chunk r (with zigzag, and its mirror),
  // gathers every chunk's K and V and sends each owner its share of their dK | dV (every rank built).
  bool executable_cp_allgather() const { return cp > 1 && cp_comm == CpComm::all_gather && built_cp() == cp && built_tp() == tp; }
  // FPDT the executors run: no TP or CP, one sequence per micro-batch, at most 255 chunks (its merge op covers them
  // all, sim::Op::chunk_count), and each sp rank's tokens a whole number of FPDT chunks, so that rank i holds chunks i * r .. (i + 1) * r - 1, r =
  // fpdt_run() (sim::Op::chunk_run); with sp > 1 the heads must split evenly too (LayerEmitter::executable_ulysses).
  bool executable_fpdt() const { return fpdt_chunks > 1 && fpdt_chunks <= 255 && tp == 1 && cp == 1 && sequences == 1 && fpdt_chunks % ulysses == 0; }
  // The executors' chunks a rank's ops cover: FPDT's chunks of its share of the sequence; else 1.
  int fpdt_run() const { return executable_fpdt() ? fpdt_chunks / ulysses : 1; }
  // An executable zigzag split: the 2 x cp chunks of the sequence (sim::Op::zigzag); else 0.
  std::uint8_t zigzag_chunks() const {
    return (executable_ring() || executable_cp_a2a() || executable_cp_a2a_p2p() || executable_cp_allgather()) && zigzag && cp <= 127
               ? static_cast<std::uint8_t>(2 * cp)
               : 0;
  }
  // The tokens of the executors' chunk: a rank's share of a sequence, half of it with zigzag; FPDT: its chunk.
  std::int64_t chunk_tokens() const { return local_tokens() / sequences / (zigzag_chunks() > 0 ? 2 : 1) / fpdt_run(); }
};

// Bytes of activations one layer keeps for backward on one GPU. Follows Korthikanti et al. (2022), "Reducing
// Activation Recomputation in Large Transformer Models", with flash attention: Q, K, V, the attention output and
// the fp32 log-sum-exp are kept, the S^2 scores never are, so "selective" keeps what "none" keeps (it only costs
// the core attention's forward again; with unfused attention it drops the stored scores); "full" keeps the layer
// input only.
struct ActivationBytes {
  double norms = 0;              // the inputs of both norms
  double projection_inputs = 0;  // QKV and MLP-up inputs (the norms' outputs)
  double attention = 0;          // q, k, v, attention output, lse
  double mlp = 0;                // the MLP's intermediate tensors
  double dropout_masks = 0;      // 1 byte per element, when dropout is on
  double total() const { return norms + projection_inputs + attention + mlp + dropout_masks; }
};
ActivationBytes layer_activation_bytes(const model::ModelConfig& m, const LayerSplit& split, Recompute recompute);
// LayerSplit::score_bytes for a cluster: the stack's stored bytes per score when its attention on this GPU is
// unfused, else 0 (fused kernels keep only the log-sum-exp).
double stored_score_bytes(const sim::Cluster& cluster);

// Bytes each GPU moves in tensor-parallel collectives for one layer's forward (backward moves the same):
// two all-reduces of the b*S*h activations (ring: 2(t-1)/t of the buffer per GPU), or with sequence
// parallelism two all-gathers and two reduce-scatters ((t-1)/t each): the same volume.
double tp_bytes_per_layer_forward(const model::ModelConfig& m, const LayerSplit& split);

// Bytes each GPU puts into Ulysses all-to-alls for one layer's forward (backward moves the same): q, k, v before
// attention and its output after, b*S/P tokens each (4 b S h / P elements for multi-head attention).
double ulysses_bytes_per_layer_forward(const model::ModelConfig& m, const LayerSplit& split);

// Bytes each GPU sends around the ring for one layer's attention under context parallelism: cp - 1 passes of
// its K and V block (its TP rank's K/V heads; forward); backward passes K, V and the fp32 dK, dV accumulators.
double ring_bytes_per_layer(const model::ModelConfig& m, const LayerSplit& split, bool backward);
// All-gather context parallelism: the gathered bf16 K and V of the whole sequence for one TP rank's K/V heads
// (nccl-tests' size of the all-gather; backward reduce-scatters dK, dV of the same size).
double cp_gathered_kv_bytes(const model::ModelConfig& m, const LayerSplit& split);

// FPDT's HBM working set for one layer: the current chunk's tensors plus two prefetch buffers and the
// accumulators, taken as 4 chunks' worth of the layer's activations (all of them when there is one chunk).
double fpdt_working_bytes(const model::ModelConfig& m, const LayerSplit& split);
// Bytes one GPU copies to or from host DRAM for one layer's FPDT attention (forward or backward).
double fpdt_copy_bytes(const model::ModelConfig& m, const LayerSplit& split, bool backward);
// The size of each of those copies (LayerEmitter::fpdt_attention): a chunk's K/V (out in forward, back in for each
// later chunk, and once in backward), and per (kv chunk, query chunk) pair of the backward, q, o, dO, lse and dq in
// and dq out.
struct FpdtCopySizes {
  double kv_bytes = 0, pair_in_bytes = 0, pair_out_bytes = 0;
};
FpdtCopySizes fpdt_copy_sizes(const model::ModelConfig& m, const LayerSplit& split);

// Emits tasks into a graph for one group of ranks doing the same ops on their shards: tensor-parallel ranks
// (split.tp of them), Ulysses ranks (split.ulysses), context-parallel ranks (split.cp), or cp x tp ranks
// ordered [cp index][tp index], threading each rank's chain through `last`. TP collectives run within each TP
// group only; Ulysses all-to-alls over all ranks; ring passes between the ranks of one TP index.
// Context parallelism's messages and collectives run on comm stream 3: the cp group's own NCCL communicator,
// whose stream is apart from the pipeline's sends (Megatron, comm 1) and ZeRO-3's parameter gathers (comm 1), as
// every torch.distributed process group has its own.
inline constexpr int kCpStream = 3;

// How the loss holds its logits: in pieces of `chunk_tokens` (0: the whole micro-batch at once), each holding
// `bytes_per_logit` while its cross-entropy runs.
struct LossMemory {
  std::int64_t chunk_tokens = 8192;
  double bytes_per_logit = 4;  // fp32 logits
};

class LayerEmitter {
 public:
  LayerEmitter(sim::TaskGraph& graph, const model::ModelConfig& model, const LayerSplit& split, std::vector<sim::DeviceId> ranks);

  // Where the next forward()/backward() is in the step: every task they emit carries these coordinates and
  // its op code (sim::Op), which is what lets the executor run the graph with real tensors.
  void set_coordinates(int seq, int layer, int chunk) { at_ = on_rank(sim::Op(sim::OpCode::none, seq, layer, chunk), 0); }
  // `at` as the group's rank index `rank` holds it: its chunk (LayerSplit::executable_ring: rank r's cp index;
  // executable_ulysses: its index) and zigzag.
  sim::Op on_rank(sim::Op at, std::size_t rank) const;
  // Ulysses the executors run: the heads and K/V heads split evenly over the sp ranks (no TP or CP; FPDT where
  // LayerSplit::executable_fpdt); rank i holds chunk i of the sequence (FPDT: its run of chunks) and, around
  // attention, head group i of every chunk.
  bool executable_ulysses() const;
  // Ulysses or Megatron's a2a (or a2a+p2p) CP that the executors run: the head groups attention works on (sp, cp
  // or cp_a2a); else 0.
  int executable_heads_split() const;
  // Rank index `rank`'s attention op `o` over head group `rank` of every chunk; an all-to-all's op.
  sim::Op head_group_op(sim::Op o, sim::TaskId rank) const;
  sim::Op heads_exchange_op(sim::OpCode code) const;
  sim::Op op(sim::OpCode code) const {
    sim::Op o = at_;
    o.code = code;
    return o;
  }

  // `last[i]` is rank i's most recent task (or -1); it is updated to the layer's final task.
  void forward(const std::string& prefix, std::vector<sim::TaskId>& last, bool recompute = false);
  void backward(const std::string& prefix, std::vector<sim::TaskId>& last);

  // Tensor parallelism around the layers (Megatron's vocab-parallel embedding and LM head), on every TP group:
  //  - embedding_sum: the embedding's partial lookups (each rank holds vocab / tp rows) summed, an all-reduce of
  //    b*S*h bf16 (a reduce-scatter with sequence parallelism); `at`: the embedding's coordinates.
  //  - vocab_parallel_loss: emit_loss's pieces over the vocabulary shards: each rank's logits and its shard's
  //    cross-entropy statistics (log-sum-exp and target logit, 8 bytes per token), all-gathered and merged into the
  //    loss and the logits' gradient; the head's input gradient (partial over the shards) all-reduced before the
  //    final norm's backward. With sequence parallelism the final hidden state is all-gathered first and the
  //    pieces' input gradients reduce-scattered. Megatron merges the statistics with three all-reduces of 4 bytes
  //    per token (max, target logit, sum of exponentials); one all-gather of the same bytes stands for them.
  void embedding_sum(const std::string& name, sim::Op at, std::vector<sim::TaskId>& last);
  // With sequence parallelism, the embedding's backward first all-gathers layer 0's dX (the transpose of the
  // forward's reduce-scatter: each rank's vocabulary shard needs every row's gradient); `at`: its coordinates.
  void embedding_gather(const std::string& name, sim::Op at, std::vector<sim::TaskId>& last);
  // With sequence parallelism, the norms' weight gradients of layers first_layer..last_layer (and the final
  // norm's, with `head`), each rank's over its own rows, all-reduced in fp32 over every TP group.
  void norm_gradients_sum(const std::string& name, std::int64_t first_layer, std::int64_t last_layer, bool head, std::vector<sim::TaskId>& last);
  void vocab_parallel_loss(const std::string& tag, std::int64_t tokens, std::int64_t vocab_shard, sim::Op at, const LossMemory& memory,
                           std::vector<sim::TaskId>& last);

  // Replaces the attention step (forward, recompute or backward) for schemes that stream it themselves
  // (ring-track: one chunk against the K/V of all earlier chunks); the hook chains its tasks through `last`.
  using AttentionHook = std::function<void(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute)>;
  void set_attention_hook(AttentionHook hook) { attention_hook_ = std::move(hook); }

 private:
  // One task per rank, each after that rank's previous task.
  void each_rank(const std::string& name, const sim::TaskParams& params, std::vector<sim::TaskId>& last, bool recompute, sim::OpCode code);
  void gemm(const std::string& name, sim::OpCode code, std::int64_t m, std::int64_t n, std::int64_t k, std::vector<sim::TaskId>& last,
            bool recompute);
  void elementwise(const std::string& name, sim::OpCode code, double read, double written, std::vector<sim::TaskId>& last, bool recompute);
  void attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute);
  // `code`: what a TP collective sums or gathers (sim::OpCode::tp_sum_*, tp_gather_*), for the executors.
  void collective(const std::string& name, sim::CollectiveOp op, double bytes, std::vector<sim::TaskId>& last, sim::OpCode code = sim::OpCode::none);
  // With split.tp_comm_overlap: the collective and the GEMM both start after `last`, and the rank's next task
  // waits for both. Without: the collective, then the GEMM (gather_first) or the GEMM, then the collective.
  void gemm_beside_collective(const std::string& gemm_name, sim::OpCode code, std::int64_t m, std::int64_t n, std::int64_t k,
                              const std::string& collective_name, sim::CollectiveOp op, double bytes, bool gather_first,
                              std::vector<sim::TaskId>& last, bool recompute, sim::OpCode collective_code = sim::OpCode::none);
  void ulysses_exchange(const std::string& name, sim::OpCode code, double bytes, std::vector<sim::TaskId>& last);
  void ring_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute);
  void allgather_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute);
  void a2a_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute);
  void a2a_p2p_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute);
  // The K/V ring's steps over `rings` (rank indices in ring order; `steps` >= their size under symmetry), each
  // block `block` (its kv_len the whole block's; causal marks nothing) of `k_elements` elements of K; forward
  // then merges the partial outputs, backward brings the dK | dV accumulators home.
  void ring_steps(const std::string& name, const std::vector<std::vector<std::size_t>>& rings, int steps, sim::Attention block, double k_elements,
                  std::vector<sim::TaskId>& last, bool recompute);
  struct RingPass {  // one ring_steps call's messages
    std::string name;
    std::int64_t kv_bytes, dkv_bytes;   // a block's K and V; its fp32 dK | dV accumulator
    std::vector<sim::TaskId> outgoing;  // each rank's last message
  };
  struct Accumulator {  // a block's dK | dV on its way: the ring position holding it and the task that finished it
    int holder = -1;
    sim::TaskId ready = -1;
  };
  sim::TaskId ring_send(RingPass& pass, const std::string& label, std::size_t from, std::size_t to, std::int64_t bytes, std::vector<sim::TaskId> deps,
                        sim::Op op);
  void bring_accumulator(RingPass& pass, const std::vector<std::size_t>& ring, const std::vector<Accumulator>& accumulators, int owner, int to,
                         sim::TaskId posted, std::vector<sim::TaskId>& last);
  // The chunk a rank's tasks work on. Rings other than LayerSplit::executable_ring are left unannotated.
  std::int32_t chunk_of(std::size_t rank) const { return on_rank(at_, rank).chunk; }
  // The chunks a ring's block holds: the rank's chunk (LayerSplit::executable_ring), or under a2a+p2p its a2a
  // group's run of cp_a2a chunks (first chunk, count); with zigzag, their mirrors too.
  std::pair<std::int32_t, std::int32_t> ring_block(std::size_t rank) const;
  // A ring task's op: rank `rank`'s work on (or move of) the block that started on rank `block_rank` (dkv_add:
  // the accumulator `from_rank` sent); under a2a+p2p, in the rank's head group.
  sim::Op ring_op(sim::OpCode code, std::size_t rank, std::size_t block_rank, std::size_t from_rank = 0) const;
  void cp_exchange_heads(const std::string& name, bool backward, bool inbound, std::vector<sim::TaskId>& last);
  // Says what each cp group's collective just emitted (its members' last task) moves, for the executors.
  void set_cp_group_ops(sim::OpCode code, const std::vector<sim::TaskId>& last);
  void cp_collective(const std::string& name, sim::CollectiveOp op, std::int64_t bytes, std::vector<sim::TaskId>& last);
  // The ranks of TP index t across the cp slices, and the chain ends of those ranks.
  std::size_t rank_index(int cp_index, int tp_index) const { return static_cast<std::size_t>(cp_index * split_.built_tp() + tp_index); }
  void fpdt_attention(const std::string& name, bool backward, std::vector<sim::TaskId>& last, bool recompute);

  sim::TaskGraph& graph_;
  const model::ModelConfig& model_;
  LayerSplit split_;
  std::vector<sim::DeviceId> ranks_;
  std::vector<std::int32_t> tp_groups_;  // one per cp index, when tp > 1
  struct CpGroup {
    std::int32_t id;
    std::vector<std::size_t> members;  // rank indices
  };
  std::vector<CpGroup> cp_groups_;  // all-gather and a2a CP: one per tp index; a2a_p2p: its all-to-all groups
  std::int32_t ulysses_group_ = -1;
  std::vector<sim::TaskId> join_;  // per rank: a collective run beside a GEMM, which the rank's next task waits for
  AttentionHook attention_hook_;
  sim::Op at_;
};

// The ends of the model, per GPU, chained after `after` (or -1); each returns its last task.
// Embedding lookup (a gather writing tokens*h*2 bytes) or its backward (a scatter-add into the embedding
// gradient). Under TP, LayerEmitter::embedding_sum adds the vocab-parallel lookup's all-reduce.
// `at` gives the coordinates (sequence, chunk) its tasks carry.
sim::TaskId emit_embedding(sim::TaskGraph& g, sim::DeviceId gpu, const std::string& name, std::int64_t tokens, std::int64_t hidden, bool backward,
                           sim::TaskId after, sim::Op at = {});
// The stack's (stacks::StackProfile::loss_logits), or trainyard's 8K-token chunks of fp32 logits.
LossMemory loss_memory(const stacks::StackProfile& stack);
// LM head and softmax cross-entropy over `tokens`, forward and backward fused per chunk (LossMemory; trainyard's
// default of 8K tokens keeps the fp32 logits of a long sequence from existing whole): logits, loss, input and
// weight gradients. The final norm runs inside the LM head's pieces (its cost is not modelled: h elements per token).
sim::TaskId emit_loss(sim::TaskGraph& g, sim::DeviceId gpu, const std::string& tag, std::int64_t tokens, std::int64_t hidden,
                      std::int64_t vocab_shard, sim::TaskId after, sim::Op at = {}, const LossMemory& memory = {});

}  // namespace trainyard::planner
