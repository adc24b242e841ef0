#include "backend/schedule.hpp"

#include <algorithm>
#include <limits>
#include <queue>

#include "common/error.hpp"

namespace trainyard::backend {

namespace {

using sim::DeviceId;
using sim::Stream;
using sim::StreamKind;
using sim::Task;
using sim::TaskGraph;
using sim::TaskId;

struct Involvement {
  bool involved = false;
  bool receive = false;
  DeviceId device = 0;  // whose stream
};

// Whether this rank runs `task`, and on which device's stream: the streams sim::for_each_occupied_stream gives
// (a host task's on the node's first rank, a host optimizer step's on its GPU's rank), plus the receiving side of a
// send to this rank, on a slot of its own.
// Host allocations and frees take no stream and belong to every rank of the node: the order they carry (a copy back
// after the copy out, through the host buffer's free) must hold on each rank that copies.
Involvement involvement(const TaskGraph& graph, const Task& task, int rank, int gpus_per_node) {
  const DeviceId host = sim::host_device(rank / gpus_per_node);
  // A host optimizer step (or sum of streamed gradients) is the rank's whose GPU it serves: each rank steps its own
  // parameters on its CPU, as ZeRO-Offload does, on a host stream slot of its own.
  if (task.op.serves_gpu() && sim::is_host(task.device) && task.stream.kind != StreamKind::none) {
    return task.op.owner_gpu == rank ? Involvement{true, false, task.device} : Involvement{};
  }
  auto mine = [&](DeviceId d) { return d == rank || (rank % gpus_per_node == 0 && d == host); };
  Involvement out;
  sim::for_each_occupied_stream(graph, task, [&](DeviceId device, Stream) {
    if (mine(device)) out = {true, false, device};
  });
  if (out.involved) return out;
  if (const auto* p = std::get_if<sim::PointToPoint>(&task.params); p && p->dst == rank) return {true, true, rank};
  if (task.stream.kind == StreamKind::none && (mine(task.device) || task.device == host)) return {true, false, task.device};
  return out;
}

struct Buffer {
  TaskId alloc = 0, free_task = -1;
  Lifetime lifetime;
};

std::vector<std::vector<TaskId>> place_buffers(std::vector<Buffer>& buffers, Arena& arena) {
  std::vector<Lifetime> lifetimes;
  for (const Buffer& b : buffers) lifetimes.push_back(b.lifetime);
  std::vector<std::vector<int>> earlier;
  arena.size_bytes = place_lifetimes(lifetimes, &earlier);
  std::vector<std::vector<TaskId>> reuse(buffers.size());
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    buffers[i].lifetime = lifetimes[i];
    arena.offset_bytes[buffers[i].alloc] = lifetimes[i].offset;
    for (int o : earlier[i]) {
      if (buffers[o].free_task >= 0) reuse[i].push_back(buffers[o].free_task);
    }
  }
  return reuse;
}

}  // namespace

// Largest first, each at the lowest offset free of the buffers it is live beside (the greedy-by-size strategy
// of TFLite's arena planner; near the live-bytes peak where an online first fit fragments).
std::int64_t place_lifetimes(std::vector<Lifetime>& buffers, std::vector<std::vector<int>>* reuses) {
  std::vector<std::size_t> by_size(buffers.size());
  for (std::size_t i = 0; i < by_size.size(); ++i) by_size[i] = i;
  std::stable_sort(by_size.begin(), by_size.end(), [&](std::size_t x, std::size_t y) { return buffers[x].size > buffers[y].size; });
  std::vector<std::size_t> placed;
  std::int64_t size_bytes = 0;
  for (std::size_t i : by_size) {
    Lifetime& b = buffers[i];
    std::vector<std::pair<std::int64_t, std::int64_t>> taken;  // address ranges of buffers live beside b
    for (std::size_t j : placed) {
      const Lifetime& o = buffers[j];
      if (o.start < b.end && b.start < o.end) taken.emplace_back(o.offset, o.offset + o.size);
    }
    std::sort(taken.begin(), taken.end());
    std::int64_t offset = 0;
    for (const auto& [lo, hi] : taken) {
      if (lo - offset >= b.size) break;
      offset = std::max(offset, hi);
    }
    b.offset = offset;
    placed.push_back(i);
    size_bytes = std::max(size_bytes, offset + b.size);
  }
  if (reuses) {
    reuses->assign(buffers.size(), {});
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      for (std::size_t o = 0; o < buffers.size(); ++o) {
        const Lifetime& a = buffers[o];
        const bool before = a.end <= buffers[i].start;
        if (before && a.offset < buffers[i].offset + buffers[i].size && buffers[i].offset < a.offset + a.size)
          (*reuses)[i].push_back(static_cast<int>(o));
      }
    }
  }
  return size_bytes;
}

