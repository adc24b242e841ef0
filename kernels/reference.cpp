#include "kernels/reference.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "common/error.hpp"
#include "common/thread_pool.hpp"

namespace trainyard::kernels {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::size_t at(std::size_t row, std::size_t head, std::size_t dim, std::size_t heads, std::size_t d) { return (row * heads + head) * d + dim; }

void check_attention(const AttentionShape& s, std::size_t q, std::size_t kv) {
  TRAINYARD_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0, "attention heads");
  TRAINYARD_CHECK(q == static_cast<std::size_t>(s.q_len) * static_cast<std::size_t>(s.heads * s.head_dim), "q size");
  TRAINYARD_CHECK(kv == static_cast<std::size_t>(s.kv_len) * static_cast<std::size_t>(s.kv_heads * s.head_dim), "k/v size");
}

bool visible(const AttentionShape& s, int i, int j) { return !s.causal || s.kv_offset + j <= s.q_offset + i; }

double silu(double g) { return g / (1 + std::exp(-g)); }

}  // namespace

std::uint16_t to_bf16(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);  // stays a (quiet) NaN
  const std::uint32_t rounding = 0x7fff + ((bits >> 16) & 1);                 // to nearest, ties to even
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float from_bf16(std::uint16_t x) { return std::bit_cast<float>(static_cast<std::uint32_t>(x) << 16); }

float AttentionShape::scale() const { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))); }

void attention_forward_ref(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v, std::span<float> o,
                           std::span<float> lse) {
  check_attention(s, q.size(), k.size());
  const auto H = static_cast<std::size_t>(s.heads), KH = static_cast<std::size_t>(s.kv_heads), D = static_cast<std::size_t>(s.head_dim);
  const std::size_t group = H / KH;
  const double scale = s.scale();
  std::vector<double> score(static_cast<std::size_t>(s.kv_len));
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t kh = h / group;
    for (int i = 0; i < s.q_len; ++i) {
      double best = kNegInf;
      for (int j = 0; j < s.kv_len; ++j) {
        double dot = 0;
        for (std::size_t d = 0; d < D; ++d) {
          dot += static_cast<double>(q[at(static_cast<std::size_t>(i), h, d, H, D)]) * k[at(static_cast<std::size_t>(j), kh, d, KH, D)];
        }
        score[j] = visible(s, i, j) ? dot * scale : kNegInf;
        best = std::max(best, score[j]);
      }
      double sum = 0;
      for (int j = 0; j < s.kv_len; ++j) sum += best == kNegInf ? 0 : std::exp(score[j] - best);
      for (std::size_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j < s.kv_len && sum > 0; ++j) {
          acc += std::exp(score[j] - best) * v[at(static_cast<std::size_t>(j), kh, d, KH, D)];
        }
        o[at(static_cast<std::size_t>(i), h, d, H, D)] = sum > 0 ? static_cast<float>(acc / sum) : 0.0f;
      }
      lse[h * static_cast<std::size_t>(s.q_len) + static_cast<std::size_t>(i)] = sum > 0 ? static_cast<float>(best + std::log(sum))
                                                                                         : -std::numeric_limits<float>::infinity();
    }
  }
}

void attention_merge_ref(int q_len, int heads, int head_dim, std::span<float> o_acc, std::span<float> lse_acc, std::span<const float> o_part,
                         std::span<const float> lse_part) {
  const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
  for (std::size_t h = 0; h < H; ++h) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(q_len); ++i) {
      const std::size_t li = h * static_cast<std::size_t>(q_len) + i;
      const double a = lse_acc[li], b = lse_part[li];
      const double top = std::max(a, b);
      if (top == kNegInf) continue;  // neither side saw a key
      const double wa = a == kNegInf ? 0 : std::exp(a - top), wb = b == kNegInf ? 0 : std::exp(b - top);
      const double total = wa + wb;
      for (std::size_t d = 0; d < D; ++d) {
        const std::size_t oi = at(i, h, d, H, D);
        o_acc[oi] = static_cast<float>((wa * o_acc[oi] + wb * o_part[oi]) / total);
      }
      lse_acc[li] = static_cast<float>(top + std::log(total));
    }
  }
}

