// edl/kernels/quant_amx.hpp
// Tiles of int8 products on AMX (Intel's tile unit), for prefill where the build targets it:
// 8 activation rows by a group of 16 weight rows (quant/row_groups.hpp), one block a tile
// multiply. `tdpbssd` (q8_0) or `tdpbsud` (q4_0's unsigned codes) gives each output's exact
// int32 block sum; the scaling then runs as in kernels::dot_group: s (+ -8 sum x for q4_0)
// to f32, times d_w * d_x, added into the even or the odd blocks' chain. So every output is
// the definition's dot product (kernels/quant_dot.hpp), the bits of the VNNI path.
//
// Linux hands a process the tile state only on request (arch_prctl); where it refuses,
// amx_available() is false and the products run on the VNNI tiles, with the same bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <edl/kernels/quant_dot.hpp>
#include <edl/quant/matrix.hpp>
#include <edl/quant/row_groups.hpp>

#if defined(EDL_QUANT_ZMM) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define EDL_QUANT_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace edl::kernels {

/// Whether prefill's int8 products run on AMX tiles in this process.
inline bool amx_available() noexcept {
#if defined(EDL_QUANT_AMX)
  constexpr long kReqTilePermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  static const bool ok = syscall(SYS_arch_prctl, kReqTilePermission, kTileData) == 0;
  return ok;
#else
  return false;
#endif
}

#if defined(EDL_QUANT_AMX)
namespace detail {

/// Activation rows of an AMX tile.
inline constexpr int kAmxRows = 8;

/// Sets this thread's tiles once: 0-3 four blocks' int32 sums (8 x 16), 4-5 activations (8 rows
/// x 32 bytes), 6-7 weights (8 rows of 4 bytes x 16 rows).
inline void configure_tiles() noexcept {
  thread_local bool configured = false;
  if (configured) return;
  struct alignas(64) {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {64, 64, 64, 64, 32, 32, 64, 64};
    std::uint8_t rows[16] = {kAmxRows, kAmxRows, kAmxRows, kAmxRows, kAmxRows, kAmxRows, 8, 8};
  } config;
  _tile_loadconfig(&config);
  configured = true;
}

/// Group g's weights as the tiles multiply them (nb x 512 bytes at out): q4_0's codes split
/// into unsigned bytes (B row k: values 4k..4k+3 of each row); q8_0's are already so.
inline const std::uint8_t* amx_weights(const quant::MatrixView& W, std::int64_t g, std::uint8_t* out) noexcept {
  const std::uint8_t* codes = W.group(g);
  if (W.format == quant::Format::q8_0) return codes;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (std::int64_t b = 0; b < W.blocks_per_row(); ++b)
    for (int k = 0; k < 4; ++k) {
      const __m512i raw = _mm512_loadu_si512(codes + b * 256 + 64 * k);
      _mm512_store_si512(out + b * 512 + 64 * k, _mm512_and_si512(raw, low4));
      _mm512_store_si512(out + b * 512 + 64 * (k + 4), _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
    }
  return out;
}

/// out[m * 16 + n] = row n of group g . activation row m for kAmxRows rows at x (ldx blocks
/// apart); w: the group's weights from amx_weights. configure_tiles() first.
inline void amx_group_tile(const quant::MatrixView& W, std::int64_t g, const std::uint8_t* w, const ActivationBlock* x,
                           std::int64_t ldx, float* out) noexcept {
  const std::int64_t nb = W.blocks_per_row();
  const bool four = W.format == quant::Format::q4_0;
  const std::uint16_t* scales = reinterpret_cast<const std::uint16_t*>(W.group(g) + nb * quant::group_code_bytes(W.format));
  const std::int64_t stride = ldx * static_cast<std::int64_t>(sizeof(ActivationBlock));
  alignas(64) std::int32_t sums[4][kAmxRows * 16];
  __m512 even[kAmxRows], odd[kAmxRows];
  for (int m = 0; m < kAmxRows; ++m) even[m] = odd[m] = _mm512_setzero_ps();
  const auto scale = [&](std::int64_t b, const std::int32_t* s, __m512 (&acc)[kAmxRows]) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 16 * b)));
#pragma GCC unroll 8
    for (int m = 0; m < kAmxRows; ++m) {
      const ActivationBlock& xb = x[m * ldx + b];
      __m512i v = _mm512_load_si512(s + 16 * m);
      if (four) v = _mm512_add_epi32(v, _mm512_set1_epi32(xb.neg8_sum));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), acc[m]);
    }
  };
  // Block b's sums go to tile b mod 4: the tile unit multiplies two blocks ahead while the
  // vector unit scales the sums it has finished. (The tile intrinsics take tile numbers as
  // literals.)
#define EDL_AMX_ISSUE(C, A, B, blk)                       \
  if ((blk) < nb) {                                       \
    _tile_zero(C);                                        \
    _tile_loadd(A, x[blk].qs, stride);                    \
    _tile_loadd(B, w + (blk) * 512, 64);                  \
    if (four) _tile_dpbsud(C, A, B);                      \
    else _tile_dpbssd(C, A, B);                           \
  }
#define EDL_AMX_FINISH(C, blk, acc)                       \
  if ((blk) < nb) {                                       \
    _tile_stored(C, sums[C], 64);                         \
    scale(blk, sums[C], acc);                             \
  }
  EDL_AMX_ISSUE(0, 4, 6, 0)
  EDL_AMX_ISSUE(1, 5, 7, 1)
  for (std::int64_t b = 0; b < nb; b += 4) {
    EDL_AMX_ISSUE(2, 4, 6, b + 2)
    EDL_AMX_ISSUE(3, 5, 7, b + 3)
    EDL_AMX_FINISH(0, b, even)
    EDL_AMX_FINISH(1, b + 1, odd)
    EDL_AMX_ISSUE(0, 4, 6, b + 4)
    EDL_AMX_ISSUE(1, 5, 7, b + 5)
    EDL_AMX_FINISH(2, b + 2, even)
    EDL_AMX_FINISH(3, b + 3, odd)
  }
#undef EDL_AMX_ISSUE
#undef EDL_AMX_FINISH
  for (int m = 0; m < kAmxRows; ++m) _mm512_storeu_ps(out + 16 * m, _mm512_add_ps(even[m], odd[m]));
}

}  // namespace detail
#endif

}  // namespace edl::kernels
