#include "planner/symmetry.hpp"

namespace trainyard::planner {

namespace {
constexpr int kBuiltReplicas = 2;  // a ring needs two members; the second also keeps every link's load symmetric
}  // namespace

std::optional<ReducedStep> reduce_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  auto no = [&](const std::string& reason) -> std::optional<ReducedStep> {
    if (why_not != nullptr) *why_not = reason;
    return std::nullopt;
  };
  if (spec.scheme != "megatron") return no("only Megatron's data-parallel replicas are reduced so far");
  const MegatronParams& p = spec.megatron;
  if (p.dp <= kBuiltReplicas) return no("dp " + std::to_string(p.dp) + ": nothing to reduce");
  const int per_node = in.cluster.topology.gpus_per_node();
  if ((p.tp * p.cp) % per_node != 0) {
    return no("a pipeline stage of one replica (tp x cp = " + std::to_string(p.tp * p.cp) + " GPUs) does not fill whole nodes of " +
              std::to_string(per_node) + ": replicas would share node links");
  }
  ReducedStep out;
  out.spec = spec;
  out.spec.megatron.dp = kBuiltReplicas;
  out.spec.megatron.dp_represented = p.dp;
  out.nodes = in.cluster.nodes / p.dp * kBuiltReplicas;
  out.workload = in.workload;
  out.workload.global_batch = in.workload.global_batch / p.dp * kBuiltReplicas;
  out.replicas = p.dp;
  return out;
}

}  // namespace trainyard::planner