void attention_backward_prep_ref(int q_len, int heads, int head_dim, std::span<const float> o, std::span<const float> d_o, std::span<float> delta) {
  const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim);
  for (std::size_t h = 0; h < H; ++h) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(q_len); ++i) {
      double sum = 0;
      for (std::size_t d = 0; d < D; ++d) sum += static_cast<double>(o[at(i, h, d, H, D)]) * d_o[at(i, h, d, H, D)];
      delta[h * static_cast<std::size_t>(q_len) + i] = static_cast<float>(sum);
    }
  }
}

void attention_backward_ref(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                            std::span<const float> d_o, std::span<const float> lse, std::span<const float> delta, std::span<float> dq,
                            std::span<float> dk, std::span<float> dv) {
  check_attention(s, q.size(), k.size());
  const auto H = static_cast<std::size_t>(s.heads), KH = static_cast<std::size_t>(s.kv_heads), D = static_cast<std::size_t>(s.head_dim);
  const std::size_t group = H / KH;
  const double scale = s.scale();
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t kh = h / group;
    for (int i = 0; i < s.q_len; ++i) {
      const std::size_t ii = static_cast<std::size_t>(i);
      const double l = lse[h * static_cast<std::size_t>(s.q_len) + ii];
      if (l == kNegInf) continue;
      const double di = delta[h * static_cast<std::size_t>(s.q_len) + ii];
      for (int j = 0; j < s.kv_len; ++j) {
        if (!visible(s, i, j)) continue;
        const std::size_t jj = static_cast<std::size_t>(j);
        double dot = 0, dp = 0;
        for (std::size_t d = 0; d < D; ++d) {
          dot += static_cast<double>(q[at(ii, h, d, H, D)]) * k[at(jj, kh, d, KH, D)];
          dp += static_cast<double>(d_o[at(ii, h, d, H, D)]) * v[at(jj, kh, d, KH, D)];
        }
        const double p = std::exp(dot * scale - l);
        const double ds = p * (dp - di) * scale;
        for (std::size_t d = 0; d < D; ++d) {
          dv[at(jj, kh, d, KH, D)] += static_cast<float>(p * d_o[at(ii, h, d, H, D)]);
          dq[at(ii, h, d, H, D)] += static_cast<float>(ds * k[at(jj, kh, d, KH, D)]);
          dk[at(jj, kh, d, KH, D)] += static_cast<float>(ds * q[at(ii, h, d, H, D)]);
        }
      }
    }
  }
}

namespace {

// Probabilities of one chunk pair as the naive bf16 path has them: P[h][i][j] (0 where masked), with the scores
// rounded after the matmul and after the scale, P after the softmax. lse_out receives the fp32 lse when given;
// otherwise `lse_in` (the forward's) normalises, as a recomputing backward does.
std::vector<float> naive_probabilities(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> lse_in,
                                       std::span<float> lse_out) {
  const auto H = static_cast<std::size_t>(s.heads), KH = static_cast<std::size_t>(s.kv_heads), D = static_cast<std::size_t>(s.head_dim);
  const auto Q = static_cast<std::size_t>(s.q_len), K = static_cast<std::size_t>(s.kv_len);
  const float scale = s.scale();
  std::vector<float> p(H * Q * K, 0.0f), score(K);
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t kh = h / (H / KH);
    for (std::size_t i = 0; i < Q; ++i) {
      float best = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < K; ++j) {
        float dot = 0;
        for (std::size_t d = 0; d < D; ++d) dot += q[at(i, h, d, H, D)] * k[at(j, kh, d, KH, D)];
        score[j] = visible(s, static_cast<int>(i), static_cast<int>(j)) ? round_bf16(round_bf16(dot) * scale)
                                                                        : -std::numeric_limits<float>::infinity();
        best = std::max(best, score[j]);
      }
      float* row = &p[(h * Q + i) * K];
      if (best == -std::numeric_limits<float>::infinity()) {
        if (!lse_out.empty()) lse_out[h * Q + i] = best;
        continue;
      }
      float sum = 0;
      for (std::size_t j = 0; j < K; ++j) sum += std::exp(score[j] - best);
      const float lse = lse_out.empty() ? lse_in[h * Q + i] : best + std::log(sum);
      if (!lse_out.empty()) lse_out[h * Q + i] = lse;
      for (std::size_t j = 0; j < K; ++j) row[j] = round_bf16(std::exp(score[j] - lse));
    }
  }
  return p;
}

}  // namespace

