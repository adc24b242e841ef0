#include "models/model.hpp"

#include <charconv>
#include <cmath>

#include "common/error.hpp"
#include "common/units.hpp"

namespace trainyard::model {

std::string_view to_string(Activation a) { return a == Activation::swiglu ? "swiglu" : "gelu"; }
std::string_view to_string(Norm n) { return n == Norm::rmsnorm ? "rmsnorm" : "layernorm"; }

ParamCounts ModelConfig::param_counts() const {
  const double h = static_cast<double>(hidden);
  const double q = static_cast<double>(q_dim());
  const double kv = static_cast<double>(kv_dim());
  const double f = static_cast<double>(ffn_hidden);
  const double v = static_cast<double>(vocab);
  ParamCounts p;
  p.embedding = v * h;
  p.lm_head = tied_embeddings ? 0 : v * h;
  p.attention_per_layer = h * q + 2 * h * kv + q * h + (bias ? q + 2 * kv + h : 0);
  const double mlp_matrices = activation == Activation::swiglu ? 3 : 2;
  const double mlp_bias = activation == Activation::swiglu ? 2 * f + h : f + h;
  p.mlp_per_layer = mlp_matrices * h * f + (bias ? mlp_bias : 0);
  const double norm_params = norm == Norm::rmsnorm ? h : 2 * h;  // scale (+ shift for LayerNorm)
  p.norms_per_layer = 2 * norm_params;
  p.final_norm = norm_params;
  return p;
}

double ModelConfig::dense_flops_per_token_fwd() const {
  const double h = static_cast<double>(hidden);
  const double matrices_per_layer = h * static_cast<double>(q_dim()) * 2 + 2 * h * static_cast<double>(kv_dim()) +
                                    (activation == Activation::swiglu ? 3 : 2) * h * static_cast<double>(ffn_hidden);
  return 2 * (matrices_per_layer * static_cast<double>(layers) + static_cast<double>(vocab) * h);
}

double ModelConfig::attention_flops_per_token_fwd(std::int64_t seq_len, bool causal) const {
  const double s = static_cast<double>(seq_len);
  const double kv_len = causal ? (s + 1) / 2 : s;
  return 4 * kv_len * static_cast<double>(q_dim()) * static_cast<double>(layers);
}

double ModelConfig::training_flops_per_token(std::int64_t seq_len, bool causal) const {
  return 3 * (dense_flops_per_token_fwd() + attention_flops_per_token_fwd(seq_len, causal));
}

namespace {

// Megatron-DeepSpeed's throughput_calculator per token (FlopFormula), `passes` forwards: 3, or 4 with recompute.
double megatron_deepspeed_flops_per_token(const ModelConfig& m, std::int64_t seq_len, FlopFormula formula, double passes) {
  const double h = static_cast<double>(m.hidden), l = static_cast<double>(m.layers);
  const double s = static_cast<double>(seq_len), v = static_cast<double>(m.vocab);
  if (formula == FlopFormula::megatron_deepspeed_2023) return 24 * passes * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
  const double g = static_cast<double>(m.heads / m.kv_heads), f = m.activation == Activation::swiglu ? 3 : 2;
  const double projections = l * (2 + std::floor(2 / g)) * h * h, scores = 2 * l * h * s;
  const double mlp = l * f * static_cast<double>(m.ffn_hidden) * h, logits = v * h;
  return 2 * passes * (projections + scores + mlp + logits);  // multiply-adds to FLOPs
}

}  // namespace

std::string to_string(FlopFormula formula) {
  switch (formula) {
    case FlopFormula::parameters: return "parameters";
    case FlopFormula::megatron_deepspeed_2023: return "megatron-deepspeed-2023";
    case FlopFormula::megatron_deepspeed_2024: return "megatron-deepspeed-2024";
  }
  return "parameters";
}

FlopConvention parse_flop_convention(const json::Reader& r) {
  FlopConvention c;
  c.causal_attention_halved = r.boolean("causal_attention_halved");
  c.recompute_counted = r.boolean("recompute_counted");
  c.input_embedding_counted = r.boolean("input_embedding_counted");
  if (!r.has("formula")) return c;
  const std::string formula = r.choice("formula", {"parameters", "megatron-deepspeed-2023", "megatron-deepspeed-2024"});
  c.formula = formula == "megatron-deepspeed-2023"   ? FlopFormula::megatron_deepspeed_2023
              : formula == "megatron-deepspeed-2024" ? FlopFormula::megatron_deepspeed_2024
                                                     : FlopFormula::parameters;
  if (c.formula != FlopFormula::parameters && (c.causal_attention_halved || !c.recompute_counted || c.input_embedding_counted)) {
    r.fail("formula", "with causal_attention_halved false, recompute_counted true and input_embedding_counted false (what " + formula + " counts)",
           "\"" + formula + "\" with other switches");
  }
  return c;
}

double convention_flops_per_token(const ModelConfig& model, std::int64_t seq_len, const FlopConvention& convention, bool full_recompute) {
  if (convention.formula != FlopFormula::parameters) {
    return megatron_deepspeed_flops_per_token(model, seq_len, convention.formula, full_recompute ? 4 : 3);
  }
  const bool causal = convention.causal_attention_halved;
  const double forward = model.dense_flops_per_token_fwd() + model.attention_flops_per_token_fwd(seq_len, causal);
  double flops = 3 * forward;
  if (full_recompute && convention.recompute_counted) flops += forward;
  if (convention.input_embedding_counted) flops += 6 * static_cast<double>(model.vocab) * static_cast<double>(model.hidden);
  return flops;
}

double ModelConfig::megatron_flops_per_token(std::int64_t seq_len) const {
  const double h = static_cast<double>(hidden), l = static_cast<double>(layers);
  const double s = static_cast<double>(seq_len), v = static_cast<double>(vocab);
  return 72 * l * h * h * (1 + s / (6 * h) + v / (12 * h * l));
}

namespace {

// Shape checks shared by files and --model custom:...; `r` reads from either.
void read_shape(const json::Reader& r, ModelConfig& m) {
  m.layers = r.integer("layers", 1, 100000);
  m.hidden = r.integer("hidden", 8, 1 << 20);
  m.heads = r.integer("heads", 1, m.hidden);
  m.kv_heads = r.integer("kv_heads", 1, m.heads);
  if (m.heads % m.kv_heads != 0) {
    r.fail("kv_heads", "a divisor of heads (" + std::to_string(m.heads) + ")", std::to_string(m.kv_heads));
  }
  m.head_dim = r.integer("head_dim", 1, 4096);
  m.ffn_hidden = r.integer("ffn_hidden", 1, 1 << 24);
  m.vocab = r.integer("vocab", 2, 1 << 24);
  m.activation = r.choice("activation", {"swiglu", "gelu"}) == "swiglu" ? Activation::swiglu : Activation::gelu;
  m.norm = r.choice("norm", {"rmsnorm", "layernorm"}) == "rmsnorm" ? Norm::rmsnorm : Norm::layernorm;
  m.bias = r.boolean("bias");
  m.tied_embeddings = r.boolean("tied_embeddings");
  m.dtype = r.choice("dtype", {"bf16", "fp16", "fp32"});
  m.norm_epsilon = r.number("norm_epsilon", json::Bound{1e-12, 0.1, "", false, false});
  if (r.has("rope_theta")) m.rope_theta = r.number("rope_theta", json::Bound{1, 1e12, "", false, false});
  m.norm_weight_decay = r.boolean("norm_weight_decay");
}

}  // namespace

ModelConfig parse_model(const json::Json& document, const std::string& origin) {
  json::Reader r(document, origin);
  ModelConfig m;
  json::read_header(r, "trainyard.model.v1", m);
  m.source = r.string("source");
  read_shape(r, m);
  r.finish();
  return m;
}

ModelConfig parse_custom_model(std::string_view spec, std::vector<std::string>* defaults_used) {
  const std::string origin = "--model";
  constexpr std::string_view prefix = "custom:";
  if (!spec.starts_with(prefix)) {
    throw InputError(origin, "value", "custom:<field>=<value>,...", "\"" + std::string(spec) + "\"");
  }
  const std::string original(spec);
  spec.remove_prefix(prefix.size());
  json::Json fields = json::Json::object();
  while (!spec.empty()) {
    const auto comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      throw InputError(origin, "custom", "field=value pairs separated by commas", "\"" + std::string(item) + "\"");
    }
    const std::string key(item.substr(0, eq));
    const std::string value(item.substr(eq + 1));
    if (fields.contains(key)) throw InputError(origin, "custom." + key, "each field once", "it twice");
    std::int64_t number = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
    double real = 0;
    auto [real_end, real_ec] = std::from_chars(value.data(), value.data() + value.size(), real);
    if (ec == std::errc() && end == value.data() + value.size()) {
      fields[key] = number;
    } else if (real_ec == std::errc() && real_end == value.data() + value.size()) {
      fields[key] = real;  // norm_epsilon=1e-6
    } else if (value == "true" || value == "false") {
      fields[key] = value == "true";
    } else {
      fields[key] = value;
    }
  }

