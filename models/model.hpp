#pragma once
// A transformer's shape (models/*.json or --model custom:...) and what follows from it: parameter counts,
// FLOPs per token, and the bytes of model states under a precision policy.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/json_reader.hpp"

namespace trainyard::model {

enum class Activation { swiglu, gelu };
enum class Norm { rmsnorm, layernorm };
std::string_view to_string(Activation a);
std::string_view to_string(Norm n);

struct ParamCounts {
  double embedding = 0;  // vocab * hidden
  double lm_head = 0;    // 0 when tied to the embedding
  double attention_per_layer = 0;
  double mlp_per_layer = 0;
  double norms_per_layer = 0;
  double final_norm = 0;
  double per_layer() const { return attention_per_layer + mlp_per_layer + norms_per_layer; }
  double total(std::int64_t layers) const { return embedding + lm_head + final_norm + per_layer() * static_cast<double>(layers); }
};

struct ModelConfig {
  std::string name;
  std::string description;
  std::string source;  // where the shape comes from
  std::string origin;  // the file (or "--model") it was read from
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t ffn_hidden = 0;
  std::int64_t vocab = 0;
  Activation activation = Activation::swiglu;
  Norm norm = Norm::rmsnorm;
  bool bias = false;
  bool tied_embeddings = false;
  std::string dtype = "bf16";
  // Constants the executors need (from the model's own config, as its "source" says):
  double norm_epsilon = 1e-5;        // the norms' epsilon (Hugging Face config.json: rms_norm_eps / layer_norm_eps)
  std::optional<double> rope_theta;  // the RoPE base (config.json: rope_theta); none: no rotary positions (GPT)
  bool norm_weight_decay = false;    // AdamW decays the norm gains too (Megatron-LM and Llama's recipes do not)

  std::int64_t q_dim() const { return heads * head_dim; }
  std::int64_t kv_dim() const { return kv_heads * head_dim; }
  ParamCounts param_counts() const;
  double params() const { return param_counts().total(layers); }

  // FLOP conventions (docs/flops.md): a multiply-add is 2 FLOPs; backward costs 2x forward.
  // Dense: every weight matrix, LM head included (even when tied), 2 FLOPs per weight per token, forward.
  double dense_flops_per_token_fwd() const;
  // Attention scores and weighted sum (QK^T and PV): 4 * kv_len * q_dim per token per layer, forward, with
  // kv_len averaged over the sequence: (S + 1) / 2 when causal, S otherwise.
  double attention_flops_per_token_fwd(std::int64_t seq_len, bool causal) const;
  // Forward + backward (3x forward), dense plus attention: the model FLOPs that MFU counts.
  double training_flops_per_token(std::int64_t seq_len, bool causal) const;
  // Megatron's per-iteration formula 72*B*s*L*h^2*(1 + s/(6h) + V/(12hL)) (Narayanan et al. 2021, without
  // recomputation, non-causal, MHA with a 4h MLP assumed) divided by B*s, so figures compare with papers.
  double megatron_flops_per_token(std::int64_t seq_len) const;
};

// How a published figure counts training FLOPs, so that a predicted step time can be turned into the number
// that source prints (TFLOP/s per GPU, MFU). Sources differ (docs/validation.md): attention causal-halved
// (Megatron-LM since March 2025, FlashAttention's kernel benchmarks) or not (torchtitan, Narayanan et al. 2021);
// the recomputed forward counted (Narayanan et al. 2021, BLOOM) or not; the input embedding counted as a
// vocab x hidden matrix (torchtitan before May 2024) or not.
// Some frameworks print a formula of their own instead (`formula`): Megatron-DeepSpeed's throughput_calculator
// (megatron/utils.py) before its commit b7b2d5e (2024-08-19), 24 c B s L h^2 (1 + s/6h + V/16Lh) with c = 3, or 4
// with activation checkpointing (a GPT with a 4h MLP), and after it, per GEMM in multiply-adds: L (2 + 2 // g) h^2
// for the projections (g = heads / kv heads, integer division as its code does), 2 L h s for the attention
// scores, L f F h for the MLP (f = 3 with SwiGLU), V h for the logits; 3 forwards, 4 with full recompute.
// Both count attention over the full square and the recomputed forward; the switches above must say so.
enum class FlopFormula { parameters, megatron_deepspeed_2023, megatron_deepspeed_2024 };
struct FlopConvention {
  bool causal_attention_halved = true;
  bool recompute_counted = false;        // with full recomputation: one more forward per step
  bool input_embedding_counted = false;  // 6 FLOPs per embedding weight per token
  FlopFormula formula = FlopFormula::parameters;
};
// A convention from a JSON object (causal_attention_halved, recompute_counted, input_embedding_counted, and an
// optional formula: "parameters", "megatron-deepspeed-2023" or "megatron-deepspeed-2024"); InputError names the field.
FlopConvention parse_flop_convention(const json::Reader& r);
std::string to_string(FlopFormula formula);
// Training FLOPs per token under `convention`: 3x the forward (dense + attention), plus the recomputed forward
// when the run recomputes everything and the convention counts it, plus the embedding term when counted; or the
// framework's own formula.
double convention_flops_per_token(const ModelConfig& model, std::int64_t seq_len, const FlopConvention& convention, bool full_recompute);

ModelConfig parse_model(const json::Json& document, const std::string& origin);

// "custom:layers=24,hidden=2304,heads=24,..." -> a model with the rest defaulted. `defaults_used` receives
// "field=value" for each default that was filled in, so the CLI can print them.
ModelConfig parse_custom_model(std::string_view spec, std::vector<std::string>* defaults_used = nullptr);

struct PrecisionPolicy {
  std::string name;
  std::string description;
  double weight_bytes = 2;  // per parameter, the copy used for compute
  double grad_bytes = 2;
  double master_bytes = 4;     // fp32 master weights (0 when compute weights are already fp32)
  double optimizer_bytes = 8;  // Adam m and v in fp32
  double bytes_per_param() const { return weight_bytes + grad_bytes + master_bytes + optimizer_bytes; }
};
std::vector<PrecisionPolicy> precision_policies();
PrecisionPolicy precision_policy(std::string_view name, const std::string& origin = "--precision");

struct ModelStateBytes {
  double weights = 0, grads = 0, master = 0, optimizer = 0;
  double total() const { return weights + grads + master + optimizer; }
};
ModelStateBytes model_state_bytes(const ModelConfig& model, const PrecisionPolicy& policy);

// Tensor parallelism's even split (the executors' shards): the first of heads, kv_heads, ffn_hidden and vocab,
// as (field, value), that `shards` does not divide; none when every one divides.
std::optional<std::pair<std::string, std::int64_t>> tensor_shard_mismatch(const ModelConfig& model, int shards);

}  // namespace trainyard::model
