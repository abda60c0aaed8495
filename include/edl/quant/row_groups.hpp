// edl/quant/row_groups.hpp
// How a q8_0 or q4_0 matrix lies in memory: in groups of 16 rows, their blocks interleaved so
// that one 64-byte vector holds four consecutive values of each of the 16 rows. The int8
// kernels then keep one row per 32-bit lane (kernels/quant_dot.hpp) and sum a block of each
// row without moving values across lanes. Files keep GGUF's layout (rows of blocks);
// to_groups / block_of convert. The bytes are the same count as the rows': a group of nb
// blocks a row is
//
//   codes:  nb x kGroupCodeBytes  block b: byte 64 k + 4 n + i holds value 4 k + i of row n
//                                 q8_0: k = 0..7, int8 as in the block
//                                 q4_0: k = 0..3, the block's byte 4 k + i: value 4 k + i in
//                                       the low nibble, value 4 k + i + 16 in the high one
//   scales: nb x 16 f16           block b: row n's scale at 16 b + n
//
// A last group that has fewer than 16 rows is padded with zero rows (zero codes and scales),
// which the kernels compute and nobody reads.
#pragma once

#include <cstdint>
#include <cstring>

#include <edl/core/dtype.hpp>
#include <edl/quant/formats.hpp>

namespace edl::quant {

/// Rows in a group.
inline constexpr std::int64_t kGroupRows = 16;

/// Whether the format lies in row groups (q8_0, q4_0); nf4 keeps rows of blocks.
constexpr bool in_row_groups(Format f) noexcept { return f == Format::q8_0 || f == Format::q4_0; }

/// Code bytes of one block of a group's 16 rows.
constexpr std::int64_t group_code_bytes(Format f) noexcept { return f == Format::q8_0 ? 512 : 256; }

/// Bytes of a group of 16 rows of nb blocks.
constexpr std::int64_t group_bytes(Format f, std::int64_t nb) noexcept { return nb * (group_code_bytes(f) + 32); }

/// Offset in a block's group codes of byte i of row n (q8_0: value i; q4_0: the block's byte i).
constexpr std::int64_t group_code_offset(int n, int i) noexcept { return 64 * (i / 4) + 4 * n + i % 4; }

/// Puts row n (0..15) of a group, nb blocks of GGUF's layout, into the group at g.
inline void put_group_row(Format f, const std::uint8_t* row, std::int64_t nb, int n, std::uint8_t* g) noexcept {
  const std::int64_t cb = group_code_bytes(f);
  std::uint8_t* scales = g + nb * cb;
  for (std::int64_t b = 0; b < nb; ++b) {
    std::uint8_t* codes = g + b * cb;
    if (f == Format::q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      std::memcpy(scales + 2 * (16 * b + n), &blk->d, 2);
      for (int e = 0; e < 32; ++e) codes[group_code_offset(n, e)] = static_cast<std::uint8_t>(blk->qs[e]);
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      std::memcpy(scales + 2 * (16 * b + n), &blk->d, 2);
      for (int e = 0; e < 16; ++e) codes[group_code_offset(n, e)] = blk->qs[e];
    }
  }
}

/// Block b of row n (0..15) of the group at g, in GGUF's layout (BlockQ8_0 or BlockQ4_0 at out).
inline void block_of(Format f, const std::uint8_t* g, std::int64_t nb, int n, std::int64_t b, void* out) noexcept {
  const std::int64_t cb = group_code_bytes(f);
  const std::uint8_t* codes = g + b * cb;
  const std::uint8_t* scales = g + nb * cb;
  if (f == Format::q8_0) {
    auto* blk = static_cast<BlockQ8_0*>(out);
    std::memcpy(&blk->d, scales + 2 * (16 * b + n), 2);
    for (int e = 0; e < 32; ++e) blk->qs[e] = static_cast<std::int8_t>(codes[group_code_offset(n, e)]);
  } else {
    auto* blk = static_cast<BlockQ4_0*>(out);
    std::memcpy(&blk->d, scales + 2 * (16 * b + n), 2);
    for (int e = 0; e < 16; ++e) blk->qs[e] = codes[group_code_offset(n, e)];
  }
}

}  // namespace edl::quant
