// edl/kernels/quant_gemm.hpp
// Prefill with int8 weights: y [M, N] = x [M, K] W^T for q8_0 / q4_0 W and many rows of x,
// each output the same sum as the decode dot product (kernels/quant_dot.hpp) bit for bit.
//
//   kernels::quant_gemm_nt(xa, M, W, bias, y);   // xa: M rows of K / 32 ActivationBlocks
//   kernels::Int8Rows rows(x, M, K);              // x quantized and packed once, then
//   kernels::quant_gemm_nt<float>(rows, parts);    // several products of it (q, k, v) at once
//
// With AVX-512 VNNI a tile of 4 weight rows by 4 activation rows runs two blocks per 512-bit
// vector: the even block in lanes 0-7 and the odd one in lanes 8-15, which is exactly the
// two accumulators of the dot's definition. The activations go unsigned (x + 128, a flip of
// the sign bit) so vpdpbusd takes the weights as they are, and -128 * (each lane's weight sum),
// made once per weight block, starts the sum: the same integers as the dot's. Both sides are
// packed into those vectors once per call (the activations for all tasks, each chunk of 16
// weight rows by its task), not once per tile. Tiles are parallel over chunks of weight rows
// and walk the activations in blocks that stay in L2; the edges run the dot products themselves.
//
// With AVX2 (and AVX-VNNI) a tile is 4 weight rows by 2 activation rows: eight accumulators
// of eight lanes in sixteen registers. Both formats are packed as signed int8 values (q4_0's codes minus 8) and multiplied as the q8_0 dot does
// (|w| times x with w's sign); each lane's integer is exact, so it is the dot's integer. The
// dot's two chains run one after the other (the even blocks, then the odd ones): the order of
// a chain's terms is what the definition fixes, not when the chains run. Without AVX2 every
// output is a dot product.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/quant_dot.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/matrix.hpp>


namespace edl::kernels {

namespace detail {

/// The dot of weight row r (q8_0 or q4_0) with one activation row.
inline float int8_row_dot(const quant::MatrixView& W, std::int64_t r, const ActivationBlock* xa) noexcept {
  const std::int64_t nb = W.blocks_per_row();
  if (W.format == quant::Format::q8_0) return dot_q8_0(reinterpret_cast<const quant::BlockQ8_0*>(W.row(r)), xa, nb);
  return dot_q4_0(reinterpret_cast<const quant::BlockQ4_0*>(W.row(r)), xa, nb);
}

#if defined(EDL_QUANT_ZMM)
/// Weights prepared once per call for the tiles: for 4 rows and a pair of blocks (b, b + 1),
/// each row's two blocks as signed int8 (b + 1 zero when absent), -128 * each lane's weight
/// sum, and the two scales spread over the lanes.
struct alignas(64) PackedWeightPair {
  __m512i w[4], negc[4];
  __m512 d[4];
};
/// An activation row's pair of blocks, made unsigned (x + 128), and its two scales.
struct alignas(64) PackedActivationPair {
  __m512i xu;
  __m512 d;
};

/// Rows r0..r0+3 of W for pairs [0, pairs) into out[pairs].
inline void pack_weight_pairs(const quant::MatrixView& W, std::int64_t r0, PackedWeightPair* out) noexcept {
  const std::int64_t nb = W.blocks_per_row();
  const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m256i eight = _mm256_set1_epi8(8);
  for (int i = 0; i < 4; ++i)
    for (std::int64_t b = 0; b < nb; b += 2) {
      const bool second = b + 1 < nb;
      PackedWeightPair& o = out[b / 2];
      float d0, d1 = 0.f;
      __m256i lo, hi = _mm256_setzero_si256();
      if (W.format == quant::Format::q8_0) {
        const auto* w = reinterpret_cast<const quant::BlockQ8_0*>(W.row(r0 + i)) + b;
        d0 = f16_to_f32(w[0].d);
        lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[0].qs));
        if (second) {
          d1 = f16_to_f32(w[1].d);
          hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[1].qs));
        }
      } else {
        const auto* w = reinterpret_cast<const quant::BlockQ4_0*>(W.row(r0 + i)) + b;
        d0 = f16_to_f32(w[0].d);
        lo = _mm256_sub_epi8(unpack_q4_0(w[0].qs), eight);
        if (second) {
          d1 = f16_to_f32(w[1].d);
          hi = _mm256_sub_epi8(unpack_q4_0(w[1].qs), eight);
        }
      }
      o.w[i] = two_halves(lo, hi);
      o.negc[i] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, o.w[i]));
      o.d[i] = two_halves(d0, d1);
    }
}

