// edl/train/evaluation.hpp
// Held-out evaluation shared by the trainer (Trainer::evaluate) and `edl eval`, so that both
// report the same number for the same model and data:
//
//   EvalOptions o{.max_sequence_length = 128, .batch_size = 8, .pad_id = tok.pad_id().value_or(0)};
//   EvalMetrics e = train::evaluate_dataset(model, heldout, o);   // mean CE over target tokens
//   UnigramBaseline u = train::unigram_baseline(train_ds, heldout, vocab_size, o);
//
// evaluate_dataset: the sequences in order, batch_size at a time, collated as in training
// (right padding, truncation by `truncation`), the HF-shifted causal LM loss summed over every
// target token and divided by their number (so the batch size does not change the result
// beyond float rounding of the per-batch means).
//
// unigram_baseline: the cross-entropy of a model that ignores context and predicts every token
// with its frequency in the training data, p(t) = (count(t) + 1) / (N + V) (add-one smoothing,
// so a token unseen in training costs log(N + V) instead of infinity), scored on the same
// held-out target tokens evaluate_dataset scores. A language model that has learned anything
// from context beats it; one that has not sits at it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/nn/loss.hpp>
#include <edl/train/dataset.hpp>

namespace edl::train {

struct EvalMetrics {
  std::int64_t step = 0;
  double loss = 0.0;        // mean over target tokens
  double perplexity = 1.0;  // exp(loss)
  double accuracy = 0.0;
  std::int64_t tokens = 0;
};

struct EvalOptions {
  std::int64_t max_sequence_length = 2048;
  std::int64_t batch_size = 8;                 // sequences per forward pass
  std::optional<std::int64_t> max_batches;     // stop after this many batches (null: all)
  std::int64_t pad_id = 0;
  Truncation truncation = Truncation::keep_end;
  DataCollator collator;                       // batches of rows in place of collate_rows (checked)
  std::int64_t vocab_size = 0;                 // what check_batch holds a collator's ids to (0: no check)
};

/// The model's forward and loss (and backward when asked), with a finiteness check of the
/// final hidden states before the loss: non-finite activations give loss NaN instead of
/// reaching the loss kernel (whose argmax expects finite logits). `remat` names the
/// gradient-checkpointing policy of the forward (remat::parse's spellings; "" keeps everything):
/// the layers keep what it saves and their backward recomputes the rest, with bitwise the same
/// loss and gradients.
template <class Model>
nn::LossMetrics guarded_causal_lm_loss(Model& model, const Batch& b, const nn::LossOptions& lo, bool backward,
                                       std::string_view remat = {}) {
  const nn::TokenLayout lay = b.layout();
  typename Model::Saved s;
  if (!backward || remat.empty()) model.forward(b.input_ids.data(), lay, s);
  else model.forward(b.input_ids.data(), lay, s, remat::parse(remat, "gradient_checkpointing"));
  for (float v : s.hidden)
    if (!std::isfinite(v)) {
      nn::LossMetrics bad;
      bad.loss = std::numeric_limits<double>::quiet_NaN();
      return bad;
    }
  const auto& c = model.config();
  std::vector<float> dhidden(backward ? s.hidden.size() : 0);
  nn::LossOptions opt = lo;
  if constexpr (requires { model.loss_options(lo); }) opt = model.loss_options(lo);
  const auto loss_with = [&](const auto* w, float* grad) {
    return nn::causal_lm_loss(s.hidden.data(), lay.batch, lay.seq, c.hidden_size, w, c.vocab_size, b.labels.data(), opt,
                              backward ? dhidden.data() : nullptr, grad);
  };
  nn::LossMetrics m;
  if constexpr (requires { model.with_head(backward, loss_with); }) m = model.with_head(backward, loss_with);
  else m = loss_with(model.head_weight(), backward ? model.head_grad() : nullptr);
  if constexpr (requires { model.router_losses(s, lay, lo, m, backward); }) model.router_losses(s, lay, lo, m, backward);
  if (backward) model.model.backward(dhidden.data(), s.model_s);
  return m;
}

/// Calls f(batch) for the batches evaluate_dataset scores. An example is `rows_per_example`
/// consecutive rows (2: a preference pair's chosen and rejected sequences); a batch holds
/// o.batch_size examples.
template <class F>
void for_each_eval_batch(const TokenDataset& ds, const EvalOptions& o, F&& f, std::int64_t rows_per_example = 1) {
  EDL_CHECK(o.batch_size > 0, errc::invalid_argument, "evaluation", "batch size must be positive, found ", o.batch_size);
  const std::int64_t examples = ds.size() / rows_per_example;
  std::int64_t batches = 0;
  std::vector<std::int64_t> rows;
  for (std::int64_t lo = 0; lo < examples; lo += o.batch_size) {
    if (o.max_batches && batches >= *o.max_batches) break;
    rows.resize(static_cast<std::size_t>((std::min(examples, lo + o.batch_size) - lo) * rows_per_example));
    std::iota(rows.begin(), rows.end(), lo * rows_per_example);
    if (!o.collator) {
      f(collate_rows(ds, rows, o.max_sequence_length, o.pad_id, o.truncation));
    } else {
      const Batch b = o.collator(ds, rows);
      if (o.vocab_size > 0) check_batch(b, o.vocab_size, "data_collator (evaluation batch " + std::to_string(batches) + ")");
      f(b);
    }
    ++batches;
  }
}

/// Combines per-batch loss metrics into the mean over all target tokens.
class EvalAccumulator {
 public:
  void add(const nn::LossMetrics& m) {
    ce_ += m.loss * static_cast<double>(m.tokens);
    hits_ += m.accuracy * static_cast<double>(m.tokens);
    tokens_ += m.tokens;
  }
  /// The result; throws errc::invalid_argument naming `where` when the loss is not finite.
  EvalMetrics result(const std::string& where) const {
    EDL_CHECK(std::isfinite(ce_), errc::invalid_argument, where, "the eval loss is ", ce_,
              " (the model's outputs are not finite)");
    EvalMetrics e;
    e.tokens = tokens_;
    if (tokens_ > 0) {
      e.loss = ce_ / static_cast<double>(tokens_);
      e.accuracy = hits_ / static_cast<double>(tokens_);
      e.perplexity = std::exp(e.loss);
    }
    return e;
  }

