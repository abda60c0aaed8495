// edl/kernels/detail/simd.hpp
// Shared building blocks of the elementwise and reduction kernels (softmax.hpp, rms_norm.hpp,
// activations.hpp, elementwise.hpp):
//  - `fbatch`, the widest xsimd float batch of the build (8 lanes with AVX2, 16 with AVX-512);
//  - a vectorized exp (Cephes-style, about 1 ulp, exact 0 below -86.64, +Inf above
//    ln(FLT_MAX), NaN kept), so softmax does not depend on xsimd's generic exp;
//  - horizontal sum and max in a fixed lane order;
//  - loads of f32 / bf16 / f16 rows widened to f32 and stores rounded back (RNE), plus
//    partial loads and stores for the tail of a row: a tail is padded to a full batch and
//    goes through the same lane-wise code as the body, so an element's result never depends
//    on its position in the row;
//  - argument checks shared by every kernel;
//  - the fixed chunking rule of deterministic reductions.
//
// Determinism: every kernel computes each output element (or each row) with one fixed
// sequence of operations that depends only on the sizes, never on the thread count or on
// how edl::exec::parallel_for splits the range. Reductions over more than one row or over
// long flat arrays are split into chunks of a FIXED size (kReduceChunk elements,
// kRowChunk rows), reduced chunk by chunk, and the chunk partials are combined in index
// order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/fma.hpp>

#if defined(__AVX2__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace edl::kernels::detail {

using fbatch = xsimd::batch<float>;
using ibatch = xsimd::batch<std::int32_t>;
inline constexpr std::ptrdiff_t kLanes = static_cast<std::ptrdiff_t>(fbatch::size);

/// Elements per chunk of a flat deterministic reduction (dot, sum_squares). Fixed: changing
/// it changes results in the last bits, never the thread count.
inline constexpr std::ptrdiff_t kReduceChunk = 8192;
/// Rows per chunk of a reduction over rows (rms_norm_backward's dweight).
inline constexpr std::ptrdiff_t kRowChunk = 32;
/// Work (elements) below which a kernel runs on the calling thread.
inline constexpr std::ptrdiff_t kParallelWork = 1 << 15;

/// Rows per parallel_for grain so that one task touches about kParallelWork elements.
inline std::ptrdiff_t row_grain(std::ptrdiff_t cols) noexcept {
  return std::max<std::ptrdiff_t>(1, kParallelWork / std::max<std::ptrdiff_t>(cols, 1));
}

// ------------------------------------------------------------------------------ checks

inline std::string kname(const char* kernel) { return std::string("kernels.") + kernel; }

/// A size argument must be >= 0.
inline void check_size(std::ptrdiff_t v, const char* kernel, const char* name) {
  EDL_CHECK(v >= 0, errc::invalid_argument, kname(kernel), name, " = ", v, ", expected >= 0");
}

/// A pointer argument may be null only when it addresses no element.
inline void check_ptr(const void* p, std::ptrdiff_t n, const char* kernel, const char* name) {
  EDL_CHECK(p != nullptr || n == 0, errc::invalid_argument, kname(kernel), name, " is null, expected ", n,
            " elements");
}

/// rows * cols, checking both are >= 0 and the product fits.
inline std::ptrdiff_t checked_area(std::ptrdiff_t rows, std::ptrdiff_t cols, const char* kernel) {
  check_size(rows, kernel, "rows");
  check_size(cols, kernel, "cols");
  EDL_CHECK(cols == 0 || rows <= std::numeric_limits<std::ptrdiff_t>::max() / cols, errc::invalid_argument,
            kname(kernel), "rows * cols = ", rows, " * ", cols, " overflows");
  return rows * cols;
}

// ------------------------------------------------------------------------------ loads / stores

/// Loads kLanes elements widened to f32.
inline fbatch load(const float* p) noexcept { return fbatch::load_unaligned(p); }

// The intrinsic paths below are chosen by the preprocessor, not `if constexpr`: these are not
// templates, so a discarded branch would still have to compile for the other register width.
// xsimd's default batch follows the widest instruction set the build enables, so
// __AVX512F__ means 16 lanes and __AVX2__ (without it) 8.
#if defined(__AVX512F__)
#define EDL_SIMD_AVX512 1
#elif defined(__AVX2__)
#define EDL_SIMD_AVX2 1
#endif

