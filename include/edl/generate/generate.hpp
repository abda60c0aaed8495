// edl/generate/generate.hpp
// generate(): prompts in, new tokens out (docs/generation.md).
//
//   generate::GenerationConfig g;  g.max_new_tokens = 16;          // greedy
//   generate::GenerateOptions o;   o.cache = generate::CacheKind::paged;
//   o.on_token = [](std::int64_t seq, std::int64_t tok) { ... };   // streaming
//   auto r = generate::generate(model, {{1, 2, 3}, {4, 5}}, g, o);
//   r.tokens[0]                                                    // new tokens of prompt 0
//   auto e = generate::generate_from_embeds(model, {prompt_vectors}, g);  // HF's inputs_embeds
//
// Prompts of different lengths run as one left-padded batch. A sequence stops at a stop token
// (eos_token_id or stop_token_ids; the stop token is included in its output, as HF), after
// max_new_tokens, or when prompt + output reaches max_model_length (finish_reason "stop" /
// "length"). num_beams > 1 runs beam search (beam_search.hpp); on_token is then called once
// per output token after the search ends.
// Errors (edl::Error, before any compute): an empty prompt, a token id outside the vocabulary,
// a prompt longer than max_model_length; with the paged cache, running out of pages.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <xtensor/xtensor.hpp>

#include <edl/core/error.hpp>
#include <edl/generate/beam_search.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/sampling.hpp>