  // Defaults: Llama-like. kv_heads = heads (MHA), head_dim = hidden / heads, SwiGLU with the Llama MLP width
  // (8/3 * hidden rounded up to a multiple of 256), GELU with 4 * hidden, Llama-2's 32000 vocab.
  auto fill = [&](const std::string& key, const json::Json& value) {
    if (fields.contains(key)) return;
    fields[key] = value;
    if (defaults_used) defaults_used->push_back(key + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
  };
  json::Reader shape(fields, origin, "custom");
  (void)shape.integer("layers", 1, 100000);
  const std::int64_t hidden = shape.integer("hidden", 8, 1 << 20);
  const std::int64_t heads = shape.integer("heads", 1, hidden);
  if (hidden % heads != 0 && !fields.contains("head_dim")) {
    shape.fail("heads", "a divisor of hidden (" + std::to_string(hidden) + ") unless head_dim is given", std::to_string(heads));
  }
  fill("kv_heads", heads);
  fill("head_dim", hidden / heads);
  fill("activation", "swiglu");
  const bool swiglu = fields["activation"] == "swiglu";
  fill("ffn_hidden", swiglu ? (8 * hidden / 3 + 255) / 256 * 256 : 4 * hidden);
  fill("vocab", 32000);
  fill("norm", "rmsnorm");
  fill("bias", false);
  fill("tied_embeddings", false);
  fill("dtype", "bf16");
  // Llama 2's constants (config.json of meta-llama/Llama-2-7b-hf: rms_norm_eps 1e-5, the default rope_theta 10000).
  fill("norm_epsilon", 1e-5);
  fill("rope_theta", 10000);
  fill("norm_weight_decay", false);

  ModelConfig m;
  m.origin = origin;
  json::Reader r(fields, origin, "custom");
  read_shape(r, m);
  r.finish();
  m.name = "custom";
  m.description = "custom model from the command line";
  m.source = original;
  return m;
}

std::vector<PrecisionPolicy> precision_policies() {
  return {
      {"bf16-mixed", "bf16 weights and gradients, fp32 master weights and Adam m, v (16 B/param)", 2, 2, 4, 8},
      {"bf16-mixed-fp32-grads", "bf16 weights, fp32 gradient accumulation, fp32 master and Adam (18 B/param)", 2, 4, 4, 8},
      {"fp32", "fp32 weights and gradients, fp32 Adam m, v (16 B/param)", 4, 4, 0, 8},
  };
}

PrecisionPolicy precision_policy(std::string_view name, const std::string& origin) {
  std::string known;
  for (const auto& p : precision_policies()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw InputError(origin, "value", "one of " + known, "\"" + std::string(name) + "\"");
}

ModelStateBytes model_state_bytes(const ModelConfig& model, const PrecisionPolicy& policy) {
  const double n = model.params();
  return {n * policy.weight_bytes, n * policy.grad_bytes, n * policy.master_bytes, n * policy.optimizer_bytes};
}

std::optional<std::pair<std::string, std::int64_t>> tensor_shard_mismatch(const ModelConfig& model, int shards) {
  for (const auto& [field, value] : {std::pair{"heads", model.heads}, std::pair{"kv_heads", model.kv_heads},
                                     std::pair{"ffn_hidden", model.ffn_hidden}, std::pair{"vocab", model.vocab}}) {
    if (shards <= 0 || value % shards != 0) return std::pair{std::string(field), value};
  }
  return std::nullopt;
}

}  // namespace trainyard::model
