// edl/kernels/quant_gemm.hpp
// Products with int8 weights for many rows: y [M, N] = x [M, K] W^T for q8_0 / q4_0 W, each
// output the definition's dot product (kernels/quant_dot.hpp) bit for bit, so a row's result
// does not depend on how many rows came with it.
//
//   kernels::quant_gemm_nt(xa, M, W, bias, y);   // xa: M rows of K / 32 ActivationBlocks
//   kernels::Int8Rows rows(x, M, K);              // x quantized once, then
//   kernels::quant_gemm_nt<float>(rows, parts);    // several products of it (q, k, v) at once
//
// A tile is a group of 16 weight rows (one per lane) by up to kTileRows activation rows: the
// group's codes are unpacked once a block and multiply each of the tile's activation rows.
// Where the build targets AMX and the system grants it, 8 activation rows at a time run on
// AMX tiles instead (kernels/quant_amx.hpp), with the same bits.
// Tasks take a few groups each and walk the activations in blocks that stay in L2, so that
// a group's weights stay in L1 over a block of activation rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/quant_amx.hpp>
#include <edl/kernels/quant_dot.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/matrix.hpp>

namespace edl::kernels {

namespace detail {

/// Activation rows a tile multiplies (the 512-bit kernel keeps their accumulators in registers).
inline constexpr int kTileRows =
#if defined(EDL_QUANT_ZMM)
    4;
#else
    1;
#endif

/// y[(m0 + m) * ldy + r] (+ bias[r]) = out[m * 16 + r - 16 g] for the rows r of group g that
/// exist and mr activation rows.
template <class TB>
inline void store_group_rows(const float* out, const quant::MatrixView& W, std::int64_t g, std::int64_t m0, int mr,
                             const TB* bias, float* y, std::int64_t ldy) noexcept {
  const std::int64_t r0 = g * quant::kGroupRows, n = std::min(quant::kGroupRows, W.rows - r0);
  for (int m = 0; m < mr; ++m)
    for (std::int64_t i = 0; i < n; ++i) {
      const float s = out[m * quant::kGroupRows + i];
      y[(m0 + m) * ldy + r0 + i] = bias ? s + to_f32(bias[r0 + i]) : s;
    }
}

/// y[m * ldy + r] (+ bias[r]) for the rows r of group g that exist, activation rows [m0, m0 + mr)
/// (mr <= kTileRows).
template <class TB>
inline void group_tile(const quant::MatrixView& W, std::int64_t g, const ActivationBlock* x, std::int64_t nb,
                       std::int64_t m0, int mr, const TB* bias, float* y, std::int64_t ldy) noexcept {
  alignas(64) float out[kTileRows * quant::kGroupRows];
  const ActivationBlock* xm = x + m0 * nb;
  switch (mr) {
#if defined(EDL_QUANT_ZMM)
    case 4: dot_group<4>(W, g, xm, nb, out); break;
    case 3: dot_group<3>(W, g, xm, nb, out); break;
    case 2: dot_group<2>(W, g, xm, nb, out); break;
#endif
    default: dot_group<1>(W, g, xm, nb, out); break;
  }
  store_group_rows(out, W, g, m0, mr, bias, y, ldy);
}

}  // namespace detail

/// x [M, K]'s rows (K a multiple of 32) quantized into out (K / 32 ActivationBlocks a row), in parallel.
inline void quantize_activation_rows(const float* x, std::int64_t M, std::int64_t K, ActivationBlock* out) {
  exec::parallel_for(0, M, 16, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::int64_t m = lo; m < hi; ++m) quantize_activations(x + m * K, out + m * (K / 32), K);
  });
}

/// Activation rows prepared for int8 products: quantized to q8_0 once (ActivationBlocks), so
/// that several products of the same rows (q, k and v; gate and up) share one preparation.
class Int8Rows {
 public:
  /// Quantizes x [M, K] (K a multiple of 32), rows in parallel.
  Int8Rows(const float* x, std::int64_t M, std::int64_t K)
      : M_(M), nb_(K / 32), own_(new ActivationBlock[static_cast<std::size_t>(M * (K / 32))]), blocks_(own_.get()) {
    quantize_activation_rows(x, M, K, own_.get());
  }
  /// M rows already quantized (nb blocks a row), borrowed: they must outlive this.
  Int8Rows(const ActivationBlock* xa, std::int64_t M, std::int64_t nb) : M_(M), nb_(nb), blocks_(xa) {}