void attention_forward_naive_bf16(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                                  std::span<float> o, std::span<float> lse) {
  check_attention(s, q.size(), k.size());
  const auto H = static_cast<std::size_t>(s.heads), KH = static_cast<std::size_t>(s.kv_heads), D = static_cast<std::size_t>(s.head_dim);
  const auto Q = static_cast<std::size_t>(s.q_len), K = static_cast<std::size_t>(s.kv_len);
  const auto p = naive_probabilities(s, q, k, {}, lse);
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t kh = h / (H / KH);
    for (std::size_t i = 0; i < Q; ++i) {
      for (std::size_t d = 0; d < D; ++d) {
        float acc = 0;
        for (std::size_t j = 0; j < K; ++j) acc += p[(h * Q + i) * K + j] * v[at(j, kh, d, KH, D)];
        o[at(i, h, d, H, D)] = round_bf16(acc);
      }
    }
  }
}

void attention_backward_naive_bf16(const AttentionShape& s, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                                   std::span<const float> d_o, std::span<const float> lse, std::span<const float> delta, std::span<float> dq,
                                   std::span<float> dk, std::span<float> dv) {
  check_attention(s, q.size(), k.size());
  const auto H = static_cast<std::size_t>(s.heads), KH = static_cast<std::size_t>(s.kv_heads), D = static_cast<std::size_t>(s.head_dim);
  const auto Q = static_cast<std::size_t>(s.q_len), K = static_cast<std::size_t>(s.kv_len);
  const float scale = s.scale();
  const auto p = naive_probabilities(s, q, k, lse, {});
  // dS = P * (dP - D) with dP = dO V^T, each rounded as a bf16 op would.
  std::vector<float> ds(p.size(), 0.0f);
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t kh = h / (H / KH);
    for (std::size_t i = 0; i < Q; ++i) {
      for (std::size_t j = 0; j < K; ++j) {
        float dp = 0;
        for (std::size_t d = 0; d < D; ++d) dp += d_o[at(i, h, d, H, D)] * v[at(j, kh, d, KH, D)];
        ds[(h * Q + i) * K + j] = round_bf16(p[(h * Q + i) * K + j] * (round_bf16(dp) - delta[h * Q + i]));
      }
    }
  }
  std::vector<float> dk_sum(dk.size(), 0.0f), dv_sum(dv.size(), 0.0f);  // the heads of a K/V head add up
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t kh = h / (H / KH);
    for (std::size_t d = 0; d < D; ++d) {
      for (std::size_t i = 0; i < Q; ++i) {
        float acc = 0;
        for (std::size_t j = 0; j < K; ++j) acc += ds[(h * Q + i) * K + j] * k[at(j, kh, d, KH, D)];
        dq[at(i, h, d, H, D)] = round_bf16(acc * scale);
      }
      for (std::size_t j = 0; j < K; ++j) {
        float acc_k = 0, acc_v = 0;
        for (std::size_t i = 0; i < Q; ++i) {
          acc_k += ds[(h * Q + i) * K + j] * q[at(i, h, d, H, D)];
          acc_v += p[(h * Q + i) * K + j] * d_o[at(i, h, d, H, D)];
        }
        dk_sum[at(j, kh, d, KH, D)] += round_bf16(acc_k * scale);
        dv_sum[at(j, kh, d, KH, D)] += round_bf16(acc_v);
      }
    }
  }
  for (std::size_t i = 0; i < dk.size(); ++i) {
    dk[i] = round_bf16(dk_sum[i]);
    dv[i] = round_bf16(dv_sum[i]);
  }
}

void rmsnorm_forward_ref(int rows, int cols, float eps, std::span<const float> x, std::span<const float> w, std::span<float> y) {
  const auto C = static_cast<std::size_t>(cols);
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    double ms = 0;
    for (std::size_t c = 0; c < C; ++c) ms += static_cast<double>(x[r * C + c]) * x[r * C + c];
    const double inv = 1 / std::sqrt(ms / static_cast<double>(C) + eps);
    for (std::size_t c = 0; c < C; ++c) y[r * C + c] = static_cast<float>(x[r * C + c] * inv * w[c]);
  }
}

