#pragma once
// The plan IR: one training step as tasks with dependencies. The simulator (engine.hpp) predicts it and the
// CUDA executor runs it, so both are judged on the very same schedule.
//
// Devices: GPU g is 0..gpus-1 across the cluster (node = g / gpus_per_node); the host of node n is
// host_device(n) (a negative number). Streams are in-order like CUDA streams: a task starts when all its
// dependencies are done and it is at the head of each stream it occupies (a collective occupies the comm
// stream of every member of its group).
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/huge_pages.hpp"
#include "hwprofiles/dtype.hpp"

namespace trainyard::sim {

using TaskId = std::int32_t;
using DeviceId = std::int32_t;
constexpr DeviceId host_device(int node) { return -1 - node; }
constexpr bool is_host(DeviceId d) { return d < 0; }
constexpr int host_node(DeviceId d) { return -1 - d; }
std::string device_name(DeviceId d);  // "gpu3", "host0": as graph files and reports write them

enum class StreamKind : std::uint8_t { none, compute, h2d, d2h, comm, host };
std::string_view to_string(StreamKind kind);

struct Stream {
  StreamKind kind = StreamKind::none;
  std::uint8_t index = 0;  // compute streams 0..; the others have one each
};

enum class Pool : std::uint8_t { hbm, dram };  // a GPU's HBM; the pinned host DRAM of a node

// --- task kinds -------------------------------------------------------------------------------------------
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0;
  hw::Dtype dtype = hw::Dtype::bf16;
};
struct Attention {
  std::int64_t q_len = 0, kv_len = 0;  // the queries are the last q_len positions of the kv_len keys
  std::int32_t heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = true;
  bool backward = false;
  // Share of the (causal) score block actually computed: packed rows of several documents with per-document
  // masks compute only each document's own block (planner/lengths.hpp).
  double density = 1;
};
struct Elementwise {  // norms, activations, residuals, RoPE, loss: memory-bound
  std::int64_t bytes_read = 0, bytes_written = 0;
};
struct OptimizerStep {  // bytes read + written by the update (weights, grads, moments)
  std::int64_t bytes = 0;
};
struct Copy {  // between a GPU's HBM and its node's host DRAM; the direction picks the copy engine
  enum class Direction : std::uint8_t { h2d, d2h } direction = Direction::h2d;
  std::int64_t bytes = 0;
  bool pinned = true;
};
struct PointToPoint {  // the task's device sends to `dst`
  DeviceId dst = 0;
  std::int64_t bytes = 0;
};
enum class CollectiveOp : std::uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast };
enum class Algorithm : std::uint8_t { ring, tree, direct };
struct Collective {
  CollectiveOp op = CollectiveOp::all_reduce;
  Algorithm algorithm = Algorithm::ring;
  std::int32_t group = 0;  // index into TaskGraph::groups(); the first member is the root of a broadcast
  std::int64_t bytes = 0;  // the full buffer per GPU (all-gather: the gathered output)
  // Symmetry reduction: a ring all-reduce, all-gather or reduce-scatter of `ring_ranks` ranks of which the group
  // holds the simulated ones (identical replicas stand for the rest): it takes the steps of the whole ring and
  // every member sends bytes / ring_ranks to its successor in the group each step, as every rank of the whole
  // ring would; a group of one member passes its slices to itself, through its NVSwitch or, when the whole ring
  // crosses nodes (`ring_across_nodes`), out through its rail NIC to the fabric and back in. 0: the group is the
  // whole ring.
  std::int32_t ring_ranks = 0;
  bool ring_across_nodes = false;
};
struct Alloc {
  Pool pool = Pool::hbm;
  std::int64_t bytes = 0;
  std::int32_t label = 0;  // index into TaskGraph::labels()
};
struct Free {
  TaskId alloc = 0;
};

using TaskParams = std::variant<Gemm, Attention, Elementwise, OptimizerStep, Copy, PointToPoint, Collective, Alloc, Free>;

enum class TaskKind : std::uint8_t { gemm, attention, elementwise, optimizer, copy, p2p, collective, alloc, free };
std::string_view to_string(TaskKind kind);
std::string_view to_string(CollectiveOp op);
std::string_view to_string(Algorithm algorithm);

