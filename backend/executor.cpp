#include "backend/executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "backend/dataflow.hpp"
#include "backend/device.hpp"
#include "backend/device_ops.hpp"
#include "backend/parameter_groups.hpp"
#include "backend/schedule.hpp"
#include "common/error.hpp"
#include "common/units.hpp"

namespace trainyard::backend {

namespace {

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

}  // namespace

namespace {

// What the executor needs of one task on `ranks` ranks: {expected, found}, or nothing when it runs it.
std::optional<std::pair<std::string, std::string>> task_refusal(const sim::Task& t, int ranks) {
  const bool memory = t.kind() == sim::TaskKind::alloc || t.kind() == sim::TaskKind::free;
  if (ranks == 1 && (t.device > 0 || t.kind() == sim::TaskKind::p2p || t.kind() == sim::TaskKind::collective)) {
    return std::pair{"a step on one GPU (or, under mpirun, one rank per GPU)", "a task of several GPUs"};
  }
  if (t.kind() == sim::TaskKind::collective && t.op.code != sim::OpCode::states && !is_heads_exchange(t.op.code) &&
      !is_tensor_parallel_collective(t.op.code) && t.op.code != sim::OpCode::cp_gather_kv && t.op.code != sim::OpCode::cp_scatter_dkv) {
    return std::pair{
        "collectives of gradients or model states, Ulysses' all-to-alls, tensor parallelism's sums and gathers or "
        "all-gather context parallelism's exchanges",
        "a collective on activations"};
  }
  if (sim::is_host(t.device) && !memory && t.op.code != sim::OpCode::optimizer && t.op.code != sim::OpCode::host_grad_sum) {
    return std::pair{"GPU tasks, the host's optimizer step or its sums of streamed gradients", "a host task of another kind"};
  }
  const bool offloaded_states = t.kind() == sim::TaskKind::copy && (t.op.is_updated_weights() || t.op.carries_gradients());
  if (t.op.code == sim::OpCode::states && (t.kind() == sim::TaskKind::copy || t.kind() == sim::TaskKind::p2p) && !offloaded_states) {
    return std::pair{
        "copies of model states that say which (the weights a host optimizer step updated, a layer's gradients out to it or "
        "its weights in from it)",
        "a copy of model states"};
  }
  if (t.op.code != sim::OpCode::none && t.op.seq < 0) return std::pair{"a step of at most 32767 sequences", "a task of a later one"};
  if (t.op.code == sim::OpCode::none && !memory) {
    return std::pair{"a task the executor can run (a builder that annotates its tasks: ring-track, Megatron, ZeRO)", "a task without an op"};
  }
  return std::nullopt;
}

}  // namespace

// Tensor parallelism as the executor shards it: GPU g holds shard g % shards, so every TP collective's group is
// `shards` consecutive GPUs from a multiple of it (not a symmetry-reduced group standing for more ranks).
std::optional<std::string> tensor_parallel_refusal(const sim::TaskGraph& g, const sim::Task& t) {
  if (!is_tensor_parallel_collective(t.op.code)) return std::nullopt;
  const auto& c = std::get<sim::Collective>(t.params);
  const auto& members = g.groups()[c.group];
  bool consecutive = c.ring_ranks == 0 && static_cast<int>(members.size()) == g.tensor_shards() && members.front() % g.tensor_shards() == 0;
  for (std::size_t k = 0; k < members.size() && consecutive; ++k) consecutive = members[k] == members.front() + static_cast<int>(k);
  if (consecutive) return std::nullopt;
  return "a group of " + std::to_string(members.size()) + " GPUs from gpu" + std::to_string(members.front()) +
         (c.ring_ranks > 0 ? " standing for " + std::to_string(c.ring_ranks) : std::string{});
}

std::optional<ExecutorRefusal> executor_refusal(const sim::TaskGraph& g, int ranks) {
  if (g.tensor_shards() < 1) {
    return ExecutorRefusal{"the task graph", "one tensor-parallel size for the whole graph", "parts with different sizes"};
  }
  int gpus = 0;
  for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(g.size()); ++id) {
    const sim::Task& t = g.task(id);
    const std::string what = "task " + std::to_string(id) + " '" + std::string(g.name(id)) + "'";
    if (!sim::is_host(t.device)) gpus = std::max(gpus, t.device + 1);
    if (const auto refusal = task_refusal(t, ranks)) return ExecutorRefusal{what, refusal->first, refusal->second};
    if (const auto found = tensor_parallel_refusal(g, t)) {
      return ExecutorRefusal{what, "tensor parallelism over " + std::to_string(g.tensor_shards()) + " consecutive GPUs, every rank built", *found};
    }
  }
  if (ranks > 1 && gpus != ranks) {
    return ExecutorRefusal{"mpirun", std::to_string(gpus) + " ranks (-np), one per GPU of the plan", std::to_string(ranks) + " ranks"};
  }
  // Gradients offloaded or weights streamed from the host go to and come from the host's optimizer step's buffers.
  const auto& tasks = g.tasks();
  const bool host_step = std::any_of(tasks.begin(), tasks.end(),
                                     [](const sim::Task& t) { return sim::is_host(t.device) && t.op.code == sim::OpCode::optimizer; });
  for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(g.size()) && !host_step; ++id) {
    const sim::Task& t = g.task(id);
    if (t.kind() == sim::TaskKind::copy && t.op.carries_gradients()) {
      return ExecutorRefusal{"task " + std::to_string(id) + " '" + std::string(g.name(id)) + "'",
                             "offloaded gradients or weights with the optimizer step on the host", "no optimizer step on the host"};
    }
  }
  return std::nullopt;
}

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
  std::vector<int> layer_param;                         // layer * 6 + k: index into params (norm1, wqkv, wo, norm2, wup, wdown)
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
  void find_owned_groups() {
    for (const auto& [group, owners] : forward_owners(g)) {
      if (ranks() == 1 || owners.count(rank())) owned.insert(group);
    }
    std::set<std::pair<int, std::vector<int>>> seen;
    for (const sim::Task& t : g.tasks()) {
      if (t.kind() != sim::TaskKind::collective) continue;
      for (int group : carried_groups(t.op)) {
        if (auto key = std::pair{group, reduction_ranks(g, t)}; !seen.insert(key).second) repeated.insert(std::move(key));
      }
    }
  }

  // Every rank creates the step's sub-communicators at once, before anything waits on them (MPI cannot bound that).
  void prepare_communicator() {
    if (ranks() <= 1) return;
    std::vector<std::vector<int>> sets{all_ranks()};  // the loss's sum
    for (auto& reduction : reduction_groups(g)) sets.push_back(std::move(reduction));
    for (const sim::Task& t : g.tasks()) {  // tensor parallelism's sums
      if (t.kind() == sim::TaskKind::collective && is_tensor_parallel_collective(t.op.code)) sets.push_back(group_ranks(t));
    }
    opt.comm->prepare_groups(sets);
    dev.prepare_peers(*opt.comm, sets, opt.comm_timeout);
  }

  // A gradient reduction: the groups it carries (sim::Op::gradients), summed over its members' ranks. A group
  // reduced again over the same ranks later in the step (ZeRO-2/3 reduce every micro-batch) holds the last sum S
  // on every member, to which each added its own new share: the share alone (gradient - S) is summed and S added
  // back, then kept as the new S (the CPU reference does the same arithmetic). Over other ranks (tied embeddings'
  // first and last stage) the values themselves are summed.
  void reduce_gradients(const sim::Task& t, int stream) {
    const std::vector<int> over = reduction_ranks(g, t);
    if (!std::binary_search(over.begin(), over.end(), rank())) return;
    for (int gid : carried_groups(t.op)) {
      const GroupGradients& b = group_gradients.at(gid);
      gradients_on_host.erase(gid);  // a copy out before the sum took the rank's own: the optimizer copies the sum
      if (!repeated.count({gid, over})) {
        dev.all_reduce_sum(stream, *opt.comm, over, b.grad, b.n);
        continue;
      }
      const bool first = reduced_once.insert(gid).second;
      if (!first) dev.axpy_f32(stream, b.n, -1.0f, b.last_sum, b.grad);
      dev.all_reduce_sum(stream, *opt.comm, over, b.grad, b.n);
      if (!first) dev.axpy_f32(stream, b.n, 1.0f, b.last_sum, b.grad);
      dev.copy(stream, b.last_sum, b.grad, b.n * static_cast<std::int64_t>(sizeof(float)));
    }
  }

  // The mean loss over the step's tokens: each rank's written rows (the others stay NaN), summed over the ranks.
  double step_loss(const std::vector<float>& loss) const {
    double sums[2] = {0, 0};
    for (float l : loss) {
      if (!std::isnan(l)) sums[0] += l, sums[1] += 1;
    }
    if (ranks() > 1) opt.comm->all_reduce_sum(all_ranks(), sums);
    for (double& s : sums) s /= shards;  // every rank of a TP group wrote the same rows
    const auto total = static_cast<double>(loss.size());
    if (!std::isfinite(sums[0]) || sums[1] != total) {
      throw InternalError("the step's loss is not finite or not whole: " + std::to_string(static_cast<std::int64_t>(sums[1])) + " of " +
                              std::to_string(loss.size()) + " tokens' losses written (one never written, or the step diverged)",
                          __FILE__, __LINE__);
    }
    return sums[0] / total;
  }

  void refuse_what_is_not_written() const {
    if (const std::string needs = dev.refuses_head_dim(m.head_dim); !needs.empty()) {
      throw InputError("the plan's model", "head_dim", needs, std::to_string(m.head_dim));
    }
    if (const auto refusal = executor_refusal(g, ranks()))
      throw InputError("the plan's task graph", refusal->task, refusal->expected, refusal->found);
    if (const auto group = ranks() > 1 ? unreduced_shared_group(g, m) : std::nullopt) {
      throw InputError("the plan's task graph", group_name(*group), "a gradient reduction over the GPUs that use it, to run on several ranks",
                       "none");
    }
  }

  template <typename T>
  T* device_alloc(std::int64_t count) {
    const std::int64_t bytes = std::max<std::int64_t>(count, 1) * static_cast<std::int64_t>(sizeof(T));
    void* p = dev.allocate(bytes);
    states_bytes += bytes;
    return static_cast<T*>(p);
  }

  // Master weights and moments: in HBM, or in pinned host memory where the optimizer runs on the host.
  float* optimizer_alloc(std::int64_t count) {
    if (!host_optimizer) return device_alloc<float>(count);
    return static_cast<float*>(dev.allocate_pinned(std::max<std::int64_t>(count, 1) * static_cast<std::int64_t>(sizeof(float))));
  }
  // Copies between the host and a state buffer, which is in pinned host memory or on the device.
  void put(void* state, const void* host, std::int64_t bytes, bool in_host_memory) const {
    in_host_memory ? static_cast<void>(std::memcpy(state, host, static_cast<std::size_t>(bytes))) : dev.upload(state, host, bytes);
  }
  void get(void* host, const void* state, std::int64_t bytes, bool in_host_memory) const {
    in_host_memory ? static_cast<void>(std::memcpy(host, state, static_cast<std::size_t>(bytes))) : dev.download(host, state, bytes);
  }

  void allocate(ModelState& shapes) {
    // The states, in ModelState's layout and order.
    std::int64_t state_bytes_needed = 0;
    const std::int64_t last_sum_bytes = repeated.empty() ? 0 : 4;     // at most: every parameter's last reduced gradient
    const std::int64_t optimizer_bytes = host_optimizer ? 0 : 3 * 4;  // master weights and moments, unless on the host
    const auto all = shapes.all();
    for (std::size_t i = 0; i < all.size(); ++i) state_bytes_needed += held_elements(i, *all[i]) * (2 + 4 + optimizer_bytes + last_sum_bytes);
    const std::int64_t free_bytes = dev.free_bytes();
    const std::int64_t workspaces = static_cast<std::int64_t>(sched.streams.size()) * dev.per_stream_bytes();
    const std::int64_t needed = state_bytes_needed + flow.device_arena_bytes + workspaces;
    if (needed > free_bytes) {
      throw InputError("the plan", "device memory", "at most " + format_bytes(static_cast<double>(free_bytes)) + " (free on " + dev.name() + ")",
                       format_bytes(static_cast<double>(needed)) + ": " + format_bytes(static_cast<double>(flow.device_arena_bytes)) +
                           " of tensors, " + format_bytes(static_cast<double>(state_bytes_needed)) + " of model states and " +
                           format_bytes(static_cast<double>(workspaces)) + " of GEMM workspaces");
    }
    for (std::size_t i = 0; i < all.size(); ++i) {
      const Parameter* p = all[i];
      DeviceParameter d;
      d.name = p->name;
      d.n = held_elements(i, *p);
      d.decays = p->decays;
      d.weight = device_alloc<bf16_bits>(d.n);
      d.master = optimizer_alloc(d.n);
      d.m = optimizer_alloc(d.n);
      d.v = optimizer_alloc(d.n);
      params.push_back(std::move(d));
    }
    // Index the parameters by their place in the model (ModelState's names: "L3 wqkv", "embedding", ...).
    auto index_of = [&](const Parameter& p) { return static_cast<int>(std::find(all.begin(), all.end(), &p) - all.begin()); };
    for (const auto& layer : shapes.layers()) {
      for (const Parameter* p : {&layer.norm1, &layer.wqkv, &layer.wo, &layer.norm2, &layer.wup, &layer.wdown}) layer_param.push_back(index_of(*p));
    }
    embedding = index_of(shapes.embedding());
    final_norm = index_of(shapes.final_norm());
    lm_head = index_of(shapes.lm_head());
    std::vector<int> group_ids = {kEmbeddingGroup, kHeadGroup};
    for (int l = 0; l < static_cast<int>(m.layers); ++l) group_ids.push_back(l);
    for (int gid : group_ids) {
      for (Parameter* p : shapes.group(gid)) groups[gid].push_back(index_of(*p));
    }
    for (const auto& [gid, members] : groups) {
      GroupGradients& b = group_gradients[gid];
      for (int p : members) b.n += params[p].n;
      b.grad = device_alloc<float>(b.n);
      const bool reduced_again = std::any_of(repeated.begin(), repeated.end(), [gid = gid](const auto& r) { return r.first == gid; });
      if (reduced_again) b.last_sum = device_alloc<float>(b.n);
      if (host_optimizer) {
        b.host_grad = static_cast<float*>(dev.allocate_pinned(b.n * static_cast<std::int64_t>(sizeof(float))));
        b.host_weight = static_cast<bf16_bits*>(dev.allocate_pinned(b.n * static_cast<std::int64_t>(sizeof(bf16_bits))));
      }
      std::int64_t offset = 0;
      for (int p : members) {
        params[p].grad = b.grad + offset;
        if (b.last_sum) params[p].last_sum = b.last_sum + offset;
        if (b.host_grad) params[p].host_grad = b.host_grad + offset, params[p].host_weight = b.host_weight + offset;
        params[p].weights_on_host = b.host_weight != nullptr && streamed.count(gid) > 0;
        offset += params[p].n;
      }
    }
    losses = device_alloc<float>(1);  // sized per step
    dloss = device_alloc<float>(chunk_tokens);

    arena = dev.allocate(flow.device_arena_bytes);
    pinned = dev.allocate_pinned(flow.host_bytes);
    allocate_fpdt_staging();
    for (std::size_t s = 0; s < sched.streams.size(); ++s) {
      streams.push_back(dev.create_stream());
      states_bytes += dev.per_stream_bytes();
    }
    begin.assign(g.size(), -1);
    end.assign(g.size(), -1);
    for (const Submission& s : sched.submissions) {
      begin[s.task] = dev.create_event();
      end[s.task] = dev.create_event();
    }
    origin = dev.create_event();
  }

  // --- the step ------------------------------------------------------------------------------------------------
  TensorMemory memory() const { return {&flow, arena, pinned}; }
  void* where(int instance) const { return memory().at(instance); }

  // A layer's parameters, in ModelState's per-layer order.
  const DeviceParameter& layer(int l, LayerWeight w) const { return params[layer_param[l * kLayerWeights + static_cast<int>(w)]]; }

  MeasuredStep run(std::span<const std::vector<std::int32_t>> token_ids, int optimizer_step) {
    TRAINYARD_CHECK(!token_ids.empty(), "a step has at least one sequence");
    const std::int64_t seq_len = static_cast<std::int64_t>(token_ids.front().size()) - 1;
    const std::int64_t total = seq_len * static_cast<std::int64_t>(token_ids.size());
    prepare_step(checked_tokens(token_ids, seq_len), total);  // before the step's timing starts
    submit_schedule(seq_len, optimizer_step);
    dev.synchronize();
    return collect(total);
  }

  // The step's token ids, flat, checked here because a kernel would read or write out of bounds instead (the CPU
  // reference checks the same); with tensor parallelism in this rank's vocabulary shard, -1 for another's (the
  // embedding gives a zero row, the loss no target logit; kernels/reference.hpp).
  std::vector<std::int32_t> checked_tokens(std::span<const std::vector<std::int32_t>> token_ids, std::int64_t seq_len) const {
    if (static_cast<int>(token_ids.size()) != sequences) {
      throw InputError("the step's tokens", "sequences", std::to_string(sequences) + " (the graph's)", std::to_string(token_ids.size()));
    }
    check_sequence_length(g, seq_len);
    std::vector<std::int32_t> flat;
    for (const auto& s : token_ids) {
      TRAINYARD_CHECK(static_cast<std::int64_t>(s.size()) == seq_len + 1, "every sequence has seq_len + 1 tokens");
      for (std::int32_t id : s) {
        if (id < 0 || id >= full.vocab)
          throw InputError("the step's tokens", "token id", "0 to " + std::to_string(full.vocab - 1), std::to_string(id));
      }
      flat.insert(flat.end(), s.begin(), s.end());
    }
    for (std::int32_t& id : flat) id = shards == 1 ? id : id / m.vocab == shard ? static_cast<std::int32_t>(id % m.vocab) : -1;
    return flat;
  }

  // The token ids and the loss's per-row weights on the device, the losses NaN (a row no task wrote shows), the
  // gradients zero, the step's bookkeeping cleared; then every rank's origin as close together as one barrier's exit.
  void prepare_step(const std::vector<std::int32_t>& flat, std::int64_t total) {
    const auto flat_bytes = static_cast<std::int64_t>(flat.size() * sizeof(std::int32_t));
    if (static_cast<std::int64_t>(flat.size()) > tokens_capacity) {
      dev.release(tokens);
      tokens = nullptr;
      tokens = static_cast<std::int32_t*>(dev.allocate(flat_bytes));
      tokens_capacity = static_cast<std::int64_t>(flat.size());
    }
    const auto loss_bytes = total * static_cast<std::int64_t>(sizeof(float));
    if (total > losses_capacity) {
      dev.release(losses);
      losses = nullptr;
      losses = static_cast<float*>(dev.allocate(loss_bytes));
      losses_capacity = total;
    }
    dev.upload(tokens, flat.data(), flat_bytes);
    const std::vector<float> weights(static_cast<std::size_t>(chunk_tokens), 1.0f / static_cast<float>(total));
    dev.upload(dloss, weights.data(), static_cast<std::int64_t>(weights.size() * sizeof(float)));
    dev.fill(losses, 0xFF, loss_bytes);
    for (const auto& p : params) dev.fill(p.grad, 0, p.n * static_cast<std::int64_t>(sizeof(float)));
    reduced_once.clear();
    gradients_on_host.clear();
    weights_from_host.clear();
    dev.reset_scratch_peak();
    dev.synchronize();
    if (ranks() > 1) opt.comm->barrier();
  }

  // Everything starts after `origin`; then the schedule, step by step, each between its begin and end events.
  void submit_schedule(std::int64_t seq_len, int optimizer_step) {
    dev.record(origin, streams.front());
    for (std::size_t s = 1; s < streams.size(); ++s) dev.wait(streams[s], origin);
    std::set<int> updated_groups;
    for (std::size_t pos = 0; pos < sched.order.size(); ++pos) {
      if (step_at[pos] < 0) continue;  // allocations and frees: their waits pass to the tasks after them
      const Submission& step = sched.submissions[step_at[pos]];
      const TaskTensors& tensors = flow.steps[pos];
      const int stream = streams[step.slot];
      for (sim::TaskId w : step.waits) dev.wait(stream, end[w]);
      for (sim::TaskId w : reuse_waits[pos]) dev.wait(stream, end[w]);
      const sim::TaskId id = step.task;
      dev.record(begin[id], stream);
      for (int inst : tensors.zero_first) dev.fill(stream, where(inst), 0, flow.instances[inst].bytes);
      execute(id, tensors, stream, seq_len, optimizer_step, updated_groups);
      dev.record(end[id], stream);
    }
  }

  // The finished step: each task's times from its events (the step starts at its first task), the loss, the memory.
  MeasuredStep collect(std::int64_t total) {
    MeasuredStep r;
    r.tokens = total;
    r.timing.assign(g.size(), {});
    std::int64_t first = -1, last = 0;
    for (const Submission& s : sched.submissions) {
      const double start_ms = dev.elapsed_ms(origin, begin[s.task]), end_ms = dev.elapsed_ms(origin, end[s.task]);
      auto& t = r.timing[s.task];
      t.start_ns = static_cast<std::int64_t>(std::llround(static_cast<double>(start_ms) * 1e6));
      t.end_ns = std::max(t.start_ns, static_cast<std::int64_t>(std::llround(static_cast<double>(end_ms) * 1e6)));
      first = first < 0 ? t.start_ns : std::min(first, t.start_ns);
      last = std::max(last, t.end_ns);
    }
    for (auto& t : r.timing) {
      if (t.start_ns >= 0) t.start_ns -= first, t.end_ns -= first;
    }
    r.step_ns = last - std::max<std::int64_t>(first, 0);
    r.first_task_ns = std::max<std::int64_t>(first, 0);
    std::vector<float> loss(static_cast<std::size_t>(total));
    dev.download(loss.data(), losses, total * static_cast<std::int64_t>(sizeof(float)));
    r.loss = step_loss(loss);
    r.arena_bytes = flow.device_arena_bytes;
    r.live_peak_bytes = flow.device_peak_bytes;
    r.states_bytes = states_bytes;
    r.pinned_bytes = flow.host_bytes;
    r.scratch_peak_bytes = dev.scratch_peak_bytes();
    r.device_used_bytes = dev.used_bytes();
    return r;
  }

  // A tensor taking bytes an earlier tensor held waits until every task that touched the earlier one is done
  // (planned once: the same for every step).
  std::vector<sim::TaskId> reused_bytes_owners(const TaskTensors& tensors, int pos) const {
    std::set<sim::TaskId> waits;
    for (int inst : tensors.instances) {
      if (inst < 0) continue;
      const Instance& i = flow.instances[inst];
      if (i.accessors.front() != pos) continue;  // not created here
      for (int earlier : i.reuses) {
        for (int at : flow.instances[earlier].accessors) waits.insert(sched.order[at]);
      }
    }
    return {waits.begin(), waits.end()};  // only tasks with a stream touch tensors, so each has an end event
  }

  template <typename T>
  T* scratch(std::int64_t count, int stream) const {
    return static_cast<T*>(dev.scratch(stream, count * static_cast<std::int64_t>(sizeof(T))));
  }
  void release(void* p, int stream) const { dev.release_scratch(stream, p); }

  void execute(sim::TaskId id, const TaskTensors& t, int stream, std::int64_t seq_len, int optimizer_step, std::set<int>& updated_groups) {
    const sim::Task& task = g.task(id);
    const sim::Op& op = task.op;
    if (task.kind() == sim::TaskKind::collective && is_heads_exchange(op.code)) return exchange_heads(task, id, t, stream);
    if (task.kind() == sim::TaskKind::collective && is_tensor_parallel_collective(op.code)) return tensor_parallel(task, id, t, stream);
    if (task.kind() == sim::TaskKind::collective && (op.code == sim::OpCode::cp_gather_kv || op.code == sim::OpCode::cp_scatter_dkv)) {
      return cp_exchange(task, id, t, stream);
    }
    if (task.kind() == sim::TaskKind::collective) {  // gradients summed over the members; model states carry no values here
      if (opt.comm != nullptr && op.carries_gradients()) reduce_gradients(task, stream);
      return;
    }
    if (task.kind() == sim::TaskKind::p2p) return exchange(task, id, t, stream);
    if (op.is_updated_weights()) return copy_updated_weights(stream);
    if (op.carries_gradients() && task.kind() == sim::TaskKind::copy) return copy_offloaded_states(std::get<sim::Copy>(task.params), op, stream);
    if (op.code == sim::OpCode::fpdt_buffers) return stream_fpdt_buffers(std::get<sim::Copy>(task.params), stream);
    if (task.kind() == sim::TaskKind::copy) {  // (source, destination) pairs; an untouched accumulator moves nothing
      for (std::size_t i = 0; i + 1 < t.instances.size(); i += 2) {
        if (t.instances[i] < 0) continue;
        dev.copy(stream, where(t.instances[i + 1]), where(t.instances[i]), flow.instances[t.instances[i]].bytes);
      }
      return;
    }
    // Ring-track's streamed weights: the host adds each visit's gradients to its sums. Here the device's gradients
    // accumulate over the visits and each copy out carries their running sum, so the host holds the same sums.
    if (op.code == sim::OpCode::host_grad_sum) return;
    if (op.code == sim::OpCode::optimizer) {
      const bool on_host = sim::is_host(task.device);  // ZeRO-Offload: the gradients out, AdamW on the host
      for (const auto& [gid, members] : groups) {
        if (!owned.count(gid) || !updated_groups.insert(gid).second || !opt.run_optimizer) continue;
        const GroupGradients& b = group_gradients.at(gid);
        if (on_host && !gradients_on_host.count(gid)) dev.copy(stream, b.host_grad, b.grad, b.n * static_cast<std::int64_t>(sizeof(float)));
        for (int p : members) {
          const DeviceParameter& d = params[p];
          kernels::AdamW o = opt.adam;
          if (!d.decays) o.weight_decay = 0;  // as ModelState::adamw_step
          if (on_host) {
            dev.host_adamw(stream, o, optimizer_step, d.n, d.master, d.m, d.v, d.host_grad, d.host_weight);
          } else {
            dev.adamw(stream, o, optimizer_step, d.n, d.master, d.m, d.v, d.grad, d.weight);
          }
        }
      }
      return;
    }
    if (task.kind() != sim::TaskKind::gemm && task.kind() != sim::TaskKind::attention && task.kind() != sim::TaskKind::elementwise) {
      return;  // nothing to run for this kind (validated by executor_refusal)
    }
    const std::vector<sim::Op> ops = chunk_ops(op, chunk_tokens);
    if (ops.size() == 1) return compute(ops.front(), OpTensors(ops.front(), t.uses, t.instances), stream, seq_len);  // (rebased into its chunk)
    // A zigzag, run, micro-batch or Ulysses op: one chunk (pair) at a time, each over its share of the uses (compute_uses' order).
    std::size_t at = 0;
    for (const sim::Op& one : ops) {
      const std::size_t n = compute_uses(one, m, chunk_tokens).size();
      compute(one, OpTensors(one, std::span(t.uses).subspan(at, n), std::span(t.instances).subspan(at, n)), stream, seq_len);
      at += n;
    }
  }

  // ZeRO-Offload's gradients out to the host's optimizer step (D2H), or ZeRO-Infinity's and ring-track's streamed
  // weights in from the host's copy (H2D), of the groups the copy carries. The weights stay resident on the device as
  // well: HBM holds more than the plan counts. Only a group's first copy in a step writes them: every use of the
  // layer follows it (its gathers and visits are chained), while a later one (the backward's gather, the next
  // chunk's visit) could overwrite them, with the same values, while an earlier use still reads them; a later copy
  // moves the same bytes into scratch instead, so the copy engine carries what the plan moves, at its time.
  void copy_offloaded_states(const sim::Copy& copy, const sim::Op& op, int stream) {
    for (int gid : carried_groups(op)) {
      const GroupGradients& b = group_gradients.at(gid);
      TRAINYARD_CHECK(b.host_grad != nullptr, "offloaded states go to or come from an optimizer step on this rank's host");
      if (copy.direction == sim::Copy::Direction::d2h) {
        dev.copy(stream, b.host_grad, b.grad, b.n * static_cast<std::int64_t>(sizeof(float)));
        gradients_on_host.insert(gid);
        continue;
      }
      if (!weights_from_host.insert(gid).second) {
        for (int p : groups.at(gid)) {
          const std::int64_t bytes = params[p].n * static_cast<std::int64_t>(sizeof(bf16_bits));
          void* again = dev.scratch(stream, bytes);
          dev.copy(stream, again, params[p].host_weight, bytes);
          dev.release_scratch(stream, again);
        }
        continue;
      }
      for (int p : groups.at(gid)) {
        dev.copy(stream, params[p].weight, params[p].host_weight, params[p].n * static_cast<std::int64_t>(sizeof(bf16_bits)));
      }
    }
  }

  // ZeRO-Offload: the weights the host's optimizer step updated, back to the device (the groups this rank owns but
  // those copied in from the host whenever they are used).
  void copy_updated_weights(int stream) {
    if (!opt.run_optimizer) return;
    for (int gid : owned) {
      if (streamed.count(gid)) continue;
      const GroupGradients& b = group_gradients.at(gid);
      TRAINYARD_CHECK(b.host_weight != nullptr, "updated weights come from a host optimizer step on this rank");
      for (int p : groups.at(gid))
        dev.copy(stream, params[p].weight, params[p].host_weight, params[p].n * static_cast<std::int64_t>(sizeof(bf16_bits)));
    }
  }

  void allocate_fpdt_staging() {
    std::int64_t out_bytes = 0, in_bytes = 0;
    for (sim::TaskId id : sched.order) {
      const sim::Task& t = g.task(id);
      if (t.kind() != sim::TaskKind::copy || t.op.code != sim::OpCode::fpdt_buffers) continue;
      const auto& copy = std::get<sim::Copy>(t.params);
      auto& largest = copy.direction == sim::Copy::Direction::d2h ? out_bytes : in_bytes;
      largest = std::max(largest, copy.bytes);
    }
    if (out_bytes > 0) fpdt_out = dev.allocate_pinned(out_bytes);
    if (in_bytes > 0) fpdt_in = dev.allocate_pinned(in_bytes);
  }

  // FPDT's streamed buffers: the tensors stay in HBM (their values are the executor's tensors), and the copy carries
  // its bytes between scratch and the pinned staging buffer of its direction, so the copy engine does the plan's work.
  void stream_fpdt_buffers(const sim::Copy& copy, int stream) {
    void* device = dev.scratch(stream, copy.bytes);
    if (copy.direction == sim::Copy::Direction::d2h) {
      dev.copy(stream, fpdt_out, device, copy.bytes);
    } else {
      dev.copy(stream, device, fpdt_in, copy.bytes);
    }
    release(device, stream);
  }

  // Ulysses' all-to-all over the task's group (the dataflow's order: per tensor, what this rank sends, then what
  // it receives, by member and chunk). To head groups, each member's block is packed from its columns of this
  // rank's chunks' rows; back, each block received is unpacked into them. A member holding two chunks (zigzag)
  // sends and receives both in one block, copied out of and into their tensors; one chunk goes as it is.
  void exchange_heads(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
    const auto& members = g.groups()[std::get<sim::Collective>(task.params).group];
    const std::vector<int> ranks(members.begin(), members.end());
    const auto peers = static_cast<std::int64_t>(ranks.size());
    const auto me = static_cast<std::int32_t>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
    const auto chunks = static_cast<std::int64_t>(member_chunks(task.op, me).size());  // every member holds as many
    const bool to_groups = to_head_groups(task.op.code);
    std::size_t at = 0;
    auto next = [&] { return static_cast<char*>(where(t.instances[at++])); };
    for (const HeadsExchanged& e : heads_exchanged(task.op.code)) {
      const std::int64_t row_bytes = width_elements(e.row, m) * element_bytes(e.dtype), part = row_bytes / peers, rows = chunk_tokens * e.blocks;
      const std::int64_t piece = part * rows, block = chunks * piece;  // one chunk's head group; one member's share
      std::vector<char*> scratch_blocks;
      auto fresh = [&] { return scratch_blocks.emplace_back(scratch<char>(block, stream)); };
      std::vector<ConstBytes> sends;
      std::vector<Bytes> recvs;
      if (to_groups) {
        std::vector<char*> wholes;
        for (std::int64_t k = 0; k < chunks; ++k) wholes.push_back(next());
        for (std::int64_t i = 0; i < peers; ++i) {
          char* out = fresh();
          for (std::int64_t k = 0; k < chunks; ++k) dev.copy_2d(stream, out + k * piece, part, wholes[k] + i * part, row_bytes, part, rows);
          sends.push_back({out, block});
        }
        std::vector<std::vector<char*>> into(static_cast<std::size_t>(peers));
        for (auto& member : into) {
          for (std::int64_t k = 0; k < chunks; ++k) member.push_back(next());
          recvs.push_back({chunks == 1 ? member.front() : fresh(), block});
        }
        dev.all_to_all(stream, *opt.comm, ranks, id, std::move(sends), recvs);
        for (std::int64_t i = 0; i < peers && chunks > 1; ++i) {
          for (std::int64_t k = 0; k < chunks; ++k) dev.copy(stream, into[i][k], static_cast<char*>(recvs[i].data) + k * piece, piece);
        }
      } else {
        for (std::int64_t i = 0; i < peers; ++i) {
          if (chunks == 1) {
            sends.push_back({next(), block});
            continue;
          }
          char* out = fresh();
          for (std::int64_t k = 0; k < chunks; ++k) dev.copy(stream, out + k * piece, next(), piece);
          sends.push_back({out, block});
        }
        for (std::int64_t i = 0; i < peers; ++i) recvs.push_back({fresh(), block});
        dev.all_to_all(stream, *opt.comm, ranks, id, std::move(sends), recvs);
        for (std::int64_t k = 0; k < chunks; ++k) {
          char* whole = next();
          for (std::int64_t i = 0; i < peers; ++i) {
            dev.copy_2d(stream, whole + i * part, row_bytes, static_cast<char*>(recvs[i].data) + k * piece, part, part, rows);
          }
        }
      }
      for (char* b : scratch_blocks) release(b, stream);
    }
  }

  // Tensor parallelism's collectives over the task's group, in place: partial sums of bf16 activations all-reduced,
  // or with sequence parallelism reduce-scattered to each member's rows (the LM head's pieces, whose rows do not
  // split by member, all-reduced); all-gathers (the loss's statistics, [shard][2][rows] fp32; sequence
  // parallelism's rows) as an all-to-all sending each member this rank's block, each member's block at its index.
  void tensor_parallel(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
    const std::vector<int> ranks = group_ranks(task);
    if (task.op.code == sim::OpCode::tp_sum_norms) return sum_norm_gradients(task.op, ranks, stream);
    for (int inst : t.instances) {
      const Instance& i = flow.instances[inst];
      if (sequence_parallel && !is_tensor_parallel_gather(task.op.code) && task.op.code != sim::OpCode::tp_sum_dnf) {
        reduce_scatter_rows(static_cast<char*>(where(inst)), i.bytes, ranks, id, stream);
        continue;
      }
      if (!is_tensor_parallel_gather(task.op.code)) {  // the LM head's pieces under SP too: every row summed
        dev.all_reduce_sum(stream, *opt.comm, ranks, static_cast<bf16_bits*>(where(inst)), i.bytes / 2);
        continue;
      }
      const std::int64_t block = i.bytes / static_cast<std::int64_t>(ranks.size());
      char* base = static_cast<char*>(where(inst));
      std::vector<ConstBytes> sends;
      std::vector<Bytes> recvs;
      for (std::size_t k = 0; k < ranks.size(); ++k) {
        const bool mine = ranks[k] == rank();  // already in place
        sends.push_back({base + shard * block, mine ? 0 : block});
        recvs.push_back({base + static_cast<std::int64_t>(k) * block, mine ? 0 : block});
      }
      dev.all_to_all(stream, *opt.comm, ranks, id, std::move(sends), std::move(recvs));
    }
  }
  // Sequence parallelism's reduce-scatter of a bf16 [rows][width] partial sum: member k's block of rows to member k
  // (one all-to-all), the blocks received added into this rank's own rows; the other rows stay partial.
  void reduce_scatter_rows(char* base, std::int64_t bytes, const std::vector<int>& ranks, sim::TaskId id, int stream) {
    const std::int64_t block = bytes / static_cast<std::int64_t>(ranks.size());
    char* received = scratch<char>(bytes, stream);
    std::vector<ConstBytes> sends;
    std::vector<Bytes> recvs;
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      const bool mine = ranks[k] == rank();
      sends.push_back({base + static_cast<std::int64_t>(k) * block, mine ? 0 : block});
      recvs.push_back({received + static_cast<std::int64_t>(k) * block, mine ? 0 : block});
    }
    dev.all_to_all(stream, *opt.comm, ranks, id, std::move(sends), recvs);
    auto* own = reinterpret_cast<bf16_bits*>(base + shard * block);
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      if (ranks[k] != rank()) dev.add(stream, block / 2, own, reinterpret_cast<const bf16_bits*>(recvs[k].data), own);
    }
    release(received, stream);
  }
  // Sequence parallelism: the norms' weight gradients, each rank's over its own rows, summed over the TP group.
  void sum_norm_gradients(const sim::Op& op, const std::vector<int>& ranks, int stream) {
    for (int l = op.kv_first; l <= op.kv_last; ++l) {
      for (LayerWeight w : {LayerWeight::norm1, LayerWeight::norm2}) dev.all_reduce_sum(stream, *opt.comm, ranks, layer(l, w).grad, m.hidden);
    }
    if (op.row_begin == 1) dev.all_reduce_sum(stream, *opt.comm, ranks, params[final_norm].grad, m.hidden);
  }
  // All-gather context parallelism over the task's cp group, as one all-to-all (the dataflow's order: the
  // gather's own K, V then every other member's; the reduce-scatter's dK | dV for every other member, then its own).
  // Gather: this rank's tensors packed into one block sent to every member, each member's block unpacked into its
  // chunks' K and V. Reduce-scatter: each member's chunks' dK | dV packed and sent to it, each block received added
  // into this rank's own.
  void cp_exchange(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
    const std::vector<int> ranks = group_ranks(task);
    const auto members = ranks.size();
    const std::size_t me = static_cast<std::size_t>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
    const bool gather = task.op.code == sim::OpCode::cp_gather_kv;
    const std::size_t per_member = t.instances.size() / members;  // tensors of one member's chunks
    const std::int64_t bytes = flow.instances[t.instances.front()].bytes, block = bytes * static_cast<std::int64_t>(per_member);
    // The instances of member i's chunks, in the dataflow's order.
    auto of = [&](std::size_t i) {
      const std::size_t slot = gather ? (i == me ? 0 : (i < me ? i + 1 : i)) : (i == me ? members - 1 : (i < me ? i : i - 1));
      return std::span(t.instances).subspan(slot * per_member, per_member);
    };
    auto pack = [&](std::span<const int> instances) {
      char* out = scratch<char>(block, stream);
      for (std::size_t k = 0; k < instances.size(); ++k) dev.copy(stream, out + static_cast<std::int64_t>(k) * bytes, where(instances[k]), bytes);
      return out;
    };
    std::vector<char*> blocks;
    std::vector<ConstBytes> sends;
    std::vector<Bytes> recvs;
    char* own = gather ? blocks.emplace_back(pack(of(me))) : nullptr;
    void* nothing = where(t.instances.front());  // this rank's own block: no bytes (a real pointer, as memcpy wants)
    for (std::size_t i = 0; i < members; ++i) {
      const bool self = i == me;
      sends.push_back({self ? nothing : gather ? own : blocks.emplace_back(pack(of(i))), self ? 0 : block});
      recvs.push_back({self ? nothing : blocks.emplace_back(scratch<char>(block, stream)), self ? 0 : block});
    }
    dev.all_to_all(stream, *opt.comm, ranks, id, std::move(sends), recvs);
    for (std::size_t i = 0; i < members; ++i) {
      if (i == me) continue;
      const std::span<const int> into = gather ? of(i) : of(me);
      for (std::size_t k = 0; k < into.size(); ++k) {
        char* from = static_cast<char*>(recvs[i].data) + static_cast<std::int64_t>(k) * bytes;
        if (gather) {
          dev.copy(stream, where(into[k]), from, bytes);
        } else {
          dev.axpy_f32(stream, bytes / 4, 1.0f, reinterpret_cast<const float*>(from), static_cast<float*>(where(into[k])));
        }
      }
    }
    for (char* b : blocks) release(b, stream);
  }

  std::vector<int> group_ranks(const sim::Task& task) const {
    const auto& members = g.groups()[std::get<sim::Collective>(task.params).group];
    return {members.begin(), members.end()};
  }

  // A send between ranks, on its sender (this rank's side of each (source, destination) pair) or its receiver:
  // one message under the task's id.
  void exchange(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
    const sim::DeviceId dst = std::get<sim::PointToPoint>(task.params).dst;
    if (task.device == rank()) {
      std::vector<ConstBytes> out;
      for (std::size_t i = 0; i < t.instances.size(); i += 2) out.push_back({where(t.instances[i]), flow.instances[t.instances[i]].bytes});
      dev.send(stream, *opt.comm, dst, id, std::move(out));
    } else {
      std::vector<Bytes> in;
      for (std::size_t i = 1; i < t.instances.size(); i += 2) in.push_back({where(t.instances[i]), flow.instances[t.instances[i]].bytes});
      dev.recv(stream, *opt.comm, task.device, id, std::move(in));
    }
  }

  // One chunk (pair) of a compute task, through its op's function (device_ops.hpp).
  void compute(const sim::Op& op, const OpTensors& t, int stream, std::int64_t seq_len) {
    DeviceOpArgs a;
    a.dev = &dev;
    a.stream = stream;
    a.op = &op;
    a.tensors = &t;
    a.memory = memory();
    a.model = &m;
    a.chunk_tokens = chunk_tokens;
    a.shard = shard;
    a.shards = shards;
    a.sequence_parallel = sequence_parallel;
    if (op.layer >= 0 && op.layer < m.layers) {
      for (int k = 0; k < kLayerWeights; ++k) a.layer[k] = &layer(op.layer, static_cast<LayerWeight>(k));
    }
    auto parameter = [&](int i) { return i >= 0 ? &params[i] : nullptr; };
    a.embedding = parameter(embedding);
    a.final_norm = parameter(final_norm);
    a.lm_head = parameter(lm_head);
    const std::int64_t chunk_start = static_cast<std::int64_t>(op.chunk) * chunk_tokens;
    a.tokens = tokens + static_cast<std::int64_t>(op.seq) * (seq_len + 1) + chunk_start;
    a.losses = losses + static_cast<std::int64_t>(op.seq) * seq_len + chunk_start;
    a.dloss = dloss;
    run_device_op(a);
  }

  // --- states between host and device ----------------------------------------------------------------------------
  // The elements of parameter i (ModelState::all() order) this rank holds: all, or its tensor-parallel shard's.
  std::int64_t held_elements(std::size_t i, const Parameter& p) const {
    return shards == 1 ? static_cast<std::int64_t>(p.size()) : shard_layouts[static_cast<std::size_t>(shard)][i].elements();
  }
  // This rank's values of a whole parameter: the whole itself, or its shard's, taken into `part`.
  std::span<const float> mine(std::size_t i, const std::vector<float>& whole, std::vector<float>& part) const {
    if (shards == 1) return whole;
    const ShardLayout& layout = shard_layouts[static_cast<std::size_t>(shard)][i];
    part.resize(static_cast<std::size_t>(layout.elements()));
    take_shard(layout, whole, part);
    return part;
  }
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

  void upload(const ModelState& state) {
    const auto all = state.all();
    TRAINYARD_CHECK(all.size() == params.size(), "the state is of the executor's model");
    for (std::size_t i = 0; i < all.size(); ++i) {
      const Parameter& p = *all[i];
      const DeviceParameter& d = params[i];
      std::vector<float> part;
      const std::span<const float> weights = mine(i, p.weight, part);
      std::vector<bf16_bits> bits(weights.size());
      for (std::size_t k = 0; k < bits.size(); ++k) bits[k] = kernels::to_bf16(weights[k]);
      dev.upload(d.weight, bits.data(), d.n * 2);
      if (d.host_weight) std::memcpy(d.host_weight, bits.data(), bits.size() * sizeof(bf16_bits));
      put(d.master, mine(i, p.master, part).data(), d.n * 4, host_optimizer);
      put(d.m, mine(i, p.m, part).data(), d.n * 4, host_optimizer);
      put(d.v, mine(i, p.v, part).data(), d.n * 4, host_optimizer);
    }
  }

  void download(ModelState& state) const {
    dev.synchronize();
    const auto all = state.all();
    TRAINYARD_CHECK(all.size() == params.size(), "the state is of the executor's model");
    for (std::size_t i = 0; i < all.size(); ++i) {
      Parameter& p = *all[i];
      const DeviceParameter& d = params[i];
      whole(i, p.weight, [&](float* out) {
        std::vector<bf16_bits> bits(static_cast<std::size_t>(d.n));
        get(bits.data(), d.weights_on_host ? static_cast<const void*>(d.host_weight) : d.weight, d.n * 2, d.weights_on_host);
        for (std::size_t k = 0; k < bits.size(); ++k) out[k] = kernels::from_bf16(bits[k]);
      });
      whole(i, p.grad, [&](float* out) { dev.download(out, d.grad, d.n * 4); });
      for (auto [held, out] : {std::pair{d.master, &p.master}, std::pair{d.m, &p.m}, std::pair{d.v, &p.v}}) {
        whole(i, *out, [&, held = held](float* into) { get(into, held, d.n * 4, host_optimizer); });
      }
    }
  }
};

Executor::Executor(Device& device, const sim::TaskGraph& graph, ModelState& shapes, int gpus_per_node, std::span<const sim::TaskTiming> predicted,
                   const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>(device, graph, shapes, gpus_per_node, predicted, options)) {}
Executor::~Executor() = default;
void Executor::upload(const ModelState& state) { impl_->upload(state); }
void Executor::download(ModelState& state) const { impl_->download(state); }
MeasuredStep Executor::run_step(std::span<const std::vector<std::int32_t>> tokens, int optimizer_step) { return impl_->run(tokens, optimizer_step); }

}  // namespace trainyard::backend
