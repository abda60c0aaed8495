// edl/quant/formats.hpp
// Block formats of quantized weights. A quantized matrix [N, K] stores each row as K / 32
// (or K / 64) independent blocks; a block holds its values as small integers and a scale.
//
//   q8_0  32 int8 values q and an f16 scale d:     x = d * q                 34 bytes / 32
//   q4_0  32 4-bit values q and an f16 scale d:    x = d * (q - 8)           18 bytes / 32
//   nf4   64 4-bit codes and a per-block absmax:   x = absmax * NF4[code]   (QLoRA)
//
// q8_0 and q4_0 have GGUF's byte layout (ggml's block_q8_0 / block_q4_0), so a GGUF tensor
// of those types is a row-major array of these blocks. In q4_0 byte j holds value j in its
// low nibble and value j + 16 in its high nibble, as ggml does. nf4 follows bitsandbytes:
// two codes per byte, the first in the high nibble, and the absmax of each block of 64
// double-quantized (quant/quantize.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>

namespace edl::quant {

/// The run-time name of a block format (a Linear's storage; files and flags spell it).
enum class Format : std::uint8_t { none, q8_0, q4_0, nf4 };

struct BlockQ8_0 {
  static constexpr std::int64_t elems = 32;
  f16 d;
  std::int8_t qs[32];
};
struct BlockQ4_0 {
  static constexpr std::int64_t elems = 32;
  f16 d;
  std::uint8_t qs[16];
};
/// nf4's codes; the block's scale is kept beside the codes (quant::Matrix::absmax), since
/// bitsandbytes stores it double-quantized in a separate array.
struct BlockNF4 {
  static constexpr std::int64_t elems = 64;
  std::uint8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockNF4) == 32,
              "edl::quant: the blocks must have ggml's byte layout");

/// Elements per block.
constexpr std::int64_t block_elems(Format f) noexcept {
  switch (f) {
    case Format::q8_0: return BlockQ8_0::elems;
    case Format::q4_0: return BlockQ4_0::elems;
    case Format::nf4: return BlockNF4::elems;
    case Format::none: break;
  }
  return 1;
}
/// Bytes per block (nf4: the codes only).
constexpr std::int64_t block_bytes(Format f) noexcept {
  switch (f) {
    case Format::q8_0: return sizeof(BlockQ8_0);
    case Format::q4_0: return sizeof(BlockQ4_0);
    case Format::nf4: return sizeof(BlockNF4);
    case Format::none: break;
  }
  return 0;
}

constexpr const char* format_name(Format f) noexcept {
  switch (f) {
    case Format::q8_0: return "q8_0";
    case Format::q4_0: return "q4_0";
    case Format::nf4: return "nf4";
    case Format::none: break;
  }
  return "none";
}

/// "q8_0", "q4_0", "nf4" or "none"; anything else is an edl::Error naming `where`.
inline Format parse_format(std::string_view s, const std::string& where) {
  for (Format f : {Format::none, Format::q8_0, Format::q4_0, Format::nf4})
    if (s == format_name(f)) return f;
  throw Error(errc::invalid_argument, where,
              "unknown quantization method \"" + std::string(s) + "\" (expected q8_0, q4_0, nf4 or none)");
}

// Compile-time schemes for the quantization slot of edl::Policy: a model whose policy names
// one quantizes the Linears of its decoder layers to that format when it is loaded or built
// (models::quantize's default pattern); quant::none keeps every weight in param_t.
struct q8_0 {
  static constexpr const char* name = "q8_0";
  static constexpr bool quantized = true;
  static constexpr Format format = Format::q8_0;
};
struct q4_0 {
  static constexpr const char* name = "q4_0";
  static constexpr bool quantized = true;
  static constexpr Format format = Format::q4_0;
};
struct nf4 {
  static constexpr const char* name = "nf4";
  static constexpr bool quantized = true;
  static constexpr Format format = Format::nf4;
};

/// The format a Policy's quantization slot names (Format::none for quant::none).
template <class Q>
constexpr Format format_of() noexcept {
  if constexpr (requires { Q::format; }) return Q::format;
  else return Format::none;
}

}  // namespace edl::quant
