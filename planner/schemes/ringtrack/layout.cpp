// Where a ring-track step keeps its states (planner/switching.hpp): each layer on its ring position in every replica.
#include <numeric>

#include "planner/schemes/ringtrack/closed_form.hpp"

namespace trainyard::planner {

StateLayout ringtrack_layout(const StepInputs& in, const RingTrackParams& p) {
  const auto& m = in.model;
  const int L = static_cast<int>(m.layers);
  const int P = p.ring, replicas = in.cluster.gpus() / p.ring;
  const std::vector<int> position = stage_positions(m.layers, p);
  std::vector<std::vector<int>> rings;
  for (int r = 0; r < replicas; ++r) {
    std::vector<int> members(static_cast<std::size_t>(P));
    std::iota(members.begin(), members.end(), r * P);
    if (p.ring_order.empty()) {
      rings.push_back(best_ring_order(in.cluster, members));
    } else {
      std::vector<int> order;
      for (int pos : p.ring_order) order.push_back(r * P + pos);
      rings.push_back(order);
    }
  }
  return whole(m, [&](int unit) {
    // Layers at their stage's position; the embedding with layer 0; the LM head at the stop after the last layer.
    const int pos = position[unit < L ? unit : unit == L ? 0 : L];
    std::vector<sim::DeviceId> h;
    for (const auto& ring : rings) h.push_back(ring[pos]);
    return h;
  });
}

}  // namespace trainyard::planner
