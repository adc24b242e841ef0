#include "backend/executor.hpp"

#include "backend/executor_impl.hpp"

namespace trainyard::backend {

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

double Executor::Impl::step_loss(const std::vector<float>& loss) const {
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

void Executor::Impl::refuse_what_is_not_written() const {
  if (const std::string needs = dev.refuses_head_dim(m.head_dim); !needs.empty()) {
    throw InputError("the plan's model", "head_dim", needs, std::to_string(m.head_dim));
  }
  if (const auto refusal = executor_refusal(g, ranks())) throw InputError("the plan's task graph", refusal->task, refusal->expected, refusal->found);
  if (const auto group = ranks() > 1 ? unreduced_shared_group(g, m) : std::nullopt) {
    throw InputError("the plan's task graph", group_name(*group), "a gradient reduction over the GPUs that use it, to run on several ranks", "none");
  }
}

MeasuredStep Executor::Impl::run(std::span<const std::vector<std::int32_t>> token_ids, int optimizer_step) {
  TRAINYARD_CHECK(!token_ids.empty(), "a step has at least one sequence");
  const std::int64_t seq_len = static_cast<std::int64_t>(token_ids.front().size()) - 1;
  const std::int64_t total = seq_len * static_cast<std::int64_t>(token_ids.size());
  prepare_step(checked_tokens(token_ids, seq_len), total);  // before the step's timing starts
  submit_schedule(seq_len, optimizer_step);
  dev.synchronize();
  return collect(total);
}

std::vector<std::int32_t> Executor::Impl::checked_tokens(std::span<const std::vector<std::int32_t>> token_ids, std::int64_t seq_len) const {
  if (static_cast<int>(token_ids.size()) != sequences) {
    throw InputError("the step's tokens", "sequences", std::to_string(sequences) + " (the graph's)", std::to_string(token_ids.size()));
  }
  check_sequence_length(g, seq_len);
  std::vector<std::int32_t> flat;
  for (const auto& s : token_ids) {
    TRAINYARD_CHECK(static_cast<std::int64_t>(s.size()) == seq_len + 1, "every sequence has seq_len + 1 tokens");
    for (std::int32_t id : s) {
      if (id < 0 || id >= full.vocab) throw InputError("the step's tokens", "token id", "0 to " + std::to_string(full.vocab - 1), std::to_string(id));
    }
    flat.insert(flat.end(), s.begin(), s.end());
  }
  for (std::int32_t& id : flat) id = shards == 1 ? id : id / m.vocab == shard ? static_cast<std::int32_t>(id % m.vocab) : -1;
  return flat;
}

void Executor::Impl::prepare_step(const std::vector<std::int32_t>& flat, std::int64_t total) {
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

void Executor::Impl::submit_schedule(std::int64_t seq_len, int optimizer_step) {
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

MeasuredStep Executor::Impl::collect(std::int64_t total) {
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

std::vector<sim::TaskId> Executor::Impl::reused_bytes_owners(const TaskTensors& tensors, int pos) const {
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

void Executor::Impl::execute(sim::TaskId id, const TaskTensors& t, int stream, std::int64_t seq_len, int optimizer_step,
                             std::set<int>& updated_groups) {
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

void Executor::Impl::compute(const sim::Op& op, const OpTensors& t, int stream, std::int64_t seq_len) {
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

Executor::Executor(Device& device, const sim::TaskGraph& graph, ModelState& shapes, int gpus_per_node, std::span<const sim::TaskTiming> predicted,
                   const ExecutorOptions& options)
    : impl_(std::make_unique<Impl>(device, graph, shapes, gpus_per_node, predicted, options)) {}
Executor::~Executor() = default;
void Executor::upload(const ModelState& state) { impl_->upload(state); }
void Executor::download(ModelState& state) const { impl_->download(state); }
MeasuredStep Executor::run_step(std::span<const std::vector<std::int32_t>> tokens, int optimizer_step) { return impl_->run(tokens, optimizer_step); }

}  // namespace trainyard::backend
