#include "backend/hotspa_step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "backend/executor.hpp"
#include "backend/parameter_groups.hpp"
#include "backend/reference_step.hpp"
#include "common/error.hpp"

namespace trainyard::backend {

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t elapsed_ns(Clock::time_point since) { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count(); }

std::vector<float>& values_of(Parameter& p, SwitchedValues which) { return which == SwitchedValues::weights ? p.weight : p.grad; }

// The indices into ModelState::all() (and tensor_slice_layouts) of a unit's parameters: all() lists each layer's
// six (model_state.hpp, LayerParameters), then the embedding, the final norm and, untied, the LM head.
std::vector<std::size_t> unit_parameters(const model::ModelConfig& model, int unit) {
  const auto layers = static_cast<std::size_t>(model.layers);
  const auto u = static_cast<std::size_t>(unit);
  if (u < layers) return {6 * u, 6 * u + 1, 6 * u + 2, 6 * u + 3, 6 * u + 4, 6 * u + 5};
  if (u == layers) return {6 * layers};                // the embedding
  if (model.tied_embeddings) return {6 * layers + 1};  // the final norm
  return {6 * layers + 1, 6 * layers + 2};             // the final norm and the LM head
}

// tensor_slice_layouts by slice, each built once (a switch cuts the units at a few fractions).
class SliceLayouts {
 public:
  explicit SliceLayouts(const model::ModelConfig& model) : model_(model) {}
  // Visits every element of the unit's slice [begin, end) in the slice's order: (parameter index in
  // ModelState::all(), flat index in the whole tensor).
  template <typename Visit>
  void for_each_element(int unit, double begin, double end, Visit&& visit) {
    auto found = cache_.find({begin, end});
    if (found == cache_.end()) found = cache_.emplace(std::pair{begin, end}, tensor_slice_layouts(model_, begin, end)).first;
    for (std::size_t i : unit_parameters(model_, unit)) {
      for_each_shard_element(found->second[i], [&](std::int64_t, std::int64_t e) { visit(i, static_cast<std::size_t>(e)); });
    }
  }

 private:
  const model::ModelConfig& model_;
  std::map<std::pair<double, double>, std::vector<ShardLayout>> cache_;
};

// The slice of `layout`'s unit `unit` that GPU `gpu` holds, if any.
const planner::Shard* held_slice(const planner::StateLayout& layout, int unit, int gpu) {
  for (const auto& s : layout.units[static_cast<std::size_t>(unit)]) {
    if (std::binary_search(s.holders.begin(), s.holders.end(), gpu)) return &s;
  }
  return nullptr;
}

// Flags of the elements a GPU holds in a layout, per parameter (ModelState::all() order).
using Held = std::vector<std::vector<char>>;

Held held_elements(ModelState& state, const planner::StateLayout& layout, int gpu) {
  const auto params = state.all();
  Held held(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) held[i].assign(params[i]->size(), 0);
  SliceLayouts slices(state.model());
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    const planner::Shard* s = held_slice(layout, static_cast<int>(u), gpu);
    if (s == nullptr) continue;
    slices.for_each_element(static_cast<int>(u), s->begin, s->end, [&](std::size_t i, std::size_t e) { held[i][e] = 1; });
  }
  return held;
}

}  // namespace

std::vector<int> layout_units(const model::ModelConfig& model) {
  std::vector<int> units;
  for (int l = 0; l < static_cast<int>(model.layers); ++l) units.push_back(l);
  units.push_back(kEmbeddingGroup);
  units.push_back(kHeadGroup);
  return units;
}

planner::StateLayout executor_layout(const sim::TaskGraph& graph, const model::ModelConfig& model) {
  const auto owners = group_users(graph, model);
  const int t = std::max(1, graph.tensor_shards());
  planner::StateLayout layout;
  for (int group : layout_units(model)) {
    const auto found = owners.find(group);
    if (found == owners.end()) throw InputError("a HotSPa group's task graph", group_name(group), "a GPU that uses them", "none");
    std::vector<planner::Shard> shards;
    for (int k = 0; k < t; ++k) {
      planner::Shard s{static_cast<double>(k) / t, static_cast<double>(k + 1) / t, {}};
      for (sim::DeviceId g : found->second) {
        if (g % t == k) s.holders.push_back(g);
      }
      shards.push_back(std::move(s));
    }
    layout.units.push_back(std::move(shards));
  }
  return layout;
}

planner::StateLayout gathered_layout(const model::ModelConfig& model) {
  planner::StateLayout layout;
  for (std::size_t u = 0; u < layout_units(model).size(); ++u) layout.units.push_back({planner::Shard{0, 1, {0}}});
  return layout;
}

