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

std::string group_name(int group) {
  if (group == kEmbeddingGroup) return "the embedding's parameters";
  if (group == kHeadGroup) return "the LM head's parameters";
  return "layer " + std::to_string(group) + "'s parameters";
}

std::vector<int> groups_used(const sim::Task& t, const model::ModelConfig& m) {
  using sim::OpCode;
  const OpCode code = t.op.code;
  if (code == OpCode::embed || code == OpCode::embed_bwd) return {kEmbeddingGroup};
  if (t.op.is_lm_head() && t.kind() != sim::TaskKind::collective) {  // the vocab-parallel collectives sum, they use no weights
    if (m.tied_embeddings) return {kHeadGroup, kEmbeddingGroup};
    return {kHeadGroup};
  }
  if (code >= OpCode::norm1 && code <= OpCode::norm1_bwd && t.op.layer >= 0 && t.op.layer < m.layers) return {t.op.layer};
  return {};
}

std::map<int, std::set<sim::DeviceId>> group_users(const sim::TaskGraph& graph, const model::ModelConfig& model) {
  std::map<int, std::set<sim::DeviceId>> users;
  for (const sim::Task& t : graph.tasks()) {
    for (int group : groups_used(t, model)) users[group].insert(t.device);
  }
  return users;
}

std::optional<int> unreduced_shared_group(const sim::TaskGraph& graph, const model::ModelConfig& m) {
  const std::map<int, std::set<sim::DeviceId>> holders = group_users(graph, m);
  std::map<int, std::map<sim::DeviceId, sim::DeviceId>> joined;  // per group: each GPU's representative (union-find)
  auto root = [](std::map<sim::DeviceId, sim::DeviceId>& parent, sim::DeviceId d) {
    while (parent.count(d) && parent[d] != d) d = parent[d];
    return d;
  };
  for (const sim::Task& t : graph.tasks()) {
    if (t.kind() != sim::TaskKind::collective) continue;
    const auto& members = graph.groups()[std::get<sim::Collective>(t.params).group];
    for (int group : carried_groups(t.op)) {
      auto& parent = joined[group];
      for (sim::DeviceId d : members) parent[root(parent, d)] = root(parent, members.front());
    }
  }
  // Under tensor parallelism the GPUs of one shard index share the shard (a norm, replicated, is computed alike on
  // every TP rank from the same values, so each TP rank's gradient of it is the whole one already).
  const int shards = std::max(1, graph.tensor_shards());
  for (const auto& [group, devices] : holders) {
    auto& parent = joined[group];
    std::map<int, sim::DeviceId> first_of_shard;
    for (sim::DeviceId d : devices) {
      const sim::DeviceId first = first_of_shard.try_emplace(d % shards, d).first->second;
      if (root(parent, d) != root(parent, first)) return group;  // two holders no reduction joins
    }
  }
  return std::nullopt;
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
