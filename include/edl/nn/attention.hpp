// edl/nn/attention.hpp
// Multi-head causal self-attention as HF LlamaAttention (eager), with grouped-query attention.
//
//   q = x Wq^T [T, nh*D], k = x Wk^T [T, nkv*D], v = x Wv^T [T, nkv*D]   (+ bias if configured)
//   q, k <- rope(q, k) at each token's position
//   for batch b, query head h (kv head g = h / (nh / nkv), HF repeat_kv), query position i:
//     allowed j: j <= i (causal), i - j < sliding_window (if set), attention_mask[b, j] != 0
//     s_j = (q_i . k_j) / sqrt(D);  p = softmax_j(s) in f32;  ctx_i = sum_j p_j v_j
//   y = ctx Wo^T [T, hidden]
// A query row with no allowed key (e.g. a left-padding row) gives ctx = 0 and zero gradients
// (HF gives a finite but meaningless value there; such rows are padding and carry no loss).
//
// Saved (documented choice): q and k after rope, v, ctx and the per-row log-sum-exp of the
// scores, [batch, nh, seq] -- not the [batch, nh, seq, seq] probabilities: backward recomputes
// p_j = exp(s_j - lse_i) (one extra q.k per pair), so activation memory stays linear in seq.
//
// Backward, per (b, kv head g) on one thread (deterministic; dk, dv of a kv head are summed
// over its query heads in order):
//   dp_j = dctx_i . v_j,  Di = sum_j p_j dp_j,  ds_j = p_j (dp_j - Di)
//   dq_i = sum_j ds_j k_j / sqrt(D),  dk_j += ds_j q_i / sqrt(D),  dv_j += p_j dctx_i
//   then dq, dk go through the inverse rotation and the projections' backward.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/rng.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/rotary.hpp>

