#pragma once
// What the search, the estimate, HotSPa and the symmetry reduction know of a ZeRO-family plan (zero, ulysses,
// ring-attention, fpdt) without building its graph: its lower bounds (bounds.cpp), its analytic estimate and task
// count (analytic.cpp), where its states sit and how its step reduces by symmetry (layout.cpp). The family's
// registry entries (*_scheme.cpp over family.hpp) hand them out; the builder is zero.hpp.
#include <optional>
#include <string>

#include "planner/analytic.hpp"
#include "planner/bounds.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/zero_family/zero.hpp"
#include "planner/switching.hpp"
#include "planner/symmetry.hpp"

namespace trainyard::planner {

SchemeBounds zero_bounds(const BoundContext& c, const ZeroParams& z);
SchemeEstimate zero_estimate(const BoundContext& ctx, const ZeroParams& z);
double zero_tasks(const StepInputs& in, const ZeroParams& z);
// A full copy on every GPU, or 1/N each from stage 3 for parameters and stage 2 for gradients; gradients: where the
// reduced gradients sit.
StateLayout zero_layout(const StepInputs& in, const ZeroParams& z, bool gradients);
// Whole units of nodes, each holding whole sequence-parallel groups, simulated two at a time (planner/symmetry.hpp).
std::optional<ReducedStep> reduce_zero_family_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not);

}  // namespace trainyard::planner