inline fbatch load(const bf16* p) noexcept {
#if defined(EDL_SIMD_AVX512)
  if constexpr (kLanes == 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return fbatch(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
#elif defined(EDL_SIMD_AVX2)
  if constexpr (kLanes == 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return fbatch(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
#endif
  alignas(64) float buf[kLanes];
  for (std::ptrdiff_t i = 0; i < kLanes; ++i) buf[i] = p[i].to_float();
  return fbatch::load_aligned(buf);
}

inline fbatch load(const f16* p) noexcept {
#if defined(EDL_SIMD_AVX512)
  if constexpr (kLanes == 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m512 f = _mm512_cvtph_ps(h);
    // As below: keep a signalling NaN's payload bit for bit, like f16::to_float.
    const __m512i h32 = _mm512_cvtepu16_epi32(h);
    const __mmask16 is_nan =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(h32, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7c00));
    const __m512i nan_bits = _mm512_or_si512(
        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(h32, _mm512_set1_epi32(0x8000)), 16),
                        _mm512_set1_epi32(0x7f800000)),
        _mm512_slli_epi32(_mm512_and_si512(h32, _mm512_set1_epi32(0x3ff)), 13));
    return fbatch(_mm512_mask_blend_ps(is_nan, f, _mm512_castsi512_ps(nan_bits)));
  }
#elif defined(__F16C__) && defined(EDL_SIMD_AVX2)
  if constexpr (kLanes == 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256 f = _mm256_cvtph_ps(h);
#if defined(__AVX2__)
    // F16C quiets signalling NaNs; edl's f16::to_float keeps the payload bit for bit.
    const __m256i h32 = _mm256_cvtepu16_epi32(h);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x7fff)),
                                              _mm256_set1_epi32(0x7c00));
    const __m256i nan_bits = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x8000)), 16),
                        _mm256_set1_epi32(0x7f800000)),
        _mm256_slli_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x3ff)), 13));
    return fbatch(_mm256_blendv_ps(f, _mm256_castsi256_ps(nan_bits), _mm256_castsi256_ps(is_nan)));
#else
    return fbatch(f);
#endif
  }
#endif
  alignas(64) float buf[kLanes];
  for (std::ptrdiff_t i = 0; i < kLanes; ++i) buf[i] = p[i].to_float();
  return fbatch::load_aligned(buf);
}

/// int8 (the int8 KV cache's values) widened exactly to f32.
inline fbatch load(const std::int8_t* p) noexcept {
#if defined(EDL_SIMD_AVX512)
  if constexpr (kLanes == 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return fbatch(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
  }
#elif defined(EDL_SIMD_AVX2)
  if constexpr (kLanes == 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return fbatch(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
  }
#endif
  alignas(64) float buf[kLanes];
  for (std::ptrdiff_t i = 0; i < kLanes; ++i) buf[i] = static_cast<float>(p[i]);
  return fbatch::load_aligned(buf);
}

/// Stores kLanes elements, rounding to nearest even for bf16/f16 (bit-identical to
/// edl::from_f32, NaN and Inf included).
inline void store(float* p, const fbatch& v) noexcept { v.store_unaligned(p); }

inline void store(bf16* p, const fbatch& v) noexcept {
#if defined(EDL_SIMD_AVX512)
  if constexpr (kLanes == 16) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
    const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
    return;
  }
#elif defined(EDL_SIMD_AVX2)
  if constexpr (kLanes == 8) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
    return;
  }
#endif
  alignas(64) float buf[kLanes];
  v.store_aligned(buf);
  for (std::ptrdiff_t i = 0; i < kLanes; ++i) p[i] = bf16(buf[i]);
}

inline void store(f16* p, const fbatch& v) noexcept {
  // F16C's conversion ignores DAZ/FTZ for f16 subnormals but its NaN payload rule and
  // subnormal handling are checked against f16::from_float in the tests; the scalar path
  // is the definition.
#if defined(EDL_SIMD_AVX512)
  if constexpr (kLanes == 16) {
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    return;
  }
#elif defined(__F16C__) && defined(EDL_SIMD_AVX2)
  if constexpr (kLanes == 8) {
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    return;
  }
#endif
  alignas(64) float buf[kLanes];
  v.store_aligned(buf);
  for (std::ptrdiff_t i = 0; i < kLanes; ++i) p[i] = f16(buf[i]);
}

/// Loads the first n < kLanes elements; the other lanes hold `fill`.
template <class T>
inline fbatch load_partial(const T* p, std::ptrdiff_t n, float fill) noexcept {
  alignas(64) float buf[kLanes];
  for (std::ptrdiff_t i = 0; i < kLanes; ++i) buf[i] = i < n ? to_f32(p[i]) : fill;
  return fbatch::load_aligned(buf);
}

/// Stores the first n < kLanes lanes (rounded like store()).
template <class T>
inline void store_partial(T* p, const fbatch& v, std::ptrdiff_t n) noexcept {
  alignas(64) float buf[kLanes];
  v.store_aligned(buf);
  for (std::ptrdiff_t i = 0; i < n; ++i) p[i] = from_f32<T>(buf[i]);
}

