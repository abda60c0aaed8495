// edl/generate/sampling.hpp
// Next-token selection from one row of logits, with HF semantics (docs/generation.md):
//
//   processors (greedy, sampling and beam search), over context = prompt + generated:
//     repetition_penalty p != 1: for every distinct token of the context:
//                                logit < 0 ? logit * p : logit / p          (HF, CTRL)
//     presence_penalty a, frequency_penalty f (OpenAI / vLLM), for every distinct generated
//                                token seen c times: logit -= a + f * c
//     then tokens set to -inf (HF's processors of the same names):
//     no_repeat_ngram_size n:    every token that would complete an n-gram already in the
//                                context (its n - 1 last tokens seen before, followed by it)
//     bad_words_ids:             a one-token sequence always; a longer one's last token when
//                                the context ends with the rest (a sequence that is just an
//                                eos token is dropped, as HF drops it)
//     min_length, min_new_tokens: every stop token (eos_token_id and stop_token_ids) while
//                                the context / the generated tokens are shorter
//     suppress_tokens always; begin_suppress_tokens for the first generated token
//   greedy: argmax (the first index on ties)
//   sampling warpers, HF order: temperature (logit / T), top_k (keep logits >= the k-th largest),
//     top_p (keep a token when the probability of the tokens ranked before it is < top_p,
//     so the smallest head of mass >= top_p, at least one token), min_p (drop tokens with
//     p < min_p * p_max), typical_p m (rank tokens by |-log p - H|, H the entropy, ascending;
//     keep the tokens up to the first whose cumulative probability reaches m, and every token
//     as close to H as it); then softmax over the kept tokens and an inverse-CDF draw in token
//     order with u = uniform_at(fold_in(fold_in(Key::from_seed(seed), b), t), 0): the draw of
//     sequence b at step t depends only on (seed, b, t), so it is reproducible whatever the
//     batch composition, thread count or cache kind.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/kernels/argmax.hpp>

namespace edl::generate {

/// A user's step over one sequence's next-token scores (the seeds' logits_processor): `prompt`
/// is the prompt's index, `context` the prompt and the tokens generated so far, `scores` the
/// vocabulary's scores to change in place (say, -inf to ban a token). Sampling and greedy
/// decoding call it on the model's logits, beam search on the log-probabilities, in both cases
/// before the generation config's own processors (penalties, bans, temperature, top-k / p).
using LogitsProcessor =
    std::function<void(std::int64_t prompt, std::span<const std::int64_t> context, std::span<float> scores)>;

/// A list of processors (HF's LogitsProcessorList) as one: each runs in order on the scores
/// the one before it left; empty entries are skipped.
inline LogitsProcessor chain_processors(std::vector<LogitsProcessor> list) {
  return [list = std::move(list)](std::int64_t prompt, std::span<const std::int64_t> context, std::span<float> scores) {
    for (const auto& f : list)
      if (f) f(prompt, context, scores);
  };
}


using kernels::argmax;

/// The uniform draw of sequence b at step t.
inline float sample_uniform(Key key, std::uint32_t b, std::uint32_t t) noexcept {
  return uniform_at(fold_in(fold_in(key, b), t), 0);
}

/// Applies the processors in place (see the header comment). `context` = prompt + generated,
/// `generated` = generated tokens only. Token ids outside [0, V) are ignored here (the decoder
/// rejects them in the context, GenerationConfig::validate in the config).
class Penalties {
 public:
  void apply(float* logits, std::int64_t V, std::span<const std::int64_t> context,
             std::span<const std::int64_t> generated, const GenerationConfig& c) {
    if (static_cast<std::int64_t>(seen_.size()) < V) seen_.assign(static_cast<std::size_t>(V), 0);
    if (c.repetition_penalty != 1.0f) {
      const float p = c.repetition_penalty;
      for (auto t : context) {
        if (t < 0 || t >= V || seen_[static_cast<std::size_t>(t)]) continue;
        seen_[static_cast<std::size_t>(t)] = 1;
        float& x = logits[t];
        x = x < 0 ? x * p : x / p;
      }
      for (auto t : context)
        if (t >= 0 && t < V) seen_[static_cast<std::size_t>(t)] = 0;
    }
    if (c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f) {
      if (static_cast<std::int64_t>(count_.size()) < V) count_.assign(static_cast<std::size_t>(V), 0);
      for (auto t : generated)
        if (t >= 0 && t < V) ++count_[static_cast<std::size_t>(t)];
      for (auto t : generated) {  // each distinct token once: its count is zeroed after use
        if (t < 0 || t >= V || count_[static_cast<std::size_t>(t)] == 0) continue;
        auto& n = count_[static_cast<std::size_t>(t)];
        logits[t] -= c.presence_penalty + c.frequency_penalty * static_cast<float>(n);
        n = 0;
      }
    }
    const float ninf = -std::numeric_limits<float>::infinity();
    const auto ban = [&](std::int64_t t) {
      if (t >= 0 && t < V) logits[t] = ninf;
    };
    const std::size_t L = context.size();
    if (c.no_repeat_ngram_size > 0 && L + 1 >= static_cast<std::size_t>(c.no_repeat_ngram_size)) {
      const std::size_t n = static_cast<std::size_t>(c.no_repeat_ngram_size);
      const auto prefix = context.subspan(L + 1 - n);  // the n - 1 last tokens
      for (std::size_t i = 0; i + n <= L; ++i)
        if (std::equal(prefix.begin(), prefix.end(), context.begin() + static_cast<std::ptrdiff_t>(i)))
          ban(context[i + n - 1]);
    }
    for (const auto& w : c.bad_words_ids) {
      if (w.size() == 1 && std::find(c.eos_token_id.begin(), c.eos_token_id.end(), w[0]) != c.eos_token_id.end()) continue;
      const std::size_t k = w.size() - 1;  // tokens that must end the context
      if (k <= L && std::equal(w.begin(), w.end() - 1, context.end() - static_cast<std::ptrdiff_t>(k))) ban(w.back());
    }
    if (static_cast<std::int64_t>(L) < c.min_length || static_cast<std::int64_t>(generated.size()) < c.min_new_tokens) {
      for (const auto t : c.eos_token_id) ban(t);
      for (const auto t : c.stop_token_ids) ban(t);
    }
    for (const auto t : c.suppress_tokens) ban(t);
    if (generated.empty())
      for (const auto t : c.begin_suppress_tokens) ban(t);
  }

