#include "backend/ops.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <sstream>
#include <tuple>

#include "common/error.hpp"

namespace trainyard::backend {

namespace {

// A table laid out by hand.
// clang-format off
constexpr const char* kRoleNames[] = {"x (layer input)", "norm1 output", "Q", "K", "V", "running attention output",
                                      "attention output", "attention lse", "projection output", "residual1 output",
                                      "norm2 output", "gate|up", "MLP activation", "MLP output", "dMLP", "dh1", "dact", "dgate|up",
                                      "dnorm2", "dproj", "dO", "attention delta", "dQ", "dK|dV accumulator",
                                      "received dK|dV accumulator", "dQKV",
                                      "dnorm1", "dx (input gradient)", "final norm output", "logits", "dlogits",
                                      "dfinal norm output", "cross-entropy statistics"};
// clang-format on
static_assert(std::size(kRoleNames) == static_cast<std::size_t>(Role::xstats) + 1);

using sim::OpCode;
constexpr auto R = Access::read, W = Access::write, U = Access::update;
constexpr auto f32 = ElementType::fp32, b16 = ElementType::bf16;
constexpr auto kv_chunks = Place::kv_chunks, next_layer = Place::next_layer, piece = Place::head_piece;
constexpr auto starting = When::starting, continuing = When::continuing;
constexpr auto HID = Width::hidden, Q = Width::q, KV = Width::kv, QKV = Width::qkv, DKV = Width::dkv, FFN = Width::ffn, GU = Width::gate_up,
               VOCAB = Width::vocab, HEADS = Width::heads, VSTATS = Width::vocab_stats;

// The table. Forward and backward of a Llama layer (RMSNorm, GQA attention with RoPE, SwiGLU MLP), then the
// LM head. The activations and their gradients are bf16 [rows][width]; the running attention output, lse, delta,
// dQ and the dK|dV accumulators fp32, as the GPU kernels keep them.
std::vector<OpSpec> make_table() {
  using enum Role;
  return {
      {OpCode::embed, "embedding", {{x, W, HID}}},
      {OpCode::norm1, "rmsnorm", {{x, R, HID}, {n1, W, HID}}},
      {OpCode::qkv, "gemm x3", {{n1, R, HID}, {q, W, Q}, {k, W, KV}, {v, W, KV}}},
      {OpCode::rope, "rope x2", {{q, U, Q}, {k, U, KV}}},
      {OpCode::attn,
       "attention + merge per K/V chunk",
       {{q, R, Q},
        {k, R, KV, b16, kv_chunks},
        {v, R, KV, b16, kv_chunks},
        {o_run, W, Q, f32, Place::chunk, starting},
        {lse, W, HEADS, f32, Place::chunk, starting},
        {o_run, U, Q, f32, Place::chunk, continuing},
        {lse, U, HEADS, f32, Place::chunk, continuing},
        {o, W, Q}}},
      {OpCode::attn_merge, "to_bf16", {{o_run, R, Q, f32}, {o, W, Q}}},
      {OpCode::proj, "gemm", {{o, R, Q}, {p, W, HID}}},
      {OpCode::residual1, "add", {{x, R, HID}, {p, R, HID}, {h1, W, HID}}},
      {OpCode::norm2, "rmsnorm", {{h1, R, HID}, {n2, W, HID}}},
      {OpCode::mlp_up, "gemm x2", {{n2, R, HID}, {gu, W, GU}}},
      {OpCode::act, "swiglu", {{gu, R, GU}, {a, W, FFN}}},
      {OpCode::mlp_down, "gemm", {{a, R, FFN}, {mo, W, HID}}},
      {OpCode::residual2, "add", {{h1, R, HID}, {mo, R, HID}, {x, W, HID, b16, next_layer}}},

      {OpCode::residual2_bwd, "copy x2", {{dx, R, HID, b16, next_layer}, {dm, W, HID}, {dh1, W, HID}}},
      {OpCode::mlp_down_dgrad, "gemm", {{dm, R, HID}, {da, W, FFN}}},
      {OpCode::mlp_down_wgrad, "gemm", {{dm, R, HID}, {a, R, FFN}}},
      {OpCode::act_bwd, "swiglu backward", {{gu, R, GU}, {da, R, FFN}, {dgu, W, GU}}},
      {OpCode::mlp_up_dgrad, "gemm x2", {{dgu, R, GU}, {dn2, W, HID}}},
      {OpCode::mlp_up_wgrad, "gemm x2", {{dgu, R, GU}, {n2, R, HID}}},
      {OpCode::norm2_bwd, "rmsnorm backward + add", {{h1, R, HID}, {dn2, R, HID}, {dh1, U, HID}}},
      {OpCode::residual1_bwd, "copy", {{dh1, R, HID}, {dp, W, HID}}},
      {OpCode::proj_dgrad, "gemm", {{dp, R, HID}, {d_o, W, Q}}},
      {OpCode::proj_wgrad, "gemm", {{dp, R, HID}, {o, R, Q}}},
      {OpCode::attn_bwd,
       "attention backward per K/V chunk",
       {{k, R, KV, b16, kv_chunks},
        {v, R, KV, b16, kv_chunks},
        {q, R, Q},
        {d_o, R, Q},
        {lse, R, HEADS, f32},
        {o, R, Q, b16, Place::chunk, starting},  // D = rowsum(dO * O), once
        {dq, W, Q, f32, Place::chunk, starting},
        {delta, W, HEADS, f32, Place::chunk, starting},
        {dq, U, Q, f32, Place::chunk, continuing},
        {delta, U, HEADS, f32, Place::chunk, continuing},
        {dkv, Access::accumulate, DKV, f32, kv_chunks}}},
      {OpCode::dkv_add, "axpy_f32", {{dkv_in, R, DKV, f32, kv_chunks}, {dkv, Access::accumulate, DKV, f32, kv_chunks}}},
      {OpCode::rope_bwd, "to_bf16 + rope x2", {{dq, R, Q, f32}, {dkv, R, DKV, f32}, {dqkv, W, QKV}}},
      {OpCode::qkv_dgrad, "gemm x3", {{dqkv, R, QKV}, {dn1, W, HID}}},
      {OpCode::qkv_wgrad, "gemm x3", {{dqkv, R, QKV}, {n1, R, HID}}},
      {OpCode::norm1_bwd, "rmsnorm backward + add", {{x, R, HID}, {dn1, R, HID}, {dh1, R, HID}, {dx, W, HID}}},
      {OpCode::embed_bwd, "embedding backward", {{dx, R, HID}}},

      {OpCode::head_logits, "rmsnorm + gemm", {{x, R, HID}, {logits, W, VOCAB, b16, piece}, {nf, W, HID, b16, piece}}},
      {OpCode::head_xent, "cross_entropy", {{logits, R, VOCAB, b16, piece}, {dlogits, W, VOCAB, b16, piece}}},
      {OpCode::head_dgrad,
       "gemm + rmsnorm backward",
       {{dlogits, R, VOCAB, b16, piece}, {x, R, HID}, {dx, W, HID, b16, Place::chunk, starting, true}, {dx, U, HID, b16, Place::chunk, continuing}}},
      {OpCode::head_wgrad, "gemm", {{dlogits, R, VOCAB, b16, piece}, {nf, R, HID, b16, piece}}},
      // The vocab-parallel LM head (tensor parallelism): the shard's statistics, then, once all-gathered, the loss
      // and dlogits; dNF partial over the shards, then, once summed, the final norm's backward.
      {OpCode::head_xent_shard, "cross_entropy (statistics)", {{logits, R, VOCAB, b16, piece}, {xstats, W, VSTATS, f32, piece}}},
      {OpCode::head_xent_merge,
       "vocab_parallel_merge + cross_entropy backward",
       {{logits, R, VOCAB, b16, piece}, {xstats, R, VSTATS, f32, piece}, {dlogits, W, VOCAB, b16, piece}}},
      {OpCode::head_dgrad_shard, "gemm", {{dlogits, R, VOCAB, b16, piece}, {dnf, W, HID, b16, piece}}},
      {OpCode::head_norm_bwd,
       "rmsnorm backward",
       {{dnf, R, HID, b16, piece}, {x, R, HID}, {dx, W, HID, b16, Place::chunk, starting, true}, {dx, U, HID, b16, Place::chunk, continuing}}},
  };
}

// Indexed by OpCode; null for codes that are not compute ops.
const std::vector<const OpSpec*>& table_by_code() {
  static const std::vector<OpSpec> table = make_table();
  static const std::vector<const OpSpec*> by_code = [] {
    std::vector<const OpSpec*> v(static_cast<std::size_t>(OpCode::states) + 1, nullptr);
    for (const OpSpec& s : table) {
      TRAINYARD_CHECK(v[static_cast<std::size_t>(s.code)] == nullptr, "one op table entry per op code");
      v[static_cast<std::size_t>(s.code)] = &s;
    }
    return v;
  }();
  return by_code;
}

}  // namespace

std::int64_t width_elements(Width w, const model::ModelConfig& m) {
  switch (w) {
    case Width::hidden: return m.hidden;
    case Width::q: return m.q_dim();
    case Width::kv: return m.kv_dim();
    case Width::qkv: return m.q_dim() + 2 * m.kv_dim();
    case Width::dkv: return 2 * m.kv_dim();
    case Width::ffn: return m.ffn_hidden;
    case Width::gate_up: return 2 * m.ffn_hidden;
    case Width::vocab: return m.vocab;
    case Width::heads: return m.heads;
    case Width::vocab_stats: return 2;  // one shard's (compute_uses: every shard's)
  }
  return 0;
}

std::string_view to_string(Role role) { return kRoleNames[static_cast<int>(role)]; }

std::string describe(const Key& k) {
  std::ostringstream out;
  out << to_string(k.role) << " of layer " << k.layer << " chunk " << k.chunk << " (sequence " << k.seq << ")";
  if ((k.role == Role::dkv || k.role == Role::dkv_in) && k.sub > 0) out << ", the share of the rank holding chunk " << k.sub - 1;
  if (k.heads > 0) out << ", head group " << k.heads - 1;
  return out.str();
}

bool is_compute_op(sim::OpCode code) {
  const auto& by_code = table_by_code();
  const auto i = static_cast<std::size_t>(code);
  return i < by_code.size() && by_code[i] != nullptr;
}

const OpSpec& op_spec(sim::OpCode code) {
  if (!is_compute_op(code)) throw InternalError("op " + std::string(sim::to_string(code)) + " is not a compute op", __FILE__, __LINE__);
  return *table_by_code()[static_cast<std::size_t>(code)];
}

const LinearSpec* linear_spec(sim::OpCode code) {
  using enum Role;
  // clang-format off
  static const LinearSpec kLinears[] = {
      {OpCode::qkv, OpCode::qkv_dgrad, OpCode::qkv_wgrad, LayerWeight::wqkv, n1, dn1, {q, k, v}, dqkv, Width::hidden, {Width::q, Width::kv, Width::kv}},
      {OpCode::proj, OpCode::proj_dgrad, OpCode::proj_wgrad, LayerWeight::wo, o, d_o, {p}, dp, Width::q, {Width::hidden}},
      {OpCode::mlp_up, OpCode::mlp_up_dgrad, OpCode::mlp_up_wgrad, LayerWeight::wup, n2, dn2, {gu}, dgu, Width::hidden, {Width::ffn, Width::ffn}},
      {OpCode::mlp_down, OpCode::mlp_down_dgrad, OpCode::mlp_down_wgrad, LayerWeight::wdown, a, da, {mo}, dm, Width::ffn, {Width::hidden}},
  };
  // clang-format on
  for (const LinearSpec& l : kLinears) {
    if (code == l.forward || code == l.dgrad || code == l.wgrad) return &l;
  }
  return nullptr;
}

bool starts_accumulation(const sim::Op& op) {
  if (op.code == OpCode::attn || op.code == OpCode::attn_bwd) return op.kv_last == op.chunk;  // the diagonal pair runs first
  if (op.is_lm_head()) return op.row_begin == 0;
  return true;
}

TensorShape chunk_tensor(Role role, const model::ModelConfig& m, std::int64_t chunk_tokens) {
  for (const OpSpec* spec : table_by_code()) {
    if (spec == nullptr) continue;
    for (const TensorSpec& t : spec->tensors) {
      if (t.role == role && t.place != Place::head_piece) return {chunk_tokens * width_elements(t.width, m), t.dtype};
    }
  }
  throw InternalError("no op table entry has " + std::string(to_string(role)) + " of a chunk", __FILE__, __LINE__);
}

bool is_heads_exchange(sim::OpCode code) {
  return code == OpCode::heads_qkv || code == OpCode::heads_out || code == OpCode::heads_dout || code == OpCode::heads_dqkv;
}

bool to_head_groups(sim::OpCode code) { return code == OpCode::heads_qkv || code == OpCode::heads_dout; }

std::vector<HeadsExchanged> heads_exchanged(sim::OpCode code) {
  switch (code) {
    case OpCode::heads_qkv: return {{Role::q, 1, Q, b16}, {Role::k, 1, KV, b16}, {Role::v, 1, KV, b16}};
    case OpCode::heads_out: return {{Role::o, 1, Q, b16}};
    case OpCode::heads_dout: return {{Role::d_o, 1, Q, b16}};
    case OpCode::heads_dqkv: return {{Role::dq, 1, Q, f32}, {Role::dkv, 2, KV, f32}};
    default: throw InternalError("op " + std::string(sim::to_string(code)) + " is not a Ulysses all-to-all", __FILE__, __LINE__);
  }
}

bool is_tensor_parallel_collective(sim::OpCode code) { return code >= OpCode::tp_sum_p && code <= OpCode::tp_sum_norms; }
bool is_tensor_parallel_gather(sim::OpCode code) { return code >= OpCode::tp_gather_xent && code <= OpCode::tp_gather_dx; }

namespace {
Key tensor_parallel_key(const sim::Op& op) {
  switch (op.code) {
    case OpCode::tp_sum_p: return {Role::p, op.seq, op.layer, op.chunk};
    case OpCode::tp_sum_mo: return {Role::mo, op.seq, op.layer, op.chunk};
    case OpCode::tp_sum_dn2: return {Role::dn2, op.seq, op.layer, op.chunk};
    case OpCode::tp_sum_dn1: return {Role::dn1, op.seq, op.layer, op.chunk};
    case OpCode::tp_sum_x: return {Role::x, op.seq, 0, op.chunk};
    case OpCode::tp_sum_dnf: return {Role::dnf, op.seq, op.layer, op.chunk, op.row_begin};
    case OpCode::tp_gather_xent: return {Role::xstats, op.seq, op.layer, op.chunk, op.row_begin};
    case OpCode::tp_gather_n1: return {Role::n1, op.seq, op.layer, op.chunk};
    case OpCode::tp_gather_n2: return {Role::n2, op.seq, op.layer, op.chunk};
    case OpCode::tp_gather_dm: return {Role::dm, op.seq, op.layer, op.chunk};
    case OpCode::tp_gather_dp: return {Role::dp, op.seq, op.layer, op.chunk};
    case OpCode::tp_gather_x: return {Role::x, op.seq, op.layer, op.chunk};
    case OpCode::tp_gather_dx: return {Role::dx, op.seq, 0, op.chunk};
    default: throw InternalError("op " + std::string(sim::to_string(op.code)) + " is not a tensor-parallel collective", __FILE__, __LINE__);
  }
}
}  // namespace

std::vector<Key> tensor_parallel_keys(const sim::Op& op, std::int64_t chunk_tokens) {
  std::vector<Key> keys;
  if (op.code == OpCode::tp_sum_norms) return keys;  // parameters' gradients, not a step's tensors
  for (const sim::Op& one : chunk_ops(op, chunk_tokens)) keys.push_back(tensor_parallel_key(one));
  return keys;
}

model::ModelConfig tensor_shard(const model::ModelConfig& model, int shards) {
  if (shards == 1) return model;
  if (const auto mismatch = model::tensor_shard_mismatch(model, shards)) {
    throw InputError("the plan's model", mismatch->first,
                     "a multiple of the tensor-parallel size " + std::to_string(shards) +
                         " to run sharded (Megatron pads the vocabulary: --make-vocab-size-divisible-by)",
                     std::to_string(mismatch->second));
  }
  model::ModelConfig shard = model;
  shard.heads /= shards;
  shard.kv_heads /= shards;
  shard.ffn_hidden /= shards;
  shard.vocab /= shards;
  return shard;
}

std::vector<std::int32_t> covered_chunks(const sim::Op& op) {
  std::vector<std::int32_t> chunks;
  for (std::int32_t k = 0; k < std::max<std::int32_t>(1, op.chunk_count); ++k) chunks.push_back(op.chunk + k);
  const std::size_t run = chunks.size();
  for (std::size_t k = 0; k < run && op.zigzag > 0; ++k) chunks.push_back(static_cast<std::int32_t>(op.zigzag - 1 - chunks[k]));
  return chunks;
}

std::vector<std::int32_t> member_chunks(const sim::Op& op, std::int32_t member) {
  sim::Op held = op;  // the group's first member holds chunk op.chunk (-1: 0) on
  held.chunk = std::max<std::int32_t>(0, op.chunk) + member * std::max<std::int32_t>(1, op.chunk_count);
  return covered_chunks(held);
}

kernels::AttentionShape attention_shape(const sim::Op& op, const model::ModelConfig& model, std::int64_t chunk_tokens) {
  kernels::AttentionShape s;
  s.q_len = static_cast<int>(chunk_tokens);
  s.kv_len = static_cast<int>(chunk_tokens * (op.kv_last - op.kv_first + 1));
  s.heads = static_cast<int>(model.heads / std::max<int>(1, op.head_groups));
  s.kv_heads = static_cast<int>(model.kv_heads / std::max<int>(1, op.head_groups));
  s.head_dim = static_cast<int>(model.head_dim);
  s.causal = true;  // with absolute offsets: earlier chunks are wholly visible
  s.q_offset = op.chunk * chunk_tokens;
  s.kv_offset = op.kv_first * chunk_tokens;
  return s;
}

model::ModelConfig model_of(const sim::Op& op, const model::ModelConfig& model) {
  if (op.head_groups == 0 || op.is_lm_head()) return model;
  model::ModelConfig group = model;
  group.heads /= op.head_groups;
  group.kv_heads /= op.head_groups;
  return group;
}

// A Ulysses attention op's pairs: every query chunk up to op.chunk, its diagonal first, in the op's head group.
std::vector<sim::Op> head_group_pairs(const sim::Op& op) {
  std::vector<sim::Op> out;
  auto add = [&](std::int32_t q, std::int32_t kv) {
    sim::Op o = op;
    o.chunk = q;
    o.kv_first = o.kv_last = kv;
    out.push_back(o);
  };
  for (std::int32_t q = 0; q <= op.chunk; ++q) {
    add(q, q);
    for (std::int32_t j = op.kv_first; j < q && j <= op.kv_last; ++j) add(q, j);
  }
  return out;
}

namespace {
// A Ulysses (or a2a CP) attention op: head group `head_group` of every query chunk up to `chunk` (head_group_pairs).
bool is_ulysses_attention(const sim::Op& op) { return op.head_groups > 0 && op.kv_last > op.kv_first && op.zigzag == 0 && op.chunk_count <= 1; }
}  // namespace

namespace {
// A micro-batch's op (sim::Op::seq_count > 1): each sequence's in turn, as chunk_ops has it; an LM-head piece takes
// its rows of each sequence (the sequences' rows laid end to end, each sequence's its covered chunks').
std::vector<sim::Op> sequence_ops(const sim::Op& op, std::int64_t chunk_tokens) {
  std::vector<sim::Op> out;
  const auto rows = static_cast<std::int32_t>(static_cast<std::int64_t>(covered_chunks(op).size()) * chunk_tokens);
  TRAINYARD_CHECK(!op.is_lm_head() || rows > 0, "an LM-head piece over several sequences needs the chunk's rows");
  for (std::int32_t s = 0; s < op.seq_count; ++s) {
    sim::Op one = op;
    one.seq = static_cast<std::int16_t>(op.seq + s);
    one.seq_count = 1;
    if (op.is_lm_head()) {
      const std::int32_t start = s * rows;
      if (op.row_end <= start || op.row_begin >= start + rows) continue;
      one.row_begin = std::max(op.row_begin, start) - start;
      one.row_end = std::min(op.row_end, start + rows) - start;
    }
    const std::vector<sim::Op> more = chunk_ops(one, chunk_tokens);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}
}  // namespace

std::vector<sim::Op> chunk_ops(const sim::Op& op, std::int64_t chunk_tokens) {
  if (op.seq_count > 1) return sequence_ops(op, chunk_tokens);
  if (is_ulysses_attention(op)) return head_group_pairs(op);
  if (op.zigzag <= 0 && op.chunk_count <= 1) return {op};
  const std::vector<std::int32_t> covered = covered_chunks(op);
  const auto mirror = [&](std::int32_t chunk) { return static_cast<std::int32_t>(op.zigzag - 1 - chunk); };
  sim::Op one = op;
  one.zigzag = 0;
  one.chunk_count = 1;
  std::vector<std::int32_t> kv_list;
  for (std::int32_t j = op.kv_first; j >= 0 && j <= op.kv_last; ++j) kv_list.insert(kv_list.end(), {j, mirror(j)});
  std::sort(kv_list.begin(), kv_list.end());
  std::vector<sim::Op> out;
  auto add = [&](std::int32_t chunk, std::int32_t kv_chunk, std::int32_t row_begin, std::int32_t row_end) {
    sim::Op o = one;
    o.chunk = chunk;
    if (kv_chunk >= 0) o.kv_first = o.kv_last = kv_chunk;
    if (row_begin >= 0) std::tie(o.row_begin, o.row_end) = std::pair{row_begin, row_end};
    out.push_back(o);
  };
  const bool kv_op = op.code == OpCode::attn || op.code == OpCode::attn_bwd || op.code == OpCode::dkv_add || op.code == OpCode::kv ||
                     op.code == OpCode::dkv || op.code == OpCode::dkv_pass || op.code == OpCode::kv_dkv;
  TRAINYARD_CHECK(!kv_op || op.zigzag > 0, "an attention op or a K/V move covers one query chunk or a zigzag pair, not a run");
  if (op.is_lm_head()) {  // rows [row_begin, row_end) of the covered chunks laid end to end
    TRAINYARD_CHECK(chunk_tokens > 0, "an LM-head piece over several chunks needs the chunk's rows");
    const auto rows = static_cast<std::int32_t>(chunk_tokens);
    for (std::size_t k = 0; k < covered.size(); ++k) {
      const auto start = static_cast<std::int32_t>(k) * rows;
      if (op.row_begin < start + rows && op.row_end > start) {
        add(covered[k], -1, std::max(op.row_begin, start) - start, std::min(op.row_end, start + rows) - start);
      }
    }
    return out;
  }
  switch (op.code) {
    case OpCode::attn:
    case OpCode::attn_bwd:
      for (std::int32_t q : covered) {
        if (std::binary_search(kv_list.begin(), kv_list.end(), q)) add(q, q, -1, -1);  // the diagonal first
        for (std::int32_t j : kv_list) {
          if (j < q) add(q, j, -1, -1);  // later chunks are wholly masked
        }
      }
      return out;
    case OpCode::dkv_add:
    case OpCode::kv:
    case OpCode::dkv:
    case OpCode::dkv_pass:
    case OpCode::kv_dkv:
      for (std::int32_t j : kv_list) add(op.chunk, j, -1, -1);
      return out;
    default:
      for (std::int32_t chunk : covered) add(chunk, -1, -1, -1);
      return out;
  }
}

std::vector<Use> compute_uses(const sim::Op& op, const model::ModelConfig& model, std::int64_t chunk_tokens) {
  if (op.zigzag > 0 || op.chunk_count > 1 || op.seq_count > 1 || is_ulysses_attention(op)) {
    std::vector<Use> uses;
    for (const sim::Op& one : chunk_ops(op, chunk_tokens)) {
      const std::vector<Use> more = compute_uses(one, model, chunk_tokens);
      uses.insert(uses.end(), more.begin(), more.end());
    }
    return uses;
  }
  const OpSpec& spec = op_spec(op.code);
  const bool starts = starts_accumulation(op);
  const bool head_group = op.head_groups > 0 && !op.is_lm_head();
  std::optional<model::ModelConfig> group;  // a Ulysses head group's widths
  if (head_group) group = model_of(op, model);
  const model::ModelConfig& m = group ? *group : model;
  std::vector<Use> uses;
  for (const TensorSpec& t : spec.tensors) {
    if ((t.when == When::starting && !starts) || (t.when == When::continuing && starts)) continue;
    const std::int64_t width = t.width == Width::vocab_stats ? 2 * op.vocab_shards() : width_elements(t.width, m);
    const std::int64_t rows = t.place == Place::head_piece ? op.row_end - op.row_begin : chunk_tokens;
    auto add = [&](std::int32_t layer, std::int32_t chunk, std::int32_t sub) {
      uses.push_back({Key{t.role, op.seq, layer, chunk, sub, head_group ? op.head_group + 1 : 0}, t.access, rows * width, t.dtype, t.zeroed});
    };
    switch (t.place) {
      case Place::chunk: add(op.layer, op.chunk, 0); break;
      case Place::next_layer: add(op.layer + 1, op.chunk, 0); break;
      case Place::head_piece: add(op.layer, op.chunk, op.row_begin); break;
      case Place::kv_chunks: {
        const std::int32_t share = t.role == Role::dkv ? op.dkv_share() : t.role == Role::dkv_in ? op.dkv_received_share() : 0;
        for (int j = op.kv_first; j <= op.kv_last; ++j) add(op.layer, j, share);
        break;
      }
    }
  }
  return uses;
}

OpTensors::OpTensors(const sim::Op& op, std::span<const Use> uses, std::span<const int> slots) : op_(op), uses_(uses), slots_(slots) {
  TRAINYARD_CHECK(slots.empty() || uses.size() == slots.size(), "one executor slot per tensor of the op");
}

std::size_t OpTensors::index(Role role, int kv_chunk) const {
  for (std::size_t i = 0; i < uses_.size(); ++i) {
    const Key& k = uses_[i].key;
    if (k.role == role && (kv_chunk < 0 || k.chunk == kv_chunk)) return i;
  }
  throw InternalError("op " + std::string(sim::to_string(op_.code)) + " (layer " + std::to_string(op_.layer) + " chunk " + std::to_string(op_.chunk) +
                          ") asks for " + std::string(to_string(role)) + (kv_chunk >= 0 ? " of chunk " + std::to_string(kv_chunk) : "") +
                          ", which its op table entry does not name",
                      __FILE__, __LINE__);
}

const Use& OpTensors::use(Role role, int kv_chunk, bool writes) const {
  const Use& u = uses_[index(role, kv_chunk)];
  if (writes && u.access == Access::read) {
    throw InternalError(
        "op " + std::string(sim::to_string(op_.code)) + "'s " + std::string(to_string(role)) + " is read-only in the op table but is written",
        __FILE__, __LINE__);
  }
  return u;
}

int OpTensors::find(Role role, ElementType dtype, bool writes, int kv_chunk) const {
  const Use& u = use(role, kv_chunk, writes);
  if (u.dtype != dtype) {
    throw InternalError("op " + std::string(sim::to_string(op_.code)) + "'s " + std::string(to_string(role)) + " is " +
                            (u.dtype == ElementType::bf16 ? "bf16" : "fp32") + " in the op table but is accessed as " +
                            (dtype == ElementType::bf16 ? "bf16" : "fp32"),
                        __FILE__, __LINE__);
  }
  TRAINYARD_CHECK(!slots_.empty(), "OpTensors built without slots answers use() only");
  const auto i = static_cast<std::size_t>(&u - uses_.data());
  if (looked_up_) looked_up_->push_back(i);
  return slots_[i];
}

}  // namespace trainyard::backend
