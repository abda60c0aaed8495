// edl/models/llama/sequence_classification.hpp
// LlamaForSequenceClassification (HF names): LlamaModel -> score Linear [num_labels, hidden]
// (no bias), read at one pooled token per sequence.
//
//   models::LlamaForSequenceClassification<> m(cfg);       // cfg.num_labels, cfg.pad_token_id
//   models::load_weights(m, io::ShardedCheckpoint::open(dir), {.allow_missing = true});
//   m.logits(ids, {B, S}, out);                             // [B, num_labels]
//   auto r = m.forward_backward(ids, {B, S}, class_ids);    // int64 labels: single-label CE
//   auto r = m.forward_backward(ids, {B, S}, targets);      // float labels: MSE or BCE
//
// Pooling (HF, transformers >= 4.48): with pad_token_id set, sequence b is read at the last
// position s with ids[b, s] != pad_token_id (0 if every token is padding); without it, at the
// last position (seq - 1). Older HF releases used "first pad index - 1, modulo seq", which agrees
// for right padding and differs for left padding; edl follows the newer rule. (HF refuses
// batch > 1 without a pad token; edl reads the last token.)
//
// Loss by problem_type (config.problem_type, or inferred as HF does: num_labels == 1 ->
// regression; int64 labels -> single_label_classification; float labels with num_labels > 1 ->
// multi_label_classification):
//   regression                  MSE, mean over B * num_labels elements (labels float [B, num_labels])
//   single_label_classification cross-entropy, mean over labels != -100 (labels int64 [B])
//   multi_label_classification  BCE with logits, mean over B * num_labels (labels float [B, num_labels])
// forward_backward ACCUMULATES every gradient: d score.weight = dpooled^T h_pooled, and the
// decoder runs LlamaModel::backward with a dhidden that is zero except at the pooled rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/module.hpp>

namespace edl::models {

enum class ProblemType { regression, single_label_classification, multi_label_classification };

inline const char* problem_type_name(ProblemType p) {
  switch (p) {
    case ProblemType::regression: return "regression";
    case ProblemType::single_label_classification: return "single_label_classification";
    case ProblemType::multi_label_classification: return "multi_label_classification";
  }
  return "?";
}

inline ProblemType parse_problem_type(const std::string& s, const std::string& where) {
  if (s == "regression") return ProblemType::regression;
  if (s == "single_label_classification") return ProblemType::single_label_classification;
  if (s == "multi_label_classification") return ProblemType::multi_label_classification;
  ::edl::detail::raise(errc::config, where,
                       "expected regression, single_label_classification or multi_label_classification, found \"" +
                           s + "\"");
}

struct ClassificationMetrics {
  double loss = 0.0;
  double accuracy = 0.0;      // single-label: argmax == label; multi-label: (logit > 0) == label per element
  std::int64_t examples = 0;  // sequences (single-label: with a label != -100)
  ProblemType problem_type = ProblemType::single_label_classification;
};

/// Pooled positions (HF rule, see the header comment) of ids [batch, seq].
inline std::vector<std::int64_t> pooled_positions(const std::int64_t* ids, std::int64_t batch, std::int64_t seq,
                                                  std::optional<std::int64_t> pad_token_id) {
  std::vector<std::int64_t> pos(static_cast<std::size_t>(batch), seq - 1);
  if (!pad_token_id) return pos;
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t last = 0;
    for (std::int64_t s = 0; s < seq; ++s)
      if (ids[b * seq + s] != *pad_token_id) last = s;
    pos[static_cast<std::size_t>(b)] = last;
  }
  return pos;
}

/// config.problem_type, or for labels of integer (true) or float (false) type what HF infers.
inline ProblemType problem_type_of(const LlamaConfig& c, bool integer_labels) {
  if (c.problem_type) return parse_problem_type(*c.problem_type, c.where("problem_type"));
  if (c.num_labels == 1) return ProblemType::regression;
  return integer_labels ? ProblemType::single_label_classification : ProblemType::multi_label_classification;
}

/// What a head's loss divides by: single-label, the labels != -100 (each checked to lie in
/// [0, num_labels)); regression and multi-label, batch * num_labels. Throws on labels of the
/// wrong kind, naming the sequence.
inline double classification_normalizer(ProblemType pt, const std::int64_t* ilabels, const float* flabels,
                                        std::int64_t batch, std::int64_t num_labels) {
  const char* where = "LlamaForSequenceClassification.loss";
  if (pt != ProblemType::single_label_classification) {
    EDL_CHECK(flabels, errc::invalid_argument, where, problem_type_name(pt), " needs float labels [batch, num_labels]");
    return static_cast<double>(batch * num_labels);
  }
  EDL_CHECK(ilabels, errc::invalid_argument, where, "single_label_classification needs integer class labels [batch]");
  std::int64_t valid = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t l = ilabels[b];
    if (l == -100) continue;
    EDL_CHECK(l >= 0 && l < num_labels, errc::invalid_argument, where, "label ", l, " of sequence ", b,
              " is outside [0, ", num_labels, ") and is not -100");
    ++valid;
  }
  return static_cast<double>(valid);
}

