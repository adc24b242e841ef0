#include "backend/model_state.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>

#include "common/error.hpp"

namespace trainyard::backend {

namespace {

Parameter make(std::string name, std::size_t size) {
  Parameter p;
  p.name = std::move(name);
  p.weight.assign(size, 0.0f);
  p.grad.assign(size, 0.0f);
  p.master.assign(size, 0.0f);
  p.m.assign(size, 0.0f);
  p.v.assign(size, 0.0f);
  return p;
}

void fill_normal(Parameter& p, float stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, stddev);
  for (std::size_t i = 0; i < p.size(); ++i) {
    p.master[i] = normal(rng);
    p.weight[i] = kernels::round_bf16(p.master[i]);
  }
}

// A norm's gain: ones, decayed only when the model file says so.
void norm_gain(Parameter& p, const model::ModelConfig& model) {
  std::fill(p.master.begin(), p.master.end(), 1.0f);
  std::fill(p.weight.begin(), p.weight.end(), 1.0f);
  p.decays = model.norm_weight_decay;
}

}  // namespace

ModelState::ModelState(const model::ModelConfig& model, std::uint64_t seed) : model_(model) {
  const std::string origin = model.origin.empty() ? "--model" : model.origin;
  if (model.activation != model::Activation::swiglu) throw InputError(origin, "activation", "swiglu (the executors run Llama-style layers)", "gelu");
  if (model.norm != model::Norm::rmsnorm) throw InputError(origin, "norm", "rmsnorm (the executors run Llama-style layers)", "layernorm");
  if (model.bias) throw InputError(origin, "bias", "false (the executors run Llama-style layers without biases)", "true");
  if (model.head_dim % 2 != 0) throw InputError(origin, "head_dim", "an even number (RoPE rotates pairs)", std::to_string(model.head_dim));
  if (!model.rope_theta) throw InputError(origin, "rope_theta", "a RoPE base (the executors run Llama-style layers)", "none");
  const auto h = static_cast<std::size_t>(model.hidden), q = static_cast<std::size_t>(model.q_dim()), kv = static_cast<std::size_t>(model.kv_dim()),
             f = static_cast<std::size_t>(model.ffn_hidden), vocab = static_cast<std::size_t>(model.vocab);
  std::mt19937_64 rng(seed);
  constexpr float kStd = 0.02f;
  const float out_std = kStd / std::sqrt(2.0f * static_cast<float>(model.layers));
  for (std::int64_t l = 0; l < model.layers; ++l) {
    const std::string tag = "L" + std::to_string(l) + " ";
    LayerParameters p{make(tag + "norm1", h), make(tag + "wqkv", (q + 2 * kv) * h), make(tag + "wo", h * q),
                      make(tag + "norm2", h), make(tag + "wup", 2 * f * h),         make(tag + "wdown", h * f)};
    norm_gain(p.norm1, model);
    fill_normal(p.wqkv, kStd, rng);
    fill_normal(p.wo, out_std, rng);
    norm_gain(p.norm2, model);
    fill_normal(p.wup, kStd, rng);
    fill_normal(p.wdown, out_std, rng);
    layers_.push_back(std::move(p));
  }
  embedding_ = make("embedding", vocab * h);
  fill_normal(embedding_, kStd, rng);
  final_norm_ = make("final norm", h);
  norm_gain(final_norm_, model);
  if (!model.tied_embeddings) {
    lm_head_ = make("lm head", vocab * h);
    fill_normal(lm_head_, kStd, rng);
  }
}

std::vector<Parameter*> ModelState::group(int group) {
  if (group == kEmbeddingGroup) return {&embedding_};
  if (group == kHeadGroup) {
    if (model_.tied_embeddings) return {&final_norm_};  // the tied matrix is updated with the embedding group
    return {&final_norm_, &lm_head_};
  }
  TRAINYARD_CHECK(group >= 0 && group < static_cast<int>(layers_.size()), "parameter group out of range");
  const auto in_order = layers_[group].in_order();
  return {in_order.begin(), in_order.end()};
}

std::int64_t ShardLayout::elements() const {
  std::int64_t rows = 0;
  for (const auto& [first, count] : row_blocks) rows += count;
  return rows * cols;
}

std::vector<ShardLayout> tensor_shard_layouts(const model::ModelConfig& full, int shards, int index) {
  return tensor_slice_layouts(full, static_cast<double>(index) / shards, static_cast<double>(index + 1) / shards);
}

std::vector<ShardLayout> tensor_slice_layouts(const model::ModelConfig& full, double begin, double end) {
  const std::int64_t h = full.hidden, q = full.q_dim(), kv = full.kv_dim(), f = full.ffn_hidden, vocab = full.vocab;
  auto first = [&](std::int64_t positions) { return std::llround(begin * static_cast<double>(positions)); };
  auto count = [&](std::int64_t positions) { return std::llround(end * static_cast<double>(positions)) - first(positions); };
  const ShardLayout norm{h, 0, h, {{0, 1}}};
  const ShardLayout wqkv{h, 0, h, {{first(q), count(q)}, {q + first(kv), count(kv)}, {q + kv + first(kv), count(kv)}}};
  const ShardLayout wo{q, first(q), count(q), {{0, h}}};
  const ShardLayout wup{h, 0, h, {{first(f), count(f)}, {f + first(f), count(f)}}};
  const ShardLayout wdown{f, first(f), count(f), {{0, h}}};
  const ShardLayout vocab_rows{h, 0, h, {{first(vocab), count(vocab)}}};
  std::vector<ShardLayout> out;
  for (std::int64_t l = 0; l < full.layers; ++l) out.insert(out.end(), {norm, wqkv, wo, norm, wup, wdown});
  out.push_back(vocab_rows);                             // the embedding
  out.push_back(norm);                                   // the final norm
  if (!full.tied_embeddings) out.push_back(vocab_rows);  // the LM head
  return out;
}

