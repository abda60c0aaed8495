// edl/generate/beam_search.hpp
// Beam search over a Decoder, following HF transformers' BeamSearchScorer (docs/generation.md):
//
//   - each prompt starts num_beams beams; beam 0 has score 0, the others -1e9 (so the first
//     step expands one beam);
//   - per step, per beam: scores = log_softmax(logits), then the user's logits processor and the
//     config's processors (repetition / presence penalty) on the log-probabilities, plus the
//     beam's running score;
//   - beam sampling (do_sample): each beam's processed log-probabilities then go through the
//     sampling warpers (temperature, top_k, top_p, min_p, typical_p: a filtered token scores
//     -inf) before the running score is added, and the candidates are drawn from the softmax
//     over all num_beams x vocab scores, without replacement, then ordered best first (HF's
//     multinomial then sort). The draw is Gumbel-top-k (the largest score + Gumbel noise, the
//     noise counter-based by seed, prompt and step: the same on any mesh), which has the
//     distribution of successive draws without replacement;
//   - the top max(2, 1 + #stop tokens) * num_beams (beam, token) candidates, best first (ties:
//     lower beam * vocab + token first); a stop token among the first num_beams candidates
//     closes a hypothesis (tokens + the stop token, score = sum_logprobs / generated_len ^
//     length_penalty, generated_len counting the stop token); the first num_beams other
//     candidates continue;
//   - a prompt is done when it holds num_beams hypotheses and: early_stopping = true: at once;
//     heuristic (false): the best running score / generated_len ^ length_penalty cannot beat
//     the worst hypothesis; "never": the same bound with the longest possible length when
//     length_penalty > 0;
//   - at max_new_tokens (or max_model_length) the running beams are added as hypotheses;
//     the result is the best hypothesis, or with num_return_sequences n (<= num_beams) the n
//     best, best first (HF's beam_scorer.finalize).
// One documented difference: HF <= 4.4x divides a closing hypothesis by the length *before* its
// stop token; edl counts the stop token (no division by zero at the first step).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/sampling.hpp>

namespace edl::generate {

namespace detail {

struct Hypotheses {
  std::int64_t num_beams = 1;
  float length_penalty = 1.0f;
  EarlyStopping early = EarlyStopping::heuristic;
  std::vector<std::pair<float, std::vector<std::int64_t>>> beams;  // (score, new tokens)

  float worst() const {
    float w = std::numeric_limits<float>::infinity();
    for (const auto& b : beams) w = std::min(w, b.first);
    return w;
  }
  void add(std::vector<std::int64_t> tokens, float sum_logprobs, std::int64_t generated_len) {
    const float score = sum_logprobs / std::pow(static_cast<float>(std::max<std::int64_t>(1, generated_len)), length_penalty);
    if (static_cast<std::int64_t>(beams.size()) < num_beams || score > worst()) {
      beams.emplace_back(score, std::move(tokens));
      if (static_cast<std::int64_t>(beams.size()) > num_beams) {
        auto it = std::min_element(beams.begin(), beams.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        beams.erase(it);
      }
    }
  }
  bool is_done(float best_sum_logprobs, std::int64_t cur_len, std::int64_t max_len) const {
    if (static_cast<std::int64_t>(beams.size()) < num_beams) return false;
    if (early == EarlyStopping::yes) return true;
    std::int64_t len = cur_len;
    if (early == EarlyStopping::never && length_penalty > 0) len = max_len;
    const float best = best_sum_logprobs / std::pow(static_cast<float>(std::max<std::int64_t>(1, len)), length_penalty);
    return worst() >= best;
  }
};

inline void log_softmax_row(float* x, std::int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i] - mx));
  const float lse = mx + static_cast<float>(std::log(s));
  for (std::int64_t i = 0; i < n; ++i) x[i] -= lse;
}

}  // namespace detail

