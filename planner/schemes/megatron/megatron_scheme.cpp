// Megatron-LM: TP (with SP and TP overlap), PP (interleaved, uneven), DP (distributed optimizer), CP, recompute
// and checkpoint offload (megatron.hpp builds it; closed_form.hpp bounds and estimates it).
#include <algorithm>
#include <utility>

#include "common/error.hpp"

#include "planner/engines/writers.hpp"
#include "planner/schemes/megatron/closed_form.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

namespace {

std::string megatron_summary(const PlanSpec& spec) {
  const auto& p = spec.as<MegatronParams>();
  const std::string uneven = p.first_stage_layers > 0 || p.last_stage_layers > 0
                                 ? ", stages " + std::to_string(p.first_stage_layers) + "/../" + std::to_string(p.last_stage_layers)
                                 : "";
  return "tp " + std::to_string(p.tp) + ", pp " + std::to_string(p.pp) + ", dp " + std::to_string(p.dp) +
         (p.cp > 1 ? ", cp " + std::to_string(p.cp) + " " + std::string(to_string(p.cp_comm)) : "") +
         (p.cp_a2a > 0 ? " (a2a groups of " + std::to_string(p.cp_a2a) + ")" : "") + (p.vpp > 1 ? ", vpp " + std::to_string(p.vpp) : "") + uneven +
         ", mb " + std::to_string(p.micro_batch) + (p.sequence_parallel ? ", sp" : "") + (p.tp_comm_overlap ? ", tp overlap" : "") + ", recompute " +
         std::string(to_string(p.recompute)) + (p.offload_activations ? ", offload acts" : "") + (p.distributed_optimizer ? ", dist-opt" : "");
}

std::vector<Param> megatron_params() {
  using B = Param::Bound;
  constexpr int kMax = 1 << 20;
  return {
      int_param("tp", "tp", &MegatronParams::tp, 1, kMax, B::gpus),
      int_param("pp", "pp", &MegatronParams::pp, 1, kMax, B::gpus),
      int_param("dp", "dp", &MegatronParams::dp, 1, kMax, B::gpus),
      int_param("vpp", "vpp", &MegatronParams::vpp, 1, kMax, B::layers),
      int_param("micro_batch", "micro-batch", &MegatronParams::micro_batch, 1, kMax),
      bool_param("sequence_parallel", "sequence parallel", &MegatronParams::sequence_parallel),
      enum_param("recompute", "recompute", &MegatronParams::recompute, {Recompute::none, Recompute::selective, Recompute::full}, to_string),
      bool_param("offload_activations", "offload checkpoints", &MegatronParams::offload_activations),
      // Optional from here on: plans written before these existed mean their defaults (off, cp 1, p2p, an even split).
      optional(bool_param("distributed_optimizer", "distributed optimizer", &MegatronParams::distributed_optimizer)),
      optional(bool_param("tp_comm_overlap", "TP comm overlap", &MegatronParams::tp_comm_overlap)),
      optional(int_param("cp", "cp", &MegatronParams::cp, 1, kMax, B::gpus)),
      optional(
          enum_param("cp_comm", "CP comm", &MegatronParams::cp_comm, {CpComm::p2p, CpComm::all_gather, CpComm::a2a, CpComm::a2a_p2p}, to_string)),
      optional(int_param("cp_a2a", "CP a2a group", &MegatronParams::cp_a2a, 0, kMax, B::gpus)),
      optional(int_param("first_stage_layers", "first stage layers", &MegatronParams::first_stage_layers, 0, kMax, B::layers)),
      optional(int_param("last_stage_layers", "last stage layers", &MegatronParams::last_stage_layers, 0, kMax, B::layers)),
  };
}

// An uneven pipeline split for `layers` that `pp` stages (x vpp chunks) do not divide evenly, as Llama 3's 405B
// ran (126 layers on 16 stages: 7, 14 x 8, 7): every middle stage takes ceil(layers / pp), the first and last
// share the rest, fewer each (they also hold the embedding and the LM head). {0, 0}: the even split serves, or
// no uneven split is searched (interleaved pipelines: Megatron wants each stage's layers divisible by vpp).
std::pair<int, int> uneven_stage_layers(std::int64_t layers, int pp, int vpp) {
  if (pp < 2 || vpp > 1 || layers % pp == 0) return {0, 0};
  const std::int64_t middle = (layers + pp - 1) / pp, rest = layers - (pp - 2) * middle;
  if (rest < 2) return {0, 0};
  return {static_cast<int>(rest / 2), static_cast<int>(rest - rest / 2)};
}

// One (tp, cp, pp) layout's plans: interleaving by 2 where it pipelines, SP, the recompute modes that can pay,
// checkpoint offload under full recompute, the searched micro-batches, and the distributed optimizer wherever
// there is data parallelism.
void enumerate_megatron_layout(const StepInputs& in, int tp, int cp, int pp, const AddPlan& add) {
  const bool unfused = stored_score_bytes(in.cluster) > 0;
  for (int vpp : {1, 2}) {
    if (vpp > 1 && pp == 1) continue;
    const auto [first, last] = uneven_stage_layers(in.model.layers, pp, vpp);
    for (bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      // Selective recompute keeps what "none" keeps once attention is fused (planner/transformer.hpp), at the
      // price of the core attention's recompute: it is tried only where attention is unfused.
      for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
        if (rc == Recompute::selective && !unfused) continue;  // with fused attention: none's memory, more time
        for (bool oc : {false, true}) {
          if (oc && rc != Recompute::full) continue;
          for (std::int64_t mb : kSearchedMicroBatches) {
            PlanSpec spec{"megatron", MegatronParams{}};
            auto& mp = spec.as<MegatronParams>();
            mp.tp = tp;
            mp.cp = cp;
            mp.pp = pp;
            mp.dp = in.cluster.gpus() / (tp * cp * pp);
            mp.vpp = vpp;
            mp.first_stage_layers = first;
            mp.last_stage_layers = last;
            mp.micro_batch = mb;
            mp.sequence_parallel = sp;
            mp.recompute = rc;
            mp.offload_activations = oc;
            add(spec);
            if (mp.dp * mp.cp > 1) {
              mp.distributed_optimizer = true;
              add(spec);
            }
          }
        }
      }
    }
  }
}

