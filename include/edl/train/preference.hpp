// edl/train/preference.hpp
// Preference optimisation on a batch of pairs: rows 2i (prompt + chosen) and 2i + 1 (prompt +
// rejected) of a Batch whose labels are -100 except on the completions (preference_batch).
// DPO (Rafailov et al.) and IPO as TRL's DPOTrainer computes them, and ORPO (Hong et al.) as
// TRL's ORPOTrainer does.
//
//   log p(row)  = sum over the row's scored targets of log p(target)   (the HF shift applies)
//   DPO:  h_i   = (log pi(c_i) - log ref(c_i)) - (log pi(r_i) - log ref(r_i))
//     sigmoid:    loss_i = -(1 - eps) log sigmoid(beta h_i) - eps log sigmoid(-beta h_i)
//     ipo:        loss_i = (h_i - 1 / (2 beta))^2, with each log p averaged over its tokens
//     rewards   = beta (log pi - log ref) of the chosen and of the rejected completion
//   ORPO: with a, b the chosen and rejected log p averaged over their tokens (no reference),
//     log_odds_i  = (a - b) - (log(1 - e^a) - log(1 - e^b))
//     loss        = NLL of the chosen completions (mean over their tokens) - beta mean_i log sigmoid(log_odds_i)
//     rewards     = beta a and beta b
//   loss        = sum_i loss_i / pairs      (pairs: the step's, over its micro-batches; ORPO's NLL
//                                            divides by the step's chosen tokens)
//
// The gradient reaches the policy through one weighted cross-entropy backward: d loss / d log p
// of each row weighs its tokens' -log p (nn::LossOptions::row_weights), so the policy runs one
// forward and one backward; DPO's reference runs one forward and no backward. The reference is
// a model, or the policy itself with its LoRA adapters switched off (no second copy). With the
// reference equal to the policy, h = 0: the sigmoid loss is exactly log 2 and every reward 0.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/lora/apply.hpp>
#include <edl/nn/loss.hpp>
#include <edl/nn/module.hpp>
#include <edl/train/dataset.hpp>
#include <edl/train/preference_options.hpp>

namespace edl::train {

/// The batch's means, with TRL's metric names (rewards/chosen, ...).
struct PreferenceMetrics {
  double loss = 0.0;              // this batch's share of the step's loss
  double rewards_chosen = 0.0, rewards_rejected = 0.0, rewards_accuracies = 0.0, rewards_margins = 0.0;
  double logps_chosen = 0.0, logps_rejected = 0.0;  // DPO: sums over the tokens; ORPO: means
  double nll_loss = 0.0;          // ORPO: this batch's share of the step's chosen NLL
  double log_odds_ratio = 0.0, log_odds_chosen = 0.0;  // ORPO: means of log sigmoid(log_odds), log_odds
  std::int64_t pairs = 0;

  /// Adds w x each of m's means (rewards, logps, log odds): a weighted mean over batches.
  void add_means(const PreferenceMetrics& m, double w) {
    for (auto [dst, src] : means_with(m)) *dst += w * *src;
  }
  /// Multiplies every mean by s.
  void scale_means(double s) {
    for (auto [dst, src] : means_with(*this)) *dst *= s;
  }

