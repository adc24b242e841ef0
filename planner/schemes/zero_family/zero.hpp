#pragma once
// Data parallelism with ZeRO (stages 0-3; stage 3 = FSDP) and optional host offload, optionally with
// DeepSpeed-Ulysses sequence parallelism ("ulysses": sp > 1) or ring attention / context parallelism
// ("ring-attention": cp > 1, zigzag optional), activation checkpointing (AC: full recompute) and checkpoint
// offload to host (OC), as DeepSpeed runs them:
// - ZeRO groups are all GPUs. Stage >= 1 shards the optimizer states, >= 2 the gradients (reduce-scattered
//   every micro-batch, layer by layer, during backward), 3 the parameters (all-gathered layer by layer before
//   forward and again before backward, one layer ahead). Stages 0-1 all-reduce the gradients in the last
//   micro-batch's backward; stages 1-2 all-gather the updated parameters after the optimizer step.
// - Offload: optimizer (the AdamW step runs on the host over the GPU's shard, and the updated bf16 shard is
//   copied back), grads (the reduced gradient shard is copied to host), params (stage 3: the bf16 shard lives in
//   host DRAM and is copied in before each all-gather), acts (OC: layer-input checkpoints go to host DRAM after
//   forward and come back before backward; implies AC).
// - Ulysses: sp ranks share each sequence; all-to-alls around attention (planner/transformer.hpp).
// - Ring attention: cp ranks share each sequence; K/V blocks travel round the ring (planner/transformer.hpp).
// - FPDT ("fpdt": fpdt_chunk > 0, on top of Ulysses with any sp): attention runs chunk by chunk with the K/V
//   of earlier chunks (and q, o, lse, dO, dq in backward) in host DRAM, double-buffered (planner/transformer.hpp);
//   a layer's HBM working set is a few chunks' worth.
// Streams: compute 0; comm 0 for Ulysses all-to-alls, comm 1 for parameter all-gathers and ring passes, comm 2
// for gradient reductions; the copy engines for offload.
#include <cstdint>
#include <string>

#include "planner/step.hpp"
#include "planner/transformer.hpp"

namespace trainyard::planner {

struct ZeroParams {
  int stage = 0;
  int sp = 1;                             // Ulysses degree
  int cp = 1;                             // ring attention (context parallel) degree
  bool zigzag = false;                    // ring attention's causal load balancing
  std::int64_t fpdt_chunk = 0;            // FPDT: attention chunk in global tokens (0: off); K/V etc. streamed via host
  std::int64_t micro_batch = 1;           // sequences per micro-batch per sequence-parallel group
  bool activation_checkpointing = false;  // AC
  int checkpoint_every = 1;               // with AC: checkpoint every n-th layer (torchtitan's selective layer AC: 2), the rest keep all
  // Whether layer `l` is checkpointed (with OC, every layer is: the offloaded checkpoint is all it keeps).
  bool checkpoints_layer(std::int64_t l) const { return offload_activations || (activation_checkpointing && (l + 1) % checkpoint_every == 0); }
  // Layers of `layers` that are checkpointed and so recomputed in backward.
  std::int64_t checkpointed_layers(std::int64_t layers) const {
    return offload_activations ? layers : activation_checkpointing ? layers / checkpoint_every : 0;
  }
  bool offload_optimizer = false;
  bool offload_grads = false;
  bool offload_params = false;
  bool offload_activations = false;  // OC
  // Symmetry reduction (planner/symmetry.hpp): the whole step's GPUs when the cluster holds only some of them (0:
  // the cluster's). States are sharded over all of them, and the ZeRO collectives run as their whole ring.
  int gpus_represented = 0;
  int whole_gpus(int built) const { return gpus_represented > 0 ? gpus_represented : built; }
};

void check_zero(const StepInputs& in, const ZeroParams& p);
// The slice of each layer one GPU runs for one micro-batch under these parameters.
LayerSplit zero_layer_split(const StepInputs& in, const ZeroParams& p);
std::int64_t zero_micro_batches(const StepInputs& in, const ZeroParams& p);
// One GPU's model states, in bytes: the weights (layers sharded by stage 3, the embedding and LM head whole),
// `host_weights` the part of them offloaded with the parameters; gradients (sharded by stage 2); master weights
// and Adam moments (sharded by stage 1). Where gradients and optimizer states live is the offload flags' business.
struct ZeroStateBytes {
  double weights = 0, host_weights = 0, grads = 0, optimizer = 0;
};
ZeroStateBytes zero_state_bytes(const StepInputs& in, const ZeroParams& p);
// What one GPU allocates per layer (bytes), as the builder allocates it and the analytic estimate counts it:
// `forward` the activations a layer holds while its forward runs (FPDT: its working chunks, or the stack's
// whole-share tensors when more), `recomputed` those of a checkpointed layer while its backward runs, `checkpoint`
// the layer input a checkpointed layer keeps, `fpdt_host` FPDT's host buffers of one layer (q, k, v, o, lse).
struct ZeroLayerBytes {
  double forward = 0, recomputed = 0, checkpoint = 0, fpdt_host = 0;
};
ZeroLayerBytes zero_layer_bytes(const StepInputs& in, const ZeroParams& p);
// The loss's logits as the family holds them: the stack's way, or FPDT's sequence chunks (DeepSpeed's
// FPDT_LogitsLoss).
LossMemory zero_loss_memory(const StepInputs& in, const ZeroParams& p);
sim::TaskGraph build_zero(const StepInputs& in, const ZeroParams& p);

}  // namespace trainyard::planner
