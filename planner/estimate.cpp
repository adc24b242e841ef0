#include "planner/estimate.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "common/units.hpp"
#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

namespace {

// Tasks one rank emits for one layer (transformer.cpp): 6 elementwise ops and 4 GEMMs forward, 6 and 8 backward,
// the attention, and about 4 buffers and collectives around them.
constexpr double kForwardTasks = 10, kBackwardTasks = 14, kLayerExtra = 4;
// emit_loss: 6 tasks per 8K tokens.
constexpr double kLossTokens = 8192, kLossTasks = 6;

double loss_tasks(double tokens) { return kLossTasks * std::ceil(std::max(1.0, tokens) / kLossTokens); }

// Attention tasks per rank and layer, forward and backward: plain, ring attention over cp ranks (a pass and a block
// per step), or FPDT over u chunks (a copy and a block per chunk pair; backward also streams dq back).
std::pair<double, double> attention_tasks(const ZeroParams& z, double seq) {
  if (z.cp > 1) return {2.0 * z.cp + 1, 2.0 * z.cp + 1};
  if (z.fpdt_chunk > 0) {
    const double u = std::max(1.0, seq / static_cast<double>(z.fpdt_chunk));
    if (u > 1) return {u * u + u + 1, 1.5 * u * u + 2.5 * u + 1};
  }
  return {1, 1};
}

// Tasks per rank for one attention under context parallelism (transformer.cpp's LayerEmitter): p2p, a block and
// a ring pass per step of the whole ring and a merge; all_gather, the gather, the block and (backward) the
// reduce-scatter; a2a, the two all-to-alls around the block; a2a_p2p, those around a ring over the cp / a2a groups.
double cp_attention_tasks(CpComm comm, double whole_cp, int cp_a2a) {
  if (whole_cp <= 1) return 1;
  switch (comm) {
    case CpComm::p2p: return 2 * whole_cp + 1;
    case CpComm::all_gather:
    case CpComm::a2a: return 3;
    case CpComm::a2a_p2p: return 2 * whole_cp / std::max(1, cp_a2a) + 3;
  }
  return 2 * whole_cp + 1;
}

}  // namespace

double zero_tasks(const StepInputs& in, const ZeroParams& z) {
  const double gpus = in.cluster.gpus(), layers = static_cast<double>(in.model.layers);
  const double seq = static_cast<double>(in.workload.seq_len), batch = static_cast<double>(in.workload.global_batch);
  const double group = std::max(1.0, static_cast<double>(z.sp) * z.cp);
  const double groups = std::max(1.0, gpus / group);
  const double micro_batches = std::max(1.0, batch / (groups * static_cast<double>(std::max<std::int64_t>(1, z.micro_batch))));
  const auto [attn_f, attn_b] = attention_tasks(z, seq);
  const double recomputed = static_cast<double>(z.checkpointed_layers(in.model.layers)) / layers;  // share of layers
  const double per_layer = kForwardTasks + attn_f + kBackwardTasks + attn_b + recomputed * (kForwardTasks + attn_f) + kLayerExtra;
  const double local_tokens = static_cast<double>(std::max<std::int64_t>(1, z.micro_batch)) * seq / group;
  return gpus * micro_batches * (layers * per_layer + loss_tasks(local_tokens) + 2) + gpus * (2 * layers + 4);
}

double megatron_tasks(const StepInputs& in, const MegatronParams& p) {
  const double layers = static_cast<double>(in.model.layers);
  const double seq = static_cast<double>(in.workload.seq_len), batch = static_cast<double>(in.workload.global_batch);
  const double tp = std::max(1, p.built_tp()), pp = std::max(1, p.pp), dp = std::max(1, p.dp);  // built ranks
  const double micro = static_cast<double>(std::max<std::int64_t>(1, p.micro_batch));
  const double micro_batches = std::max(1.0, batch / (dp * micro));
  const bool recompute = p.recompute == Recompute::full;
  const double attention_again = p.recompute == Recompute::selective ? 1 : 0;  // the core attention, recomputed
  const double cp = std::max(1, p.cp), whole_cp = std::max(1, p.whole_cp());   // built ranks; the whole degree
  const double attention = cp_attention_tasks(p.cp_comm, whole_cp, p.cp_a2a);
  const double per_layer = kForwardTasks + kBackwardTasks + 2 * attention + (recompute ? kForwardTasks + attention : attention_again * attention) +
                           kLayerExtra;
  // Every rank: its layers and the pipeline messages of each slot; the last stage's ranks: the loss.
  const double ranks = tp * pp * dp * cp;
  return ranks * micro_batches * (layers / pp * per_layer + 4) + tp * dp * cp * micro_batches * loss_tasks(micro * seq / whole_cp) +
         ranks * (2 * layers / pp + 4);
}

// ring-track's own count (planner/ringtrack.cpp reserves this much): about 60 tasks per visit (fewer when nothing
// leaves HBM) and 8 per streamed K/V block.
double ringtrack_tasks(const StepInputs& in, const RingTrackParams& p) {
  const double gpus = in.cluster.gpus(), layers = static_cast<double>(in.model.layers);
  const double ring = std::max(1, p.ring), replicas = std::max(1.0, gpus / ring);
  const double sequences = std::max(1.0, static_cast<double>(in.workload.global_batch) / replicas);
  const double chunk = static_cast<double>(std::max<std::int64_t>(1, p.chunk));
  const double chunks = std::max(1.0, static_cast<double>(in.workload.seq_len) / chunk);
  const double span = std::max(1.0, std::floor(static_cast<double>(p.kv_block_tokens) / chunk));
  const double kv_blocks = p.kv == Placement::dram ? chunks * chunks / (2 * span) : 0;
  // Everything in HBM: no copies or host buffers around a visit (measured ~30 tasks; 50 keeps the factor of 2).
  const double per_visit = p.kv == Placement::hbm && p.acts == ActivationPolicy::hbm ? 50 : 60;
  return replicas * sequences * (layers + 1) * (per_visit * chunks + 8 * kv_blocks);
}

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
