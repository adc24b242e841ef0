#pragma once
// What the search, the estimate, HotSPa and the symmetry reduction know of a Megatron plan without building its
// graph: its lower bounds (bounds.cpp), its analytic estimate and task count (analytic.cpp), where its states sit
// and how its step reduces by symmetry (layout.cpp). The registry entry (megatron_scheme.cpp) hands them out; the
// builder is megatron.hpp.
#include <optional>
#include <string>

#include "planner/analytic.hpp"
#include "planner/bounds.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/megatron/megatron.hpp"
#include "planner/switching.hpp"
#include "planner/symmetry.hpp"

namespace trainyard::planner {

SchemeBounds megatron_bounds(const BoundContext& c, const MegatronParams& p);
SchemeEstimate megatron_estimate(const BoundContext& ctx, const MegatronParams& p);
double megatron_tasks(const StepInputs& in, const MegatronParams& p);
// TP shards of each layer on the pipeline stage that runs it, every data-parallel replica a copy.
StateLayout megatron_layout(const StepInputs& in, const MegatronParams& p);
// Identical data-parallel replicas (and CP and TP ranks where they fill whole nodes) simulated once (planner/symmetry.hpp).
std::optional<ReducedStep> reduce_megatron_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not);

}  // namespace trainyard::planner
