// What goes between ranks (executor_impl.hpp): gradient reductions, Ulysses' head all-to-alls, tensor
// parallelism's sums and gathers, all-gather context parallelism, sends.
#include "backend/executor_impl.hpp"

namespace trainyard::backend {

void Executor::Impl::prepare_communicator() {
  if (ranks() <= 1) return;
  std::vector<std::vector<int>> sets{all_ranks()};  // the loss's sum
  for (auto& reduction : reduction_groups(g)) sets.push_back(std::move(reduction));
  for (const sim::Task& t : g.tasks()) {  // tensor parallelism's sums
    if (t.kind() == sim::TaskKind::collective && is_tensor_parallel_collective(t.op.code)) sets.push_back(group_ranks(t));
  }
  opt.comm->prepare_groups(sets);
  dev.prepare_peers(*opt.comm, sets, opt.comm_timeout);
}

void Executor::Impl::reduce_gradients(const sim::Task& t, int stream) {
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

void Executor::Impl::exchange_heads(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
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

void Executor::Impl::tensor_parallel(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
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

void Executor::Impl::reduce_scatter_rows(char* base, std::int64_t bytes, const std::vector<int>& ranks, sim::TaskId id, int stream) {
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

void Executor::Impl::sum_norm_gradients(const sim::Op& op, const std::vector<int>& ranks, int stream) {
  for (int l = op.kv_first; l <= op.kv_last; ++l) {
    for (LayerWeight w : {LayerWeight::norm1, LayerWeight::norm2}) dev.all_reduce_sum(stream, *opt.comm, ranks, layer(l, w).grad, m.hidden);
  }
  if (op.row_begin == 1) dev.all_reduce_sum(stream, *opt.comm, ranks, params[final_norm].grad, m.hidden);
}

void Executor::Impl::cp_exchange(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
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

std::vector<int> Executor::Impl::group_ranks(const sim::Task& task) const {
  const auto& members = g.groups()[std::get<sim::Collective>(task.params).group];
  return {members.begin(), members.end()};
}

void Executor::Impl::exchange(const sim::Task& task, sim::TaskId id, const TaskTensors& t, int stream) {
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

}  // namespace trainyard::backend
