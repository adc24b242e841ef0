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

DataflowPlan plan_dataflow(const sim::TaskGraph& graph, std::span<const sim::TaskId> order, const model::ModelConfig& model, int gpus_per_node,
                           int rank) {
  DataflowPlan plan;
  std::map<std::pair<sim::DeviceId, Key>, int> live;  // what each place holds now
  plan.releases.assign(order.size(), {});
  auto host_of = [&](sim::DeviceId gpu) { return sim::host_device(gpu / gpus_per_node); };

  auto touch = [&](int instance, int position) {
    auto& acc = plan.instances[instance].accessors;
    if (acc.empty() || acc.back() != position) acc.push_back(position);
  };
  auto find = [&](sim::DeviceId place, const Key& key) {
    auto it = live.find({place, key});
    return it == live.end() ? -1 : it->second;
  };
  auto create = [&](sim::DeviceId place, const Key& key, std::int64_t elements, DType dtype) {
    Instance inst{key, place, dtype, elements * dtype_bytes(dtype), {}, -1, -1, -1, {}};
    if (sim::is_host(place)) {
      inst.host_offset_bytes = plan.host_bytes;
      plan.host_bytes += (inst.bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    }
    plan.instances.push_back(std::move(inst));
    const int id = static_cast<int>(plan.instances.size()) - 1;
    live[{place, key}] = id;
    return id;
  };
  auto release = [&](int instance, int position) {
    Instance& inst = plan.instances[instance];
    inst.release_after = position;
    plan.releases[position].push_back(instance);
  };

  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const int position = static_cast<int>(pos);
    const sim::TaskId id = order[pos];
    const sim::Task& t = graph.task(id);
    TaskTensors step{id, {}, {}, {}};
    auto need = [&](sim::DeviceId place, const Key& key) {
      const int found = find(place, key);
      if (found < 0) {
        throw InternalError(task_name(graph, id) + " reads " + describe(key) + " on " + sim::device_name(place) +
                                ", which does not hold it (run the plan with --device cpu --check on a small model to find the missing copy)",
                            __FILE__, __LINE__);
      }
      return found;
    };
    auto remote = [&](sim::DeviceId place) { return rank >= 0 && !sim::is_host(place) && place != rank; };
    // A send between ranks: this rank's side of it.
    auto across_ranks = [&](sim::DeviceId from, sim::DeviceId to) {
      for (const Key& key : content(t.op)) {
        if (remote(to)) {  // sending: what it carries must be here
          int src = find(from, key);
          if (src < 0 && key.role == Role::dkv) {  // nothing added yet: zeros, so that the message is what the receiver expects
            const TensorShape shape = chunk_tensor(key.role, model_of(t.op, model), graph.chunk_tokens());
            src = create(from, key, shape.elements, shape.dtype);
            step.zero_first.push_back(src);
          }
          if (src < 0) need(from, key);
          touch(src, position);
          step.instances.insert(step.instances.end(), {src, -1});
        } else {  // receiving
          const Key delivered = arrival(t.op, key);
          int dst = find(to, delivered);
          if (dst < 0) {
            const TensorShape shape = chunk_tensor(delivered.role, model_of(t.op, model), graph.chunk_tokens());
            dst = create(to, delivered, shape.elements, shape.dtype);
          }
          touch(dst, position);
          step.instances.insert(step.instances.end(), {-1, dst});
        }
      }
    };
    auto move = [&](sim::DeviceId from, sim::DeviceId to) {
      if (remote(from) || remote(to)) return across_ranks(from, to);
      for (const Key& key : content(t.op)) {
        const int src = find(from, key);
        if (src < 0 && key.role == Role::dkv) {  // an accumulator nothing has added to yet is zero: nothing to move...
          int dst = -1;
          if (const Key delivered = arrival(t.op, key); delivered.role == Role::dkv_in) {  // ...but a ring's is added in: zeros
            const TensorShape shape = chunk_tensor(delivered.role, model_of(t.op, model), graph.chunk_tokens());
            dst = find(to, delivered);
            if (dst < 0) dst = create(to, delivered, shape.elements, shape.dtype);
            step.zero_first.push_back(dst);
            touch(dst, position);
          }
          step.instances.insert(step.instances.end(), {-1, dst});
          continue;
        }
        if (src < 0) need(from, key);
        const Instance& s = plan.instances[src];
        const Key delivered = arrival(t.op, key);
        int dst = find(to, delivered);
        if (dst < 0) dst = create(to, delivered, s.bytes / dtype_bytes(s.dtype), s.dtype);
        touch(src, position);
        touch(dst, position);
        step.instances.insert(step.instances.end(), {src, dst});
      }
    };
    // Ulysses' all-to-all, this rank's side: per tensor, what it sends (its chunks' heads, or its head group of
    // every member's chunks), then what it receives, each in member and chunk order (member_chunks).
    auto exchange_heads = [&] {
      TRAINYARD_CHECK(rank >= 0, "Ulysses' all-to-alls are planned one rank at a time");
      const auto& members = graph.groups()[std::get<sim::Collective>(t.params).group];
      const auto at = std::find(members.begin(), members.end(), rank);
      if (at == members.end()) return;
      const auto me = static_cast<std::int32_t>(at - members.begin()), groups = static_cast<std::int32_t>(members.size());
      for (const HeadsExchanged& e : heads_exchanged(t.op.code)) {
        const std::int64_t whole = graph.chunk_tokens() * e.blocks * width_elements(e.row, model);
        auto key = [&](std::int32_t chunk, std::int32_t heads) { return Key{e.role, t.op.seq, t.op.layer, chunk, 0, heads}; };
        std::vector<Key> mine, theirs;  // this rank's chunks' heads; its head group of every member's chunks
        for (std::int32_t chunk : member_chunks(t.op, me)) mine.push_back(key(chunk, 0));
        for (std::int32_t i = 0; i < groups; ++i) {
          for (std::int32_t chunk : member_chunks(t.op, i)) theirs.push_back(key(chunk, me + 1));
        }
        const bool to_groups = to_head_groups(t.op.code);
        const std::vector<Key>& sent = to_groups ? mine : theirs;
        const std::vector<Key>& received = to_groups ? theirs : mine;
        for (const Key& k : sent) {
          const int src = need(rank, k);
          touch(src, position);
          step.instances.push_back(src);
        }
        for (const Key& k : received) {
          int dst = find(rank, k);
          if (dst < 0) dst = create(rank, k, k.heads > 0 ? whole / groups : whole, e.dtype);
          touch(dst, position);
          step.instances.push_back(dst);
        }
      }
    };
    // All-gather context parallelism, this rank's side (member i holds member_chunks(op, i)): the gather sends K
    // and V of its chunks and receives every other member's, member by member; the reduce-scatter sends each other
    // member its dK | dV of that member's chunks (zeros where nothing was added) and adds what it receives into its own.
    auto cp_exchange = [&] {
      TRAINYARD_CHECK(rank >= 0, "all-gather context parallelism is planned one rank at a time");
      const auto& members = graph.groups()[std::get<sim::Collective>(t.params).group];
      const auto at = std::find(members.begin(), members.end(), rank);
      if (at == members.end()) return;
      const auto me = static_cast<std::int32_t>(at - members.begin());
      const bool gather = t.op.code == sim::OpCode::cp_gather_kv;
      const std::vector<Role> roles = gather ? std::vector<Role>{Role::k, Role::v} : std::vector<Role>{Role::dkv};
      auto each = [&](std::int32_t member, auto&& visit) {
        for (std::int32_t chunk : member_chunks(t.op, member)) {
          for (Role r : roles) visit(Key{r, t.op.seq, t.op.layer, chunk});
        }
      };
      auto take = [&](const Key& k, bool zeroed_if_new) {
        int inst = find(rank, k);
        if (inst < 0) {
          const TensorShape shape = chunk_tensor(k.role, model, graph.chunk_tokens());
          inst = create(rank, k, shape.elements, shape.dtype);
          if (zeroed_if_new) step.zero_first.push_back(inst);
        }
        touch(inst, position);
        step.instances.push_back(inst);
      };
      auto mine = [&](const Key& k) {
        const int inst = need(rank, k);
        touch(inst, position);
        step.instances.push_back(inst);
      };
      if (gather) each(me, mine);
      for (std::int32_t i = 0; i < static_cast<std::int32_t>(members.size()); ++i) {
        if (i != me) each(i, [&](const Key& k) { take(k, !gather); });
      }
      if (!gather) each(me, mine);
    };
    switch (t.kind()) {
      case sim::TaskKind::alloc: break;
      case sim::TaskKind::free: {
        const sim::Task& alloc = graph.task(std::get<sim::Free>(t.params).alloc);
        for (const Key& key : content(alloc.op)) {
          auto it = live.find({alloc.device, key});
          if (it == live.end()) continue;
          release(it->second, position);
          live.erase(it);
        }
        break;
      }
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
        if (is_tensor_parallel_collective(t.op.code)) {
          const auto& members = graph.groups()[std::get<sim::Collective>(t.params).group];
          for (sim::DeviceId member : members) {
            if (rank >= 0 && member != rank) continue;
            for (const Key& key : tensor_parallel_keys(t.op, graph.chunk_tokens())) {
              const int inst = need(member, key);
              touch(inst, position);
              step.instances.push_back(inst);
            }
          }
        }
        break;
      default:
        if (t.op.code == sim::OpCode::states || t.op.code == sim::OpCode::optimizer || t.op.code == sim::OpCode::host_grad_sum) break;
        step.uses = compute_uses(t.op, model, graph.chunk_tokens());
        for (const Use& u : step.uses) {
          int inst = find(t.device, u.key);
          switch (u.access) {
            case Access::read:
            case Access::update: inst = need(t.device, u.key); break;
            case Access::write:
              if (inst < 0) {
                inst = create(t.device, u.key, u.elements, u.dtype);
                if (u.zeroed) step.zero_first.push_back(inst);
              }
              break;
            case Access::accumulate:
              if (inst < 0) {
                inst = create(t.device, u.key, u.elements, u.dtype);
                step.zero_first.push_back(inst);
              }
              break;
          }
          touch(inst, position);
          step.instances.push_back(inst);
        }
        break;
    }
    plan.steps.push_back(std::move(step));
  }
  // What no free dropped is released after its last access.
  for (const auto& [where, instance] : live) {
    const auto& acc = plan.instances[instance].accessors;
    if (!acc.empty()) release(instance, acc.back());
  }
  // The device high-water mark: each instance is live from its first access to its release.
  std::map<sim::DeviceId, std::vector<std::int64_t>> delta;
  for (const Instance& inst : plan.instances) {
    if (sim::is_host(inst.place) || inst.accessors.empty()) continue;
    auto& d = delta.try_emplace(inst.place, order.size() + 1, 0).first->second;
    d[inst.accessors.front()] += inst.bytes;
    d[static_cast<std::size_t>(inst.release_after) + 1] -= inst.bytes;
  }
  for (const auto& [place, d] : delta) {
    std::int64_t live_bytes = 0;
    for (std::int64_t change : d) plan.device_peak_bytes = std::max(plan.device_peak_bytes, live_bytes += change);
  }
  // Offsets in each GPU's arena.
  std::map<sim::DeviceId, std::vector<int>> on_gpu;
  for (std::size_t i = 0; i < plan.instances.size(); ++i) {
    if (!sim::is_host(plan.instances[i].place)) on_gpu[plan.instances[i].place].push_back(static_cast<int>(i));
  }
  for (const auto& [gpu, ids] : on_gpu) {
    std::vector<Lifetime> lifetimes;
    for (int i : ids) {
      const Instance& inst = plan.instances[i];
      lifetimes.push_back(
          {inst.accessors.front(), inst.release_after + 1, (inst.bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment, -1});
    }
    std::vector<std::vector<int>> reuses;
    plan.device_arena_bytes = std::max(plan.device_arena_bytes, place_lifetimes(lifetimes, &reuses));
    for (std::size_t k = 0; k < ids.size(); ++k) {
      Instance& inst = plan.instances[ids[k]];
      inst.device_offset_bytes = lifetimes[k].offset;
      for (int r : reuses[k]) inst.reuses.push_back(ids[r]);
    }
  }
  return plan;
}

}  // namespace trainyard::backend
