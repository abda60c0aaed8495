// edl/kernels/quant_dot.hpp
// Dot products of quantized weights with activations, the inner loop of every product with
// quantized weights (kernels/quant_matvec.hpp and quant_gemm.hpp run them over matrices).
//
//   kernels::quantize_activations(x, xa, K);        // x -> ActivationBlocks (q8_0 values)
//   kernels::dot_group<MR>(W, g, xa, nb, out);       // 16 rows of q8_0 / q4_0 W . MR activation rows
//   float s = kernels::dot_nf4(codes, absmax, x, K / 64); // nf4 weights . f32 activations
//
// The int8 formats multiply integers, as llama.cpp does. Their definition, for a weight row w
// and an activation row x of nb blocks:
//
//   s_b = the exact int32 sum of block b's 32 products (q4_0's values are code - 8)
//   acc_(b mod 2) = fma(float(s_b), d_w,b * d_x,b, acc_(b mod 2))   (d_w * d_x one f32 product)
//   dot = acc_0 + acc_1
//
// reference::dot_int8 writes it out. The weights lie in groups of 16 rows whose blocks are
// interleaved (quant/row_groups.hpp), so a vector holds one row per 32-bit lane: vpdpbusd
// (AVX-512 VNNI, AVX-VNNI) or vpmaddubsw + vpmaddwd (AVX2) sums four products into each
// row's lane, eight steps make a block's sum, and no value crosses lanes. Every path gives
// the definition's bits. The activations are a q8_0 row prepared once per product
// (ActivationBlock: the scale as f32 and the sum of the values). The sum lets unsigned codes
// be multiplied directly: sum (q - 8) x = sum q x - 8 sum x for q4_0, and for q8_0 in
// vpdpbusd (w + 128) x - 128 sum x. nf4 dequantizes in registers (a 16-entry table lookup)
// and multiplies f32 activations.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <edl/core/dtype.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/matrix.hpp>
#include <edl/quant/quantize.hpp>
#include <edl/quant/row_groups.hpp>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define EDL_QUANT_AVX2 1
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define EDL_QUANT_VNNI 1
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define EDL_QUANT_ZMM 1  // 512-bit vpdpbusd: a group's 16 rows in one vector
#endif
#endif