// What a task computes or moves in the model's terms, for the executor (backend/reference_step.hpp and the CUDA
// executor); the simulator ignores it. Builders that annotate every task of a step make it executable with real
// tensors; a graph with a task left at `none` can only be simulated.
//
// Coordinates: sequence `seq` of the step, `layer` (the LM head is layer == the model's layer count), query
// chunk `chunk`; the fields after them are set only by the ops that say so (-1 otherwise).
// A table laid out by hand.
// clang-format off
enum class OpCode : std::uint8_t {
  none,
  // forward of layer `layer` on chunk `chunk` (recompute reruns them with Task::recompute set)
  embed, norm1, qkv, rope, attn, attn_merge, proj, residual1, norm2, mlp_up, act, mlp_down, residual2,
  // backward, in the order a layer runs them (each *_dgrad is followed by its *_wgrad: LayerEmitter relies on it)
  residual2_bwd, mlp_down_dgrad, mlp_down_wgrad, act_bwd, mlp_up_dgrad, mlp_up_wgrad, norm2_bwd, residual1_bwd,
  proj_dgrad, proj_wgrad, attn_bwd,
  dkv_add,  // ring attention: the dK|dV accumulators received for chunks kv_first..kv_last added into this rank's share
  rope_bwd, qkv_dgrad, qkv_wgrad, norm1_bwd, embed_bwd,
  // the final norm, LM head and cross-entropy on tokens [row_begin, row_end) of the chunk: forward and backward fused.
  // Under tensor parallelism (Op::vocab_parallel) the vocabulary is sharded (Megatron's vocab-parallel head): the
  // loss takes head_xent_shard (this shard's statistics), their all-gather and head_xent_merge; the head's input
  // gradient head_dgrad_shard (a partial sum), its all-reduce and head_norm_bwd, in place of head_xent, head_dgrad.
  head_logits, head_xent, head_xent_shard, head_xent_merge, head_dgrad, head_dgrad_shard, head_norm_bwd, head_wgrad,
  optimizer,  // AdamW on the parameters the task's device (or the GPU it serves) owns
  // Ring-track's streamed weights: on a host task, the host adding one backward visit's gradients of layer `layer`
  // (copied out just before) to its sums for the GPU it serves (Op::host_gradient_sum).
  host_grad_sum,
  // What a copy or send moves, and what an allocation holds (its free drops it): tensors of (layer, chunk)
  kv,          // K and V of chunks kv_first..kv_last
  dkv,         // fp32 dK/dV accumulators of chunks kv_first..kv_last
  kv_dkv,      // both (the backward's stream buffers)
  dkv_pass,    // ring attention: dK|dV accumulators of chunks kv_first..kv_last, arriving as the receiver's incoming
               // accumulators (added by its dkv_add, so the rank's own share is computed while they travel)
  acts,        // what forward keeps for backward except K/V: layer input, norm outputs, q, o, lse, MLP tensors
  checkpoint,  // what recompute keeps: the layer input, the attention output and its lse
  input,       // the layer's input (the previous layer's output; layer L: the final hidden state)
  input_grad,  // the gradient of the layer's input
  // FPDT's attention tensors streamed through host DRAM (forward: K/V out and back; backward: K/V, q, o, dO, lse
  // and dq in, dq out). The executors keep those tensors in HBM and carry the copy's bytes between scratch and
  // pinned buffers: the copy engines do the plan's work, while HBM holds more than the plan counts.
  fpdt_buffers,
  // On an all-to-all over a Ulysses group, whose rank i holds chunk i of the sequence and, around attention, head
  // group i of every chunk (Op::head_groups groups): Q, K, V (heads_qkv) and dO (heads_dout) from a chunk's heads
  // to head groups; the attention output (heads_out) and the fp32 dQ, dK|dV (heads_dqkv) back.
  heads_qkv, heads_out, heads_dout, heads_dqkv,
  // Tensor parallelism (Megatron's TP without sequence parallelism): collectives in place over the layer's TP group,
  // on a tensor of (layer, chunk) of which each member computed a partial sum (all-reduce): the projection's output
  // P, the MLP's output MO, the gradients dN2 and dN1 of the norms' outputs (from the column-parallel GEMMs'
  // dgrads), the vocab-parallel embedding's output (layer 0's X) and the LM head piece's dNF; or its own slot
  // (all-gather): the LM head piece's cross-entropy statistics. With sequence parallelism the sums are
  // reduce-scatters (each member sums its own rows; the LM head's pieces, all of theirs) and these all-gathers bring
  // each member's rows of a (layer, chunk) tensor to every member: the norms' outputs N1 and N2 (forward, and again
  // for the weight gradients), the incoming gradients dM and dP of the row-parallel GEMMs, the final hidden state
  // (layer L's X, for the LM head) and layer 0's dX (for the embedding's backward).
  tp_sum_p, tp_sum_mo, tp_sum_dn2, tp_sum_dn1, tp_sum_x, tp_sum_dnf, tp_gather_xent,
  tp_gather_n1, tp_gather_n2, tp_gather_dm, tp_gather_dp, tp_gather_x, tp_gather_dx,
  // Sequence parallelism: the norms' weight gradients, each member's over its own rows, summed over the TP group
  // (Megatron-LM's _allreduce_layernorm_grads) for the layers and head of Op::norm_gradients.
  tp_sum_norms,
  // All-gather context parallelism (Megatron's all_gather comm type), over a cp group whose member i holds chunk i
  // (with zigzag, and its mirror: backend/ops.hpp member_chunks): K and V of every member's chunks gathered to every
  // member; the fp32 dK | dV each member computed for every chunk summed into the chunk's owner's (reduce-scatter).
  cp_gather_kv, cp_scatter_dkv,
  states,      // model states (weights, gradients, master weights, moments) of the device's layers; on a
               // data-parallel collective, the gradients it reduces (Op::gradients)
};
// clang-format on
std::string_view to_string(OpCode code);

