#include "sim/graph_json.hpp"

#include <charconv>
#include <unordered_map>

#include "common/error.hpp"
#include "common/input_file.hpp"

namespace trainyard::sim {

namespace {

constexpr std::int64_t kMaxCount = std::int64_t{1} << 50;  // bytes, tokens, GEMM sizes

// "gpu3" -> 3, "host1" -> host_device(1)
DeviceId parse_device(const json::Reader& r, std::string_view key) {
  const std::string text = r.string(key);
  auto number = [&](std::string_view digits) -> int {
    int value = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size() || value < 0 || digits.empty()) {
      r.fail(key, "a device such as \"gpu0\" or \"host0\"", "\"" + text + "\"");
    }
    return value;
  };
  if (text.starts_with("gpu")) return number(std::string_view(text).substr(3));
  if (text.starts_with("host")) return host_device(number(std::string_view(text).substr(4)));
  r.fail(key, "a device such as \"gpu0\" or \"host0\"", "\"" + text + "\"");
}

template <typename E>
E enum_choice(const json::Reader& r, std::string_view key, std::initializer_list<std::pair<const char*, E>> options) {
  std::vector<std::string> names;
  for (const auto& [name, _] : options) names.emplace_back(name);
  const std::string chosen = r.choice(key, names);
  for (const auto& [name, value] : options) {
    if (chosen == name) return value;
  }
  TRAINYARD_CHECK(false, "unreachable");
}

using TaskIds = std::unordered_map<std::string, TaskId>;

// Pass 1: names, so that dependencies may refer forward.
TaskIds task_ids(const std::vector<json::Reader>& tasks) {
  TaskIds ids;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const std::string name = tasks[i].string("name");
    if (!ids.emplace(name, static_cast<TaskId>(i)).second) {
      tasks[i].fail("name", "a name no other task has", "\"" + name + "\" again");
    }
  }
  return ids;
}

// The task a reference in field `key` names; an unknown name is an error there.
TaskId task_ref(const TaskIds& ids, const json::Reader& r, std::string_view key, const std::string& name) {
  auto it = ids.find(name);
  if (it == ids.end()) r.fail(key, "the name of a task in this file", "\"" + name + "\"");
  return it->second;
}

// A count (bytes, tokens, a GEMM size): 1 to kMaxCount.
std::int64_t read_count(const json::Reader& r, std::string_view key) { return r.integer(key, 1, kMaxCount); }

// The optional "stream" of a compute or comm task (default 0).
std::uint8_t stream_index(const json::Reader& r) { return static_cast<std::uint8_t>(r.has("stream") ? r.integer("stream", 0, 15) : 0); }

Gemm parse_gemm(const json::Reader& r) {
  Gemm g{read_count(r, "m"), read_count(r, "n"), read_count(r, "k"), hw::Dtype::bf16};
  if (r.has("dtype")) {
    g.dtype = enum_choice<hw::Dtype>(r, "dtype",
                                     {{"bf16", hw::Dtype::bf16}, {"fp16", hw::Dtype::fp16}, {"tf32", hw::Dtype::tf32}, {"fp32", hw::Dtype::fp32}});
  }
  return g;
}

Attention parse_attention(const json::Reader& r) {
  Attention a;
  a.q_len = read_count(r, "q_len");
  a.kv_len = read_count(r, "kv_len");
  a.heads = static_cast<std::int32_t>(r.integer("heads", 1, 4096));
  a.kv_heads = static_cast<std::int32_t>(r.integer("kv_heads", 1, 4096));
  a.head_dim = static_cast<std::int32_t>(r.integer("head_dim", 1, 4096));
  a.causal = r.boolean("causal");
  a.backward = r.boolean("backward");
  if (r.has("density")) a.density = r.number("density", {1e-9, 1, "", false, false});
  return a;
}

Copy parse_copy(const json::Reader& r) {
  Copy c;
  c.direction = enum_choice<Copy::Direction>(r, "direction", {{"h2d", Copy::Direction::h2d}, {"d2h", Copy::Direction::d2h}});
  c.bytes = read_count(r, "bytes");
  if (r.has("pinned")) c.pinned = r.boolean("pinned");
  return c;
}

