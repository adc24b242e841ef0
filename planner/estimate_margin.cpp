// The estimate's measured margins (planner/analytic.hpp, estimate_margin): how far above the simulator the analytic
// estimate has been seen, per scheme. Source: `build/benchmarks/bench_estimate --stride 7 --rows FILE` (2,168
// configurations, benchmarks/results/estimate.md): the 99th percentile of estimate / simulation - 1 over the fitting
// configurations of each scheme, rounded up to the next percent, at least 1%. Not a physical constant and not
// fitted: a measured error. Each search measures it again on the plans it simulates (search.cpp, margin_here), and
// test_analytic holds it on a corpus of its own. When the estimate changes, measure again and update this table.
#include <map>
#include <string>

#include "common/error.hpp"
#include "planner/analytic.hpp"

namespace trainyard::planner {

EstimateMargin estimate_margin(const std::string& scheme) {
  static const std::map<std::string, EstimateMargin> kMargins = {
      {"fpdt", {0.13, 0.01}},      {"megatron", {0.36, 0.21}}, {"ring-attention", {0.01, 0.01}},
      {"ringtrack", {0.12, 0.25}}, {"ulysses", {0.01, 0.01}},  {"zero", {0.01, 0.01}},
  };
  const auto it = kMargins.find(scheme);
  TRAINYARD_CHECK(it != kMargins.end(), "no measured estimate margin for scheme \"" + scheme + "\"");
  return it->second;
}

}  // namespace trainyard::planner
