// tests/support/small_llama.hpp: the small Llama the unit tests share: 2 layers, hidden 32,
// 4 attention heads over 2 KV heads, MLP 64, so that every mesh axis of size 2 (and fsdp or
// sp of 4) divides it. Tests change what they exercise (vocabulary, eps, biases, heads) and
// validate again.
#pragma once

#include <cstdint>

#include <edl/models/llama/config.hpp>

namespace edl::test_support {

inline models::LlamaConfig small_llama_config(std::int64_t vocab_size = 64) {
  models::LlamaConfig c;
  c.vocab_size = vocab_size;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.validate();
  return c;
}

}  // namespace edl::test_support
