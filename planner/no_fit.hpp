#pragma once
// Why the plan search found nothing that fits, per scheme: no valid configuration for these inputs at all, or
// configurations that all miss, with the closest miss and the memory it is short of. A miss's text and its
// shortfall always name the same memory.
#include <optional>
#include <string>
#include <vector>

#include "planner/search.hpp"

namespace trainyard::planner {

// A candidate its memory lower bounds rule out, as a miss. Its shortfall is the larger of the two (HBM per GPU
// over the usable HBM, DRAM per node over the node's DRAM); its text names that memory first, and the other one
// when it is short too.
RankedPlan bound_miss(const PlanSpec& spec, const Bounds& bounds, double hbm_usable_bytes, double dram_capacity_bytes);

// Keeps `miss` as the closest miss overall and of its scheme when it misses by less. A miss that is not short of
// memory (a step that did not finish) counts only where no memory miss is known.
void note_miss(SearchReport& report, RankedPlan miss);

// "megatron (tp=8 ...): peak HBM 81 GB exceeds the 76 GB left after the HBM headroom; short by 5 GB of HBM per GPU"
std::string describe_miss(const RankedPlan& miss);

// When `scheme` has no valid configuration at `in`'s global batch but has one at a larger one (its data-parallel
// ranks each take whole sequences, so a step of fewer sequences than ranks has none): the smallest such batch, up to
// the next multiple of the cluster's GPUs. 0 when `in`'s batch has valid configurations or no larger one helps.
std::int64_t global_batch_needed(const StepInputs& in, const std::string& scheme);

struct SchemeNoFit {
  std::string scheme;
  std::size_t configurations = 0;       // valid configurations for these inputs
  std::size_t not_runnable = 0;         // valid ones left out by SearchOptions::runnable (--executable, --engine)
  std::string runnable_keeps;           // what it keeps (SearchOptions::runnable_keeps)
  std::int64_t valid_global_batch = 0;  // without valid configurations: the smallest batch that has some (0: none)
  std::optional<RankedPlan> closest;    // the one that missed by the least, when any was bounded or simulated
  bool interrupted = false;             // the search stopped early: not every configuration was tried
  std::string reason() const;           // one sentence, starting with the scheme
};
// The schemes of `schemes` without a fitting plan in `report` (a search on `in`), in that order.
std::vector<SchemeNoFit> schemes_without_fit(const SearchReport& report, const std::vector<std::string>& schemes, const StepInputs& in);

}  // namespace trainyard::planner
