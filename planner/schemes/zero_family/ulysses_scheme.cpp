// DeepSpeed-Ulysses: the sequence split over sp GPUs, all-to-alls to a head split around attention, on ZeRO.
#include "planner/engines/writers.hpp"
#include "planner/schemes/zero_family/family.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

Scheme ulysses_scheme() {
  Scheme s = zero_family_scheme("ulysses", "DeepSpeed-Ulysses sequence parallelism (all-to-all around attention)", {"sp"});
  s.required_flags = {{"sp", "a degree"}};
  s.summary = [](const PlanSpec& spec) {
    const ZeroParams& z = spec.as<ZeroParams>();
    return zero_family_summary(z, ", sp " + std::to_string(z.sp));
  };
  s.enumerate = [](const StepInputs& in, const AddPlan& add) {
    for (int sp : divisors(in.cluster.gpus())) {
      if (sp == 1) continue;
      ZeroParams base;
      base.sp = sp;
      zero_family_variants("ulysses", base, false, add);
    }
  };
  // Its tasks say what they compute where the heads split evenly (planner/transformer.cpp: rank i holds chunk i,
  // and head group i of every chunk around attention), so the executors run it, one rank per GPU.
  s.run = RunFacet{.refusal = zero_family_run_refusal, .unchunked = nullptr};  // --check: the plain data-parallel step
  s.exports = {{"deepspeed", deepspeed_launch}};
  return s;
}

}  // namespace trainyard::planner