namespace edl::generate {

enum class CacheKind { standard, int8, paged };

inline CacheKind parse_cache_kind(const std::string& s) {
  if (s == "standard") return CacheKind::standard;
  if (s == "int8") return CacheKind::int8;
  if (s == "paged") return CacheKind::paged;
  ::edl::detail::raise(errc::invalid_argument, "generate.cache", "expected standard, int8 or paged, found \"" + s + "\"");
}

struct GenerateOptions {
  CacheKind cache = CacheKind::standard;
  PagedKVCacheOptions paged;          // page_size, budget_bytes, utilization (max_model_length below)
  std::int64_t max_model_length = 0;  // 0: the model's max_position_embeddings
  std::function<void(std::int64_t seq, std::int64_t token)> on_token;  // streaming, may be empty
  LogitsProcessor logits_processor;  // may be empty; several: chain_processors({...})
};

struct GenerateStats {
  double prefill_seconds = 0, decode_seconds = 0;
  std::int64_t prefill_tokens = 0;  // real prompt tokens
  std::int64_t decode_tokens = 0;   // tokens fed through decode steps
  std::int64_t decode_steps = 0;
  std::int64_t cache_bytes = 0, scratch_bytes = 0;
};

struct GenerateResult {
  std::vector<std::vector<std::int64_t>> tokens;  // new tokens per prompt
  std::vector<std::string> finish_reason;         // "stop" | "length"
  GenerateStats stats;
};

namespace detail {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The checks generate() makes before any compute; returns the cache length the prompts need
/// and sets mml (max_model_length).
inline std::int64_t check_prompts(const models::LlamaConfig& cfg, const std::vector<std::vector<std::int64_t>>& prompts,
                                  const GenerationConfig& g, const GenerateOptions& o, std::int64_t& mml) {
  const char* w = "generate";
  const std::int64_t V = cfg.vocab_size;
  mml = o.max_model_length > 0 ? o.max_model_length : cfg.max_position_embeddings;
  EDL_CHECK(!prompts.empty(), errc::invalid_argument, w, "no prompt given");
  std::int64_t need = 0;
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    const auto& pr = prompts[p];
    EDL_CHECK(!pr.empty(), errc::invalid_argument, w, "prompt ", p, " is empty");
    for (std::size_t i = 0; i < pr.size(); ++i)
      EDL_CHECK(pr[i] >= 0 && pr[i] < V, errc::invalid_argument, w, "prompt ", p, " token ", i, ": id ", pr[i],
                " is outside the vocabulary [0, ", V, ")");
    EDL_CHECK(static_cast<std::int64_t>(pr.size()) <= mml, errc::invalid_argument, w, "prompt ", p, " has ", pr.size(),
              " tokens, more than max_model_length = ", mml);
    need = std::max<std::int64_t>(need, std::min<std::int64_t>(mml, static_cast<std::int64_t>(pr.size()) + g.max_new_tokens));
  }
  return std::max<std::int64_t>(1, need);
}

/// The most new tokens a prompt of `prompt_len` tokens may get: max_new_tokens, short of
/// max_model_length (mml).
inline std::int64_t new_token_limit(const GenerationConfig& g, std::int64_t mml, std::int64_t prompt_len) {
  return std::min<std::int64_t>(g.max_new_tokens, mml - prompt_len);
}

/// Prompts [P] padded to ids / mask [P, S] (left padding), and each prompt's new-token limit.
struct PaddedPrompts {
  std::vector<std::int64_t> ids, mask, limit;
  std::int64_t seq = 0;
};
inline PaddedPrompts pad_prompts(const std::vector<std::vector<std::int64_t>>& prompts, std::int64_t nb,
                                 const GenerationConfig& g, std::int64_t mml) {
  const std::int64_t P = static_cast<std::int64_t>(prompts.size()), R = P * nb;
  PaddedPrompts pp;
  std::int64_t& S = pp.seq;
  for (const auto& p : prompts) S = std::max<std::int64_t>(S, static_cast<std::int64_t>(p.size()));
  pp.ids.assign(static_cast<std::size_t>(R * S), 0);
  pp.mask.assign(static_cast<std::size_t>(R * S), 0);
  for (std::int64_t r = 0; r < R; ++r) {
    const auto& p = prompts[static_cast<std::size_t>(r / nb)];
    const std::int64_t pad = S - static_cast<std::int64_t>(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      pp.ids[static_cast<std::size_t>(r * S + pad) + i] = p[i];
      pp.mask[static_cast<std::size_t>(r * S + pad) + i] = 1;
    }
  }
  pp.limit.resize(static_cast<std::size_t>(P));
  for (std::int64_t p = 0; p < P; ++p)
    pp.limit[static_cast<std::size_t>(p)] =
        new_token_limit(g, mml, static_cast<std::int64_t>(prompts[static_cast<std::size_t>(p)].size()));
  return pp;
}

/// Greedy or sampled decoding of one sequence per prompt on any decoder with Decoder's
/// prefill / decode (the one-device Decoder and the mesh's ShardedDecoder share it, so both
/// choose tokens by the same code).
/// prompts give each sequence's context (what penalties and processors see: empty for
/// prompts given as vectors, as HF passes no ids with inputs_embeds); embeds (optional) the
/// prompts' vectors laid out as ids.
template <class Dec>
void sample_loop(Dec& dec, const std::vector<std::vector<std::int64_t>>& prompts, const GenerationConfig& g,
                 const GenerateOptions& o, const std::vector<std::int64_t>& limit, const std::vector<std::int64_t>& ids,
                 const std::vector<std::int64_t>& mask, std::int64_t S, std::int64_t V, GenerateResult& res,
                 const float* embeds = nullptr) {
  const std::int64_t P = static_cast<std::int64_t>(prompts.size());
  std::vector<float> logits(static_cast<std::size_t>(P * V));
  std::vector<std::uint8_t> active(static_cast<std::size_t>(P), 1);
  std::vector<std::int64_t> next(static_cast<std::size_t>(P), 0);
  std::vector<std::vector<std::int64_t>> ctx(prompts.begin(), prompts.end());
  for (auto& c : ctx) c.reserve(c.size() + static_cast<std::size_t>(std::max<std::int64_t>(0, g.max_new_tokens)));
  Sampler sampler;
  bool any = false;
  for (std::int64_t p = 0; p < P; ++p) {
    active[static_cast<std::size_t>(p)] = limit[static_cast<std::size_t>(p)] > 0;
    any = any || active[static_cast<std::size_t>(p)];
  }
  if (any) {
    const auto t0 = std::chrono::steady_clock::now();
    dec.prefill(ids.data(), S, mask.data(), logits.data(), nullptr, embeds);
    res.stats.prefill_seconds = seconds_since(t0);
  }
  const auto t1 = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; any; ++step) {
    any = false;
    for (std::int64_t p = 0; p < P; ++p) {
      const std::size_t pi = static_cast<std::size_t>(p);
      if (!active[pi]) continue;
      auto& c = ctx[pi];
      auto& out = res.tokens[pi];
      if (o.logits_processor)
        o.logits_processor(p, c, std::span<float>(logits.data() + p * V, static_cast<std::size_t>(V)));
      const std::int64_t tok = sampler.next(logits.data() + p * V, V, g, c, out, static_cast<std::uint32_t>(p),
                                            static_cast<std::uint32_t>(step));
      out.push_back(tok);
      c.push_back(tok);
      next[pi] = tok;
      if (o.on_token) o.on_token(p, tok);
      if (g.is_stop(tok)) {
        res.finish_reason[pi] = "stop";
        active[pi] = 0;
      } else if (static_cast<std::int64_t>(out.size()) >= limit[pi]) {
        active[pi] = 0;
      }
      any = any || active[pi];
    }
    if (!any) break;
    dec.decode(next.data(), logits.data(), active.data());
    ++res.stats.decode_steps;
    for (auto a : active) res.stats.decode_tokens += a;
  }
  res.stats.decode_seconds = seconds_since(t1);
}