std::vector<std::int64_t> layout_unit_bytes(const model::ModelConfig& model, double bytes_per_element) {
  const std::int64_t h = model.hidden, vocab_rows = model.vocab * model.hidden;
  const std::int64_t layer = 2 * h + (model.q_dim() + 2 * model.kv_dim()) * h + h * model.q_dim() + 3 * model.ffn_hidden * h;
  std::vector<std::int64_t> elements(static_cast<std::size_t>(model.layers), layer);
  elements.push_back(vocab_rows);                                    // the embedding
  elements.push_back(h + (model.tied_embeddings ? 0 : vocab_rows));  // the final norm and the untied LM head
  std::vector<std::int64_t> out;
  for (std::int64_t e : elements) out.push_back(std::llround(static_cast<double>(e) * bytes_per_element));
  return out;
}

std::int64_t run_switch(ModelState& state, const planner::SwitchPlan& plan, SwitchedValues which, Communicator* comm) {
  if (plan.transfers.empty()) return 0;
  if (comm == nullptr) throw InternalError("a switch between GPUs on one rank", __FILE__, __LINE__);
  const auto params = state.all();
  SliceLayouts slices(state.model());
  std::int64_t sent = 0;
  int tag = 0;
  for (const planner::Transfer& t : plan.transfers) {
    ++tag;
    if (comm->rank() != t.src && comm->rank() != t.dst) continue;
    std::vector<float> slice;
    if (comm->rank() == t.src) {
      slices.for_each_element(t.unit, t.begin, t.end, [&](std::size_t i, std::size_t e) { slice.push_back(values_of(*params[i], which)[e]); });
      send_floats(*comm, t.dst, tag, slice);
      sent += static_cast<std::int64_t>(slice.size() * sizeof(float));
      continue;
    }
    slice = recv_floats(*comm, t.src, tag);
    std::size_t k = 0;
    slices.for_each_element(t.unit, t.begin, t.end, [&](std::size_t i, std::size_t e) {
      if (k >= slice.size()) throw TRAINYARD_COMM_ERROR("rank " + std::to_string(t.src) + " sent a switch slice shorter than its layout");
      values_of(*params[i], which)[e] = slice[k++];
    });
    if (k != slice.size()) throw TRAINYARD_COMM_ERROR("rank " + std::to_string(t.src) + " sent a switch slice longer than its layout");
  }
  return sent;
}

