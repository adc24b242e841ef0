#include "planner/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "common/error.hpp"
#include "common/json_reader.hpp"
#include "common/units.hpp"

namespace trainyard::planner {

namespace {

using Json = nlohmann::json;

std::string tokens(std::int64_t n) { return format_tokens(n); }

std::string_view placement_name(Placement p) { return p == Placement::hbm ? "hbm" : "dram"; }
std::string_view acts_name(ActivationPolicy a) {
  return a == ActivationPolicy::hbm ? "hbm" : a == ActivationPolicy::dram ? "dram" : "recompute";
}

std::string offload_list(const ZeroParams& z) {
  std::string out;
  auto add = [&](bool on, const char* name) {
    if (on) out += (out.empty() ? "" : ",") + std::string(name);
  };
  add(z.offload_optimizer, "optimizer");
  add(z.offload_grads, "grads");
  add(z.offload_params, "params");
  add(z.offload_activations, "acts");
  return out.empty() ? "none" : out;
}

}  // namespace

bool set_offload(ZeroParams& z, const std::string& target) {
  if (target == "optimizer") z.offload_optimizer = true;
  else if (target == "grads") z.offload_grads = true;
  else if (target == "params") z.offload_params = true;
  else if (target == "acts") z.offload_activations = true;
  else return false;
  return true;
}

double PlanSpec::recomputed_layer_share(std::int64_t layers) const {
  if (scheme == "ringtrack") return ringtrack.acts == ActivationPolicy::recompute ? 1 : 0;
  if (scheme == "megatron") return megatron.recompute == Recompute::full ? 1 : 0;
  return static_cast<double>(zero.checkpointed_layers(layers)) / static_cast<double>(layers);
}

std::string PlanSpec::summary() const {
  if (scheme == "ringtrack") {
    const auto& p = ringtrack;
    return "ring " + std::to_string(p.ring) + ", block " + std::to_string(p.block) + ", chunk " + tokens(p.chunk) + ", prefetch " +
           std::to_string(p.prefetch) + ", kv " + std::string(placement_name(p.kv)) + ", acts " + std::string(acts_name(p.acts)) +
           ", weights " + (p.weights == WeightPolicy::resident ? "resident" : "stream") + ", states " +
           std::string(placement_name(p.states));
  }
  if (scheme == "megatron") {
    const auto& p = megatron;
    const std::string uneven = p.first_stage_layers > 0 || p.last_stage_layers > 0
                                   ? ", stages " + std::to_string(p.first_stage_layers) + "/../" + std::to_string(p.last_stage_layers)
                                   : "";
    return "tp " + std::to_string(p.tp) + ", pp " + std::to_string(p.pp) + ", dp " + std::to_string(p.dp) +
           (p.cp > 1 ? ", cp " + std::to_string(p.cp) + " " + std::string(to_string(p.cp_comm)) : "") +
           (p.cp_a2a > 0 ? " (a2a groups of " + std::to_string(p.cp_a2a) + ")" : "") +
           (p.vpp > 1 ? ", vpp " + std::to_string(p.vpp) : "") + uneven + ", mb " + std::to_string(p.micro_batch) +
           (p.sequence_parallel ? ", sp" : "") + (p.tp_comm_overlap ? ", tp overlap" : "") + ", recompute " + std::string(to_string(p.recompute)) +
           (p.offload_activations ? ", offload acts" : "") + (p.distributed_optimizer ? ", dist-opt" : "");
  }
  const auto& z = zero;
  std::string out = "zero-" + std::to_string(z.stage);
  if (scheme == "ulysses" || scheme == "fpdt") out += ", sp " + std::to_string(z.sp);
  if (scheme == "ring-attention") out += ", cp " + std::to_string(z.cp) + (z.zigzag ? " zigzag" : "");
  if (scheme == "fpdt") out += ", chunk " + tokens(z.fpdt_chunk);
  out += ", mb " + std::to_string(z.micro_batch);
  if (z.activation_checkpointing) out += z.checkpoint_every == 1 ? ", AC" : ", AC every " + std::to_string(z.checkpoint_every) + " layers";
  if (offload_list(z) != "none") out += ", offload " + offload_list(z);
  return out;
}

void check_plan(const StepInputs& in, const PlanSpec& spec) {
  if (spec.scheme == "ringtrack") check_ringtrack(in, spec.ringtrack);
  else if (spec.scheme == "megatron") check_megatron(in, spec.megatron);
  else if (spec.scheme == "zero" || spec.scheme == "ulysses" || spec.scheme == "ring-attention" || spec.scheme == "fpdt") check_zero(in, spec.zero);
  else throw InputError("scheme", "value", "one of ringtrack, fpdt, ulysses, ring-attention, megatron, zero", "\"" + spec.scheme + "\"");
}

sim::TaskGraph build_plan(const StepInputs& in, const PlanSpec& spec, RingTrackPlan* rings) {
  if (spec.scheme == "ringtrack") {
    RingTrackPlan plan = build_ringtrack(in, spec.ringtrack);
    sim::TaskGraph graph = std::move(plan.graph);
    if (rings) *rings = std::move(plan);
    return graph;
  }
  if (spec.scheme == "megatron") return build_megatron(in, spec.megatron);
  if (spec.scheme == "zero" || spec.scheme == "ulysses" || spec.scheme == "ring-attention" || spec.scheme == "fpdt") {
    return build_zero(in, spec.zero);
  }
  throw InputError("scheme", "value", "one of ringtrack, fpdt, ulysses, ring-attention, megatron, zero", "\"" + spec.scheme + "\"");
}

Json parameters_json(const PlanSpec& spec) {
  if (spec.scheme == "ringtrack") {
    const auto& p = spec.ringtrack;
    return {{"ring", p.ring}, {"block", p.block}, {"chunk", p.chunk}, {"prefetch", p.prefetch},
            {"kv", placement_name(p.kv)}, {"acts", acts_name(p.acts)},
            {"weights", p.weights == WeightPolicy::resident ? "resident" : "stream"}, {"states", placement_name(p.states)},
            {"ring_order", p.ring_order}};
  }
  if (spec.scheme == "megatron") {
    const auto& p = spec.megatron;
    return {{"tp", p.tp}, {"pp", p.pp}, {"dp", p.dp}, {"vpp", p.vpp}, {"micro_batch", p.micro_batch},
            {"sequence_parallel", p.sequence_parallel}, {"tp_comm_overlap", p.tp_comm_overlap}, {"recompute", to_string(p.recompute)},
            {"offload_activations", p.offload_activations}, {"distributed_optimizer", p.distributed_optimizer},
            {"cp", p.cp}, {"cp_comm", to_string(p.cp_comm)}, {"cp_a2a", p.cp_a2a},
            {"first_stage_layers", p.first_stage_layers}, {"last_stage_layers", p.last_stage_layers}};
  }
  const auto& z = spec.zero;
  return {{"zero_stage", z.stage}, {"sp", z.sp}, {"cp", z.cp}, {"zigzag", z.zigzag}, {"chunk", z.fpdt_chunk},
          {"micro_batch", z.micro_batch}, {"activation_checkpointing", z.activation_checkpointing},
          {"checkpoint_every", z.checkpoint_every},
          {"offload", offload_list(z)}};
}

PlanSpec parse_parameters(const std::string& scheme, const Json& parameters, const std::string& origin) {
  PlanSpec spec;
  spec.scheme = scheme;
  const json::Reader r(parameters, origin, "parameters");
  constexpr std::int64_t kMaxTokens = std::int64_t{1} << 40;
  if (scheme == "ringtrack") {
    auto& p = spec.ringtrack;
    p.ring = static_cast<int>(r.integer("ring", 1, 1 << 20));
    p.block = static_cast<int>(r.integer("block", 1, 1 << 20));
    p.chunk = r.integer("chunk", 1, kMaxTokens);
    p.prefetch = static_cast<int>(r.integer("prefetch", 1, 8));
    p.kv = r.choice("kv", {"hbm", "dram"}) == "hbm" ? Placement::hbm : Placement::dram;
    const std::string acts = r.choice("acts", {"hbm", "dram", "recompute"});
    p.acts = acts == "hbm" ? ActivationPolicy::hbm : acts == "dram" ? ActivationPolicy::dram : ActivationPolicy::recompute;
    p.weights = r.choice("weights", {"resident", "stream"}) == "stream" ? WeightPolicy::stream : WeightPolicy::resident;
    p.states = r.choice("states", {"hbm", "dram"}) == "dram" ? Placement::dram : Placement::hbm;
    const Json& order = r.raw("ring_order");
    if (!order.is_array() || !std::all_of(order.begin(), order.end(), [](const Json& v) { return v.is_number_integer(); })) {
      r.fail("ring_order", "an array of ring positions (empty: chosen from the topology)", json::describe(order));
    }
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto position = order[i].get<std::int64_t>();  // checked here: a cast to int could wrap
      if (position < 0 || position >= p.ring) {  // a huge unsigned one reads as negative
        r.fail("ring_order", "ring positions 0.." + std::to_string(p.ring - 1) + " (\"ring\" is " + std::to_string(p.ring) + ")",
               json::describe(order[i]) + " at index " + std::to_string(i));
      }
      p.ring_order.push_back(static_cast<int>(position));
    }
    check_ring_order(p.ring_order, p.ring, origin, "parameters.ring_order");
  } else if (scheme == "megatron") {
    auto& p = spec.megatron;
    p.tp = static_cast<int>(r.integer("tp", 1, 1 << 20));
    p.pp = static_cast<int>(r.integer("pp", 1, 1 << 20));
    p.dp = static_cast<int>(r.integer("dp", 1, 1 << 20));
    p.vpp = static_cast<int>(r.integer("vpp", 1, 1 << 20));
    p.micro_batch = r.integer("micro_batch", 1, 1 << 20);
    p.sequence_parallel = r.boolean("sequence_parallel");
    const std::string rc = r.choice("recompute", {"none", "selective", "full"});
    p.recompute = rc == "none" ? Recompute::none : rc == "selective" ? Recompute::selective : Recompute::full;
    p.offload_activations = r.boolean("offload_activations");
    // Optional: plan files written before it existed mean false.
    p.distributed_optimizer = r.has("distributed_optimizer") && r.boolean("distributed_optimizer");
    p.tp_comm_overlap = r.has("tp_comm_overlap") && r.boolean("tp_comm_overlap");
    // Optional too (plans written before Megatron CP and uneven stages): cp 1, p2p, an even split.
    if (r.has("cp")) p.cp = static_cast<int>(r.integer("cp", 1, 1 << 20));
    if (r.has("cp_comm")) p.cp_comm = *cp_comm_named(r.choice("cp_comm", {"p2p", "all_gather", "a2a", "a2a+p2p"}));
    if (r.has("cp_a2a")) p.cp_a2a = static_cast<int>(r.integer("cp_a2a", 0, 1 << 20));
    if (r.has("first_stage_layers")) p.first_stage_layers = static_cast<int>(r.integer("first_stage_layers", 0, 1 << 20));
    if (r.has("last_stage_layers")) p.last_stage_layers = static_cast<int>(r.integer("last_stage_layers", 0, 1 << 20));
  } else if (scheme == "zero" || scheme == "ulysses" || scheme == "ring-attention" || scheme == "fpdt") {
    auto& z = spec.zero;
    z.stage = static_cast<int>(r.integer("zero_stage", 0, 3));
    z.sp = static_cast<int>(r.integer("sp", 1, 1 << 20));
    z.cp = static_cast<int>(r.integer("cp", 1, 1 << 20));
    z.zigzag = r.boolean("zigzag");
    z.fpdt_chunk = r.integer("chunk", 0, kMaxTokens);
    z.micro_batch = r.integer("micro_batch", 1, 1 << 20);
    z.activation_checkpointing = r.boolean("activation_checkpointing");
    if (r.has("checkpoint_every")) z.checkpoint_every = static_cast<int>(r.integer("checkpoint_every", 1, 100000));
    const std::string list = r.string("offload");
    if (list != "none") {
      for (const auto& item : split_commas(list)) {
        if (!set_offload(z, item)) r.fail("offload", "\"none\" or a comma list of optimizer, grads, params, acts", "\"" + list + "\"");
      }
    }
  } else {
    throw InputError(origin, "scheme", "one of ringtrack, fpdt, ulysses, ring-attention, megatron, zero", "\"" + scheme + "\"");
  }
  r.finish();
  return spec;
}