// A collective; its group is added to `graph`.
Collective parse_collective(const json::Reader& r, const std::string& origin, TaskGraph& graph) {
  Collective c;
  c.op = enum_choice<CollectiveOp>(r, "op",
                                   {{"all_reduce", CollectiveOp::all_reduce},
                                    {"all_gather", CollectiveOp::all_gather},
                                    {"reduce_scatter", CollectiveOp::reduce_scatter},
                                    {"all_to_all", CollectiveOp::all_to_all},
                                    {"broadcast", CollectiveOp::broadcast}});
  if (r.has("algorithm")) {
    c.algorithm = enum_choice<Algorithm>(r, "algorithm", {{"ring", Algorithm::ring}, {"tree", Algorithm::tree}, {"direct", Algorithm::direct}});
  }
  c.bytes = read_count(r, "bytes");
  if (r.has("ring_ranks")) c.ring_ranks = static_cast<std::int32_t>(r.integer("ring_ranks", 2, 1 << 24));
  if (r.has("ring_across_nodes")) c.ring_across_nodes = r.boolean("ring_across_nodes");
  // One member stands for a ring of ring_ranks (symmetry reduction); else a group of at least two.
  const std::size_t fewest = c.ring_ranks != 0 ? 1 : 2;
  const json::Json& group = r.raw("group");
  if (!group.is_array() || group.size() < fewest) {
    r.fail("group", "an array of at least " + std::to_string(fewest) + " devices", json::describe(group));
  }
  std::vector<DeviceId> members;
  for (std::size_t m = 0; m < group.size(); ++m) {
    const json::Json wrapper = {{"member", group[m]}};
    json::Reader member(wrapper, origin, r.field_path("group[" + std::to_string(m) + "]"));
    members.push_back(parse_device(member, "member"));
  }
  c.group = graph.add_group(std::move(members));
  return c;
}

// The fields of the task's kind: its stream and parameters (and a collective's device, its group's first member).
void parse_params(const json::Reader& r, const std::string& kind, const TaskIds& ids, const std::string& origin, TaskGraph& graph, Task& task) {
  if (kind == "gemm") {
    task.stream = {StreamKind::compute, stream_index(r)};
    task.params = parse_gemm(r);
  } else if (kind == "attention") {
    task.stream = {StreamKind::compute, stream_index(r)};
    task.params = parse_attention(r);
  } else if (kind == "elementwise") {
    task.stream = {StreamKind::compute, stream_index(r)};
    task.params = Elementwise{r.integer("bytes_read", 0, kMaxCount), r.integer("bytes_written", 0, kMaxCount)};
  } else if (kind == "optimizer") {
    task.stream = {is_host(task.device) ? StreamKind::host : StreamKind::compute, 0};
    task.params = OptimizerStep{read_count(r, "bytes")};
  } else if (kind == "copy") {
    const Copy c = parse_copy(r);
    task.stream = {c.direction == Copy::Direction::h2d ? StreamKind::h2d : StreamKind::d2h, 0};
    task.params = c;
  } else if (kind == "p2p") {
    task.stream = {StreamKind::comm, stream_index(r)};
    task.params = PointToPoint{parse_device(r, "dst"), read_count(r, "bytes")};
  } else if (kind == "collective") {
    const Collective c = parse_collective(r, origin, graph);
    task.device = graph.groups()[c.group].front();
    task.stream = {StreamKind::comm, stream_index(r)};
    task.params = c;
  } else if (kind == "alloc") {
    Alloc a;
    a.pool = enum_choice<Pool>(r, "pool", {{"hbm", Pool::hbm}, {"dram", Pool::dram}});
    a.bytes = read_count(r, "bytes");
    a.label = graph.add_label(r.string("label"));
    task.params = a;
  } else {
    task.params = Free{task_ref(ids, r, "alloc", r.string("alloc"))};
  }
}

std::vector<TaskId> parse_deps(const json::Reader& r, const TaskIds& ids) {
  std::vector<TaskId> deps;
  if (r.has("deps")) {
    const json::Json& list = r.raw("deps");
    if (!list.is_array()) r.fail("deps", "an array of task names", json::describe(list));
    for (std::size_t d = 0; d < list.size(); ++d) {
      const std::string key = "deps[" + std::to_string(d) + "]";
      if (!list[d].is_string()) r.fail(key, "a task name", json::describe(list[d]));
      deps.push_back(task_ref(ids, r, key, list[d].get<std::string>()));
    }
  }
  return deps;
}

// Pass 2: one task, added to `graph` with its dependencies.
void parse_task(const json::Reader& r, const TaskIds& ids, const std::string& origin, TaskGraph& graph) {
  Task task;
  const std::string name = r.string("name");
  const std::string kind = r.choice("kind", {"gemm", "attention", "elementwise", "optimizer", "copy", "p2p", "collective", "alloc", "free"});
  if (r.has("recompute")) task.recompute = r.boolean("recompute");
  if (kind != "collective") task.device = parse_device(r, "device");
  parse_params(r, kind, ids, origin, graph, task);
  const std::vector<TaskId> deps = parse_deps(r, ids);
  r.finish();
  graph.add(name, std::move(task), deps);
}

}  // namespace