// Every TP degree within a node, every CP degree (K/V ring passes, Megatron's default) and every pipeline depth
// (split unevenly where the layers do not divide), with enumerate_megatron_layout's options. Not searched: TP
// overlap, the other CP comm types (explicit plans only).
void enumerate_megatron(const StepInputs& in, const AddPlan& add) {
  const int gpus = in.cluster.gpus();
  for (int tp : divisors(gpus)) {
    // Tensor parallelism across nodes (valid for explicit plans) is not searched: every layer's collectives
    // would cross the network.
    if (tp > in.cluster.topology.gpus_per_node()) continue;
    for (int cp : divisors(gpus / tp)) {
      for (int pp : divisors(gpus / (tp * cp))) enumerate_megatron_layout(in, tp, cp, pp, add);
    }
  }
}

PlanSpec megatron_from_flags(const FlagValues& flags, const sim::Cluster& cluster) {
  PlanSpec spec{"megatron", MegatronParams{}};
  MegatronParams& p = spec.as<MegatronParams>();
  auto integer = [&](const char* flag, std::int64_t fallback) { return static_cast<int>(flags.integer(flag).value_or(fallback)); };
  p.tp = integer("tp", 1);
  p.pp = integer("pp", 1);
  if (p.tp < 1 || p.pp < 1) throw InputError("--tp/--pp", "value", "positive integers", "a value below 1");
  p.cp = integer("cp", 1);
  if (p.cp < 1) throw InputError("--cp", "value", "a positive integer", std::to_string(p.cp));
  p.dp = integer("dp", std::max(1, cluster.gpus() / (p.tp * p.pp * p.cp)));
  if (const auto comm = flags.text("cp-comm")) {
    const auto named = cp_comm_named(*comm);
    if (!named) throw InputError("--cp-comm", "value", "p2p, all_gather, a2a or a2a+p2p", "\"" + *comm + "\"");
    p.cp_comm = *named;
  }
  p.cp_a2a = integer("cp-a2a", 0);
  p.vpp = integer("vpp", 1);
  p.first_stage_layers = integer("first-stage-layers", 0);
  p.last_stage_layers = integer("last-stage-layers", 0);
  p.micro_batch = flags.integer("micro-batch").value_or(1);
  p.sequence_parallel = flags.on("sequence-parallel");
  p.tp_comm_overlap = flags.on("tp-comm-overlap");
  p.distributed_optimizer = flags.on("distributed-optimizer");
  p.recompute = recompute_flag(flags);
  if (const auto offload = flags.text("offload")) {
    if (*offload != "acts") throw InputError("--offload", "value", "acts (the only offload megatron models)", "\"" + *offload + "\"");
    p.offload_activations = true;
  }
  return spec;
}

