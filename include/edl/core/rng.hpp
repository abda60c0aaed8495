// edl/core/rng.hpp
// A counter-based, splittable random number generator in the manner of JAX's PRNG keys.
//
// A Key is two 32-bit words. Randomness is a pure function of (key, counter) through the
// Threefry-2x32 block cipher (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; 20 rounds as in JAX and Random123). Because element i of a tensor draws from
// counter i of its key, a device that owns elements [a, b) of a sharded tensor produces
// exactly the numbers the unsharded tensor has there: the same seed gives the same
// initialization and the same samples on every mesh shape.
//
//   Key k = Key::from_seed(0);
//   auto [k1, k2] = split2(k);                 // independent streams
//   Key layer3 = fold_in(k, 3);                // a stream per layer index
//   float u = uniform_at(k1, 12345);           // element 12345 of k1's uniform stream
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace edl {

struct Key {
  std::uint32_t k0 = 0, k1 = 0;
  /// As jax.random.PRNGKey(seed): the high and low words of a 64-bit seed.
  static constexpr Key from_seed(std::uint64_t seed) noexcept {
    return {static_cast<std::uint32_t>(seed >> 32), static_cast<std::uint32_t>(seed)};
  }
  friend constexpr bool operator==(const Key&, const Key&) = default;
};

namespace detail {
constexpr std::uint32_t rotl32(std::uint32_t x, int r) noexcept { return (x << r) | (x >> (32 - r)); }
}  // namespace detail

/// Threefry-2x32 with 20 rounds: one 64-bit block (x0, x1) enciphered under `key`.
constexpr std::array<std::uint32_t, 2> threefry2x32(Key key, std::uint32_t x0, std::uint32_t x1) noexcept {
  constexpr int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  const std::uint32_t ks[3] = {key.k0, key.k1, key.k0 ^ key.k1 ^ 0x1BD11BDAu};
  x0 += ks[0];
  x1 += ks[1];
  for (int block = 0; block < 5; ++block) {  // 5 x 4 rounds, key injection after each 4
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = detail::rotl32(x1, rot[(block % 2) * 4 + r]);
      x1 ^= x0;
    }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + static_cast<std::uint32_t>(block + 1);
  }
  return {x0, x1};
}

/// 32 random bits at position `counter` of key's stream. Two consecutive counters share
/// one cipher block, so a stream costs one block per two values.
constexpr std::uint32_t random_bits_at(Key key, std::uint64_t counter) noexcept {
  const std::uint64_t block = counter >> 1;
  const auto y = threefry2x32(key, static_cast<std::uint32_t>(block >> 32), static_cast<std::uint32_t>(block));
  return (counter & 1) ? y[1] : y[0];
}

/// n independent keys derived from `key` (jax.random.split).
inline std::vector<Key> split(Key key, std::size_t n) {
  std::vector<Key> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Counters 2^63 + 2i, 2^63 + 2i + 1: a region disjoint from element streams of `key`.
    const auto y = threefry2x32(key, 0x80000000u, static_cast<std::uint32_t>(i));
    out[i] = {y[0], y[1]};
  }
  return out;
}
inline std::pair<Key, Key> split2(Key key) {
  auto ks = split(key, 2);
  return {ks[0], ks[1]};
}

/// A key for `data` under `key` (jax.random.fold_in): per-layer, per-step or per-device streams.
constexpr Key fold_in(Key key, std::uint32_t data) noexcept {
  const auto y = threefry2x32(key, 0x40000000u, data);
  return {y[0], y[1]};
}

/// Uniform float in [0, 1) from 32 bits: the top 23 bits become the mantissa of [1, 2).
constexpr float bits_to_unit_float(std::uint32_t bits) noexcept {
  return std::bit_cast<float>((bits >> 9) | 0x3f800000u) - 1.0f;
}

/// Element `i` of key's uniform [lo, hi) stream.
constexpr float uniform_at(Key key, std::uint64_t i, float lo = 0.0f, float hi = 1.0f) noexcept {
  return lo + (hi - lo) * bits_to_unit_float(random_bits_at(key, i));
}

/// Element `i` of key's standard normal stream (Box-Muller on counters 2i and 2i+1,
/// cosine branch), computed in double so every platform rounds the same way.
inline float normal_at(Key key, std::uint64_t i) noexcept {
  // Counters 2i and 2i + 1 are the two words of cipher block i: one threefry call gives both
  // (the same bits as random_bits_at(key, 2i) and (key, 2i + 1), at half the cost).
  const auto y = threefry2x32(key, static_cast<std::uint32_t>(i >> 32), static_cast<std::uint32_t>(i));
  const std::uint32_t b0 = y[0], b1 = y[1];
  const double u1 = (static_cast<double>(b0 >> 8) + 1.0) / 16777216.0;  // (0, 1]
  const double u2 = static_cast<double>(b1 >> 8) / 16777216.0;          // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

/// Fills out[j] with element (first + j) of the uniform stream.
inline void fill_uniform(Key key, std::uint64_t first, std::span<float> out, float lo = 0.0f, float hi = 1.0f) {
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = uniform_at(key, first + j, lo, hi);
}
/// Fills out[j] with mean + std * element (first + j) of the normal stream.
inline void fill_normal(Key key, std::uint64_t first, std::span<float> out, float mean = 0.0f, float std = 1.0f) {
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = mean + std * normal_at(key, first + j);
}

}  // namespace edl
