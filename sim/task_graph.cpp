#include "sim/task_graph.hpp"

#include <algorithm>
#include <iterator>

#include "common/error.hpp"

namespace trainyard::sim {

std::string device_name(DeviceId d) { return is_host(d) ? "host" + std::to_string(host_node(d)) : "gpu" + std::to_string(d); }

std::string_view to_string(StreamKind kind) {
  switch (kind) {
    case StreamKind::none: return "none";
    case StreamKind::compute: return "compute";
    case StreamKind::h2d: return "h2d";
    case StreamKind::d2h: return "d2h";
    case StreamKind::comm: return "comm";
    case StreamKind::host: return "host";
  }
  return "?";
}

std::string_view to_string(TaskKind kind) {
  static constexpr std::string_view names[] = {"gemm", "attention", "elementwise", "optimizer", "copy", "p2p", "collective", "alloc", "free"};
  return names[static_cast<int>(kind)];
}

std::uint8_t narrow_op_count(std::int32_t count, const char* what) {
  if (count < 1 || count > UINT8_MAX) throw InputError("the step's task graph", what, "1 to 255", std::to_string(count));
  return static_cast<std::uint8_t>(count);
}

std::string_view to_string(OpCode code) {
  // A table laid out by hand, in OpCode's order.
  // clang-format off
  static constexpr std::string_view names[] = {
      "none", "embed", "norm1", "qkv", "rope", "attn", "attn_merge", "proj", "residual1", "norm2", "mlp_up", "act", "mlp_down",
      "residual2", "residual2_bwd", "mlp_down_dgrad", "mlp_down_wgrad", "act_bwd", "mlp_up_dgrad", "mlp_up_wgrad", "norm2_bwd",
      "residual1_bwd", "proj_dgrad", "proj_wgrad", "attn_bwd", "dkv_add", "rope_bwd", "qkv_dgrad", "qkv_wgrad", "norm1_bwd",
      "embed_bwd", "head_logits", "head_xent", "head_xent_shard", "head_xent_merge", "head_dgrad", "head_dgrad_shard",
      "head_norm_bwd", "head_wgrad", "optimizer", "host_grad_sum", "kv", "dkv", "kv_dkv", "dkv_pass", "acts", "checkpoint", "input",
      "input_grad", "fpdt_buffers", "heads_qkv", "heads_out", "heads_dout", "heads_dqkv", "tp_sum_p", "tp_sum_mo", "tp_sum_dn2", "tp_sum_dn1",
      "tp_sum_x", "tp_sum_dnf", "tp_gather_xent", "tp_gather_n1", "tp_gather_n2", "tp_gather_dm", "tp_gather_dp", "tp_gather_x",
      "tp_gather_dx", "tp_sum_norms", "cp_gather_kv", "cp_scatter_dkv", "states"};
  // clang-format on
  static_assert(std::size(names) == static_cast<std::size_t>(OpCode::states) + 1);
  return names[static_cast<int>(code)];
}

std::string_view to_string(CollectiveOp op) {
  static constexpr std::string_view names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};
  return names[static_cast<int>(op)];
}

std::string_view to_string(Algorithm algorithm) {
  static constexpr std::string_view names[] = {"ring", "tree", "direct"};
  return names[static_cast<int>(algorithm)];
}

namespace {

// Compressed successor lists of `edges` (valid task ids) over `tasks` tasks: task t's successors are
// to[offset[t] .. offset[t + 1]), in edge order (a counting sort by source).
template <class Edges, class Offsets, class Targets>
void compress_successors(std::size_t tasks, const Edges& edges, Offsets& offset, Targets& to) {
  offset.assign(tasks + 1, 0);
  for (const auto& edge : edges) ++offset[static_cast<std::size_t>(edge.first) + 1];
  for (std::size_t i = 0; i < tasks; ++i) offset[i + 1] += offset[i];
  to.resize(edges.size());
  std::vector<std::int32_t> fill(offset.begin(), offset.end() - 1);
  for (const auto& edge : edges) to[fill[edge.first]++] = edge.second;
}

}  // namespace

