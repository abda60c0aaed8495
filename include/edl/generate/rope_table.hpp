// edl/generate/rope_table.hpp: the rotary cos/sin of every position a KV cache can hold,
// computed once when a decoder is built, and the in-place rotation of one token's heads.
//
// The tables and the rotation are nn::RotaryEmbedding's (HF inv_freq from the config's
// rope_theta and rope_scaling, angle = position x inv_freq in double, rounded to f32 once),
// so a decoder's q and k equal the full forward's. Both decoders (generate/decoder.hpp on one device,
// generate/sharded_decoder.hpp on a mesh) use this one table.
//
// Scalings that depend on the sequence length L (dynamic, longrope; nn/rotary.hpp) rotate a
// token by the L of the forward that writes it, as HF generation does: a prefill by the prompt's
// length, a decode step by its position + 1; the keys already cached keep their rotation.
// longrope keeps a second table (long_factor) for L beyond original_max_position_embeddings;
// dynamic computes the frequencies of an L beyond max_position_embeddings once per call.
// Gemma's sliding layers rotate with their own base (rope_local_base_freq): local(), a second table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/rotary.hpp>

namespace edl::generate {

class RopeTable {
 public:
  /// The frequencies of the last length beyond the base table a caller asked for (dynamic).
  struct Scratch {
    std::int64_t context = -1;
    std::vector<double> inv_freq;
  };

  RopeTable() = default;
  /// Positions 0 .. positions-1 of the model described by `c`.
  RopeTable(const models::LlamaConfig& c, std::int64_t positions)
      : RopeTable(c.head_size(), models::rope_config(c), positions) {
    for (std::int64_t l = 0; l < c.num_hidden_layers && !local_; ++l)
      if (c.layer_has_local_rope(l))
        local_ = std::make_shared<const RopeTable>(c.head_size(), models::rope_config(c, l), positions);
  }
  /// Positions 0 .. positions-1 of one rope.
  RopeTable(std::int64_t head_dim, const nn::RopeConfig& rope, std::int64_t positions)
      : rot_(head_dim, rope), half_(head_dim / 2) {
    const nn::RopeConfig& rc = rot_.config();
    rot_.tables(nn::TokenLayout{1, positions, nullptr, nullptr, nullptr, /*context=*/1}, cos_, sin_);
    if (rc.type == "longrope")
      rot_.tables(nn::TokenLayout{1, positions, nullptr, nullptr, nullptr,
                                  static_cast<std::int64_t>(rc.original_max_position_embeddings) + 1},
                  long_cos_, long_sin_);
  }

  std::int64_t half() const noexcept { return half_; }
  /// The table of the local layers (Gemma's sliding layers), or null.
  const RopeTable* local() const noexcept { return local_.get(); }

  /// cos and sin [head_dim / 2] of position `pos` written by a forward whose sequence reaches
  /// `context` tokens (its largest position + 1).
  void angles(std::int64_t pos, std::int64_t context, float* cos, float* sin, Scratch& scratch) const {
    const nn::RopeConfig& rc = rot_.config();
    const std::size_t at = static_cast<std::size_t>(pos * half_);
    if (rc.type == "longrope" && static_cast<double>(context) > rc.original_max_position_embeddings) {
      std::copy_n(long_cos_.data() + at, half_, cos);
      std::copy_n(long_sin_.data() + at, half_, sin);
    } else if (rc.type == "dynamic" && static_cast<double>(context) > rc.max_position_embeddings) {
      if (scratch.context != context) {
        scratch.inv_freq = nn::RotaryEmbedding::compute_inv_freq(2 * half_, rc, context);
        scratch.context = context;
      }
      rot_.angles(scratch.inv_freq, pos, cos, sin);
    } else {
      std::copy_n(cos_.data() + at, half_, cos);
      std::copy_n(sin_.data() + at, half_, sin);
    }
  }

  /// Rotates `heads` consecutive heads of head_dim floats at x, one token, by its angles.
  void rotate(float* x, std::int64_t heads, const float* cos, const float* sin) const {
    rot_.apply(x, 1, heads, cos, sin);
  }

 private:
  nn::RotaryEmbedding rot_;
  std::int64_t half_ = 0;
  std::vector<float> cos_, sin_, long_cos_, long_sin_;
  std::shared_ptr<const RopeTable> local_;
};

}  // namespace edl::generate
