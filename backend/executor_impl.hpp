#pragma once
// The CUDA executor's state and its parts (executor.hpp is the interface), one file per part:
//   - executor.cpp: the step, from the schedule to the measured timeline: submission, the tasks' dispatch and the
//     compute ops (device_ops.hpp);
//   - executor_exchanges.cpp: what goes between ranks: gradient reductions, Ulysses' head all-to-alls, tensor
//     parallelism's sums and gathers, all-gather context parallelism, sends;
//   - executor_states.cpp: the model states: the device's arenas and parameters, the host optimizer's and
//     ZeRO's offloaded copies, FPDT's staging, upload and download.
// Internal to backend/: nothing outside the executor's files includes it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "backend/dataflow.hpp"
#include "backend/device.hpp"
#include "backend/device_ops.hpp"
#include "backend/executor.hpp"
#include "backend/parameter_groups.hpp"
#include "backend/schedule.hpp"
#include "common/error.hpp"
#include "common/units.hpp"

namespace trainyard::backend {

// A parameter group's gradients in one buffer, its parameters' one after another in ModelState's order, so that a
// reduction of the group (one task of the graph) is one all-reduce, as frameworks reduce a bucket.
struct GroupGradients {
  float* grad = nullptr;
  float* last_sum = nullptr;  // a group reduced several times a step: its last reduced gradient (else null)
  std::int64_t n = 0;
  // The optimizer on the host (ZeRO-Offload): the gradients copied out, the updated weights to copy back (pinned).
  float* host_grad = nullptr;
  bf16_bits* host_weight = nullptr;
};

struct Executor::Impl {
  Device& dev;
  const sim::TaskGraph& g;
  model::ModelConfig full;    // the plan's model
  model::ModelConfig m;       // what this rank's tensors and weights hold: the model, or its tensor-parallel shard
  int shards = 1, shard = 0;  // tensor parallelism: this rank holds shard `shard` of `shards`
  // Sequence parallelism (its all-gathers carry ops): between the TP regions this rank holds rows
  // [shard * chunk_tokens / shards, (shard + 1) * chunk_tokens / shards) of each chunk. Its tensors keep the chunk's full size; the ops
  // there (norms, residuals and their backwards, the final norm's) touch only those rows.
  bool sequence_parallel = false;
  // Tensor parallelism: per shard index, per parameter (ModelState::all() order), that shard of it.
  std::vector<std::vector<ShardLayout>> shard_layouts;
  std::int64_t chunk_tokens;  // the graph's (TaskGraph::chunk_tokens)
  int gpn;
  ExecutorOptions opt;
  RankSchedule sched;
  DataflowPlan flow;
  std::vector<int> step_at;                           // per position in sched.order: index into sched.submissions, or -1 (allocations, frees)
  std::vector<std::vector<sim::TaskId>> reuse_waits;  // per position: tasks to wait for before reusing bytes

  std::vector<int> streams;     // the device's stream per schedule slot
  std::vector<int> begin, end;  // per task id: the device's events (-1 for tasks without a stream)
  int origin = -1;
  void* arena = nullptr;
  void* pinned = nullptr;
  // FPDT's streamed buffers (sim::OpCode::fpdt_buffers): pinned staging for the largest copy out and in.
  void* fpdt_out = nullptr;
  void* fpdt_in = nullptr;

  std::vector<DeviceParameter> params;                  // ModelState::all() order
  std::map<int, std::vector<int>> groups;               // optimizer group -> params
  std::map<int, GroupGradients> group_gradients;        // optimizer group -> its gradients
  std::set<int> owned;                                  // the groups this rank updates
  bool host_optimizer = false;                          // this rank's optimizer step runs on the host (ZeRO-Offload)
  std::set<std::pair<int, std::vector<int>>> repeated;  // (group, ranks) reduced more than once a step
  std::set<int> reduced_once;                           // during a step: the groups (of repeated groups) reduced so far
  std::set<int> gradients_on_host;                      // during a step: the groups whose gradients a copy took to the host
  std::set<int> weights_from_host;                      // during a step: the streamed groups whose weights a copy brought in
  std::set<int> streamed;                               // groups whose weights are copied in from the host when used (ZeRO-Infinity)
  std::vector<int> layer_param;                         // layer * kLayerWeights + LayerWeight: index into params
  int embedding = -1, final_norm = -1, lm_head = -1;
  std::int32_t* tokens = nullptr;
  std::int64_t tokens_capacity = 0, losses_capacity = 0;
  int sequences = 0;        // the graph's sequences (largest op.seq + op.seq_count)
  float* losses = nullptr;  // per token of the step
  float* dloss = nullptr;   // 1 / tokens, one per row of a chunk
  std::int64_t states_bytes = 0;