TaskId TaskGraph::add(std::string_view name, Task task, std::span<const TaskId> deps) {
  TRAINYARD_CHECK(!finalized_, "task added to a finalized graph");
  const auto id = static_cast<TaskId>(tasks_.size());
  task.name_offset = names_.size();
  task.name_length = static_cast<std::uint32_t>(std::min<std::size_t>(name.size(), UINT32_MAX));
  names_.insert(names_.end(), name.begin(), name.begin() + task.name_length);
  tasks_.push_back(std::move(task));
  for (TaskId d : deps) edges_.emplace_back(d, id);
  return id;
}

void TaskGraph::add_dependency(TaskId before, TaskId after) {
  TRAINYARD_CHECK(!finalized_, "dependency added to a finalized graph");
  edges_.emplace_back(before, after);
}

std::int32_t TaskGraph::add_group(std::vector<DeviceId> members) {
  groups_.push_back(std::move(members));
  return static_cast<std::int32_t>(groups_.size() - 1);
}

std::int32_t TaskGraph::add_label(std::string label) {
  labels_.push_back(std::move(label));
  return static_cast<std::int32_t>(labels_.size() - 1);
}

TaskId TaskGraph::gemm(std::string_view name, DeviceId gpu, Gemm g, std::span<const TaskId> deps, int stream) {
  return add(name, {gpu, {StreamKind::compute, static_cast<std::uint8_t>(stream)}, false, g}, deps);
}

TaskId TaskGraph::attention(std::string_view name, DeviceId gpu, Attention a, std::span<const TaskId> deps, int stream) {
  return add(name, {gpu, {StreamKind::compute, static_cast<std::uint8_t>(stream)}, false, a}, deps);
}

TaskId TaskGraph::elementwise(std::string_view name, DeviceId gpu, Elementwise e, std::span<const TaskId> deps, int stream) {
  return add(name, {gpu, {StreamKind::compute, static_cast<std::uint8_t>(stream)}, false, e}, deps);
}

TaskId TaskGraph::copy(std::string_view name, DeviceId gpu, Copy c, std::span<const TaskId> deps) {
  const StreamKind engine = c.direction == Copy::Direction::h2d ? StreamKind::h2d : StreamKind::d2h;
  return add(name, {gpu, {engine, 0}, false, c}, deps);
}

TaskId TaskGraph::send(std::string_view name, DeviceId src, DeviceId dst, std::int64_t bytes, std::span<const TaskId> deps, int stream) {
  return add(name, {src, {StreamKind::comm, static_cast<std::uint8_t>(stream)}, false, PointToPoint{dst, bytes}}, deps);
}

TaskId TaskGraph::collective(std::string_view name, Collective c, std::span<const TaskId> deps, int stream) {
  TRAINYARD_CHECK(c.group >= 0 && static_cast<std::size_t>(c.group) < groups_.size() && !groups_[c.group].empty(),
                  "collective with an unknown group");
  return add(name, {groups_[c.group].front(), {StreamKind::comm, static_cast<std::uint8_t>(stream)}, false, c}, deps);
}

TaskId TaskGraph::alloc(std::string_view name, DeviceId device, Pool pool, std::int64_t bytes, std::string label, std::span<const TaskId> deps) {
  const std::int32_t l = add_label(std::move(label));
  return add(name, {device, {}, false, Alloc{pool, bytes, l}}, deps);
}

TaskId TaskGraph::free(std::string_view name, TaskId alloc, std::span<const TaskId> deps) {
  TRAINYARD_CHECK(alloc >= 0 && static_cast<std::size_t>(alloc) < tasks_.size(), "free of an unknown task");
  return add(name, {tasks_[alloc].device, {}, false, Free{alloc}}, deps);
}

void TaskGraph::finalize() {
  if (finalized_) return;
  const std::size_t n = tasks_.size();
  // A free always waits for its alloc, whether or not the builder said so.
  for (std::size_t i = 0; i < n; ++i) {
    if (const auto* f = std::get_if<Free>(&tasks_[i].params)) {
      if (f->alloc >= 0 && static_cast<std::size_t>(f->alloc) < n) edges_.emplace_back(f->alloc, static_cast<TaskId>(i));
    }
  }
  pred_count_.assign(n, 0);
  for (const auto& [from, to] : edges_) {
    TRAINYARD_CHECK(from >= 0 && static_cast<std::size_t>(from) < n && to >= 0 && static_cast<std::size_t>(to) < n,
                    "dependency on a task that does not exist");
    ++pred_count_[to];
  }
  compress_successors(n, edges_, succ_offset_, succ_);
  HugePageVector<std::pair<TaskId, TaskId>>().swap(edges_);  // the successor lists hold them now
  finalized_ = true;
}

