// edl/generate/rope_table.hpp: the rotary cos/sin of every position a KV cache can hold,
// computed once when a decoder is built, and the in-place rotation of one token's heads.
//
// The tables and the rotation are nn::RotaryEmbedding's (HF inv_freq from the config's
// rope_theta and rope_scaling, angle = position x inv_freq in double, rounded to f32 once),
// so a decoder's q and k equal the full forward's. Both decoders (generate/decoder.hpp on one device,
// generate/sharded_decoder.hpp on a mesh) use this one table.
#pragma once

#include <cstdint>
#include <vector>

#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/rotary.hpp>

namespace edl::generate {

class RopeTable {
 public:
  RopeTable() = default;
  /// Positions 0 .. positions-1 of the model described by `c`.
  RopeTable(const models::LlamaConfig& c, std::int64_t positions)
      : rot_(c.head_size(), models::rope_config(c)), half_(c.head_size() / 2) {
    rot_.tables(nn::TokenLayout{1, positions}, cos_, sin_);
  }

  /// Rotates `heads` consecutive heads of head_dim floats at x, one token at position `pos`.
  void rotate(float* x, std::int64_t pos, std::int64_t heads) const {
    rot_.apply(x, 1, heads, cos_.data() + pos * half_, sin_.data() + pos * half_);
  }

 private:
  nn::RotaryEmbedding rot_;
  std::int64_t half_ = 0;
  std::vector<float> cos_, sin_;
};

}  // namespace edl::generate
