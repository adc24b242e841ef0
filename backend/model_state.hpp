#pragma once
// The model's parameters with real values, for the executors: bf16 weights (held as floats rounded to bf16),
// their fp32 gradients, and the fp32 master weights and AdamW moments. Layouts are the ones the layer's GEMMs use
// (row-major [out][in], y = x W^T): see the per-tensor comments.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/reference.hpp"
#include "models/model.hpp"

namespace trainyard::backend {

// One parameter tensor with everything the optimizer needs.
struct Parameter {
  std::string name;           // "L3 wqkv", "embedding"
  std::vector<float> weight;  // what forward reads (bf16 values)
  std::vector<float> grad;    // fp32, summed over the step's chunks and sequences
  std::vector<float> master;  // fp32 master copy
  std::vector<float> m, v;    // AdamW moments
  bool decays = true;         // AdamW's weight decay applies (norm gains: as the model file's norm_weight_decay says)
  std::size_t size() const { return weight.size(); }
};

struct LayerParameters {
  Parameter norm1;  // [hidden]
  Parameter wqkv;   // [q_dim + 2 kv_dim][hidden]: the rows of q, then k, then v
  Parameter wo;     // [hidden][q_dim]
  Parameter norm2;  // [hidden]
  Parameter wup;    // [2 ffn][hidden]: the gate rows, then the up rows
  Parameter wdown;  // [hidden][ffn]
  // The layer's parameters in their one order, which the optimizer's groups and the executors' LayerWeight follow.
  std::array<Parameter*, 6> in_order() { return {&norm1, &wqkv, &wo, &norm2, &wup, &wdown}; }
};

// Parameter groups, as the optimizer sees them: one per layer, the embedding, the head (final norm and LM head).
constexpr int kEmbeddingGroup = -1;
constexpr int kHeadGroup = -2;

class ModelState {
 public:
  // Seeded: weights ~ N(0, 0.02^2) (the output projections scaled by 1/sqrt(2 layers), GPT-2 style), norms 1.
  // Throws InputError (origin --model) for shapes the executors do not run: gelu, layernorm, bias, an odd head_dim,
  // no rope_theta.
  ModelState(const model::ModelConfig& model, std::uint64_t seed);

  const model::ModelConfig& model() const { return model_; }
  std::vector<LayerParameters>& layers() { return layers_; }
  const std::vector<LayerParameters>& layers() const { return layers_; }
  Parameter& embedding() { return embedding_; }
  const Parameter& embedding() const { return embedding_; }
  Parameter& final_norm() { return final_norm_; }
  const Parameter& final_norm() const { return final_norm_; }
  // The LM head's [vocab][hidden] matrix: the embedding itself when the model ties them.
  Parameter& lm_head() { return model_.tied_embeddings ? embedding_ : lm_head_; }
  const Parameter& lm_head() const { return model_.tied_embeddings ? embedding_ : lm_head_; }

  // Every parameter of a group (a layer index, kEmbeddingGroup or kHeadGroup).
  std::vector<Parameter*> group(int group);
  std::vector<Parameter*> all();
  std::vector<const Parameter*> all() const;

  void zero_grads();
  // One AdamW step (step >= 1) on a group: master weights and moments updated, bf16 weights refreshed.
  void adamw_step(int group, const kernels::AdamW& opt, int step);

 private:
  model::ModelConfig model_;
  std::vector<LayerParameters> layers_;
  Parameter embedding_, final_norm_, lm_head_;
};

// Tensor parallelism: shard `index` of `shards` of a parameter, in the whole parameter's [rows][cols] layout: its
// row blocks (first row, rows) one after another, each row's columns [col_first, col_first + cols). The shard's
// values are those elements in that order, which is the layout of the same parameter of the sharded model
// (ops.hpp tensor_shard).
struct ShardLayout {
  std::int64_t full_cols = 0, col_first = 0, cols = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> row_blocks;
  std::int64_t elements() const;
};
// Every parameter's shard, in ModelState::all() order, as Megatron splits them: wqkv's Q, K and V rows and wup's
// gate and up rows by output (column-parallel), wo's and wdown's columns by input (row-parallel), the embedding's
// and the LM head's vocabulary rows (vocab-parallel), the norms whole (replicated).
std::vector<ShardLayout> tensor_shard_layouts(const model::ModelConfig& full, int shards, int index);
// The same for the fraction [begin, end) of each split (shard k of n is [k/n, (k+1)/n)): HotSPa's switches move such
// slices between layouts of different tensor-parallel degrees. A split of P rows or columns covers positions
// [round(begin P), round(end P)), so neighbouring slices partition it; the norms are whole in every slice.
std::vector<ShardLayout> tensor_slice_layouts(const model::ModelConfig& full, double begin, double end);
// Visits a shard's elements in order: (index in the shard, index in the whole parameter).
template <typename Visit>
void for_each_shard_element(const ShardLayout& l, Visit&& visit) {
  std::int64_t k = 0;
  for (const auto& [first, rows] : l.row_blocks) {
    for (std::int64_t r = first; r < first + rows; ++r) {
      for (std::int64_t c = 0; c < l.cols; ++c) visit(k++, r * l.full_cols + l.col_first + c);
    }
  }
}
void take_shard(const ShardLayout& layout, std::span<const float> full, std::span<float> shard);
void put_shard(const ShardLayout& layout, std::span<const float> shard, std::span<float> full);

// The blocks a parameter's gradient is judged in, as element offsets [cuts[i], cuts[i + 1]): the whole tensor, or
// wqkv's q, k and v rows and wup's gate and up rows apart (their scales differ).
std::vector<std::size_t> gradient_blocks(const model::ModelConfig& model, const Parameter& p);

// How `trainyard run --check` and the tests compare two runs of a step: per gradient block (above), the largest
// |difference| relative to the block's
// largest |gradient| in `reference`; the worst block. Per block, so a wrong small gradient (dK, a norm) cannot hide
// behind the embedding's large one.
double max_gradient_difference(const ModelState& a, const ModelState& reference);

// Byte-level tokens (vocab 256) of a text (the contents of the file `path`), cut into `sequences` windows of
// seq_len + 1 tokens (inputs and next-token targets) starting at `offset` and wrapping round the text. Throws
// InputError naming the file when it is shorter than one window.
std::vector<std::vector<std::int32_t>> text_windows(std::string_view text, const std::string& path, std::int64_t seq_len, std::int64_t sequences,
                                                    std::int64_t offset);
// Seeded uniform tokens in [0, vocab), same shape.
std::vector<std::vector<std::int32_t>> random_windows(std::int64_t vocab, std::int64_t seq_len, std::int64_t sequences, std::uint64_t seed);

}  // namespace trainyard::backend
