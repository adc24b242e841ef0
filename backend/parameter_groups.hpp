#pragma once
// A graph's parameter groups (a layer index, kEmbeddingGroup, kHeadGroup: model_state.hpp) and the GPUs and ranks
// that hold and reduce them, as both executors on several ranks read them (reference_step.hpp, executor.hpp;
// GPU g is rank g).
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "models/model.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::backend {

// Which GPUs hold each parameter group: those running its forward.
std::map<int, std::set<sim::DeviceId>> forward_owners(const sim::TaskGraph& graph);
// Which GPUs use each parameter group (groups_used over the graph's tasks): its forward's GPUs and, with tied
// embeddings, the LM head's GPUs for the embedding too.
std::map<int, std::set<sim::DeviceId>> group_users(const sim::TaskGraph& graph, const model::ModelConfig& model);
// The groups whose gradients a reduction carries (sim::Op::gradients); none for any other op.
std::vector<int> carried_groups(const sim::Op& op);
// The ranks of a collective's members, ascending.
std::vector<int> reduction_ranks(const sim::TaskGraph& graph, const sim::Task& collective);
std::string group_name(int group);  // "layer 3's parameters", "the embedding's parameters", "the LM head's parameters"
// The groups a compute task reads or adds to (with tied embeddings the LM head's tasks use the embedding's too).
std::vector<int> groups_used(const sim::Task& task, const model::ModelConfig& model);
// A group used on several GPUs that the graph's gradient reductions carrying it do not join (together they must
// connect every GPU that uses it; under tensor parallelism, every GPU of one shard index): on several ranks each would
// update its copy with its own share of the gradient.
// Empty when there is none.
std::optional<int> unreduced_shared_group(const sim::TaskGraph& graph, const model::ModelConfig& model);
// Every gradient reduction's ranks, in task order (the same on every rank: what the communicator prepares).
std::vector<std::vector<int>> reduction_groups(const sim::TaskGraph& graph);

}  // namespace trainyard::backend
