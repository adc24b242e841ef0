#include "backend/device_ops.hpp"

#include <algorithm>
#include <optional>

#include "common/error.hpp"

namespace trainyard::backend {

void* TensorMemory::at(int instance) const {
  const Instance& i = flow->instances[instance];
  char* base = static_cast<char*>(sim::is_host(i.place) ? pinned : arena);
  return base + (sim::is_host(i.place) ? i.host_offset_bytes : i.device_offset_bytes);
}

namespace {

using sim::OpCode;
using Args = DeviceOpArgs;

// The sizes an op's kernels take, for its model: this rank's, or a Ulysses head group's (model_of), worked out
// once per op by run_device_op. Only a head group's model is a copy: the executor submits a whole step of ops.
struct Dims {
  explicit Dims(const Args& a) {
    if (a.op->head_groups > 0) group = model_of(*a.op, *a.model);
    const model::ModelConfig& m = *a.model;
    const model::ModelConfig& mm = op_model(a);
    chunk_tokens = static_cast<int>(a.chunk_tokens);
    h = static_cast<int>(m.hidden);
    q = static_cast<int>(mm.q_dim());
    kv = static_cast<int>(mm.kv_dim());
    f = static_cast<int>(m.ffn_hidden);
    vocab = static_cast<int>(m.vocab);
    H = static_cast<int>(mm.heads);
    KV = static_cast<int>(mm.kv_heads);
    D = static_cast<int>(m.head_dim);
    cq = static_cast<std::int64_t>(chunk_tokens) * q;
    ckv = static_cast<std::int64_t>(chunk_tokens) * kv;
    cf = static_cast<std::int64_t>(chunk_tokens) * f;
    eps = static_cast<float>(m.norm_epsilon);
    rope_theta = static_cast<float>(m.rope_theta.value_or(0));
  }
  Dims(const Dims&) = delete;
  Dims& operator=(const Dims&) = delete;
  const model::ModelConfig& op_model(const Args& a) const { return group ? *group : *a.model; }