 private:
  std::vector<std::uint8_t> seen_;
  std::vector<std::int32_t> count_;
};

/// The sampling distribution after temperature, top-k, top-p and min-p: probs[V] sums to 1,
/// zero for filtered tokens. Scratch is kept between calls (no allocation once sized).
class Sampler {
 public:
  /// probs (size V) from logits (after penalties).
  void distribution(const float* logits, std::int64_t V, const GenerationConfig& c, std::vector<float>& probs) {
    probs.resize(static_cast<std::size_t>(V));
    z_.resize(static_cast<std::size_t>(V));
    const float inv_t = 1.0f / c.temperature;
    for (std::int64_t i = 0; i < V; ++i) z_[static_cast<std::size_t>(i)] = logits[i] * inv_t;
    const float ninf = -std::numeric_limits<float>::infinity();
    // top_k: keep values >= the k-th largest (ties kept, as HF).
    if (c.top_k > 0 && c.top_k < V) {
      tmp_.assign(z_.begin(), z_.end());
      std::nth_element(tmp_.begin(), tmp_.begin() + (c.top_k - 1), tmp_.end(), std::greater<float>());
      const float kth = tmp_[static_cast<std::size_t>(c.top_k - 1)];
      for (auto& z : z_)
        if (z < kth) z = ninf;
    }
    softmax(V, probs);
    // top_p: sort by probability, descending (ties by index); keep while the mass before < top_p.
    if (c.top_p < 1.0f) {
      order_.resize(static_cast<std::size_t>(V));
      std::iota(order_.begin(), order_.end(), 0);
      std::stable_sort(order_.begin(), order_.end(), [&](std::int32_t a, std::int32_t b) {
        return probs[static_cast<std::size_t>(a)] > probs[static_cast<std::size_t>(b)];
      });
      double before = 0;
      for (std::size_t r = 0; r < order_.size(); ++r) {
        const std::size_t i = static_cast<std::size_t>(order_[r]);
        if (r > 0 && before >= static_cast<double>(c.top_p)) z_[i] = ninf;
        before += probs[i];
      }
      softmax(V, probs);
    }
    // min_p: drop p < min_p * p_max.
    if (c.min_p > 0.0f) {
      const float pmax = *std::max_element(probs.begin(), probs.end());
      const float thr = c.min_p * pmax;
      for (std::int64_t i = 0; i < V; ++i)
        if (probs[static_cast<std::size_t>(i)] < thr) z_[static_cast<std::size_t>(i)] = ninf;
      softmax(V, probs);
    }
    if (c.typical_p < 1.0f) typical(V, c.typical_p, probs);
  }