std::string StreamSlot::name() const {
  std::string s = sim::device_name(device) + " " + std::string(sim::to_string(stream.kind));
  if (stream.kind == StreamKind::compute || stream.kind == StreamKind::comm) s += std::to_string(stream.index);
  return receive ? s + " recv from " + sim::device_name(sender) : s;
}

namespace {

// make_schedule's phases, each a method over the state they share: which tasks are this rank's and on which
// slot, their local predecessors, the submission order, the arenas, and the event waits.
class ScheduleBuilder {
 public:
  ScheduleBuilder(const TaskGraph& graph, int rank, int gpus_per_node, std::span<const sim::TaskTiming> predicted)
      : graph_(graph), rank_(rank), gpus_per_node_(gpus_per_node), predicted_(predicted), n_(static_cast<TaskId>(graph.size())) {
    out_.rank = rank;
    out_.waited_on.assign(static_cast<std::size_t>(n_), false);
  }

  RankSchedule build() {
    assign_slots();
    link_predecessors();
    order_submissions();
    place_arenas();
    add_event_waits();
    out_.order = std::move(order_);
    return std::move(out_);
  }

 private:
  // Which tasks are ours, and on which slot (-2: not ours; -1: ours without a stream).
  void assign_slots() {
    slot_of_.assign(static_cast<std::size_t>(n_), -2);
    std::map<std::tuple<DeviceId, int, int, bool, DeviceId>, int> slot_ids;
    for (TaskId t = 0; t < n_; ++t) {
      const Task& task = graph_.task(t);
      const Involvement inv = involvement(graph_, task, rank_, gpus_per_node_);
      if (!inv.involved) continue;
      if (task.stream.kind == StreamKind::none) {
        slot_of_[t] = -1;
        continue;
      }
      const DeviceId sender = inv.receive ? task.device : -1;
      const auto key = std::tuple{inv.device, static_cast<int>(task.stream.kind), static_cast<int>(task.stream.index), inv.receive, sender};
      auto [it, inserted] = slot_ids.try_emplace(key, static_cast<int>(out_.streams.size()));
      if (inserted) out_.streams.push_back({inv.device, task.stream, inv.receive, sender});
      slot_of_[t] = it->second;
    }
  }

  // Local predecessors: dependencies and the previous task on the same slot; `pending_` counts both.
  void link_predecessors() {
    preds_.resize(static_cast<std::size_t>(n_));
    succs_.resize(static_cast<std::size_t>(n_));
    pending_.assign(static_cast<std::size_t>(n_), 0);
    for (const auto& [before, after] : graph_.edges()) {
      if (slot_of_[after] == -2) continue;
      if (slot_of_[before] == -2) {
        ++out_.remote_dependencies;
        continue;
      }
      preds_[after].push_back(before);
      succs_[before].push_back(after);
      ++pending_[after];
    }
    std::vector<TaskId> last_on_slot(out_.streams.size(), -1);
    next_on_slot_.assign(static_cast<std::size_t>(n_), -1);
    for (TaskId t = 0; t < n_; ++t) {
      const int slot = slot_of_[t];
      if (slot < 0) continue;
      if (last_on_slot[slot] >= 0) {
        next_on_slot_[last_on_slot[slot]] = t;
        ++pending_[t];
      }
      last_on_slot[slot] = t;
    }
  }

  // Kahn's algorithm, earliest predicted start (then lowest task id) first; a task that can never start (an
  // earlier task on its stream depends on a later one) is an InputError.
  void order_submissions() {
    using Key = std::pair<std::int64_t, TaskId>;
    auto key = [&](TaskId t) { return Key{predicted_.empty() ? 0 : predicted_[t].start_ns, t}; };
    std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
    for (TaskId t = 0; t < n_; ++t) {
      if (slot_of_[t] != -2 && pending_[t] == 0) ready.push(key(t));
    }
    auto release = [&](TaskId t) {
      if (--pending_[t] == 0) ready.push(key(t));
    };
    while (!ready.empty()) {
      const TaskId t = ready.top().second;
      ready.pop();
      order_.push_back(t);
      for (TaskId s : succs_[t]) release(s);
      if (next_on_slot_[t] >= 0) release(next_on_slot_[t]);
    }
    int ours = 0;
    for (int s : slot_of_) ours += s != -2;
    if (static_cast<int>(order_.size()) == ours) return;
    for (TaskId t = 0; t < n_; ++t) {
      if (slot_of_[t] != -2 && pending_[t] > 0) {
        throw InputError("task '" + std::string(graph_.name(t)) + "' on gpu" + std::to_string(rank_) +
                         " can never start: its stream runs tasks in task order and an earlier task on it depends on a later one "
                         "(expected dependencies that follow stream order)");
      }
    }
  }

