// The estimate's measured margins (planner/analytic.hpp, estimate_margin): how far above the simulator the analytic
// estimate has been seen, per scheme. Source: `build/benchmarks/bench_estimate --stride 7` (2,168 configurations,
// benchmarks/results/estimate.md; its "most over" columns): the largest estimate / simulation - 1 over the fitting
// configurations of each scheme (DRAM: those that keep something there), rounded up to the next percent, at least
// 1%. The largest, not a percentile: a plan whose estimate errs beyond the margin can be pruned wrongly, and on the
// main job the wider margins cost no extra simulation (83 either way). Not a physical constant and not fitted: a
// measured error. Each search measures it again on the plans it simulates (search.cpp, margin_here), and
// test_analytic holds it on a corpus of its own. When the estimate changes, measure again and update this table.
#include <map>
#include <string>

#include "common/error.hpp"
#include "planner/analytic.hpp"

namespace trainyard::planner {

EstimateMargin estimate_margin(const std::string& scheme) {
  // Ring-track's DRAM: 3.1% on the corpus above; the unit test's corpus of small models reaches 5.3% (two chunks,
  // K/V in DRAM), so its margin covers both measured corpora.
  static const std::map<std::string, EstimateMargin> kMargins = {
      // scheme            step  HBM   DRAM
      {"fpdt", {0.08, 0.01, 0.01}},      {"megatron", {0.09, 0.48, 0.01}}, {"ring-attention", {0.05, 0.01, 0.01}},
      {"ringtrack", {0.22, 0.42, 0.06}}, {"ulysses", {0.01, 0.01, 0.01}},  {"zero", {0.01, 0.01, 0.01}},
  };
  const auto it = kMargins.find(scheme);
  TRAINYARD_CHECK(it != kMargins.end(), "no measured estimate margin for scheme \"" + scheme + "\"");
  return it->second;
}

}  // namespace trainyard::planner
