#pragma once
// A graph's parameter groups (a layer index, kEmbeddingGroup, kHeadGroup: model_state.hpp) and the GPUs and ranks
// that hold and reduce them, as both executors on several ranks read them (reference_step.hpp, executor.hpp;
// GPU g is rank g).
#include <map>
#include <set>
#include <vector>

#include "sim/task_graph.hpp"

namespace trainyard::backend {

// Which GPUs hold each parameter group: those running its forward.
std::map<int, std::set<sim::DeviceId>> forward_owners(const sim::TaskGraph& graph);
// The groups whose gradients a reduction carries (sim::Op::gradients); none for any other op.
std::vector<int> carried_groups(const sim::Op& op);
// The ranks of a collective's members, ascending.
std::vector<int> reduction_ranks(const sim::TaskGraph& graph, const sim::Task& collective);
// Every gradient reduction's ranks, in task order (the same on every rank: what the communicator prepares).
std::vector<std::vector<int>> reduction_groups(const sim::TaskGraph& graph);

}  // namespace trainyard::backend