// ------------------------------------------------------------------------------ reductions

/// Sum of the lanes, in lane order (0 + 1 + 2 + ...): the same on every call.
inline float hsum(const fbatch& v) noexcept {
  alignas(64) float buf[kLanes];
  v.store_aligned(buf);
  // Pairwise in a fixed tree for accuracy; the tree depends only on kLanes.
  for (std::ptrdiff_t w = kLanes / 2; w >= 1; w /= 2)
    for (std::ptrdiff_t i = 0; i < w; ++i) buf[i] += buf[i + w];
  return buf[0];
}

/// Row sums of kLanes batches: lane r of the result is the sum of rows[r]'s lanes, in a fixed
/// tree (the same on every call). xsimd::haddp does this on SSE/AVX, but xsimd 8.1's AVX-512
/// version returns rows 2-5 and 10-13 in the wrong lanes, so AVX-512 builds use this
/// transposing reduction: pairs of rows (unpack lo/hi), then quads (64-bit unpacks), then the
/// four 128-bit lanes (two shuffles of 128-bit lanes).
inline fbatch haddp(const fbatch* rows) noexcept {
#if defined(EDL_SIMD_AVX512)
  if constexpr (kLanes == 16) {
    __m512 x[8];
    for (int i = 0; i < 8; ++i)
      x[i] = _mm512_add_ps(_mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]),
                           _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]));
    __m512 y[4];
    for (int k = 0; k < 4; ++k) {
      const __m512d a = _mm512_castps_pd(x[2 * k]), b = _mm512_castps_pd(x[2 * k + 1]);
      y[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    // y[k]'s 128-bit lane L holds rows 4k..4k+3 summed over that lane's 4 elements.
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return fbatch(_mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1))));
  }
#endif
  return xsimd::haddp(rows);
}

/// out[i] = the sum of rows[i]'s lanes for i in [0, 8): eight rows reduced in registers, each
/// in a fixed tree that depends only on the lane count (not on the other rows). With AVX-512
/// haddp would reduce sixteen rows, half of them zeros for eight, through the stack; here each
/// row folds to 8 lanes (the 256-bit halves added), then three rounds of hadd and one of the
/// 128-bit halves. The decode kernel's eight streams end a row with this (generate/decoder.hpp).
inline void hsum8(const fbatch* rows, float* out) noexcept {
#if defined(EDL_SIMD_AVX512)
  if constexpr (kLanes == 16) {
    const auto fold = [](const fbatch& v) {
      const __m512 z = v;
      return _mm256_add_ps(_mm512_castps512_ps256(z), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)));
    };
    const __m256 x0 = _mm256_hadd_ps(fold(rows[0]), fold(rows[1])), x1 = _mm256_hadd_ps(fold(rows[2]), fold(rows[3]));
    const __m256 x2 = _mm256_hadd_ps(fold(rows[4]), fold(rows[5])), x3 = _mm256_hadd_ps(fold(rows[6]), fold(rows[7]));
    const __m256 y0 = _mm256_hadd_ps(x0, x1), y1 = _mm256_hadd_ps(x2, x3);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(y0, y1, 0x20), _mm256_permute2f128_ps(y0, y1, 0x31)));
    return;
  }
#endif
  if constexpr (kLanes == 8) {
    haddp(rows).store_unaligned(out);
  } else if constexpr (kLanes == 4) {
    haddp(rows).store_unaligned(out);
    haddp(rows + 4).store_unaligned(out + 4);
  } else {
    for (int i = 0; i < 8; ++i) out[i] = hsum(rows[i]);
  }
}

/// Largest lane, compared in lane order.
inline float hmax(const fbatch& v) noexcept {
  alignas(64) float buf[kLanes];
  v.store_aligned(buf);
  float m = buf[0];
  for (std::ptrdiff_t i = 1; i < kLanes; ++i) m = buf[i] > m ? buf[i] : m;
  return m;
}

// ------------------------------------------------------------------------------ math