namespace edl::kernels {

/// The instruction path the quantized dot products use in this build.
inline constexpr const char* quant_dot_path =
#if defined(EDL_QUANT_VNNI)
    "vnni";
#elif defined(EDL_QUANT_AVX2)
    "avx2";
#else
    "scalar";
#endif

namespace reference {

inline float sum_lanes8(const float* a) noexcept { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

/// The definition of the int8 formats' dot product (q8_0 or q4_0 blocks . q8_0 activations),
/// written out.
template <class Block>
inline float dot_int8(const Block* w, const quant::BlockQ8_0* x, std::int64_t nb) noexcept {
  float acc[2] = {0.f, 0.f};
  for (std::int64_t b = 0; b < nb; ++b) {
    std::int32_t s = 0;
    for (int j = 0; j < 32; ++j) {
      std::int32_t v;
      if constexpr (sizeof(Block) == sizeof(quant::BlockQ8_0)) v = w[b].qs[j];
      else v = quant::q4_0_value(w[b], j);
      s += v * static_cast<std::int32_t>(x[b].qs[j]);
    }
    const float d = w[b].d.to_float() * x[b].d.to_float();
    acc[b & 1] = std::fma(static_cast<float>(s), d, acc[b & 1]);
  }
  return acc[0] + acc[1];
}

/// The definition of dot_nf4 for a vector of L lanes (8 with AVX2, 16 with AVX-512): the
/// activations of a block are taken in the order codes are packed, lane l of step t reading
/// byte t * L + l (its high code against x[2 * byte], then its low code against x[2 * byte + 1])
/// into a block partial p_l; then acc_l = fma(p_l, absmax, acc_l); lanes summed pairwise
/// (l with l + L/2) down to eight, then sum_lanes8.
template <int L>
inline float dot_nf4(const quant::BlockNF4* w, const float* absmax, const float* x, std::int64_t nb) noexcept {
  float acc[L] = {};
  for (std::int64_t b = 0; b < nb; ++b, x += 64) {
    float p[L] = {};
    for (int t = 0; t < 32 / L; ++t)
      for (int l = 0; l < L; ++l) {
        const int byte = t * L + l;
        const std::uint8_t q = w[b].qs[byte];
        p[l] = std::fma(quant::kNF4Levels[q >> 4], x[2 * byte], p[l]);
        p[l] = std::fma(quant::kNF4Levels[q & 15], x[2 * byte + 1], p[l]);
      }
    for (int l = 0; l < L; ++l) acc[l] = std::fma(p[l], absmax[b], acc[l]);
  }
  for (int w2 = L / 2; w2 >= 8; w2 /= 2)
    for (int l = 0; l < w2; ++l) acc[l] += acc[l + w2];
  return sum_lanes8(acc);
}

}  // namespace reference

/// One block of 32 activations quantized to q8_0, as the dot products read it.
struct alignas(64) ActivationBlock {
  std::int8_t qs[32];
  std::int32_t sum;         // qs[0] + .. + qs[31]
  std::int32_t neg8_sum;    // -8 sum: starts a q4_0 block's sum (its codes are q + 8)
  std::int32_t neg128_sum;  // -128 sum: starts a q8_0 block's sum in vpdpbusd (w + 128)
  float d;                  // the block's f16 scale, widened
};

/// The ActivationBlock of a q8_0 block.
inline void prepare_activation(const quant::BlockQ8_0& in, ActivationBlock& out) noexcept {
  std::memcpy(out.qs, in.qs, 32);
  out.sum = 0;
  for (int j = 0; j < 32; ++j) out.sum += in.qs[j];
  out.neg8_sum = -8 * out.sum;
  out.neg128_sum = -128 * out.sum;
  out.d = in.d.to_float();
}

#if defined(EDL_QUANT_AVX2)
namespace detail {
/// ((0+4)+(2+6))+((1+5)+(3+7)), reference::sum_lanes8's tree.
inline float sum_lanes8(__m256 v) noexcept {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
inline float f16_to_f32(f16 h) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return h.to_float();
#endif
}
#if defined(__AVX512F__)
/// Sixteen lanes as two halves of eight added lane by lane (lanes 0-7 + 8-15: the even and odd
/// chains, or a 16-lane sum folded to eight), then sum_lanes8's tree.
inline float sum_lanes16(__m512 v) noexcept {
  return sum_lanes8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
#endif
}  // namespace detail
#endif

#if defined(EDL_QUANT_AVX2)
namespace detail {
/// One block of 32 activations to q8_0 values in order (returned) with
/// quant::quantize_activations_ref's rounding; d receives the scale amax / 127 before its f16 rounding.
inline __m256i quantize_block(const float* x, float& d) noexcept {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float amax = _mm_cvtss_f32(h);
  d = amax / 127.f;
  const __m256 idv = _mm256_set1_ps(amax != 0.f ? 127.f / amax : 0.f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // Pack 4 x 8 int32 -> 32 int8 in order (packs interleave 128-bit lanes; permute fixes it).
  const __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  return _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
/// The f16 nearest to f (ties to even), as f16(f) rounds.
inline f16 to_f16(float f) noexcept {
#if defined(__F16C__)
  return f16::from_bits(static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
#else
  return f16(f);
#endif
}
}  // namespace detail
#endif

/// Quantizes K values (K a multiple of 32) to q8_0 blocks with the activations' rounding
/// (quant::quantize_activations_ref, bit for bit).
inline void quantize_activations(const float* x, quant::BlockQ8_0* out, std::int64_t K) noexcept {
#if defined(EDL_QUANT_AVX2)
  for (std::int64_t b = 0; b < K / 32; ++b, x += 32) {
    float d;
    const __m256i q = detail::quantize_block(x, d);
    out[b].d = detail::to_f16(d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), q);
  }
#else
  quant::quantize_activations_ref(x, out, K);
#endif
}

/// Quantizes K values (K a multiple of 32) into ActivationBlocks: each the ActivationBlock
/// prepare_activation makes of the q8_0 block quantize_activations gives.
inline void quantize_activations(const float* x, ActivationBlock* out, std::int64_t K) noexcept {
#if defined(EDL_QUANT_AVX2)
  for (std::int64_t b = 0; b < K / 32; ++b, x += 32) {
    float d;
    const __m256i q = detail::quantize_block(x, d);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].qs), q);
    // The values' sum, exact: pairs to int16, then to eight int32, then across.
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    out[b].sum = _mm_cvtsi128_si32(t);
    out[b].neg8_sum = -8 * out[b].sum;
    out[b].neg128_sum = -128 * out[b].sum;
    out[b].d = detail::f16_to_f32(detail::to_f16(d));
  }
#else
  for (std::int64_t b = 0; b < K / 32; ++b) {
    quant::BlockQ8_0 q;
    quantize_activations(x + 32 * b, &q, 32);
    prepare_activation(q, out[b]);
  }
#endif
}

namespace detail {

/// Asks for the 64-byte lines of [p, p + bytes) into L2. On x86 an asm statement: GCC 12 drops
/// __builtin_prefetch from a function that does nothing else once it inlines it (the function
/// looks free of effects, so its calls go).
inline void prefetch_lines(const std::uint8_t* p, std::int64_t bytes) noexcept {
  for (std::int64_t c = 0; c < bytes; c += 64) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht1 %0" : : "m"(p[c]));
#else
    __builtin_prefetch(p + c, 0, 2);
#endif
  }
}

/// How far ahead of the block it multiplies a product asks for the weights: decode is a stream
/// of groups, and one core's hardware prefetcher alone left the dots waiting on memory (or on
/// a large L3) about half the time.
inline constexpr std::int64_t kWeightPrefetchBytes = 4096;

/// Value e (0..31) of row n of block b's codes in a group (q4_0: code - 8), as the definition
/// multiplies it.
inline std::int32_t group_value(quant::Format f, const std::uint8_t* codes, int n, int e) noexcept {
  if (f == quant::Format::q8_0) return static_cast<std::int8_t>(codes[quant::group_code_offset(n, e)]);
  const int i = e % 16;
  const std::uint8_t c = codes[quant::group_code_offset(n, i)];
  return (e < 16 ? c & 15 : c >> 4) - 8;
}

}  // namespace detail

/// out[m * 16 + n] = row n of group g of W (q8_0 or q4_0) . activation row m, for MR rows of
/// ActivationBlocks at x + m * ldx: the definition's bits (reference::dot_int8). A padding row
/// of the last group gives 0.
template <int MR>
inline void dot_group(const quant::MatrixView& W, std::int64_t g, const ActivationBlock* x, std::int64_t ldx,
                      float* out) noexcept {
  const std::int64_t nb = W.blocks_per_row(), cb = quant::group_code_bytes(W.format);
  const std::uint8_t* codes = W.group(g);
  const std::uint16_t* scales = reinterpret_cast<const std::uint16_t*>(codes + nb * cb);
  const bool four = W.format == quant::Format::q4_0;
#if defined(EDL_QUANT_ZMM)
  // Row n in lane n: q4_0's codes as they are (unsigned 0..15), q8_0's flipped to w + 128, both
  // against the signed activations; the sum of x times 8 or 128 starts each block's sum.
  // Two named accumulator sets, the even and the odd blocks' chains, so that they stay in
  // registers.
  __m512 even[MR], odd[MR];
  for (int m = 0; m < MR; ++m) even[m] = odd[m] = _mm512_setzero_ps();
  const auto block = [&](std::int64_t b, __m512 (&acc)[MR]) {
    const std::uint8_t* c = codes + b * cb;
    detail::prefetch_lines(c + detail::kWeightPrefetchBytes, cb);
    __m512i w[8];
    if (four) {
      const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i raw = _mm512_loadu_si512(c + 64 * k);
        w[k] = _mm512_and_si512(raw, low4);
        w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
    } else {
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) w[k] = _mm512_xor_si512(_mm512_loadu_si512(c + 64 * k), flip);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 16 * b)));
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const ActivationBlock& xb = x[m * ldx + b];
      const auto* xd = reinterpret_cast<const std::int32_t*>(xb.qs);  // broadcast from memory, not through a register
      __m512i s = _mm512_set1_epi32(four ? xb.neg8_sum : xb.neg128_sum);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(xd[k]));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), acc[m]);
    }
  };
  std::int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block(b, even);
    block(b + 1, odd);
  }
  if (b < nb) block(b, even);
  for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out + 16 * m, _mm512_add_ps(even[m], odd[m]));
