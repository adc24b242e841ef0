#pragma once
// Ring-track temporal parallelism (design.md 3.1): P GPUs form a ring and layer l lives on ring position
// (l / b) mod P; the sequence is cut into C chunks of c tokens that travel round the ring one after another like
// the cars of a train. Forward F(l, k) needs F(l-1, k) (its input, from the previous GPU) and F(l, k-1) (the K/V
// of earlier chunks at layer l, on the same GPU). K/V, the activations kept for backward and optionally the
// weights and optimizer state live in the node's host DRAM: written out as they are produced, streamed back
// through `prefetch` HBM buffers just before they are needed. Backward runs the train in reverse (chunk C-1
// first, last layer first) with the query chunk as the outer loop, so the fp32 dK/dV accumulators of earlier
// chunks are read, updated and written back for every (chunk, earlier chunk) pair.
//
// The LM head and loss are the ring's stop after the last layer (position L / b mod P), so every chunk makes
// L hops forward and L back. The rest of the cluster runs data-parallel copies of the ring (replica r holds
// GPUs r*P .. r*P+P-1) and all-reduces each layer's gradients once its backward is complete.
// Streams: compute 0; comm 0 for the chunk activations and their gradients; comm 2 for the data-parallel
// all-reduces; the copy engines for everything that goes through host DRAM.
#include <cstdint>
#include <string>
#include <vector>

#include "planner/schemes/ringtrack/ring_order.hpp"
#include "planner/step.hpp"
#include "sim/task_graph.hpp"

namespace trainyard::planner {

// K/V of earlier chunks stream from host DRAM in blocks of at least this many tokens (several chunks when chunks
// are small), so each copy is long against its latency and the task count stays moderate; the blocks' HBM
// buffers do not depend on the sequence length.
inline constexpr std::int64_t kKvBlockTokens = 65536;

enum class Placement { hbm, dram };
enum class ActivationPolicy { hbm, dram, recompute };
enum class WeightPolicy { resident, stream };

struct RingTrackParams {
  int ring = 1;                    // P: GPUs in one ring
  int block = 1;                   // b: consecutive layers per ring position
  std::int64_t chunk = 16384;      // c: tokens per chunk
  int prefetch = 2;                // d: HBM buffers in flight for each stream of blocks from host DRAM
  Placement kv = Placement::dram;  // K/V of earlier chunks, and the fp32 dK/dV accumulators in backward
  // hbm: everything a layer keeps for backward stays in HBM; dram: it goes to host DRAM and comes back;
  // recompute: only the layer input, the attention output and its log-sum-exp go to DRAM, the rest of the
  // layer is recomputed from them in backward (attention itself is not recomputed).
  ActivationPolicy acts = ActivationPolicy::dram;
  // resident: the ring position's layers stay in HBM; stream: they live in host DRAM and are copied in for every
  // visit (each chunk at each layer), with their gradients copied out and accumulated on the host.
  WeightPolicy weights = WeightPolicy::resident;
  // Gradients, fp32 master weights and Adam moments: hbm (optimizer step on the GPU) or dram (optimizer step on
  // the host CPU, updated bf16 weights copied back).
  Placement states = Placement::hbm;
  std::vector<int> ring_order;  // positions 0..P-1 in ring order (same pattern in every replica); empty: from the topology
  // Tokens per streamed K/V block: not a plan-file parameter (plans use kKvBlockTokens); tests lower it to stream
  // several blocks through the prefetch buffers at small sizes.
  std::int64_t kv_block_tokens = kKvBlockTokens;
};

struct RingTrackPlan {
  sim::TaskGraph graph;
  std::vector<std::vector<int>> rings;  // per replica: GPUs in ring order
  std::vector<RingHop> hops;            // replica 0's hops
  std::string describe() const;         // "gpu0 -> gpu2 -> gpu1 -> gpu3 -> gpu0 (slowest hop 150.0 GB/s)"
};

// The ring position of each stage: layer l at (l / block) mod ring, stage L (the LM head and loss) the ring's next
// stop after the last layer. L + 1 entries.
std::vector<int> stage_positions(std::int64_t layers, const RingTrackParams& p);
// How many layers (stages 0..L-1) each ring position holds.
std::vector<int> layers_per_position(const std::vector<int>& stage_positions, int ring);

// A (stage, chunk) visit; stage L is the LM head and loss.
struct Visit {
  int stage = 0;
  int chunk = 0;
};
// Where each stage runs (its ring position) and the order in which the GPUs run their visits, forward and
// backward: the builder emits the visits in this order, and each GPU's compute stream is in order.
struct TrainSchedule {
  std::vector<int> stage_position;  // L + 1 entries
  std::vector<Visit> forward, backward;
};
TrainSchedule train_schedule(const model::ModelConfig& model, const RingTrackParams& p, std::int64_t seq_len);

void check_ringtrack(const StepInputs& in, const RingTrackParams& p);
RingTrackPlan build_ringtrack(const StepInputs& in, const RingTrackParams& p);

}  // namespace trainyard::planner