void take_shard(const ShardLayout& layout, std::span<const float> full, std::span<float> shard) {
  TRAINYARD_CHECK(static_cast<std::int64_t>(shard.size()) == layout.elements(), "a shard of the layout's size");
  for_each_shard_element(layout, [&](std::int64_t k, std::int64_t i) { shard[static_cast<std::size_t>(k)] = full[static_cast<std::size_t>(i)]; });
}

void put_shard(const ShardLayout& layout, std::span<const float> shard, std::span<float> full) {
  TRAINYARD_CHECK(static_cast<std::int64_t>(shard.size()) == layout.elements(), "a shard of the layout's size");
  for_each_shard_element(layout, [&](std::int64_t k, std::int64_t i) { full[static_cast<std::size_t>(i)] = shard[static_cast<std::size_t>(k)]; });
}

std::vector<Parameter*> ModelState::all() {
  std::vector<Parameter*> out;
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    for (Parameter* p : group(l)) out.push_back(p);
  }
  out.push_back(&embedding_);
  for (Parameter* p : group(kHeadGroup)) out.push_back(p);
  return out;
}

std::vector<const Parameter*> ModelState::all() const {
  const auto mutable_all = const_cast<ModelState*>(this)->all();  // the same list, read-only
  return {mutable_all.begin(), mutable_all.end()};
}

void ModelState::zero_grads() {
  for (Parameter* p : all()) std::fill(p->grad.begin(), p->grad.end(), 0.0f);
}

void ModelState::adamw_step(int group, const kernels::AdamW& opt, int step) {
  for (Parameter* p : this->group(group)) {
    kernels::AdamW o = opt;
    if (!p->decays) o.weight_decay = 0;
    kernels::adamw_ref(o, step, p->master, p->m, p->v, p->grad, p->weight);
  }
}

std::vector<std::size_t> gradient_blocks(const model::ModelConfig& m, const Parameter& p) {
  const auto h = static_cast<std::size_t>(m.hidden), q = static_cast<std::size_t>(m.q_dim()), kv = static_cast<std::size_t>(m.kv_dim()),
             f = static_cast<std::size_t>(m.ffn_hidden);
  if (p.name.ends_with("wqkv")) return {0, q * h, (q + kv) * h, p.size()};
  if (p.name.ends_with("wup")) return {0, f * h, p.size()};
  return {0, p.size()};
}

double max_gradient_difference(const ModelState& a, const ModelState& reference) {
  const auto pa = a.all(), pb = reference.all();
  TRAINYARD_CHECK(pa.size() == pb.size(), "gradients of the same model");
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const auto& ga = pa[i]->grad;
    const auto& gb = pb[i]->grad;
    TRAINYARD_CHECK(ga.size() == gb.size(), "gradients of the same model");
    const auto cuts = gradient_blocks(reference.model(), *pb[i]);
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      double diff = 0, scale = 0;
      for (std::size_t j = cuts[c]; j < cuts[c + 1]; ++j) {
        const double d = std::abs(static_cast<double>(ga[j]) - static_cast<double>(gb[j]));
        diff = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(diff, d);  // std::max would drop a NaN
        scale = std::max(scale, static_cast<double>(std::abs(gb[j])));
      }
      worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
  }
  return worst;
}

std::vector<std::vector<std::int32_t>> text_windows(std::string_view text, const std::string& path, std::int64_t seq_len, std::int64_t sequences,
                                                    std::int64_t offset) {
  const auto n = static_cast<std::int64_t>(text.size());
  if (n < seq_len + 1) {
    throw InputError(path, "length", "at least " + std::to_string(seq_len + 1) + " bytes (one sequence and its last target)",
                     std::to_string(n) + " bytes");
  }
  std::vector<std::vector<std::int32_t>> out;
  for (std::int64_t s = 0; s < sequences; ++s) {
    std::vector<std::int32_t> window(static_cast<std::size_t>(seq_len + 1));
    const std::int64_t start = (offset + s * seq_len) % n;
    for (std::int64_t i = 0; i <= seq_len; ++i) window[i] = static_cast<unsigned char>(text[(start + i) % n]);
    out.push_back(std::move(window));
  }
  return out;
}

std::vector<std::vector<std::int32_t>> random_windows(std::int64_t vocab, std::int64_t seq_len, std::int64_t sequences, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(sequences), std::vector<std::int32_t>(static_cast<std::size_t>(seq_len + 1)));
  for (auto& w : out) {
    for (auto& t : w) t = token(rng);
  }
  return out;
}

}  // namespace trainyard::backend