/// Prompts given as vectors (generate_from_embeds): one [length, hidden] block each.
using PromptVectors = std::vector<xt::xtensor<float, 2>>;

/// The prompts' vectors laid out as pad_prompts lays out their ids ([R * S, hidden], nb rows
/// per prompt, left padding zero).
inline std::vector<float> pad_vectors(const PromptVectors& e, std::int64_t nb, std::int64_t S, std::int64_t H) {
  const std::int64_t R = static_cast<std::int64_t>(e.size()) * nb;
  std::vector<float> out(static_cast<std::size_t>(R * S * H), 0.0f);
  for (std::int64_t r = 0; r < R; ++r) {
    const auto& p = e[static_cast<std::size_t>(r / nb)];
    const std::int64_t len = static_cast<std::int64_t>(p.shape(0));
    std::copy(p.data(), p.data() + len * H, out.data() + (r * S + S - len) * H);
  }
  return out;
}

/// Beam search on `dec` (a one-device or mesh decoder whose batch holds each prompt's beams),
/// its sequences in res with their finish reasons; on_token is called once per token after the
/// search ends.
template <class Dec>
void run_beams(Dec& dec, const std::vector<std::vector<std::int64_t>>& prompts, const GenerationConfig& g,
               const GenerateOptions& o, const PaddedPrompts& pp, std::int64_t V, GenerateResult& res,
               const float* embeds = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  res.tokens = beam_search(dec, prompts, g, pp.limit, pp.ids, pp.seq, pp.mask, V, o.logits_processor, embeds);
  res.stats.decode_seconds = seconds_since(t0);
  for (std::size_t r = 0; r < res.tokens.size(); ++r) {
    const auto& t = res.tokens[r];
    if (!t.empty() && g.is_stop(t.back())) res.finish_reason[r] = "stop";
    if (o.on_token)
      for (auto tok : t) o.on_token(static_cast<std::int64_t>(r), tok);
  }
}

template <class Pol, class Cache>
GenerateResult run_generate(const models::LlamaForCausalLM<Pol>& model, Cache& cache,
                            const std::vector<std::vector<std::int64_t>>& prompts, const GenerationConfig& g,
                            const GenerateOptions& o, std::int64_t mml, const PromptVectors* vectors = nullptr) {
  const std::int64_t P = static_cast<std::int64_t>(prompts.size()), V = model.config().vocab_size;
  const std::int64_t nb = g.num_beams;
  const PaddedPrompts pp = pad_prompts(prompts, nb, g, mml);
  const std::vector<std::int64_t>&ids = pp.ids, &mask = pp.mask, &limit = pp.limit;
  const std::int64_t S = pp.seq;
  // Prompts given as vectors: `prompts` only hold their lengths, and their context is empty.
  const std::vector<float> embeds = vectors ? pad_vectors(*vectors, nb, S, model.config().hidden_size) : std::vector<float>();
  const std::vector<std::vector<std::int64_t>> no_context(vectors ? prompts.size() : 0);
  const auto& context = vectors ? no_context : prompts;
  const float* e = vectors ? embeds.data() : nullptr;

  GenerateResult res;
  // Beam search returns num_return_sequences sequences per prompt; sampling runs one per row.
  const std::int64_t rows = nb > 1 ? P * g.num_return_sequences : P;
  res.tokens.assign(static_cast<std::size_t>(rows), {});
  res.finish_reason.assign(static_cast<std::size_t>(rows), "length");
  Decoder<Pol, Cache> dec(model, cache);
  for (const auto& p : prompts) res.stats.prefill_tokens += static_cast<std::int64_t>(p.size());

  if (nb > 1) {
    run_beams(dec, context, g, o, pp, V, res, e);
  } else {
    sample_loop(dec, context, g, o, limit, ids, mask, S, V, res, e);
  }
  res.stats.cache_bytes = cache.bytes();
  res.stats.scratch_bytes = dec.scratch_bytes();
  return res;
}

