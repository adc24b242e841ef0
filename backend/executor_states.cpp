// The model states (executor_impl.hpp): the device's arenas and parameters, the host optimizer's and ZeRO's
// offloaded copies, FPDT's staging, upload and download.
#include "backend/executor_impl.hpp"

namespace trainyard::backend {

void Executor::Impl::find_owned_groups() {
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

float* Executor::Impl::optimizer_alloc(std::int64_t count) {
  if (!host_optimizer) return device_alloc<float>(count);
  return static_cast<float*>(dev.allocate_pinned(std::max<std::int64_t>(count, 1) * static_cast<std::int64_t>(sizeof(float))));
}

void Executor::Impl::put(void* state, const void* host, std::int64_t bytes, bool in_host_memory) const {
  in_host_memory ? static_cast<void>(std::memcpy(state, host, static_cast<std::size_t>(bytes))) : dev.upload(state, host, bytes);
}

void Executor::Impl::get(void* host, const void* state, std::int64_t bytes, bool in_host_memory) const {
  in_host_memory ? static_cast<void>(std::memcpy(host, state, static_cast<std::size_t>(bytes))) : dev.download(host, state, bytes);
}

void Executor::Impl::allocate(ModelState& shapes) {
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
                     format_bytes(static_cast<double>(needed)) + ": " + format_bytes(static_cast<double>(flow.device_arena_bytes)) + " of tensors, " +
                         format_bytes(static_cast<double>(state_bytes_needed)) + " of model states and " +
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
  for (auto& layer : shapes.layers()) {
    for (const Parameter* p : layer.in_order()) layer_param.push_back(index_of(*p));
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

void Executor::Impl::copy_offloaded_states(const sim::Copy& copy, const sim::Op& op, int stream) {
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

void Executor::Impl::copy_updated_weights(int stream) {
  if (!opt.run_optimizer) return;
  for (int gid : owned) {
    if (streamed.count(gid)) continue;
    const GroupGradients& b = group_gradients.at(gid);
    TRAINYARD_CHECK(b.host_weight != nullptr, "updated weights come from a host optimizer step on this rank");
    for (int p : groups.at(gid))
      dev.copy(stream, params[p].weight, params[p].host_weight, params[p].n * static_cast<std::int64_t>(sizeof(bf16_bits)));
  }
}

void Executor::Impl::allocate_fpdt_staging() {
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

void Executor::Impl::stream_fpdt_buffers(const sim::Copy& copy, int stream) {
  void* device = dev.scratch(stream, copy.bytes);
  if (copy.direction == sim::Copy::Direction::d2h) {
    dev.copy(stream, fpdt_out, device, copy.bytes);
  } else {
    dev.copy(stream, device, fpdt_in, copy.bytes);
  }
  release(device, stream);
}

std::int64_t Executor::Impl::held_elements(std::size_t i, const Parameter& p) const {
  return shards == 1 ? static_cast<std::int64_t>(p.size()) : shard_layouts[static_cast<std::size_t>(shard)][i].elements();
}

std::span<const float> Executor::Impl::mine(std::size_t i, const std::vector<float>& whole, std::vector<float>& part) const {
  if (shards == 1) return whole;
  const ShardLayout& layout = shard_layouts[static_cast<std::size_t>(shard)][i];
  part.resize(static_cast<std::size_t>(layout.elements()));
  take_shard(layout, whole, part);
  return part;
}

void Executor::Impl::upload(const ModelState& state) {
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

void Executor::Impl::download(ModelState& state) const {
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

}  // namespace trainyard::backend
