#pragma once
// Symmetry reduction: a Megatron step whose data-parallel replicas are identical is simulated with one of them
// (two where a replica is a single node). The replicas run the same tasks at the same times, so every per-GPU
// figure (step time, memory, MFU, tokens per second per GPU) is one replica's; what they share are the
// data-parallel collectives, which the built replica runs as rings of the whole data-parallel degree
// (sim::Collective::ring_ranks): every step of such a ring, every rank sends one slice to its successor in another
// node, so the lone built member sends its slice out through its rail NIC to the fabric and takes its
// predecessor's in the same way (ring_across_nodes), and each GPU's links carry what they carry in the whole ring.
// Exact where the replicas share no link but the fabric (hw::Topology: one non-blocking fabric vertex): each
// pipeline stage of a replica must fill whole nodes. tests/test_symmetry.cpp holds the reduced step to the full
// one. Context-parallel ranks reduce the same way when each one's TP group fills whole nodes: two built, their K/V
// exchanges run as the whole ring's (Megatron's load-balanced split gives every rank the same work). The ZeRO
// family (zero, ulysses, ring-attention, fpdt) reduces by whole units of nodes: every GPU is a data-parallel rank,
// its sequence-parallel group inside a unit, and the ZeRO collectives over every GPU run as the whole cluster's
// ring. Megatron's TP ranks reduce to one when a TP group is exactly a node whose GPUs meet only at one NVSwitch
// and reach the fabric on links of their own: the built rank's TP collectives run as the whole group's ring
// through the switch (sim::Collective::ring_ranks), the other GPUs of each node stand idle and are not part of the
// simulated step (sim::Cluster::devices_per_node). Each scheme's registry entry says whether and how its steps
// reduce (`reduce_by_symmetry`); ring-track's replicas, pipeline stages and TP ranks are not reduced yet, nor are
// Megatron's pipeline stages (they differ in warm-up and cool-down).
#include <optional>
#include <string>

#include "planner/plan.hpp"

namespace trainyard::planner {

struct ReducedStep {
  PlanSpec spec;      // as simulated: dp 1 or 2 (cp 2) where reduced, dp_represented (cp_represented) the step's
  int nodes = 0;      // of the simulated cluster
  Workload workload;  // the simulated replicas' share of the step's sequences
  std::string unit;   // what a replica is: "data-parallel replicas", or "nodes" for the ZeRO family
  int replicas = 0;   // the replicas (units) of the whole step, and how many were built
  int simulated_replicas = 0;
  int cp_ranks = 0;  // the context-parallel ranks of the whole step (0: not a Megatron step), and how many were built
  int simulated_cp_ranks = 0;
  int tp_ranks = 0;  // the tensor-parallel ranks of a group (0: not a Megatron step), and how many were built
  int simulated_tp_ranks = 0;
  int devices_per_node = 0;  // the simulated cluster's sim::Cluster::devices_per_node (0: every GPU of a node)
};

// The reduced step when the plan allows one, else nullopt with `why_not` (when given) saying why.
std::optional<ReducedStep> reduce_by_symmetry(const StepInputs& in, const PlanSpec& spec, std::string* why_not = nullptr);
// What the schemes' reductions (their registry entries' `reduce_by_symmetry`, in planner/schemes/NAME/layout.cpp)
// share: two members of a ring are built where one stands for many (a CP rank's K/V passes and a ZeRO ring's hops
// between nodes need a peer, so every link's load stays symmetric), and the answer "not reduced", with `reason`
// in `why_not` when the caller asked.
inline constexpr int kBuilt = 2;
std::optional<ReducedStep> not_reduced(std::string* why_not, const std::string& reason);

}  // namespace trainyard::planner
