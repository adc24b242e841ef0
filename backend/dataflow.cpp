#include "backend/dataflow.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>
#include <utility>

#include "backend/schedule.hpp"
#include "common/error.hpp"

namespace trainyard::backend {

namespace {

std::string task_name(const sim::TaskGraph& g, sim::TaskId id) { return "task " + std::to_string(id) + " '" + std::string(g.name(id)) + "'"; }

}  // namespace

std::vector<sim::TaskId> stream_ordered_order(const sim::TaskGraph& graph, std::vector<std::vector<sim::TaskId>>* preds) {
  const auto n = graph.size();
  if (preds) preds->assign(n, {});
  std::vector<std::vector<sim::TaskId>> succs(n);
  std::vector<int> missing(n, 0);
  auto edge = [&](sim::TaskId a, sim::TaskId b) {
    if (preds) (*preds)[b].push_back(a);
    succs[a].push_back(b);
    ++missing[b];
  };
  for (const auto& [a, b] : graph.edges()) edge(a, b);
  std::map<std::tuple<sim::DeviceId, sim::StreamKind, int>, sim::TaskId> stream_last;
  for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(n); ++id) {
    sim::for_each_occupied_stream(graph, graph.task(id), [&](sim::DeviceId device, sim::Stream stream) {
      auto [it, fresh] = stream_last.try_emplace({device, stream.kind, stream.index}, id);
      if (!fresh) edge(std::exchange(it->second, id), id);
    });
  }
  std::priority_queue<sim::TaskId, std::vector<sim::TaskId>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i) {
    if (missing[i] == 0) ready.push(static_cast<sim::TaskId>(i));
  }
  std::vector<sim::TaskId> order;
  order.reserve(n);
  while (!ready.empty()) {
    const sim::TaskId t = ready.top();
    ready.pop();
    order.push_back(t);
    for (sim::TaskId s : succs[t]) {
      if (--missing[s] == 0) ready.push(s);
    }
  }
  TRAINYARD_CHECK(order.size() == n, "the step's task graph has a cycle");
  return order;
}

void check_sequence_length(const sim::TaskGraph& graph, std::int64_t sequence_tokens) {
  if (graph.chunk_tokens() <= 0 || graph.sequence_tokens() <= 0) {
    throw InputError("the plan's task graph", "chunk and sequence length", "both set by the graph's builder (ring-track, Megatron, ZeRO)",
                     "chunk " + std::to_string(graph.chunk_tokens()) + ", sequence " + std::to_string(graph.sequence_tokens()));
  }
  if (sequence_tokens != graph.sequence_tokens()) {
    throw InputError("the step's tokens", "sequence length", std::to_string(graph.sequence_tokens()) + " tokens, the graph's sequence",
                     std::to_string(sequence_tokens));
  }
}

std::vector<Key> content(const sim::Op& op) {
  if (op.zigzag > 0 || op.chunk_count > 1 || op.seq_count > 1) {  // moves carry no LM-head pieces, so no chunk size is needed
    std::vector<Key> keys;
    for (const sim::Op& one : chunk_ops(op, 0)) {
      const std::vector<Key> more = content(one);
      keys.insert(keys.end(), more.begin(), more.end());
    }
    return keys;
  }
  std::vector<Key> keys;
  const std::int32_t heads = op.head_groups > 0 && !op.is_lm_head() ? op.head_group + 1 : 0;  // a2a+p2p: a head group's blocks
  auto at = [&](Role r, int layer, int chunk) { keys.push_back({r, op.seq, layer, chunk, 0, heads}); };
  switch (op.code) {
    case sim::OpCode::kv:
    case sim::OpCode::dkv:
    case sim::OpCode::dkv_pass:
    case sim::OpCode::kv_dkv:
      for (int j = op.kv_first; j <= op.kv_last; ++j) {
        if (op.code == sim::OpCode::kv || op.code == sim::OpCode::kv_dkv) {
          at(Role::k, op.layer, j);
          at(Role::v, op.layer, j);
        }
        if (op.code != sim::OpCode::kv) keys.push_back({Role::dkv, op.seq, op.layer, j, op.dkv_share(), heads});
      }
      break;
    case sim::OpCode::acts:
      for (Role r : {Role::x, Role::n1, Role::q, Role::o, Role::lse, Role::h1, Role::n2, Role::gu, Role::a}) at(r, op.layer, op.chunk);
      break;
    case sim::OpCode::checkpoint:
      for (Role r : {Role::x, Role::o, Role::lse}) at(r, op.layer, op.chunk);
      break;
    case sim::OpCode::input: at(Role::x, op.layer, op.chunk); break;
    case sim::OpCode::input_grad: at(Role::dx, op.layer, op.chunk); break;
    default: break;
  }
  return keys;
}

