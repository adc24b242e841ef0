#include "backend/parameter_groups.hpp"

#include <algorithm>

#include "backend/model_state.hpp"

namespace trainyard::backend {

std::map<int, std::set<sim::DeviceId>> forward_owners(const sim::TaskGraph& graph) {
  std::map<int, std::set<sim::DeviceId>> owners;
  for (const auto& t : graph.tasks()) {
    if (t.op.code == sim::OpCode::norm1) owners[t.op.layer].insert(t.device);
    if (t.op.code == sim::OpCode::embed) owners[kEmbeddingGroup].insert(t.device);
    if (t.op.code == sim::OpCode::head_logits) owners[kHeadGroup].insert(t.device);
  }
  return owners;
}

std::vector<int> carried_groups(const sim::Op& op) {
  std::vector<int> groups;
  if (!op.carries_gradients()) return groups;
  for (int l = op.kv_first; l <= op.kv_last; ++l) groups.push_back(l);
  if (op.carries_head_gradients()) groups.push_back(kHeadGroup);
  if (op.carries_embedding_gradients()) groups.push_back(kEmbeddingGroup);
  return groups;
}

std::vector<int> reduction_ranks(const sim::TaskGraph& graph, const sim::Task& collective) {
  const auto& members = graph.groups()[std::get<sim::Collective>(collective.params).group];
  std::vector<int> ranks(members.begin(), members.end());
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::vector<std::vector<int>> reduction_groups(const sim::TaskGraph& graph) {
  std::vector<std::vector<int>> groups;
  for (const sim::Task& t : graph.tasks()) {
    if (t.kind() == sim::TaskKind::collective && t.op.carries_gradients()) groups.push_back(reduction_ranks(graph, t));
  }
  return groups;
}

}  // namespace trainyard::backend
