// edl/nn/loss.hpp
// Causal-LM cross-entropy fused with the lm_head projection, computed in chunks of rows so the
// [tokens, vocab] f32 logits are never all live (only [chunk_rows, vocab]).
//
// Targets follow HF's one-position shift: the prediction at (b, s) is scored against
// labels[b, s + 1]; the last position of each sequence and every label == ignore_index (-100)
// are ignored. Per valid row r with logits x (row of hidden W^T), label l, lse = logsumexp(x):
//   nll_r  = lse - x_l
//   ce_r   = (1 - eps) nll_r + eps (lse - mean_j x_j)          (label_smoothing eps, as PyTorch)
//   z_r    = z_coef * lse^2                                    (PaLM z-loss)
//   loss   = sum_r (ce_r + z_r) / N,  N = number of valid rows (or options.normalizer)
//   dx_j   = (softmax_j (1 + 2 z_coef lse) - eps / V - (1 - eps) [j == l]) / N
// With row_weights w, row r's terms (in loss and gradient) are multiplied by w_r.
// With logit_softcap c (Gemma 2's final_logit_softcapping) the logits are x <- c tanh(x / c)
// first, and dx is multiplied by 1 - tanh^2 on the way back.
// then dhidden = dlogits W and dW += dlogits^T hidden, chunk by chunk (chunks in order).
// Metrics: loss (ce + z), z_loss (the z term alone), accuracy (argmax == label, first maximum
// wins), tokens (N valid), perplexity = exp(mean nll). With no valid row: loss 0, tokens 0,
// accuracy 0, perplexity 1, zero gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/activations.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/softmax.hpp>
#include <edl/nn/linear.hpp>

namespace edl::nn {

struct LossOptions {
  std::int64_t chunk_rows = 1024;   // rows of logits live at once
  float z_loss = 0.0f;              // coefficient of lse^2 (0: off)
  float label_smoothing = 0.0f;     // in [0, 1)
  std::int64_t ignore_index = -100;
  double normalizer = 0.0;          // > 0: divide by this instead of the number of valid targets
                                    // (gradient accumulation over micro-batches)
  bool shift = true;                // HF causal shift; false: labels are per-row targets already
  /// [batch * seq] or null: row r's loss and gradient are scaled by row_weights[r] (after the
  /// shift; preference losses weigh each sequence's tokens by d loss / d log p(sequence)).
  const float* row_weights = nullptr;
  /// Out, [batch * seq] or null: each row's -log p(target) (0 where ignored), unweighted.
  double* row_nll = nullptr;
  /// > 0: the logits are soft-capped, x <- logit_softcap tanh(x / logit_softcap) (Gemma 2's
  /// final_logit_softcapping; models set it, see LlamaForCausalLM::loss_options).
  float logit_softcap = 0.0f;
  /// The model's compute dtype (f32, bf16, f16): the logits are rounded to it where the head's
  /// product ends, as a model's apply_lm_head rounds them (models set it, see loss_options);
  /// the soft cap, the softmax and the loss run in f32 on the rounded values.
  DType logit_dtype = DType::f32;
};

struct LossMetrics {
  double loss = 0.0;
  double z_loss = 0.0;
  double accuracy = 0.0;
  std::int64_t tokens = 0;
  double perplexity = 1.0;
  // Mixture-of-experts models (unscaled; `loss` holds them times their coefficients):
  double aux_loss = 0.0;       // load balancing (transformers' load_balancing_loss_func)
  double router_z_loss = 0.0;  // mean logsumexp(router logits)^2
};

/// Rounds logits [n] in place to a compute dtype (LossOptions::logit_dtype).
inline void round_logits(DType d, float* x, std::ptrdiff_t n) {
  if (d == DType::bf16) kernels::round_to<bf16>(x, n);
  else if (d == DType::f16) kernels::round_to<f16>(x, n);
}

/// Per-row targets [batch * seq] from labels [batch, seq]: targets[b, s] = labels[b, s + 1],
/// ignore_index at s = seq - 1.
inline std::vector<std::int64_t> shift_labels(const std::int64_t* labels, std::int64_t batch, std::int64_t seq,
                                              std::int64_t ignore_index = -100) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(batch * seq), ignore_index);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s + 1 < seq; ++s) t[static_cast<std::size_t>(b * seq + s)] = labels[b * seq + s + 1];
  return t;
}