/// Beam search for prompts [P][len] on a decoder whose cache holds P * num_beams sequences
/// (row p * num_beams + k = beam k of prompt p) and is empty. Returns the new tokens of the
/// num_return_sequences best hypotheses of each prompt, prompt by prompt, best first.
/// limit[p]: the most new tokens prompt p may get. prompts give each beam's starting context
/// (empty for prompts given as vectors, `embeds`, laid out as ids_padded; see Decoder::prefill).
template <class Dec>
std::vector<std::vector<std::int64_t>> beam_search(Dec& dec,
                                                   const std::vector<std::vector<std::int64_t>>& prompts,
                                                   const GenerationConfig& cfg, const std::vector<std::int64_t>& limit,
                                                   const std::vector<std::int64_t>& ids_padded, std::int64_t seq,
                                                   const std::vector<std::int64_t>& mask_padded, std::int64_t V,
                                                   const LogitsProcessor& processor = {},
                                                   const float* embeds = nullptr) {
  const std::int64_t P = static_cast<std::int64_t>(prompts.size()), nb = cfg.num_beams, R = P * nb;
  EDL_CHECK(dec.batch() == R, errc::invalid_argument, "generate.beam_search", "the cache holds ", dec.batch(),
            " sequences, expected prompts x num_beams = ", R);
  std::vector<float> logits(static_cast<std::size_t>(R * V));
  std::vector<float> score(static_cast<std::size_t>(R), 0.0f);
  std::vector<std::vector<std::int64_t>> seqs(static_cast<std::size_t>(R));
  std::vector<detail::Hypotheses> hyps(static_cast<std::size_t>(P));
  std::vector<std::uint8_t> done(static_cast<std::size_t>(P), 0), active(static_cast<std::size_t>(R), 1);
  for (auto& h : hyps) {
    h.num_beams = nb;
    h.length_penalty = cfg.length_penalty;
    h.early = cfg.early_stopping;
  }
  for (std::int64_t p = 0; p < P; ++p)
    for (std::int64_t k = 1; k < nb; ++k) score[static_cast<std::size_t>(p * nb + k)] = -1e9f;

  dec.prefill(ids_padded.data(), seq, mask_padded.data(), logits.data(), nullptr, embeds);
  std::int64_t n_stop = 0;
  for (std::int64_t t = 0; t < V; ++t) n_stop += cfg.is_stop(t) ? 1 : 0;
  const std::int64_t keep = std::max<std::int64_t>(2, 1 + n_stop) * nb;
  Penalties pen;
  Sampler warp;  // beam sampling: temperature, top-k, top-p, ... as the sampling loop's
  std::vector<float> probs, noisy;
  std::vector<std::int64_t> src(static_cast<std::size_t>(R)), next_tok(static_cast<std::size_t>(R), 0), ctx;
  std::vector<float> next_score(static_cast<std::size_t>(R));
  std::vector<std::int64_t> cand(static_cast<std::size_t>(nb * V));

  const auto finalize = [&](std::int64_t p, std::int64_t g) {
    for (std::int64_t k = 0; k < nb; ++k) {
      const std::size_t r = static_cast<std::size_t>(p * nb + k);
      hyps[static_cast<std::size_t>(p)].add(seqs[r], score[r], g);
    }
    done[static_cast<std::size_t>(p)] = 1;
  };
  for (std::int64_t p = 0; p < P; ++p)
    if (limit[static_cast<std::size_t>(p)] <= 0) finalize(p, 0);

  for (std::int64_t g = 0;; ++g) {
    bool any = false;
    for (std::int64_t r = 0; r < R; ++r) src[static_cast<std::size_t>(r)] = r;
    for (std::int64_t p = 0; p < P; ++p) {
      if (done[static_cast<std::size_t>(p)]) continue;
      float* base = logits.data() + p * nb * V;
      for (std::int64_t k = 0; k < nb; ++k) {
        const std::size_t r = static_cast<std::size_t>(p * nb + k);
        float* row = base + k * V;
        detail::log_softmax_row(row, V);
        ctx.assign(prompts[static_cast<std::size_t>(p)].begin(), prompts[static_cast<std::size_t>(p)].end());
        ctx.insert(ctx.end(), seqs[r].begin(), seqs[r].end());
        if (processor) processor(p, ctx, std::span<float>(row, static_cast<std::size_t>(V)));
        pen.apply(row, V, ctx, seqs[r], cfg);
        if (cfg.do_sample) {
          warp.distribution(row, V, cfg, probs);
          for (std::int64_t t = 0; t < V; ++t)
            row[t] = probs[static_cast<std::size_t>(t)] > 0.0f ? row[t] / cfg.temperature
                                                               : -std::numeric_limits<float>::infinity();
        }
        for (std::int64_t t = 0; t < V; ++t) row[t] += score[r];
      }
      const std::int64_t n = nb * V;
      std::int64_t kk = std::min(keep, n);
      for (std::int64_t i = 0; i < n; ++i) cand[static_cast<std::size_t>(i)] = i;
      const auto better = [&](std::int64_t a, std::int64_t b) { return base[a] > base[b] || (base[a] == base[b] && a < b); };
      if (cfg.do_sample) {
        // Gumbel-top-k: the kk largest of score + Gumbel noise are a draw of kk candidates
        // without replacement from softmax(score); a filtered (-inf) candidate is never drawn.
        noisy.resize(static_cast<std::size_t>(n));
        const Key key = fold_in(fold_in(Key::from_seed(cfg.seed), static_cast<std::uint64_t>(p)), static_cast<std::uint64_t>(g));
        std::int64_t finite = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          const double u = std::max(static_cast<double>(uniform_at(key, static_cast<std::uint64_t>(i))), 1e-12);
          noisy[static_cast<std::size_t>(i)] = static_cast<float>(base[i] - std::log(-std::log(u)));
          finite += std::isfinite(base[i]) ? 1 : 0;
        }
        kk = std::min(kk, finite);
        std::partial_sort(cand.begin(), cand.begin() + kk, cand.begin() + n, [&](std::int64_t a, std::int64_t b) {
          const float x = noisy[static_cast<std::size_t>(a)], y = noisy[static_cast<std::size_t>(b)];
          return x > y || (x == y && a < b);
        });
        std::sort(cand.begin(), cand.begin() + kk, better);  // the drawn ones, best first
      } else {
        std::partial_sort(cand.begin(), cand.begin() + kk, cand.begin() + n, better);
      }
      std::int64_t k_next = 0;
      for (std::int64_t rank = 0; rank < kk && k_next < nb; ++rank) {
        const std::int64_t c = cand[static_cast<std::size_t>(rank)], beam = c / V, tok = c % V;
        const std::size_t r = static_cast<std::size_t>(p * nb + beam);
        if (cfg.is_stop(tok)) {
          if (rank >= nb) continue;
          std::vector<std::int64_t> h = seqs[r];
          h.push_back(tok);
          hyps[static_cast<std::size_t>(p)].add(std::move(h), base[c], g + 1);
        } else {
          const std::size_t dst = static_cast<std::size_t>(p * nb + k_next++);
          src[dst] = static_cast<std::int64_t>(r);
          next_tok[dst] = tok;
          next_score[dst] = base[c];
        }
      }
      const float best = base[cand[0]];
      const std::int64_t max_len = limit[static_cast<std::size_t>(p)];
      if (hyps[static_cast<std::size_t>(p)].is_done(best, g + 1, max_len)) {
        done[static_cast<std::size_t>(p)] = 1;
        for (std::int64_t k = 0; k < nb; ++k) src[static_cast<std::size_t>(p * nb + k)] = p * nb + k;
        continue;
      }
      any = true;
    }
    if (!any) break;
    // Reorder beams (cache and token histories), then append the chosen tokens.
    dec.reorder(src.data());
    {
      std::vector<std::vector<std::int64_t>> ns(static_cast<std::size_t>(R));
      for (std::int64_t r = 0; r < R; ++r) ns[static_cast<std::size_t>(r)] = seqs[static_cast<std::size_t>(src[static_cast<std::size_t>(r)])];
      seqs.swap(ns);
    }
    for (std::int64_t p = 0; p < P; ++p) {
      const bool live = !done[static_cast<std::size_t>(p)];
      for (std::int64_t k = 0; k < nb; ++k) {
        const std::size_t r = static_cast<std::size_t>(p * nb + k);
        active[r] = live ? 1 : 0;
        if (!live) continue;
        seqs[r].push_back(next_tok[r]);
        score[r] = next_score[r];
      }
      if (live && g + 1 >= limit[static_cast<std::size_t>(p)]) {
        finalize(p, g + 1);
        for (std::int64_t k = 0; k < nb; ++k) active[static_cast<std::size_t>(p * nb + k)] = 0;
      }
    }
    bool feed = false;
    for (auto a : active) feed = feed || a;
    if (!feed) break;
    dec.decode(next_tok.data(), logits.data(), active.data());
  }
  const std::int64_t n = cfg.num_return_sequences;
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(P * n));
  for (std::int64_t p = 0; p < P; ++p) {
    auto hb = hyps[static_cast<std::size_t>(p)].beams;
    std::stable_sort(hb.begin(), hb.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (std::int64_t j = 0; j < n && j < static_cast<std::int64_t>(hb.size()); ++j)
      out[static_cast<std::size_t>(p * n + j)] = std::move(hb[static_cast<std::size_t>(j)].second);
  }
  return out;
}

}  // namespace edl::generate
