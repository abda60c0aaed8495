// edl/kernels/detail/fma.hpp
// Fused multiply-add on xsimd batches that is fused on every instruction set.
//
// xsimd 8.1 (Debian 12) has FMA kernels for SSE/AVX/AVX2 with FMA3, but none for AVX-512: there
// xsimd::fma falls back to `x * y + z`, two roundings, which the compiler may or may not
// contract into one instruction at each call site. That breaks two promises: axpy and the dot
// products round once, and every element of a GEMM tile is computed with the same arithmetic
// wherever the tile lies (the bit-reproducibility across thread counts). So every kernel calls
// these instead of xsimd::fma / fms / fnma.
#pragma once

#include <type_traits>

#include <xsimd/xsimd.hpp>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace edl::kernels::detail {

template <class A>
inline constexpr bool is_avx512 =
#if defined(__AVX512F__)
    std::is_base_of_v<xsimd::avx512f, A>;
#else
    false;
#endif

/// x * y + z, rounded once.
template <class T, class A>
inline xsimd::batch<T, A> fmadd(const xsimd::batch<T, A>& x, const xsimd::batch<T, A>& y,
                                const xsimd::batch<T, A>& z) noexcept {
#if defined(__AVX512F__)
  if constexpr (is_avx512<A> && std::is_same_v<T, float>) return _mm512_fmadd_ps(x, y, z);
  else if constexpr (is_avx512<A> && std::is_same_v<T, double>) return _mm512_fmadd_pd(x, y, z);
  else
#endif
    return xsimd::fma(x, y, z);  // FMA3 kernels on SSE/AVX/AVX2: one rounding
}

/// x * y - z, rounded once.
template <class T, class A>
inline xsimd::batch<T, A> fmsub(const xsimd::batch<T, A>& x, const xsimd::batch<T, A>& y,
                                const xsimd::batch<T, A>& z) noexcept {
#if defined(__AVX512F__)
  if constexpr (is_avx512<A> && std::is_same_v<T, float>) return _mm512_fmsub_ps(x, y, z);
  else if constexpr (is_avx512<A> && std::is_same_v<T, double>) return _mm512_fmsub_pd(x, y, z);
  else
#endif
    return xsimd::fms(x, y, z);
}

/// z - x * y, rounded once.
template <class T, class A>
inline xsimd::batch<T, A> fnmadd(const xsimd::batch<T, A>& x, const xsimd::batch<T, A>& y,
                                 const xsimd::batch<T, A>& z) noexcept {
#if defined(__AVX512F__)
  if constexpr (is_avx512<A> && std::is_same_v<T, float>) return _mm512_fnmadd_ps(x, y, z);
  else if constexpr (is_avx512<A> && std::is_same_v<T, double>) return _mm512_fnmadd_pd(x, y, z);
  else
#endif
    return xsimd::fnma(x, y, z);
}

}  // namespace edl::kernels::detail
