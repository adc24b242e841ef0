#pragma once
// The cluster a step runs on: identical nodes, their topology and the software stack. Its own header so that what
// only needs the cluster (the planner's inputs, the schemes' checks) does not read the engine's.
#include "hwprofiles/node.hpp"
#include "hwprofiles/topology.hpp"
#include "sim/task_graph.hpp"
#include "stacks/stack_profile.hpp"

namespace trainyard::sim {

// N identical nodes, the topology that joins them and the software stack they run (its kernels, host costs and
// reserved memory are part of every prediction). A graph's GPUs are the nodes' GPUs in order; under symmetry
// reduction (planner/symmetry.hpp) a graph may use only the first `devices_per_node` GPUs of each node, the
// others standing idle for identical ones it does not build.
struct Cluster {
  Cluster(hw::NodeProfile node_profile, int node_count, stacks::StackProfile stack_profile = stacks::default_stack(), int devices_per_node = 0);
  hw::NodeProfile node;
  int nodes;
  hw::Topology topology;
  stacks::StackProfile stack;
  int devices_per_node;  // the graph's GPUs per node: topology.gpus_per_node() unless reduced
  int gpus() const { return nodes * devices_per_node; }
  int node_of(DeviceId gpu) const { return gpu / devices_per_node; }
  int slot_of(DeviceId gpu) const { return gpu % devices_per_node; }  // the GPU's index within its node
};

}  // namespace trainyard::sim