 private:
  double ce_ = 0, hits_ = 0;
  std::int64_t tokens_ = 0;
};

/// Mean loss, perplexity and next-token accuracy of `model` over `ds` (see the header comment).
template <class Model>
EvalMetrics evaluate_dataset(Model& model, const TokenDataset& ds, const EvalOptions& o,
                             const std::string& where = "evaluation") {
  EvalAccumulator acc;
  for_each_eval_batch(ds, o, [&](const Batch& b) { acc.add(guarded_causal_lm_loss(model, b, {}, /*backward=*/false)); });
  return acc.result(where);
}

/// evaluate_dataset for a model sharded over a mesh (models::ShardedLlama): each batch padded
/// to what the mesh splits (rows to a multiple of `row_multiple`, dp x fsdp x ep, with rows
/// that hold no target; positions to a multiple of `seq_multiple`, sp) and scored by the
/// sharded loss, so no process gathers the model. Equals evaluate_dataset of the gathered
/// model within f32 rounding (the mesh sums in another order).
template <class ShardedModel>
EvalMetrics evaluate_dataset_on_mesh(ShardedModel& model, const TokenDataset& ds, const EvalOptions& o,
                                     std::int64_t row_multiple, std::int64_t seq_multiple,
                                     const std::string& where = "evaluation") {
  EvalAccumulator acc;
  for_each_eval_batch(ds, o, [&](const Batch& batch) {
    Batch b = batch;
    pad_rows_to_multiple(b, row_multiple, o.pad_id);
    pad_to_multiple(b, seq_multiple, o.pad_id);
    const nn::TokenLayout lay = b.layout();
    acc.add(model.loss(b.input_ids.data(), b.labels.data(), b.batch, b.seq, nn::LossOptions{}, lay.attention_mask,
                       lay.position_ids, lay.segment_ids));
  });
  return acc.result(where);
}

struct UnigramBaseline {
  double loss = 0.0;            // mean -log p(t) over the held-out target tokens
  double perplexity = 1.0;      // exp(loss)
  double entropy = 0.0;         // entropy of the smoothed training distribution itself
  std::int64_t tokens = 0;      // held-out target tokens scored
  std::int64_t train_tokens = 0;
};

/// Token counts of every token of `ds` (ids must be below vocab_size).
inline std::vector<std::int64_t> token_counts(const TokenDataset& ds, std::int64_t vocab_size) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(vocab_size), 0);
  for (std::int64_t i = 0; i < ds.size(); ++i)
    for (auto t : ds[i]) {
      EDL_CHECK(t >= 0 && t < vocab_size, errc::invalid_argument, "token_counts", "token ", t,
                " is outside the vocabulary (vocab_size ", vocab_size, ")");
      ++c[static_cast<std::size_t>(t)];
    }
  return c;
}

/// The unigram baseline (see the header comment) of `train` scored on `heldout`.
inline UnigramBaseline unigram_baseline(const TokenDataset& train, const TokenDataset& heldout, std::int64_t vocab_size,
                                        const EvalOptions& o) {
  EDL_CHECK(vocab_size > 0, errc::invalid_argument, "unigram_baseline", "vocab_size must be positive");
  const auto counts = token_counts(train, vocab_size);
  UnigramBaseline u;
  u.train_tokens = train.num_tokens();
  const double denom = static_cast<double>(u.train_tokens + vocab_size);
  std::vector<double> nll(counts.size());
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const double p = (static_cast<double>(counts[t]) + 1.0) / denom;
    nll[t] = -std::log(p);
    u.entropy += p * nll[t];
  }
  double sum = 0;
  for_each_eval_batch(heldout, o, [&](const Batch& b) {
    for (std::int64_t r = 0; r < b.batch; ++r)
      for (std::int64_t s = 1; s < b.seq; ++s) {  // the HF shift: position 0 is never a target
        const std::int64_t y = b.labels[static_cast<std::size_t>(r * b.seq + s)];
        if (y == -100) continue;
        EDL_CHECK(y >= 0 && y < vocab_size, errc::invalid_argument, "unigram_baseline", "held-out token ", y,
                  " is outside the vocabulary (vocab_size ", vocab_size, ")");
        sum += nll[static_cast<std::size_t>(y)];
        ++u.tokens;
      }
  });
  if (u.tokens > 0) {
    u.loss = sum / static_cast<double>(u.tokens);
    u.perplexity = std::exp(u.loss);
  }
  return u;
}

}  // namespace edl::train