// Op's counts (chunk_count, seq_count): `count`, or InputError naming `what` outside 1 to 255.
std::uint8_t narrow_op_count(std::int32_t count, const char* what);

struct Op {
  // Coordinates only: the fields below are set by name (kv_range, optimizer_of), never by position.
  Op(OpCode code_ = OpCode::none, std::int32_t seq_ = 0, std::int32_t layer_ = -1, std::int32_t chunk_ = -1)
      : code(code_), seq(seq_ <= INT16_MAX ? static_cast<std::int16_t>(seq_) : std::int16_t{-1}), layer(layer_), chunk(chunk_) {}
  OpCode code = OpCode::none;
  // Zigzag ring attention: 0, or the number of chunks the sequence is cut into (2 x cp, at most 254), when the op
  // covers two of them, `chunk` and its mirror zigzag - 1 - chunk, and each K/V chunk with its mirror likewise
  // (the two halves a cp rank holds). The executors run it as its one-chunk ops (backend/ops.hpp chunk_ops).
  std::uint8_t zigzag = 0;
  // Ulysses' attention: 0, or the head groups the heads are split into (at most 127); the op works on head group
  // `head_group` of every query chunk up to `chunk` (its K/V chunks kv_first..kv_last). These three fit in the
  // padding after `code`.
  std::int8_t head_group = -1;
  std::uint8_t head_groups = 0;
  // The step's sequence (-1 beyond 32767: the simulator times such a step, the executors refuse it); the sequences
  // the op covers, seq .. seq + seq_count - 1 (a micro-batch of several, Op::sequences), and in each the chunks it
  // covers, chunk .. chunk + chunk_count - 1 (FPDT: an sp rank's run of the sequence's chunks, Op::chunk_run). The
  // executors run such an op as its one-chunk ops.
  std::int16_t seq = 0;
  std::uint8_t chunk_count = 1, seq_count = 1;
  std::int32_t layer = -1, chunk = -1;
  // attn, attn_bwd, kv, dkv, kv_dkv: the K/V chunks kv_first..kv_last (both included).
  std::int32_t kv_first = -1, kv_last = -1;
  // head_*: the piece's token rows [row_begin, row_end) inside the chunk.
  std::int32_t row_begin = -1, row_end = -1;
  // optimizer: the GPU whose parameters it updates (the task itself may run on its node's host); a states copy
  // (updated_weights_of): the GPU whose weights the host's optimizer updated, copied back to it.
  std::int32_t owner_gpu = -1;

