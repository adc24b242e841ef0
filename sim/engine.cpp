#include "sim/engine.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <unordered_map>

#include "common/units.hpp"
#include "sim/collectives.hpp"
#include "sim/cost_model.hpp"
#include "sim/event_queue.hpp"
#include "sim/flow_network.hpp"

namespace trainyard::sim {

double SimResult::mfu() const { return step_ns > 0 ? model_flops / (static_cast<double>(step_ns) * 1e-9 * gpus * peak_flops_per_gpu) : 0; }
double SimResult::hfu() const { return step_ns > 0 ? hardware_flops / (static_cast<double>(step_ns) * 1e-9 * gpus * peak_flops_per_gpu) : 0; }

std::string OomReport::describe(const TaskGraph& graph) const {
  std::string out = "out of memory at task '" + std::string(graph.name(task)) + "': " + pool + " needs " +
                    format_bytes(static_cast<double>(requested_bytes)) + " with " + format_bytes(static_cast<double>(in_use_bytes)) + " of " +
                    format_bytes(static_cast<double>(capacity_bytes)) + " in use: " + format_bytes(static_cast<double>(excess_bytes)) + " (" +
                    std::to_string(excess_bytes) + " bytes) over; largest live:";
  for (const auto& [label, bytes] : largest_live) out += " " + label + " (" + format_bytes(static_cast<double>(bytes)) + "),";
  if (!largest_live.empty()) out.pop_back();
  return out;
}

namespace {

// A kernel sharing SMs with collectives ends with kSharedEnd (its end can move); other tasks with kTaskEnd.
enum EventKind : std::uint32_t { kTaskEnd = 0, kFlowEnd = 1, kStepDone = 2, kSharedEnd = 3 };

bool is_transfer(TaskKind k) { return k == TaskKind::copy || k == TaskKind::p2p || k == TaskKind::collective; }

struct RouteResources {
  std::vector<std::int32_t> resources;
  std::int64_t latency_ns = 0;
};

class Engine {
 public:
  Engine(const TaskGraph& graph, const Cluster& cluster, const SimOptions& options)
      : graph_(graph),
        cluster_(cluster),
        topo_(cluster.topology),
        options_(options),
        library_(options.collectives ? *options.collectives : stacks::default_collective_library()),
        compute_(cluster.node, cluster.stack),
        compute_memo_(compute_),
        network_(capacities()) {
    TRAINYARD_CHECK(!library_.protocols.empty(), "a collective library without protocols");
    for (const auto& p : library_.protocols) result_.protocol_names.push_back(p.name);
    if (library_.nvls) result_.protocol_names.push_back("NVLS");
  }

  SimResult run();

 private:
  std::vector<double> capacities() const {
    std::vector<double> caps(static_cast<std::size_t>(2 * topo_.link_count()));
    for (int l = 0; l < topo_.link_count(); ++l) {
      const auto& link = topo_.link(l);
      caps[2 * link.index] = link.GBps_per_direction;  // 1 GB/s = 1 byte/ns
      caps[2 * link.index + 1] = link.GBps_per_direction;
    }
    return caps;
  }

  void build_streams();
  void prepare();  // results, pools, streams and blocker counts
  void start();    // what can start at time 0
  void flow_ended(const Event& e);
  void collective_step_done(TaskId t);
  void collect();  // the step's figures once the loop is done
  void collect_links();
  void release(TaskId t);  // one blocker gone; launches at zero
  void launch(TaskId t);
  // Inlined on purpose: GCC drops calls to a function that only prefetches (it counts as free of effects).
  [[gnu::always_inline]] inline void prefetch_next_in_streams(TaskId t) const;
  void note_exposed_wait(TaskId t, const Task& task, std::int64_t now);
  ComputeTimes compute_times(TaskId t, const Task& task);
  void launch_compute(TaskId t, const Task& task, std::int64_t now);
  void launch_collective(TaskId t, const Collective& c);
  void launch_alloc(TaskId t, const Task& task, std::int64_t now);
  void report_oom(TaskId t, int pool, std::int64_t bytes, std::int64_t in_use);
  void launch_free(TaskId t, const Task& task, std::int64_t now);
  std::int64_t host_issue_ns(const Task& task, int kernels, std::int64_t now);
  void finish(TaskId t);
  void start_flow(TaskId owner, const RouteResources& route, double bytes, double cap);
  void push_changed_flows();
  void start_collective_step(TaskId t);
  std::optional<RouteResources> cross_node_route(hw::VertexId from, hw::VertexId to);
  void record_links();
  const RouteResources& route(hw::VertexId from, hw::VertexId to);
  // The legs' routes one after the other (a path through the vertices where they meet), hop limit checked.
  RouteResources chain(std::initializer_list<std::pair<hw::VertexId, hw::VertexId>> legs);
  const RouteResources& gpu_to_gpu(DeviceId a, DeviceId b);
  // A collective's transfer between two members: gpu_to_gpu, except that a lone member of a ring across nodes
  // loops through the network (network_loopback) rather than its NVSwitch.
  const RouteResources& member_route(const Collective& c, DeviceId a, DeviceId b);
  RouteResources loopback(hw::VertexId gpu);
  RouteResources network_loopback(hw::VertexId gpu);
  // Memoised per GPU (routes_ never moves its entries): copies and sends look routes up once per task.
  const RouteResources& copy_route(DeviceId gpu, bool h2d);
  const RouteResources& send_route(DeviceId src, DeviceId dst);
  void check_route_length(const RouteResources& r, hw::VertexId from, hw::VertexId to) const;
  hw::VertexId gpu_vertex(DeviceId g) const { return topo_.gpu(cluster_.node_of(g), cluster_.slot_of(g)); }
  // The DRAM on the GPU's socket: found once for node 0's GPU of the same index, then shifted to its node.
  hw::VertexId host_memory_of(DeviceId gpu) {
    const int per_node = topo_.gpus_per_node();
    if (host_memory_.empty()) {
      for (int g = 0; g < per_node; ++g) host_memory_.push_back(*topo_.nearest_host_memory(topo_.gpu(0, g)));
    }
    const int node = cluster_.node_of(gpu);
    return host_memory_[cluster_.slot_of(gpu)] - topo_.first_vertex(0) + topo_.first_vertex(node);
  }
  int pool_of(const Task& t, Pool pool) const {
    if (pool == Pool::hbm) return t.device;
    const int node = is_host(t.device) ? host_node(t.device) : cluster_.node_of(t.device);
    return cluster_.gpus() + node;
  }
  std::string describe_stuck() const;

