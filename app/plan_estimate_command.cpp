// `trainyard plan --estimate-only`: the plan search answered by the analytic estimate alone (planner/analytic.hpp),
// nothing simulated. Every figure it prints is labelled an estimate, and every JSON object carries
// "provisional": true; it writes no plan file or trace (those hold the simulator's figures only).
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "common/interrupt.hpp"
#include "common/text_table.hpp"
#include "common/units.hpp"
#include "planner/analytic.hpp"

using Json = nlohmann::json;

namespace trainyard::app {

namespace {

constexpr const char* kEstimateLabel =
    "ESTIMATE: the analytic estimate alone (planner/analytic.hpp), nothing simulated; without --estimate-only the simulator "
    "confirms and ranks";

Json estimate_json(const planner::EstimatedPlan& p, double tokens) {
  const planner::StepEstimate& e = p.estimate;
  return {{"scheme", p.spec.scheme},
          {"summary", p.spec.summary()},
          {"parameters", planner::parameters_json(p.spec)},
          {"provisional", true},
          {"step_s", e.step_s},
          {"tokens_per_s", tokens / e.step_s},
          {"mfu", e.mfu},
          {"peak_hbm_bytes", e.hbm_bytes},
          {"peak_dram_bytes", e.dram_bytes}};
}

std::vector<std::string> estimate_cells(const planner::EstimatedPlan& p, double tokens) {
  const planner::StepEstimate& e = p.estimate;
  return {"~" + format_seconds(e.step_s), "~" + format_fixed(tokens / e.step_s, 0), "~" + format_fixed(100 * e.mfu, 1) + "%",
          "~" + format_bytes(e.hbm_bytes), "~" + format_bytes(e.dram_bytes)};
}

// The first `shown` plans as a table, every figure marked an estimate.
void print_estimated_table(std::ostream& out, const std::vector<planner::EstimatedPlan>& ranked, std::size_t shown, double tokens) {
  TextTable table({"rank", "scheme", "plan", "step (est.)", "tokens/s (est.)", "MFU (est.)", "peak HBM/GPU (est.)", "peak DRAM/node (est.)"},
                  {true, false, false, true, true, true, true, true});
  for (std::size_t i = 0; i < std::min(shown, ranked.size()); ++i) {
    std::vector<std::string> row{std::to_string(i + 1), ranked[i].spec.scheme, ranked[i].spec.summary()};
    for (auto& cell : estimate_cells(ranked[i], tokens)) row.push_back(std::move(cell));
    table.add_row(std::move(row));
  }
  table.print(out);
}

int ranked_by_estimate(const planner::StepInputs& in, const planner::SearchOptions& search, bool as_json) {
  const std::vector<planner::EstimatedPlan> ranked = planner::rank_by_estimate(in, search);
  const auto tokens = static_cast<double>(in.workload.tokens());
  const std::size_t shown = std::min(ranked.size(), static_cast<std::size_t>(search.top));
  if (as_json) {
    Json plans = Json::array();
    for (std::size_t i = 0; i < shown; ++i) plans.push_back(estimate_json(ranked[i], tokens));
    std::cout << Json{{"estimate_only", true}, {"provisional", true}, {"fits", !ranked.empty()}, {"ranked", plans}}.dump(2) << "\n";
    return ranked.empty() ? 1 : 0;
  }
  if (ranked.empty()) {
    std::cerr << "error: no plan fits by the estimate (ESTIMATE: without --estimate-only the simulator decides)\n";
    return 1;
  }
  std::cout << kEstimateLabel << "\n\n";
  print_estimated_table(std::cout, ranked, shown, tokens);
  return 0;
}

int max_seq_by_estimate(const planner::StepInputs& in, const planner::SearchOptions& search, bool as_json) {
  Json out = Json::array();
  TextTable table({"scheme", "max length (est.)", "plan", "step there (est.)", "peak HBM/GPU (est.)"}, {false, true, false, true, true});
  for (const auto& scheme : search.schemes) {
    if (interrupted()) break;
    const auto best = planner::max_sequence_by_estimate(in, scheme, search);
    if (!best) {
      table.add_row({scheme, "< 1K", "no plan fits (estimate)", "", ""});
      out.push_back({{"scheme", scheme}, {"max_seq_len", nullptr}, {"provisional", true}});
      continue;
    }
    table.add_row({scheme, "~" + format_tokens(best->seq_len), best->plan.spec.summary(), "~" + format_fixed(best->plan.estimate.step_s, 3) + " s",
                   "~" + format_bytes(best->plan.estimate.hbm_bytes)});
    Json j = estimate_json(best->plan, static_cast<double>(best->seq_len * in.workload.global_batch));
    j["max_seq_len"] = best->seq_len;
    out.push_back(j);
  }
  if (as_json) {
    std::cout
        << Json{{"objective", "max-seq"}, {"estimate_only", true}, {"provisional", true}, {"interrupted", interrupted()}, {"schemes", out}}.dump(2)
        << "\n";
  } else {
    std::cout << kEstimateLabel << "\n\n";
    table.print(std::cout);
  }
  return interrupted() ? kInterruptedExitCode : 0;
}

}  // namespace

void print_provisional(std::ostream& out, const std::vector<planner::EstimatedPlan>& plans, double tokens_per_step) {
  if (plans.empty()) return;
  out << "ESTIMATE while the simulator confirms (provisional: the analytic estimate alone; the simulated table follows)\n";
  print_estimated_table(out, plans, plans.size(), tokens_per_step);
  out << "\n";
}

int run_plan_estimate_only(const planner::StepInputs& in, const planner::SearchOptions& search, bool as_json) {
  return search.objective == planner::Objective::max_seq ? max_seq_by_estimate(in, search, as_json) : ranked_by_estimate(in, search, as_json);
}

}  // namespace trainyard::app