namespace {

void poison(ModelState& state, const Held& held, SwitchedValues which) {
  const auto params = state.all();
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto& values = values_of(*params[i], which);
    for (std::size_t e = 0; e < values.size(); ++e) {
      if (!held[i][e]) values[e] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

// acc += weight * step on the `held` elements.
void accumulate_held(ModelState& acc, const ModelState& step, const Held& held, double weight) {
  const auto a = acc.all();
  const auto s = step.all();
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (std::size_t e = 0; e < a[i]->grad.size(); ++e) {
      if (held[i][e]) a[i]->grad[e] += static_cast<float>(weight * static_cast<double>(s[i]->grad[e]));
    }
  }
}

std::int64_t token_count(std::span<const std::vector<std::int32_t>> rows) {
  std::int64_t n = 0;
  for (const auto& r : rows) n += static_cast<std::int64_t>(r.size()) - 1;
  return n;
}

// The switches of a mini-batch (planner/hotspa.hpp's order): into group k the parameters from home (k = 0) or group
// k - 1, none into home (its parameters never left); the accumulated gradients from group k - 1 (k > 0).
struct MinibatchSwitches {
  std::vector<planner::SwitchPlan> params, grads;  // [k]: into group k
};
MinibatchSwitches plan_minibatch_switches(const std::vector<planner::StateLayout>& layouts, const model::ModelConfig& m, int gpus_per_node,
                                          int gpus) {
  const std::size_t n = layouts.size(), home = n - 1;
  const auto param_units = layout_unit_bytes(m, 2), grad_units = layout_unit_bytes(m, 4);
  MinibatchSwitches out{std::vector<planner::SwitchPlan>(n), std::vector<planner::SwitchPlan>(n)};
  for (std::size_t k = 0; k < n; ++k) {
    if (k != home) out.params[k] = planner::plan_switch(layouts[k == 0 ? home : k - 1], layouts[k], param_units, gpus_per_node, gpus);
    if (k > 0) out.grads[k] = planner::plan_switch(layouts[k - 1], layouts[k], grad_units, gpus_per_node, gpus);
  }
  return out;
}

// Group k's step on the executor, its gradients added (weighted by its share of the mini-batch's tokens) to the
// accumulated ones on the elements this rank holds in the group's layout. Returns the group's measured step.
MeasuredStep run_group(Device& device, const HotSpaGroupRun& group, ModelState& state, ModelState& scratch, const Held& held, int gpus_per_node,
                       int optimizer_step, std::int64_t minibatch_tokens, const ExecutorOptions& eo) {
  Executor executor(device, *group.graph, state, gpus_per_node, {}, eo);
  executor.upload(state);
  const MeasuredStep measured = executor.run_step(group.tokens, optimizer_step);
  executor.download(scratch);
  accumulate_held(state, scratch, held, static_cast<double>(measured.tokens) / static_cast<double>(minibatch_tokens));
  return measured;
}

std::int64_t sum_over_ranks(Communicator* comm, std::int64_t value) {
  if (comm == nullptr) return value;
  double v = static_cast<double>(value);
  comm->all_reduce_sum(all_ranks(*comm), std::span<double>(&v, 1));
  return static_cast<std::int64_t>(v);
}

}  // namespace

void poison_unheld(ModelState& state, const planner::StateLayout& layout, int rank, SwitchedValues which) {
  poison(state, held_elements(state, layout, rank), which);
}

HotSpaStepResult run_hotspa_step(Device& device, std::span<const HotSpaGroupRun> groups, ModelState& state, int gpus_per_node, int optimizer_step,
                                 const HotSpaOptions& options) {
  TRAINYARD_CHECK(!groups.empty(), "a mini-batch of at least one group");
  Communicator* comm = options.comm != nullptr && options.comm->size() > 1 ? options.comm : nullptr;
  const int rank = comm != nullptr ? comm->rank() : 0, gpus = comm != nullptr ? comm->size() : 1;
  const model::ModelConfig& m = state.model();
  const std::size_t n = groups.size(), home = n - 1;
  std::vector<planner::StateLayout> layouts;
  for (const auto& g : groups) layouts.push_back(executor_layout(*g.graph, m));
  const MinibatchSwitches switches = plan_minibatch_switches(layouts, m, gpus_per_node, gpus);

  HotSpaStepResult r;
  for (const auto& g : groups) r.tokens += token_count(g.tokens);
  poison_unheld(state, layouts[home], rank, SwitchedValues::weights);
  ExecutorOptions eo;
  eo.comm = comm;
  eo.comm_timeout = options.comm_timeout;
  ModelState scratch(m, 0);  // each group's downloaded gradients
  for (std::size_t k = 0; k < n; ++k) {
    const auto switch_start = Clock::now();
    r.sent_bytes += run_switch(state, switches.params[k], SwitchedValues::weights, comm);
    if (k == 0) state.zero_grads();
    r.sent_bytes += run_switch(state, switches.grads[k], SwitchedValues::gradients, comm);
    r.switch_ns += elapsed_ns(switch_start);
    r.planned_param_bytes += switches.params[k].bytes();
    r.planned_grad_bytes += switches.grads[k].bytes();
    const Held held = held_elements(state, layouts[k], rank);
    poison(state, held, SwitchedValues::gradients);  // what this rank accumulated for another layout
    const MeasuredStep measured = run_group(device, groups[k], state, scratch, held, gpus_per_node, optimizer_step, r.tokens, eo);
    r.loss += static_cast<double>(measured.tokens) / static_cast<double>(r.tokens) * measured.loss;
    r.group_step_ns.push_back(measured.step_ns);
  }
  if (options.update) {
    const std::vector<int> units = layout_units(m);
    for (std::size_t u = 0; u < units.size(); ++u) {
      if (held_slice(layouts[home], static_cast<int>(u), rank) != nullptr) state.adamw_step(units[u], options.adam, optimizer_step);
    }
  }
  r.sent_bytes = sum_over_ranks(comm, r.sent_bytes);
  if (comm != nullptr) comm->barrier();  // the switches' sends delivered: none is left in flight when the run ends
  return r;
}

void gather_switched(ModelState& state, const planner::StateLayout& home, int gpus_per_node, Communicator& comm) {
  const model::ModelConfig& m = state.model();
  const auto gather = planner::plan_switch(home, gathered_layout(m), layout_unit_bytes(m, 4), gpus_per_node, comm.size());
  run_switch(state, gather, SwitchedValues::gradients, &comm);
  run_switch(state, gather, SwitchedValues::weights, &comm);
  comm.barrier();  // every send delivered before a rank moves on (and may end, freeing its communicator)
}

double hotspa_reference_step(std::span<const HotSpaGroupRun> groups, ModelState& state, int gpus_per_node, int optimizer_step, bool update,
                             const kernels::AdamW& adam) {
  std::int64_t total = 0;
  for (const auto& g : groups) total += token_count(g.tokens);
  ModelState step(state.model(), 0);
  const Held everything = held_elements(state, gathered_layout(state.model()), 0);
  const auto from = state.all();
  const auto to = step.all();
  state.zero_grads();
  double loss = 0;
  for (const auto& g : groups) {
    for (std::size_t i = 0; i < from.size(); ++i) to[i]->weight = from[i]->weight;
    const ReferenceResult r = run_reference_step(*g.graph, step, gpus_per_node, g.tokens);
    const double weight = static_cast<double>(r.tokens) / static_cast<double>(total);
    loss += weight * r.loss;
    accumulate_held(state, step, everything, weight);
  }
  if (update) {
    for (int group : layout_units(state.model())) state.adamw_step(group, adam, optimizer_step);
  }
  return loss;
}

}  // namespace trainyard::backend