Key arrival(const sim::Op& op, Key key) {
  if (op.code == sim::OpCode::dkv_pass) key.role = Role::dkv_in;
  return key;
}

namespace {

// plan_dataflow's walk: one method per kind of task, each adding the task's instances to `step_` (the task at
// `position_` of the order) and creating, finding and releasing what each place holds.
class DataflowPlanner {
 public:
  DataflowPlanner(const sim::TaskGraph& graph, std::span<const sim::TaskId> order, const model::ModelConfig& model, int gpus_per_node, int rank)
      : g_(graph), order_(order), model_(model), gpn_(gpus_per_node), rank_(rank) {
    plan_.releases.assign(order.size(), {});
  }

  DataflowPlan run() {
    for (std::size_t pos = 0; pos < order_.size(); ++pos) plan_.steps.push_back(plan_task(static_cast<int>(pos)));
    // What no free dropped is released after its last access.
    for (const auto& [where, instance] : live_) {
      const auto& acc = plan_.instances[instance].accessors;
      if (!acc.empty()) release(instance, acc.back());
    }
    find_device_peak();
    place_in_arenas();
    return std::move(plan_);
  }

 private:
  TaskTensors plan_task(int position) {
    position_ = position;
    id_ = order_[static_cast<std::size_t>(position)];
    const sim::Task& t = task();
    step_ = TaskTensors{id_, {}, {}, {}};
    switch (t.kind()) {
      case sim::TaskKind::alloc: break;
      case sim::TaskKind::free: free_allocation(g_.task(std::get<sim::Free>(t.params).alloc)); break;
      case sim::TaskKind::copy:
        if (t.op.code != sim::OpCode::states) {
          const bool h2d = std::get<sim::Copy>(t.params).direction == sim::Copy::Direction::h2d;
          move(h2d ? host_of(t.device) : t.device, h2d ? t.device : host_of(t.device));
        }
        break;
      case sim::TaskKind::p2p:
        if (t.op.code != sim::OpCode::states) move(t.device, std::get<sim::PointToPoint>(t.params).dst);
        break;
      case sim::TaskKind::collective:  // model states, Ulysses' all-to-alls, or tensor parallelism's sums in place
        if (is_heads_exchange(t.op.code)) exchange_heads();
        if (t.op.code == sim::OpCode::cp_gather_kv || t.op.code == sim::OpCode::cp_scatter_dkv) cp_exchange();
        if (is_tensor_parallel_collective(t.op.code)) tensor_parallel();
        break;
      default:
        if (t.op.code == sim::OpCode::states || t.op.code == sim::OpCode::optimizer || t.op.code == sim::OpCode::host_grad_sum) break;
        compute();
        break;
    }
    return std::move(step_);
  }

  const sim::Task& task() const { return g_.task(id_); }
  sim::DeviceId host_of(sim::DeviceId gpu) const { return sim::host_device(gpu / gpn_); }
  bool remote(sim::DeviceId place) const { return rank_ >= 0 && !sim::is_host(place) && place != rank_; }
  TensorShape shape_of(Role role) const { return chunk_tensor(role, model_of(task().op, model_), g_.chunk_tokens()); }