  Impl(Device& device, const sim::TaskGraph& graph, ModelState& shapes, int gpus_per_node, std::span<const sim::TaskTiming> predicted,
       const ExecutorOptions& options)
      : dev(device), g(graph), full(shapes.model()), m(shapes.model()), chunk_tokens(graph.chunk_tokens()), gpn(gpus_per_node), opt(options) {
    refuse_what_is_not_written();
    if (g.tensor_shards() > 1) {
      shards = g.tensor_shards();
      shard = rank() % shards;
      m = tensor_shard(full, shards);
      for (int k = 0; k < shards; ++k) shard_layouts.push_back(tensor_shard_layouts(full, shards, k));
      const auto& tasks = g.tasks();
      sequence_parallel = std::any_of(tasks.begin(), tasks.end(), [](const sim::Task& t) { return t.op.code == sim::OpCode::tp_gather_n1; });
    }
    if (chunk_tokens <= 0)
      throw InputError("the plan's task graph", "chunk length", "one chunk length for the whole graph (set by its builder)", "none");
    for (const sim::Task& t : g.tasks()) sequences = std::max(sequences, t.op.seq + t.op.seq_count);
    sched = make_schedule(g, rank(), gpn, predicted);
    flow = plan_dataflow(g, sched.order, m, gpn, ranks() > 1 ? rank() : -1);
    std::map<sim::TaskId, int> step_of;
    for (std::size_t i = 0; i < sched.submissions.size(); ++i) step_of[sched.submissions[i].task] = static_cast<int>(i);
    for (sim::TaskId t : sched.order) {
      const auto it = step_of.find(t);
      step_at.push_back(it == step_of.end() ? -1 : it->second);
    }
    for (std::size_t pos = 0; pos < sched.order.size(); ++pos) reuse_waits.push_back(reused_bytes_owners(flow.steps[pos], static_cast<int>(pos)));
    find_owned_groups();
    for (const sim::Task& t : g.tasks()) {
      if (sim::is_host(t.device) && t.op.code == sim::OpCode::optimizer && (ranks() == 1 || t.op.owner_gpu == rank())) host_optimizer = true;
      if (const auto* copy = std::get_if<sim::Copy>(&t.params); copy && copy->direction == sim::Copy::Direction::h2d && t.op.carries_gradients()) {
        for (int gid : carried_groups(t.op)) streamed.insert(gid);
      }
    }
    prepare_communicator();
    try {
      allocate(shapes);
    } catch (...) {
      release_all();  // the destructor does not run for a constructor that throws
      throw;
    }
  }

  ~Impl() { release_all(); }

  // Errors are ignored here: it runs from the destructor and while an error is already on its way up.
  void release_all() {
    try {
      dev.synchronize();
    } catch (...) {  // the step's error has been reported, or is on its way up
    }
    for (auto& p : params) {
      dev.release(p.weight);
      for (void* ptr : {static_cast<void*>(p.master), static_cast<void*>(p.m), static_cast<void*>(p.v)}) {
        host_optimizer ? dev.release_pinned(ptr) : dev.release(ptr);
      }
    }
    for (auto& [gid, buffer] : group_gradients) {
      dev.release(buffer.grad);
      dev.release(buffer.last_sum);
      dev.release_pinned(buffer.host_grad);
      dev.release_pinned(buffer.host_weight);
    }
    dev.release(tokens);
    dev.release(losses);
    dev.release(dloss);
    dev.release(arena);
    dev.release_pinned(pinned);
    dev.release_pinned(fpdt_out);
    dev.release_pinned(fpdt_in);
  }

  int ranks() const { return opt.comm != nullptr ? opt.comm->size() : 1; }
  int rank() const { return opt.comm != nullptr ? opt.comm->rank() : 0; }
  std::vector<int> all_ranks() const {
    std::vector<int> r(static_cast<std::size_t>(ranks()));
    for (int i = 0; i < ranks(); ++i) r[static_cast<std::size_t>(i)] = i;
    return r;
  }

