#pragma once
// What the search, the estimate and HotSPa know of a ring-track plan without building its graph: its lower bounds
// (bounds.cpp), its analytic estimate and task count (analytic.cpp), and where its states sit (layout.cpp). The
// registry entry (ringtrack_scheme.cpp) hands them out; the builder is ringtrack.hpp.
#include <vector>

#include "planner/analytic.hpp"
#include "planner/bounds.hpp"
#include "planner/estimate.hpp"
#include "planner/schemes/ringtrack/ringtrack.hpp"
#include "planner/switching.hpp"

namespace trainyard::planner {

SchemeBounds ringtrack_bounds(const BoundContext& c, const RingTrackParams& p);
// Its visits as the builder emits them, the train's idle turns, the copies' pace and the tail; the fullest GPU's
// memory at the builder's own peaks (the bound's byte counts below).
SchemeEstimate ringtrack_estimate(const BoundContext& ctx, const RingTrackParams& p);
// The graph's tasks, counted from the parameters (the builder reserves this much): about 60 per visit (fewer when
// nothing leaves HBM) and 8 per streamed K/V block.
double ringtrack_tasks(const StepInputs& in, const RingTrackParams& p);
// Each layer on its ring position in every replica; the embedding with layer 0, the LM head after the last layer.
StateLayout ringtrack_layout(const StepInputs& in, const RingTrackParams& p);

// Ring-track's sizes its bound and its estimate use (the builder's own: RingTrackBuilder's kv_chunk_, kept_, ...).
struct RingSizes {
  std::vector<int> positions;  // the ring position of each stage
  std::vector<int> owned;      // layers per ring position
  double most = 0;             // the most layers any position holds
  double chunk_tokens = 0;     // a chunk's tokens
  double chunk_count = 0;      // chunks per sequence
  double sequences = 0;        // per replica
  double kv_token = 0;         // K and V bytes per token (bf16)
  double kept_token = 0;       // activations kept per token besides K/V
  double ckpt_token = 0;       // a recompute checkpoint per token
  double acc_chunk = 0;        // a chunk's fp32 dK/dV accumulators
};
RingSizes ring_sizes(const BoundContext& ctx, const RingTrackParams& p);
// What a token of a layer leaves in host DRAM for the backward by the activation policy: its kept activations
// (acts dram), its recompute checkpoint (acts recompute), or nothing (acts hbm).
double ring_host_acts_token(const RingTrackParams& p, const RingSizes& r);
// Per ring position, the most bytes it keeps for the backward when one of its layers starts its backward (the last
// chunk first): the K/V and kept activations (when they stay in HBM) of every chunk whose backward visit has not
// run yet, and the dK/dV accumulators (K/V in HBM) of every layer between its first and last backward visit. The
// visit order is the builder's own (train_schedule), so this holds for the graph that will be simulated.
std::vector<double> ring_kept_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r);
// Host DRAM of one node at the turn from forward to backward: everything of every layer that lives there, and,
// when K/V live in DRAM, the first backward visit's dK/dV accumulators for the earlier chunks. Whole rings per node
// (a ring spanning nodes: no bound, to stay below the truth).
double ring_dram_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r);
// What one ring keeps in host DRAM at that turn (ring_dram_bytes before the rings per node).
double ring_host_bytes_per_ring(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r);
// The model states ring position `pos` holds in HBM (by where weights and states live).
double ring_state_hbm_bytes(const BoundContext& ctx, const RingTrackParams& p, const RingSizes& r, int pos);

}  // namespace trainyard::planner