/// num_return_sequences n > 1 without beams: each prompt n times in the batch (sampled ones
/// from their own streams), one sequence each, the logits processor told the prompt's index.
struct RepeatedPrompts {
  std::vector<std::vector<std::int64_t>> prompts;
  GenerationConfig g;
  GenerateOptions o;
};
inline RepeatedPrompts repeat_prompts(const std::vector<std::vector<std::int64_t>>& prompts, const GenerationConfig& g,
                                      const GenerateOptions& o) {
  const std::int64_t n = g.num_return_sequences;
  RepeatedPrompts r{{}, g, o};
  r.prompts.reserve(prompts.size() * static_cast<std::size_t>(n));
  for (const auto& p : prompts)
    for (std::int64_t i = 0; i < n; ++i) r.prompts.push_back(p);
  r.g.num_return_sequences = 1;
  if (o.logits_processor)
    r.o.logits_processor = [f = o.logits_processor, n](std::int64_t seq, std::span<const std::int64_t> c,
                                                       std::span<float> s) { f(seq / n, c, s); };
  return r;
}

/// generate() of token prompts or, with `vectors`, of prompts given as vectors (`prompts` then
/// hold only their lengths).
template <class Pol>
GenerateResult generate_prompts(const models::LlamaForCausalLM<Pol>& model,
                                const std::vector<std::vector<std::int64_t>>& prompts, const PromptVectors* vectors,
                                const GenerationConfig& g, const GenerateOptions& o) {
  g.validate("GenerationConfig", model.config().vocab_size);
  if (const std::int64_t n = g.num_return_sequences; n > 1 && g.num_beams == 1) {
    const RepeatedPrompts r = repeat_prompts(prompts, g, o);
    PromptVectors each_vectors;
    if (vectors)
      for (const auto& v : *vectors)
        for (std::int64_t i = 0; i < n; ++i) each_vectors.push_back(v);
    return generate_prompts(model, r.prompts, vectors ? &each_vectors : nullptr, r.g, r.o);
  }
  const auto& cfg = model.config();
  std::int64_t mml = 0;
  const std::int64_t need = check_prompts(cfg, prompts, g, o, mml);
  const std::int64_t R = static_cast<std::int64_t>(prompts.size()) * g.num_beams;
  const KVCacheShape shape = kv_cache_shape(cfg, R, need);
  switch (o.cache) {
    case CacheKind::standard: {
      StandardKVCache c(shape);
      return run_generate(model, c, prompts, g, o, mml, vectors);
    }
    case CacheKind::int8: {
      Int8KVCache c(shape);
      return run_generate(model, c, prompts, g, o, mml, vectors);
    }
    case CacheKind::paged: {
      PagedKVCacheOptions po = o.paged;
      po.max_model_length = mml;
      PagedKVCache c(shape, po);
      return run_generate(model, c, prompts, g, o, mml, vectors);
    }
  }
  return {};
}

}  // namespace detail

/// New tokens for each prompt (see the header comment). With num_return_sequences n > 1 the
/// result holds n sequences per prompt, prompt by prompt (HF's order): beam search returns its
/// n best hypotheses, best first; otherwise each prompt runs n times in the batch, sampled
/// ones from their own streams. on_token's index is the sequence's, the logits processor's
/// the prompt's.
template <class Pol>
GenerateResult generate(const models::LlamaForCausalLM<Pol>& model, const std::vector<std::vector<std::int64_t>>& prompts,
                        const GenerationConfig& g, const GenerateOptions& o = {}) {
  return detail::generate_prompts(model, prompts, nullptr, g, o);
}

/// HF's generate(inputs_embeds=...): each prompt is given as vectors, [length, hidden], in
/// place of its tokens' embeddings (in the embedding table's space: the embed scale still
/// applies, so a prompt of the table's rows generates as its ids). As HF, the prompts carry no
/// ids: repetition penalties, n-gram bans and logits processors see the new tokens only. The
/// rest is generate()'s (batching, sampling, beams, caches, stop conditions).
template <class Pol>
GenerateResult generate_from_embeds(const models::LlamaForCausalLM<Pol>& model,
                                    const std::vector<xt::xtensor<float, 2>>& prompts, const GenerationConfig& g,
                                    const GenerateOptions& o = {}) {
  const std::int64_t H = model.config().hidden_size;
  std::vector<std::vector<std::int64_t>> lengths;
  lengths.reserve(prompts.size());
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    const auto& v = prompts[p];
    EDL_CHECK(static_cast<std::int64_t>(v.shape(1)) == H, errc::shape_mismatch, "generate_from_embeds", "prompt ", p,
              " is [", v.shape(0), ", ", v.shape(1), "], expected [length, hidden_size = ", H, "]");
    lengths.emplace_back(v.shape(0), std::int64_t{0});  // the lengths alone: ids are not read
  }
  return detail::generate_prompts(model, lengths, &prompts, g, o);
}

}  // namespace edl::generate