// What the executors run of Megatron's steps so far (tests/test_mpi.cpp, test_backend_reference.cpp):
// pipeline (interleaved or split unevenly too) and data parallelism with micro-batches of up to 255 sequences (one
// with CP), any recompute, offloaded checkpoints, the distributed optimizer, context parallelism by p2p, a2a or
// a2a+p2p (tp 1, the heads split evenly over the all-to-all group), and on the executor only (the CPU reference
// refuses them) context parallelism by all-gather and tensor parallelism, with or without
// sequence parallelism (heads, K/V heads, the MLP and the vocabulary split evenly; with SP, each chunk's rows too).
std::string megatron_run_refusal(const StepInputs& in, const PlanSpec& spec, int ranks) {
  const MegatronParams& p = spec.as<MegatronParams>();
  const bool executor_only = p.tp > 1 || (p.cp > 1 && p.cp_comm == CpComm::all_gather);
  if (executor_only && ranks != in.cluster.gpus()) {
    return "tp 1 and cp_comm p2p or a2a on one process (tensor parallelism and all-gather context parallelism run on the executor only, "
           "under mpirun -np " +
           std::to_string(in.cluster.gpus()) + ")";
  }
  if (p.tp_comm_overlap) {
    return "no --tp-comm-overlap (its graph runs each collective beside the GEMM whose output it moves, a timing model that "
           "is not a dataflow)";
  }
  // Sequence parallelism splits each chunk's rows evenly over the TP group.
  const std::int64_t chunk_rows = megatron_layer_split(in, p).chunk_tokens();
  if (p.sequence_parallel && chunk_rows % p.tp != 0) {
    return "a chunk of rows tp divides with sequence parallelism (" + std::to_string(chunk_rows) + " rows, tp " + std::to_string(p.tp) + ")";
  }
  const model::ModelConfig& m = in.model;
  if (p.tp > 1 && model::tensor_shard_mismatch(m, p.tp)) {
    return "a tp dividing the model's heads, K/V heads, ffn_hidden and vocab (" + std::to_string(m.heads) + ", " + std::to_string(m.kv_heads) + ", " +
           std::to_string(m.ffn_hidden) + ", " + std::to_string(m.vocab) + ")";
  }
  if (p.cp != 1 && (p.cp_comm == CpComm::a2a || p.cp_comm == CpComm::a2a_p2p)) {  // LayerSplit::executable_cp_a2a(_p2p)
    const int a2a = p.cp_comm == CpComm::a2a ? p.cp : p.cp_a2a;
    if (p.tp > 1) return "tp 1 with cp_comm a2a or a2a+p2p (their all-to-alls split whole heads)";
    if (m.heads % a2a != 0 || m.kv_heads % a2a != 0) {
      return "an all-to-all group (" + std::to_string(a2a) + ") dividing the model's heads and K/V heads (" + std::to_string(m.heads) + ", " +
             std::to_string(m.kv_heads) + ")";
    }
  }
  if (p.micro_batch > 1 && p.cp > 1) return "micro_batch 1 with context parallelism (its ring and exchanges carry one sequence)";
  if (p.micro_batch > 255) return "a micro_batch of at most 255 sequences";
  return "";
}

}  // namespace

Scheme megatron_scheme() {
  return {
      .name = "megatron",
      .description = "Megatron-LM TP/PP/DP/SP with selective or full recompute",
      .family = "megatron",
      .defaults = MegatronParams{},
      .params = megatron_params(),
      .flags = {"tp", "pp", "dp", "cp", "cp-comm", "cp-a2a", "vpp", "first-stage-layers", "last-stage-layers", "micro-batch", "sequence-parallel",
                "tp-comm-overlap", "distributed-optimizer", "recompute", "offload"},
      .required_flags = {},
      .from_flags = megatron_from_flags,
      .summary = megatron_summary,
      .check = [](const StepInputs& in, const PlanSpec& spec) { check_megatron(in, spec.as<MegatronParams>()); },
      .build = [](const StepInputs& in, const PlanSpec& spec, RingTrackPlan*) { return build_megatron(in, spec.as<MegatronParams>()); },
      .enumerate = enumerate_megatron,
      .bounds = [](const BoundContext& ctx, const PlanSpec& spec) { return megatron_bounds(ctx, spec.as<MegatronParams>()); },
      .analytic = [](const BoundContext& ctx, const PlanSpec& spec) { return megatron_estimate(ctx, spec.as<MegatronParams>()); },
      .estimate = [](const StepInputs& in, const PlanSpec& spec) { return estimate_tasks(megatron_tasks(in, spec.as<MegatronParams>())); },
      .search_cost = [](const StepInputs& in, const PlanSpec&) { return static_cast<double>(in.model.layers); },
      .recomputed_layer_share = [](const PlanSpec& spec, std::int64_t) { return spec.as<MegatronParams>().recompute == Recompute::full ? 1.0 : 0.0; },
      .run = RunFacet{.refusal = megatron_run_refusal, .unchunked = nullptr},  // --check: the plain data-parallel step
      .hotspa =
          HotSpaFacet{
              .layout = [](const StepInputs& in, const PlanSpec& spec, bool) { return megatron_layout(in, spec.as<MegatronParams>()); },
              .set_micro_batch = [](PlanSpec& spec, std::int64_t sequences) { spec.as<MegatronParams>().micro_batch = sequences; },
              .row_multiple =
                  [](const PlanSpec& spec, int) {
                    const auto& p = spec.as<MegatronParams>();
                    return std::int64_t{p.dp} * p.micro_batch * (p.vpp > 1 ? p.pp : 1);
                  },
              .complete_strategy =
                  [](nlohmann::json& params, const std::vector<std::string>& given, int gpus) {
                    if (std::find(given.begin(), given.end(), "dp") != given.end()) return;
                    params["dp"] = std::max<std::int64_t>(1, gpus / (params["tp"].get<std::int64_t>() * params["pp"].get<std::int64_t>()));
                  },
          },
      .chunk = std::nullopt,
      .reduce_by_symmetry = reduce_megatron_by_symmetry,
      .exports = {{"megatron", megatron_lm_launch}, {"torchtitan", torchtitan_megatron_launch}},
  };
}

}  // namespace trainyard::planner
