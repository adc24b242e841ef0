// Ring-track: the cyclic layer ring with chunk trains and DRAM prefetch (ringtrack.hpp builds it; closed_form.hpp bounds and estimates it).
#include <algorithm>

#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/schemes/ringtrack/closed_form.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

namespace {

std::string_view placement_name(Placement p) { return p == Placement::hbm ? "hbm" : "dram"; }
std::string_view acts_name(ActivationPolicy a) { return a == ActivationPolicy::hbm ? "hbm" : a == ActivationPolicy::dram ? "dram" : "recompute"; }
std::string_view weights_name(WeightPolicy w) { return w == WeightPolicy::resident ? "resident" : "stream"; }

std::string ringtrack_summary(const PlanSpec& spec) {
  const auto& p = spec.as<RingTrackParams>();
  return "ring " + std::to_string(p.ring) + ", block " + std::to_string(p.block) + ", chunk " + format_tokens(p.chunk) + ", prefetch " +
         std::to_string(p.prefetch) + ", kv " + std::string(placement_name(p.kv)) + ", acts " + std::string(acts_name(p.acts)) + ", weights " +
         std::string(weights_name(p.weights)) + ", states " + std::string(placement_name(p.states));
}

// ring_order: an array of ring positions (empty: chosen from the topology), each checked against "ring".
Param ring_order_param() {
  Param p;
  p.key = "ring_order";
  p.label = "ring order";
  p.kind = Param::Kind::custom;
  p.in_panel = false;
  p.get = [](const PlanSpec& spec) { return nlohmann::json(spec.as<RingTrackParams>().ring_order); };
  p.read = [](const json::Reader& r, PlanSpec& spec) {
    auto& rt = spec.as<RingTrackParams>();
    const nlohmann::json& order = r.raw("ring_order");
    if (!order.is_array() || !std::all_of(order.begin(), order.end(), [](const nlohmann::json& v) { return v.is_number_integer(); })) {
      r.fail("ring_order", "an array of ring positions (empty: chosen from the topology)", json::describe(order));
    }
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto position = order[i].get<std::int64_t>();  // checked here: a cast to int could wrap
      if (position < 0 || position >= rt.ring) {           // a huge unsigned one reads as negative
        r.fail("ring_order", "ring positions 0.." + std::to_string(rt.ring - 1) + " (\"ring\" is " + std::to_string(rt.ring) + ")",
               json::describe(order[i]) + " at index " + std::to_string(i));
      }
      rt.ring_order.push_back(static_cast<int>(position));
    }
    check_ring_order(rt.ring_order, rt.ring, r.origin(), "parameters.ring_order");
  };
  return p;
}

std::vector<Param> ringtrack_params() {
  using B = Param::Bound;
  constexpr int kMax = 1 << 20;
  Param chunk = hidden(member_param("chunk", "chunk", Param::Kind::tokens, &RingTrackParams::chunk));
  chunk.max = std::int64_t{1} << 40;
  return {
      int_param("ring", "ring (GPUs)", &RingTrackParams::ring, 1, kMax, B::gpus),
      int_param("block", "block (layers)", &RingTrackParams::block, 1, kMax, B::layers),
      chunk,
      int_param("prefetch", "prefetch", &RingTrackParams::prefetch, 1, 8),
      enum_param("kv", "K/V", &RingTrackParams::kv, {Placement::hbm, Placement::dram}, placement_name),
      enum_param("acts", "activations", &RingTrackParams::acts, {ActivationPolicy::hbm, ActivationPolicy::dram, ActivationPolicy::recompute},
                 acts_name),
      enum_param("weights", "weights", &RingTrackParams::weights, {WeightPolicy::resident, WeightPolicy::stream}, weights_name),
      enum_param("states", "optimizer states", &RingTrackParams::states, {Placement::hbm, Placement::dram}, placement_name),
      ring_order_param(),
  };
}

