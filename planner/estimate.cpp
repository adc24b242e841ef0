#include "planner/estimate.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

double loss_tasks(double tokens) { return kLossTasks * std::ceil(std::max(1.0, tokens) / kLossTokens); }

GraphEstimate estimate_tasks(double tasks) { return {tasks, tasks * kBytesPerTask}; }

double built_graph_bytes(const sim::TaskGraph& graph) {
  return static_cast<double>(graph.memory_bytes()) + kEngineBytesPerTask * static_cast<double>(graph.size());
}

GraphEstimate estimate_plan(const StepInputs& in, const PlanSpec& spec) { return scheme_named(spec.scheme).estimate(in, spec); }

double cluster_bytes(const hw::NodeProfile& node, int nodes) {
  constexpr double kBytesPerElement = 192;
  return static_cast<double>(nodes) * static_cast<double>(node.vertices.size() + node.links.size()) * kBytesPerElement;
}

void require_cluster_within_budget(const hw::NodeProfile& node, int nodes, std::int64_t budget_bytes) {
  const double gpus = static_cast<double>(node.gpu_count()) * nodes;
  const GraphEstimate step = estimate_tasks(gpus * (kForwardTasks + kBackwardTasks + 2));
  require_within_budget({step.tasks, step.bytes + cluster_bytes(node, nodes)}, budget_bytes,
                        "a cluster of " + std::to_string(nodes) + " nodes and the smallest step graph on its " + format_count(gpus) + " GPUs",
                        "fewer --nodes");
}

void require_within_budget(const GraphEstimate& e, std::int64_t budget_bytes, const std::string& what, const std::string& advice,
                           const std::string& unit) {
  if (e.bytes <= static_cast<double>(budget_bytes)) return;
  throw InputError("--memory-budget", "size",
                   what + " within " + format_bytes(static_cast<double>(budget_bytes)) + " (" + advice + ", or raise --memory-budget)",
                   "an estimated " + format_count(e.tasks) + " " + unit + ", " + format_bytes(e.bytes));
}

}  // namespace trainyard::planner
