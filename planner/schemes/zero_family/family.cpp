#include "planner/schemes/zero_family/family.hpp"

#include <algorithm>
#include <array>

#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/schemes/zero_family/closed_form.hpp"
#include "planner/schemes/zero_family/zero.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

namespace {

// Turns on one ZeRO offload target ("optimizer", "grads", "params" or "acts"); false for any other word.
bool set_offload(ZeroParams& z, const std::string& target) {
  if (target == "optimizer") z.offload_optimizer = true;
  else if (target == "grads") z.offload_grads = true;
  else if (target == "params") z.offload_params = true;
  else if (target == "acts") z.offload_activations = true;
  else return false;
  return true;
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

// ZeRO offload sets that make sense for a stage: (optimizer, grads, params).
std::vector<std::array<bool, 3>> offload_sets(int stage) {
  std::vector<std::array<bool, 3>> out{{false, false, false}};
  if (stage >= 1) out.push_back({true, false, false});
  if (stage >= 2) out.push_back({true, true, false});
  if (stage == 3) out.push_back({true, true, true});
  return out;
}

// The family's parameters; the split's degrees and switches other members use are fixed in this one's panel.
std::vector<Param> zero_family_params(const std::vector<std::string>& split_keys) {
  using B = Param::Bound;
  constexpr int kMax = 1 << 20;
  auto split = [&](Param p) {
    p.in_panel = std::find(split_keys.begin(), split_keys.end(), p.key) != split_keys.end();
    return p;
  };
  Param chunk = hidden(member_param("chunk", "chunk", Param::Kind::tokens, &ZeroParams::fpdt_chunk));
  chunk.min = 0;
  chunk.max = std::int64_t{1} << 40;
  Param offload;
  offload.key = "offload";
  offload.label = "offload";
  offload.kind = Param::Kind::set;
  offload.choices = {"optimizer", "grads", "params", "acts"};
  offload.get = [](const PlanSpec& spec) { return nlohmann::json(offload_list(spec.as<ZeroParams>())); };
  offload.set = [](PlanSpec& spec, const nlohmann::json& v) {
    auto& z = spec.as<ZeroParams>();
    z.offload_optimizer = z.offload_grads = z.offload_params = z.offload_activations = false;
    const std::string list = v.get<std::string>();
    if (list == "none") return;
    for (const auto& item : split_commas(list)) set_offload(z, item);
  };
  return {
      int_param("zero_stage", "ZeRO stage", &ZeroParams::stage, 0, 3),
      split(int_param("sp", "sp (Ulysses)", &ZeroParams::sp, 1, kMax, B::gpus)),
      split(int_param("cp", "cp (ring)", &ZeroParams::cp, 1, kMax, B::gpus)),
      split(bool_param("zigzag", "zigzag", &ZeroParams::zigzag)),
      chunk,
      int_param("micro_batch", "micro-batch", &ZeroParams::micro_batch, 1, kMax),
      bool_param("activation_checkpointing", "activation checkpointing", &ZeroParams::activation_checkpointing),
      optional(int_param("checkpoint_every", "checkpoint every (layers)", &ZeroParams::checkpoint_every, 1, 100000, B::layers)),
      offload,
  };
}

}  // namespace

std::string zero_family_summary(const ZeroParams& z, const std::string& split) {
  std::string out = "zero-" + std::to_string(z.stage) + split;
  out += ", mb " + std::to_string(z.micro_batch);
  if (z.activation_checkpointing) out += z.checkpoint_every == 1 ? ", AC" : ", AC every " + std::to_string(z.checkpoint_every) + " layers";
  if (offload_list(z) != "none") out += ", offload " + offload_list(z);
  return out;
}

void zero_family_variants(const std::string& scheme, const ZeroParams& base, bool require_ac, const AddPlan& add) {
  for (std::int64_t mb : kSearchedMicroBatches) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (const auto& set : offload_sets(stage)) {
        for (int ac = require_ac ? 1 : 0; ac <= 1; ++ac) {
          for (int oc = 0; oc <= ac; ++oc) {
            ZeroParams z = base;
            z.micro_batch = mb;
            z.stage = stage;
            z.offload_optimizer = set[0];
            z.offload_grads = set[1];
            z.offload_params = set[2];
            z.activation_checkpointing = ac == 1;
            z.offload_activations = oc == 1;
            add(PlanSpec{scheme, z});
          }
        }
      }
    }
  }
}