/// exp(x) lane-wise. Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, degree-7
/// polynomial (Cephes expf), scaling by 2^n built from the exponent bits. Max error about
/// 1 ulp on [-86.6, 88.7]; returns exactly 0 for x < -86.64 (~ln 2^-125: masked -Inf logits
/// give 0, never a denormal), +Inf for x > ln(FLT_MAX), NaN for NaN.
inline fbatch exp(const fbatch& x) noexcept {
  const fbatch log2e(1.44269504088896341f);
  const fbatch ln2_hi(0.693359375f);
  const fbatch ln2_lo(-2.12194440e-4f);
  const fbatch hi(88.72283905206835f);
  const fbatch lo(-86.64f);

  const fbatch n = xsimd::nearbyint(x * log2e);
  fbatch r = kernels::detail::fnmadd(n, ln2_hi, x);  // x - n*ln2_hi
  r = kernels::detail::fnmadd(n, ln2_lo, r);         // - n*ln2_lo
  fbatch p(1.9875691500e-4f);
  p = kernels::detail::fmadd(p, r, fbatch(1.3981999507e-3f));
  p = kernels::detail::fmadd(p, r, fbatch(8.3334519073e-3f));
  p = kernels::detail::fmadd(p, r, fbatch(4.1665795894e-2f));
  p = kernels::detail::fmadd(p, r, fbatch(1.6666665459e-1f));
  p = kernels::detail::fmadd(p, r, fbatch(5.0000001201e-1f));
  p = kernels::detail::fmadd(p * r, r, r) + fbatch(1.0f);
  // y = (2p) * 2^(n-1): for lo <= x <= hi, n is in [-125, 128] so n - 1 + 127 is a valid
  // normal exponent field (n = 128 happens just below ln(FLT_MAX)). Lanes outside that range
  // hold garbage here and are replaced by the selects; NaN lanes stay NaN through r.
  const ibatch e = (xsimd::batch_cast<std::int32_t>(n) + ibatch(126)) << 23;
  fbatch y = (p + p) * xsimd::bitwise_cast<fbatch>(e);
  y = xsimd::select(x > hi, fbatch(std::numeric_limits<float>::infinity()), y);
  y = xsimd::select(x < lo, fbatch(0.0f), y);
  return y;
}

/// exp of one float through the vector path (for scalar spots that must agree with it).
inline float exp1(float x) noexcept {
  alignas(64) float buf[kLanes];
  detail::exp(fbatch(x)).store_aligned(buf);
  return buf[0];
}

/// 1 / (1 + exp(-x)) lane-wise: 0 for x -> -Inf, 1 for x -> +Inf; accurate to a few ulp
/// relative everywhere (no cancellation).
inline fbatch sigmoid(const fbatch& x) noexcept { return fbatch(1.0f) / (fbatch(1.0f) + detail::exp(-x)); }

/// s = sigmoid(x) and 1 - s, both with small relative error (1 - s = exp(-x) * s, with x
/// clamped at -80 so exp(-x) stays finite; s and 1 - s are exact 0/1 beyond that).
inline void sigmoid_pair(const fbatch& x, fbatch& s, fbatch& one_minus_s) noexcept {
  const fbatch e = detail::exp(-xsimd::max(x, fbatch(-80.0f)));
  s = fbatch(1.0f) / (fbatch(1.0f) + e);
  one_minus_s = e * s;
}

// ------------------------------------------------------------------------------ loops

inline void row_fill(float* y, std::ptrdiff_t n, float v) noexcept {
  for (std::ptrdiff_t j = 0; j < n; ++j) y[j] = v;
}

/// Runs f(i) over [0, n) on chunks of fixed size kReduceChunk (deterministic layout), in
/// parallel when n is large. f must only touch element range [i*chunk, ...).
template <class F>
inline void for_chunks(std::ptrdiff_t n, F&& f) {
  if (n <= 0) return;
  const std::ptrdiff_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  const std::ptrdiff_t grain = std::max<std::ptrdiff_t>(1, kParallelWork / kReduceChunk);
  exec::parallel_for(0, chunks, grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::ptrdiff_t c = lo; c < hi; ++c) {
      const std::ptrdiff_t b = c * kReduceChunk;
      f(c, b, std::min(n, b + kReduceChunk));
    }
  });
}

/// Lane-wise map over a flat range [lo, hi): out[i] = op(in...[i]) for any number of input
/// arrays (f32/bf16/f16) and one output array. The tail is padded with `fill`.
template <class Out, class Op, class... In>
inline void map_range(std::ptrdiff_t lo, std::ptrdiff_t hi, Op&& op, Out* out, const In*... in) noexcept {
  std::ptrdiff_t i = lo;
  for (; i + kLanes <= hi; i += kLanes) store(out + i, op(load(in + i)...));
  if (i < hi) store_partial(out + i, op(load_partial(in + i, hi - i, 0.0f)...), hi - i);
}

/// Parallel lane-wise map over [0, n).
template <class Out, class Op, class... In>
inline void map(std::ptrdiff_t n, Op&& op, Out* out, const In*... in) {
  if (n <= 0) return;
  exec::parallel_for(0, n, kParallelWork, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    map_range(lo, hi, op, out, in...);
  });
}

}  // namespace edl::kernels::detail
