// edl/generate/sharded_generate.hpp
// generate() on a device mesh (docs/generation.md, "Generation on a mesh").
//
//   auto mesh = create_mesh({1, 1, 2, 1});                             // tp=2
//   auto r = generate::generate(model, mesh, {{1, 2, 3}}, g, o);       // a one-device model
//   auto r = generate::generate(sharded_llama, {{1, 2, 3}}, g, o);      // a ShardedLlama's mesh
//
// Same GenerationConfig, options, checks and token choice as the one-device generate() (the
// sampling loop is shared), run by a ShardedDecoder: the tokens equal one device's up to the
// f32 rounding of the sharded sums (greedy tokens are identical unless two logits tie to
// within that rounding). A 1-device mesh runs the one-device path.
// Beam search keeps each prompt's beams on one group of devices (the sequences are cut over
// dp x fsdp x ep by prompts), so reordering the beams moves cache rows within each device.
// GenerateStats::cache_bytes and scratch_bytes are this process's devices' totals.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/generate/generate.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/sharded_decoder.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>

namespace edl::generate {

namespace detail {

/// Runs the prompts on a ShardedDecoder built by make_decoder(batch, max_length, factory,
/// keep_together).
template <class Pol, class MakeDecoder>
GenerateResult run_generate_on_mesh(const models::LlamaConfig& cfg, std::int64_t sp,
                                    const std::vector<std::vector<std::int64_t>>& prompts, const GenerationConfig& g,
                                    const GenerateOptions& o, MakeDecoder&& make_decoder) {
  g.validate("GenerationConfig", cfg.vocab_size);
  if (g.num_return_sequences > 1 && g.num_beams == 1) {
    const RepeatedPrompts r = repeat_prompts(prompts, g, o);
    return run_generate_on_mesh<Pol>(cfg, sp, r.prompts, r.g, r.o, make_decoder);
  }
  std::int64_t mml = 0;
  const std::int64_t need = check_prompts(cfg, prompts, g, o, mml);
  const std::int64_t P = static_cast<std::int64_t>(prompts.size()), V = cfg.vocab_size, nb = g.num_beams;
  const PaddedPrompts pp = pad_prompts(prompts, nb, g, mml);
  GenerateResult res;
  const std::int64_t rows = nb > 1 ? P * g.num_return_sequences : P;
  res.tokens.assign(static_cast<std::size_t>(rows), {});
  res.finish_reason.assign(static_cast<std::size_t>(rows), "length");
  for (const auto& p : prompts) res.stats.prefill_tokens += static_cast<std::int64_t>(p.size());
  const auto go = [&](auto& dec) {
    if (nb > 1) run_beams(dec, prompts, g, o, pp, V, res);
    else sample_loop(dec, prompts, g, o, pp.limit, pp.ids, pp.mask, pp.seq, V, res);
    res.stats.cache_bytes = dec.cache_bytes();
    res.stats.scratch_bytes = dec.scratch_bytes();
  };
  switch (o.cache) {
    case CacheKind::standard: {
      auto dec = make_decoder.template operator()<StandardKVCache>(P * nb, need, nullptr, nb);
      go(*dec);
      break;
    }
    case CacheKind::int8: {
      auto dec = make_decoder.template operator()<Int8KVCache>(P * nb, need, nullptr, nb);
      go(*dec);
      break;
    }
    case CacheKind::paged: {
      PagedKVCacheOptions po = o.paged;
      po.max_model_length = (mml + sp - 1) / sp;  // each sp rank holds every sp-th position
      auto dec = make_decoder.template operator()<PagedKVCache>(
          P * nb, need, [po](const KVCacheShape& s) { return std::make_unique<PagedKVCache>(s, po); }, nb);
      go(*dec);
      break;
    }
  }
  return res;
}

}  // namespace detail

/// New tokens for each prompt, computed on `mesh` (see the header comment).
template <class Pol>
GenerateResult generate(const models::LlamaForCausalLM<Pol>& model, const DefaultMesh& mesh,
                        const std::vector<std::vector<std::int64_t>>& prompts, const GenerationConfig& g,
                        const GenerateOptions& o = {}) {
  if (mesh.size() == 1) return generate(model, prompts, g, o);
  // The tp split is checked before the prompts are padded or anything is allocated.
  (void)sharded_decoder_local_config(model.config(), mesh.axis_size("tp"));
  return detail::run_generate_on_mesh<Pol>(
      model.config(), mesh.axis_size("sp"), prompts, g, o,
      [&]<class Cache>(std::int64_t batch, std::int64_t max_length,
                       typename ShardedDecoder<Pol, Cache>::CacheFactory make, std::int64_t keep_together) {
        return std::make_unique<ShardedDecoder<Pol, Cache>>(model, mesh, batch, max_length, std::move(make),
                                                            keep_together);
      });
}

/// New tokens for each prompt, computed on the ShardedLlama's mesh (its parameters gathered
/// once, see ShardedDecoder).
template <class Pol>
GenerateResult generate(const models::ShardedLlama<Pol>& model, const std::vector<std::vector<std::int64_t>>& prompts,
                        const GenerationConfig& g, const GenerateOptions& o = {}) {
  const DefaultMesh& mesh = model.mesh();
  if (mesh.size() == 1) return generate(model.gather_model(), prompts, g, o);
  (void)sharded_decoder_local_config(model.config(), mesh.axis_size("tp"));
  return detail::run_generate_on_mesh<Pol>(
      model.config(), mesh.axis_size("sp"), prompts, g, o,
      [&]<class Cache>(std::int64_t batch, std::int64_t max_length,
                       typename ShardedDecoder<Pol, Cache>::CacheFactory make, std::int64_t keep_together) {
        return std::make_unique<ShardedDecoder<Pol, Cache>>(model, batch, max_length, std::move(make), keep_together);
      });
}

}  // namespace edl::generate