/// An activation row's blocks (nb) into pairs (nb + 1) / 2.
inline void pack_activation_pairs(const ActivationBlock* x, std::int64_t nb, PackedActivationPair* out) noexcept {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (std::int64_t b = 0; b < nb; b += 2) {
    const bool second = b + 1 < nb;
    const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i hi = second ? _mm256_load_si256(reinterpret_cast<const __m256i*>(x[b + 1].qs)) : _mm256_setzero_si256();
    out[b / 2].xu = _mm512_xor_si512(two_halves(lo, hi), flip);
    out[b / 2].d = two_halves(x[b].d, second ? x[b + 1].d : 0.f);
  }
}

/// y[m * ldy + r0 + i] for the 4 packed weight rows and activation rows m0..m0+3 (pairs each).
/// Lanes 8-15 of an absent odd block are zero weights with a zero scale: they add +0.0.
inline void int8_tile_4x4(const PackedWeightPair* w, const PackedActivationPair* xa, std::int64_t m0, std::int64_t pairs,
                          std::int64_t r0, float* y, std::int64_t ldy) noexcept {
  __m512 acc[4][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < pairs; ++p) {
    const PackedWeightPair& wp = w[p];
    // Unrolled, so that the 16 accumulators stay in registers.
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const PackedActivationPair& x = xa[(m0 + j) * pairs + p];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i s = _mm512_dpbusd_epi32(wp.negc[i], x.xu, wp.w[i]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wp.d[i], x.d), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) y[(m0 + j) * ldy + r0 + i] = sum_lanes16(acc[i][j]);
}
#elif defined(EDL_QUANT_AVX2)
/// Block b of 4 weight rows, prepared once per call: the 32 values as signed int8 and the scales.
struct alignas(32) PackedWeightBlocks {
  __m256i w[4];
  float d[4];
};

/// Rows r0..r0+3 of W, every block, into out[nb].
inline void pack_weight_blocks(const quant::MatrixView& W, std::int64_t r0, PackedWeightBlocks* out) noexcept {
  const std::int64_t nb = W.blocks_per_row();
  const __m256i eight = _mm256_set1_epi8(8);
  for (int i = 0; i < 4; ++i)
    for (std::int64_t b = 0; b < nb; ++b) {
      if (W.format == quant::Format::q8_0) {
        const auto& w = reinterpret_cast<const quant::BlockQ8_0*>(W.row(r0 + i))[b];
        out[b].w[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));
        out[b].d[i] = f16_to_f32(w.d);
      } else {
        const auto& w = reinterpret_cast<const quant::BlockQ4_0*>(W.row(r0 + i))[b];
        out[b].w[i] = _mm256_sub_epi8(unpack_q4_0(w.qs), eight);
        out[b].d[i] = f16_to_f32(w.d);
      }
    }
}

/// One of the dot's two chains (blocks b0, b0 + 2, ..) for 4 packed weight rows by the NR
/// activation rows m0..: out[i][j] holds its eight lanes.
template <int NR>
inline void int8_chain_4xn(const PackedWeightBlocks* w, const ActivationBlock* xa, std::int64_t nb, std::int64_t m0,
                           std::int64_t b0, __m256 (&out)[4][NR]) noexcept {
  __m256 acc[4][NR];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (std::int64_t b = b0; b < nb; b += 2) {
    const PackedWeightBlocks& wb = w[b];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256 dw = _mm256_broadcast_ss(&wb.d[i]);
#pragma GCC unroll 2
      for (int j = 0; j < NR; ++j) {
        const ActivationBlock& x = xa[(m0 + j) * nb + b];
        const __m256i s = dot_i8_lanes(wb.w[i], _mm256_load_si256(reinterpret_cast<const __m256i*>(x.qs)));
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_broadcast_ss(&x.d)), acc[i][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) out[i][j] = acc[i][j];
}

/// y[m * ldy + r0 + i] for the 4 packed weight rows and the NR activation rows m0.. (nb blocks
/// each): the even chain, then the odd one, added lane by lane and summed in sum_lanes8's tree.
template <int NR>
inline void int8_tile_4xn(const PackedWeightBlocks* w, const ActivationBlock* xa, std::int64_t nb, std::int64_t m0,
                          std::int64_t r0, float* y, std::int64_t ldy) noexcept {
  __m256 even[4][NR], odd[4][NR];
  int8_chain_4xn<NR>(w, xa, nb, m0, 0, even);
  int8_chain_4xn<NR>(w, xa, nb, m0, 1, odd);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < NR; ++j) y[(m0 + j) * ldy + r0 + i] = sum_lanes8(_mm256_add_ps(even[i][j], odd[i][j]));
}
#endif

}  // namespace detail