  std::int64_t rows() const noexcept { return M_; }
  std::int64_t blocks_per_row() const noexcept { return nb_; }
  const ActivationBlock* blocks() const noexcept { return blocks_; }

 private:
  std::int64_t M_ = 0, nb_ = 0;
  std::unique_ptr<ActivationBlock[]> own_;  // uninitialized: every block is written
  const ActivationBlock* blocks_ = nullptr;
};

/// One product of a group: y [M, W.rows] = the rows . W's rows (+ bias).
template <class TB>
struct QuantGemmPart {
  quant::MatrixView W;
  const TB* bias = nullptr;
  float* y = nullptr;
};

/// Every part's y = the dots of its W's rows (q8_0 or q4_0, each W.cols = 32 x.blocks_per_row())
/// with x's rows, plus bias[j] when given; one parallel region over the groups of all parts.
template <class TB>
void quant_gemm_nt(const Int8Rows& x, std::span<const QuantGemmPart<TB>> parts) {
  const std::int64_t M = x.rows(), nb = x.blocks_per_row();
  const ActivationBlock* xa = x.blocks();
  // A task's groups (64 weight rows); its tiles walk the activations kActBlock rows at a time.
  constexpr std::int64_t kTaskGroups = 4, kActBlock = 64;
  const auto chunks_of = [](const QuantGemmPart<TB>& p) { return (p.W.groups() + kTaskGroups - 1) / kTaskGroups; };
  std::int64_t chunks = 0;
  for (const QuantGemmPart<TB>& p : parts) chunks += chunks_of(p);
  exec::parallel_for(0, chunks, 1, [&](std::ptrdiff_t c0, std::ptrdiff_t c1) {
    std::size_t part = 0;
    std::int64_t first = 0;  // the first chunk of `part`
#if defined(EDL_QUANT_AMX)
    const bool amx = M >= detail::kAmxRows && amx_available();
    thread_local aligned_vector<std::uint8_t> unpacked;  // the task's groups as the tiles take them
    if (amx) {
      detail::configure_tiles();
      unpacked.resize(static_cast<std::size_t>(kTaskGroups * nb * 512));
    }
#endif
    for (std::int64_t c = c0; c < c1; ++c) {
      while (c - first >= chunks_of(parts[part])) first += chunks_of(parts[part++]);
      const QuantGemmPart<TB>& p = parts[part];
      const std::int64_t g0 = (c - first) * kTaskGroups, g1 = std::min(p.W.groups(), g0 + kTaskGroups);
#if defined(EDL_QUANT_AMX)
      const std::uint8_t* amx_w[kTaskGroups] = {};
      if (amx)
        for (std::int64_t g = g0; g < g1; ++g) amx_w[g - g0] = detail::amx_weights(p.W, g, unpacked.data() + (g - g0) * nb * 512);
#endif
      for (std::int64_t m_lo = 0; m_lo < M; m_lo += kActBlock) {
        const std::int64_t m_hi = std::min(M, m_lo + kActBlock);
        for (std::int64_t g = g0; g < g1; ++g) {
          std::int64_t m = m_lo;
#if defined(EDL_QUANT_AMX)
          if (amx)
            for (; m + detail::kAmxRows <= m_hi; m += detail::kAmxRows) {
              alignas(64) float out[detail::kAmxRows * quant::kGroupRows];
              detail::amx_group_tile(p.W, g, amx_w[g - g0], xa + m * nb, nb, out);
              detail::store_group_rows(out, p.W, g, m, detail::kAmxRows, p.bias, p.y, p.W.rows);
            }
#endif
          for (; m < m_hi; m += detail::kTileRows)
            detail::group_tile(p.W, g, xa, nb, m, static_cast<int>(std::min<std::int64_t>(detail::kTileRows, m_hi - m)),
                               p.bias, p.y, p.W.rows);
        }
      }
    }
  });
}

/// y [M, N] = the dots of W's rows (q8_0 or q4_0, N = W.rows) with M activation rows (xa:
/// K / 32 blocks a row), plus bias[j] when given.
template <class TB>
void quant_gemm_nt(const ActivationBlock* xa, std::int64_t M, const quant::MatrixView& W, const TB* bias, float* y) {
  const QuantGemmPart<TB> part{W, bias, y};
  quant_gemm_nt<TB>(Int8Rows(xa, M, W.blocks_per_row()), std::span<const QuantGemmPart<TB>>(&part, 1));
}

}  // namespace edl::kernels
