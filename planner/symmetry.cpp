#include "planner/symmetry.hpp"

#include <set>

#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

std::optional<ReducedStep> not_reduced(std::string* why_not, const std::string& reason) {
  if (why_not != nullptr) *why_not = reason;
  return std::nullopt;
}

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

}  // namespace trainyard::planner
