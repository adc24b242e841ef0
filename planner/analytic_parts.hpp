#pragma once
// What the schemes' analytic estimates share (planner/analytic.hpp; each scheme's own part is in
// planner/schemes/NAME/analytic.cpp): the rates bytes move at, the attention, the ends of the model and the
// optimizer step of one GPU, timed as the simulator's cost model times the builders' tasks.
#include <cstdint>
#include <optional>

#include "planner/bounds.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

// The loss's logits buffer one GPU holds at once: `tokens` of its share in `memory`'s chunks (emit_loss).
double logits_bytes(const LossMemory& memory, double tokens, double vocab_shard);

// Per-GPU rates the estimate moves bytes at, GB/s per direction: within a node (NVLink at the rate NCCL reaches,
// else PCIe), across nodes (the node's NICs shared by its GPUs, never above the in-node rate), and to and from
// host DRAM (the GPU's pinned-copy rate, shared by the GPUs behind one PCIe switch).
struct Rates {
  double intra = 0, inter = 0, pcie = 0, nic = 0;
};
Rates rates_of(const sim::Cluster& cluster);
// A group of `size` consecutive GPUs (every `stride`-th) is within one node unless it is longer than a node. Across
// nodes, a GPU's own transfers (all-to-all, ring passes) cross at its NIC's rate; a ring collective (all-gather,
// reduce-scatter, all-reduce) enters each node once and runs one channel per NIC, so its members on a node share
// their NICs (nccl-tests' multi-node busbw: about the node's NIC total, up to NVLink's rate).
double group_GBps(const BoundContext& ctx, const Rates& r, int size, int stride = 1, bool ring_collective = false);
double seconds(double bytes, double GBps);

// The optimizer step over `params` on GPU 0, timed as the simulator times the builders' OptimizerStep task.
double optimizer_seconds(const StepInputs& in, double params);

// One layer's attention time on one GPU, per micro-batch: forward (or a recomputed forward) and backward.
struct LayerAttention {
  double forward = 0, backward = 0;
};
LayerAttention layer_attention(const BoundContext& ctx, double layers, double micro_batches);

// Context parallelism's K/V ring beside the attention blocks it feeds: each of the cp - 1 passes of a layer's
// forward moves a rank's K and V, backward also their fp32 gradients; what the attention does not cover waits.
double ring_exposed_s(const BoundContext& ctx, const Rates& r, int cp, int stride, double kv_elements, double layers, double micro_batches,
                      bool recompute);

// The embedding's forward and backward, and the LM head with the loss, for one micro-batch of `tokens` on GPU 0
// over a vocabulary shard: their tasks as the builders emit them (emit_embedding, emit_loss), timed by the cost
// model. Not at the best GEMM rate, as the search's bound takes them: for a 1B model with a 128K vocabulary the
// head is a fifth of the FLOPs.
double embedding_seconds(const StepInputs& in, std::int64_t tokens);
double head_seconds(const StepInputs& in, std::int64_t tokens, std::int64_t vocab_shard, const LossMemory& memory);
double ends_seconds(const StepInputs& in, std::int64_t tokens, std::int64_t vocab_shard, const LossMemory& memory);

// One layer on GPU 0, one micro-batch (forward, the recomputed forward when `recompute`, backward): its attention's
// time, and the host's time to issue all its kernels.
struct LayerExtras {
  double attention_s = 0, issue_s = 0;
};
// A layer's attention is emitted only up to this many blocks a side (FPDT's chunks, CP's ranks: the blocks grow
// as their square); beyond, the estimate takes every attention FLOP at the profile's best rate, as the bound does,
// so that no length makes it slow or large.
inline constexpr int kMostEmittedBlocks = 64;
// nullopt: too many blocks to emit (kMostEmittedBlocks).
std::optional<LayerExtras> layer_extras(const StepInputs& in, const LayerSplit& split, bool recompute);

}  // namespace trainyard::planner
