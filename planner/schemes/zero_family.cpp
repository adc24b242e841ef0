#include "planner/schemes/zero_family.hpp"

#include <algorithm>
#include <array>

#include "common/units.hpp"
#include "planner/search.hpp"
#include "planner/zero.hpp"

namespace trainyard::planner {

namespace {

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

// ZeRO offload sets that make sense for a stage: (optimizer, grads, params).
std::vector<std::array<bool, 3>> offload_sets(int stage) {
  std::vector<std::array<bool, 3>> out{{false, false, false}};
  if (stage >= 1) out.push_back({true, false, false});
  if (stage >= 2) out.push_back({true, true, false});
  if (stage == 3) out.push_back({true, true, true});
  return out;
}

}  // namespace

std::string zero_family_summary(const ZeroParams& z, const std::string& split) {
  std::string out = "zero-" + std::to_string(z.stage) + split;
  out += ", mb " + std::to_string(z.micro_batch);
  if (z.activation_checkpointing) out += z.checkpoint_every == 1 ? ", AC" : ", AC every " + std::to_string(z.checkpoint_every) + " layers";
  if (offload_list(z) != "none") out += ", offload " + offload_list(z);
  return out;
}

nlohmann::json zero_family_json(const ZeroParams& z) {
  return {{"zero_stage", z.stage}, {"sp", z.sp}, {"cp", z.cp}, {"zigzag", z.zigzag}, {"chunk", z.fpdt_chunk},
          {"micro_batch", z.micro_batch}, {"activation_checkpointing", z.activation_checkpointing},
          {"checkpoint_every", z.checkpoint_every},
          {"offload", offload_list(z)}};
}

void parse_zero_family(const json::Reader& r, ZeroParams& z) {
  constexpr std::int64_t kMaxTokens = std::int64_t{1} << 40;
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
}

void zero_family_variants(const std::string& scheme, const ZeroParams& base, bool require_ac, const AddPlan& add) {
  for (std::int64_t mb : kSearchedMicroBatches) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (const auto& set : offload_sets(stage)) {
        for (int ac = require_ac ? 1 : 0; ac <= 1; ++ac) {
          for (int oc = 0; oc <= ac; ++oc) {
            PlanSpec spec;
            spec.scheme = scheme;
            spec.zero = base;
            spec.zero.micro_batch = mb;
            spec.zero.stage = stage;
            spec.zero.offload_optimizer = set[0];
            spec.zero.offload_grads = set[1];
            spec.zero.offload_params = set[2];
            spec.zero.activation_checkpointing = ac == 1;
            spec.zero.offload_activations = oc == 1;
            add(spec);
          }
        }
      }
    }
  }
}

Scheme zero_family_scheme(std::string name, std::string description, std::vector<std::string> split_flags) {
  std::vector<std::string> flags = std::move(split_flags);
  for (const char* common : {"zero-stage", "micro-batch", "recompute", "offload"}) flags.emplace_back(common);
  return {
      .name = std::move(name),
      .description = std::move(description),
      .flags = std::move(flags),
      .required_flags = {},
      .executable = false,
      .summary = nullptr,  // each member's own: it names its split
      .parameters_json = [](const PlanSpec& spec) { return zero_family_json(spec.zero); },
      .parse_parameters = [](const json::Reader& r, PlanSpec& spec) { parse_zero_family(r, spec.zero); },
      .check = [](const StepInputs& in, const PlanSpec& spec) { check_zero(in, spec.zero); },
      .build = [](const StepInputs& in, const PlanSpec& spec, RingTrackPlan*) { return build_zero(in, spec.zero); },
      .enumerate = nullptr,  // each member's own
      .estimate = [](const StepInputs& in, const PlanSpec& spec) { return estimate_tasks(zero_tasks(in, spec.zero)); },
      .recomputed_layer_share =
          [](const PlanSpec& spec, std::int64_t layers) {
            return static_cast<double>(spec.zero.checkpointed_layers(layers)) / static_cast<double>(layers);
          },
      .layout = [](const StepInputs& in, const PlanSpec& spec, bool gradients) { return zero_layout(in, spec.zero, gradients); },
      .set_micro_batch = [](PlanSpec& spec, std::int64_t sequences) { spec.zero.micro_batch = sequences; },
      .row_multiple =
          [](const PlanSpec& spec, int gpus) { return std::int64_t{gpus / std::max(1, spec.zero.sp * spec.zero.cp)} * spec.zero.micro_batch; },
      .complete_strategy = [](nlohmann::json&, const std::vector<std::string>&, int) {},
  };
}

}  // namespace trainyard::planner