std::vector<std::pair<TaskId, TaskId>> TaskGraph::edges() const {
  if (!finalized_) return {edges_.begin(), edges_.end()};
  std::vector<std::pair<TaskId, TaskId>> out;
  out.reserve(succ_.size());
  for (TaskId from = 0; from < static_cast<TaskId>(tasks_.size()); ++from) {
    for (TaskId to : successors(from)) out.emplace_back(from, to);
  }
  return out;
}

std::span<const TaskId> TaskGraph::successors(TaskId id) const {
  const auto i = static_cast<std::size_t>(id);
  return {succ_.data() + succ_offset_[i], static_cast<std::size_t>(succ_offset_[i + 1] - succ_offset_[i])};
}

TaskGraph::MemoryBytes TaskGraph::memory() const {
  MemoryBytes m;
  m.task_records = tasks_.size() * sizeof(Task);
  m.edges = edges_.size() * sizeof(edges_[0]) + succ_offset_.size() * sizeof(std::int32_t) + succ_.size() * sizeof(TaskId) +
            pred_count_.size() * sizeof(std::int32_t);
  m.names = names_.size();
  for (const auto& l : labels_) m.groups_and_labels += sizeof(l) + l.capacity();
  for (const auto& g : groups_) m.groups_and_labels += sizeof(g) + g.capacity() * sizeof(DeviceId);
  return m;
}

namespace {

std::string where(const TaskGraph& graph, TaskId id) { return "tasks[" + std::to_string(id) + "] '" + std::string(graph.name(id)) + "'"; }

// What every check of validate() needs: the graph, the cluster's size, and how to report a failure.
struct Validation {
  const TaskGraph& graph;
  int gpus, nodes;
  const std::string& origin;
  std::string any_gpu;  // "a GPU gpu0..gpuN", the expected value of every GPU field

  [[noreturn]] void fail(TaskId id, const std::string& field, const std::string& expected, const std::string& got) const {
    throw InputError(origin, where(graph, id) + (field.empty() ? "" : "." + field), expected, got);
  }
  bool gpu_ok(DeviceId d) const { return d >= 0 && d < gpus; }
  void positive(TaskId id, std::int64_t v, const char* field) const {
    if (v <= 0) fail(id, field, "a positive number", std::to_string(v));
  }
};

// Which stream each kind runs on.
StreamKind stream_for(const Task& t) {
  switch (t.kind()) {
    case TaskKind::gemm:
    case TaskKind::attention:
    case TaskKind::elementwise: return StreamKind::compute;
    case TaskKind::optimizer: return is_host(t.device) ? StreamKind::host : StreamKind::compute;
    case TaskKind::copy: return std::get<Copy>(t.params).direction == Copy::Direction::h2d ? StreamKind::h2d : StreamKind::d2h;
    case TaskKind::p2p:
    case TaskKind::collective: return StreamKind::comm;
    case TaskKind::alloc:
    case TaskKind::free: return StreamKind::none;
  }
  return StreamKind::compute;
}

// The task's device exists, its stream can run its kind, and only optimizer, alloc and free tasks sit on a host.
void check_placement(const Validation& v, TaskId id) {
  const Task& t = v.graph.task(id);
  const TaskKind kind = t.kind();
  const bool on_host = is_host(t.device);
  if (on_host ? host_node(t.device) >= v.nodes : !v.gpu_ok(t.device)) {
    v.fail(id, "device", v.any_gpu + " or a host host0..host" + std::to_string(v.nodes - 1), device_name(t.device));
  }
  const StreamKind want = stream_for(t);
  if (t.stream.kind != want) {
    v.fail(id, "stream", "\"" + std::string(to_string(want)) + "\" for a " + std::string(to_string(kind)) + " task",
           "\"" + std::string(to_string(t.stream.kind)) + "\"");
  }
  if (on_host && kind != TaskKind::optimizer && kind != TaskKind::alloc && kind != TaskKind::free) {
    v.fail(id, "device", v.any_gpu + " (only optimizer, alloc and free tasks run on a host)", device_name(t.device));
  }
}

void check_attention(const Validation& v, TaskId id, const Attention& a) {
  v.positive(id, a.q_len, "q_len");
  v.positive(id, a.kv_len, "kv_len");
  v.positive(id, a.heads, "heads");
  v.positive(id, a.kv_heads, "kv_heads");
  v.positive(id, a.head_dim, "head_dim");
  if (a.heads % a.kv_heads != 0) v.fail(id, "kv_heads", "a divisor of heads", std::to_string(a.kv_heads));
  if (a.causal && a.q_len > a.kv_len) {
    v.fail(id, "q_len", "at most kv_len for causal attention (queries are the last q_len positions)", std::to_string(a.q_len));
  }
}

// The collective's group: at least 2 distinct existing GPUs (1 standing for a ring of ring_ranks); returns it.
const std::vector<DeviceId>& checked_group(const Validation& v, TaskId id, const Collective& c) {
  if (c.group < 0 || static_cast<std::size_t>(c.group) >= v.graph.groups().size()) v.fail(id, "group", "a group of GPUs", "none");
  const auto& members = v.graph.groups()[c.group];
  if (members.size() < (c.ring_ranks != 0 ? 1U : 2U)) {
    v.fail(id, "group", c.ring_ranks != 0 ? "at least 1 GPU" : "at least 2 GPUs", std::to_string(members.size()));
  }
  std::vector<DeviceId> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (!v.gpu_ok(sorted[i])) v.fail(id, "group", v.any_gpu + " for every member", device_name(sorted[i]));
    if (i > 0 && sorted[i] == sorted[i - 1]) v.fail(id, "group", "distinct GPUs", device_name(sorted[i]) + " twice");
  }
  return members;
}

