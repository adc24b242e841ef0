#pragma once
// What building and simulating a plan would hold, counted from the plan's parameters before anything is built:
// the tasks of its step graph (the builders' loops, counted per rank, layer, micro-batch, chunk and K/V block)
// and the bytes the graph and the simulation engine keep for them. Within a factor of 2 of the real task count
// for the built plans the tests try (tests/test_limits.cpp holds it); never a reason to build anything.
//
// Commands compare these estimates with a memory budget (common/memory_budget.hpp) and refuse, before building,
// what would not fit.
#include <cstdint>
#include <string>

#include "hwprofiles/node.hpp"
#include "planner/plan.hpp"

namespace trainyard::planner {

struct GraphEstimate {
  double tasks = 0;
  double bytes = 0;  // graph + engine state while it is simulated
};

// Bytes per task of a built graph and its simulation (the task, its name, edges, successor lists, the engine's
// timing and event state), measured on built plans with some headroom: the whole process's peak RSS over the tasks
// was 237 B for Megatron (Llama 3 405B, 890K tasks), 236 B for Megatron with CP (1.9M) and 290 B for FPDT (229K,
// the process's ~10 MB base included) before task names moved to an arena (2026-11-27); since then 198 B for the
// 1T Megatron step (3.2M tasks, whole process) and 234-273 B for every scheme's largest configuration in
// tests/test_limits.cpp (heap in use). Kept at 400: lowering it lets larger graphs into the same budget, which
// changes what the searches simulate; benchmarks/results/sim.md says what each byte is.
inline constexpr double kBytesPerTask = 400;

// What the engine keeps per task while it simulates (timings, blocking counters, events, flows): 47.2 B measured on
// ring-track's 1M-token steps (benchmarks/results/sim.md, bench_ringtrack), 56 B before; taken as 96 for the schemes
// whose collectives start more flows per task. Once a graph is built, the search holds its written bytes plus this
// for each task instead of the estimate (built_graph_bytes).
inline constexpr double kEngineBytesPerTask = 96;
double built_graph_bytes(const sim::TaskGraph& graph);

GraphEstimate estimate_plan(const StepInputs& in, const PlanSpec& spec);
// What the schemes' own task counts (their registry entries' `estimate`, in planner/schemes/NAME/analytic.cpp) share:
// tasks one rank emits for one layer (transformer.cpp): 6 elementwise ops and 4 GEMMs forward, 6 and 8 backward, the
// attention, and about 4 buffers and collectives around them; emit_loss: 6 tasks per 8K tokens.
inline constexpr double kForwardTasks = 10, kBackwardTasks = 14, kLayerExtra = 4;
inline constexpr double kLossTokens = 8192, kLossTasks = 6;
double loss_tasks(double tokens);
GraphEstimate estimate_tasks(double tasks);  // bytes for a task count

// Bytes a cluster of `nodes` such nodes holds before anything is built (hw::Topology keeps every node's vertices
// and links: about 130 bytes each, measured on 100000 dgx-h100 nodes; taken as 192).
double cluster_bytes(const hw::NodeProfile& node, int nodes);
// The cluster and the smallest step graph any scheme builds on it (every GPU runs at least one layer forward and
// backward): refused before the cluster is built when even that exceeds the budget (too many --nodes).
void require_cluster_within_budget(const hw::NodeProfile& node, int nodes, std::int64_t budget_bytes);

// InputError naming `flag` when `e` needs more than `budget_bytes`: says the estimate and what to change
// (`advice`, e.g. "fewer nodes, a smaller --global-batch or a larger --chunk").
// `unit` names what GraphEstimate::tasks counts.
void require_within_budget(const GraphEstimate& e, std::int64_t budget_bytes, const std::string& what, const std::string& advice,
                           const std::string& unit = "tasks");

}  // namespace trainyard::planner