Json plan_file_json(const PlanFile& plan) {
  return {{"format", "trainyard.plan.v1"},
          {"model", plan.model},
          {"hw", plan.hw},
          {"nodes", plan.nodes},
          {"workload", {{"seq_len", plan.workload.seq_len}, {"global_batch", plan.workload.global_batch}}},
          {"precision", plan.precision},
          {"stack", plan.stack},
          {"scheme", plan.spec.scheme},
          {"parameters", parameters_json(plan.spec)},
          {"predicted", plan.predicted}};
}

PlanFile read_plan_file(const std::string& path) {
  const Json doc = json::parse_file(path);
  const json::Reader r(doc, path);
  r.expect_string("format", "trainyard.plan.v1");
  PlanFile plan;
  plan.model = r.string("model");
  plan.hw = r.string("hw");
  plan.nodes = static_cast<int>(r.integer("nodes", 1, 100000));
  const json::Reader w = r.object("workload");
  plan.workload.seq_len = w.integer("seq_len", 1, std::int64_t{1} << 40);
  plan.workload.global_batch = w.integer("global_batch", 1, std::int64_t{1} << 30);
  w.finish();
  plan.precision = r.string("precision");
  if (auto stack = r.optional_string("stack")) plan.stack = *stack;
  const std::string scheme = r.choice("scheme", kSchemes);
  plan.spec = parse_parameters(scheme, r.raw("parameters"), path);
  if (r.has("predicted")) {
    // Free-form metrics; the two that simulate --plan compares must be numbers when present.
    const json::Reader predicted = r.object("predicted");
    if (predicted.has("step_s")) predicted.number("step_s", {0, 1e12, "s"});
    if (predicted.has("peak_hbm_bytes")) predicted.number("peak_hbm_bytes", {0, 1e18, "bytes"});
    plan.predicted = r.raw("predicted");
  }
  r.finish();
  return plan;
}