  static Op kv_range(OpCode code, std::int32_t seq, std::int32_t layer, std::int32_t chunk, std::int32_t kv_first, std::int32_t kv_last) {
    Op o{code, seq, layer, chunk};
    o.kv_first = kv_first;
    o.kv_last = kv_last;
    return o;
  }
  static Op chunk_run(Op o, std::int32_t first_chunk, std::int32_t count) {
    o.chunk = first_chunk;
    o.chunk_count = narrow_op_count(count, "chunks in one op's run");
    return o;
  }
  static Op sequences(Op o, std::int32_t count) {
    o.seq_count = narrow_op_count(count, "sequences in one micro-batch");
    return o;
  }
  static Op optimizer_of(std::int32_t gpu) {
    Op o{OpCode::optimizer};
    o.owner_gpu = gpu;
    return o;
  }
  // ZeRO-Offload: the copy to GPU `gpu` of the bf16 weights its optimizer step on the host updated.
  static Op updated_weights_of(std::int32_t gpu) {
    Op o{OpCode::states};
    o.owner_gpu = gpu;
    return o;
  }
  bool is_updated_weights() const { return code == OpCode::states && owner_gpu >= 0; }
  static Op host_gradient_sum(std::int32_t layer, std::int32_t gpu) {
    Op o{OpCode::host_grad_sum, 0, layer};
    o.owner_gpu = gpu;
    return o;
  }
  // A host task that serves one GPU (its optimizer step, its gradients' sums): run by that GPU's rank.
  bool serves_gpu() const { return (code == OpCode::optimizer || code == OpCode::host_grad_sum) && owner_gpu >= 0; }
  // ZeRO-Infinity's offloaded parameters: on an H2D copy, layer `layer`'s weights from the host's copy (the groups
  // it carries, encoded as Op::gradients').
  static Op layer_weights(std::int32_t layer) { return gradients(layer, layer, false, false); }
  // A gradient reduction (OpCode::states on a collective) and the parameter groups whose gradients it carries, so
  // that executors on several ranks reduce exactly those: layers first_layer..last_layer (none when last < first),
  // the LM head's and the embedding's. Kept in the K/V range and the row fields, which states ops do not use. On a
  // D2H copy: those groups' gradients to the host's optimizer (ZeRO-Offload's offloaded gradients).
  static Op gradients(std::int32_t first_layer, std::int32_t last_layer, bool head, bool embedding) {
    Op o{OpCode::states};
    o.kv_first = first_layer;
    o.kv_last = last_layer;
    o.row_begin = head ? 1 : 0;
    o.row_end = embedding ? 1 : 0;
    return o;
  }
  // Sequence parallelism's sum of the norms' weight gradients over a TP group (OpCode::tp_sum_norms): those of
  // layers first_layer..last_layer and, with `head`, the final norm's; kept where Op::gradients keeps them.
  static Op norm_gradients(std::int32_t first_layer, std::int32_t last_layer, bool head) {
    Op o = gradients(first_layer, last_layer, head, false);
    o.code = OpCode::tp_sum_norms;
    return o;
  }
  // Ring attention's backward (attn_bwd, dkv_add, dkv_pass): a rank other than a chunk's owner keeps its share of
  // that chunk's dK | dV apart from the owner's accumulator until dkv_add brings it home. `holder_chunk`: the chunk
  // of the rank whose share this task adds to (attn_bwd, dkv_add) or sends (dkv_pass); `from_chunk`: dkv_add's
  // sender. Kept in the row fields, which these ops do not use.
  static Op ring_share(Op o, std::int32_t holder_chunk, std::int32_t from_chunk = -1) {
    o.row_begin = holder_chunk;
    o.row_end = from_chunk;
    return o;
  }
  // Which dK | dV a ring task adds to or sends, as Key::sub (0: the owner's accumulator) and which it received.
  std::int32_t dkv_share() const { return code != OpCode::states && kv_first >= 0 && row_begin >= 0 ? row_begin + 1 : 0; }
  std::int32_t dkv_received_share() const { return code == OpCode::dkv_add && row_end >= 0 ? row_end + 1 : 0; }
  // The LM head's ops and collectives under tensor parallelism: the vocabulary shards (at most 127), kept in
  // head_groups, which they do not otherwise use. 1 for any other op.
  static Op vocab_parallel(Op o, int shards) {
    o.head_groups = static_cast<std::uint8_t>(shards);
    return o;
  }
  bool is_lm_head() const {
    return (code >= OpCode::head_logits && code <= OpCode::head_wgrad) || code == OpCode::tp_sum_dnf || code == OpCode::tp_gather_xent;
  }
  int vocab_shards() const { return is_lm_head() && head_groups > 0 ? head_groups : 1; }
  bool carries_gradients() const { return code == OpCode::states && row_begin >= 0; }
  bool carries_head_gradients() const { return carries_gradients() && row_begin == 1; }
  bool carries_embedding_gradients() const { return carries_gradients() && row_end == 1; }
};
static_assert(sizeof(Op) == 9 * sizeof(std::int32_t), "Op's one-byte fields share the word after `code`");