 private:
  std::array<std::pair<double*, const double*>, 8> means_with(const PreferenceMetrics& m) {
    return {{{&rewards_chosen, &m.rewards_chosen}, {&rewards_rejected, &m.rewards_rejected},
             {&rewards_accuracies, &m.rewards_accuracies}, {&rewards_margins, &m.rewards_margins},
             {&logps_chosen, &m.logps_chosen}, {&logps_rejected, &m.logps_rejected},
             {&log_odds_ratio, &m.log_odds_ratio}, {&log_odds_chosen, &m.log_odds_chosen}}};
  }
};

/// Rows 2i and 2i + 1 of a preference batch from sequences and their scored masks, as collate
/// pads and truncates them.
inline Batch preference_batch(const std::vector<std::span<const std::int32_t>>& seqs,
                              const std::vector<std::span<const std::uint8_t>>& scored, std::int64_t max_length,
                              std::int64_t pad_id, Truncation mode = Truncation::keep_end) {
  EDL_CHECK(seqs.size() % 2 == 0, errc::invalid_argument, "preference_batch",
            "expected (chosen, rejected) pairs of rows, found ", seqs.size(), " rows");
  return collate(seqs, max_length, pad_id, mode, &scored);
}

namespace preference_detail {

/// Per row of `b`: the sum of log p over its scored targets (from the per-position NLLs
/// nn::LossOptions::row_nll gives), and their count.
inline void logps_from_nll(const Batch& b, const std::vector<double>& nll, std::vector<double>& logp,
                           std::vector<std::int64_t>& count) {
  logp.assign(static_cast<std::size_t>(b.batch), 0.0);
  count.assign(static_cast<std::size_t>(b.batch), 0);
  for (std::int64_t r = 0; r < b.batch; ++r)
    for (std::int64_t t = 0; t + 1 < b.seq; ++t)
      if (b.labels[static_cast<std::size_t>(r * b.seq + t + 1)] != -100) {
        logp[static_cast<std::size_t>(r)] -= nll[static_cast<std::size_t>(r * b.seq + t)];
        ++count[static_cast<std::size_t>(r)];
      }
}

/// Per row of `b`: the sum of log p over its scored targets, and their count; `s` keeps the
/// forward for a backward.
template <class Model>
void row_logps(const Model& m, const Batch& b, typename Model::Saved& s, std::vector<double>& logp,
               std::vector<std::int64_t>& count) {
  m.forward(b.input_ids.data(), b.layout(), s);
  std::vector<double> nll(static_cast<std::size_t>(b.batch * b.seq));
  nn::LossOptions o;
  o.row_nll = nll.data();
  const auto& c = m.config();
  const_cast<Model&>(m).with_head(false, [&](const auto* w, float*) {
    return nn::causal_lm_loss(s.hidden.data(), b.batch, b.seq, c.hidden_size, w, c.vocab_size, b.labels.data(),
                              m.loss_options(o));
  });
  logps_from_nll(b, nll, logp, count);
}

/// The scored targets of the chosen rows (the even ones) of a preference batch: ORPO's NLL
/// denominator.
inline std::int64_t chosen_targets(const Batch& b) {
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < b.batch; r += 2)
    for (std::int64_t t = 1; t < b.seq; ++t) n += b.labels[static_cast<std::size_t>(r * b.seq + t)] != -100;
  return n;
}

inline double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace preference_detail

/// The preference loss of batch `b` from the rows' log-probabilities: `policy_logps(logp,
/// count)` and DPO's `reference_logps(logp, count)` give them per row; with `backward`,
/// `policy_backward(weights)` ACCUMULATES the gradient of sum over positions of weights x NLL
/// into the policy (weights [batch * seq]: -d loss / d log p of the position's row). The model
/// behind them may be one device or a mesh. `step_pairs` > 0: the pairs of the whole optimizer
/// step (micro-batches), the loss's denominator; `step_chosen` > 0: the step's chosen targets
/// (ORPO's NLL).
template <class PolicyLogps, class PolicyBackward, class ReferenceLogps>
PreferenceMetrics preference_objective(PolicyLogps&& policy_logps, PolicyBackward&& policy_backward,
                                       ReferenceLogps&& reference_logps, const Batch& b, const PreferenceOptions& o,
                                       bool backward, std::int64_t step_pairs, std::int64_t step_chosen) {
  namespace d = preference_detail;
  EDL_CHECK(b.batch % 2 == 0 && b.batch > 0, errc::invalid_argument, "preference_loss",
            "expected (chosen, rejected) pairs of rows, found ", b.batch, " rows");
  const std::int64_t P = b.batch / 2, S = b.seq;
  const double denom = static_cast<double>(step_pairs > 0 ? step_pairs : P);
  const double nll_denom = static_cast<double>(std::max<std::int64_t>(1, step_chosen > 0 ? step_chosen : d::chosen_targets(b)));
  std::vector<double> ref, pol;
  std::vector<std::int64_t> n;
  if (!o.orpo) reference_logps(ref, n);
  policy_logps(pol, n);
  const bool ipo = o.loss_type == "ipo" && !o.orpo, averaged = ipo || o.orpo;
  PreferenceMetrics m;
  m.pairs = P;
  if (o.orpo) {  // the chosen completions' NLL, before averaging
    for (std::int64_t i = 0; i < P; ++i) m.nll_loss -= pol[static_cast<std::size_t>(2 * i)] / nll_denom;
    ref.assign(pol.size(), 0.0);
  }
  if (averaged)  // log p per token
    for (std::size_t r = 0; r < pol.size(); ++r) {
      const double k = static_cast<double>(std::max<std::int64_t>(1, n[r]));
      pol[r] /= k;
      ref[r] /= k;
    }
  std::vector<double> dlogp(static_cast<std::size_t>(b.batch), 0.0);  // d loss / d log pi(row)
  const double beta = o.beta, eps = o.label_smoothing, Pd = static_cast<double>(P);
  for (std::int64_t i = 0; i < P; ++i) {
    const std::size_t c = static_cast<std::size_t>(2 * i), r = c + 1;
    double loss;
    if (o.orpo) {
      // A certain completion (log p = 0) would make log(1 - e^a) infinite: a stays below -1e-9.
      const double a = std::min(pol[c], -1e-9), bb = std::min(pol[r], -1e-9);
      const double lo = (a - bb) - (std::log(-std::expm1(a)) - std::log(-std::expm1(bb)));
      loss = -beta * d::log_sigmoid(lo);
      const double dlo = -beta * d::sigmoid(-lo) / denom;  // d loss / d log_odds
      dlogp[c] = dlo / -std::expm1(a);                      // d log_odds / da = 1 / (1 - e^a)
      dlogp[r] = -dlo / -std::expm1(bb);
      m.log_odds_ratio += d::log_sigmoid(lo) / Pd;
      m.log_odds_chosen += lo / Pd;
    } else {
      const double h = (pol[c] - ref[c]) - (pol[r] - ref[r]);
      double dh;
      if (ipo) {
        const double e = h - 1.0 / (2.0 * beta);
        loss = e * e;
        dh = 2.0 * e;
      } else {
        const double z = beta * h;
        loss = -(1.0 - eps) * d::log_sigmoid(z) - eps * d::log_sigmoid(-z);
        dh = beta * (-(1.0 - eps) * d::sigmoid(-z) + eps * d::sigmoid(z));
      }
      dlogp[c] = dh / denom;
      dlogp[r] = -dh / denom;
    }
    m.loss += loss / denom;
    const double rc = beta * (pol[c] - ref[c]), rr = beta * (pol[r] - ref[r]);
    m.rewards_chosen += rc / Pd;
    m.rewards_rejected += rr / Pd;
    m.rewards_accuracies += (rc > rr ? 1.0 : 0.0) / Pd;
    m.rewards_margins += (rc - rr) / Pd;
    m.logps_chosen += pol[c] / Pd;
    m.logps_rejected += pol[r] / Pd;
  }
  m.loss += m.nll_loss;
  if (!backward) return m;
  // log pi(row) = -sum nll: its tokens' cross-entropy weighs -d loss / d log pi (averaged: / count),
  // and ORPO's chosen tokens 1 / (the step's chosen targets) more.
  std::vector<float> w(static_cast<std::size_t>(b.batch * S), 0.0f);
  for (std::int64_t row = 0; row < b.batch; ++row) {
    double g = -dlogp[static_cast<std::size_t>(row)];
    if (averaged) g /= static_cast<double>(std::max<std::int64_t>(1, n[static_cast<std::size_t>(row)]));
    if (o.orpo && row % 2 == 0) g += 1.0 / nll_denom;
    for (std::int64_t t = 0; t < S; ++t) w[static_cast<std::size_t>(row * S + t)] = static_cast<float>(g);
  }
  policy_backward(w);
  return m;
}

/// preference_objective for a one-device model: one forward for the log-probabilities, kept for
/// the weighted cross-entropy backward.
template <class Model, class ReferenceLogps>
PreferenceMetrics preference_loss_with(Model& policy, ReferenceLogps&& reference_logps, const Batch& b,
                                       const PreferenceOptions& o, bool backward, std::int64_t step_pairs,
                                       std::int64_t step_chosen) {
  typename Model::Saved s;
  return preference_objective(
      [&](std::vector<double>& logp, std::vector<std::int64_t>& count) {
        preference_detail::row_logps(policy, b, s, logp, count);
      },
      [&](const std::vector<float>& w) {
        nn::LossOptions lo;
        lo.normalizer = 1.0;
        lo.row_weights = w.data();
        const auto& cfg = policy.config();
        std::vector<float> dhidden(s.hidden.size());
        policy.with_head(true, [&](const auto* wt, float* grad) {
          return nn::causal_lm_loss(s.hidden.data(), b.batch, b.seq, cfg.hidden_size, wt, cfg.vocab_size,
                                    b.labels.data(), policy.loss_options(lo), dhidden.data(), grad);
        });
        policy.model.backward(dhidden.data(), s.model_s);
      },
      reference_logps, b, o, backward, step_pairs, step_chosen);
}

/// DPO against a frozen `reference` model (see preference_loss_with; ORPO ignores it).
template <class Model, class Reference>
PreferenceMetrics preference_loss(Model& policy, const Reference& reference, const Batch& b, const PreferenceOptions& o,
                                  bool backward, std::int64_t step_pairs = 0, std::int64_t step_chosen = 0) {
  return preference_loss_with(
      policy,
      [&](std::vector<double>& logp, std::vector<std::int64_t>& count) {
        typename Reference::Saved rs;
        preference_detail::row_logps(reference, b, rs, logp, count);
      },
      b, o, backward, step_pairs, step_chosen);
}

/// ORPO, or DPO against the policy with its LoRA adapters switched off (the base it adapts).
template <class Model>
PreferenceMetrics preference_loss(Model& policy, const Batch& b, const PreferenceOptions& o, bool backward,
                                  std::int64_t step_pairs = 0, std::int64_t step_chosen = 0) {
  EDL_CHECK(o.orpo || lora::lora_is_enabled(policy), errc::invalid_argument, "preference_loss",
            "DPO without a reference model needs LoRA adapters on the policy (the reference is its base); "
            "found a policy without adapters");
  return preference_loss_with(
      policy,
      [&](std::vector<double>& logp, std::vector<std::int64_t>& count) {
        const lora::AdaptersOff<Model> off(policy);
        typename Model::Saved rs;
        preference_detail::row_logps(policy, b, rs, logp, count);
      },
      b, o, backward, step_pairs, step_chosen);
}

/// Per row of `b`: the sum of log p over its scored targets of a model on a mesh
/// (models::ShardedLlama), and their count. A batch the mesh does not split (an evaluation
/// batch) is scored padded with target-free rows and positions (pad_rows_to_multiple,
/// pad_to_multiple); the padding's rows are dropped from the result.
template <class Sharded>
void sharded_row_logps(Sharded& m, const Batch& b, std::vector<double>& logp, std::vector<std::int64_t>& count) {
  const bool fits = b.batch % m.batch_multiple() == 0 && b.seq % m.seq_multiple() == 0;
  Batch padded;
  if (!fits) {
    padded = b;
    pad_rows_to_multiple(padded, m.batch_multiple(), 0);
    pad_to_multiple(padded, m.seq_multiple(), 0);
  }
  const Batch& x = fits ? b : padded;
  const nn::TokenLayout lay = x.layout();
  std::vector<double> nll(static_cast<std::size_t>(x.batch * x.seq));
  nn::LossOptions lo;
  lo.row_nll = nll.data();
  m.loss(x.input_ids.data(), x.labels.data(), x.batch, x.seq, lo, lay.attention_mask, lay.position_ids, lay.segment_ids);
  preference_detail::logps_from_nll(x, nll, logp, count);
  logp.resize(static_cast<std::size_t>(b.batch));
  count.resize(static_cast<std::size_t>(b.batch));
}

/// The preference loss of batch `b` for a policy on a mesh (models::ShardedLlama: its loss and
/// loss_and_grads with per-position NLLs and weights), against a frozen `reference` on the same
/// mesh or on one device (null: ORPO, or DPO against the base of a policy with LoRA adapters,
/// run on the mesh with them switched off). The policy runs one forward for the
/// log-probabilities and, with `backward`, one forward and backward for the gradient (the
/// batch must then split over the mesh; without, any batch is scored, padded); the result
/// equals the one-device loss within f32 rounding.
template <class Sharded, class Reference>
PreferenceMetrics sharded_preference_loss(Sharded& policy, Reference* reference, const Batch& b,
                                          const PreferenceOptions& o, bool backward, std::int64_t step_pairs = 0,
                                          std::int64_t step_chosen = 0) {
  EDL_CHECK(o.orpo || reference != nullptr || policy.has_adapters(), errc::invalid_argument, "sharded_preference_loss",
            "DPO needs a reference model, or LoRA adapters on the policy (the reference is its base)");
  return preference_objective(
      [&](std::vector<double>& logp, std::vector<std::int64_t>& count) { sharded_row_logps(policy, b, logp, count); },
      [&](const std::vector<float>& w) {
        const nn::TokenLayout lay = b.layout();
        nn::LossOptions lo;
        lo.normalizer = 1.0;
        lo.row_weights = w.data();
        policy.loss_and_grads(b.input_ids.data(), b.labels.data(), b.batch, b.seq, lo, lay.attention_mask,
                              lay.position_ids, lay.segment_ids);
      },
      [&](std::vector<double>& logp, std::vector<std::int64_t>& count) {
        if (!reference) {  // the policy's base: its adapters switched off for this forward
          const lora::AdaptersOff<Sharded> off(policy);
          return sharded_row_logps(policy, b, logp, count);
        }
        if constexpr (requires { reference->batch_multiple(); }) {  // a reference on the mesh
          sharded_row_logps(*reference, b, logp, count);
        } else {
          typename Reference::Saved rs;
          preference_detail::row_logps(*reference, b, rs, logp, count);
        }
      },
      b, o, backward, step_pairs, step_chosen);
}

}  // namespace edl::train