  // The parameter groups this rank updates: those whose forward runs on its GPU (every group on one rank).
  // And the groups reduced more than once a step (the reductions are the same on every rank).
  void find_owned_groups();

  // Every rank creates the step's sub-communicators at once, before anything waits on them (MPI cannot bound that).
  void prepare_communicator();

  // A gradient reduction: the groups it carries (sim::Op::gradients), summed over its members' ranks. A group
  // reduced again over the same ranks later in the step (ZeRO-2/3 reduce every micro-batch) holds the last sum S
  // on every member, to which each added its own new share: the share alone (gradient - S) is summed and S added
  // back, then kept as the new S (the CPU reference does the same arithmetic). Over other ranks (tied embeddings'
  // first and last stage) the values themselves are summed.
  void reduce_gradients(const sim::Task& t, int stream);

  // The mean loss over the step's tokens: each rank's written rows (the others stay NaN), summed over the ranks.
  double step_loss(const std::vector<float>& loss) const;

  void refuse_what_is_not_written() const;

  template <typename T>
  T* device_alloc(std::int64_t count) {
    const std::int64_t bytes = std::max<std::int64_t>(count, 1) * static_cast<std::int64_t>(sizeof(T));
    void* p = dev.allocate(bytes);
    states_bytes += bytes;
    return static_cast<T*>(p);
  }

  // Master weights and moments: in HBM, or in pinned host memory where the optimizer runs on the host.
  float* optimizer_alloc(std::int64_t count);
  // Copies between the host and a state buffer, which is in pinned host memory or on the device.
  void put(void* state, const void* host, std::int64_t bytes, bool in_host_memory) const;
  void get(void* host, const void* state, std::int64_t bytes, bool in_host_memory) const;

  void allocate(ModelState& shapes);

  // --- the step ------------------------------------------------------------------------------------------------
  TensorMemory memory() const { return {&flow, arena, pinned}; }
  void* where(int instance) const { return memory().at(instance); }

  // A layer's parameters, in ModelState's per-layer order.
  const DeviceParameter& layer(int l, LayerWeight w) const { return params[layer_param[l * kLayerWeights + static_cast<int>(w)]]; }

  MeasuredStep run(std::span<const std::vector<std::int32_t>> token_ids, int optimizer_step);

  // The step's token ids, flat, checked here because a kernel would read or write out of bounds instead (the CPU
  // reference checks the same); with tensor parallelism in this rank's vocabulary shard, -1 for another's (the
  // embedding gives a zero row, the loss no target logit; kernels/reference.hpp).
  std::vector<std::int32_t> checked_tokens(std::span<const std::vector<std::int32_t>> token_ids, std::int64_t seq_len) const;

  // The token ids and the loss's per-row weights on the device, the losses NaN (a row no task wrote shows), the
  // gradients zero, the step's bookkeeping cleared; then every rank's origin as close together as one barrier's exit.
  void prepare_step(const std::vector<std::int32_t>& flat, std::int64_t total);

  // Everything starts after `origin`; then the schedule, step by step, each between its begin and end events.
  void submit_schedule(std::int64_t seq_len, int optimizer_step);

  // The finished step: each task's times from its events (the step starts at its first task), the loss, the memory.
  MeasuredStep collect(std::int64_t total);

  // A tensor taking bytes an earlier tensor held waits until every task that touched the earlier one is done
  // (planned once: the same for every step).
  std::vector<sim::TaskId> reused_bytes_owners(const TaskTensors& tensors, int pos) const;

  template <typename T>
  T* scratch(std::int64_t count, int stream) const {
    return static_cast<T*>(dev.scratch(stream, count * static_cast<std::int64_t>(sizeof(T))));
  }
  void release(void* p, int stream) const { dev.release_scratch(stream, p); }

  void execute(sim::TaskId id, const TaskTensors& t, int stream, std::int64_t seq_len, int optimizer_step, std::set<int>& updated_groups);

  // ZeRO-Offload's gradients out to the host's optimizer step (D2H), or ZeRO-Infinity's and ring-track's streamed
  // weights in from the host's copy (H2D), of the groups the copy carries. The weights stay resident on the device as
  // well: HBM holds more than the plan counts. Only a group's first copy in a step writes them: every use of the
  // layer follows it (its gathers and visits are chained), while a later one (the backward's gather, the next
  // chunk's visit) could overwrite them, with the same values, while an earlier use still reads them; a later copy
  // moves the same bytes into scratch instead, so the copy engine carries what the plan moves, at its time.
  void copy_offloaded_states(const sim::Copy& copy, const sim::Op& op, int stream);