/// The examples a head's metrics count: single-label, the labels != -100 (the normalizer);
/// regression and multi-label, the batch.
inline std::int64_t classification_examples(ProblemType pt, double normalizer, std::int64_t batch) noexcept {
  return pt == ProblemType::single_label_classification ? static_cast<std::int64_t>(normalizer) : batch;
}

/// A head's loss summed over some pooled rows (classification_loss_rows).
struct ClassificationSums {
  double loss = 0.0;      // the sum of the rows' terms (divide by the normalizer for the mean)
  std::int64_t hits = 0;  // correct predictions (single-label rows, multi-label elements)
};

/// The loss terms of `rows` pooled rows: logits [rows, num_labels] with their labels (ilabels
/// [rows] or flabels [rows, num_labels], checked by classification_normalizer). With dlogits,
/// writes d mean loss / d logits, the mean being over `normalizer` (the whole batch's). The
/// rows may be any part of a batch: a device's share of it sums to the batch's terms.
inline ClassificationSums classification_loss_rows(ProblemType pt, const float* logits, std::int64_t rows,
                                                   std::int64_t num_labels, const std::int64_t* ilabels,
                                                   const float* flabels, double normalizer, float* dlogits) {
  const std::int64_t L = num_labels;
  ClassificationSums r;
  if (pt == ProblemType::single_label_classification) {
    for (std::int64_t b = 0; b < rows; ++b) {
      const std::int64_t l = ilabels[b];
      const float* x = logits + b * L;
      if (l == -100) {
        if (dlogits) std::fill_n(dlogits + b * L, L, 0.0f);
        continue;
      }
      const float mx = *std::max_element(x, x + L);
      double se = 0;
      for (std::int64_t j = 0; j < L; ++j) se += std::exp(static_cast<double>(x[j] - mx));
      const double lse = mx + std::log(se);
      r.loss += lse - x[l];
      r.hits += (std::max_element(x, x + L) - x) == l;
      if (dlogits)
        for (std::int64_t j = 0; j < L; ++j)
          dlogits[b * L + j] =
              static_cast<float>((std::exp(static_cast<double>(x[j]) - lse) - (j == l ? 1.0 : 0.0)) / normalizer);
    }
    return r;
  }
  for (std::int64_t i = 0; i < rows * L; ++i) {
    const double xi = logits[i], yi = flabels[i];
    if (pt == ProblemType::regression) {
      r.loss += (xi - yi) * (xi - yi);
      if (dlogits) dlogits[i] = static_cast<float>(2.0 * (xi - yi) / normalizer);
    } else {
      // BCEWithLogits, stable: max(x, 0) - x y + log(1 + exp(-|x|))
      r.loss += std::max(xi, 0.0) - xi * yi + std::log1p(std::exp(-std::fabs(xi)));
      if (dlogits) dlogits[i] = static_cast<float>((1.0 / (1.0 + std::exp(-xi)) - yi) / normalizer);
      r.hits += (xi > 0) == (yi > 0.5);
    }
  }
  return r;
}

template <class Pol = DefaultPolicy>
class LlamaForSequenceClassification {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  static constexpr const char* hf_architecture = "LlamaForSequenceClassification";
  /// The seeds' can_generate(): a classification head has no next-token logits.
  static constexpr bool can_generate() noexcept { return false; }
  using T = typename Pol::param_t;
  using ScoreLinear = nn::Linear<Pol, P<none, none>>;  // [num_labels, hidden], replicated

  struct Saved {
    typename LlamaModel<Pol>::Saved model_s;
    std::vector<float> hidden;         // [T, H]
    std::vector<float> pooled_hidden;  // [B, H]
    std::vector<float> logits;         // [B, num_labels]
    std::vector<std::int64_t> pos;     // [B] pooled positions
    std::int64_t batch = 0, seq = 0;
  };

  LlamaForSequenceClassification() = default;
  explicit LlamaForSequenceClassification(const LlamaConfig& c) : model(c) {
    EDL_CHECK(c.num_labels > 0, errc::config, c.where("num_labels"),
              "sequence classification needs num_labels > 0, found ", c.num_labels);
    if (c.problem_type) parse_problem_type(*c.problem_type, c.where("problem_type"));
    score = ScoreLinear(c.hidden_size, c.num_labels, false);
  }

  LlamaModel<Pol> model;
  ScoreLinear score;