// Every ring size, one layer per stop or the staged block, every chunk size, K/V streamed from DRAM (at the
// prefetch depths that differ) or kept in HBM, each activation policy, and the weight/state placements.
void enumerate_ringtrack(const StepInputs& in, const AddPlan& add) {
  const int gpus = in.cluster.gpus();
  const std::int64_t S = in.workload.seq_len;
  const int L = static_cast<int>(in.model.layers);
  for (int ring : divisors(gpus)) {
    std::vector<int> blocks{1};
    const int staged = (L + ring - 1) / ring;
    if (staged != 1) blocks.push_back(staged);
    for (int block : blocks) {
      for (std::int64_t chunk : chunk_sizes(S)) {
        // K/V stream in blocks of at least 64K tokens; depths beyond the most blocks a visit reads build the
        // same graph, and without streaming (kv in HBM) the depth does not matter at all.
        const std::int64_t span = std::max<std::int64_t>(1, (kKvBlockTokens + chunk - 1) / chunk);
        const std::int64_t most_blocks = (S / chunk - 1 + span - 1) / span;
        for (Placement kv : {Placement::dram, Placement::hbm}) {
          std::vector<int> depths;
          for (int d = 1; d <= 3 && (d == 1 || d <= most_blocks); ++d) depths.push_back(d);
          if (kv == Placement::hbm) depths = {2};
          for (int prefetch : depths) {
            for (ActivationPolicy acts : {ActivationPolicy::recompute, ActivationPolicy::dram, ActivationPolicy::hbm}) {
              for (auto [weights, states] : {std::pair{WeightPolicy::resident, Placement::hbm}, std::pair{WeightPolicy::resident, Placement::dram},
                                             std::pair{WeightPolicy::stream, Placement::dram}}) {
                add(PlanSpec{"ringtrack", RingTrackParams{ring, block, chunk, prefetch, kv, acts, weights, states, {}}});
              }
            }
          }
        }
      }
    }
  }
}

sim::TaskGraph build_ringtrack_step(const StepInputs& in, const PlanSpec& spec, RingTrackPlan* rings) {
  RingTrackPlan plan = build_ringtrack(in, spec.as<RingTrackParams>());
  sim::TaskGraph graph = std::move(plan.graph);
  if (rings) *rings = std::move(plan);
  return graph;
}

PlanSpec ringtrack_from_flags(const FlagValues& flags, const sim::Cluster& cluster) {
  auto word = [&](const char* flag, const std::vector<std::string>& allowed, const std::string& fallback) {
    const std::string value = flags.text(flag).value_or(fallback);
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      std::string expected;
      for (const auto& a : allowed) expected += (expected.empty() ? "" : " or ") + a;
      throw InputError(std::string("--") + flag, "value", expected, "\"" + value + "\"");
    }
    return value;
  };
  PlanSpec spec{"ringtrack", RingTrackParams{}};
  RingTrackParams& p = spec.as<RingTrackParams>();
  p.ring = static_cast<int>(flags.integer("ring").value_or(cluster.gpus()));
  p.block = static_cast<int>(flags.integer("block").value_or(1));
  p.chunk = parse_token_count(flags.text("chunk").value_or("16K"), "--chunk");
  p.prefetch = static_cast<int>(flags.integer("prefetch").value_or(2));
  p.kv = word("kv", {"hbm", "dram"}, "dram") == "hbm" ? Placement::hbm : Placement::dram;
  const std::string acts = word("acts", {"hbm", "dram", "recompute"}, "dram");
  p.acts = acts == "hbm" ? ActivationPolicy::hbm : acts == "dram" ? ActivationPolicy::dram : ActivationPolicy::recompute;
  p.weights = word("weights", {"resident", "stream"}, "resident") == "stream" ? WeightPolicy::stream : WeightPolicy::resident;
  p.states = word("states", {"hbm", "dram"}, "hbm") == "dram" ? Placement::dram : Placement::hbm;
  if (const auto list = flags.text("ring-order")) {
    for (const auto& item : split_commas(*list)) {
      if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 6) {
        throw InputError("--ring-order", "value", "a comma list of ring positions (e.g. 0,2,1,3)", "\"" + *list + "\"");
      }
      p.ring_order.push_back(std::stoi(item));
    }
    if (p.ring >= 1 && cluster.gpus() % p.ring == 0) check_ring_order(p.ring_order, p.ring, "--ring-order", "value");
  }
  return spec;
}

