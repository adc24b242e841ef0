#include "planner/symmetry.hpp"

#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

namespace {
constexpr int kBuilt = 2;  // replicas or cp ranks built: a ring needs two members, which keep every link's load symmetric

// No reduction, with `reason` in `why_not` when the caller asked.
std::optional<ReducedStep> not_reduced(std::string* why_not, const std::string& reason) {
  if (why_not != nullptr) *why_not = reason;
  return std::nullopt;
}
}  // namespace

std::optional<ReducedStep> reduce_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  const Scheme& scheme = scheme_named(spec.scheme);
  if (scheme.reduce_by_symmetry != nullptr) return scheme.reduce_by_symmetry(in, spec, why_not);
  if (why_not != nullptr) {
    std::string reduced;
    for (const auto& name : scheme_names()) {
      if (scheme_named(name).reduce_by_symmetry != nullptr) reduced += (reduced.empty() ? "" : ", ") + name;
    }
    *why_not = spec.scheme + " steps are not reduced by symmetry yet (only " + reduced + "'s are)";
  }
  return std::nullopt;
}

std::optional<ReducedStep> reduce_megatron_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  const MegatronParams& p = spec.megatron;
  const int per_node = in.cluster.topology.gpus_per_node();
  // Context-parallel ranks: identical under Megatron's load-balanced split when each one's TP group fills
  // whole nodes (the cp ranks then meet only at the fabric).
  const bool cp_reduces = p.cp > kBuilt && p.tp % per_node == 0 && p.cp_comm != CpComm::a2a &&
                          p.cp_comm != CpComm::a2a_p2p;  // all-to-alls: every pair of a group exchanges
  const int cp_built = cp_reduces ? kBuilt : p.cp;
  // Data-parallel replicas: when each pipeline stage of a replica fills whole nodes.
  const bool dp_reduces = p.dp > kBuilt && (p.tp * cp_built) % per_node == 0;
  if (!cp_reduces && !dp_reduces) {
    if (p.dp <= kBuilt && p.cp <= kBuilt)
      return not_reduced(why_not, "dp " + std::to_string(p.dp) + " and cp " + std::to_string(p.cp) + ": nothing to reduce");
    return not_reduced(why_not, "a pipeline stage of one replica (tp x cp = " + std::to_string(p.tp * p.cp) + " GPUs) does not fill whole nodes of " +
                                    std::to_string(per_node) + ": replicas would share node links");
  }
  ReducedStep out;
  out.spec = spec;
  MegatronParams& r = out.spec.megatron;
  if (dp_reduces) {
    r.dp = kBuilt;
    r.dp_represented = p.dp;
  }
  if (cp_reduces) {
    r.cp = kBuilt;
    r.cp_represented = p.cp;
  }
  out.nodes = p.pp * r.dp * r.cp * p.tp / per_node;
  out.workload = in.workload;
  out.workload.global_batch = in.workload.global_batch / p.dp * r.dp;
  out.unit = "data-parallel replicas";
  out.replicas = p.dp;
  out.simulated_replicas = r.dp;
  out.cp_ranks = p.cp;
  out.simulated_cp_ranks = r.cp;
  return out;
}

std::optional<ReducedStep> reduce_zero_family_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  const ZeroParams& z = spec.zero;
  const int per_node = in.cluster.topology.gpus_per_node(), gpus = in.cluster.gpus();
  const int group = z.sp * z.cp;
  // A unit: whole nodes holding whole sequence-parallel groups, so two units share nothing but the fabric.
  const int unit = group % per_node == 0 ? group : per_node % group == 0 ? per_node : 0;
  if (unit == 0) {
    return not_reduced(why_not, "a sequence-parallel group of " + std::to_string(group) + " GPUs neither fills whole nodes of " +
                                    std::to_string(per_node) + " nor divides one: groups would share node links");
  }
  const int units = gpus / unit;
  if (units <= kBuilt) return not_reduced(why_not, std::to_string(units) + " units of " + std::to_string(unit) + " GPUs: nothing to reduce");
  ReducedStep out;
  out.spec = spec;
  out.spec.zero.gpus_represented = gpus;
  out.nodes = kBuilt * unit / per_node;
  out.workload = in.workload;
  out.workload.global_batch = in.workload.global_batch / units * kBuilt;  // a multiple of a unit's groups (check_zero)
  out.unit = "nodes";
  out.replicas = gpus / per_node;
  out.simulated_replicas = out.nodes;
  return out;
}

}  // namespace trainyard::planner
