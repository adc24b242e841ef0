// Where a ZeRO-family step keeps its states (planner/switching.hpp) and its reduction by symmetry
// (planner/symmetry.hpp).
#include <numeric>

#include "planner/schemes/zero_family/closed_form.hpp"

namespace trainyard::planner {

StateLayout zero_layout(const StepInputs& in, const ZeroParams& z, bool gradients) {
  const int gpus = in.cluster.gpus();
  if ((!gradients && z.stage >= 3) || (gradients && z.stage >= 2)) return sharded(in.model, gpus);
  return whole(in.model, [&](int) {
    std::vector<sim::DeviceId> all(static_cast<std::size_t>(gpus));
    std::iota(all.begin(), all.end(), 0);
    return all;
  });
}

std::optional<ReducedStep> reduce_zero_family_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  const ZeroParams& z = spec.as<ZeroParams>();
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
  out.spec.as<ZeroParams>().gpus_represented = gpus;
  out.nodes = kBuilt * unit / per_node;
  out.workload = in.workload;
  out.workload.global_batch = in.workload.global_batch / units * kBuilt;  // a multiple of a unit's groups (check_zero)
  out.unit = "nodes";
  out.replicas = gpus / per_node;
  out.simulated_replicas = out.nodes;
  return out;
}

}  // namespace trainyard::planner
