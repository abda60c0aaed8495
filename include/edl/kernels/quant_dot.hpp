// edl/kernels/quant_dot.hpp
// Dot products of quantized weight rows with an activation row, the inner loop of decode on
// quantized models (kernels/quant_matvec.hpp runs them over matrices).
//
//   kernels::quantize_activations(x, xa, K);             // x -> ActivationBlocks (q8_0 values)
//   float s = kernels::dot_q8_0(w_row, xa, K / 32);      // q8_0 weights . q8_0 activations
//   float s = kernels::dot_q4_0(w_row, xa, K / 32);      // q4_0 weights . q8_0 activations
//   float s = kernels::dot_nf4(codes, absmax, x, K / 64); // nf4 weights . f32 activations
//
// The int8 formats multiply integers, as llama.cpp does: each block of 32 gives eight lane
// sums (lane i sums the products of values 4i..4i+3) on whichever instruction the build
// targets (AVX-512 VNNI / AVX-VNNI vpdpbusd, AVX2 vpmaddubsw, scalar), the same integers on
// each; with 512-bit VNNI, q4_0 takes two blocks per vector. Each lane then accumulates
// s_i * (d_w * d_x) in f32 with one rounding, even blocks and
// odd blocks in two accumulators (two chains hide the FMA latency) added lane by lane, and the
// eight lanes are summed in the fixed tree ((0+4)+(2+6))+((1+5)+(3+7)). The scalar
// path is that definition written out (the naive twin the tests hold the SIMD paths to), so
// every path gives the same bits. The activations are a q8_0 row prepared once per product
// (ActivationBlock: the scale as f32, and -8 times each lane's sum, which lets q4_0 multiply
// its unsigned nibbles directly: sum (q - 8) x = sum q x - 8 sum x). nf4 dequantizes in registers (a 16-entry table lookup) and
// multiplies f32 activations.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <edl/core/dtype.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/quantize.hpp>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EDL_QUANT_AVX2 1
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define EDL_QUANT_VNNI 1
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define EDL_QUANT_ZMM 1  // 512-bit vpdpbusd: two blocks per vector
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

/// Lane i (0..7) sum of a block: products of values 4i..4i+3.
template <class W>
inline std::int32_t lane_sum(W&& w, const std::int8_t* x, int lane) noexcept {
  std::int32_t s = 0;
  for (int j = 4 * lane; j < 4 * lane + 4; ++j) s += w(j) * static_cast<std::int32_t>(x[j]);
  return s;
}
inline float sum_lanes8(const float* a) noexcept { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

/// The definition of dot_q8_0 / dot_q4_0, written out.
template <class Block>
inline float dot_int8(const Block* w, const quant::BlockQ8_0* x, std::int64_t nb) noexcept {
  float acc2[2][8] = {};
  for (std::int64_t b = 0; b < nb; ++b) {
    const float d = w[b].d.to_float() * x[b].d.to_float();
    for (int l = 0; l < 8; ++l) {
      std::int32_t s;
      if constexpr (sizeof(Block) == sizeof(quant::BlockQ8_0))
        s = lane_sum([&](int j) { return static_cast<std::int32_t>(w[b].qs[j]); }, x[b].qs, l);
      else
        s = lane_sum([&](int j) { return static_cast<std::int32_t>(quant::q4_0_value(w[b], j)); }, x[b].qs, l);
      acc2[b & 1][l] = std::fma(static_cast<float>(s), d, acc2[b & 1][l]);
    }
  }
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = acc2[0][l] + acc2[1][l];
  return sum_lanes8(acc);
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
struct alignas(32) ActivationBlock {
  std::int8_t qs[32];
  std::int32_t neg8_lane_sums[8];  // -8 * (qs[4l] + .. + qs[4l + 3])
  float d;                         // the block's f16 scale, widened
};

/// The ActivationBlock of a q8_0 block.
inline void prepare_activation(const quant::BlockQ8_0& in, ActivationBlock& out) noexcept {
  std::memcpy(out.qs, in.qs, 32);
  for (int l = 0; l < 8; ++l)
    out.neg8_lane_sums[l] = -8 * (in.qs[4 * l] + in.qs[4 * l + 1] + in.qs[4 * l + 2] + in.qs[4 * l + 3]);
  out.d = in.d.to_float();
}

#if defined(EDL_QUANT_AVX2)
namespace detail {
/// Eight lane sums of 32 int8 products (lane i: values 4i..4i+3), |w| <= 128, |x| <= 127.
inline __m256i dot_i8_lanes(__m256i w, __m256i x) noexcept {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
#if defined(EDL_QUANT_VNNI)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
#else
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aw, sx);
#endif
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
#endif
}
/// ((0+4)+(2+6))+((1+5)+(3+7)), reference::sum_lanes8's tree.
inline float sum_lanes8(__m256 v) noexcept {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
/// The two-chain sum of the dots: step(b, acc) adds block b's term to acc; even blocks go to
/// one accumulator, odd to the other (named, so they stay in registers), then lane-wise added
/// and summed in sum_lanes8's tree.
template <class Step>
inline float two_chains(std::int64_t nb, Step&& step) noexcept {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  std::int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    a0 = step(b, a0);
    a1 = step(b + 1, a1);
  }
  if (b < nb) a0 = step(b, a0);
  return sum_lanes8(_mm256_add_ps(a0, a1));
}
/// A q4_0 block's 32 codes q (0..15, unsigned) in value order: low nibbles then high nibbles.
inline __m256i unpack_q4_0(const std::uint8_t* qs) noexcept {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}
/// c + the eight lane sums of unsigned q (0..15) times signed x.
inline __m256i dot_u4_lanes(__m256i c, __m256i q, __m256i x) noexcept {
#if defined(EDL_QUANT_VNNI)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(c, q, x);
#else
  return _mm256_dpbusd_avx_epi32(c, q, x);
#endif
#else
  return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1)));