void check_collective(const Validation& v, TaskId id, const Collective& c) {
  v.positive(id, c.bytes, "bytes");
  const auto& members = checked_group(v, id, c);
  const bool tree_ok = c.op == CollectiveOp::all_reduce || c.op == CollectiveOp::broadcast;
  if (c.algorithm == Algorithm::tree && !tree_ok) {
    v.fail(id, "algorithm", "ring or direct for " + std::string(to_string(c.op)), "\"tree\"");
  }
  if (c.ring_ranks != 0) {
    const bool ring_op = c.op == CollectiveOp::all_reduce || c.op == CollectiveOp::all_gather || c.op == CollectiveOp::reduce_scatter;
    if (!ring_op || c.algorithm != Algorithm::ring) {
      v.fail(id, "ring_ranks", "only on a ring all_reduce, all_gather or reduce_scatter", std::to_string(c.ring_ranks));
    }
    if (c.ring_ranks < static_cast<std::int32_t>(members.size())) {
      v.fail(id, "ring_ranks", "at least the group size (" + std::to_string(members.size()) + ")", std::to_string(c.ring_ranks));
    }
  } else if (c.ring_across_nodes) {
    v.fail(id, "ring_across_nodes", "only with ring_ranks (a group standing for a whole ring)", "true");
  }
  const std::int64_t ranks = c.ring_ranks != 0 ? c.ring_ranks : static_cast<std::int64_t>(members.size());
  if ((c.op == CollectiveOp::all_gather || c.op == CollectiveOp::reduce_scatter || c.op == CollectiveOp::all_to_all ||
       c.op == CollectiveOp::all_reduce) &&
      c.bytes % ranks != 0) {
    v.fail(id, "bytes", std::string("a multiple of the ") + (c.ring_ranks != 0 ? "ring_ranks" : "group size") + " (" + std::to_string(ranks) + ")",
           std::to_string(c.bytes));
  }
}

// A free names an alloc not freed already; `freed` marks the allocs freed so far.
void check_free(const Validation& v, TaskId id, const Free& f, std::vector<bool>& freed) {
  const auto n = static_cast<TaskId>(v.graph.size());
  const TaskId a = f.alloc;
  if (a < 0 || a >= n || v.graph.task(a).kind() != TaskKind::alloc) {
    v.fail(id, "alloc", "the name of an alloc task", a >= 0 && a < n ? where(v.graph, a) : "nothing");
  }
  if (freed[a]) v.fail(id, "alloc", "an allocation not freed already", where(v.graph, a));
  freed[a] = true;
}

