#pragma once
// A software stack (framework) as the prediction needs it (stacks/frameworks/*.json, schema trainyard.stack.v1):
// which attention kernel it runs, how many kernels and HBM passes its elementwise ops take, what the host spends
// issuing each kernel, what memory it holds beyond the tensors the plan allocates, and the FLOP convention its
// own logs use for MFU. The same step graph runs differently under Megatron-LM, DeepSpeed or torchtitan; the
// simulator reads these figures instead of assuming one ideal stack. Plain C++.
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_reader.hpp"
#include "models/model.hpp"

namespace trainyard::stacks {

// The help text of the --stack NAME|PATH option (stacks/frameworks/), default megatron-lm.
inline constexpr const char* kStackFlagHelp =
    "software stack the step runs under: megatron-lm (default), megatron-lm-unfused, megatron-lm-gpt3-2022, deepspeed, "
    "torchtitan, torchtitan-compile, trainyard, or a stack file (docs/stacks.md)";

using json::Figure;

// How an attention call runs. The fused kernels (FlashAttention-2/-3, cuDNN) take their figures from the GPU
// profile (hw::AttentionKernel); `unfused` materialises the scores: two batched GEMMs over the full square and
// softmax passes through HBM; `calibrated` uses the GPU profile's per-FLOP tables (trainyard's own kernels, as
// `trainyard calibrate` measures them).
enum class AttentionImpl { flash2, flash3, cudnn, unfused, calibrated };
std::string_view to_string(AttentionImpl impl);
std::optional<AttentionImpl> attention_impl_named(std::string_view name);  // nullopt: not one of the above

// An elementwise op as the stack runs it: kernels launched and HBM traffic as a multiple of one fused pass
// (read the inputs once, write the output once), which is what trainyard's graph charges.
struct ElementwiseCost {
  Figure kernels;
  Figure hbm_passes;
};

enum class ElementwiseClass { norm, rope, activation, residual, loss, other };

struct StackProfile {
  std::string name;
  std::string description;
  std::string origin;
  struct Attention {
    std::vector<AttentionImpl> preference;  // the first the GPU profile describes is used; then `calibrated`
    Figure softmax_passes_forward;          // unfused: HBM passes over the bf16 scores (write, softmax, dropout)
    Figure softmax_passes_backward;
    Figure stored_bytes_per_score;  // unfused: bytes kept per score for backward (softmax output, dropout mask)
  } attention;
  ElementwiseCost norm, rope, activation, residual;
  // The softmax cross-entropy over the LM head's logits, forward and backward, whose fused pass reads fp32
  // logits and writes bf16 gradients (6 bytes per logit). Optional in a stack file: absent means one pass.
  ElementwiseCost loss{json::Figure{1, "", {}, ""}, json::Figure{1, "", {}, ""}};
  // How the loss holds its logits: the whole micro-batch's at once (Megatron-LM, Megatron-DeepSpeed: the LM head's
  // bf16 output and its fp32 copy, `bytes_per_logit`), or, when absent, in trainyard's chunks of 8K tokens.
  struct LossLogits {
    bool whole_micro_batch = false;
    Figure bytes_per_logit{4, "", {}, ""};
  } loss_logits;
  // Sharded data parallelism (ZeRO-3 / FSDP): HBM passes over a layer's gathered bf16 parameters on the compute
  // stream once its all-gather lands (FSDP2 copies the flat buffer out into the parameters; ZeRO-3 and Megatron
  // use views: 0).
  Figure gathered_params_copy_passes;
  // The sharded data-parallel gradient reduction (ZeRO family): bytes per gradient element it moves (0: the
  // precision policy's gradient bytes), and the HBM passes that copy a layer's gradients into the reduction's
  // input buffer, in that dtype, on the compute stream first (FSDP2's copy-in with its cast to reduce_dtype).
  // Optional in a stack file: absent means 0.
  Figure gradient_reduce_bytes;
  Figure reduced_grads_copy_passes;
  // Activation checkpoints offloaded to host DRAM (`--offload acts`): `blocking` copies hold up the compute stream
  // (the next layer waits for the copy out; the copy back waits for the backward to reach the layer), `pinned`
  // ones run at the pinned PCIe rate, pageable ones at about half. Optional in a stack file: absent means
  // asynchronous copies from pinned buffers.
  struct CheckpointOffload {
    bool blocking = false;
    bool pinned = true;
    json::Source source;
  } checkpoint_offload;
  // Whether the ZeRO family's gradient reductions run beside the backward (on their own stream) or hold up the
  // compute stream until each is done, per ZeRO stage 0-3 (DeepSpeed's overlap_comm: on by default for stage 3
  // only). Optional in a stack file: absent means every stage overlaps.
  struct ZeroOverlap {
    std::array<bool, 4> by_stage{true, true, true, true};
    json::Source source;
    bool overlaps(int stage) const { return by_stage.at(static_cast<std::size_t>(stage)); }
  } zero_overlap_comm;
  // FPDT as the stack's code runs it: the tensors of a GPU's whole share of the sequence (tokens x hidden, bf16) a
  // layer holds at once, at the peak of its forward and of its recompute-and-backward, beside the chunked
  // attention and FFN buffers. Optional in a stack file: absent (0) means only chunks are held.
  struct FpdtFullLength {
    Figure forward_tensors{0, "", {}, ""};
    Figure backward_tensors{0, "", {}, ""};
  } fpdt_full_length;
  // Rotary position tables built at the whole sequence's length on every GPU: bytes per token of the sequence and
  // head_dim element, held through the step (the bf16 cos and sin) and during the forward only (their fp32
  // originals). Optional in a stack file: absent (0) means tables of a GPU's tokens, counted with the activations.
  struct RotaryTables {
    Figure step_bytes_per_token_dim{0, "", {}, ""};
    Figure forward_bytes_per_token_dim{0, "", {}, ""};
  } rotary_tables;
  struct Host {
    Figure dispatch_us_per_kernel;       // host time to issue one kernel (framework, dispatcher, driver launch)
    bool sync_before_optimizer = false;  // the host waits for the GPU before the optimizer (e.g. grad-norm .item())
  } host;
  struct Memory {
    Figure cuda_context_bytes;   // context and loaded kernels, per GPU
    Figure workspace_bytes;      // library workspaces (cuBLAS, cuBLASLt, cuDNN)
    Figure communication_bytes;  // communication library buffers and the framework's gradient buckets
    Figure allocator_overhead;   // reserved / allocated - 1 of the caching allocator at its peak
    double fixed_bytes() const { return cuda_context_bytes.value + workspace_bytes.value + communication_bytes.value; }
  } memory;
  model::FlopConvention mfu_convention;  // how the framework's own log counts FLOPs for its MFU / TFLOP/s
  json::Source mfu_convention_source;

  const ElementwiseCost* elementwise(ElementwiseClass c) const;
  // HBM the allocator can hand out on a GPU of `hbm_bytes`, and what it reserves for `allocated_bytes`.
  double allocatable_bytes(double hbm_bytes) const;
  double reserved_bytes(double allocated_bytes) const;
};

StackProfile parse_stack(const json::Json& document, const std::string& origin);
// A built-in (stacks/frameworks/NAME.json) or a file by path; `origin` names the flag or field that asked.
StackProfile load_stack(std::string_view name_or_path, const std::string& origin);
std::vector<std::string> stack_names();
// megatron-lm: Megatron-LM with Transformer Engine's fused attention, what trainyard modelled before stacks.
inline constexpr std::string_view kDefaultStack = "megatron-lm";
const StackProfile& default_stack();

}  // namespace trainyard::stacks