GraphDocument parse_graph(const json::Json& document, const std::string& origin) {
  json::refuse_plan_file(document, origin, "a task graph (trainyard.taskgraph.v1; docs/taskgraph.md)");
  json::Reader top(document, origin);
  top.expect_string("schema", "trainyard.taskgraph.v1");
  GraphDocument out;
  if (top.has("hw")) out.hw = top.string("hw");
  if (top.has("nodes")) out.nodes = static_cast<int>(top.integer("nodes", 1, 100000));
  const std::vector<json::Reader> tasks = top.objects("tasks");
  top.finish();
  const TaskIds ids = task_ids(tasks);
  for (const json::Reader& r : tasks) parse_task(r, ids, origin, out.graph);
  return out;
}

GraphDocument load_graph(const std::string& path) { return parse_graph(json::parse_file(path, kGraphFileCapBytes), path); }

json::Json graph_to_json(const TaskGraph& graph) {
  using json::Json;
  std::vector<std::vector<TaskId>> deps(graph.size());
  for (const auto& [from, to] : graph.edges()) {
    // finalize() adds alloc -> free edges itself; leave them implicit.
    const Task& t = graph.task(to);
    if (const auto* f = std::get_if<Free>(&t.params); f && f->alloc == from) continue;
    deps[to].push_back(from);
  }
  Json tasks = Json::array();
  for (TaskId id = 0; id < static_cast<TaskId>(graph.size()); ++id) {
    const Task& t = graph.task(id);
    Json j = {{"name", graph.name(id)}, {"kind", to_string(t.kind())}};
    if (t.kind() != TaskKind::collective) j["device"] = device_name(t.device);
    if ((t.stream.kind == StreamKind::compute || t.stream.kind == StreamKind::comm) && t.stream.index != 0) {
      j["stream"] = t.stream.index;
    }
    if (t.recompute) j["recompute"] = true;
    std::visit(
        [&](const auto& p) {
          using P = std::decay_t<decltype(p)>;
          if constexpr (std::is_same_v<P, Gemm>) {
            j["m"] = p.m;
            j["n"] = p.n;
            j["k"] = p.k;
            j["dtype"] = hw::to_string(p.dtype);
          } else if constexpr (std::is_same_v<P, Attention>) {
            j["q_len"] = p.q_len;
            j["kv_len"] = p.kv_len;
            j["heads"] = p.heads;
            j["kv_heads"] = p.kv_heads;
            j["head_dim"] = p.head_dim;
            j["causal"] = p.causal;
            j["backward"] = p.backward;
            if (p.density != 1) j["density"] = p.density;
          } else if constexpr (std::is_same_v<P, Elementwise>) {
            j["bytes_read"] = p.bytes_read;
            j["bytes_written"] = p.bytes_written;
          } else if constexpr (std::is_same_v<P, OptimizerStep>) {
            j["bytes"] = p.bytes;
          } else if constexpr (std::is_same_v<P, Copy>) {
            j["direction"] = p.direction == Copy::Direction::h2d ? "h2d" : "d2h";
            j["bytes"] = p.bytes;
            j["pinned"] = p.pinned;
          } else if constexpr (std::is_same_v<P, PointToPoint>) {
            j["dst"] = device_name(p.dst);
            j["bytes"] = p.bytes;
          } else if constexpr (std::is_same_v<P, Collective>) {
            j["op"] = to_string(p.op);
            j["algorithm"] = to_string(p.algorithm);
            j["bytes"] = p.bytes;
            if (p.ring_ranks != 0) j["ring_ranks"] = p.ring_ranks;
            if (p.ring_across_nodes) j["ring_across_nodes"] = true;
            Json group = Json::array();
            for (DeviceId m : graph.groups()[p.group]) group.push_back(device_name(m));
            j["group"] = group;
          } else if constexpr (std::is_same_v<P, Alloc>) {
            j["pool"] = p.pool == Pool::hbm ? "hbm" : "dram";
            j["bytes"] = p.bytes;
            j["label"] = graph.labels()[p.label];
          } else if constexpr (std::is_same_v<P, Free>) {
            j["alloc"] = graph.name(p.alloc);
          }
        },
        t.params);
    if (!deps[id].empty()) {
      Json list = Json::array();
      for (TaskId d : deps[id]) list.push_back(graph.name(d));
      j["deps"] = list;
    }
    tasks.push_back(std::move(j));
  }
  return {{"schema", "trainyard.taskgraph.v1"}, {"tasks", std::move(tasks)}};
}

}  // namespace trainyard::sim