  std::optional<model::ModelConfig> group;  // set for an op of a head group
  int chunk_tokens, h, q, kv, f, vocab, H, KV, D;
  std::int64_t cq, ckv, cf;
  float eps, rope_theta;
};

// y = x W^T, dx = dy W, dW += dy^T x (W [out][in]; see kernels/gemm.hpp).
void forward(const Args& a, int rows, int in, int out, const bf16_bits* x, const bf16_bits* w, bf16_bits* y) {
  a.dev->gemm(a.stream, rows, out, in, x, false, w, true, y, false, 1, 0);
}
void dgrad(const Args& a, int rows, int in, int out, const bf16_bits* dy, const bf16_bits* w, bf16_bits* dx, float beta = 0) {
  a.dev->gemm(a.stream, rows, in, out, dy, false, w, false, dx, false, 1, beta);
}
void wgrad(const Args& a, int rows, int in, int out, const bf16_bits* dy, const bf16_bits* x, float* dw) {
  a.dev->gemm(a.stream, out, in, rows, dy, true, x, false, dw, true, 1, 1);
}

// Sequence parallelism's ops between the TP regions, which work on a rank's own rows of the chunk.
bool sequence_local(OpCode code) {
  using enum OpCode;
  return code == norm1 || code == residual1 || code == norm2 || code == residual2 || code == residual2_bwd || code == norm2_bwd ||
         code == residual1_bwd || code == norm1_bwd;
}

// The rows of the chunk this rank computes (all, or under sequence parallelism its own) and where they start.
struct OwnRows {
  int rows;
  std::int64_t at;     // elements into a [chunk_tokens][hidden] tensor
  std::int64_t count;  // rows x hidden
  const bf16_bits* in(const Args& a, Role r) const { return a.in<bf16_bits>(r) + at; }
  bf16_bits* out(const Args& a, Role r) const { return a.out<bf16_bits>(r) + at; }
};
OwnRows own_rows(const Args& a, const Dims& d) {
  const bool own = a.sequence_parallel && sequence_local(a.op->code);
  const int R = own ? d.chunk_tokens / a.shards : d.chunk_tokens;
  const std::int64_t at = own ? static_cast<std::int64_t>(a.shard) * R * d.h : 0;
  return {R, at, static_cast<std::int64_t>(R) * d.h};
}

// The op's query chunk against K/V chunk `kv_chunk` alone.
kernels::AttentionShape pair(const Args& a, int kv_chunk) {
  sim::Op one = *a.op;
  one.kv_first = one.kv_last = kv_chunk;
  return attention_shape(one, *a.model, a.chunk_tokens);
}

// ---- the layer's linear maps, one GEMM per block of W's rows (LinearSpec) ---------------------------------------
void linear(const Args& a, const Dims& d) {
  const LinearSpec& l = *linear_spec(a.op->code);
  const model::ModelConfig& mm = d.op_model(a);
  const int in = static_cast<int>(width_elements(l.in, mm));
  const DeviceParameter& w = a.weights(l.weight);
  std::int64_t columns = 0;  // the block's first column of y (row of W)
  for (std::size_t b = 0; b < l.out.size(); ++b) {
    const int out = static_cast<int>(width_elements(l.out[b], mm));
    const std::int64_t w_at = columns * in, y_at = static_cast<std::int64_t>(d.chunk_tokens) * columns;
    if (a.op->code == l.forward) {
      bf16_bits* y = l.y.size() > 1 ? a.out<bf16_bits>(l.y[b]) : a.out<bf16_bits>(l.y.front()) + y_at;
      forward(a, d.chunk_tokens, in, out, a.in<bf16_bits>(l.x), w.weight + w_at, y);
    } else if (a.op->code == l.dgrad) {  // the blocks' input gradients add up (each after the first adds to the bf16 result)
      dgrad(a, d.chunk_tokens, in, out, a.in<bf16_bits>(l.dy) + y_at, w.weight + w_at, a.out<bf16_bits>(l.dx), b > 0 ? 1.0f : 0.0f);
    } else {
      wgrad(a, d.chunk_tokens, in, out, a.in<bf16_bits>(l.dy) + y_at, a.in<bf16_bits>(l.x), w.grad + w_at);
    }
    columns += out;
  }
}

// ---- forward ------------------------------------------------------------------------------------------------
void embed(const Args& a, const Dims& d) {
  a.dev->embedding_forward(a.stream, d.chunk_tokens, d.h, a.embedding->weight, a.tokens, a.out<bf16_bits>(Role::x));
}
void norm(const Args& a, const Dims& d) {
  const OwnRows r = own_rows(a, d);
  const bool first = a.op->code == OpCode::norm1;
  a.dev->rmsnorm_forward(a.stream, r.rows, d.h, d.eps, r.in(a, first ? Role::x : Role::h1),
                         a.weights(first ? LayerWeight::norm1 : LayerWeight::norm2).weight, r.out(a, first ? Role::n1 : Role::n2));
}
void rope(const Args& a, const Dims& d) {
  const std::int64_t offset = a.op->chunk * a.chunk_tokens;
  a.dev->rope(a.stream, d.chunk_tokens, d.H, d.D, offset, d.rope_theta, false, a.out<bf16_bits>(Role::q));
  a.dev->rope(a.stream, d.chunk_tokens, d.KV, d.D, offset, d.rope_theta, false, a.out<bf16_bits>(Role::k));
}
// Pair by pair into the running state, the diagonal first as the reference's single call covers it.
void attention(const Args& a, const Dims& d) {
  const sim::Op& op = *a.op;
  float* o_run = a.out<float>(Role::o_run);
  float* lse = a.out<float>(Role::lse);
  if (starts_accumulation(op)) {  // an empty running state: zero output, and an lse so low (-1.7e38) its merge weight is 0
    a.dev->fill(a.stream, o_run, 0, d.cq * 4);
    a.dev->fill(a.stream, lse, 0xFE, static_cast<std::int64_t>(d.H) * d.chunk_tokens * 4);
  }
  auto* o_part = a.scratch<bf16_bits>(d.cq);
  auto* lse_part = a.scratch<float>(static_cast<std::int64_t>(d.H) * d.chunk_tokens);
  for (int j = op.kv_last; j >= op.kv_first; --j) {
    a.dev->attention_forward(a.stream, pair(a, j), a.in<bf16_bits>(Role::q), a.in<bf16_bits>(Role::k, j), a.in<bf16_bits>(Role::v, j), o_part,
                             lse_part);
    a.dev->attention_merge(a.stream, d.chunk_tokens, d.H, d.D, o_run, lse, o_part, lse_part);
  }
  a.release(o_part);
  a.release(lse_part);
  a.dev->to_bf16(a.stream, o_run, a.out<bf16_bits>(Role::o), d.cq);
}
void attention_merge(const Args& a, const Dims& d) { a.dev->to_bf16(a.stream, a.in<float>(Role::o_run), a.out<bf16_bits>(Role::o), d.cq); }
void residual(const Args& a, const Dims& d) {
  const OwnRows r = own_rows(a, d);
  const bool first = a.op->code == OpCode::residual1;
  a.dev->add(a.stream, r.count, r.in(a, first ? Role::x : Role::h1), r.in(a, first ? Role::p : Role::mo), r.out(a, first ? Role::h1 : Role::x));
}
void swiglu(const Args& a, const Dims& d) {
  const std::int64_t cf = d.cf;
  a.dev->swiglu_forward(a.stream, cf, a.in<bf16_bits>(Role::gu), a.in<bf16_bits>(Role::gu) + cf, a.out<bf16_bits>(Role::a));
}

// ---- backward -----------------------------------------------------------------------------------------------
void residual2_bwd(const Args& a, const Dims& d) {  // the output's gradient flows into the MLP branch and the residual
  const OwnRows r = own_rows(a, d);
  a.dev->copy(a.stream, r.out(a, Role::dm), r.in(a, Role::dx), r.count * 2);
  a.dev->copy(a.stream, r.out(a, Role::dh1), r.in(a, Role::dx), r.count * 2);
}
void residual1_bwd(const Args& a, const Dims& d) {
  const OwnRows r = own_rows(a, d);
  a.dev->copy(a.stream, r.out(a, Role::dp), r.in(a, Role::dh1), r.count * 2);
}
void swiglu_bwd(const Args& a, const Dims& d) {
  const std::int64_t cf = d.cf;
  const bf16_bits* gu = a.in<bf16_bits>(Role::gu);
  bf16_bits* dgu = a.out<bf16_bits>(Role::dgu);
  a.dev->swiglu_backward(a.stream, cf, gu, gu + cf, a.in<bf16_bits>(Role::da), dgu, dgu + cf);
}
void norm2_bwd(const Args& a, const Dims& d) {  // dh1 += norm2's input gradient
  const OwnRows r = own_rows(a, d);
  const DeviceParameter& w = a.weights(LayerWeight::norm2);
  auto* dx = a.scratch<bf16_bits>(r.count);
  a.dev->rmsnorm_backward(a.stream, r.rows, d.h, d.eps, r.in(a, Role::h1), w.weight, r.in(a, Role::dn2), dx, w.grad);
  a.dev->add(a.stream, r.count, dx, r.out(a, Role::dh1), r.out(a, Role::dh1));
  a.release(dx);
}
void norm1_bwd(const Args& a, const Dims& d) {  // dx = norm1's input gradient + the residual's dh1
  const OwnRows r = own_rows(a, d);
  const DeviceParameter& w = a.weights(LayerWeight::norm1);
  a.dev->rmsnorm_backward(a.stream, r.rows, d.h, d.eps, r.in(a, Role::x), w.weight, r.in(a, Role::dn1), r.out(a, Role::dx), w.grad);
  a.dev->add(a.stream, r.count, r.out(a, Role::dx), r.in(a, Role::dh1), r.out(a, Role::dx));
}
void attention_bwd(const Args& a, const Dims& d) {
  const sim::Op& op = *a.op;
  float* dq = a.out<float>(Role::dq);
  float* delta = a.out<float>(Role::delta);
  if (starts_accumulation(op)) {  // the diagonal starts dQ and computes D = rowsum(dO * O)
    a.dev->fill(a.stream, dq, 0, d.cq * 4);
    a.dev->attention_backward_prep(a.stream, d.chunk_tokens, d.H, d.D, a.in<bf16_bits>(Role::o), a.in<bf16_bits>(Role::d_o), delta);
  }
  for (int j = op.kv_first; j <= op.kv_last; ++j) {
    float* dkv = a.out<float>(Role::dkv, j);
    a.dev->attention_backward(a.stream, pair(a, j), a.in<bf16_bits>(Role::q), a.in<bf16_bits>(Role::k, j), a.in<bf16_bits>(Role::v, j),
                              a.in<bf16_bits>(Role::d_o), a.in<float>(Role::lse), delta, dq, dkv, dkv + d.ckv);
  }
}
void dkv_add(const Args& a, const Dims& d) {  // the ring's dK | dV for a chunk into this rank's own (zeroed first where it had none)
  const std::int64_t ckv = d.ckv;
  for (int j = a.op->kv_first; j <= a.op->kv_last; ++j)
    a.dev->axpy_f32(a.stream, 2 * ckv, 1.0f, a.in<float>(Role::dkv_in, j), a.out<float>(Role::dkv, j));
}
void rope_bwd(const Args& a, const Dims& d) {  // dQKV (bf16 dQ | dK | dV) from the fp32 dQ and dK | dV, then RoPE undone on dQ and dK
  const std::int64_t offset = a.op->chunk * a.chunk_tokens;
  bf16_bits* dqkv = a.out<bf16_bits>(Role::dqkv);
  a.dev->to_bf16(a.stream, a.in<float>(Role::dq), dqkv, d.cq);
  a.dev->to_bf16(a.stream, a.in<float>(Role::dkv), dqkv + d.cq, 2 * d.ckv);
  a.dev->rope(a.stream, d.chunk_tokens, d.H, d.D, offset, d.rope_theta, true, dqkv);
  a.dev->rope(a.stream, d.chunk_tokens, d.KV, d.D, offset, d.rope_theta, true, dqkv + d.cq);
}
void embed_bwd(const Args& a, const Dims& d) {
  a.dev->embedding_backward(a.stream, d.chunk_tokens, d.h, a.tokens, a.in<bf16_bits>(Role::dx), a.embedding->grad);
}

// ---- the LM head on rows [row_begin, row_end) of the chunk ----------------------------------------------------
int head_rows(const Args& a) { return a.op->row_end - a.op->row_begin; }
void head_logits(const Args& a, const Dims& d) {
  const bf16_bits* x = a.in<bf16_bits>(Role::x) + static_cast<std::int64_t>(a.op->row_begin) * d.h;
  a.dev->rmsnorm_forward(a.stream, head_rows(a), d.h, d.eps, x, a.final_norm->weight, a.out<bf16_bits>(Role::nf));
  forward(a, head_rows(a), d.h, d.vocab, a.out<bf16_bits>(Role::nf), a.lm_head->weight, a.out<bf16_bits>(Role::logits));
}
void head_xent(const Args& a, const Dims& d) {
  const int rows = head_rows(a);
  const std::int32_t* targets = a.tokens + a.op->row_begin + 1;
  auto* lse = a.scratch<float>(rows);
  a.dev->cross_entropy_forward(a.stream, rows, d.vocab, a.in<bf16_bits>(Role::logits), targets, a.losses + a.op->row_begin, lse);
  a.dev->cross_entropy_backward(a.stream, rows, d.vocab, a.in<bf16_bits>(Role::logits), targets, lse, a.dloss, a.out<bf16_bits>(Role::dlogits));
  a.release(lse);
}
void head_dgrad(const Args& a, const Dims& d) {  // fills rows [row_begin, row_end) of dx
  const int rows = head_rows(a);
  auto* dnf = a.scratch<bf16_bits>(static_cast<std::int64_t>(rows) * d.h);
  dgrad(a, rows, d.h, d.vocab, a.in<bf16_bits>(Role::dlogits), a.lm_head->weight, dnf);
  const std::int64_t at = static_cast<std::int64_t>(a.op->row_begin) * d.h;
  a.dev->rmsnorm_backward(a.stream, rows, d.h, d.eps, a.in<bf16_bits>(Role::x) + at, a.final_norm->weight, dnf, a.out<bf16_bits>(Role::dx) + at,
                          a.final_norm->grad);
  a.release(dnf);
}
void head_wgrad(const Args& a, const Dims& d) {
  wgrad(a, head_rows(a), d.h, d.vocab, a.in<bf16_bits>(Role::dlogits), a.in<bf16_bits>(Role::nf), a.lm_head->grad);
}

// ---- the vocab-parallel LM head (tensor parallelism): `vocab` is this rank's shard, token ids its own -----------
void head_xent_shard(const Args& a, const Dims& d) {  // this shard's block of the statistics: its lse, then the loss against its target logit
  const int rows = head_rows(a);
  float* block = a.out<float>(Role::xstats) + static_cast<std::int64_t>(a.shard) * 2 * rows;
  a.dev->cross_entropy_forward(a.stream, rows, d.vocab, a.in<bf16_bits>(Role::logits), a.tokens + a.op->row_begin + 1, block + rows, block);
}
void head_xent_merge(const Args& a, const Dims& d) {
  const int rows = head_rows(a);
  auto* lse = a.scratch<float>(rows);
  a.dev->vocab_parallel_merge(a.stream, rows, a.shards, a.in<float>(Role::xstats), a.losses + a.op->row_begin, lse);
  a.dev->cross_entropy_backward(a.stream, rows, d.vocab, a.in<bf16_bits>(Role::logits), a.tokens + a.op->row_begin + 1, lse, a.dloss,
                                a.out<bf16_bits>(Role::dlogits));
  a.release(lse);
}
void head_dgrad_shard(const Args& a, const Dims& d) {
  dgrad(a, head_rows(a), d.h, d.vocab, a.in<bf16_bits>(Role::dlogits), a.lm_head->weight, a.out<bf16_bits>(Role::dnf));
}
void head_norm_bwd(const Args& a, const Dims& d) {  // fills rows [row_begin, row_end) of dx from the summed dNF (under SP: this rank's of them)
  const sim::Op& op = *a.op;
  const int first = a.sequence_parallel ? std::max(op.row_begin, a.shard * d.chunk_tokens / a.shards) : op.row_begin;
  const int past = a.sequence_parallel ? std::min(op.row_end, (a.shard + 1) * d.chunk_tokens / a.shards) : op.row_end;
  if (past <= first) return;
  const std::int64_t row = static_cast<std::int64_t>(first) * d.h;
  a.dev->rmsnorm_backward(a.stream, past - first, d.h, d.eps, a.in<bf16_bits>(Role::x) + row, a.final_norm->weight,
                          a.in<bf16_bits>(Role::dnf) + static_cast<std::int64_t>(first - op.row_begin) * d.h, a.out<bf16_bits>(Role::dx) + row,
                          a.final_norm->grad);
}

using DeviceOp = void (*)(const Args&, const Dims&);
DeviceOp device_op(OpCode code) {
  if (linear_spec(code)) return linear;
  switch (code) {
    case OpCode::embed: return embed;
    case OpCode::norm1:
    case OpCode::norm2: return norm;
    case OpCode::rope: return rope;
    case OpCode::attn: return attention;
    case OpCode::attn_merge: return attention_merge;
    case OpCode::residual1:
    case OpCode::residual2: return residual;
    case OpCode::act: return swiglu;
    case OpCode::residual2_bwd: return residual2_bwd;
    case OpCode::act_bwd: return swiglu_bwd;
    case OpCode::norm2_bwd: return norm2_bwd;
    case OpCode::residual1_bwd: return residual1_bwd;
    case OpCode::attn_bwd: return attention_bwd;
    case OpCode::dkv_add: return dkv_add;
    case OpCode::rope_bwd: return rope_bwd;
    case OpCode::norm1_bwd: return norm1_bwd;
    case OpCode::embed_bwd: return embed_bwd;
    case OpCode::head_logits: return head_logits;
    case OpCode::head_xent: return head_xent;
    case OpCode::head_dgrad: return head_dgrad;
    case OpCode::head_wgrad: return head_wgrad;
    case OpCode::head_xent_shard: return head_xent_shard;
    case OpCode::head_xent_merge: return head_xent_merge;
    case OpCode::head_dgrad_shard: return head_dgrad_shard;
    case OpCode::head_norm_bwd: return head_norm_bwd;
    default: return nullptr;
  }
}

}  // namespace

void run_device_op(const DeviceOpArgs& args) {
  const sim::Op& op = *args.op;
  const DeviceOp run = device_op(op.code);
  if (!run) throw InternalError("op " + std::string(sim::to_string(op.code)) + " is not one the executor runs", __FILE__, __LINE__);
  const bool in_a_layer = !op.is_lm_head() && op.code != OpCode::embed && op.code != OpCode::embed_bwd;
  if (in_a_layer && (op.layer < 0 || op.layer >= args.model->layers)) {
    throw InternalError("op " + std::string(sim::to_string(op.code)) + " on layer " + std::to_string(op.layer), __FILE__, __LINE__);
  }
  const Dims d(args);
  run(args, d);
}

}  // namespace trainyard::backend