// --check's plain step: the whole sequence as one chunk, everything in HBM.
PlanSpec ringtrack_unchunked(const PlanSpec& spec, std::int64_t seq_len) {
  PlanSpec plain = spec;
  RingTrackParams& p = plain.as<RingTrackParams>();
  p.chunk = seq_len;
  p.kv = Placement::hbm;
  p.acts = ActivationPolicy::hbm;
  p.weights = WeightPolicy::resident;
  p.states = Placement::hbm;
  return plain;
}

}  // namespace

Scheme ringtrack_scheme() {
  return {
      .name = "ringtrack",
      .description = "ring-track temporal pipeline: cyclic layer ring, chunk trains, DRAM prefetch",
      .family = "ringtrack",
      .defaults = RingTrackParams{},
      .params = ringtrack_params(),
      .flags = {"ring", "block", "chunk", "prefetch", "kv", "acts", "weights", "states", "ring-order"},
      .required_flags = {},
      .from_flags = ringtrack_from_flags,
      .summary = ringtrack_summary,
      .check = [](const StepInputs& in, const PlanSpec& spec) { check_ringtrack(in, spec.as<RingTrackParams>()); },
      .build = build_ringtrack_step,
      .enumerate = enumerate_ringtrack,
      .bounds = [](const BoundContext& ctx, const PlanSpec& spec) { return ringtrack_bounds(ctx, spec.as<RingTrackParams>()); },
      .analytic = [](const BoundContext& ctx, const PlanSpec& spec) { return ringtrack_estimate(ctx, spec.as<RingTrackParams>()); },
      .estimate = [](const StepInputs& in, const PlanSpec& spec) { return estimate_tasks(ringtrack_tasks(in, spec.as<RingTrackParams>())); },
      .search_cost =
          [](const StepInputs& in, const PlanSpec& spec) {
            return static_cast<double>(in.model.layers) * static_cast<double>(in.workload.seq_len) /
                   static_cast<double>(spec.as<RingTrackParams>().chunk);
          },
      .recomputed_layer_share = [](const PlanSpec& spec,
                                   std::int64_t) { return spec.as<RingTrackParams>().acts == ActivationPolicy::recompute ? 1.0 : 0.0; },
      .run = RunFacet{.refusal = [](const StepInputs&, const PlanSpec&, int) { return std::string(); }, .unchunked = ringtrack_unchunked},
      .hotspa =
          HotSpaFacet{
              .layout = [](const StepInputs& in, const PlanSpec& spec, bool) { return ringtrack_layout(in, spec.as<RingTrackParams>()); },
              .set_micro_batch = [](PlanSpec&, std::int64_t) {},  // a replica's ring takes one sequence at a time
              .row_multiple = [](const PlanSpec& spec, int gpus) -> std::int64_t { return gpus / std::max(1, spec.as<RingTrackParams>().ring); },
              .complete_strategy =
                  [](nlohmann::json& params, const std::vector<std::string>& given, int gpus) {
                    if (std::find(given.begin(), given.end(), "ring") == given.end()) params["ring"] = gpus;  // one ring of every GPU
                  },
              .min_row_tokens = 65536,  // a ring pays off for long sequences only
          },
      .chunk =
          ChunkFacet{
              .tokens = [](const PlanSpec& spec) { return spec.as<RingTrackParams>().chunk; },
              .set_tokens = [](PlanSpec& spec, std::int64_t tokens) { spec.as<RingTrackParams>().chunk = tokens; },
              .interactive_chunks = 1024,
          },
  };
}

}  // namespace trainyard::planner