#endif
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
#if defined(EDL_QUANT_ZMM)
/// A 512-bit vector from two 256-bit halves (block b low, b + 1 high), or of two scales
/// broadcast over eight lanes each.
inline __m512i two_halves(__m256i lo, __m256i hi) noexcept { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512 two_halves(float lo, float hi) noexcept { return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1); }
#if defined(__AVX512VBMI__)
/// The byte permute that takes two adjacent q4_0 blocks (bytes 0-35: scale, 16 code bytes,
/// scale, 16 code bytes) to each block's code bytes twice: block b's in bytes 0-31, b + 1's in
/// 32-63 (the upper copy of each then shifts to the high nibbles).
inline __m512i q4_0_pair_code_bytes() noexcept {
  return _mm512_set_epi8(35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,  //
                         35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,  //
                         17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,          //
                         17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2);
}
#endif
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
    const __m256i s = detail::dot_i8_lanes(_mm256_set1_epi8(1), q);  // the lane sums, exact
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].neg8_lane_sums), _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, 3)));
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

/// q8_0 weights (nb blocks) . q8_0 activations.
inline float dot_q8_0(const quant::BlockQ8_0* w, const ActivationBlock* x, std::int64_t nb) noexcept {
#if defined(EDL_QUANT_AVX2)
  const auto step = [&](std::int64_t b, __m256 acc) {
    const __m256i s = detail::dot_i8_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs)),
                                           _mm256_load_si256(reinterpret_cast<const __m256i*>(x[b].qs)));
    const float d = detail::f16_to_f32(w[b].d) * x[b].d;
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
  };
  return detail::two_chains(nb, step);
#else
  float acc2[2][8] = {};
  for (std::int64_t b = 0; b < nb; ++b) {
    const float d = w[b].d.to_float() * x[b].d;
    for (int l = 0; l < 8; ++l) {
      const std::int32_t s = reference::lane_sum([&](int j) { return static_cast<std::int32_t>(w[b].qs[j]); }, x[b].qs, l);
      acc2[b & 1][l] = std::fma(static_cast<float>(s), d, acc2[b & 1][l]);
    }
  }
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = acc2[0][l] + acc2[1][l];
  return reference::sum_lanes8(acc);
#endif
}

#if defined(EDL_QUANT_ZMM)
/// An activation row's blocks b and b + 1 as the 512-bit q4_0 dot takes them: block b in lanes
/// 0-7, b + 1 in 8-15 (zero when absent). Made once for all the rows of a matrix-vector
/// product, it saves each row's pair the three lane inserts that put them side by side.
struct alignas(64) ActivationPair {
  __m512i qs, neg8_lane_sums;
  __m512 d;
};

/// The nb blocks of x as (nb + 1) / 2 pairs.
inline void pair_activations(const ActivationBlock* x, std::int64_t nb, ActivationPair* out) noexcept {
  for (std::int64_t b = 0; b < nb; b += 2) {
    const bool second = b + 1 < nb;
    const auto both = [&](const auto member) {
      const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(x[b].*member));
      const __m256i hi = second ? _mm256_load_si256(reinterpret_cast<const __m256i*>(x[b + 1].*member)) : _mm256_setzero_si256();
      return detail::two_halves(lo, hi);
    };
    out[b / 2] = {both(&ActivationBlock::qs), both(&ActivationBlock::neg8_lane_sums),
                  detail::two_halves(x[b].d, second ? x[b + 1].d : 0.f)};
  }
}

