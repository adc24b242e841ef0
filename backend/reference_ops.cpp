#include "backend/reference_ops.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>

#include "common/error.hpp"

namespace trainyard::backend {

namespace {

using sim::OpCode;
using Args = ReferenceOpArgs;

const model::ModelConfig& model(const Args& a) { return a.state->model(); }
std::int64_t chunk(const Args& a) { return a.chunk_tokens; }
LayerParameters& layer(const Args& a) { return a.state->layers()[a.op->layer]; }
float eps(const Args& a) { return static_cast<float>(model(a).norm_epsilon); }
float rope_theta(const Args& a) { return static_cast<float>(model(a).rope_theta.value_or(0)); }  // ModelState refuses a model without one
// The token rows of the running task's GEMM: `rows` (the op's), or a zigzag or run task's (all its chunks).
std::int64_t task_rows(const Args& a, std::int64_t rows) { return a.task_rows >= 0 ? a.task_rows : rows; }

std::vector<float> rounded(const Args& a, std::vector<float> x) {
  if (a.emulate_bf16) {
    for (float& v : x) v = kernels::round_bf16(v);
  }
  return x;
}

std::int32_t token(const Args& a, std::int64_t position) {
  const auto& t = a.tokens[a.op->seq];
  TRAINYARD_CHECK(position >= 0 && position < static_cast<std::int64_t>(t.size()), "token position inside the sequence");
  const std::int32_t id = t[position];
  TRAINYARD_CHECK(id >= 0 && id < model(a).vocab, "token id inside the vocabulary");
  return id;
}

static_assert(std::tuple_size_v<decltype(std::declval<LayerParameters&>().in_order())> == kLayerWeights, "LayerWeight counts in_order()");
Parameter& weight_of(LayerParameters& l, LayerWeight w) { return *l.in_order()[static_cast<std::size_t>(w)]; }

// y[rows][out] = x[rows][in] W^T, W [out][in].
std::vector<float> times_transposed(const std::vector<float>& x, const std::vector<float>& w, std::int64_t rows, std::int64_t in, std::int64_t out) {
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  kernels::gemm_ref(static_cast<int>(rows), static_cast<int>(out), static_cast<int>(in), x, false, w, true, y, 1, 0);
  return y;
}
// dx[rows][in] = dy[rows][out] W.
std::vector<float> input_gradient(const std::vector<float>& dy, const std::vector<float>& w, std::int64_t rows, std::int64_t in, std::int64_t out) {
  std::vector<float> dx(static_cast<std::size_t>(rows * in));
  kernels::gemm_ref(static_cast<int>(rows), static_cast<int>(in), static_cast<int>(out), dy, false, w, false, dx, 1, 0);
  return dx;
}
// dW[out][in] += dy^T x.
void add_weight_gradient(const std::vector<float>& dy, const std::vector<float>& x, std::vector<float>& dw, std::int64_t rows, std::int64_t in,
                         std::int64_t out) {
  kernels::gemm_ref(static_cast<int>(out), static_cast<int>(in), static_cast<int>(rows), dy, true, x, false, dw, 1, 1);
}

// Columns [first, first + width) of every row of a [rows][row_width] matrix.
std::vector<float> columns(const std::vector<float>& y, std::int64_t row_width, std::int64_t first, std::int64_t width) {
  const std::int64_t rows = static_cast<std::int64_t>(y.size()) / row_width;
  std::vector<float> out(static_cast<std::size_t>(rows * width));
  for (std::int64_t r = 0; r < rows; ++r) std::copy_n(y.begin() + r * row_width + first, width, out.begin() + r * width);
  return out;
}

// ---- the layer's linear maps (LinearSpec): one GEMM over all W's rows; blocks are column ranges of each row -------
void linear(const Args& a) {
  const LinearSpec& l = *linear_spec(a.op->code);
  const model::ModelConfig mm = model_of(*a.op, model(a));
  const std::int64_t c = chunk(a), in = width_elements(l.in, mm);
  std::vector<std::int64_t> widths;
  for (Width w : l.out) widths.push_back(width_elements(w, mm));
  const std::int64_t out = std::accumulate(widths.begin(), widths.end(), std::int64_t{0});
  Parameter& w = weight_of(layer(a), l.weight);
  if (a.op->code == l.forward) {
    a.task->expect_gemm(task_rows(a, c), out, in);
    const std::vector<float> y = times_transposed(a.task->in(l.x), w.weight, c, in, out);
    if (l.y.size() == 1) return a.task->out(l.y.front(), rounded(a, y));
    std::int64_t first = 0;
    for (std::size_t b = 0; b < l.y.size(); first += widths[b], ++b) a.task->out(l.y[b], rounded(a, columns(y, out, first, widths[b])));
  } else if (a.op->code == l.dgrad) {
    a.task->expect_gemm(task_rows(a, c), in, out);
    a.task->out(l.dx, rounded(a, input_gradient(a.task->in(l.dy), w.weight, c, in, out)));
  } else {
    a.task->expect_gemm(in, out, task_rows(a, c));
    add_weight_gradient(a.task->in(l.dy), a.task->in(l.x), w.grad, c, in, out);
    a.task->wrote_gradients(a.op->layer);
  }
}

// ---- forward ------------------------------------------------------------------------------------------------
void embed(const Args& a) {
  const std::int64_t c = chunk(a), h = model(a).hidden;
  std::vector<float> x(static_cast<std::size_t>(c * h));
  const auto& e = a.state->embedding().weight;
  for (std::int64_t r = 0; r < c; ++r) std::copy_n(e.begin() + token(a, a.op->chunk * c + r) * h, h, x.begin() + r * h);
  a.task->out(Role::x, std::move(x));
}
void norm(const Args& a) {
  const bool first = a.op->code == OpCode::norm1;
  const auto& x = a.task->in(first ? Role::x : Role::h1);
  std::vector<float> y(x.size());
  kernels::rmsnorm_forward_ref(static_cast<int>(chunk(a)), static_cast<int>(model(a).hidden), eps(a), x,
                               weight_of(layer(a), first ? LayerWeight::norm1 : LayerWeight::norm2).weight, y);
  a.task->out(first ? Role::n1 : Role::n2, rounded(a, std::move(y)));
}
void rope(const Args& a) {
  const model::ModelConfig mm = model_of(*a.op, model(a));
  const auto c = static_cast<int>(chunk(a));
  const int D = static_cast<int>(mm.head_dim);
  std::vector<float> qs = a.task->in(Role::q), ks = a.task->in(Role::k);
  kernels::rope_ref(c, static_cast<int>(mm.heads), D, a.op->chunk * chunk(a), rope_theta(a), false, qs);
  kernels::rope_ref(c, static_cast<int>(model(a).kv_heads), D, a.op->chunk * chunk(a), rope_theta(a), false, ks);
  a.task->out(Role::q, rounded(a, std::move(qs)));
  a.task->out(Role::k, rounded(a, std::move(ks)));
}
// K and V of chunks kv_first..kv_last of a layer, one after another.
std::pair<std::vector<float>, std::vector<float>> gather_kv(const Args& a) {
  std::vector<float> k, v;
  for (int j = a.op->kv_first; j <= a.op->kv_last; ++j) {
    const auto& kj = a.task->in(Role::k, j);
    k.insert(k.end(), kj.begin(), kj.end());
    const auto& vj = a.task->in(Role::v, j);
    v.insert(v.end(), vj.begin(), vj.end());
  }
  return {std::move(k), std::move(v)};
}
// What both attention directions start from, once the graph's attention is checked against the op: the op's
// head group's widths and its K/V chunks laid end to end.
struct AttentionInputs {
  model::ModelConfig mm;
  std::int64_t c;
  int H, D;
  std::vector<float> k, v;
};
AttentionInputs attention_inputs(const Args& a) {
  a.task->expect_attention(*a.op);
  AttentionInputs in{model_of(*a.op, model(a)), chunk(a), 0, 0, {}, {}};
  in.H = static_cast<int>(in.mm.heads);
  in.D = static_cast<int>(in.mm.head_dim);
  std::tie(in.k, in.v) = gather_kv(a);
  return in;
}
void attention(const Args& a) {
  const sim::Op& op = *a.op;
  const auto [mm, c, H, D, k, v] = attention_inputs(a);
  std::vector<float> o_part(static_cast<std::size_t>(c * mm.q_dim())), lse_part(static_cast<std::size_t>(H * c));
  kernels::attention_forward_ref(attention_shape(op, model(a), c), a.task->in(Role::q), k, v, o_part, lse_part);
  o_part = rounded(a, std::move(o_part));  // partials are written in bf16
  std::vector<float> o_run(o_part.size(), 0.0f), lse(lse_part.size(), -std::numeric_limits<float>::infinity());
  if (!starts_accumulation(op)) {  // not the diagonal (which comes first): fold into the running state
    o_run = a.task->in(Role::o_run);
    lse = a.task->in(Role::lse);
  }
  kernels::attention_merge_ref(static_cast<int>(c), H, D, o_run, lse, o_part, lse_part);
  a.task->out(Role::o, rounded(a, o_run));
  a.task->out(Role::o_run, std::move(o_run));
  a.task->out(Role::lse, std::move(lse));
}
void attention_merge(const Args& a) { a.task->out(Role::o, rounded(a, a.task->in(Role::o_run))); }
void residual(const Args& a) {
  const bool first = a.op->code == OpCode::residual1;
  std::vector<float> y = a.task->in(first ? Role::x : Role::h1);
  const auto& branch = a.task->in(first ? Role::p : Role::mo);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += branch[i];
  a.task->out(first ? Role::h1 : Role::x, rounded(a, std::move(y)));  // residual2: the next layer's input (layer L's: the final hidden state)
}
void swiglu(const Args& a) {
  const std::int64_t f = model(a).ffn_hidden;
  const auto& gu = a.task->in(Role::gu);
  const std::vector<float> gate = columns(gu, 2 * f, 0, f), up = columns(gu, 2 * f, f, f);
  std::vector<float> y(gate.size());
  kernels::swiglu_forward_ref(gate, up, y);
  a.task->out(Role::a, rounded(a, std::move(y)));
}

// ---- backward -----------------------------------------------------------------------------------------------
void residual2_bwd(const Args& a) {  // the output's gradient flows into the MLP branch and the residual
  std::vector<float> g = a.task->in(Role::dx);
  a.task->out(Role::dm, g);
  a.task->out(Role::dh1, std::move(g));
}
void residual1_bwd(const Args& a) { a.task->out(Role::dp, a.task->in(Role::dh1)); }
void swiglu_bwd(const Args& a) {
  const std::int64_t c = chunk(a), f = model(a).ffn_hidden;
  const auto& gu = a.task->in(Role::gu);
  const std::vector<float> gate = columns(gu, 2 * f, 0, f), up = columns(gu, 2 * f, f, f);
  std::vector<float> d_gate(gate.size()), d_up(up.size());
  kernels::swiglu_backward_ref(gate, up, a.task->in(Role::da), d_gate, d_up);
  std::vector<float> dgu(static_cast<std::size_t>(c * 2 * f));
  for (std::int64_t r = 0; r < c; ++r) {
    std::copy_n(d_gate.begin() + r * f, f, dgu.begin() + r * 2 * f);
    std::copy_n(d_up.begin() + r * f, f, dgu.begin() + r * 2 * f + f);
  }
  a.task->out(Role::dgu, rounded(a, std::move(dgu)));
}
void norm_bwd(const Args& a) {  // the norm's input gradient plus the residual's share (dh1)
  const bool second = a.op->code == OpCode::norm2_bwd;
  const auto& x = a.task->in(second ? Role::h1 : Role::x);
  std::vector<float> dx(x.size());
  Parameter& w = weight_of(layer(a), second ? LayerWeight::norm2 : LayerWeight::norm1);
  kernels::rmsnorm_backward_ref(static_cast<int>(chunk(a)), static_cast<int>(model(a).hidden), eps(a), x, w.weight,
                                a.task->in(second ? Role::dn2 : Role::dn1), dx, w.grad);
  a.task->wrote_gradients(a.op->layer);
  const auto& skip = a.task->in(Role::dh1);
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += skip[i];
  a.task->out(second ? Role::dh1 : Role::dx, rounded(a, std::move(dx)));
}
// Adds each K/V chunk's share of dK | dV into its fp32 accumulator (zero where nothing has added yet).
void add_to_accumulators(const Args& a, const std::vector<float>& dk, const std::vector<float>& dv, std::size_t chunk_kv) {
  for (int j = a.op->kv_first; j <= a.op->kv_last; ++j) {
    std::vector<float> sum = a.task->holds(Role::dkv, j) ? a.task->in(Role::dkv, j) : std::vector<float>(2 * chunk_kv, 0.0f);
    const std::size_t at = static_cast<std::size_t>(j - a.op->kv_first) * chunk_kv;
    for (std::size_t i = 0; i < chunk_kv; ++i) {
      sum[i] += dk[at + i];
      sum[chunk_kv + i] += dv[at + i];
    }
    a.task->out(Role::dkv, std::move(sum), j);
  }
}
void attention_bwd(const Args& a) {
  const sim::Op& op = *a.op;
  const auto [mm, c, H, D, k, v] = attention_inputs(a);
  std::vector<float> dq(static_cast<std::size_t>(c * mm.q_dim()), 0.0f), delta(static_cast<std::size_t>(H * c));
  if (starts_accumulation(op)) {  // the diagonal comes first: it starts dQ and computes D = rowsum(dO * O)
    kernels::attention_backward_prep_ref(static_cast<int>(c), H, D, a.task->in(Role::o), a.task->in(Role::d_o), delta);
  } else {
    dq = a.task->in(Role::dq);
    delta = a.task->in(Role::delta);
  }
  std::vector<float> dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  kernels::attention_backward_ref(attention_shape(op, model(a), c), a.task->in(Role::q), k, v, a.task->in(Role::d_o), a.task->in(Role::lse), delta,
                                  dq, dk, dv);
  add_to_accumulators(a, dk, dv, static_cast<std::size_t>(c * mm.kv_dim()));
  a.task->out(Role::dq, std::move(dq));
  a.task->out(Role::delta, std::move(delta));
}
void dkv_add(const Args& a) {  // a ring-attention rank's own share of dK | dV plus what the ring brought
  for (int j = a.op->kv_first; j <= a.op->kv_last; ++j) {
    std::vector<float> sum = a.task->in(Role::dkv_in, j);
    if (a.task->holds(Role::dkv, j)) {
      const auto& mine = a.task->in(Role::dkv, j);
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += mine[i];
    }
    a.task->out(Role::dkv, std::move(sum), j);
  }
}
void rope_bwd(const Args& a) {  // undo RoPE on dQ and this chunk's (now complete) dK; dV passes through
  const model::ModelConfig mm = model_of(*a.op, model(a));
  const std::int64_t c = chunk(a), q = mm.q_dim(), kv = mm.kv_dim();
  const int D = static_cast<int>(mm.head_dim);
  std::vector<float> dq = a.task->in(Role::dq);
  const auto& acc = a.task->in(Role::dkv);
  const auto chunk_kv = static_cast<std::size_t>(c * kv);
  std::vector<float> dk(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(chunk_kv));
  kernels::rope_ref(static_cast<int>(c), static_cast<int>(mm.heads), D, a.op->chunk * c, rope_theta(a), true, dq);
  kernels::rope_ref(static_cast<int>(c), static_cast<int>(model(a).kv_heads), D, a.op->chunk * c, rope_theta(a), true, dk);
  std::vector<float> dqkv(static_cast<std::size_t>(c * (q + 2 * kv)));
  for (std::int64_t r = 0; r < c; ++r) {
    auto row = dqkv.begin() + r * (q + 2 * kv);
    std::copy_n(dq.begin() + r * q, q, row);
    std::copy_n(dk.begin() + r * kv, kv, row + q);
    std::copy_n(acc.begin() + static_cast<std::ptrdiff_t>(chunk_kv) + r * kv, kv, row + q + kv);
  }
  a.task->out(Role::dqkv, rounded(a, std::move(dqkv)));
}
void embed_bwd(const Args& a) {
  const std::int64_t c = chunk(a), h = model(a).hidden;
  const auto& dx = a.task->in(Role::dx);
  auto& de = a.state->embedding().grad;
  for (std::int64_t r = 0; r < c; ++r) {
    const std::int64_t row = token(a, a.op->chunk * c + r);
    for (std::int64_t i = 0; i < h; ++i) de[row * h + i] += dx[r * h + i];
  }
  a.task->wrote_gradients(kEmbeddingGroup);
}

// ---- the LM head: final norm, logits, cross-entropy and their backward, on rows [row_begin, row_end) ------------
std::int64_t head_rows(const Args& a) {
  const std::int64_t rows = a.op->row_end - a.op->row_begin;
  if (a.op->row_begin < 0 || rows <= 0 || a.op->row_end > chunk(a)) a.task->fail("LM head rows outside the chunk");
  return rows;
}
std::vector<float> hidden_rows(const Args& a) {
  const std::int64_t h = model(a).hidden;
  const auto& x = a.task->in(Role::x);
  return std::vector<float>(x.begin() + a.op->row_begin * h, x.begin() + a.op->row_end * h);
}
void head_logits(const Args& a) {
  const std::int64_t h = model(a).hidden, vocab = model(a).vocab, rows = head_rows(a);
  a.task->expect_gemm(task_rows(a, rows), vocab, h);
  std::vector<float> nf(static_cast<std::size_t>(rows * h));
  kernels::rmsnorm_forward_ref(static_cast<int>(rows), static_cast<int>(h), eps(a), hidden_rows(a), a.state->final_norm().weight, nf);
  nf = rounded(a, std::move(nf));
  a.task->out(Role::logits,
              rounded(a, times_transposed(nf, a.state->lm_head().weight, rows, h, vocab)));  // bf16, as the GPU's loss kernels read them
  a.task->out(Role::nf, std::move(nf));
}
void head_xent(const Args& a) {
  const std::int64_t vocab = model(a).vocab, rows = head_rows(a);
  const auto& logits = a.task->in(Role::logits);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) targets[r] = token(a, a.op->chunk * chunk(a) + a.op->row_begin + r + 1);
  std::vector<float> loss(static_cast<std::size_t>(rows)), lse(static_cast<std::size_t>(rows));
  kernels::cross_entropy_forward_ref(static_cast<int>(rows), static_cast<int>(vocab), logits, targets, loss, lse);
  for (float l : loss) *a.loss_sum += l;
  *a.loss_rows += rows;
  // The step's loss is the mean over all its tokens: each token's loss has weight 1 / tokens.
  const std::vector<float> dloss(static_cast<std::size_t>(rows), 1.0f / static_cast<float>(a.step_tokens));
  std::vector<float> dlogits(logits.size());
  kernels::cross_entropy_backward_ref(static_cast<int>(rows), static_cast<int>(vocab), logits, targets, lse, dloss, dlogits);
  a.task->out(Role::dlogits, rounded(a, std::move(dlogits)));
}
void head_dgrad(const Args& a) {  // fills rows [row_begin, row_end) of dx
  const std::int64_t h = model(a).hidden, vocab = model(a).vocab, rows = head_rows(a);
  a.task->expect_gemm(task_rows(a, rows), h, vocab);
  const auto dnf = rounded(a, input_gradient(a.task->in(Role::dlogits), a.state->lm_head().weight, rows, h, vocab));
  std::vector<float> dx_rows(static_cast<std::size_t>(rows * h));
  Parameter& final_norm = a.state->final_norm();
  kernels::rmsnorm_backward_ref(static_cast<int>(rows), static_cast<int>(h), eps(a), hidden_rows(a), final_norm.weight, dnf, dx_rows,
                                final_norm.grad);
  a.task->wrote_gradients(kHeadGroup);
  std::vector<float> dx = starts_accumulation(*a.op) ? std::vector<float>(static_cast<std::size_t>(chunk(a) * h), 0.0f) : a.task->in(Role::dx);
  std::copy(dx_rows.begin(), dx_rows.end(), dx.begin() + a.op->row_begin * h);
  a.task->out(Role::dx, rounded(a, std::move(dx)));
}
void head_wgrad(const Args& a) {
  const std::int64_t h = model(a).hidden, vocab = model(a).vocab, rows = head_rows(a);
  a.task->expect_gemm(h, vocab, task_rows(a, rows));
  add_weight_gradient(a.task->in(Role::dlogits), a.task->in(Role::nf), a.state->lm_head().grad, rows, h, vocab);
  a.task->wrote_gradients(model(a).tied_embeddings ? kEmbeddingGroup : kHeadGroup);
}

using ReferenceOp = void (*)(const Args&);
ReferenceOp reference_op(OpCode code) {
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
    case OpCode::norm2_bwd:
    case OpCode::norm1_bwd: return norm_bwd;
    case OpCode::residual1_bwd: return residual1_bwd;
    case OpCode::attn_bwd: return attention_bwd;
    case OpCode::dkv_add: return dkv_add;
    case OpCode::rope_bwd: return rope_bwd;
    case OpCode::embed_bwd: return embed_bwd;
    case OpCode::head_logits: return head_logits;
    case OpCode::head_xent: return head_xent;
    case OpCode::head_dgrad: return head_dgrad;
    case OpCode::head_wgrad: return head_wgrad;
    default: return nullptr;
  }
}

}  // namespace

void run_reference_op(const ReferenceOpArgs& args) {
  const ReferenceOp run = reference_op(args.op->code);
  if (!run) args.task->fail("op " + std::string(sim::to_string(args.op->code)) + " is not one the executor runs");
  run(args);
}

}  // namespace trainyard::backend
