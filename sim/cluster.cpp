#include "sim/cluster.hpp"

#include <string>

#include "common/error.hpp"

namespace trainyard::sim {

Cluster::Cluster(hw::NodeProfile node_profile, int node_count, stacks::StackProfile stack_profile, int devices_per_node_)
    : node(std::move(node_profile)),
      nodes(node_count),
      topology(node, node_count),
      stack(std::move(stack_profile)),
      devices_per_node(devices_per_node_ > 0 ? devices_per_node_ : topology.gpus_per_node()) {
  TRAINYARD_CHECK(devices_per_node <= topology.gpus_per_node(), "devices_per_node " + std::to_string(devices_per_node) + " exceeds the node's " +
                                                                    std::to_string(topology.gpus_per_node()) + " GPUs");
}

}  // namespace trainyard::sim