// The fields of the task's kind.
void check_params(const Validation& v, TaskId id, std::vector<bool>& freed) {
  const Task& t = v.graph.task(id);
  switch (t.kind()) {
    case TaskKind::gemm: {
      const auto& g = std::get<Gemm>(t.params);
      v.positive(id, g.m, "m");
      v.positive(id, g.n, "n");
      v.positive(id, g.k, "k");
      break;
    }
    case TaskKind::attention: check_attention(v, id, std::get<Attention>(t.params)); break;
    case TaskKind::elementwise: {
      const auto& e = std::get<Elementwise>(t.params);
      if (e.bytes_read < 0 || e.bytes_written < 0 || e.bytes_read + e.bytes_written == 0) {
        v.fail(id, "bytes_read", "non-negative byte counts, not both zero", std::to_string(e.bytes_read) + " and " + std::to_string(e.bytes_written));
      }
      break;
    }
    case TaskKind::optimizer: v.positive(id, std::get<OptimizerStep>(t.params).bytes, "bytes"); break;
    case TaskKind::copy: v.positive(id, std::get<Copy>(t.params).bytes, "bytes"); break;
    case TaskKind::p2p: {
      const auto& p = std::get<PointToPoint>(t.params);
      v.positive(id, p.bytes, "bytes");
      if (!v.gpu_ok(p.dst)) v.fail(id, "dst", v.any_gpu, device_name(p.dst));
      if (p.dst == t.device) v.fail(id, "dst", "a GPU other than the sender", device_name(p.dst));
      break;
    }
    case TaskKind::collective: check_collective(v, id, std::get<Collective>(t.params)); break;
    case TaskKind::alloc: {
      const auto& a = std::get<Alloc>(t.params);
      v.positive(id, a.bytes, "bytes");
      if (a.pool == Pool::hbm && is_host(t.device)) v.fail(id, "pool", "\"dram\" on a host device", "\"hbm\"");
      break;
    }
    case TaskKind::free: check_free(v, id, std::get<Free>(t.params), freed); break;
  }
}

// Cycles: Kahn's algorithm; whatever is left over sits on or behind a cycle.
// Compressed successor lists (compress_successors), for graphs not finalized yet.
struct SuccessorLists {
  std::vector<std::int32_t> offset;  // per task, and one past the last
  std::vector<TaskId> to;
  std::span<const TaskId> of(TaskId t) const { return {to.data() + offset[t], static_cast<std::size_t>(offset[t + 1] - offset[t])}; }
};

SuccessorLists checked_successor_lists(const Validation& v) {
  const TaskGraph& graph = v.graph;
  const auto n = static_cast<TaskId>(graph.size());
  std::vector<std::pair<TaskId, TaskId>> edges = graph.edges();
  // finalize() makes every free wait for its alloc: include those edges, or a cycle through them would pass.
  for (TaskId id = 0; id < n; ++id) {
    if (const auto* f = std::get_if<Free>(&graph.task(id).params)) edges.emplace_back(f->alloc, id);
  }
  for (const auto& [from, to] : edges) {
    if (from < 0 || from >= n) v.fail(to, "deps", "existing tasks", "task index " + std::to_string(from));
    if (from == to) v.fail(to, "deps", "no dependency on itself", "itself");
  }
  SuccessorLists lists;
  compress_successors(graph.size(), edges, lists.offset, lists.to);
  return lists;
}

// Kahn's algorithm over the successor lists (the graph's own once finalized: no copy of a graph of millions).
void check_acyclic(const Validation& v) {
  const TaskGraph& graph = v.graph;
  const auto n = static_cast<TaskId>(graph.size());
  const SuccessorLists built = graph.finalized() ? SuccessorLists{} : checked_successor_lists(v);
  auto successors = [&](TaskId t) { return graph.finalized() ? graph.successors(t) : built.of(t); };
  std::vector<std::int32_t> indegree(graph.size(), 0);
  for (TaskId t = 0; t < n; ++t) {
    for (TaskId s : successors(t)) ++indegree[s];
  }
  std::vector<TaskId> ready;
  for (TaskId i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push_back(i);
  }
  std::size_t done = 0;
  while (!ready.empty()) {
    const TaskId t = ready.back();
    ready.pop_back();
    ++done;
    for (TaskId s : successors(t)) {
      if (--indegree[s] == 0) ready.push_back(s);
    }
  }
  if (done != graph.size()) {
    for (TaskId i = 0; i < n; ++i) {
      if (indegree[i] > 0) {
        v.fail(i, "deps", "no dependency cycle", "a cycle (this task is on it or waits on it)");
      }
    }
  }
}

}  // namespace