PlanSpec zero_family_from_flags(const FlagValues& flags) {
  PlanSpec spec{"", ZeroParams{}};  // the caller names the scheme
  ZeroParams& p = spec.as<ZeroParams>();
  p.stage = static_cast<int>(flags.integer("zero-stage").value_or(0));
  p.sp = static_cast<int>(flags.integer("sp").value_or(1));
  p.cp = static_cast<int>(flags.integer("cp").value_or(1));
  p.zigzag = flags.on("zigzag");
  p.micro_batch = flags.integer("micro-batch").value_or(1);
  // Full checkpoints every layer; selective every other one (torchtitan's selective layer AC).
  const Recompute recompute = recompute_flag(flags);
  p.activation_checkpointing = recompute != Recompute::none;
  p.checkpoint_every = recompute == Recompute::selective ? 2 : 1;
  if (const auto offload = flags.text("offload")) {
    for (const auto& item : split_commas(*offload)) {
      if (!set_offload(p, item)) throw InputError("--offload", "value", "a comma list of optimizer, grads, params, acts", "\"" + item + "\"");
    }
  }
  return spec;
}

// Micro-batches of several sequences run where nothing exchanges a sequence's pieces (no Ulysses, CP or FPDT).
std::string zero_family_run_refusal(const StepInputs&, const PlanSpec& spec, int) {
  const ZeroParams& p = spec.as<ZeroParams>();
  if (p.micro_batch == 1) return "";
  if (p.sp > 1 || p.cp > 1 || p.fpdt_chunk > 0) return "micro_batch 1 with Ulysses, ring attention or FPDT (their exchanges carry one sequence)";
  return p.micro_batch <= 255 ? "" : "a micro_batch of at most 255 sequences";
}

Scheme zero_family_scheme(std::string name, std::string description, std::vector<std::string> split_flags) {
  std::vector<std::string> params_shown = split_flags;  // the split's flags are its plan-file keys too
  std::vector<std::string> flags = std::move(split_flags);
  for (const char* common : {"zero-stage", "micro-batch", "recompute", "offload"}) flags.emplace_back(common);
  return {
      .name = std::move(name),
      .description = std::move(description),
      .family = "zero",
      .defaults = ZeroParams{},
      .params = zero_family_params(params_shown),
      .flags = std::move(flags),
      .required_flags = {},
      .from_flags = [](const FlagValues& given, const sim::Cluster&) { return zero_family_from_flags(given); },
      .summary = nullptr,  // each member's own: it names its split
      .check = [](const StepInputs& in, const PlanSpec& spec) { check_zero(in, spec.as<ZeroParams>()); },
      .build = [](const StepInputs& in, const PlanSpec& spec, RingTrackPlan*) { return build_zero(in, spec.as<ZeroParams>()); },
      .enumerate = nullptr,  // each member's own
      .bounds = [](const BoundContext& ctx, const PlanSpec& spec) { return zero_bounds(ctx, spec.as<ZeroParams>()); },
      .analytic = [](const BoundContext& ctx, const PlanSpec& spec) { return zero_estimate(ctx, spec.as<ZeroParams>()); },
      .estimate = [](const StepInputs& in, const PlanSpec& spec) { return estimate_tasks(zero_tasks(in, spec.as<ZeroParams>())); },
      .search_cost =
          [](const StepInputs& in, const PlanSpec& spec) {
            const double layers = static_cast<double>(in.model.layers), S = static_cast<double>(in.workload.seq_len);
            const ZeroParams& z = spec.as<ZeroParams>();
            if (z.fpdt_chunk <= 0) return layers;
            const double u = std::max(1.0, S / static_cast<double>(z.fpdt_chunk));  // FPDT: chunk pairs per layer
            return layers * u * u;
          },
      .recomputed_layer_share =
          [](const PlanSpec& spec, std::int64_t layers) {
            return static_cast<double>(spec.as<ZeroParams>().checkpointed_layers(layers)) / static_cast<double>(layers);
          },
      .run = std::nullopt,  // each member that runs sets its own
      .hotspa =
          HotSpaFacet{
              .layout = [](const StepInputs& in, const PlanSpec& spec, bool gradients) { return zero_layout(in, spec.as<ZeroParams>(), gradients); },
              .set_micro_batch = [](PlanSpec& spec, std::int64_t sequences) { spec.as<ZeroParams>().micro_batch = sequences; },
              .row_multiple =
                  [](const PlanSpec& spec, int gpus) {
                    const ZeroParams& z = spec.as<ZeroParams>();
                    return std::int64_t{gpus / std::max(1, z.sp * z.cp)} * z.micro_batch;
                  },
              .complete_strategy = [](nlohmann::json&, const std::vector<std::string>&, int) {},
          },
      .chunk = std::nullopt,
      .reduce_by_symmetry = reduce_zero_family_by_symmetry,
  };
}

}  // namespace trainyard::planner