// A task's name ("F L3 C7 attn", "H2D kv L3 C5": says what it is) lives in its graph's name arena
// (TaskGraph::name): an inline std::string per task took 32 bytes plus the heap for most names.
struct Task {
  Task() = default;
  Task(DeviceId device_, Stream stream_, bool recompute_, TaskParams params_, Op op_ = {})
      : params(std::move(params_)), op(op_), device(device_), stream(stream_), recompute(recompute_) {}

  // Laid out largest first so the record packs into 104 bytes (it is most of a graph's memory).
  TaskParams params;
  std::uint64_t name_offset = 0;  // in the graph's name arena (set by TaskGraph::add)
  Op op;                          // what it is in the model's terms, when the builder says (else code none)
  std::uint32_t name_length = 0;
  DeviceId device = 0;
  Stream stream;
  bool recompute = false;  // counted in HFU, not MFU

  TaskKind kind() const { return static_cast<TaskKind>(params.index()); }
};

// Built by schemes through this API or read from JSON (graph_json.hpp). Dependencies are kept as an edge
// list until finalize() turns them into compressed successor lists for the engine.
class TaskGraph {
 public:
  TaskId add(std::string_view name, Task task, std::span<const TaskId> deps = {});
  TaskId add(std::string_view name, Task task, std::initializer_list<TaskId> deps) {
    return add(name, std::move(task), std::span(deps.begin(), deps.size()));
  }
  void add_dependency(TaskId before, TaskId after);
  // Says what task `id` is (sim::Op); returns `id`, so a builder can tag a task as it adds it.
  TaskId set_op(TaskId id, Op op) {
    tasks_[id].op = op;
    return id;
  }
  std::int32_t add_group(std::vector<DeviceId> members);
  std::int32_t add_label(std::string label);

  // Convenience builders used by the schemes; each returns the new task's id.
  TaskId gemm(std::string_view name, DeviceId gpu, Gemm g, std::span<const TaskId> deps = {}, int stream = 0);
  TaskId attention(std::string_view name, DeviceId gpu, Attention a, std::span<const TaskId> deps = {}, int stream = 0);
  TaskId elementwise(std::string_view name, DeviceId gpu, Elementwise e, std::span<const TaskId> deps = {}, int stream = 0);
  TaskId copy(std::string_view name, DeviceId gpu, Copy c, std::span<const TaskId> deps = {});
  // Messages and collectives run on comm stream `stream` (several let pipeline sends, tensor-parallel and
  // data-parallel collectives proceed independently, as separate NCCL streams do).
  TaskId send(std::string_view name, DeviceId src, DeviceId dst, std::int64_t bytes, std::span<const TaskId> deps = {}, int stream = 0);
  TaskId collective(std::string_view name, Collective c, std::span<const TaskId> deps = {}, int stream = 0);
  TaskId alloc(std::string_view name, DeviceId device, Pool pool, std::int64_t bytes, std::string label, std::span<const TaskId> deps = {});
  TaskId free(std::string_view name, TaskId alloc, std::span<const TaskId> deps = {});

  std::size_t size() const { return tasks_.size(); }
  // Room for an estimated `tasks` tasks (the planner's estimates are within a factor of 2), with 25% to spare, so
  // that the arrays are not copied as they grow: room never written costs address space, not memory.
  void reserve(std::size_t estimated_tasks) {
    const std::size_t tasks = estimated_tasks + estimated_tasks / 4;
    tasks_.reserve(tasks);
    edges_.reserve(2 * tasks);
    names_.reserve(24 * tasks);  // names average about 20 characters
  }
  const Task& task(TaskId id) const { return tasks_[id]; }
  std::string_view name(TaskId id) const { return name_of(tasks_[id]); }
  std::string_view name_of(const Task& t) const { return {names_.data() + t.name_offset, t.name_length}; }
  Task& edit(TaskId id) { return tasks_[id]; }  // before finalize(): sizes, not deps
  std::span<const Task> tasks() const { return tasks_; }
  const std::vector<std::vector<DeviceId>>& groups() const { return groups_; }
  const std::vector<std::string>& labels() const { return labels_; }
  // Every dependency (before, after). Before finalize() in the order given; after it, by `before` (each task's
  // successors in the order given), rebuilt from the successor lists: finalize() drops the edge list, which would
  // otherwise hold 8 bytes per edge beside the lists' 4 for the whole simulation.
  std::vector<std::pair<TaskId, TaskId>> edges() const;
  // The tokens of one query chunk (Op::chunk counts chunks of this length; unchunked schemes: the sequence), set by
  // builders that annotate their tasks; 0 otherwise. The executors size every tensor from it.
  void set_chunk_tokens(std::int64_t tokens) { chunk_tokens_ = tokens; }
  std::int64_t chunk_tokens() const { return chunk_tokens_; }
  // The tokens of each sequence the step trains on (Op::seq counts sequences of this length), set beside the chunk
  // length by the same builders; 0 otherwise. The executors take token ids of exactly this length (plus the target).
  void set_sequence_tokens(std::int64_t tokens) { sequence_tokens_ = tokens; }
  std::int64_t sequence_tokens() const { return sequence_tokens_; }
  // Tensor parallelism, set by builders that annotate it: each layer's weights, the embedding and the LM head are
  // split into this many shards, GPU g holding shard g % shards (a TP group is consecutive GPUs); 1: none; 0: parts of an appended graph differ (the
  // executors refuse it).
  void set_tensor_shards(int shards) { tensor_shards_ = shards; }
  int tensor_shards() const { return tensor_shards_; }

