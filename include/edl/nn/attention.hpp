// edl/nn/attention.hpp
// Multi-head causal self-attention as HF LlamaAttention (eager), with grouped-query attention.
//
//   q = x Wq^T [T, nh*D], k = x Wk^T [T, nkv*D], v = x Wv^T [T, nkv*D]   (+ bias if configured)
//   with qk_norm (Qwen3): q <- q_norm(q), k <- k_norm(k), an RMSNorm over each head's D values
//     (weights [D], shared by the heads)
//   q, k <- rope(q, k) at each token's position
//   for batch b, query head h (kv head g = h / (nh / nkv), HF repeat_kv), query position i:
//     allowed j: j <= i (causal), i - j < sliding_window (if set), attention_mask[b, j] != 0,
//                j in i's document (packed rows: segment_ids)
//     s_j = (q_i . k_j) / sqrt(D) (or x query_scale);  with softcap c (Gemma 2): s_j <- c tanh(s_j / c)
//     p = softmax_j(s) in f32;  ctx_i = sum_j p_j v_j
//   y = ctx Wo^T [T, hidden]
// A query row with no allowed key (e.g. a left-padding row) gives ctx = 0 and zero gradients
// (HF gives a finite but meaningless value there; such rows are padding and carry no loss).
//
// Saved (documented choice): q and k after rope, v, ctx and the per-row log-sum-exp of the
// scores, [batch, nh, seq] -- not the [batch, nh, seq, seq] probabilities: backward recomputes
// p_j = exp(s_j - lse_i) (one extra q.k per pair), so activation memory stays linear in seq.
// With qk_norm also q and k as projected (the norms' input) and one 1/rms per head and token.
//
// Both directions are blocked over query rows and run on the GEMM (gemm_serial inside one
// task per head), so the O(seq^2) part runs at matrix-product speed.
// Backward, per (b, kv head g) on one thread (deterministic; dk, dv of a kv head are summed
// over its query heads in order):
//   dp_j = dctx_i . v_j,  Di = sum_j p_j dp_j = dctx_i . ctx_i,  ds_j = p_j (dp_j - Di)
//   (times 1 - tanh^2(s_j / c) under soft-capping)
//   dq_i = sum_j ds_j k_j / sqrt(D),  dk_j += ds_j q_i / sqrt(D),  dv_j += p_j dctx_i
//   then dq, dk go through the inverse rotation, the q/k norms' backward (qk_norm) and the
//   projections' backward.
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
#include <edl/kernels/activations.hpp>
#include <edl/kernels/attention.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/softmax.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/rms_norm.hpp>
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
  bool qk_norm = false;       // Qwen3: RMSNorm of each q and k head (over head_dim) before rope
  double qk_norm_eps = 1e-6;  // its eps (the model's rms_norm_eps)
  float qk_norm_offset = 0;   // Gemma 3: the norms scale by (1 + w)
  double query_scale = 0;     // the scores' scale: 0 = 1 / sqrt(head_dim); Gemma: query_pre_attn_scalar^-0.5
  double softcap = 0;         // Gemma 2: scores <- softcap tanh(scores / softcap) before the mask; 0 = none
};

template <class Pol>
class Attention {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  struct Saved {
    typename ColumnLinear<Pol>::Saved q_s, k_s, v_s;
    typename RowLinear<Pol>::Saved o_s;
    std::int64_t batch = 0, seq = 0;
    std::vector<std::int64_t> mask;  // [batch * seq] copy of the attention mask (empty: none)
    std::vector<std::int64_t> doc_start;  // [batch * seq] first position of each token's document (empty: 0)
    std::vector<float> cos, sin;     // [T, D/2]
    std::vector<float> q, k, v;      // after rope: [T, nh*D], [T, nkv*D], [T, nkv*D]
    std::vector<float> q_proj_out, k_proj_out;  // qk_norm: q, k before the norms (their input); else empty
    typename RMSNorm<Pol>::Saved q_norm_s, k_norm_s;
    std::vector<float> ctx;          // [T, nh*D], input of o_proj
    std::vector<float> lse;          // [batch, nh, seq]
  };