void rmsnorm_backward_ref(int rows, int cols, float eps, std::span<const float> x, std::span<const float> w, std::span<const float> dy,
                          std::span<float> dx, std::span<float> dw) {
  const auto C = static_cast<std::size_t>(cols);
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    double ms = 0, dot = 0;
    for (std::size_t c = 0; c < C; ++c) {
      ms += static_cast<double>(x[r * C + c]) * x[r * C + c];
      dot += static_cast<double>(dy[r * C + c]) * w[c] * x[r * C + c];
    }
    const double inv = 1 / std::sqrt(ms / static_cast<double>(C) + eps);
    // y = x * inv * w: dx = inv * (dy*w - x * inv^2 * mean(dy*w*x))
    for (std::size_t c = 0; c < C; ++c) {
      dx[r * C + c] = static_cast<float>(inv * (dy[r * C + c] * w[c] - x[r * C + c] * inv * inv * dot / static_cast<double>(C)));
      dw[c] += static_cast<float>(dy[r * C + c] * x[r * C + c] * inv);
    }
  }
}

void swiglu_forward_ref(std::span<const float> gate, std::span<const float> up, std::span<float> y) {
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(silu(gate[i]) * up[i]);
}

void swiglu_backward_ref(std::span<const float> gate, std::span<const float> up, std::span<const float> dy, std::span<float> d_gate,
                         std::span<float> d_up) {
  for (std::size_t i = 0; i < dy.size(); ++i) {
    const double g = gate[i], sig = 1 / (1 + std::exp(-g));
    d_up[i] = static_cast<float>(dy[i] * g * sig);
    d_gate[i] = static_cast<float>(dy[i] * up[i] * sig * (1 + g * (1 - sig)));
  }
}

void add_ref(std::span<const float> a, std::span<const float> b, std::span<float> y) {
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = a[i] + b[i];
}

void axpy_ref(float alpha, std::span<const float> x, std::span<float> y) {
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += alpha * x[i];
}

void embedding_forward_ref(int rows, int hidden, std::span<const float> table, std::span<const std::int32_t> tokens, std::span<float> y) {
  const auto H = static_cast<std::size_t>(hidden);
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    const auto out = y.begin() + static_cast<std::ptrdiff_t>(r * H);
    if (tokens[r] < 0) {
      std::fill_n(out, H, 0.0f);
      continue;
    }
    std::copy_n(table.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(tokens[r]) * H), H, out);
  }
}

void embedding_backward_ref(int rows, int hidden, std::span<const std::int32_t> tokens, std::span<const float> dy, std::span<float> dtable) {
  const auto H = static_cast<std::size_t>(hidden);
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    if (tokens[r] < 0) continue;
    for (std::size_t i = 0; i < H; ++i) dtable[static_cast<std::size_t>(tokens[r]) * H + i] += dy[r * H + i];
  }
}

void rope_ref(int rows, int heads, int head_dim, std::int64_t position_offset, float base, bool inverse, std::span<float> x) {
  const auto H = static_cast<std::size_t>(heads), D = static_cast<std::size_t>(head_dim), half = D / 2;
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    const double pos = static_cast<double>(position_offset) + static_cast<double>(r);
    for (std::size_t i = 0; i < half; ++i) {
      const double angle = pos * std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(D));
      const double c = std::cos(angle), sn = inverse ? -std::sin(angle) : std::sin(angle);
      for (std::size_t h = 0; h < H; ++h) {
        const double a = x[at(r, h, i, H, D)], b = x[at(r, h, i + half, H, D)];
        x[at(r, h, i, H, D)] = static_cast<float>(a * c - b * sn);
        x[at(r, h, i + half, H, D)] = static_cast<float>(b * c + a * sn);
      }
    }
  }
}

void cross_entropy_forward_ref(int rows, int vocab, std::span<const float> logits, std::span<const std::int32_t> targets, std::span<float> loss,
                               std::span<float> lse) {
  const auto V = static_cast<std::size_t>(vocab);
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    double best = kNegInf;
    for (std::size_t c = 0; c < V; ++c) best = std::max(best, static_cast<double>(logits[r * V + c]));
    double sum = 0;
    for (std::size_t c = 0; c < V; ++c) sum += std::exp(logits[r * V + c] - best);
    const double l = best + std::log(sum);
    lse[r] = static_cast<float>(l);
    loss[r] = static_cast<float>(targets[r] < 0 ? l : l - logits[r * V + static_cast<std::size_t>(targets[r])]);
  }
}