  // ZeRO-Offload: the weights the host's optimizer step updated, back to the device (the groups this rank owns but
  // those copied in from the host whenever they are used).
  void copy_updated_weights(int stream);

  void allocate_fpdt_staging();

  // FPDT's streamed buffers: the tensors stay in HBM (their values are the executor's tensors), and the copy carries
  // its bytes between scratch and the pinned staging buffer of its direction, so the copy engine does the plan's work.
  void stream_fpdt_buffers(const sim::Copy& copy, int stream);

  // Ulysses' all-to-all over the task's group (the dataflow's order: per tensor, what this rank sends, then what
  // it receives, by member and chunk). To head groups, each member's block is packed from its columns of this
  // rank's chunks' rows; back, each block received is unpacked into them. A member holding two chunks (zigzag)
  // sends and receives both in one block, copied out of and into their tensors; one chunk goes as it is.
  void exchange_heads(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream);

  // Tensor parallelism's collectives over the task's group, in place: partial sums of bf16 activations all-reduced,
  // or with sequence parallelism reduce-scattered to each member's rows (the LM head's pieces, whose rows do not
  // split by member, all-reduced); all-gathers (the loss's statistics, [shard][2][rows] fp32; sequence
  // parallelism's rows) as an all-to-all sending each member this rank's block, each member's block at its index.
  void tensor_parallel(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream);
  // Sequence parallelism's reduce-scatter of a bf16 [rows][width] partial sum: member k's block of rows to member k
  // (one all-to-all), the blocks received added into this rank's own rows; the other rows stay partial.
  void reduce_scatter_rows(char* base, std::int64_t bytes, const std::vector<int>& ranks, sim::TaskId id, int stream);
  // Sequence parallelism: the norms' weight gradients, each rank's over its own rows, summed over the TP group.
  void sum_norm_gradients(const sim::Op& op, const std::vector<int>& ranks, int stream);
  // All-gather context parallelism over the task's cp group, as one all-to-all (the dataflow's order: the
  // gather's own K, V then every other member's; the reduce-scatter's dK | dV for every other member, then its own).
  // Gather: this rank's tensors packed into one block sent to every member, each member's block unpacked into its
  // chunks' K and V. Reduce-scatter: each member's chunks' dK | dV packed and sent to it, each block received added
  // into this rank's own.
  void cp_exchange(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream);

  std::vector<int> group_ranks(const sim::Task& task) const;

  // A send between ranks, on its sender (this rank's side of each (source, destination) pair) or its receiver:
  // one message under the task's id.
  void exchange(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream);

  // One chunk (pair) of a compute task, through its op's function (device_ops.hpp).
  void compute(const sim::Op& op, const OpTensors& t, int stream, std::int64_t seq_len);

  // --- states between host and device ----------------------------------------------------------------------------
  // The elements of parameter i (ModelState::all() order) this rank holds: all, or its tensor-parallel shard's.
  std::int64_t held_elements(std::size_t i, const Parameter& p) const;
  // This rank's values of a whole parameter: the whole itself, or its shard's, taken into `part`.
  std::span<const float> mine(std::size_t i, const std::vector<float>& whole, std::vector<float>& part) const;
  // A whole parameter `out` from this rank's values, which `read` writes to the pointer it is given: read straight
  // into it, or under tensor parallelism every shard's all-gathered over the TP group (whose member k holds shard
  // k), so that every rank has the whole model.
  template <typename Read>
  void whole(std::size_t i, std::vector<float>& out, Read&& read) const {
    if (shards == 1) return read(out.data());
    std::vector<float> values(static_cast<std::size_t>(params[i].n));
    read(values.data());
    std::vector<int> group(static_cast<std::size_t>(shards));
    for (int k = 0; k < shards; ++k) group[static_cast<std::size_t>(k)] = rank() - shard + k;
    const std::vector<float> every = opt.comm->all_gather(group, values);
    for (int k = 0; k < shards; ++k) {
      put_shard(shard_layouts[static_cast<std::size_t>(k)][i], std::span(every).subspan(static_cast<std::size_t>(k) * values.size(), values.size()),
                out);
    }
  }

  void upload(const ModelState& state);

  void download(ModelState& state) const;
};

}  // namespace trainyard::backend