  Attention() = default;
  explicit Attention(const AttentionConfig& c)
      : hidden_(c.hidden),
        nh_(c.num_heads),
        nkv_(c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads),
        D_(c.head_dim > 0 ? c.head_dim : (c.num_heads > 0 ? c.hidden / c.num_heads : 0)),
        window_(c.sliding_window.value_or(0)),
        qk_norm_(c.qk_norm) {
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
    if (qk_norm_) {
      q_norm = RMSNorm<Pol>(D_, c.qk_norm_eps, c.qk_norm_offset);
      k_norm = RMSNorm<Pol>(D_, c.qk_norm_eps, c.qk_norm_offset);
    }
    rope = RotaryEmbedding(D_, c.rope);
    scale_ = c.query_scale > 0 ? static_cast<float>(c.query_scale) : 1.0f / std::sqrt(static_cast<float>(D_));
    softcap_ = static_cast<float>(c.softcap);
  }

  ColumnLinear<Pol> q_proj, k_proj, v_proj;
  RowLinear<Pol> o_proj;
  RMSNorm<Pol> q_norm, k_norm;  // rows of head_dim values; empty (no parameter) unless has_qk_norm()
  RotaryEmbedding rope;

  std::int64_t num_heads() const noexcept { return nh_; }
  std::int64_t num_kv_heads() const noexcept { return nkv_; }
  std::int64_t head_dim() const noexcept { return D_; }
  std::int64_t sliding_window() const noexcept { return window_; }
  bool has_qk_norm() const noexcept { return qk_norm_; }
  /// The scores' scale (1 / sqrt(head_dim) unless the config sets query_scale).
  float query_scale() const noexcept { return scale_; }