void vocab_parallel_merge_ref(int rows, int shards, std::span<const float> stats, std::span<float> loss, std::span<float> lse) {
  const auto R = static_cast<std::size_t>(rows);
  for (std::size_t r = 0; r < R; ++r) {
    double top = kNegInf;
    for (std::size_t s = 0; s < static_cast<std::size_t>(shards); ++s) top = std::max(top, static_cast<double>(stats[s * 2 * R + r]));
    double sum = 0, target = 0;
    for (std::size_t s = 0; s < static_cast<std::size_t>(shards); ++s) {
      const double shard_lse = stats[s * 2 * R + r], shard_loss = stats[s * 2 * R + R + r];
      sum += std::exp(shard_lse - top);
      target += shard_lse - shard_loss;
    }
    const double l = top + std::log(sum);
    lse[r] = static_cast<float>(l);
    loss[r] = static_cast<float>(l - target);
  }
}

void cross_entropy_backward_ref(int rows, int vocab, std::span<const float> logits, std::span<const std::int32_t> targets, std::span<const float> lse,
                                std::span<const float> dloss, std::span<float> dlogits) {
  const auto V = static_cast<std::size_t>(vocab);
  for (std::size_t r = 0; r < static_cast<std::size_t>(rows); ++r) {
    for (std::size_t c = 0; c < V; ++c) {
      const double p = std::exp(static_cast<double>(logits[r * V + c]) - lse[r]);
      dlogits[r * V + c] = static_cast<float>((p - (static_cast<std::int32_t>(c) == targets[r] ? 1.0 : 0.0)) * dloss[r]);
    }
  }
}

void gemm_ref(int m, int n, int k, std::span<const float> a, bool transpose_a, std::span<const float> b, bool transpose_b, std::span<float> c,
              float alpha, float beta) {
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t j = 0; j < N; ++j) {
      double sum = 0;
      for (std::size_t p = 0; p < K; ++p) {
        sum += static_cast<double>(transpose_a ? a[p * M + i] : a[i * K + p]) * (transpose_b ? b[j * K + p] : b[p * N + j]);
      }
      c[i * N + j] = static_cast<float>(alpha * sum + beta * static_cast<double>(c[i * N + j]));
    }
  }
}

void adamw_ref(const AdamW& opt, int step, std::span<float> master, std::span<float> m, std::span<float> v, std::span<const float> grad,
               std::span<float> weights_bf16) {
  const double c1 = 1 - std::pow(static_cast<double>(opt.beta1), step), c2 = 1 - std::pow(static_cast<double>(opt.beta2), step);
  for (std::size_t i = 0; i < master.size(); ++i) {
    const double g = grad[i];
    const double mi = opt.beta1 * static_cast<double>(m[i]) + (1 - opt.beta1) * g;
    const double vi = opt.beta2 * static_cast<double>(v[i]) + (1 - opt.beta2) * g * g;
    double w = master[i];
    w -= opt.lr * opt.weight_decay * w;
    w -= opt.lr * (mi / c1) / (std::sqrt(vi / c2) + opt.eps);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    master[i] = static_cast<float>(w);
    weights_bf16[i] = round_bf16(master[i]);
  }
}

void adamw_host(const AdamW& opt, int step, std::int64_t n, float* master, float* m, float* v, const float* grad, std::uint16_t* weights_bf16,
                int threads) {
  constexpr std::int64_t kBlock = 1 << 16;  // parameters per job: 1.25 MiB of states and gradients
  const auto blocks = static_cast<std::size_t>((std::max<std::int64_t>(n, 0) + kBlock - 1) / kBlock);
  parallel_for(blocks, resolve_threads(threads), [&](std::size_t b) {
    // The rounded weights go through a buffer on the stack: a heap buffer of a block's size is an mmap and fresh
    // pages each call, which cost milliseconds per step where page faults are slow (a sandboxed GPU host).
    constexpr std::int64_t kSlice = 2048;
    std::array<float, kSlice> rounded;
    const std::int64_t end = std::min(static_cast<std::int64_t>(b + 1) * kBlock, n);
    for (std::int64_t first = static_cast<std::int64_t>(b) * kBlock; first < end; first += kSlice) {
      const auto count = static_cast<std::size_t>(std::min(kSlice, end - first));
      adamw_ref(opt, step, {master + first, count}, {m + first, count}, {v + first, count}, {grad + first, count}, {rounded.data(), count});
      for (std::size_t i = 0; i < count; ++i) weights_bf16[first + static_cast<std::int64_t>(i)] = to_bf16(rounded[i]);
    }
  });
}

}  // namespace trainyard::kernels
