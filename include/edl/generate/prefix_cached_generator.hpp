// edl/generate/prefix_cached_generator.hpp
// generate() for one conversation that grows turn by turn, keeping the KV cache between calls
// (docs/generation.md, "A conversation's prefix cache").
//
//   generate::PrefixCachedGenerator gen(model);
//   auto r1 = gen.generate(prompt_of_turn_1, g);     // prefills the whole prompt
//   auto r2 = gen.generate(prompt_of_turn_2, g);     // prefills only what follows the prefix
//   gen.reused_tokens();                             //   it shares with turn 1's prompt + reply
//
// The cache holds the tokens the last call fed: its prompt and its new tokens but the last
// (which was never fed back). A call keeps the longest prefix its prompt shares with them (at
// most all but the prompt's last token: the logits of that token are needed), drops the rest
// (the cache's length is cut back; nothing is recomputed), and prefills the remainder as a
// chunk after it. A chat template re-renders earlier turns the same way, so a turn prefills
// only its own message (and the reply, where re-encoding its text gives other tokens than
// were generated, from that point on).
// The tokens are generate()'s for the same prompt: the same sampling loop (detail::sample_loop,
// sequence 0, steps from 0), and a chunk after cached tokens gives the logits of a whole-prompt
// prefill (the decoder's rows do not depend on how the sequence was cut into calls).
// Models whose rope depends on the forward's length (dynamic, longrope) rotate every key by the
// length of the step that wrote it, so reusing keys would change the result: for them every
// call starts over (reused_tokens() 0).
// The cache grows as needed (a new one of twice the size, the kept tokens copied). One
// sequence, greedy or sampled (num_beams 1); errors as generate()'s. A call interrupted by an
// exception from on_token keeps what it fed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/generate.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/models/llama/llama.hpp>

namespace edl::generate {

template <class Pol = DefaultPolicy>
class PrefixCachedGenerator {
 public:
  using Model = models::LlamaForCausalLM<Pol>;

  explicit PrefixCachedGenerator(const Model& model) : m_(model) {}
  PrefixCachedGenerator(const PrefixCachedGenerator&) = delete;  // the decoder points at the cache
  PrefixCachedGenerator& operator=(const PrefixCachedGenerator&) = delete;

  /// New tokens for `prompt` (GenerateResult of one prompt); o.cache and o.paged are not used.
  GenerateResult generate(const std::vector<std::int64_t>& prompt, const GenerationConfig& g,
                          const GenerateOptions& o = {}) {
    const models::LlamaConfig& cfg = m_.config();
    g.validate("GenerationConfig", cfg.vocab_size);
    EDL_CHECK(g.num_beams == 1, errc::unsupported, "generate.PrefixCachedGenerator",
              "beam search (num_beams = ", g.num_beams, ") does not run here; use generate()");
    std::int64_t mml = 0;
    const std::int64_t need = detail::check_prompts(cfg, {prompt}, g, o, mml);
    const std::int64_t P = static_cast<std::int64_t>(prompt.size());

    // The prefix kept: shared with what the cache holds, short of the prompt's last token.
    std::int64_t keep = 0;
    if (!length_dependent_rope()) {
      const std::int64_t most = std::min<std::int64_t>(P - 1, static_cast<std::int64_t>(cached_.size()));
      while (keep < most && cached_[static_cast<std::size_t>(keep)] == prompt[static_cast<std::size_t>(keep)]) ++keep;
    }
    ensure_capacity(need, keep);
    cache_->set_length(0, keep);
    cached_.resize(static_cast<std::size_t>(keep));
    reused_ = keep;

    const std::vector<std::int64_t> limit = {detail::new_token_limit(g, mml, P)};
    const std::vector<std::int64_t> ids(prompt.begin() + keep, prompt.end()), mask(ids.size(), 1);
    GenerateResult res;
    res.tokens.assign(1, {});
    res.finish_reason.assign(1, "length");
    res.stats.prefill_tokens = P - keep;
    try {
      detail::sample_loop(*dec_, {prompt}, g, o, limit, ids, mask, static_cast<std::int64_t>(ids.size()),
                          cfg.vocab_size, res);
    } catch (...) {
      remember(prompt, res.tokens[0]);
      throw;
    }
    remember(prompt, res.tokens[0]);
    res.stats.cache_bytes = cache_->bytes();
    res.stats.scratch_bytes = dec_->scratch_bytes();
    return res;
  }

  /// Forgets the conversation (the cache keeps its memory).
  void reset() {
    cached_.clear();
    if (cache_) cache_->set_length(0, 0);
  }
  /// Prompt tokens the last call found in the cache (not prefilled again).
  std::int64_t reused_tokens() const noexcept { return reused_; }
  /// Tokens the cache holds now.
  std::int64_t cached_tokens() const noexcept { return static_cast<std::int64_t>(cached_.size()); }

 private:
  bool length_dependent_rope() const {
    const auto& rs = m_.config().rope_scaling;
    return rs && (rs->rope_type == "dynamic" || rs->rope_type == "longrope");
  }

  /// A cache of at least `need` tokens whose first `keep` tokens are the current cache's.
  void ensure_capacity(std::int64_t need, std::int64_t keep) {
    if (cache_ && cache_->shape().max_length >= need) return;
    const std::int64_t cap = std::max(need, cache_ ? 2 * cache_->shape().max_length : need);
    auto next = std::make_unique<StandardKVCache>(kv_cache_shape(m_.config(), 1, cap));
    if (cache_ && keep > 0) {  // copy the kept rows, every layer and kv head
      const KVCacheShape& s = cache_->shape();
      std::vector<float> k(static_cast<std::size_t>(s.kv_heads * s.head_dim)), v(k.size());
      next->reserve(0, keep);
      for (std::int64_t l = 0; l < s.num_layers; ++l)
        for (std::int64_t slot = 0; slot < keep; ++slot) {
          for (std::int64_t h = 0; h < s.kv_heads; ++h)
            cache_->view(l, 0, h).read(slot, k.data() + h * s.head_dim, v.data() + h * s.head_dim);
          next->store(l, 0, slot, k.data(), v.data());
        }
    }
    dec_.reset();
    cache_ = std::move(next);
    dec_ = std::make_unique<Decoder<Pol, StandardKVCache>>(m_, *cache_);
  }

  /// What the cache holds after a call: the prompt and the new tokens it fed (all but the last).
  void remember(const std::vector<std::int64_t>& prompt, const std::vector<std::int64_t>& out) {
    cached_ = prompt;
    cached_.insert(cached_.end(), out.begin(), out.end());
    cached_.resize(static_cast<std::size_t>(std::min<std::int64_t>(cache_->length(0), static_cast<std::int64_t>(cached_.size()))));
  }

  const Model& m_;
  std::unique_ptr<StandardKVCache> cache_;
  std::unique_ptr<Decoder<Pol, StandardKVCache>> dec_;
  std::vector<std::int64_t> cached_;
  std::int64_t reused_ = 0;
};

}  // namespace edl::generate
