#include "backend/dataflow.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>
#include <utility>
#include <sstream>

#include "backend/schedule.hpp"
#include "common/error.hpp"

namespace trainyard::backend {

namespace {

constexpr const char* kRoleNames[] = {"x (layer input)", "norm1 output", "Q", "K", "V", "running attention output",
                                      "attention output", "attention lse", "projection output", "residual1 output",
                                      "norm2 output", "gate|up", "MLP activation", "MLP output", "dMLP", "dh1", "dact", "dgate|up",
                                      "dnorm2", "dproj", "dO", "attention delta", "dQ", "dK|dV accumulator", "dQKV",
                                      "dnorm1", "dx (input gradient)", "final norm output", "logits", "dlogits"};
static_assert(std::size(kRoleNames) == static_cast<std::size_t>(Role::dlogits) + 1);

std::string task_name(const sim::TaskGraph& g, sim::TaskId id) { return "task " + std::to_string(id) + " '" + g.task(id).name + "'"; }

}  // namespace

std::string describe(const Key& k) {
  std::ostringstream out;
  out << kRoleNames[static_cast<int>(k.role)] << " of layer " << k.layer << " chunk " << k.chunk << " (sequence " << k.seq << ")";
  return out.str();
}

std::vector<sim::TaskId> stream_ordered_order(const sim::TaskGraph& graph, std::vector<std::vector<sim::TaskId>>* preds) {
  const auto n = graph.size();
  if (preds) preds->assign(n, {});
  std::vector<std::vector<sim::TaskId>> succs(n);
  std::vector<int> missing(n, 0);
  auto edge = [&](sim::TaskId a, sim::TaskId b) {
    if (preds) (*preds)[static_cast<std::size_t>(b)].push_back(a);
    succs[static_cast<std::size_t>(a)].push_back(b);
    ++missing[static_cast<std::size_t>(b)];
  };
  for (const auto& [a, b] : graph.edges()) edge(a, b);
  std::map<std::tuple<sim::DeviceId, sim::StreamKind, int>, sim::TaskId> stream_last;
  for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(n); ++id) {
    const auto& t = graph.task(id);
    if (t.stream.kind == sim::StreamKind::none) continue;
    auto [it, fresh] = stream_last.try_emplace({t.device, t.stream.kind, t.stream.index}, id);
    if (!fresh) edge(std::exchange(it->second, id), id);
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
    for (sim::TaskId s : succs[static_cast<std::size_t>(t)]) {
      if (--missing[static_cast<std::size_t>(s)] == 0) ready.push(s);
    }
  }
  TRAINYARD_CHECK(order.size() == n, "the step's task graph has a cycle");
  return order;
}