  // Successors and predecessor counts in compressed form; valid after finalize().
  void finalize();
  bool finalized() const { return finalized_; }
  std::span<const TaskId> successors(TaskId id) const;
  std::int32_t predecessor_count(TaskId id) const { return pred_count_[id]; }

  // Bytes the graph has written, by what holds them, for the benchmarks' memory-per-task figures. The room that
  // reserve() leaves beyond them is never touched, so the process does not hold it (it is not counted).
  struct MemoryBytes {
    std::size_t task_records = 0;  // the Task vector (sizeof(Task) per task)
    std::size_t names = 0;         // the name arena: every task's name, one after another
    std::size_t edges = 0;         // the dependency list, plus the successor lists and counts once finalized
    std::size_t groups_and_labels = 0;
    std::size_t total() const { return task_records + names + edges + groups_and_labels; }
  };
  MemoryBytes memory() const;
  std::size_t memory_bytes() const { return memory().total(); }

 private:
  // The per-task arrays, in huge pages where they are large (common/huge_pages.hpp).
  HugePageVector<Task> tasks_;
  HugePageVector<char> names_;  // the tasks' names (Task::name_offset, name_length), one after another
  HugePageVector<std::pair<TaskId, TaskId>> edges_;
  std::vector<std::vector<DeviceId>> groups_;
  std::vector<std::string> labels_;
  HugePageVector<std::int32_t> succ_offset_;
  HugePageVector<TaskId> succ_;
  HugePageVector<std::int32_t> pred_count_;
  std::int64_t chunk_tokens_ = 0;
  std::int64_t sequence_tokens_ = 0;
  int tensor_shards_ = 1;
  bool finalized_ = false;
};

// Adds `from`'s tasks, groups and labels to `into` (its ids shifted by into's size before, which is returned).
TaskId append(TaskGraph& into, const TaskGraph& from);
// A copy without the tasks `drop` selects; a dropped task's successors inherit its dependencies.
TaskGraph without_tasks(const TaskGraph& graph, const std::function<bool(const Task&)>& drop);

// Stream order, the one rule the simulator (sim/engine.cpp), the CPU reference's order (backend/dataflow.cpp) and
// the executor's schedule (backend/schedule.cpp) share: every stream runs its tasks in task-id order, and a task
// occupies these streams: a collective, its stream on every member of its group; any other task with a stream,
// that stream on its own device (a send: the sender's; the receiver's side takes no stream here, the executor
// gives receives one of their own); allocations and frees, none. Calls visit(device, stream) for each.
template <typename Visit>
void for_each_occupied_stream(const TaskGraph& graph, const Task& task, Visit&& visit) {
  if (const auto* c = std::get_if<Collective>(&task.params)) {
    for (DeviceId member : graph.groups()[c->group]) visit(member, task.stream);
  } else if (task.stream.kind != StreamKind::none) {
    visit(task.device, task.stream);
  }
}

// Checks a graph against a cluster of `gpus` GPUs on `nodes` nodes: devices exist, each kind runs on a
// stream that can run it, groups are valid, frees match allocs, no cycles. Throws InputError naming
// `origin` (the graph file), the task ("tasks[12] 'F L3 C7 attn'") and what was expected.
void validate(const TaskGraph& graph, int gpus, int nodes, const std::string& origin);

}  // namespace trainyard::sim