#elif defined(EDL_QUANT_AVX2)
  // Eight rows a vector, the group's two halves one after the other; a row's 32 products go
  // to its lane four at a time: unsigned codes (q4_0; q8_0's |w|, with w's sign on x) times x.
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
  const auto add4 = [&](__m256i s, __m256i u, __m256i v) {
#if defined(EDL_QUANT_VNNI)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(s, u, v);
#else
    return _mm256_dpbusd_avx_epi32(s, u, v);
#endif
#else
    return _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), ones));
#endif
  };
  for (int h = 0; h < 2; ++h) {
    for (int m = 0; m < MR; ++m) {
      const ActivationBlock* xm = x + m * ldx;
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::uint8_t* c = codes + b * cb + 32 * h;
        if (m == 0 && h == 0) detail::prefetch_lines(c + detail::kWeightPrefetchBytes, cb);
        std::int32_t xd[8];
        std::memcpy(xd, xm[b].qs, 32);
        __m256i s;
        if (four) {
          s = _mm256_set1_epi32(xm[b].neg8_sum);
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * k));
            s = add4(s, _mm256_and_si256(raw, low4), _mm256_set1_epi32(xd[k]));
            s = add4(s, _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), _mm256_set1_epi32(xd[k + 4]));
          }
        } else {
          s = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int k = 0; k < 8; ++k) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * k));
            s = add4(s, _mm256_sign_epi8(w, w), _mm256_sign_epi8(_mm256_set1_epi32(xd[k]), w));
          }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * b + 8 * h)));
        acc[b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xm[b].d)), acc[b & 1]);
      }
      _mm256_storeu_ps(out + 16 * m + 8 * h, _mm256_add_ps(acc[0], acc[1]));
    }
  }
