// tests/generate/small_llama.hpp: the small Llama configs and random token ids the generation
// tests share (one place, so every test exercises the same shapes: GQA with 4 heads over 2
// kv heads of 8, two layers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/rng.hpp>
#include <edl/models/llama/config.hpp>

namespace edl::generate::test_support {

/// Hidden 32, intermediate 48, 2 layers, 4 heads over 2 kv heads of 8, rms_norm_eps 1e-5.
/// variant: "" | "bias" (attention and MLP biases) | "llama3" (rope scaling) | "window"
/// (mistral, sliding window 5) | "tied" (tied embeddings) | "mha" (4 kv heads) | "no_eos"
/// (no eos token: generation runs to max_new_tokens) | "qwen3" (per-head q/k norms, head_dim 12
/// while hidden / heads is 8).
inline models::LlamaConfig small_llama(std::int64_t vocab, std::int64_t max_positions, const std::string& variant = "") {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = max_positions;
  c.rms_norm_eps = 1e-5;
  if (variant == "bias") c.attention_bias = true, c.mlp_bias = true;
  if (variant == "llama3") {
    models::RopeScaling r;
    r.rope_type = "llama3";
    r.factor = 8;
    r.low_freq_factor = 1;
    r.high_freq_factor = 4;
    r.original_max_position_embeddings = 16;
    c.rope_scaling = r;
  }
  if (variant == "window") c.model_type = "mistral", c.sliding_window = 5;
  if (variant == "tied") c.tie_word_embeddings = true;
  if (variant == "mha") c.num_key_value_heads = 4;
  if (variant == "no_eos") c.eos_token_id = {};
  if (variant == "qwen3") c.model_type = "qwen3", c.head_dim = 12;
  c.validate();
  return c;
}

/// Sets every RMSNorm weight (the layers', the final one and qwen3's per-head q/k norms) to values
/// in [0.6, 1.4) instead of init's ones, so that a weight read at the wrong index, or a norm
/// left out, changes the logits.
template <class Model>
void spread_norm_weights(Model& m, std::uint32_t seed) {
  std::uint64_t i = 0;
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (!path.ends_with("norm.weight")) return;
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    for (std::size_t j = 0; j < p.value.size(); ++j)
      p.data()[j] = from_f32<T>(0.6f + 0.8f * uniform_at(Key::from_seed(seed), i++));
  });
}

/// n ids uniform in [0, V) from the counter-based generator (the same ids on every platform).
inline std::vector<std::int64_t> random_ids(std::int64_t n, std::int64_t V, std::uint32_t seed) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    ids[static_cast<std::size_t>(i)] =
        static_cast<std::int64_t>(uniform_at(Key::from_seed(seed), static_cast<std::uint64_t>(i)) * static_cast<float>(V)) % V;
  return ids;
}

}  // namespace edl::generate::test_support
