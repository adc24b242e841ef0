// ZeRO data parallelism (stages 0-3, offload of optimizer states, gradients, parameters and checkpoints).
#include "planner/engines/writers.hpp"
#include "planner/schemes/zero_family/family.hpp"

namespace trainyard::planner {

Scheme zero_scheme() {
  Scheme s = zero_family_scheme("zero", "ZeRO-1/2/3 (FSDP) with optional CPU offload", {});
  s.summary = [](const PlanSpec& spec) { return zero_family_summary(spec.as<ZeroParams>(), ""); };
  s.enumerate = [](const StepInputs&, const AddPlan& add) { zero_family_variants("zero", ZeroParams{}, false, add); };
  // Its tasks say what they compute (planner/schemes/zero_family/zero.cpp annotates them), so the executors run it, one rank per GPU.
  s.run = RunFacet{.refusal = zero_family_run_refusal, .unchunked = nullptr};  // --check: the plain data-parallel step
  s.exports = {{"deepspeed", deepspeed_launch}, {"torchtitan", torchtitan_zero_launch}};
  return s;
}

}  // namespace trainyard::planner