  // Arenas: lifetimes in submission positions, then the placement and the frees each allocation waits for.
  void place_arenas() {
    std::vector<std::int64_t> at(static_cast<std::size_t>(n_), -1);
    for (std::size_t i = 0; i < order_.size(); ++i) at[order_[i]] = static_cast<std::int64_t>(i);
    std::vector<Buffer> pools[2];
    std::map<TaskId, std::size_t> buffer_of;
    for (TaskId t : order_) {
      if (const auto* a = std::get_if<sim::Alloc>(&graph_.task(t).params)) {
        auto& pool = pools[a->pool == sim::Pool::hbm ? 0 : 1];
        buffer_of[t] = pool.size();
        const std::int64_t size = (std::max<std::int64_t>(a->bytes, 1) + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
        pool.push_back({t, -1, {at[t], std::numeric_limits<std::int64_t>::max(), size, -1}});
      } else if (const auto* f = std::get_if<sim::Free>(&graph_.task(t).params)) {
        const auto& alloc = std::get<sim::Alloc>(graph_.task(f->alloc).params);
        const auto it = buffer_of.find(f->alloc);
        if (it == buffer_of.end()) continue;  // freeing another rank's allocation: validate() rules it out
        Buffer& b = pools[alloc.pool == sim::Pool::hbm ? 0 : 1][it->second];
        b.free_task = t;
        b.lifetime.end = at[t];
      }
    }
    for (int p = 0; p < 2; ++p) {
      const auto reuse = place_buffers(pools[p], p == 0 ? out_.hbm : out_.pinned);
      for (std::size_t i = 0; i < pools[p].size(); ++i) reuse_frees_[pools[p][i].alloc] = reuse[i];
    }
  }

  // Event waits, in submission order. What "t is done" means in events: a step is its own event; an alloc or
  // a free, the events it waited for (an alloc also those of the frees whose bytes it reuses).
  void add_event_waits() {
    std::vector<std::vector<TaskId>> done_events(static_cast<std::size_t>(n_));
    std::vector<int> position(static_cast<std::size_t>(n_), -1);  // index of a step within its slot
    std::vector<int> slot_count(out_.streams.size(), 0);
    for (TaskId t : order_) {
      std::vector<TaskId> waits;
      for (TaskId p : preds_[t]) {
        const auto& e = done_events[p];
        waits.insert(waits.end(), e.begin(), e.end());
      }
      if (const auto it = reuse_frees_.find(t); it != reuse_frees_.end()) {
        for (TaskId f : it->second) waits.insert(waits.end(), done_events[f].begin(), done_events[f].end());
      }
      const int slot = slot_of_[t];
      // Keep the latest task per other slot; drop this slot's own (stream order covers them).
      std::map<int, TaskId> latest;
      for (TaskId w : waits) {
        const int s = slot_of_[w];
        if (s == slot) continue;
        auto [it, inserted] = latest.try_emplace(s, w);
        if (!inserted && position[w] > position[it->second]) it->second = w;
      }
      std::vector<TaskId> pruned;
      for (const auto& [s, w] : latest) pruned.push_back(w);
      if (slot < 0) {
        done_events[t] = std::move(pruned);
      } else {
        for (TaskId w : pruned) out_.waited_on[w] = true;
        position[t] = slot_count[slot]++;
        done_events[t] = {t};
        out_.submissions.push_back({t, slot, std::move(pruned)});
      }
    }
  }

  const TaskGraph& graph_;
  const int rank_, gpus_per_node_;
  const std::span<const sim::TaskTiming> predicted_;
  const TaskId n_;
  RankSchedule out_;
  std::vector<int> slot_of_;
  std::vector<std::vector<TaskId>> preds_, succs_;
  std::vector<int> pending_;
  std::vector<TaskId> next_on_slot_;
  std::vector<TaskId> order_;
  std::map<TaskId, std::vector<TaskId>> reuse_frees_;
};

}  // namespace

RankSchedule make_schedule(const TaskGraph& graph, int rank, int gpus_per_node, std::span<const sim::TaskTiming> predicted) {
  TRAINYARD_CHECK(graph.finalized(), "make_schedule needs a finalized graph");
  TRAINYARD_CHECK(predicted.empty() || predicted.size() == graph.size(), "make_schedule: one predicted timing per task");
  TRAINYARD_CHECK(gpus_per_node > 0 && rank >= 0, "make_schedule: rank and gpus_per_node");
  return ScheduleBuilder(graph, rank, gpus_per_node, predicted).build();
}

}  // namespace trainyard::backend