std::vector<Key> content(const sim::Op& op) {
  std::vector<Key> keys;
  auto at = [&](Role r, int layer, int chunk) { keys.push_back({r, op.seq, layer, chunk}); };
  switch (op.code) {
    case sim::OpCode::kv:
    case sim::OpCode::dkv:
    case sim::OpCode::kv_dkv:
      for (int j = op.first; j <= op.last; ++j) {
        if (op.code != sim::OpCode::dkv) {
          at(Role::k, op.layer, j);
          at(Role::v, op.layer, j);
        }
        if (op.code != sim::OpCode::kv) at(Role::dkv, op.layer, j);
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

std::vector<Use> compute_uses(const sim::Op& op, const model::ModelConfig& m, std::int64_t c) {
  using sim::OpCode;
  const std::int64_t h = m.hidden, q = m.q_dim(), kv = m.kv_dim(), f = m.ffn_hidden, heads = m.heads;
  std::vector<Use> uses;
  auto key = [&](Role r) { return Key{r, op.seq, op.layer, op.chunk}; };
  auto read = [&](Role r) { uses.push_back({key(r), Access::read}); };
  auto write = [&](Role r, std::int64_t elements, DType t = DType::bf16) { uses.push_back({key(r), Access::write, elements, t}); };
  auto update = [&](Role r) { uses.push_back({key(r), Access::update}); };
  auto kv_range = [&](Role r) {
    for (int j = op.first; j <= op.last; ++j) uses.push_back({Key{r, op.seq, op.layer, j}, Access::read});
  };
  auto piece = [&](Role r) { return Key{r, op.seq, op.layer, op.chunk, op.first}; };
  const std::int64_t rows = op.last - op.first;  // the LM head's pieces
  switch (op.code) {
    case OpCode::embed: write(Role::x, c * h); break;
    case OpCode::norm1: read(Role::x); write(Role::n1, c * h); break;
    case OpCode::qkv: read(Role::n1); write(Role::q, c * q); write(Role::k, c * kv); write(Role::v, c * kv); break;
    case OpCode::rope: update(Role::q); update(Role::k); break;
    case OpCode::attn:
      read(Role::q);
      kv_range(Role::k);
      kv_range(Role::v);
      if (op.last == op.chunk) {  // the diagonal comes first and starts the running state
        write(Role::o_run, c * q, DType::fp32);
        write(Role::lse, heads * c, DType::fp32);
      } else {
        update(Role::o_run);
        update(Role::lse);
      }
      write(Role::o, c * q);
      break;
    case OpCode::attn_merge: read(Role::o_run); write(Role::o, c * q); break;
    case OpCode::proj: read(Role::o); write(Role::p, c * h); break;
    case OpCode::residual1: read(Role::x); read(Role::p); write(Role::h1, c * h); break;
    case OpCode::norm2: read(Role::h1); write(Role::n2, c * h); break;
    case OpCode::mlp_up: read(Role::n2); write(Role::gu, 2 * c * f); break;
    case OpCode::act: read(Role::gu); write(Role::a, c * f); break;
    case OpCode::mlp_down: read(Role::a); write(Role::mo, c * h); break;
    case OpCode::residual2:
      read(Role::h1);
      read(Role::mo);
      uses.push_back({Key{Role::x, op.seq, op.layer + 1, op.chunk}, Access::write, c * h});
      break;

    case OpCode::residual2_bwd:
      uses.push_back({Key{Role::dx, op.seq, op.layer + 1, op.chunk}, Access::read});
      write(Role::dm, c * h);
      write(Role::dh1, c * h);
      break;
    case OpCode::mlp_down_dgrad: read(Role::dm); write(Role::da, c * f); break;
    case OpCode::mlp_down_wgrad: read(Role::dm); read(Role::a); break;
    case OpCode::act_bwd: read(Role::gu); read(Role::da); write(Role::dgu, 2 * c * f); break;
    case OpCode::mlp_up_dgrad: read(Role::dgu); write(Role::dn2, c * h); break;
    case OpCode::mlp_up_wgrad: read(Role::dgu); read(Role::n2); break;
    case OpCode::norm2_bwd: read(Role::h1); read(Role::dn2); update(Role::dh1); break;
    case OpCode::residual1_bwd: read(Role::dh1); write(Role::dp, c * h); break;
    case OpCode::proj_dgrad: read(Role::dp); write(Role::d_o, c * q); break;
    case OpCode::proj_wgrad: read(Role::dp); read(Role::o); break;
    case OpCode::attn_bwd:
      kv_range(Role::k);
      kv_range(Role::v);
      read(Role::q);
      read(Role::d_o);
      read(Role::lse);
      if (op.last == op.chunk) {  // the diagonal starts dQ and computes D = rowsum(dO * O)
        read(Role::o);
        write(Role::dq, c * q, DType::fp32);
        write(Role::delta, heads * c, DType::fp32);
      } else {
        update(Role::dq);
        update(Role::delta);
      }
      for (int j = op.first; j <= op.last; ++j) uses.push_back({Key{Role::dkv, op.seq, op.layer, j}, Access::accumulate, 2 * c * kv, DType::fp32});
      break;
    case OpCode::rope_bwd: read(Role::dq); read(Role::dkv); write(Role::dqkv, c * (q + 2 * kv)); break;
    case OpCode::qkv_dgrad: read(Role::dqkv); write(Role::dn1, c * h); break;
    case OpCode::qkv_wgrad: read(Role::dqkv); read(Role::n1); break;
    case OpCode::norm1_bwd: read(Role::x); read(Role::dn1); read(Role::dh1); write(Role::dx, c * h); break;
    case OpCode::embed_bwd: read(Role::dx); break;

    case OpCode::head_logits:
      read(Role::x);
      uses.push_back({piece(Role::logits), Access::write, rows * m.vocab});
      uses.push_back({piece(Role::nf), Access::write, rows * h});
      break;
    case OpCode::head_xent:
      uses.push_back({piece(Role::logits), Access::read});
      uses.push_back({piece(Role::dlogits), Access::write, rows * m.vocab});
      break;
    case OpCode::head_dgrad:
      uses.push_back({piece(Role::dlogits), Access::read});
      read(Role::x);
      // The pieces fill dx's rows one after another: the first starts it.
      if (op.first == 0) {
        write(Role::dx, c * h);
      } else {
        update(Role::dx);
      }
      break;
    case OpCode::head_wgrad:
      uses.push_back({piece(Role::dlogits), Access::read});
      uses.push_back({piece(Role::nf), Access::read});
      break;
    default:
      throw InternalError("op " + std::string(sim::to_string(op.code)) + " is not a compute op", __FILE__, __LINE__);
  }
  return uses;
}

DataflowPlan plan_dataflow(const sim::TaskGraph& graph, std::span<const sim::TaskId> order, const model::ModelConfig& model,
                           std::int64_t chunk_tokens, int gpus_per_node) {
  DataflowPlan plan;
  std::map<std::pair<sim::DeviceId, Key>, int> live;  // what each place holds now
  plan.releases.assign(order.size(), {});
  auto host_of = [&](sim::DeviceId gpu) { return sim::host_device(gpu / gpus_per_node); };

  auto touch = [&](int instance, int position) {
    auto& acc = plan.instances[static_cast<std::size_t>(instance)].accessors;
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
    Instance& inst = plan.instances[static_cast<std::size_t>(instance)];
    inst.release_after = position;
    plan.releases[static_cast<std::size_t>(position)].push_back(instance);
  };

  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const int position = static_cast<int>(pos);
    const sim::TaskId id = order[pos];
    const sim::Task& t = graph.task(id);
    TaskTensors step{id, {}, {}};
    auto need = [&](sim::DeviceId place, const Key& key) {
      const int found = find(place, key);
      if (found < 0) {
        throw InternalError(task_name(graph, id) + " reads " + describe(key) + " on " + sim::device_name(place) +
                                ", which does not hold it (run the plan with --device cpu --check on a small model to find the missing copy)",
                            __FILE__, __LINE__);
      }
      return found;
    };
    auto move = [&](sim::DeviceId from, sim::DeviceId to) {
      for (const Key& key : content(t.op)) {
        const int src = find(from, key);
        if (src < 0 && key.role == Role::dkv) {  // an accumulator nothing has added to yet is zero: nothing to move
          step.instances.insert(step.instances.end(), {-1, -1});
          continue;
        }
        if (src < 0) need(from, key);
        const Instance& s = plan.instances[static_cast<std::size_t>(src)];
        int dst = find(to, key);
        if (dst < 0) dst = create(to, key, s.bytes / dtype_bytes(s.dtype), s.dtype);
        touch(src, position);
        touch(dst, position);
        step.instances.insert(step.instances.end(), {src, dst});
      }
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
      case sim::TaskKind::collective: break;  // model states only (the reference refuses others)
      default:
        if (t.op.code == sim::OpCode::states || t.op.code == sim::OpCode::optimizer) break;
        for (const Use& u : compute_uses(t.op, model, chunk_tokens)) {
          int inst = find(t.device, u.key);
          switch (u.access) {
            case Access::read:
            case Access::update: inst = need(t.device, u.key); break;
            case Access::write:
              if (inst < 0) {
                inst = create(t.device, u.key, u.elements, u.dtype);
                if (t.op.code == sim::OpCode::head_dgrad) step.zero_first.push_back(inst);
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
    const auto& acc = plan.instances[static_cast<std::size_t>(instance)].accessors;
    if (!acc.empty()) release(instance, acc.back());
  }
  // The device high-water mark: each instance is live from its first access to its release.
  std::map<sim::DeviceId, std::vector<std::int64_t>> delta;
  for (const Instance& inst : plan.instances) {
    if (sim::is_host(inst.place) || inst.accessors.empty()) continue;
    auto& d = delta.try_emplace(inst.place, order.size() + 1, 0).first->second;
    d[static_cast<std::size_t>(inst.accessors.front())] += inst.bytes;
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
      const Instance& inst = plan.instances[static_cast<std::size_t>(i)];
      lifetimes.push_back({inst.accessors.front(), inst.release_after + 1, (inst.bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment, -1});
    }
    std::vector<std::vector<int>> reuses;
    plan.device_arena_bytes = std::max(plan.device_arena_bytes, place_lifetimes(lifetimes, &reuses));
    for (std::size_t k = 0; k < ids.size(); ++k) {
      Instance& inst = plan.instances[static_cast<std::size_t>(ids[k])];
      inst.device_offset_bytes = lifetimes[k].offset;
      for (int r : reuses[k]) inst.reuses.push_back(ids[static_cast<std::size_t>(r)]);
    }
  }
  return plan;
}

}  // namespace trainyard::backend