namespace edl::nn {

struct AttentionConfig {
  std::int64_t hidden = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;  // 0: hidden / num_heads
  bool qkv_bias = false;
  bool o_bias = false;
  std::optional<std::int64_t> sliding_window;
  RopeConfig rope;
};

namespace detail {
inline float dot_n(const float* a, const float* b, std::int64_t n) noexcept {
  float s = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
inline void axpy_n(float a, const float* x, float* y, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
}  // namespace detail

template <class Pol>
class Attention {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  struct Saved {
    typename ColumnLinear<Pol>::Saved q_s, k_s, v_s;
    typename RowLinear<Pol>::Saved o_s;
    std::int64_t batch = 0, seq = 0;
    std::vector<std::int64_t> mask;  // [batch * seq] copy of the attention mask (empty: none)
    std::vector<float> cos, sin;     // [T, D/2]
    std::vector<float> q, k, v;      // after rope: [T, nh*D], [T, nkv*D], [T, nkv*D]
    std::vector<float> ctx;          // [T, nh*D], input of o_proj
    std::vector<float> lse;          // [batch, nh, seq]
  };

  Attention() = default;
  explicit Attention(const AttentionConfig& c)
      : hidden_(c.hidden),
        nh_(c.num_heads),
        nkv_(c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads),
        D_(c.head_dim > 0 ? c.head_dim : (c.num_heads > 0 ? c.hidden / c.num_heads : 0)),
        window_(c.sliding_window.value_or(0)) {
    const char* w = "nn.Attention";
    EDL_CHECK(hidden_ > 0 && nh_ > 0 && D_ > 0, errc::invalid_argument, w,
              "hidden, num_heads and head_dim must be positive, found ", hidden_, ", ", nh_, ", ", D_);
    EDL_CHECK(nh_ % nkv_ == 0, errc::invalid_argument, w, "num_heads (", nh_, ") must be divisible by num_kv_heads (",
              nkv_, ")");
    EDL_CHECK(!c.sliding_window || *c.sliding_window > 0, errc::invalid_argument, w,
              "sliding_window must be positive, found ", c.sliding_window.value_or(0));
    q_proj = ColumnLinear<Pol>(hidden_, nh_ * D_, c.qkv_bias);
    k_proj = ColumnLinear<Pol>(hidden_, nkv_ * D_, c.qkv_bias);
    v_proj = ColumnLinear<Pol>(hidden_, nkv_ * D_, c.qkv_bias);
    o_proj = RowLinear<Pol>(nh_ * D_, hidden_, c.o_bias);
    rope = RotaryEmbedding(D_, c.rope);
  }

  ColumnLinear<Pol> q_proj, k_proj, v_proj;
  RowLinear<Pol> o_proj;
  RotaryEmbedding rope;

  std::int64_t num_heads() const noexcept { return nh_; }
  std::int64_t num_kv_heads() const noexcept { return nkv_; }
  std::int64_t head_dim() const noexcept { return D_; }
  std::int64_t sliding_window() const noexcept { return window_; }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    q_proj.visit_params(join_path(prefix, "q_proj"), f);
    k_proj.visit_params(join_path(prefix, "k_proj"), f);
    v_proj.visit_params(join_path(prefix, "v_proj"), f);
    o_proj.visit_params(join_path(prefix, "o_proj"), f);
  }
  std::int64_t param_count() const noexcept {
    return q_proj.param_count() + k_proj.param_count() + v_proj.param_count() + o_proj.param_count();
  }
  /// Projections plus q.k and p.v over the causal (and windowed) pairs, without padding.
  double flops_forward(std::int64_t batch, std::int64_t seq) const noexcept {
    const std::int64_t T = batch * seq;
    double pairs = 0;
    for (std::int64_t i = 0; i < seq; ++i) pairs += static_cast<double>(window_ > 0 ? std::min(i + 1, window_) : i + 1);
    return q_proj.flops_forward(T) + k_proj.flops_forward(T) + v_proj.flops_forward(T) + o_proj.flops_forward(T) +
           4.0 * static_cast<double>(batch) * static_cast<double>(nh_) * pairs * static_cast<double>(D_);
  }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  /// y [T, hidden] from x [T, hidden].
  void forward(const float* x, const TokenLayout& layout, float* y, Saved& s) const {
    const std::int64_t T = layout.tokens();
    s.batch = layout.batch;
    s.seq = layout.seq;
    if (layout.attention_mask) s.mask.assign(layout.attention_mask, layout.attention_mask + T);
    else s.mask.clear();
    rope.tables(layout, s.cos, s.sin);
    forward_projections(x, s, true, true, true);
    forward_core(s);
    o_proj.forward(s.ctx.data(), T, y, s.o_s);
  }

  // Rematerialization (DecoderLayer under a remat policy): forward above is these steps, and
  // release() frees what a policy does not keep; rematerialize() recomputes it with the same
  // kernels, so the rebuilt values are bitwise those of forward. The rope tables and the
  // mask stay in Saved (small: [T, D] and [T]).

  /// Frees q, k, v, and ctx with lse (`core`), as asked.
  static void release(Saved& s, bool q, bool k, bool v, bool core) {
    if (q) std::vector<float>().swap(s.q);
    if (k) std::vector<float>().swap(s.k);
    if (v) std::vector<float>().swap(s.v);
    if (core) {
      std::vector<float>().swap(s.ctx);
      std::vector<float>().swap(s.lse);
    }
  }
  /// Recomputes what release() freed, from the same x [T, hidden] forward had (its values,
  /// not necessarily its address), and re-points the projections' Saved at x and ctx.
  void rematerialize(const float* x, Saved& s, bool q, bool k, bool v, bool core) const {
    forward_projections(x, s, q, k, v);
    if (core) forward_core(s);
    const std::int64_t T = s.batch * s.seq;
    s.q_s = {x, T};
    s.k_s = {x, T};
    s.v_s = {x, T};
    s.o_s = {s.ctx.data(), T};
  }

  /// Inference: y = attention(x), nothing kept.
  void apply(const float* x, const TokenLayout& layout, float* y) const {
    Saved s;
    forward(x, layout, y, s);
  }

  /// Accumulates the projections' gradients; writes dx [T, hidden].
  void backward(const float* dy, Saved& s, float* dx) {
    const std::int64_t T = s.batch * s.seq;
    std::vector<float> dctx(static_cast<std::size_t>(T * nh_ * D_));
    o_proj.backward(dy, s.o_s, dctx.data());
    std::vector<float> dq(dctx.size()), dk(s.k.size(), 0.0f), dv(s.v.size(), 0.0f);
    core_backward(s, dctx.data(), dq.data(), dk.data(), dv.data());
    rope.backward(dq.data(), T, nh_, s.cos.data(), s.sin.data());
    rope.backward(dk.data(), T, nkv_, s.cos.data(), s.sin.data());
    q_proj.backward(dq.data(), s.q_s, dx, false);
    k_proj.backward(dk.data(), s.k_s, dx, true);
    v_proj.backward(dv.data(), s.v_s, dx, true);
  }

 private:
  bool allowed(const Saved& s, std::int64_t b, std::int64_t i, std::int64_t j) const noexcept {
    if (j > i) return false;
    if (window_ > 0 && i - j >= window_) return false;
    return s.mask.empty() || s.mask[static_cast<std::size_t>(b * s.seq + j)] != 0;
  }
  /// First key position that may be allowed for query i.
  std::int64_t first_key(std::int64_t i) const noexcept { return window_ > 0 ? std::max<std::int64_t>(0, i - window_ + 1) : 0; }

  /// The chosen projections of x into s (q and k rotated with s's rope tables).
  void forward_projections(const float* x, Saved& s, bool q, bool k, bool v) const {
    const std::int64_t T = s.batch * s.seq;
    if (q) {
      s.q.resize(static_cast<std::size_t>(T * nh_ * D_));
      q_proj.forward(x, T, s.q.data(), s.q_s);
      rope.apply(s.q.data(), T, nh_, s.cos.data(), s.sin.data());
    }
    if (k) {
      s.k.resize(static_cast<std::size_t>(T * nkv_ * D_));
      k_proj.forward(x, T, s.k.data(), s.k_s);
      rope.apply(s.k.data(), T, nkv_, s.cos.data(), s.sin.data());
    }
    if (v) {
      s.v.resize(static_cast<std::size_t>(T * nkv_ * D_));
      v_proj.forward(x, T, s.v.data(), s.v_s);
    }
  }
  /// ctx and lse from q, k, v.
  void forward_core(Saved& s) const {
    s.ctx.resize(static_cast<std::size_t>(s.batch * s.seq * nh_ * D_));
    s.lse.resize(static_cast<std::size_t>(s.batch * nh_ * s.seq));
    core_forward(s);
  }

  void core_forward(Saved& s) const {
    const std::int64_t B = s.batch, S = s.seq, D = D_, rep = nh_ / nkv_;
    const std::int64_t qw = nh_ * D, kw = nkv_ * D;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    exec::parallel_for(0, B * nh_, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      std::vector<float> p(static_cast<std::size_t>(S));
      for (std::ptrdiff_t bh = lo; bh < hi; ++bh) {
        const std::int64_t b = bh / nh_, h = bh % nh_, g = h / rep;
        for (std::int64_t i = 0; i < S; ++i) {
          const float* qi = s.q.data() + (b * S + i) * qw + h * D;
          float* out = s.ctx.data() + (b * S + i) * qw + h * D;
          float m = -std::numeric_limits<float>::infinity();
          const std::int64_t j0 = first_key(i);
          for (std::int64_t j = j0; j <= i; ++j) {
            if (!allowed(s, b, i, j)) continue;
            const float sj = scale * detail::dot_n(qi, s.k.data() + (b * S + j) * kw + g * D, D);
            p[static_cast<std::size_t>(j)] = sj;
            m = std::max(m, sj);
          }
          for (std::int64_t d = 0; d < D; ++d) out[d] = 0.0f;
          float& lse = s.lse[static_cast<std::size_t>((b * nh_ + h) * S + i)];
          if (m == -std::numeric_limits<float>::infinity()) {  // nothing to attend to
            lse = m;
            continue;
          }
          float sum = 0.0f;
          for (std::int64_t j = j0; j <= i; ++j) {
            if (!allowed(s, b, i, j)) continue;
            const float e = std::exp(p[static_cast<std::size_t>(j)] - m);
            p[static_cast<std::size_t>(j)] = e;
            sum += e;
          }
          const float inv = 1.0f / sum;
          for (std::int64_t j = j0; j <= i; ++j) {
            if (!allowed(s, b, i, j)) continue;
            detail::axpy_n(p[static_cast<std::size_t>(j)] * inv, s.v.data() + (b * S + j) * kw + g * D, out, D);
          }
          lse = m + std::log(sum);
        }
      }
    });
  }