  const LlamaConfig& config() const noexcept { return model.config(); }
  std::int64_t num_labels() const noexcept { return config().num_labels; }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    model.visit_params(nn::join_path(prefix, "model"), f);
    score.visit_params(nn::join_path(prefix, "score"), f);
  }
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    model.visit_linears(nn::join_path(prefix, "model"), f);
    score.visit_linears(nn::join_path(prefix, "score"), f);
  }
  std::int64_t param_count() const noexcept { return model.param_count() + score.param_count(); }
  double flops_forward(std::int64_t batch, std::int64_t seq) const noexcept {
    return model.flops_forward(batch, seq) + score.flops_forward(batch);
  }
  void init(Key key, float std = -1.0f) {
    nn::init_params(*this, key, std >= 0 ? std : static_cast<float>(config().initializer_range));
  }

  /// The problem type for labels of integer (true) or float (false) type, as HF infers it.
  ProblemType problem_type(bool integer_labels) const { return problem_type_of(config(), integer_labels); }

  /// Forward to the pooled logits (kept in s.logits, [batch, num_labels]).
  void forward(const std::int64_t* ids, const nn::TokenLayout& layout, Saved& s) const {
    const std::int64_t H = config().hidden_size, B = layout.batch, S = layout.seq, L = num_labels();
    s.batch = B;
    s.seq = S;
    s.hidden.resize(static_cast<std::size_t>(layout.tokens() * H));
    model.forward(ids, layout, s.hidden.data(), s.model_s);
    s.pos = pooled_positions(ids, B, S, config().pad_token_id);
    s.pooled_hidden.resize(static_cast<std::size_t>(B * H));
    for (std::int64_t b = 0; b < B; ++b)
      std::copy_n(s.hidden.data() + (b * S + s.pos[static_cast<std::size_t>(b)]) * H, H,
                  s.pooled_hidden.data() + b * H);
    s.logits.resize(static_cast<std::size_t>(B * L));
    score.apply(s.pooled_hidden.data(), B, s.logits.data());
    nn::round_activations<Pol>(s.logits);  // the head's output, as a causal LM's logits
  }

  /// Pooled logits [batch, num_labels].
  void logits(const std::int64_t* ids, const nn::TokenLayout& layout, float* out) const {
    Saved s;
    forward(ids, layout, s);
    std::copy(s.logits.begin(), s.logits.end(), out);
  }

  /// Loss only. Integer labels [batch] (single-label; -100 ignored) ...
  ClassificationMetrics loss(const std::int64_t* ids, const nn::TokenLayout& layout, const std::int64_t* labels) const {
    Saved s;
    forward(ids, layout, s);
    return head_loss(s, problem_type(true), labels, nullptr, nullptr);
  }
  /// ... or float labels [batch, num_labels] (regression / multi-label).
  ClassificationMetrics loss(const std::int64_t* ids, const nn::TokenLayout& layout, const float* labels) const {
    Saved s;
    forward(ids, layout, s);
    return head_loss(s, problem_type(false), nullptr, labels, nullptr);
  }

  /// Forward, loss and backward; ACCUMULATES every gradient.
  ClassificationMetrics forward_backward(const std::int64_t* ids, const nn::TokenLayout& layout,
                                         const std::int64_t* labels) {
    return fb(ids, layout, problem_type(true), labels, nullptr);
  }
  ClassificationMetrics forward_backward(const std::int64_t* ids, const nn::TokenLayout& layout, const float* labels) {
    return fb(ids, layout, problem_type(false), nullptr, labels);
  }

  /// Backward from d loss / d pooled logits [batch, num_labels] (after forward into s).
  void backward(const float* dlogits, Saved& s) {
    const std::int64_t H = config().hidden_size, B = s.batch, S = s.seq;
    typename ScoreLinear::Saved ss;
    ss.x = s.pooled_hidden.data();
    ss.rows = B;
    std::vector<float> dpooled(static_cast<std::size_t>(B * H));
    score.backward(dlogits, ss, dpooled.data());
    std::vector<float> dhidden(s.hidden.size(), 0.0f);
    for (std::int64_t b = 0; b < B; ++b) {
      float* row = dhidden.data() + (b * S + s.pos[static_cast<std::size_t>(b)]) * H;
      for (std::int64_t j = 0; j < H; ++j) row[j] += dpooled[static_cast<std::size_t>(b * H + j)];
    }
    model.backward(dhidden.data(), s.model_s);
  }

 private:
  ClassificationMetrics fb(const std::int64_t* ids, const nn::TokenLayout& layout, ProblemType pt,
                           const std::int64_t* ilabels, const float* flabels) {
    Saved s;
    forward(ids, layout, s);
    std::vector<float> dlogits(s.logits.size(), 0.0f);
    const ClassificationMetrics m = head_loss(s, pt, ilabels, flabels, dlogits.data());
    backward(dlogits.data(), s);
    return m;
  }

  /// The loss of s.logits; writes d loss / d logits when dlogits is not null.
  ClassificationMetrics head_loss(const Saved& s, ProblemType pt, const std::int64_t* ilabels, const float* flabels,
                                  float* dlogits) const {
    const std::int64_t B = s.batch, L = num_labels();
    ClassificationMetrics m;
    m.problem_type = pt;
    const double normalizer = classification_normalizer(pt, ilabels, flabels, B, L);
    m.examples = classification_examples(pt, normalizer, B);
    if (m.examples == 0) return m;
    const ClassificationSums sums =
        classification_loss_rows(pt, s.logits.data(), B, L, ilabels, flabels, normalizer, dlogits);
    m.loss = sums.loss / normalizer;
    if (pt != ProblemType::regression) m.accuracy = static_cast<double>(sums.hits) / normalizer;
    return m;
  }
};

}  // namespace edl::models
