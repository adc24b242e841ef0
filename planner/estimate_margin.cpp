// The estimate's measured margins (planner/analytic.hpp, estimate_margin): how far above the simulator the analytic
// estimate has been seen, per scheme. Source: `build/benchmarks/bench_estimate --stride 7 --rows FILE`, the largest
// estimate / simulation - 1 over the fitting configurations of its corpus (benchmarks/results/estimate.md), rounded
// up to the next percent. Not a physical constant and not fitted: a measured error, which test_analytic holds on a
// corpus of its own. When the estimate changes, measure again and update this table with the recorded result.
#include <map>
#include <string>

#include "common/error.hpp"
#include "planner/analytic.hpp"

namespace trainyard::planner {

EstimateMargin estimate_margin(const std::string& scheme) {
  static const std::map<std::string, EstimateMargin> kMargins = {
      {"fpdt", {0.14, 0.01}},      {"megatron", {0.77, 0.48}}, {"ring-attention", {0.05, 0.01}},
      {"ringtrack", {0.03, 0.01}}, {"ulysses", {0.01, 0.01}},  {"zero", {0.01, 0.01}},
  };
  const auto it = kMargins.find(scheme);
  TRAINYARD_CHECK(it != kMargins.end(), "no measured estimate margin for scheme \"" + scheme + "\"");
  return it->second;
}

}  // namespace trainyard::planner
