#include "planner/symmetry.hpp"

#include <set>

#include "planner/schemes/scheme.hpp"

namespace trainyard::planner {

namespace {
// CP ranks and ZeRO units built: two members of a ring keep every link's load symmetric (a CP rank's K/V
// passes and a ZeRO ring's hops between nodes need a peer).
constexpr int kBuilt = 2;

// No reduction, with `reason` in `why_not` when the caller asked.
std::optional<ReducedStep> not_reduced(std::string* why_not, const std::string& reason) {
  if (why_not != nullptr) *why_not = reason;
  return std::nullopt;
}
}  // namespace

std::optional<ReducedStep> reduce_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  const Scheme& scheme = scheme_named(spec.scheme);
  if (scheme.reduce_by_symmetry != nullptr) return scheme.reduce_by_symmetry(in, spec, why_not);
  if (why_not != nullptr) {
    std::string reduced;
    for (const auto& name : scheme_names()) {
      if (scheme_named(name).reduce_by_symmetry != nullptr) reduced += (reduced.empty() ? "" : ", ") + name;
    }
    *why_not = spec.scheme + " steps are not reduced by symmetry yet (only " + reduced + "'s are)";
  }
  return std::nullopt;
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

std::optional<ReducedStep> reduce_zero_family_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not) {
  const ZeroParams& z = spec.as<ZeroParams>();
  const int per_node = in.cluster.topology.gpus_per_node(), gpus = in.cluster.gpus();
  const int group = z.sp * z.cp;
  // A unit: whole nodes holding whole sequence-parallel groups, so two units share nothing but the fabric.
  const int unit = group % per_node == 0 ? group : per_node % group == 0 ? per_node : 0;
  if (unit == 0) {
    return not_reduced(why_not, "a sequence-parallel group of " + std::to_string(group) + " GPUs neither fills whole nodes of " +
                                    std::to_string(per_node) + " nor divides one: groups would share node links");
  }
  const int units = gpus / unit;
  if (units <= kBuilt) return not_reduced(why_not, std::to_string(units) + " units of " + std::to_string(unit) + " GPUs: nothing to reduce");
  ReducedStep out;
  out.spec = spec;
  out.spec.as<ZeroParams>().gpus_represented = gpus;
  out.nodes = kBuilt * unit / per_node;
  out.workload = in.workload;
  out.workload.global_batch = in.workload.global_batch / units * kBuilt;  // a multiple of a unit's groups (check_zero)
  out.unit = "nodes";
  out.replicas = gpus / per_node;
  out.simulated_replicas = out.nodes;
  return out;
}

}  // namespace trainyard::planner