namespace detail {
/// One pair (blocks b, b + 1 of the row ending at w_end) of the 512-bit q4_0 dot: acc + the
/// pair's lane sums times d_w * d_x. A block's 16 bytes go to both halves of its 256 bits, the
/// upper half shifted to the high nibbles: values 0-15 then 16-31, as the activations lie.
inline __m512 q4_0_pair(const quant::BlockQ4_0* wb, const quant::BlockQ4_0* w_end, bool second, const ActivationPair& x,
                        __m512 acc) noexcept {
  __m512i q;
  __m512 dw;  // block b's f16 scale in lanes 0-7, b + 1's in 8-15 (an absent block's 0)
#if defined(__AVX512VBMI__)
  // Both blocks' 36 bytes in one load (a plain one while 64 bytes stay inside the row, which
  // decode streams faster than masked loads), one byte permute for the codes, one word
  // permute for the scales.
  const __m512i raw = wb + 4 <= w_end ? _mm512_loadu_si512(wb) : _mm512_maskz_loadu_epi8(second ? 0xFFFFFFFFFull : 0x3FFFFull, wb);
  q = _mm512_permutexvar_epi8(q4_0_pair_code_bytes(), raw);
  const __m256i scale_words = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9);
  dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_castsi256_si512(scale_words), raw)));
#else
  (void)w_end;
  const __m256i q0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[0].qs)));
  const __m256i q1 =
      second ? _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[1].qs))) : _mm256_setzero_si256();
  q = two_halves(q0, q1);
  dw = two_halves(f16_to_f32(wb[0].d), second ? f16_to_f32(wb[1].d) : 0.f);
#endif
  const __m512 d = _mm512_mul_ps(dw, x.d);  // d_w * d_x, the definition's f32 product
  q = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFF00FF00u, q, 4), _mm512_set1_epi8(0x0F));
  const __m512i s = _mm512_dpbusd_epi32(x.neg8_lane_sums, q, x.qs);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc);
}
}  // namespace detail

/// q4_0 weights (nb blocks) . activations already paired (pair_activations): dot_q4_0's bits.
inline float dot_q4_0(const quant::BlockQ4_0* w, const ActivationPair* x, std::int64_t nb) noexcept {
  __m512 acc = _mm512_setzero_ps();
  for (std::int64_t b = 0; b < nb; b += 2) acc = detail::q4_0_pair(w + b, w + nb, b + 1 < nb, x[b / 2], acc);
  return detail::sum_lanes16(acc);
}
#endif

/// q4_0 weights (nb blocks) . q8_0 activations.
inline float dot_q4_0(const quant::BlockQ4_0* w, const ActivationBlock* x, std::int64_t nb) noexcept {
#if defined(EDL_QUANT_ZMM)
  // Blocks b (lanes 0-7) and b + 1 (lanes 8-15) per vector: one accumulator holds the
  // definition's even and odd chains side by side. An odd last block leaves lanes 8-15 zero,
  // which adds +0.0 to the odd chain.
  __m512 acc = _mm512_setzero_ps();
  for (std::int64_t b = 0; b < nb; b += 2) {
    ActivationPair xp;
    pair_activations(x + b, std::min<std::int64_t>(2, nb - b), &xp);
    acc = detail::q4_0_pair(w + b, w + nb, b + 1 < nb, xp, acc);
  }
  return detail::sum_lanes16(acc);
#elif defined(EDL_QUANT_AVX2)
  const auto step = [&](std::int64_t b, __m256 acc) {
    const __m256i s = detail::dot_u4_lanes(_mm256_load_si256(reinterpret_cast<const __m256i*>(x[b].neg8_lane_sums)),
                                           detail::unpack_q4_0(w[b].qs),
                                           _mm256_load_si256(reinterpret_cast<const __m256i*>(x[b].qs)));
    const float d = detail::f16_to_f32(w[b].d) * x[b].d;
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
  };
  return detail::two_chains(nb, step);
#else
  float acc2[2][8] = {};
  for (std::int64_t b = 0; b < nb; ++b) {
    const float d = w[b].d.to_float() * x[b].d;
    for (int l = 0; l < 8; ++l) {
      const std::int32_t s =
          reference::lane_sum([&](int j) { return static_cast<std::int32_t>(quant::q4_0_value(w[b], j)); }, x[b].qs, l);
      acc2[b & 1][l] = std::fma(static_cast<float>(s), d, acc2[b & 1][l]);
    }
  }
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = acc2[0][l] + acc2[1][l];
  return reference::sum_lanes8(acc);
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