/// x [M, K]'s rows (K a multiple of 32) quantized into out (K / 32 ActivationBlocks a row), in parallel.
inline void quantize_activation_rows(const float* x, std::int64_t M, std::int64_t K, ActivationBlock* out) {
  exec::parallel_for(0, M, 16, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::int64_t m = lo; m < hi; ++m) quantize_activations(x + m * K, out + m * (K / 32), K);
  });
}

/// Activation rows prepared for int8 products: quantized to q8_0 once (ActivationBlocks) and,
/// with 512-bit VNNI, packed as the tiles read them, so that several products of the same rows
/// (q, k and v; gate and up) share one preparation.
class Int8Rows {
 public:
  /// Quantizes x [M, K] (K a multiple of 32), rows in parallel.
  Int8Rows(const float* x, std::int64_t M, std::int64_t K)
      : M_(M), nb_(K / 32), own_(new ActivationBlock[static_cast<std::size_t>(M * (K / 32))]), blocks_(own_.get()) {
    quantize_activation_rows(x, M, K, own_.get());
    pack();
  }
  /// M rows already quantized (nb blocks a row), borrowed: they must outlive this.
  Int8Rows(const ActivationBlock* xa, std::int64_t M, std::int64_t nb) : M_(M), nb_(nb), blocks_(xa) { pack(); }

  std::int64_t rows() const noexcept { return M_; }
  std::int64_t blocks_per_row() const noexcept { return nb_; }
  const ActivationBlock* blocks() const noexcept { return blocks_; }
#if defined(EDL_QUANT_ZMM)
  /// Rows [0, M / 4 * 4) as pairs of blocks, (nb + 1) / 2 a row (the tiles' rows).
  const detail::PackedActivationPair* pairs() const noexcept { return pairs_.data(); }
#endif

 private:
  void pack() {
#if defined(EDL_QUANT_ZMM)
    // Preparing a pair costs about as much as the 16 products of a tile: once for every task.
    const std::int64_t pairs = (nb_ + 1) / 2, M4 = M_ / 4 * 4;
    pairs_.resize(static_cast<std::size_t>(M4 * pairs));
    exec::parallel_for(0, M4, 16, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t m = lo; m < hi; ++m) detail::pack_activation_pairs(blocks_ + m * nb_, nb_, pairs_.data() + m * pairs);
    });
#endif
  }

  std::int64_t M_ = 0, nb_ = 0;
  std::unique_ptr<ActivationBlock[]> own_;  // uninitialized: every block is written
  const ActivationBlock* blocks_ = nullptr;
#if defined(EDL_QUANT_ZMM)
  aligned_vector<detail::PackedActivationPair> pairs_;
#endif
};

/// One product of a group: y [M, W.rows] = the rows . W's rows (+ bias).
template <class TB>
struct QuantGemmPart {
  quant::MatrixView W;
  const TB* bias = nullptr;
  float* y = nullptr;
};