#else
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < 16; ++n) {
      float acc[2] = {0.f, 0.f};
      for (std::int64_t b = 0; b < nb; ++b) {
        const ActivationBlock& xb = x[m * ldx + b];
        std::int32_t s = 0;
        for (int e = 0; e < 32; ++e) s += detail::group_value(W.format, codes + b * cb, n, e) * xb.qs[e];
        const float d = f16::from_bits(scales[16 * b + n]).to_float() * xb.d;
        acc[b & 1] = std::fma(static_cast<float>(s), d, acc[b & 1]);
      }
      out[16 * m + n] = acc[0] + acc[1];
    }
  (void)four;
#endif
}

/// Lanes of the nf4 dot product in this build (reference::dot_nf4<kNF4Lanes> is its definition).
inline constexpr int kNF4Lanes =
#if defined(__AVX512F__) && defined(EDL_QUANT_AVX2)
    16;
#else
    8;
#endif

/// nf4 weights (nb blocks of 64 codes, their absmax) . f32 activations.
inline float dot_nf4(const quant::BlockNF4* w, const float* absmax, const float* x, std::int64_t nb) noexcept {
#if defined(__AVX512F__) && defined(EDL_QUANT_AVX2)
  const __m512 table = _mm512_loadu_ps(quant::kNF4Levels.data());
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512 acc = _mm512_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b, x += 64) {
    __m512 p = _mm512_setzero_ps();
    for (int t = 0; t < 2; ++t) {
      const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs + 16 * t)));
      const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
      const __m512 lo = _mm512_permutexvar_ps(_mm512_and_si512(q, _mm512_set1_epi32(15)), table);
      const __m512 x0 = _mm512_loadu_ps(x + 32 * t), x1 = _mm512_loadu_ps(x + 32 * t + 16);
      // x[2 * byte] and x[2 * byte + 1] for the 16 bytes of this step.
      const __m512 xe = _mm512_permutex2var_ps(x0, even, x1), xo = _mm512_permutex2var_ps(x0, odd, x1);
      p = _mm512_fmadd_ps(hi, xe, p);
      p = _mm512_fmadd_ps(lo, xo, p);
    }
    acc = _mm512_fmadd_ps(p, _mm512_set1_ps(absmax[b]), acc);
  }
  return detail::sum_lanes16(acc);
#elif defined(EDL_QUANT_AVX2)
  const __m256 t_lo = _mm256_loadu_ps(quant::kNF4Levels.data()), t_hi = _mm256_loadu_ps(quant::kNF4Levels.data() + 8);
  const auto lookup = [&](__m256i c) {  // table[c] for c in 0..15: bit 3 picks the half
    const __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t_lo, c), _mm256_permutevar8x32_ps(t_hi, c), sel);
  };
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b, x += 64) {
    __m256 p = _mm256_setzero_ps();
    for (int t = 0; t < 4; ++t) {
      std::int64_t raw;
      std::memcpy(&raw, w[b].qs + 8 * t, 8);
      const __m256i q = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(raw));
      const __m256 hi = lookup(_mm256_srli_epi32(q, 4)), lo = lookup(_mm256_and_si256(q, _mm256_set1_epi32(15)));
      const __m256 x0 = _mm256_loadu_ps(x + 16 * t), x1 = _mm256_loadu_ps(x + 16 * t + 8);
      // x[2 * byte]: lanes 0-3 from x0's even elements, 4-7 from x1's.
      const __m256 xe = _mm256_blend_ps(_mm256_permutevar8x32_ps(x0, even), _mm256_permutevar8x32_ps(x1, even), 0xF0);
      const __m256 xo = _mm256_blend_ps(_mm256_permutevar8x32_ps(x0, odd), _mm256_permutevar8x32_ps(x1, odd), 0xF0);
      p = _mm256_fmadd_ps(hi, xe, p);
      p = _mm256_fmadd_ps(lo, xo, p);
    }
    acc = _mm256_fmadd_ps(p, _mm256_set1_ps(absmax[b]), acc);
  }
  return detail::sum_lanes8(acc);
#else
  return reference::dot_nf4<8>(w, absmax, x, nb);
#endif
}

}  // namespace edl::kernels