  // --- what each place holds ----------------------------------------------------------------------------------
  void touch(int instance) {
    auto& acc = plan_.instances[instance].accessors;
    if (acc.empty() || acc.back() != position_) acc.push_back(position_);
  }
  // Touched by the running task, as its next instance.
  void use(int instance) {
    touch(instance);
    step_.instances.push_back(instance);
  }
  int find(sim::DeviceId place, const Key& key) const {
    auto it = live_.find({place, key});
    return it == live_.end() ? -1 : it->second;
  }
  int need(sim::DeviceId place, const Key& key) const {
    const int found = find(place, key);
    if (found < 0) {
      throw InternalError(task_name(g_, id_) + " reads " + describe(key) + " on " + sim::device_name(place) +
                              ", which does not hold it (run the plan with --device cpu --check on a small model to find the missing copy)",
                          __FILE__, __LINE__);
    }
    return found;
  }
  int create(sim::DeviceId place, const Key& key, std::int64_t elements, ElementType dtype) {
    Instance inst{key, place, dtype, elements * element_bytes(dtype), {}, -1, -1, -1, {}};
    if (sim::is_host(place)) {
      inst.host_offset_bytes = plan_.host_bytes;
      plan_.host_bytes += (inst.bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    }
    plan_.instances.push_back(std::move(inst));
    const int id = static_cast<int>(plan_.instances.size()) - 1;
    live_[{place, key}] = id;
    return id;
  }
  // What `place` holds of `key`, or a new instance there (listed to be zeroed first when `zeroed`).
  int find_or_create(sim::DeviceId place, const Key& key, TensorShape shape, bool zeroed = false) {
    int inst = find(place, key);
    if (inst < 0) {
      inst = create(place, key, shape.elements, shape.dtype);
      if (zeroed) step_.zero_first.push_back(inst);
    }
    return inst;
  }
  void release(int instance, int position) {
    plan_.instances[instance].release_after = position;
    plan_.releases[static_cast<std::size_t>(position)].push_back(instance);
  }

  // --- one method per kind of task ----------------------------------------------------------------------------
  void free_allocation(const sim::Task& alloc) {
    for (const Key& key : content(alloc.op)) {
      auto it = live_.find({alloc.device, key});
      if (it == live_.end()) continue;
      release(it->second, position_);
      live_.erase(it);
    }
  }

  // A copy or a send: (source, destination) pairs of what it carries.
  void move(sim::DeviceId from, sim::DeviceId to) {
    if (remote(from) || remote(to)) return across_ranks(from, to);
    const sim::Op& op = task().op;
    for (const Key& key : content(op)) {
      const int src = find(from, key);
      const Key delivered = arrival(op, key);
      if (src < 0 && key.role == Role::dkv) {  // an accumulator nothing has added to yet is zero: nothing to move...
        int dst = -1;
        if (delivered.role == Role::dkv_in) {  // ...but a ring's is added in: zeros
          dst = find(to, delivered);
          if (dst < 0) {
            const TensorShape shape = shape_of(delivered.role);
            dst = create(to, delivered, shape.elements, shape.dtype);
          }
          step_.zero_first.push_back(dst);
          touch(dst);
        }
        step_.instances.insert(step_.instances.end(), {-1, dst});
        continue;
      }
      if (src < 0) need(from, key);
      const Instance& s = plan_.instances[src];
      int dst = find(to, delivered);
      if (dst < 0) dst = create(to, delivered, s.bytes / element_bytes(s.dtype), s.dtype);
      touch(src);
      touch(dst);
      step_.instances.insert(step_.instances.end(), {src, dst});
    }
  }

  // A send between ranks: this rank's side of it.
  void across_ranks(sim::DeviceId from, sim::DeviceId to) {
    const sim::Op& op = task().op;
    for (const Key& key : content(op)) {
      if (remote(to)) {  // sending: what it carries must be here
        int src = find(from, key);
        if (src < 0 && key.role == Role::dkv) src = find_or_create(from, key, shape_of(key.role), true);  // zeros, as the receiver expects
        if (src < 0) need(from, key);
        touch(src);
        step_.instances.insert(step_.instances.end(), {src, -1});
      } else {  // receiving
        const Key delivered = arrival(op, key);
        const int dst = find_or_create(to, delivered, shape_of(delivered.role));
        touch(dst);
        step_.instances.insert(step_.instances.end(), {-1, dst});
      }
    }
  }

  // This rank's index in the running collective's group, or -1 when it is not a member.
  std::int32_t member_index() const {
    const auto& members = g_.groups()[std::get<sim::Collective>(task().params).group];
    const auto at = std::find(members.begin(), members.end(), rank_);
    return at == members.end() ? -1 : static_cast<std::int32_t>(at - members.begin());
  }
  std::int32_t group_size() const { return static_cast<std::int32_t>(g_.groups()[std::get<sim::Collective>(task().params).group].size()); }

  // Ulysses' all-to-all, this rank's side: per tensor, what it sends (its chunks' heads, or its head group of
  // every member's chunks), then what it receives, each in member and chunk order (member_chunks).
  void exchange_heads() {
    TRAINYARD_CHECK(rank_ >= 0, "Ulysses' all-to-alls are planned one rank at a time");
    const std::int32_t me = member_index(), groups = group_size();
    if (me < 0) return;
    const sim::Op& op = task().op;
    for (const HeadsExchanged& e : heads_exchanged(op.code)) {
      const std::int64_t whole = g_.chunk_tokens() * e.blocks * width_elements(e.row, model_);
      auto key = [&](std::int32_t chunk, std::int32_t heads) { return Key{e.role, op.seq, op.layer, chunk, 0, heads}; };
      std::vector<Key> mine, theirs;  // this rank's chunks' heads; its head group of every member's chunks
      for (std::int32_t chunk : member_chunks(op, me)) mine.push_back(key(chunk, 0));
      for (std::int32_t i = 0; i < groups; ++i) {
        for (std::int32_t chunk : member_chunks(op, i)) theirs.push_back(key(chunk, me + 1));
      }
      const bool to_groups = to_head_groups(op.code);
      for (const Key& k : to_groups ? mine : theirs) use(need(rank_, k));
      for (const Key& k : to_groups ? theirs : mine) use(find_or_create(rank_, k, {k.heads > 0 ? whole / groups : whole, e.dtype}));
    }
  }

  // All-gather context parallelism, this rank's side (member i holds member_chunks(op, i)): the gather sends K
  // and V of its chunks and receives every other member's, member by member; the reduce-scatter sends each other
  // member its dK | dV of that member's chunks (zeros where nothing was added) and adds what it receives into its own.
  void cp_exchange() {
    TRAINYARD_CHECK(rank_ >= 0, "all-gather context parallelism is planned one rank at a time");
    const std::int32_t me = member_index();
    if (me < 0) return;
    const sim::Op& op = task().op;
    const bool gather = op.code == sim::OpCode::cp_gather_kv;
    const std::vector<Role> roles = gather ? std::vector<Role>{Role::k, Role::v} : std::vector<Role>{Role::dkv};
    auto each = [&](std::int32_t member, auto&& visit) {
      for (std::int32_t chunk : member_chunks(op, member)) {
        for (Role r : roles) visit(Key{r, op.seq, op.layer, chunk});
      }
    };
    auto mine = [&](const Key& k) { use(need(rank_, k)); };
    if (gather) each(me, mine);
    for (std::int32_t i = 0; i < group_size(); ++i) {
      if (i != me) each(i, [&](const Key& k) { use(find_or_create(rank_, k, chunk_tensor(k.role, model_, g_.chunk_tokens()), !gather)); });
    }
    if (!gather) each(me, mine);
  }

  // Tensor parallelism's sums and gathers work in place on what each member holds.
  void tensor_parallel() {
    for (sim::DeviceId member : g_.groups()[std::get<sim::Collective>(task().params).group]) {
      if (rank_ >= 0 && member != rank_) continue;
      for (const Key& key : tensor_parallel_keys(task().op, g_.chunk_tokens())) use(need(member, key));
    }
  }

  // A compute op: its table entry's tensors (compute_uses), in order.
  void compute() {
    const sim::Task& t = task();
    step_.uses = compute_uses(t.op, model_, g_.chunk_tokens());
    for (const Use& u : step_.uses) {
      int inst = find(t.device, u.key);
      switch (u.access) {
        case Access::read:
        case Access::update: inst = need(t.device, u.key); break;
        case Access::write: inst = find_or_create(t.device, u.key, {u.elements, u.dtype}, u.zeroed); break;
        case Access::accumulate: inst = find_or_create(t.device, u.key, {u.elements, u.dtype}, true); break;
      }
      use(inst);
    }
  }

  // --- after the walk ---------------------------------------------------------------------------------------------
  // The device high-water mark: each instance is live from its first access to its release.
  void find_device_peak() {
    std::map<sim::DeviceId, std::vector<std::int64_t>> delta;
    for (const Instance& inst : plan_.instances) {
      if (sim::is_host(inst.place) || inst.accessors.empty()) continue;
      auto& d = delta.try_emplace(inst.place, order_.size() + 1, 0).first->second;
      d[inst.accessors.front()] += inst.bytes;
      d[static_cast<std::size_t>(inst.release_after) + 1] -= inst.bytes;
    }
    for (const auto& [place, d] : delta) {
      std::int64_t live_bytes = 0;
      for (std::int64_t change : d) plan_.device_peak_bytes = std::max(plan_.device_peak_bytes, live_bytes += change);
    }
  }

  // Offsets in each GPU's arena.
  void place_in_arenas() {
    std::map<sim::DeviceId, std::vector<int>> on_gpu;
    for (std::size_t i = 0; i < plan_.instances.size(); ++i) {
      if (!sim::is_host(plan_.instances[i].place)) on_gpu[plan_.instances[i].place].push_back(static_cast<int>(i));
    }
    for (const auto& [gpu, ids] : on_gpu) {
      std::vector<Lifetime> lifetimes;
      for (int i : ids) {
        const Instance& inst = plan_.instances[i];
        lifetimes.push_back(
            {inst.accessors.front(), inst.release_after + 1, (inst.bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment, -1});
      }
      std::vector<std::vector<int>> reuses;
      plan_.device_arena_bytes = std::max(plan_.device_arena_bytes, place_lifetimes(lifetimes, &reuses));
      for (std::size_t k = 0; k < ids.size(); ++k) {
        Instance& inst = plan_.instances[ids[k]];
        inst.device_offset_bytes = lifetimes[k].offset;
        for (int r : reuses[k]) inst.reuses.push_back(ids[r]);
      }
    }
  }

  const sim::TaskGraph& g_;
  std::span<const sim::TaskId> order_;
  const model::ModelConfig& model_;
  int gpn_, rank_;
  DataflowPlan plan_;
  std::map<std::pair<sim::DeviceId, Key>, int> live_;  // what each place holds now
  // The task being planned: its position in the order, its id and its instances so far.
  int position_ = 0;
  sim::TaskId id_ = 0;
  TaskTensors step_;
};

}  // namespace

DataflowPlan plan_dataflow(const sim::TaskGraph& graph, std::span<const sim::TaskId> order, const model::ModelConfig& model, int gpus_per_node,
                           int rank) {
  return DataflowPlanner(graph, order, model, gpus_per_node, rank).run();
}

}  // namespace trainyard::backend
