#pragma once
// What the backend tests (the CPU reference, the dataflow table) build their steps from: a tiny model the CPU
// references run in milliseconds, one H100, and ring-track chunked and offloaded so buffers are reused.
#include <functional>
#include <string>

#include "hwprofiles/catalog.hpp"
#include "models/model.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"

namespace trainyard::test {

// With GQA (4 query heads on 2 K/V heads); the head and embedding untied unless asked; 2 layers unless asked.
inline model::ModelConfig tiny_model(bool tied = false, int layers = 2) {
  return model::parse_custom_model(
      "custom:layers=" + std::to_string(layers) +
      ",hidden=32,heads=4,kv_heads=2,head_dim=8,ffn_hidden=48,vocab=61,tied_embeddings=" + std::string(tied ? "true" : "false"));
}

inline const sim::Cluster& one_gpu() {
  static const sim::Cluster cluster(hw::load_node("lab-h100"), 1);
  return cluster;
}

// Chunks of 16 tokens, K/V and activations in host DRAM, K/V streamed in blocks of 2 chunks through 2 buffers
// (so the buffers are reused within one chunk's attention).
inline planner::RingTrackParams chunked_offloaded(planner::ActivationPolicy acts = planner::ActivationPolicy::dram) {
  planner::RingTrackParams p;
  p.chunk = 16;
  p.kv = planner::Placement::dram;
  p.acts = acts;
  p.prefetch = 2;
  p.kv_block_tokens = 32;
  return p;
}

// A ring-track step of `batch` sequences of `seq` tokens, finalized: what the executors run.
inline sim::TaskGraph ringtrack_graph(const sim::Cluster& cluster, const model::ModelConfig& m, std::int64_t seq, int batch,
                                      const planner::RingTrackParams& p) {
  const planner::StepInputs in{m, cluster, {seq, batch}, model::precision_policy("bf16-mixed")};
  auto g = planner::build_ringtrack(in, p).graph;
  g.finalize();
  return g;
}

// `graph` rebuilt (not finalized) with each task passed through `edit` and only the dependencies `keep` accepts:
// the same task ids, groups and labels, for tests that break one thing in a built plan.
inline sim::TaskGraph rebuilt(const sim::TaskGraph& graph, const std::function<void(sim::TaskId, sim::Task&)>& edit,
                              const std::function<bool(sim::TaskId, sim::TaskId)>& keep) {
  sim::TaskGraph out;
  out.set_chunk_tokens(graph.chunk_tokens());
  out.set_sequence_tokens(graph.sequence_tokens());
  for (const auto& members : graph.groups()) out.add_group(members);
  for (const auto& label : graph.labels()) out.add_label(label);
  for (sim::TaskId id = 0; id < static_cast<sim::TaskId>(graph.size()); ++id) {
    sim::Task t = graph.task(id);
    edit(id, t);
    out.add(graph.name(id), t);
  }
  for (const auto& [before, after] : graph.edges()) {
    if (keep(before, after)) out.add_dependency(before, after);
  }
  return out;
}

}  // namespace trainyard::test