  /// The attention probabilities of the forward that filled `s` (HF's output_attentions),
  /// [batch, heads, seq, seq]: row i of head h holds p_ij over the keys j, 0 where a key is
  /// masked (causal, window, document, padding) and for a query with no key. Forward never
  /// stores them (it keeps the log-sum-exp); they are recomputed here from q, k and the lse, so
  /// the forward must have kept q and k (every policy but those dropping them).
  std::vector<float> probabilities(const Saved& s) const {
    EDL_CHECK(!s.q.empty() && !s.k.empty() && !s.lse.empty(), errc::invalid_argument, "nn.Attention::probabilities",
              "the forward did not keep q, k and the log-sum-exp (a remat policy dropped them)");
    const std::int64_t B = s.batch, S = s.seq, D = D_, rep = nh_ / nkv_, qw = nh_ * D, kw = nkv_ * D;
    std::vector<float> p(static_cast<std::size_t>(B * nh_ * S * S), 0.0f);
    exec::parallel_for(0, B * nh_, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      std::vector<float> row(static_cast<std::size_t>(S));
      for (std::ptrdiff_t bh = lo; bh < hi; ++bh) {
        const std::int64_t b = bh / nh_, h = bh % nh_, g = h / rep;
        for (std::int64_t i = 0; i < S; ++i) {
          const float lse = s.lse[static_cast<std::size_t>((b * nh_ + h) * S + i)];
          if (lse == -std::numeric_limits<float>::infinity()) continue;  // no key: a row of zeros
          const std::int64_t j0 = first_key(s, b, i), n = i + 1 - j0;
          const float* q = s.q.data() + (b * S + i) * qw + h * D;
          for (std::int64_t j = 0; j < n; ++j) {
            const float* k = s.k.data() + (b * S + j0 + j) * kw + g * D;
            float dot = 0.0f;
            for (std::int64_t c = 0; c < D; ++c) dot += q[c] * k[c];
            row[static_cast<std::size_t>(j)] = scale_ * dot;
          }
          if (softcap_ > 0) kernels::softcap_row(row.data(), nullptr, n, softcap_);
          mask_row(s, b, i, j0, row.data(), n);
          float* out = p.data() + ((b * nh_ + h) * S + i) * S + j0;
          for (std::int64_t j = 0; j < n; ++j) out[j] = std::exp(row[static_cast<std::size_t>(j)] - lse);
        }
      }
    });
    return p;
  }


  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    q_proj.visit_params(join_path(prefix, "q_proj"), f);
    k_proj.visit_params(join_path(prefix, "k_proj"), f);
    v_proj.visit_params(join_path(prefix, "v_proj"), f);
    o_proj.visit_params(join_path(prefix, "o_proj"), f);
    if (qk_norm_) {  // after o_proj: HF's order
      q_norm.visit_params(join_path(prefix, "q_norm"), f);
      k_norm.visit_params(join_path(prefix, "k_norm"), f);
    }
  }
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    q_proj.visit_linears(join_path(prefix, "q_proj"), f);
    k_proj.visit_linears(join_path(prefix, "k_proj"), f);
    v_proj.visit_linears(join_path(prefix, "v_proj"), f);
    o_proj.visit_linears(join_path(prefix, "o_proj"), f);
  }
  std::int64_t param_count() const noexcept {
    return q_proj.param_count() + k_proj.param_count() + v_proj.param_count() + o_proj.param_count() +
           (qk_norm_ ? q_norm.param_count() + k_norm.param_count() : 0);
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
    document_starts(layout, s.doc_start);
    rope.tables(layout, s.cos, s.sin);
    forward_projections(x, s, true, true, true);
    forward_core(s);
    o_proj.forward(s.ctx.data(), T, y, s.o_s);
  }

  // Rematerialization (DecoderLayer under a remat policy): forward above is these steps, and
  // release() frees what a policy does not keep; rematerialize() recomputes it with the same
  // kernels, so the rebuilt values are bitwise those of forward. The rope tables and the
  // mask stay in Saved (small: [T, D] and [T]).

  /// Frees q, k (each with its norm's input and 1/rms), v, and ctx with lse (`core`), as asked.
  static void release(Saved& s, bool q, bool k, bool v, bool core) {
    if (q) {
      std::vector<float>().swap(s.q);
      std::vector<float>().swap(s.q_proj_out);
      std::vector<float>().swap(s.q_norm_s.inv_rms);
    }
    if (k) {
      std::vector<float>().swap(s.k);
      std::vector<float>().swap(s.k_proj_out);
      std::vector<float>().swap(s.k_norm_s.inv_rms);
    }
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
    s.q_s.point_at(x, T);
    s.k_s.point_at(x, T);
    s.v_s.point_at(x, T);
    s.o_s.point_at(s.ctx.data(), T);
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
    if (qk_norm_) {  // in place: the norms' input gradient overwrites their output gradient
      q_norm.backward(dq.data(), s.q_norm_s, dq.data());
      k_norm.backward(dk.data(), s.k_norm_s, dk.data());
    }
    q_proj.backward(dq.data(), s.q_s, dx, false);
    k_proj.backward(dk.data(), s.k_s, dx, true);
    v_proj.backward(dv.data(), s.v_s, dx, true);
  }

 private:
  /// Per token, the position in its row where its document starts (segment_ids: a new
  /// document wherever the id changes); empty without segment ids.
  static void document_starts(const TokenLayout& layout, std::vector<std::int64_t>& start) {
    start.clear();
    if (!layout.segment_ids) return;
    start.resize(static_cast<std::size_t>(layout.tokens()));
    for (std::int64_t b = 0; b < layout.batch; ++b)
      for (std::int64_t i = 0; i < layout.seq; ++i) {
        const std::int64_t t = b * layout.seq + i;
        start[static_cast<std::size_t>(t)] =
            i == 0 || layout.segment_ids[t] != layout.segment_ids[t - 1] ? i : start[static_cast<std::size_t>(t - 1)];
      }
  }

  /// First key position that may be allowed for query i of row b: the window's start, or its
  /// document's. Non-decreasing in i, so a block of queries starting at i0 needs no earlier key.
  std::int64_t first_key(const Saved& s, std::int64_t b, std::int64_t i) const noexcept {
    const std::int64_t w = kernels::window_start(i, window_);
    return s.doc_start.empty() ? w : std::max(w, s.doc_start[static_cast<std::size_t>(b * s.seq + i)]);
  }

  /// Sets the disallowed scores of query row i (keys j0 .. j0 + n - 1) to -Inf.
  void mask_row(const Saved& s, std::int64_t b, std::int64_t i, std::int64_t j0, float* row, std::int64_t n) const {
    const float ninf = -std::numeric_limits<float>::infinity();
    const std::int64_t lo = std::max(j0, first_key(s, b, i)), hi = std::min(j0 + n, i + 1);  // [lo, hi): causal, window, document
    for (std::int64_t j = j0; j < lo; ++j) row[j - j0] = ninf;
    for (std::int64_t j = std::max(hi, j0); j < j0 + n; ++j) row[j - j0] = ninf;
    if (s.mask.empty()) return;
    const std::int64_t* mrow = s.mask.data() + b * s.seq;
    for (std::int64_t j = lo; j < hi; ++j)
      if (mrow[j] == 0) row[j - j0] = ninf;
  }

  /// The chosen projections of x into s (q and k normalised per head with qk_norm, then
  /// rotated with s's rope tables).
  void forward_projections(const float* x, Saved& s, bool q, bool k, bool v) const {
    const std::int64_t T = s.batch * s.seq;
    if (q) project_rotated(x, T, nh_, q_proj, q_norm, s.q, s.q_proj_out, s.q_s, s.q_norm_s, s);
    if (k) project_rotated(x, T, nkv_, k_proj, k_norm, s.k, s.k_proj_out, s.k_s, s.k_norm_s, s);
    if (v) {
      s.v.resize(static_cast<std::size_t>(T * nkv_ * D_));
      v_proj.forward(x, T, s.v.data(), s.v_s);
      round_activations<Pol>(s.v);
    }
  }
  /// out [T, heads*D] = rope(norm(x W^T)) for q or k; with qk_norm the projection is kept in
  /// proj_out, the norm's input that its backward reads.
  void project_rotated(const float* x, std::int64_t T, std::int64_t heads, const ColumnLinear<Pol>& proj,
                       const RMSNorm<Pol>& norm, std::vector<float>& out, std::vector<float>& proj_out,
                       typename ColumnLinear<Pol>::Saved& proj_s, typename RMSNorm<Pol>::Saved& norm_s,
                       const Saved& s) const {
    out.resize(static_cast<std::size_t>(T * heads * D_));
    if (qk_norm_) {
      proj_out.resize(out.size());
      proj.forward(x, T, proj_out.data(), proj_s);
      round_activations<Pol>(proj_out);
      norm.forward(proj_out.data(), T * heads, out.data(), norm_s);  // one row per (token, head)
    } else {
      proj.forward(x, T, out.data(), proj_s);
      round_activations<Pol>(out);
    }
    rope.apply(out.data(), T, heads, s.cos.data(), s.sin.data());
    round_activations<Pol>(out);
  }

  /// ctx and lse from q, k, v.
  void forward_core(Saved& s) const {
    s.ctx.resize(static_cast<std::size_t>(s.batch * s.seq * nh_ * D_));
    s.lse.resize(static_cast<std::size_t>(s.batch * nh_ * s.seq));
    core_forward(s);
    round_activations<Pol>(s.ctx);
  }

  // Blocked over query rows: for rows [i0, i1) of head h the keys are [first_key(i0), i1); the
  // scores block is one GEMM (q k^T), its softmax is row-wise, the context is a second GEMM
  // (p v). Each (batch, head) is one task and its GEMMs run on that task's thread, so the
  // result does not depend on the thread count.
  void core_forward(Saved& s) const {
    const std::int64_t B = s.batch, S = s.seq, D = D_, rep = nh_ / nkv_;
    const std::int64_t qw = nh_ * D, kw = nkv_ * D, QB = kernels::kAttentionQueryBlock;
    const float scale = scale_;
    exec::parallel_for(0, B * nh_, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      std::vector<float> sc(static_cast<std::size_t>(QB * S));
      for (std::ptrdiff_t bh = lo; bh < hi; ++bh) {
        const std::int64_t b = bh / nh_, h = bh % nh_, g = h / rep;
        for (std::int64_t i0 = 0; i0 < S; i0 += QB) {
          const std::int64_t i1 = std::min(S, i0 + QB), m = i1 - i0, j0 = first_key(s, b, i0), n = i1 - j0;
          const float* q = s.q.data() + (b * S + i0) * qw + h * D;
          const float* k = s.k.data() + (b * S + j0) * kw + g * D;
          const float* v = s.v.data() + (b * S + j0) * kw + g * D;
          gemm_serial(Trans::no, Trans::yes, m, n, D, scale, q, qw, k, kw, 0.0f, sc.data(), S);
          for (std::int64_t r = 0; r < m; ++r) {
            float* row = sc.data() + r * S;
            if (softcap_ > 0) kernels::softcap_row(row, nullptr, n, softcap_);
            mask_row(s, b, i0 + r, j0, row, n);
            const float mx = kernels::detail::row_max(row, n);
            float& lse = s.lse[static_cast<std::size_t>((b * nh_ + h) * S + i0 + r)];
            if (mx == -std::numeric_limits<float>::infinity()) {  // nothing to attend to: ctx = 0
              std::fill(row, row + n, 0.0f);
              lse = mx;
              continue;
            }
            const float sum = kernels::detail::row_exp_sum(row, row, n, mx);
            const float inv = 1.0f / sum;
            for (std::int64_t j = 0; j < n; ++j) row[j] *= inv;
            lse = mx + std::log(sum);
          }
          gemm_serial(Trans::no, Trans::no, m, D, n, 1.0f, sc.data(), S, v, kw, 0.0f,
                      s.ctx.data() + (b * S + i0) * qw + h * D, qw);
        }
      }
    });
  }

  // Per (batch, kv head) task, over its query heads and query blocks in order (dk and dv of
  // a kv head are sums over its query heads, kept deterministic by one task owning them):
  //   p = exp(scale q k^T - lse) (recomputed), dp = dctx v^T, Di = dctx_i . ctx_i (equal to
  //   sum_j p_j dp_j), ds = p (dp - Di) scale, dq = ds k, dk += ds^T q, dv += p^T dctx.
  void core_backward(const Saved& s, const float* dctx, float* dq, float* dk, float* dv) const {
    const std::int64_t B = s.batch, S = s.seq, D = D_, rep = nh_ / nkv_;
    const std::int64_t qw = nh_ * D, kw = nkv_ * D, QB = kernels::kAttentionQueryBlock;
    const float scale = scale_;
    exec::parallel_for(0, B * nkv_, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      std::vector<float> p(static_cast<std::size_t>(QB * S)), dp(static_cast<std::size_t>(QB * S));
      std::vector<float> capd(softcap_ > 0 ? static_cast<std::size_t>(S) : 0);  // 1 - tanh^2 of a row
      for (std::ptrdiff_t bg = lo; bg < hi; ++bg) {
        const std::int64_t b = bg / nkv_, g = bg % nkv_;
        for (std::int64_t h = g * rep; h < (g + 1) * rep; ++h) {
          for (std::int64_t i0 = 0; i0 < S; i0 += QB) {
            const std::int64_t i1 = std::min(S, i0 + QB), m = i1 - i0, j0 = first_key(s, b, i0), n = i1 - j0;
            const std::int64_t qoff = (b * S + i0) * qw + h * D, koff = (b * S + j0) * kw + g * D;
            gemm_serial(Trans::no, Trans::yes, m, n, D, scale, s.q.data() + qoff, qw, s.k.data() + koff, kw, 0.0f,
                        p.data(), S);
            gemm_serial(Trans::no, Trans::yes, m, n, D, 1.0f, dctx + qoff, qw, s.v.data() + koff, kw, 0.0f,
                        dp.data(), S);
            for (std::int64_t r = 0; r < m; ++r) {
              float* prow = p.data() + r * S;
              float* dprow = dp.data() + r * S;
              const float lse = s.lse[static_cast<std::size_t>((b * nh_ + h) * S + i0 + r)];
              if (lse == -std::numeric_limits<float>::infinity()) {  // a row with no key: no gradient
                std::fill(prow, prow + n, 0.0f);
                std::fill(dprow, dprow + n, 0.0f);
                continue;
              }
              if (softcap_ > 0) kernels::softcap_row(prow, capd.data(), n, softcap_);
              mask_row(s, b, i0 + r, j0, prow, n);
              kernels::detail::row_exp_sum(prow, prow, n, lse);
              const float Di = kernels::detail::row_dot(dctx + qoff + r * qw, s.ctx.data() + qoff + r * qw, D);
              kernels::softmax_grad_row(prow, dprow, Di, scale, n);
              if (softcap_ > 0)  // through the cap: d raw = d capped (1 - tanh^2)
                for (std::int64_t j = 0; j < n; ++j) dprow[j] *= capd[static_cast<std::size_t>(j)];
            }
            gemm_serial(Trans::no, Trans::no, m, D, n, 1.0f, dp.data(), S, s.k.data() + koff, kw, 0.0f, dq + qoff, qw);
            gemm_serial(Trans::yes, Trans::no, n, D, m, 1.0f, dp.data(), S, s.q.data() + qoff, qw, 1.0f, dk + koff, kw);
            gemm_serial(Trans::yes, Trans::no, n, D, m, 1.0f, p.data(), S, dctx + qoff, qw, 1.0f, dv + koff, kw);
          }
        }
      }
    });
  }

  std::int64_t hidden_ = 0, nh_ = 0, nkv_ = 0, D_ = 0, window_ = 0;
  bool qk_norm_ = false;
  float scale_ = 1.0f, softcap_ = 0.0f;
};

}  // namespace edl::nn
