// Ring attention (context parallelism on ZeRO): K/V blocks passed round cp GPUs, zigzag-balanced where it splits.
#include "planner/engines/writers.hpp"
#include "planner/schemes/zero_family/family.hpp"
#include "planner/search.hpp"

namespace trainyard::planner {

Scheme ring_attention_scheme() {
  Scheme s = zero_family_scheme("ring-attention", "ring attention / context parallelism, zigzag causal balancing", {"cp", "zigzag"});
  s.required_flags = {{"cp", "a degree"}};
  s.summary = [](const PlanSpec& spec) {
    const ZeroParams& z = spec.as<ZeroParams>();
    return zero_family_summary(z, ", cp " + std::to_string(z.cp) + (z.zigzag ? " zigzag" : ""));
  };
  s.enumerate = [](const StepInputs& in, const AddPlan& add) {
    for (int cp : divisors(in.cluster.gpus())) {
      if (cp == 1) continue;
      ZeroParams base;
      base.cp = cp;
      // Zigzag balances the causal work at the same traffic; the plain ring only where zigzag cannot split.
      base.zigzag = in.workload.seq_len % (2 * cp) == 0;
      zero_family_variants("ring-attention", base, false, add);
    }
  };
  // Its tasks say what they compute (one chunk per cp rank, two with zigzag: planner/transformer.cpp's ring), so the
  // executors run it, one rank per GPU.
  s.run = RunFacet{.refusal = zero_family_run_refusal, .unchunked = nullptr};  // --check: the plain data-parallel step
  s.exports = {{"torchtitan", torchtitan_zero_launch}};
  return s;
}

}  // namespace trainyard::planner