/// The fused lm_head + cross-entropy. hidden [batch*seq, H] (after the final norm), weight
/// [V, H] in any storage type gemm accepts (float, bf16). dhidden [batch*seq, H] is written
/// (null: skip), lm_grad [V, H] accumulated (null: skip).
template <class W>
LossMetrics causal_lm_loss(const float* hidden, std::int64_t batch, std::int64_t seq, std::int64_t H, const W* weight,
                           std::int64_t V, const std::int64_t* labels, const LossOptions& opt = {},
                           float* dhidden = nullptr, float* lm_grad = nullptr) {
  const char* where = "nn.causal_lm_loss";
  EDL_CHECK(batch >= 0 && seq >= 0 && H > 0 && V > 0, errc::invalid_argument, where,
            "batch, seq >= 0 and H, V > 0 expected, found ", batch, ", ", seq, ", ", H, ", ", V);
  EDL_CHECK(opt.chunk_rows > 0, errc::invalid_argument, where, "chunk_rows must be positive, found ", opt.chunk_rows);
  EDL_CHECK(opt.label_smoothing >= 0.0f && opt.label_smoothing < 1.0f, errc::invalid_argument, where,
            "label_smoothing must be in [0, 1), found ", opt.label_smoothing);
  const std::int64_t T = batch * seq;
  const std::vector<std::int64_t> targets =
      opt.shift ? shift_labels(labels, batch, seq, opt.ignore_index) : std::vector<std::int64_t>(labels, labels + T);
  std::int64_t valid = 0;
  for (std::int64_t r = 0; r < T; ++r) {
    const std::int64_t l = targets[static_cast<std::size_t>(r)];
    if (l == opt.ignore_index) continue;
    EDL_CHECK(l >= 0 && l < V, errc::invalid_argument, where, "label ", l, " for row ", r, " is outside [0, ", V,
              ") and is not ignore_index ", opt.ignore_index);
    ++valid;
  }
  LossMetrics m;
  m.tokens = valid;
  const bool want_grad = dhidden || lm_grad;
  if (dhidden) std::fill(dhidden, dhidden + T * H, 0.0f);
  if (opt.row_nll) std::fill(opt.row_nll, opt.row_nll + T, 0.0);
  if (valid == 0) return m;

  const double N = opt.normalizer > 0 ? opt.normalizer : static_cast<double>(valid);
  const float gscale = static_cast<float>(1.0 / N);
  const float eps = opt.label_smoothing, zc = opt.z_loss;
  const std::int64_t C = std::min<std::int64_t>(opt.chunk_rows, T);
  std::vector<float> logits(static_cast<std::size_t>(C * V));
  const float cap = opt.logit_softcap;
  std::vector<float> capd(cap > 0 && want_grad ? static_cast<std::size_t>(C * V) : 0);  // 1 - tanh^2
  std::vector<double> ce(static_cast<std::size_t>(C)), zl(ce.size()), nll(ce.size());
  std::vector<char> correct(ce.size());
  double ce_sum = 0, z_sum = 0, nll_sum = 0;
  std::int64_t hits = 0;

  for (std::int64_t r0 = 0; r0 < T; r0 += C) {
    const std::int64_t c = std::min(C, T - r0);
    const std::int64_t* tg = targets.data() + r0;
    if (std::all_of(tg, tg + c, [&](std::int64_t l) { return l == opt.ignore_index; })) continue;
    nn::gemm_ops::mm_nt(hidden + r0 * H, weight, logits.data(), c, V, H);
    round_logits(opt.logit_dtype, logits.data(), static_cast<std::ptrdiff_t>(c * V));
    exec::parallel_for(0, c, std::max<std::int64_t>(1, 16384 / V), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      namespace kd = kernels::detail;
      for (std::ptrdiff_t r = lo; r < hi; ++r) {
        float* x = logits.data() + r * V;
        const std::int64_t l = tg[r];
        const std::size_t ri = static_cast<std::size_t>(r);
        const float w = opt.row_weights ? opt.row_weights[r0 + r] : 1.0f;
        float* xd = capd.empty() ? nullptr : capd.data() + r * V;
        if (cap > 0 && l != opt.ignore_index) kernels::softcap_row(x, xd, V, cap);
        if (l == opt.ignore_index) {
          ce[ri] = zl[ri] = nll[ri] = 0.0;
          correct[ri] = 0;
          if (want_grad) std::fill(x, x + V, 0.0f);
          continue;
        }
        const float mx = kd::row_max(x, V);
        std::int64_t arg = 0;
        while (arg + 1 < V && x[arg] != mx) ++arg;  // bounded: a NaN row never equals its max
        correct[ri] = arg == l;
        const float xl = x[l];
        const float mean_x = eps > 0 ? kd::row_sum(x, V) / static_cast<float>(V) : 0.0f;
        const float s = kd::row_exp_sum(x, want_grad ? x : nullptr, V, mx);
        const float lse = mx + std::log(s);
        nll[ri] = static_cast<double>(lse - xl);
        ce[ri] = w * ((1.0 - eps) * nll[ri] + eps * static_cast<double>(lse - mean_x));
        zl[ri] = w * static_cast<double>(zc) * static_cast<double>(lse) * static_cast<double>(lse);
        if (want_grad) {
          const float gw = gscale * w;
          const float a = gw * (1.0f + 2.0f * zc * lse) / s, b = gw * eps / static_cast<float>(V);
          kernels::mul_sub_inplace(x, V, a, b);
          x[l] -= gw * (1.0f - eps);
          if (xd)
            for (std::int64_t j = 0; j < V; ++j) x[j] *= xd[j];
        }
      }
    });
    for (std::int64_t r = 0; r < c; ++r) {
      const std::size_t ri = static_cast<std::size_t>(r);
      if (opt.row_nll) opt.row_nll[r0 + r] = nll[ri];
      ce_sum += ce[ri];
      z_sum += zl[ri];
      nll_sum += nll[ri];
      hits += correct[ri];
    }
    if (dhidden) nn::gemm_ops::mm(logits.data(), weight, dhidden + r0 * H, c, H, V);
    if (lm_grad) nn::gemm_ops::mm_tn(logits.data(), hidden + r0 * H, lm_grad, V, H, c, /*accumulate=*/true);
  }
  m.z_loss = z_sum / N;
  m.loss = ce_sum / N + m.z_loss;
  m.accuracy = static_cast<double>(hits) / static_cast<double>(valid);
  m.perplexity = std::exp(nll_sum / static_cast<double>(valid));
  return m;
}

}  // namespace edl::nn