  const TaskGraph& graph_;
  const Cluster& cluster_;
  const hw::Topology& topo_;
  SimOptions options_;
  const stacks::CollectiveLibrary& library_;
  ComputeModel compute_;
  ComputeMemo compute_memo_;
  std::vector<std::int64_t> host_issued_ns_;  // per GPU: when the host has issued its latest kernel
  // SMs shared with collectives: per GPU, the thread blocks running collectives hold, and the GEMM and attention
  // kernels running there, whose end moves when that changes (a newer end event carries a newer version).
  struct SharedCompute {
    TaskId task;
    std::int64_t full_rate_ns;  // the kernel's duration on all SMs
    double remaining_ns;        // of full-rate work left at since_ns
    double rate;                // share of the SMs it has now
    std::int64_t since_ns;
    std::uint32_t version = 0;
  };
  std::vector<int> collective_ctas_;
  std::vector<std::vector<SharedCompute>> shared_compute_;
  double sm_share(DeviceId gpu) const;
  bool shares_sms(const Task& task) const {
    return cluster_.node.gpu.sustained.collective_ctas.value > 0 && !is_host(task.device) &&
           (task.kind() == TaskKind::gemm || task.kind() == TaskKind::attention);
  }
  void change_collective_ctas(TaskId collective, int sign);
  bool stale_end(TaskId t, std::uint32_t version);
  int protocol_index_ = 0;  // the last choose_protocol's pick
  FlowNetwork network_;
  EventQueue queue_;
  SimResult result_;

