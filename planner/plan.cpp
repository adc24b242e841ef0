#include "planner/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "common/error.hpp"
#include "common/json_reader.hpp"
#include "common/units.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

namespace {
using Json = nlohmann::json;
}  // namespace

double PlanSpec::recomputed_layer_share(std::int64_t layers) const { return scheme_named(scheme).recomputed_layer_share(*this, layers); }

std::string PlanSpec::summary() const { return scheme_named(scheme).summary(*this); }

void check_plan(const StepInputs& in, const PlanSpec& spec) { scheme_named(spec.scheme).check(in, spec); }

sim::TaskGraph build_plan(const StepInputs& in, const PlanSpec& spec, RingTrackPlan* rings) {
  return scheme_named(spec.scheme).build(in, spec, rings);
}

Json parameters_json(const PlanSpec& spec) { return params_json(scheme_named(spec.scheme), spec); }

PlanSpec parse_parameters(const std::string& scheme, const Json& parameters, const std::string& origin) {
  const Scheme& entry = scheme_named(scheme, origin, "scheme");
  PlanSpec spec = entry.blank();
  const json::Reader r(parameters, origin, "parameters");
  read_params(entry, r, spec);
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
  const std::string scheme = r.choice("scheme", scheme_names());
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
    int& first = first_index[position];
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
      {"--global-batch", "workload.global_batch"},
      {"--seq", "workload.seq_len"},
      {"--tokens-per-step", "workload"},
      {"--nodes", "nodes"},
      {"--hw", "hw"},
      {"--model", "model"},
      {"--precision", "precision"},
      {"--stack", "stack"},
      {"--zero-stage", "parameters.zero_stage"},
      {"--offload", "parameters.offload (megatron: offload_activations)"},
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
    peak_hbm_bytes = std::max(peak_hbm_bytes, result.pools[g].peak_bytes);
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
  return "this simulation differs from the plan's stored prediction by more than " + format_fixed(100 * kPredictionTolerance, 1) + "%: " + out +
         "; the plan's inputs (profiles, model or trainyard version) changed since it was written";
}

}  // namespace trainyard::planner