void check_ring_order(const std::vector<int>& order, int ring, const std::string& origin, const std::string& field) {
  if (order.empty()) return;
  const std::string positions = "0.." + std::to_string(ring - 1);
  std::vector<int> first_index(static_cast<std::size_t>(std::max(ring, 0)), -1);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int position = order[i];
    if (position < 0 || position >= ring) {
      throw InputError(origin, field, "ring positions " + positions, std::to_string(position) + " at index " + std::to_string(i));
    }
    int& first = first_index[static_cast<std::size_t>(position)];
    if (first >= 0) {
      throw InputError(origin, field, "each ring position " + positions + " once",
                       std::to_string(position) + " twice (at indices " + std::to_string(first) + " and " + std::to_string(i) + ")");
    }
    first = static_cast<int>(i);
  }
  if (order.size() != static_cast<std::size_t>(ring)) {
    throw InputError(origin, field, "all " + std::to_string(ring) + " ring positions " + positions + ", each once",
                     std::to_string(order.size()) + " entries");
  }
}

namespace {

// "--chunk" -> "parameters.chunk"; the flags that are not parameters of the scheme have their own fields.
std::string plan_field_of_flag(std::string_view flag) {
  static const std::pair<std::string_view, std::string_view> kOwnFields[] = {
      {"--global-batch", "workload.global_batch"}, {"--seq", "workload.seq_len"}, {"--tokens-per-step", "workload"},
      {"--nodes", "nodes"}, {"--hw", "hw"}, {"--model", "model"}, {"--precision", "precision"}, {"--stack", "stack"},
      {"--zero-stage", "parameters.zero_stage"}, {"--offload", "parameters.offload (megatron: offload_activations)"},
      {"--recompute", "parameters.recompute (zero: activation_checkpointing)"}};
  for (const auto& [from, to] : kOwnFields) {
    if (flag == from) return std::string(to);
  }
  std::string name(flag.substr(2));
  std::replace(name.begin(), name.end(), '-', '_');
  return "parameters." + name;
}

// Renames every "--flag" in `text`: "--tp/--pp" -> "parameters.tp/parameters.pp".
std::string rename_flags(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const bool starts = text.compare(i, 2, "--") == 0 && i + 2 < text.size() && std::islower(static_cast<unsigned char>(text[i + 2])) &&
                        (i == 0 || !std::isalnum(static_cast<unsigned char>(text[i - 1])));
    if (!starts) {
      out += text[i++];
      continue;
    }
    std::size_t end = i + 2;
    while (end < text.size() && (std::islower(static_cast<unsigned char>(text[end])) || text[end] == '-')) ++end;
    out += plan_field_of_flag(std::string_view(text).substr(i, end - i));
    i = end;
  }
  return out;
}

}  // namespace

