// Where a Megatron step keeps its states (planner/switching.hpp) and its reduction by symmetry
// (planner/symmetry.hpp).
#include <algorithm>
#include <set>

#include "planner/schemes/megatron/closed_form.hpp"

namespace trainyard::planner {

StateLayout megatron_layout(const StepInputs& in, const MegatronParams& p) {
  const auto& m = in.model;
  const int L = static_cast<int>(m.layers);
  // The stage of a layer: that of the virtual stage holding it (chunk v / pp on stage v % pp).
  const std::vector<std::int64_t> first_layer = megatron_chunk_first_layers(m.layers, p);
  auto stage_of_layer = [&](int layer) {
    const auto v = std::upper_bound(first_layer.begin(), first_layer.end(), layer) - first_layer.begin() - 1;
    return static_cast<int>(v % p.pp);
  };
  // (cp index, TP index t) of replica d: the same weights on every cp index.
  auto gpu_of = [&](int stage, int d, int c, int t) { return ((stage * p.dp + d) * p.cp + c) * p.tp + t; };
  auto stages_of = [&](int unit) {
    if (unit < L) return std::vector<int>{stage_of_layer(unit)};
    if (unit == L && m.tied_embeddings && p.pp > 1) return std::vector<int>{0, p.pp - 1};  // Megatron keeps both copies
    return std::vector<int>{unit == L ? 0 : p.pp - 1};
  };
  StateLayout layout;
  for (int u = 0; u < unit_count(m); ++u) {
    std::vector<Shard> shards;
    for (int t = 0; t < p.tp; ++t) {
      Shard s{double(t) / p.tp, double(t + 1) / p.tp, {}};
      for (int stage : stages_of(u)) {
        for (int d = 0; d < p.dp; ++d) {
          for (int c = 0; c < p.cp; ++c) s.holders.push_back(gpu_of(stage, d, c, t));
        }
      }
      std::sort(s.holders.begin(), s.holders.end());
      shards.push_back(std::move(s));
    }
    layout.units.push_back(std::move(shards));
  }
  return layout;
}

namespace {
// Whether one GPU can stand for each GPU of its node: the node's GPUs meet only at one NVSwitch (a ring of one
// member then loads its links as the whole ring loads each member's: sim's loopback) and each reaches the
// fabric on links of its own (its rail NIC's), so the built GPU's traffic meets no idle GPU's. Else a reason.
std::string node_gpus_not_independent(const hw::Topology& topo) {
  const int n = topo.gpus_per_node();
  std::set<int> fabric_links;
  std::optional<hw::VertexId> shared_switch;
  for (int i = 0; i < n; ++i) {
    const hw::Route next = topo.route(topo.gpu(0, i), topo.gpu(0, (i + 1) % n));
    const hw::VertexId middle = next.vertices.size() == 3 ? next.vertices[1] : next.vertices.front();
    if (next.vertices.size() != 3 || topo.vertex_info(middle).type != hw::VertexType::nvswitch || (shared_switch && *shared_switch != middle)) {
      return "the node's GPUs do not meet at one NVSwitch (" + topo.describe(next) + ")";
    }
    shared_switch = middle;
    if (!topo.fabric() || topo.node_count() == 1) continue;
    const auto nic = topo.rail_nic(topo.gpu(0, i));
    if (!nic) return topo.name(topo.gpu(0, i)) + " has no rail NIC";
    for (const hw::Route& leg : {topo.route(topo.gpu(0, i), *nic), topo.route(*nic, *topo.fabric())}) {
      for (int link : leg.links) {
        if (!fabric_links.insert(link).second) return "GPUs of a node share links to the fabric (" + topo.describe(leg) + ")";
      }
    }
  }
  return {};
}
}  // namespace

std::optional<ReducedStep> reduce_megatron_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  const MegatronParams& p = spec.as<MegatronParams>();
  const int per_node = in.cluster.topology.gpus_per_node();
  // Context-parallel ranks: identical under Megatron's load-balanced split when each one's TP group fills
  // whole nodes (the cp ranks then meet only at the fabric).
  const bool cp_reduces = p.cp > kBuilt && p.tp % per_node == 0 && p.cp_comm != CpComm::a2a &&
                          p.cp_comm != CpComm::a2a_p2p;  // all-to-alls: every pair of a group exchanges
  const int cp_built = cp_reduces ? kBuilt : p.cp;
  // Data-parallel replicas: when each pipeline stage of a replica fills whole nodes. One replica is built when it
  // spans nodes: its lone member of each gradient ring sends each slice out through its rail NIC to the fabric
  // and back in (sim::Collective::ring_across_nodes), as each replica's does in the whole ring. A replica of one
  // node is built twice (one node has no fabric to loop through).
  const bool whole_nodes = (p.tp * cp_built) % per_node == 0;
  const int dp_built = whole_nodes && p.pp * p.tp * cp_built / per_node >= 2 ? 1 : kBuilt;
  const bool dp_reduces = whole_nodes && p.dp > dp_built;
  // TP ranks: one built of a group that is exactly a node, when nothing else shares the node's links (no
  // checkpoints offloaded over PCIe to host DRAM).
  std::string tp_why_not = p.tp != per_node        ? "tp " + std::to_string(p.tp) + " is not a node of " + std::to_string(per_node) + " GPUs"
                           : p.offload_activations ? "checkpoints are offloaded to host DRAM"
                                                   : node_gpus_not_independent(in.cluster.topology);
  const bool tp_reduces = p.tp > 1 && tp_why_not.empty();
  if (!cp_reduces && !dp_reduces && !tp_reduces) {
    if (p.dp <= dp_built && p.cp <= kBuilt)
      return not_reduced(why_not, "dp " + std::to_string(p.dp) + " and cp " + std::to_string(p.cp) +
                                      ": nothing to reduce, and TP ranks are not: " + (p.tp == 1 ? "tp 1" : tp_why_not));
    return not_reduced(why_not, "a pipeline stage of one replica (tp x cp = " + std::to_string(p.tp * p.cp) + " GPUs) does not fill whole nodes of " +
                                    std::to_string(per_node) + ": replicas would share node links");
  }
  ReducedStep out;
  out.spec = spec;
  MegatronParams& r = out.spec.as<MegatronParams>();
  if (dp_reduces) {
    r.dp = dp_built;
    r.dp_represented = p.dp;
  }
  if (cp_reduces) {
    r.cp = kBuilt;
    r.cp_represented = p.cp;
  }
  if (tp_reduces) {
    r.tp_built = 1;
    out.devices_per_node = 1;
  }
  out.nodes = p.pp * r.dp * r.cp * p.tp / per_node;
  out.workload = in.workload;
  out.workload.global_batch = in.workload.global_batch / p.dp * r.dp;
  out.unit = "data-parallel replicas";
  out.replicas = p.dp;
  out.simulated_replicas = r.dp;
  out.cp_ranks = p.cp;
  out.simulated_cp_ranks = r.cp;
  out.tp_ranks = p.tp;
  out.simulated_tp_ranks = r.built_tp();
  return out;
}

}  // namespace trainyard::planner