  void core_backward(const Saved& s, const float* dctx, float* dq, float* dk, float* dv) const {
    const std::int64_t B = s.batch, S = s.seq, D = D_, rep = nh_ / nkv_;
    const std::int64_t qw = nh_ * D, kw = nkv_ * D;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    exec::parallel_for(0, B * nkv_, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      std::vector<float> p(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
      for (std::ptrdiff_t bg = lo; bg < hi; ++bg) {
        const std::int64_t b = bg / nkv_, g = bg % nkv_;
        for (std::int64_t h = g * rep; h < (g + 1) * rep; ++h) {
          for (std::int64_t i = 0; i < S; ++i) {
            const std::size_t qoff = static_cast<std::size_t>((b * S + i) * qw + h * D);
            const float* qi = s.q.data() + qoff;
            const float* gi = dctx + qoff;
            float* dqi = dq + qoff;
            for (std::int64_t d = 0; d < D; ++d) dqi[d] = 0.0f;
            const float lse = s.lse[static_cast<std::size_t>((b * nh_ + h) * S + i)];
            if (lse == -std::numeric_limits<float>::infinity()) continue;
            const std::int64_t j0 = first_key(i);
            float Di = 0.0f;
            for (std::int64_t j = j0; j <= i; ++j) {
              if (!allowed(s, b, i, j)) continue;
              const std::size_t koff = static_cast<std::size_t>((b * S + j) * kw + g * D);
              const float pj = std::exp(scale * detail::dot_n(qi, s.k.data() + koff, D) - lse);
              const float dpj = detail::dot_n(gi, s.v.data() + koff, D);
              p[static_cast<std::size_t>(j)] = pj;
              dp[static_cast<std::size_t>(j)] = dpj;
              Di += pj * dpj;
            }
            for (std::int64_t j = j0; j <= i; ++j) {
              if (!allowed(s, b, i, j)) continue;
              const std::size_t koff = static_cast<std::size_t>((b * S + j) * kw + g * D);
              const float pj = p[static_cast<std::size_t>(j)];
              const float ds = pj * (dp[static_cast<std::size_t>(j)] - Di) * scale;
              detail::axpy_n(ds, s.k.data() + koff, dqi, D);
              detail::axpy_n(ds, qi, dk + koff, D);
              detail::axpy_n(pj, gi, dv + koff, D);
            }
          }
        }
      }
    });
  }

  std::int64_t hidden_ = 0, nh_ = 0, nkv_ = 0, D_ = 0, window_ = 0;
};

}  // namespace edl::nn