// Task by task (placement, then fields), then the dependencies: the first error found is the one reported.
void validate(const TaskGraph& graph, int gpus, int nodes, const std::string& origin) {
  const Validation v{graph, gpus, nodes, origin, "a GPU gpu0..gpu" + std::to_string(gpus - 1)};
  std::vector<bool> freed(graph.size(), false);
  for (TaskId id = 0; id < static_cast<TaskId>(graph.size()); ++id) {
    check_placement(v, id);
    check_params(v, id, freed);
  }
  check_acyclic(v);
}

TaskId append(TaskGraph& into, const TaskGraph& from) {
  const auto offset = static_cast<TaskId>(into.size());
  const auto group_offset = static_cast<std::int32_t>(into.groups().size());
  const auto label_offset = static_cast<std::int32_t>(into.labels().size());
  // One chunk length for the whole graph, or none (0) when the parts differ: the executors then refuse it.
  into.set_chunk_tokens(into.size() == 0 || into.chunk_tokens() == from.chunk_tokens() ? from.chunk_tokens() : 0);
  into.set_sequence_tokens(into.size() == 0 || into.sequence_tokens() == from.sequence_tokens() ? from.sequence_tokens() : 0);
  into.set_tensor_shards(into.size() == 0 || into.tensor_shards() == from.tensor_shards() ? from.tensor_shards() : 0);
  for (const auto& g : from.groups()) into.add_group(g);
  for (const auto& l : from.labels()) into.add_label(l);
  for (const Task& t : from.tasks()) {
    Task copy = t;
    if (auto* c = std::get_if<Collective>(&copy.params)) c->group += group_offset;
    if (auto* a = std::get_if<Alloc>(&copy.params)) a->label += label_offset;
    if (auto* f = std::get_if<Free>(&copy.params)) f->alloc += offset;
    into.add(from.name_of(t), std::move(copy));
  }
  for (const auto& [before, after] : from.edges()) into.add_dependency(before + offset, after + offset);
  return offset;
}

TaskGraph without_tasks(const TaskGraph& graph, const std::function<bool(const Task&)>& drop) {
  const std::size_t n = graph.size();
  std::vector<std::vector<TaskId>> preds(n);
  for (const auto& [before, after] : graph.edges()) preds[after].push_back(before);
  std::vector<char> dropped(n);
  for (std::size_t i = 0; i < n; ++i) dropped[i] = drop(graph.tasks()[i]) ? 1 : 0;
  // The kept tasks a dropped task stands for (memoised; the graph is acyclic).
  std::vector<std::vector<TaskId>> stands_for(n);
  std::vector<char> resolved(n);
  std::function<const std::vector<TaskId>&(TaskId)> kept_preds = [&](TaskId id) -> const std::vector<TaskId>& {
    const auto i = static_cast<std::size_t>(id);
    if (!resolved[i]) {
      resolved[i] = 1;
      for (TaskId p : preds[i]) {
        if (!dropped[p]) {
          stands_for[i].push_back(p);
        } else {
          const auto& inherited = kept_preds(p);
          stands_for[i].insert(stands_for[i].end(), inherited.begin(), inherited.end());
        }
      }
    }
    return stands_for[i];
  };
  std::vector<TaskId> new_id(n, -1);
  TaskGraph out;
  out.set_chunk_tokens(graph.chunk_tokens());
  out.set_sequence_tokens(graph.sequence_tokens());
  out.set_tensor_shards(graph.tensor_shards());
  for (const auto& g : graph.groups()) out.add_group(g);
  for (const auto& l : graph.labels()) out.add_label(l);
  for (std::size_t i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    Task copy = graph.tasks()[i];
    if (auto* f = std::get_if<Free>(&copy.params)) {
      TRAINYARD_CHECK(!dropped[f->alloc], "an alloc dropped with its free kept");
      f->alloc = new_id[f->alloc];
    }
    new_id[i] = out.add(graph.name(static_cast<TaskId>(i)), std::move(copy));
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    std::vector<TaskId> deps = kept_preds(static_cast<TaskId>(i));
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    for (TaskId d : deps) out.add_dependency(new_id[d], new_id[i]);
  }
  return out;
}

}  // namespace trainyard::sim