/// Every part's y = the dots of its W's rows (q8_0 or q4_0, each W.cols = 32 x.blocks_per_row())
/// with x's rows, plus bias[j] when given; one parallel region over the chunks of all parts.
template <class TB>
void quant_gemm_nt(const Int8Rows& x, std::span<const QuantGemmPart<TB>> parts) {
  const std::int64_t M = x.rows(), nb = x.blocks_per_row();
  const ActivationBlock* xa = x.blocks();
  // A task's chunk of weight rows; its tiles walk the activations kActBlock rows at a time.
  constexpr std::int64_t kRowChunk = 16;
  [[maybe_unused]] constexpr std::int64_t kActBlock = 64;
  const auto chunks_of = [](const QuantGemmPart<TB>& p) { return (p.W.rows + kRowChunk - 1) / kRowChunk; };
  std::int64_t chunks = 0;
  for (const QuantGemmPart<TB>& p : parts) chunks += chunks_of(p);
  exec::parallel_for(0, chunks, 1, [&](std::ptrdiff_t c0, std::ptrdiff_t c1) {
#if defined(EDL_QUANT_ZMM)
    const std::int64_t pairs = (nb + 1) / 2, M4 = M / 4 * 4;
    thread_local aligned_vector<detail::PackedWeightPair> wp;  // no product runs inside a chunk
    wp.resize(static_cast<std::size_t>(kRowChunk / 4 * pairs));
#elif defined(EDL_QUANT_AVX2)
    thread_local aligned_vector<detail::PackedWeightBlocks> wp;  // no product runs inside a chunk
    wp.resize(static_cast<std::size_t>(kRowChunk / 4 * nb));
#endif
    std::size_t part = 0;
    std::int64_t first = 0;  // the first chunk of `part`
    for (std::int64_t c = c0; c < c1; ++c) {
      while (c - first >= chunks_of(parts[part])) first += chunks_of(parts[part++]);
      const quant::MatrixView& W = parts[part].W;
      float* y = parts[part].y;
      const TB* bias = parts[part].bias;
      const std::int64_t N = W.rows, r_lo = (c - first) * kRowChunk, r_hi = std::min(N, r_lo + kRowChunk);
      std::int64_t r_tiles = r_lo;  // rows [r_lo, r_tiles) run in tiles
#if defined(EDL_QUANT_ZMM)
      for (; r_tiles + 4 <= r_hi; r_tiles += 4) detail::pack_weight_pairs(W, r_tiles, wp.data() + (r_tiles - r_lo) / 4 * pairs);
      for (std::int64_t m_lo = 0; m_lo < M4; m_lo += kActBlock) {
        const std::int64_t m_hi = std::min(M4, m_lo + kActBlock);
        for (std::int64_t r = r_lo; r < r_tiles; r += 4)
          for (std::int64_t m = m_lo; m < m_hi; m += 4)
            detail::int8_tile_4x4(wp.data() + (r - r_lo) / 4 * pairs, x.pairs(), m, pairs, r, y, N);
      }
      for (std::int64_t m = M4; m < M; ++m)
        for (std::int64_t r = r_lo; r < r_tiles; ++r) y[m * N + r] = detail::int8_row_dot(W, r, xa + m * nb);
#elif defined(EDL_QUANT_AVX2)
      for (; r_tiles + 4 <= r_hi; r_tiles += 4) detail::pack_weight_blocks(W, r_tiles, wp.data() + (r_tiles - r_lo) / 4 * nb);
      const std::int64_t M2 = M / 2 * 2;
      for (std::int64_t m_lo = 0; m_lo < M2; m_lo += kActBlock) {
        const std::int64_t m_hi = std::min(M2, m_lo + kActBlock);
        for (std::int64_t r = r_lo; r < r_tiles; r += 4)
          for (std::int64_t m = m_lo; m < m_hi; m += 2)
            detail::int8_tile_4xn<2>(wp.data() + (r - r_lo) / 4 * nb, xa, nb, m, r, y, N);
      }
      if (M2 < M)
        for (std::int64_t r = r_lo; r < r_tiles; r += 4)
          detail::int8_tile_4xn<1>(wp.data() + (r - r_lo) / 4 * nb, xa, nb, M2, r, y, N);
#endif
      for (std::int64_t r = r_tiles; r < r_hi; ++r)
        for (std::int64_t m = 0; m < M; ++m) y[m * N + r] = detail::int8_row_dot(W, r, xa + m * nb);
      if (bias)
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t r = r_lo; r < r_hi; ++r) y[m * N + r] += to_f32(bias[r]);
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