  /// Inverse CDF in token order: the first token whose cumulative probability exceeds u.
  static std::int64_t draw(const std::vector<float>& probs, float u) noexcept {
    double cum = 0;
    std::int64_t last = -1;
    for (std::size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] <= 0) continue;
      cum += probs[i];
      last = static_cast<std::int64_t>(i);
      if (static_cast<double>(u) < cum) return last;
    }
    return last < 0 ? 0 : last;  // rounding: the last kept token
  }

  /// Next token from logits (modified in place by the penalties) for sequence b at step t.
  std::int64_t next(float* logits, std::int64_t V, const GenerationConfig& c, std::span<const std::int64_t> context,
                    std::span<const std::int64_t> generated, std::uint32_t b, std::uint32_t t) {
    pen_.apply(logits, V, context, generated, c);
    if (!c.do_sample) return argmax(logits, V);
    distribution(logits, V, c, probs_);
    return draw(probs_, sample_uniform(Key::from_seed(c.seed), b, t));
  }

 private:
  void softmax(std::int64_t V, std::vector<float>& probs) const {
    float mx = -std::numeric_limits<float>::infinity();
    for (float z : z_) mx = std::max(mx, z);
    double sum = 0;
    for (std::int64_t i = 0; i < V; ++i) {
      const float z = z_[static_cast<std::size_t>(i)];
      const double e = z == -std::numeric_limits<float>::infinity() ? 0.0 : std::exp(static_cast<double>(z - mx));
      probs[static_cast<std::size_t>(i)] = static_cast<float>(e);
      sum += e;
    }
    for (auto& p : probs) p = static_cast<float>(p / sum);
  }

  // typical_p (HF TypicalLogitsWarper): distance of each token's surprise from the entropy,
  // the kept head in that order, and every token no farther than its last.
  void typical(std::int64_t V, float mass, std::vector<float>& probs) {
    double H = 0;
    for (const float p : probs)
      if (p > 0) H -= static_cast<double>(p) * std::log(static_cast<double>(p));
    dist_.resize(static_cast<std::size_t>(V));
    for (std::int64_t i = 0; i < V; ++i) {
      const double p = probs[static_cast<std::size_t>(i)];
      dist_[static_cast<std::size_t>(i)] = p > 0 ? std::fabs(-std::log(p) - H) : std::numeric_limits<double>::infinity();
    }
    order_.resize(static_cast<std::size_t>(V));
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(), [&](std::int32_t a, std::int32_t b) {
      return dist_[static_cast<std::size_t>(a)] < dist_[static_cast<std::size_t>(b)];
    });
    // The first rank whose cumulative probability reaches the mass (HF: the count of ranks
    // below it, at most V - 1).
    double cum = 0;
    std::size_t last = order_.size() - 1;
    for (std::size_t r = 0; r < order_.size(); ++r) {
      cum += probs[static_cast<std::size_t>(order_[r])];
      if (!(cum < static_cast<double>(mass))) {
        last = r;
        break;
      }
    }
    const double limit = dist_[static_cast<std::size_t>(order_[last])];
    for (std::size_t r = 1; r < order_.size(); ++r)  // the closest token always stays
      if (dist_[static_cast<std::size_t>(order_[r])] > limit) z_[static_cast<std::size_t>(order_[r])] = -std::numeric_limits<float>::infinity();
    softmax(V, probs);
  }

  Penalties pen_;
  std::vector<float> z_, tmp_, probs_;
  std::vector<double> dist_;
  std::vector<std::int32_t> order_;
};

}  // namespace edl::generate