  HugePageVector<std::int32_t> blocking_;  // unfinished deps + streams where the task is not yet at the head
  HugePageVector<std::int32_t> task_stream_offset_;
  HugePageVector<std::int32_t> task_streams_;  // stream ids each task occupies
  struct StreamState {
    DeviceId device;
    Stream stream;
    std::int32_t first = 0, count = 0, head = 0;  // into stream_tasks_
    std::int64_t free_since = 0;
  };
  std::vector<StreamState> streams_;
  HugePageVector<TaskId> stream_tasks_;
  HugePageVector<std::int64_t> head_since_;  // when the task reached the head of its (first) stream
  HugePageVector<TaskId> last_dep_;          // the dependency that finished last
  struct FlowOwner {
    std::int64_t latency_ns = 0;  // the route's, added after a copy/p2p flow ends
    bool collective = false;      // its end counts towards a collective step instead
  };
  std::vector<FlowOwner> flow_owners_;  // per flow id, so that a flow's end need not read its task
  struct CollectiveState {
    int step = 0;
    int steps = 0;
    int outstanding = 0;
    std::int64_t latency_ns = 0;
    std::vector<std::vector<int>> channels;  // member order of each ring channel (collectives.hpp ring_channels)
    double efficiency = 1;                   // of the protocol chosen: data bytes per wire byte
    std::int64_t base_latency_ns = 0;        // paid once, with the first step
    std::int64_t step_latency_ns = 0;
    std::optional<hw::VertexId> nvls_switch;  // set: an NVLS all-reduce through this NVSwitch, one step
    double nvls_wire_bytes = 0;               // each way per member, NVLS only
  };
  double choose_protocol(const Collective& c, CollectiveState& state);
  // The buffer whose per-step slices, over the group's members, are those of the whole ring: a ring of
  // ring_ranks moves bytes / ring_ranks per step, which a group of m members moves for a buffer of
  // bytes * m / ring_ranks.
  std::int64_t simulated_bytes(const Collective& c) const {
    if (c.ring_ranks == 0) return c.bytes;
    const auto m = static_cast<double>(graph_.groups()[c.group].size());
    return static_cast<std::int64_t>(std::llround(static_cast<double>(c.bytes) * m / c.ring_ranks));
  }
  void consider_nvls(const Collective& c, CollectiveState& state, double predicted_ns);
  std::optional<hw::VertexId> nvlink_switch_of(hw::VertexId gpu) const;
  bool crosses_nvlink(const RouteResources& r) const {
    return std::any_of(r.resources.begin(), r.resources.end(), [&](std::int32_t res) { return topo_.link(res / 2).type == hw::LinkType::nvlink; });
  }
  std::unordered_map<TaskId, CollectiveState> collectives_;
  std::vector<Transfer> step_transfers_;
  std::unordered_map<std::uint64_t, RouteResources> routes_;
  std::vector<const RouteResources*> copy_routes_;  // per GPU: d2h, h2d
  struct SendRoute {
    DeviceId dst = -1;
    const RouteResources* route = nullptr;
  };
  std::vector<SendRoute> send_routes_;  // per GPU: the latest destination's route
  std::unordered_map<int, std::vector<Sample>> link_samples_;
  std::vector<hw::VertexId> host_memory_;
  std::vector<std::int64_t> pool_in_use_;
  std::vector<std::vector<TaskId>> pool_live_;
  std::vector<std::int32_t> live_slot_;
  std::size_t finished_ = 0;
  bool stop_ = false;
};

void Engine::build_streams() {
  const auto n = static_cast<TaskId>(graph_.size());
  // Per device (hosts after the GPUs), the ids of its streams: a device has a handful, so a scan beats a hash.
  std::vector<std::vector<std::int32_t>> device_streams(static_cast<std::size_t>(cluster_.gpus() + cluster_.nodes));
  auto stream_id = [&](DeviceId device, Stream s) {
    const auto slot = static_cast<std::size_t>(is_host(device) ? cluster_.gpus() + host_node(device) : device);
    TRAINYARD_CHECK(slot < device_streams.size(), "a task on a device the cluster lacks");
    auto& ids = device_streams[slot];
    for (std::int32_t id : ids) {
      if (streams_[id].stream.kind == s.kind && streams_[id].stream.index == s.index) return id;
    }
    ids.push_back(static_cast<std::int32_t>(streams_.size()));
    streams_.push_back({device, s});
    return ids.back();
  };
  task_stream_offset_.assign(static_cast<std::size_t>(n) + 1, 0);
  task_streams_.reserve(static_cast<std::size_t>(n));
  for (TaskId t = 0; t < n; ++t) {
    for_each_occupied_stream(graph_, graph_.task(t), [&](DeviceId device, Stream stream) { task_streams_.push_back(stream_id(device, stream)); });
    task_stream_offset_[static_cast<std::size_t>(t) + 1] = static_cast<std::int32_t>(task_streams_.size());
  }
  // Each stream's tasks in submission order.
  std::vector<std::int32_t> fill(streams_.size(), 0);
  for (std::int32_t s : task_streams_) ++streams_[s].count;
  std::int32_t offset = 0;
  for (auto& s : streams_) {
    s.first = s.head = offset;
    offset += s.count;
  }
  stream_tasks_.resize(task_streams_.size());
  for (TaskId t = 0; t < n; ++t) {
    for (std::int32_t i = task_stream_offset_[t]; i < task_stream_offset_[static_cast<std::size_t>(t) + 1]; ++i) {
      auto& s = streams_[task_streams_[i]];
      stream_tasks_[s.first + fill[task_streams_[i]]++] = t;
    }
  }
}

// ns-3's shape: prepare the state, start what can start, run the event loop, collect the figures.
SimResult Engine::run() {
  TRAINYARD_CHECK(graph_.finalized(), "simulate() needs a finalized graph");
  prepare();
  start();
  while (!queue_.empty() && !stop_) {
    const Event e = queue_.pop();
    if ((++result_.events & 4095) == 0 && options_.cancel && options_.cancel->load(std::memory_order_relaxed)) {
      stop_ = true;
      result_.stuck = "cancelled";
      break;
    }
    switch (e.kind()) {
      case kTaskEnd: finish(e.id); break;
      case kSharedEnd:
        if (!stale_end(e.id, e.version)) finish(e.id);
        break;
      case kFlowEnd: flow_ended(e); break;
      case kStepDone: collective_step_done(e.id); break;
      default: TRAINYARD_CHECK(false, "unknown event kind");
    }
  }
  collect();
  return std::move(result_);
}

void Engine::prepare() {
  const auto n = static_cast<TaskId>(graph_.size());
  const int gpus = cluster_.gpus();
  result_.gpus = gpus;
  result_.peak_flops_per_gpu = cluster_.node.gpu.peak_tflops(hw::Dtype::bf16) * 1e12;
  result_.timing.assign(static_cast<std::size_t>(n), {});
  result_.exposed_transfer_ns.assign(static_cast<std::size_t>(gpus), 0);
  const stacks::StackProfile& stack = cluster_.stack;
  result_.stack = stack.name;
  result_.attention_impl = stacks::to_string(compute_.attention_impl());
  result_.hbm_fixed_bytes = stack.memory.fixed_bytes();
  result_.allocator_overhead = stack.memory.allocator_overhead.value;
  const auto allocatable = static_cast<std::int64_t>(stack.allocatable_bytes(cluster_.node.gpu.hbm_bytes.value));
  for (int g = 0; g < gpus; ++g) result_.pools.push_back({"gpu" + std::to_string(g) + " hbm", allocatable, 0, {}});
  host_issued_ns_.assign(static_cast<std::size_t>(gpus), 0);
  collective_ctas_.assign(static_cast<std::size_t>(gpus), 0);
  shared_compute_.assign(static_cast<std::size_t>(gpus), {});
  copy_routes_.assign(2 * static_cast<std::size_t>(gpus), nullptr);
  send_routes_.assign(static_cast<std::size_t>(gpus), {});
  for (int node = 0; node < cluster_.nodes; ++node) {
    result_.pools.push_back({"host" + std::to_string(node) + " dram", static_cast<std::int64_t>(cluster_.node.host_dram_bytes.value), 0, {}});
  }
  pool_in_use_.assign(result_.pools.size(), 0);
  pool_live_.assign(result_.pools.size(), {});
  live_slot_.assign(static_cast<std::size_t>(n), -1);
  head_since_.assign(static_cast<std::size_t>(n), 0);
  last_dep_.assign(static_cast<std::size_t>(n), -1);
  build_streams();
  blocking_.resize(static_cast<std::size_t>(n));
  for (TaskId t = 0; t < n; ++t) {
    blocking_[t] = graph_.predecessor_count(t) + task_stream_offset_[static_cast<std::size_t>(t) + 1] - task_stream_offset_[t];
  }
}

// Stream heads first (in stream order), then tasks with nothing to wait for, in task order.
void Engine::start() {
  for (auto& s : streams_) {
    if (s.count > 0) release(stream_tasks_[s.first]);
  }
  const auto n = static_cast<TaskId>(graph_.size());
  for (TaskId t = 0; t < n && !stop_; ++t) {
    if (blocking_[t] == 0 && result_.timing[t].start_ns < 0) launch(t);
  }
}

void Engine::flow_ended(const Event& e) {
  if (e.version != network_.version(e.id)) return;       // its completion moved earlier; a newer event exists
  if (network_.completion_ns(e.id) > queue_.now_ns()) {  // its completion moved later: wait until then
    queue_.push(network_.completion_ns(e.id), kFlowEnd, e.id, e.version);
    return;
  }
  const TaskId owner = network_.owner(e.id);
  const FlowOwner flow_owner = flow_owners_[e.id];
  network_.finish(e.id, queue_.now_ns());
  push_changed_flows();
  if (options_.record_links) record_links();
  if (!flow_owner.collective) {
    queue_.push(queue_.now_ns() + flow_owner.latency_ns, kTaskEnd, owner);
    return;
  }
  CollectiveState& state = collectives_.at(owner);
  if (--state.outstanding == 0) queue_.push(queue_.now_ns() + state.latency_ns, kStepDone, owner);
}

void Engine::collective_step_done(TaskId t) {
  auto& state = collectives_.at(t);
  if (++state.step == state.steps) {
    collectives_.erase(t);
    change_collective_ctas(t, -1);
    finish(t);
  } else {
    start_collective_step(t);
  }
}

void Engine::collect() {
  result_.completed = !stop_ && finished_ == graph_.size();
  if (!stop_ && !result_.completed) result_.stuck = describe_stuck();
  for (const auto& timing : result_.timing) result_.step_ns = std::max(result_.step_ns, timing.end_ns);
  network_.settle(queue_.now_ns());
  result_.flow_recomputes = network_.stats().recomputes;
  result_.max_concurrent_flows = network_.stats().max_active_flows;
  result_.engine_bytes = result_.timing.capacity() * sizeof(TaskTiming) + blocking_.capacity() * 4 + task_stream_offset_.capacity() * 4 +
                         task_streams_.capacity() * 4 + stream_tasks_.capacity() * 4 + head_since_.capacity() * 8 + last_dep_.capacity() * 4 +
                         flow_owners_.capacity() * sizeof(FlowOwner) + live_slot_.capacity() * 4;
  result_.mean_component_flows = network_.stats().recomputes > 0
                                     ? static_cast<double>(network_.stats().component_flows) / static_cast<double>(network_.stats().recomputes)
                                     : 0;
  collect_links();
  // Busy time per stream, summed in task order: one pass over the timings instead of a strided one per stream.
  std::vector<std::int64_t> busy_ns(streams_.size(), 0);
  for (std::size_t t = 0; t < result_.timing.size(); ++t) {
    const auto& timing = result_.timing[t];
    if (timing.end_ns < 0) continue;
    for (std::int32_t i = task_stream_offset_[t]; i < task_stream_offset_[t + 1]; ++i) busy_ns[task_streams_[i]] += timing.end_ns - timing.start_ns;
  }
  for (std::size_t s = 0; s < streams_.size(); ++s) result_.streams.push_back({streams_[s].device, streams_[s].stream, busy_ns[s]});
}

// Every link direction that carried bytes, with its busy time and (when recorded) its load over time.
void Engine::collect_links() {
  for (int l = 0; l < topo_.link_count(); ++l) {
    const auto& link = topo_.link(l);
    const auto [a, b] = topo_.link_ends(l);
    for (int dir = 0; dir < (link.full_duplex ? 2 : 1); ++dir) {
      const int r = 2 * link.index + dir;
      if (network_.bytes_moved(r) <= 0) continue;
      const auto lo = std::min(a, b), hi = std::max(a, b);
      const std::string name = link.full_duplex ? (dir == 0 ? topo_.name(lo) + "->" + topo_.name(hi) : topo_.name(hi) + "->" + topo_.name(lo))
                                                : topo_.name(lo) + "<->" + topo_.name(hi);
      LinkUsage usage{name, link.type, link.GBps_per_direction, network_.bytes_moved(r), network_.busy_ns(r), {}};
      if (auto s = link_samples_.find(r); s != link_samples_.end()) usage.load_GBps = std::move(s->second);
      result_.links.push_back(std::move(usage));
    }
  }
}

void Engine::release(TaskId t) {
  // After a failure nothing new starts: the report shows the state at the first failing task.
  if (--blocking_[t] == 0 && !stop_) launch(t);
}

// The host issues a GPU's kernels one after another, running ahead of the GPU, at the stack's dispatch cost per
// kernel; a kernel cannot start before it has been issued. Where the stack syncs before the optimizer the host
// first waits for the GPU to get there.
std::int64_t Engine::host_issue_ns(const Task& task, int kernels, std::int64_t now) {
  std::int64_t& issued = host_issued_ns_[task.device];
  const stacks::StackProfile& stack = cluster_.stack;
  if (task.kind() == TaskKind::optimizer && stack.host.sync_before_optimizer) issued = std::max(issued, now);
  issued += static_cast<std::int64_t>(std::ceil(kernels * stack.host.dispatch_us_per_kernel.value * 1e3));
  if (issued <= now) return now;
  result_.host_wait_ns += issued - now;
  return issued;
}

double Engine::sm_share(DeviceId gpu) const {
  const double sms = cluster_.node.gpu.sm_count.value;
  const double held = std::min(sms - 1, static_cast<double>(collective_ctas_[gpu]));
  return (sms - held) / sms;
}

// A collective starts (+1) or ends (-1) on its members: the GEMM and attention kernels running there go on at
// the SM share that leaves them, from now.
void Engine::change_collective_ctas(TaskId collective, int sign) {
  const int ctas = static_cast<int>(cluster_.node.gpu.sustained.collective_ctas.value);
  if (ctas == 0) return;
  const std::int64_t now = queue_.now_ns();
  const auto& c = std::get<Collective>(graph_.task(collective).params);
  for (DeviceId gpu : graph_.groups()[c.group]) {
    collective_ctas_[gpu] += sign * ctas;
    const double rate = sm_share(gpu);
    for (SharedCompute& k : shared_compute_[gpu]) {
      if (k.rate == rate) continue;
      k.remaining_ns -= static_cast<double>(std::max<std::int64_t>(0, now - k.since_ns)) * k.rate;
      k.since_ns = std::max(now, k.since_ns);
      k.rate = rate;
      queue_.push(k.since_ns + static_cast<std::int64_t>(std::ceil(std::max(0.0, k.remaining_ns) / rate)), kSharedEnd, k.task, ++k.version);
    }
  }
}

// True for an end event a change of SM share has replaced; a kernel's last end also counts the time it lost.
bool Engine::stale_end(TaskId t, std::uint32_t version) {
  const Task& task = graph_.task(t);
  auto& running = shared_compute_[task.device];
  const auto it = std::find_if(running.begin(), running.end(), [&](const SharedCompute& k) { return k.task == t; });
  if (it == running.end() || it->version != version) return true;
  const std::int64_t elapsed = queue_.now_ns() - result_.timing[t].start_ns;
  const std::int64_t lost = std::max<std::int64_t>(0, elapsed - it->full_rate_ns);
  result_.collective_sm_ns += lost;
  result_.compute_classes[static_cast<std::size_t>(task.kind())].busy_ns += lost;
  *it = running.back();
  running.pop_back();
  return false;
}

void Engine::launch(TaskId t) {
  const Task& task = graph_.task(t);
  const std::int64_t now = queue_.now_ns();
  result_.timing[t].start_ns = now;
  note_exposed_wait(t, task, now);
  prefetch_next_in_streams(t);
  switch (task.kind()) {
    case TaskKind::gemm:
    case TaskKind::attention:
    case TaskKind::elementwise:
    case TaskKind::optimizer: launch_compute(t, task, now); break;
    case TaskKind::copy: {
      const auto& c = std::get<Copy>(task.params);
      const bool h2d = c.direction == Copy::Direction::h2d;
      const auto& sustained = cluster_.node.gpu.sustained;
      // Pageable copies are staged through a pinned bounce buffer by the driver: about half the pinned rate.
      const double cap = (h2d ? sustained.pcie_h2d_GBps.value : sustained.pcie_d2h_GBps.value) * (c.pinned ? 1.0 : 0.5);
      start_flow(t, copy_route(task.device, h2d), static_cast<double>(c.bytes), cap);
      break;
    }
    case TaskKind::p2p: {
      const auto& p = std::get<PointToPoint>(task.params);
      start_flow(t, send_route(task.device, p.dst), static_cast<double>(p.bytes), FlowNetwork::kUncapped);
      break;
    }
    case TaskKind::collective: launch_collective(t, std::get<Collective>(task.params)); break;
    case TaskKind::alloc: launch_alloc(t, task, now); break;
    case TaskKind::free: launch_free(t, task, now); break;
  }
}

// The tasks queued behind `t` are likely released when it ends; by then their state (read at random: streams
// interleave in task order) can be in cache instead of costing a miss per array.
inline void Engine::prefetch_next_in_streams(TaskId t) const {
  for (std::int32_t i = task_stream_offset_[t]; i < task_stream_offset_[static_cast<std::size_t>(t) + 1]; ++i) {
    const StreamState& s = streams_[task_streams_[i]];
    if (s.head + 1 >= s.first + s.count) continue;
    const TaskId next = stream_tasks_[s.head + 1];
    const Task& task = graph_.task(next);
    __builtin_prefetch(&task.device);  // device and stream, then the params through their variant index
    __builtin_prefetch(&task.params);
    __builtin_prefetch(reinterpret_cast<const char*>(&task.params + 1) - 1);
    __builtin_prefetch(&blocking_[next]);
    __builtin_prefetch(&head_since_[next]);
    __builtin_prefetch(&last_dep_[next]);
    __builtin_prefetch(&task_stream_offset_[next]);
    __builtin_prefetch(&result_.timing[next]);
  }
}

// Exposed transfer time: the main compute stream sat idle waiting for a copy or message.
void Engine::note_exposed_wait(TaskId t, const Task& task, std::int64_t now) {
  if (task.stream.kind != StreamKind::compute || task.stream.index != 0 || is_host(task.device)) return;
  const TaskId dep = last_dep_[t];
  const std::int64_t idle_since = head_since_[t];
  if (dep >= 0 && is_transfer(graph_.task(dep).kind()) && now > idle_since) {
    result_.exposed_transfer_ns[task.device] += now - idle_since;
  }
}

// The cost model knows the task but not its name, which lives in the graph: an error there gets it here.
ComputeTimes Engine::compute_times(TaskId t, const Task& task) {
  try {
    return compute_memo_.times(task);
  } catch (const InputError& e) {
    throw InputError("task '" + std::string(graph_.name(t)) + "': " + e.what());
  }
}

void Engine::launch_compute(TaskId t, const Task& task, std::int64_t now) {
  const TaskKind kind = task.kind();
  const ComputeTimes times = compute_times(t, task);
  ComputeCost cost = times.cost;
  if (task.recompute) cost.model_flops = 0;  // as compute_cost(task)
  result_.model_flops += cost.model_flops;
  result_.hardware_flops += cost.hardware_flops;
  const std::int64_t duration = times.duration_ns;
  const std::int64_t start = is_host(task.device) ? now : host_issue_ns(task, times.kernels, now);
  if (duration > kMaxTimeNs - start) {
    throw InputError("task '" + std::string(graph_.name(t)) + "' would end after the simulator's time range (about 146 years)");
  }
  result_.timing[t].start_ns = start;
  if (!is_host(task.device)) {
    auto& totals = result_.compute_classes[static_cast<std::size_t>(kind)];
    totals.busy_ns += duration;
    totals.model_flops += cost.model_flops;
    totals.hbm_bytes += cost.hbm_bytes;
    ++totals.tasks;
  }
  if (shares_sms(task)) {
    const double rate = sm_share(task.device);
    shared_compute_[task.device].push_back({t, duration, static_cast<double>(duration), rate, start, 0});
    queue_.push(start + static_cast<std::int64_t>(std::ceil(static_cast<double>(duration) / rate)), kSharedEnd, t);
  } else {
    queue_.push(start + duration, kTaskEnd, t);
  }
}

void Engine::launch_collective(TaskId t, const Collective& c) {
  const int n = c.ring_ranks > 0 ? c.ring_ranks : static_cast<int>(graph_.groups()[c.group].size());
  CollectiveState state;
  state.steps = collective_steps(c.op, c.algorithm, n);
  if (c.algorithm == Algorithm::ring) {
    std::vector<int> member_nodes;
    for (DeviceId m : graph_.groups()[c.group]) member_nodes.push_back(cluster_.node_of(m));
    state.channels = ring_channels(member_nodes, topo_.rail_count());
  }
  consider_nvls(c, state, choose_protocol(c, state));
  result_.collective_protocols.emplace_back(t, static_cast<std::uint8_t>(protocol_index_));
  collectives_[t] = std::move(state);
  change_collective_ctas(t, +1);
  start_collective_step(t);
}

void Engine::launch_alloc(TaskId t, const Task& task, std::int64_t now) {
  const auto& a = std::get<Alloc>(task.params);
  const int pool = pool_of(task, a.pool);
  auto& usage = result_.pools[pool];
  const std::int64_t in_use = pool_in_use_[pool];
  if (in_use + a.bytes > usage.capacity_bytes) {
    report_oom(t, pool, a.bytes, in_use);
    return;
  }
  pool_in_use_[pool] = in_use + a.bytes;
  usage.peak_bytes = std::max(usage.peak_bytes, in_use + a.bytes);
  live_slot_[t] = static_cast<std::int32_t>(pool_live_[pool].size());
  pool_live_[pool].push_back(t);
  if (options_.record_memory) usage.level.push_back({now, static_cast<double>(in_use + a.bytes)});
  queue_.push(now, kTaskEnd, t);
}

// The first allocation that does not fit stops the run; the report names the largest live buffers of the pool.
void Engine::report_oom(TaskId t, int pool, std::int64_t bytes, std::int64_t in_use) {
  const auto& usage = result_.pools[pool];
  OomReport oom{t, usage.name, bytes, in_use, usage.capacity_bytes, in_use + bytes - usage.capacity_bytes, {}};
  std::vector<TaskId> live = pool_live_[pool];
  std::sort(live.begin(), live.end(), [&](TaskId x, TaskId y) {
    const auto bx = std::get<Alloc>(graph_.task(x).params).bytes, by = std::get<Alloc>(graph_.task(y).params).bytes;
    return bx != by ? bx > by : x < y;
  });
  for (std::size_t i = 0; i < live.size() && i < 5; ++i) {
    const auto& la = std::get<Alloc>(graph_.task(live[i]).params);
    oom.largest_live.emplace_back(graph_.labels()[la.label], la.bytes);
  }
  result_.oom = std::move(oom);
  result_.timing[t].start_ns = -1;
  stop_ = true;
}

void Engine::launch_free(TaskId t, const Task& task, std::int64_t now) {
  const TaskId a = std::get<Free>(task.params).alloc;
  const Task& alloc_task = graph_.task(a);
  const auto& alloc = std::get<Alloc>(alloc_task.params);
  const int pool = pool_of(alloc_task, alloc.pool);
  auto& live = pool_live_[pool];
  const std::int32_t slot = live_slot_[a];
  live[slot] = live.back();
  live_slot_[live.back()] = slot;
  live.pop_back();
  pool_in_use_[pool] -= alloc.bytes;
  if (options_.record_memory) {
    result_.pools[pool].level.push_back({now, static_cast<double>(pool_in_use_[pool])});
  }
  queue_.push(now, kTaskEnd, t);
}

void Engine::finish(TaskId t) {
  const std::int64_t now = queue_.now_ns();
  result_.timing[t].end_ns = now;
  ++finished_;
  for (TaskId s : graph_.successors(t)) {
    last_dep_[s] = t;
    release(s);
  }
  for (std::int32_t i = task_stream_offset_[t]; i < task_stream_offset_[static_cast<std::size_t>(t) + 1]; ++i) {
    StreamState& s = streams_[task_streams_[i]];
    ++s.head;
    if (s.head < s.first + s.count) {
      const TaskId next = stream_tasks_[s.head];
      head_since_[next] = std::max(head_since_[next], now);
      release(next);
    }
  }
}

void Engine::start_flow(TaskId owner, const RouteResources& r, double bytes, double cap) {
  const auto id = static_cast<std::size_t>(network_.start(r.resources, bytes, cap, queue_.now_ns(), owner));
  if (id >= flow_owners_.size()) flow_owners_.resize(id + 1);
  flow_owners_[id] = {r.latency_ns, graph_.task(owner).kind() == TaskKind::collective};
  push_changed_flows();
  if (options_.record_links) record_links();
}

void Engine::push_changed_flows() {
  for (int f : network_.changed()) queue_.push(network_.completion_ns(f), kFlowEnd, f, network_.version(f));
}

void Engine::record_links() {
  for (int r : network_.touched_resources()) {
    auto& samples = link_samples_[r];
    const double load = network_.load(r);
    if (!samples.empty() && samples.back().time_ns == queue_.now_ns()) {
      samples.back().value = load;
    } else if (samples.empty() || samples.back().value != load) {
      samples.push_back({queue_.now_ns(), load});
    }
  }
}

// NCCL's tuner: the protocol with the lowest predicted base + steps x step latency + bytes / bandwidth, where the
// step latency is that of the slowest link class a first-step transfer crosses and the bandwidth that of the
// slowest route it takes (times the channels, which run on other links). The data then moves as flows.
double Engine::choose_protocol(const Collective& c, CollectiveState& state) {
  const auto& members = graph_.groups()[c.group];
  const int n = c.ring_ranks > 0 ? c.ring_ranks : static_cast<int>(members.size());
  step_transfers_.clear();
  collective_step(c.op, c.algorithm, static_cast<int>(members.size()), simulated_bytes(c), 0, step_transfers_);
  stacks::LinkClass link_class = stacks::LinkClass::nvlink;
  double bottleneck_GBps = std::numeric_limits<double>::infinity();
  for (const Transfer& tr : step_transfers_) {
    const DeviceId a = members[tr.src_rank], b = members[tr.dst_rank];
    const RouteResources& r = member_route(c, a, b);
    for (std::int32_t res : r.resources) bottleneck_GBps = std::min(bottleneck_GBps, network_.capacity(res));
    const bool across_nodes = cluster_.node_of(a) != cluster_.node_of(b) || (a == b && c.ring_across_nodes);
    const stacks::LinkClass cls = across_nodes ? stacks::LinkClass::network : crosses_nvlink(r) ? stacks::LinkClass::nvlink : stacks::LinkClass::pcie;
    link_class = std::max(link_class, cls);
  }
  const double bandwidth_GBps = bottleneck_GBps * static_cast<double>(std::max<std::size_t>(1, state.channels.size()));
  const auto pattern = c.algorithm == Algorithm::tree ? stacks::Pattern::tree : stacks::Pattern::ring;
  const double bytes = bytes_sent_per_rank(c.op, c.algorithm, n, c.bytes);
  double best_ns = std::numeric_limits<double>::infinity();
  const auto& protocols = library_.protocols;
  for (std::size_t i = 0; i < protocols.size(); ++i) {
    const auto& p = protocols[i];
    const double ns = p.base_ns(pattern) + state.steps * p.step_ns(pattern, link_class) + bytes / (p.efficiency.value * bandwidth_GBps);
    if (ns < best_ns) {
      best_ns = ns;
      protocol_index_ = static_cast<int>(i);
      state.efficiency = p.efficiency.value;
      state.base_latency_ns = static_cast<std::int64_t>(p.base_ns(pattern));
      state.step_latency_ns = static_cast<std::int64_t>(p.step_ns(pattern, link_class));
    }
  }
  return best_ns;
}

std::optional<hw::VertexId> Engine::nvlink_switch_of(hw::VertexId gpu) const {
  for (int l : topo_.links_at(gpu)) {
    const hw::VertexId other = topo_.other_end(l, gpu);
    if (topo_.link(l).type == hw::LinkType::nvlink && topo_.vertex_info(other).type == hw::VertexType::nvswitch) return other;
  }
  return std::nullopt;
}

// NCCL runs an all-reduce inside a node with NVLink SHARP as NVLS when its model predicts it faster: every GPU
// sends its buffer to the switch, which reduces, and receives the sum; each GPU also heads one of the n
// channels, which costs its link another 1/n of the buffer each way.
void Engine::consider_nvls(const Collective& c, CollectiveState& state, double predicted_ns) {
  if (c.op != CollectiveOp::all_reduce || c.ring_across_nodes || !library_.nvls || cluster_.node.nvlink_sharp.value <= 0) return;
  const auto& members = graph_.groups()[c.group];  // under symmetry, the built members of a ring of ring_ranks
  std::optional<hw::VertexId> shared;
  double link_GBps = std::numeric_limits<double>::infinity();
  for (DeviceId m : members) {
    if (cluster_.node_of(m) != cluster_.node_of(members.front())) return;
    const auto sw = nvlink_switch_of(gpu_vertex(m));
    if (!sw || (shared && *sw != *shared)) return;
    shared = sw;
    for (std::int32_t res : route(gpu_vertex(m), *sw).resources) link_GBps = std::min(link_GBps, network_.capacity(res));
  }
  const double n = c.ring_ranks > 0 ? c.ring_ranks : static_cast<double>(members.size());
  const double wire_bytes = static_cast<double>(c.bytes) * (1 + 1 / n) / library_.nvls->efficiency.value;
  const double nvls_ns = 1e3 * library_.nvls->latency_us.value + wire_bytes / link_GBps;
  if (nvls_ns >= predicted_ns) return;
  state.nvls_switch = shared;
  state.nvls_wire_bytes = wire_bytes;
  state.steps = 1;
  state.channels.clear();
  state.efficiency = library_.nvls->efficiency.value;
  state.base_latency_ns = 0;
  state.step_latency_ns = static_cast<std::int64_t>(1e3 * library_.nvls->latency_us.value);
  protocol_index_ = static_cast<int>(library_.protocols.size());  // "NVLS", after the library's protocols
}

void Engine::start_collective_step(TaskId t) {
  const Task& task = graph_.task(t);
  const auto& c = std::get<Collective>(task.params);
  const auto& members = graph_.groups()[c.group];
  auto& state = collectives_.at(t);
  state.latency_ns = state.step_latency_ns + (state.step == 0 ? state.base_latency_ns : 0);
  if (state.nvls_switch) {  // up to the switch and back down, for every member at once
    state.outstanding = 2 * static_cast<int>(members.size());
    for (DeviceId m : members) {
      start_flow(t, route(gpu_vertex(m), *state.nvls_switch), state.nvls_wire_bytes, FlowNetwork::kUncapped);
      start_flow(t, route(*state.nvls_switch, gpu_vertex(m)), state.nvls_wire_bytes, FlowNetwork::kUncapped);
    }
    return;
  }
  step_transfers_.clear();
  const int n = static_cast<int>(members.size());
  const std::int64_t bytes = simulated_bytes(c);
  if (state.channels.size() <= 1) {
    collective_step(c.op, c.algorithm, n, bytes, state.step, step_transfers_);
  } else {  // each channel moves its share along its own member order
    const auto channels = static_cast<std::int64_t>(state.channels.size());
    for (const auto& order : state.channels) {
      const std::size_t first = step_transfers_.size();
      collective_step(c.op, c.algorithm, n, bytes / channels, state.step, step_transfers_);
      for (std::size_t i = first; i < step_transfers_.size(); ++i) {
        step_transfers_[i].src_rank = order[step_transfers_[i].src_rank];
        step_transfers_[i].dst_rank = order[step_transfers_[i].dst_rank];
      }
    }
  }
  state.outstanding = static_cast<int>(step_transfers_.size());
  if (step_transfers_.empty()) {  // a step with nothing to move (cannot happen for n >= 2, kept safe)
    queue_.push(queue_.now_ns(), kStepDone, t);
    return;
  }
  for (const Transfer& tr : step_transfers_) {
    const RouteResources& r = member_route(c, members[tr.src_rank], members[tr.dst_rank]);
    start_flow(t, r, tr.bytes / state.efficiency, FlowNetwork::kUncapped);  // the protocol's wire format
  }
}

const RouteResources& Engine::route(hw::VertexId from, hw::VertexId to) {
  const std::uint64_t key = (static_cast<std::uint64_t>(from) << 32) | static_cast<std::uint64_t>(to);
  if (auto it = routes_.find(key); it != routes_.end()) return it->second;
  const int from_node = topo_.vertex_info(from).node, to_node = topo_.vertex_info(to).node;  // -1: the fabric
  RouteResources out;
  // Every node is a copy of node 0 and nodes meet only at the fabric, so routes are computed for node 0 once
  // and shifted; a route between nodes is the route to the fabric followed by the route from it.
  auto shifted = [&](const RouteResources& base, int node) {
    RouteResources r{{}, base.latency_ns};
    const int link_shift = topo_.first_link(node) - topo_.first_link(0);
    for (std::int32_t resource : base.resources) {
      const std::int32_t link = resource / 2;
      r.resources.push_back(2 * (link + link_shift) + resource % 2);
    }
    return r;
  };
  auto to_node0 = [&](hw::VertexId v) {
    const int node = topo_.vertex_info(v).node;
    return node <= 0 ? v : v - topo_.first_vertex(node) + topo_.first_vertex(0);
  };
  if (from_node >= 0 && to_node >= 0 && from_node != to_node) {
    out = chain({{from, *topo_.fabric()}, {*topo_.fabric(), to}});
  } else if (std::max(from_node, to_node) > 0) {
    out = shifted(route(to_node0(from), to_node0(to)), std::max(from_node, to_node));
  } else {
    const hw::Route r = topo_.route(from, to);
    out.latency_ns = r.latency_ns;
    for (std::size_t i = 0; i < r.links.size(); ++i) {
      // Full-duplex links: one resource per direction, the direction being "from the lower vertex id" or not.
      const int dir = topo_.link(r.links[i]).full_duplex && r.vertices[i] > r.vertices[i + 1] ? 1 : 0;
      out.resources.push_back(2 * r.links[i] + dir);
    }
  }
  check_route_length(out, from, to);
  return routes_.emplace(key, std::move(out)).first->second;
}

RouteResources Engine::chain(std::initializer_list<std::pair<hw::VertexId, hw::VertexId>> legs) {
  RouteResources out;
  for (const auto& [a, b] : legs) {
    const RouteResources& leg = route(a, b);  // routes_ never moves its entries
    out.resources.insert(out.resources.end(), leg.resources.begin(), leg.resources.end());
    out.latency_ns += leg.latency_ns;
  }
  check_route_length(out, legs.begin()->first, std::prev(legs.end())->second);
  return out;
}

void Engine::check_route_length(const RouteResources& r, hw::VertexId from, hw::VertexId to) const {
  if (r.resources.size() > static_cast<std::size_t>(FlowNetwork::kMaxHops)) {
    throw InputError(cluster_.node.origin + ": the route from " + topo_.name(from) + " to " + topo_.name(to) + " crosses " +
                     std::to_string(r.resources.size()) + " links; the simulator supports at most " + std::to_string(FlowNetwork::kMaxHops));
  }
}

// Between nodes a GPU sends through its own rail NIC and the peer receives through its own (NCCL's pairing,
// hw::Topology::rail_nic); nullopt within a node or without NICs.
std::optional<RouteResources> Engine::cross_node_route(hw::VertexId from, hw::VertexId to) {
  if (topo_.vertex_info(from).node == topo_.vertex_info(to).node) return std::nullopt;
  const auto nic_from = topo_.rail_nic(from), nic_to = topo_.rail_nic(to);
  if (!nic_from || !nic_to) return std::nullopt;
  return chain({{from, *nic_from}, {*nic_from, *topo_.fabric()}, {*topo_.fabric(), *nic_to}, {*nic_to, to}});
}

const RouteResources& Engine::copy_route(DeviceId gpu, bool h2d) {
  const RouteResources*& cached = copy_routes_[2 * static_cast<std::size_t>(gpu) + (h2d ? 1 : 0)];
  if (cached == nullptr) {
    const hw::VertexId device = gpu_vertex(gpu), host = host_memory_of(gpu);
    cached = h2d ? &route(host, device) : &route(device, host);
  }
  return *cached;
}

const RouteResources& Engine::send_route(DeviceId src, DeviceId dst) {
  SendRoute& cached = send_routes_[src];
  if (cached.dst != dst) cached = {dst, &gpu_to_gpu(src, dst)};
  return *cached.route;
}

const RouteResources& Engine::gpu_to_gpu(DeviceId a, DeviceId b) {
  const hw::VertexId va = gpu_vertex(a), vb = gpu_vertex(b);
  const std::uint64_t key = (std::uint64_t{1} << 63) | (static_cast<std::uint64_t>(va) << 32) | static_cast<std::uint64_t>(vb);
  if (auto it = routes_.find(key); it != routes_.end()) return it->second;
  if (va == vb) return routes_.emplace(key, loopback(va)).first->second;
  RouteResources out = cross_node_route(va, vb).value_or(RouteResources{});
  // GPUs on one NVSwitch talk through it (NCCL's P2P transport over NVLink), whatever their PCIe paths' rates: on
  // every GPU node NVLink is the faster path anyway; a node whose ranks' links are slower than its PCIe (the CPU
  // device's ranks, whose messages are MPI's) must not route them over PCIe.
  const auto switch_a = nvlink_switch_of(va), switch_b = nvlink_switch_of(vb);
  if (out.resources.empty() && switch_a && switch_a == switch_b) out = chain({{va, *switch_a}, {*switch_a, vb}});
  if (out.resources.empty()) out = route(va, vb);
  // Without PCIe peer-to-peer, GPUs of one node that lack NVLink exchange through host memory: the data
  // crosses the sender's path to DRAM and then the receiver's.
  const bool nvlink = crosses_nvlink(out);
  const bool same_node = cluster_.node_of(a) == cluster_.node_of(b);
  if (same_node && !nvlink && !topo_.pcie_peer_to_peer()) {
    const hw::VertexId host = host_memory_of(a);
    out = chain({{va, host}, {host, vb}});
  }
  return routes_.emplace(key, std::move(out)).first->second;
}

const RouteResources& Engine::member_route(const Collective& c, DeviceId a, DeviceId b) {
  if (a != b || !c.ring_across_nodes) return gpu_to_gpu(a, b);
  const hw::VertexId v = gpu_vertex(a);
  const std::uint64_t key = (std::uint64_t{3} << 62) | static_cast<std::uint64_t>(v);  // apart from route's and gpu_to_gpu's keys
  if (auto it = routes_.find(key); it != routes_.end()) return it->second;
  return routes_.emplace(key, network_loopback(v)).first->second;
}

// A ring of one built member (symmetry: a TP group standing for its whole ring) passes each slice to itself
// through its NVSwitch, loading its own link out and in as its neighbours' slices would in the whole ring.
RouteResources Engine::loopback(hw::VertexId gpu) {
  const auto sw = nvlink_switch_of(gpu);
  TRAINYARD_CHECK(sw.has_value(), "a ring of one member needs its GPU on an NVSwitch (" + topo_.name(gpu) + " has none)");
  return chain({{gpu, *sw}, {*sw, gpu}});
}

// A ring of one built member that stands for a ring across nodes (symmetry: one data-parallel replica built)
// sends each slice out as it would to its successor in the next node, through its rail NIC to the fabric, and
// receives its predecessor's the same way in: the legs that cross_node_route gives a GPU and its peer.
RouteResources Engine::network_loopback(hw::VertexId gpu) {
  TRAINYARD_CHECK(topo_.fabric().has_value(), "a ring across nodes needs a fabric (" + topo_.name(gpu) + "'s cluster has none)");
  const hw::VertexId fabric = *topo_.fabric();
  const auto nic = topo_.rail_nic(gpu);
  if (!nic) return chain({{gpu, fabric}, {fabric, gpu}});
  return chain({{gpu, *nic}, {*nic, fabric}, {fabric, *nic}, {*nic, gpu}});
}

std::string Engine::describe_stuck() const {
  const auto edges = graph_.edges();
  for (const auto& s : streams_) {
    if (s.head >= s.first + s.count) continue;
    const TaskId t = stream_tasks_[s.head];
    const std::string head = "stream-order deadlock: task '" + std::string(graph_.name(t)) + "' heads its " + std::string(to_string(s.stream.kind)) +
                             " stream on " + device_name(s.device);
    for (const auto& [from, to] : edges) {
      if (to == t && result_.timing[from].end_ns < 0) {
        return head + " but waits for '" + std::string(graph_.name(from)) + "', which cannot start before it";
      }
    }
    // No dependency left: it also occupies another stream (a collective) where something else is ahead of it.
    for (std::int32_t i = task_stream_offset_[t]; i < task_stream_offset_[static_cast<std::size_t>(t) + 1]; ++i) {
      const StreamState& other = streams_[task_streams_[i]];
      const TaskId ahead = stream_tasks_[other.head];
      if (ahead != t) {
        return head + " but on " + device_name(other.device) + " it is queued behind '" + std::string(graph_.name(ahead)) + "', which waits for it";
      }
    }
    return head + " and cannot start";
  }
  return "tasks left unfinished with nothing running";
}

}  // namespace

SimResult simulate(const TaskGraph& graph, const Cluster& cluster, const SimOptions& options) {
  Engine engine(graph, cluster, options);
  return engine.run();
}

}  // namespace trainyard::sim