InputError plan_file_error(const std::string& path, const InputError& e) {
  const std::string& flag = e.origin();
  if (!flag.starts_with("--")) return e;
  // what() is "<origin>: field '<field>': expected ..., got ..."; keep what follows the field.
  const std::string head = flag + ": field '" + e.field() + "': ";
  const std::string message = e.what();
  const std::string rest = message.starts_with(head) ? message.substr(head.size()) : message;
  return InputError(path + ": field '" + rename_flags(flag) + "': " + rename_flags(rest));
}

std::string prediction_drift(const PlanFile& plan, const sim::SimResult& result, int gpus) {
  const auto stored = [&](const char* key) -> std::optional<double> {
    const auto it = plan.predicted.find(key);
    if (it == plan.predicted.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  std::int64_t peak_hbm_bytes = 0;
  for (int g = 0; g < gpus && g < static_cast<int>(result.pools.size()); ++g) {
    peak_hbm_bytes = std::max(peak_hbm_bytes, result.pools[static_cast<std::size_t>(g)].peak_bytes);
  }
  struct Figure {
    const char* key;
    const char* words;
    double now;
    std::string (*format)(double);
  };
  const Figure figures[] = {
      {"step_s", "step time", static_cast<double>(result.step_ns) * 1e-9, [](double s) { return format_fixed(s, 4) + " s"; }},
      {"peak_hbm_bytes", "peak HBM per GPU", static_cast<double>(peak_hbm_bytes), [](double b) { return format_bytes(b); }},
  };
  std::string out;
  for (const auto& f : figures) {
    const auto then = stored(f.key);
    if (!then) continue;
    const double change = *then > 0 ? (f.now - *then) / *then : (f.now > 0 ? 1.0 : 0.0);
    if (std::abs(change) <= kPredictionTolerance) continue;
    out += std::string(out.empty() ? "" : "; ") + f.words + " " + f.format(f.now) + " now, " + f.format(*then) + " predicted (" +
           (change > 0 ? "+" : "") + format_fixed(100 * change, 2) + "%)";
  }
  if (out.empty()) return out;
  return "this simulation differs from the plan's stored prediction by more than " + format_fixed(100 * kPredictionTolerance, 1) +
         "%: " + out + "; the plan's inputs (profiles, model or trainyard version) changed since it was written";
}

}  // namespace trainyard::planner
