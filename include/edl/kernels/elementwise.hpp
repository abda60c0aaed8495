// edl/kernels/elementwise.hpp
// Flat elementwise kernels and deterministic reductions over n contiguous elements.
//
// Lane-wise kernels (add, add_inplace, axpy, scale, mul, fill, convert, round_to) take f32, bf16 or
// f16 storage where marked, compute in f32 and round once (RNE, bit-identical to
// edl::from_f32). Outputs may alias inputs of the same type.
//
// Reductions (dot, sum_squares) accumulate in f32 over fixed chunks of
// detail::kReduceChunk elements (4 vector accumulators per chunk), then add the chunk
// partials in chunk order (in double, then rounded to f32). The chunking never depends on
// the thread count, so results are bit-identical with 1 or N threads.
//
// The fused cross-entropy lives in softmax.hpp (cross_entropy_rows).
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/simd.hpp>

namespace edl::kernels {

namespace detail {

inline void check_flat(std::ptrdiff_t n, const char* k) { check_size(n, k, "n"); }

/// Deterministic chunked reduction: chunk_fn(lo, hi) -> float partial of [lo, hi).
template <class ChunkFn>
inline float chunked_reduce(std::ptrdiff_t n, ChunkFn&& chunk_fn) {
  if (n <= 0) return 0.0f;
  if (n <= kReduceChunk) return static_cast<float>(static_cast<double>(chunk_fn(std::ptrdiff_t{0}, n)));
  const std::ptrdiff_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  std::vector<float> partial(static_cast<std::size_t>(chunks));
  for_chunks(n, [&](std::ptrdiff_t c, std::ptrdiff_t lo, std::ptrdiff_t hi) { partial[c] = chunk_fn(lo, hi); });
  double total = 0.0;
  for (float p : partial) total += p;
  return static_cast<float>(total);
}

/// f32 sum of f(load(a + j)...) over [lo, hi), 4 accumulators, fixed layout.
template <class F, class... In>
inline float chunk_sum(std::ptrdiff_t lo, std::ptrdiff_t hi, F&& f, const In*... in) noexcept {
  fbatch s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
  std::ptrdiff_t j = lo;
  for (; j + 4 * kLanes <= hi; j += 4 * kLanes) {
    s0 = f(s0, load(in + j)...);
    s1 = f(s1, load(in + j + kLanes)...);
    s2 = f(s2, load(in + j + 2 * kLanes)...);
    s3 = f(s3, load(in + j + 3 * kLanes)...);
  }
  for (; j + kLanes <= hi; j += kLanes) s0 = f(s0, load(in + j)...);
  if (j < hi) s1 = f(s1, load_partial(in + j, hi - j, 0.0f)...);
  return hsum((s0 + s1) + (s2 + s3));
}

}  // namespace detail

/// out = a + b.
template <FloatStorage T>
inline void add(const T* a, const T* b, T* out, std::ptrdiff_t n) {
  detail::check_flat(n, "add");
  detail::check_ptr(a, n, "add", "a");
  detail::check_ptr(b, n, "add", "b");
  detail::check_ptr(out, n, "add", "out");
  detail::map(n, [](const detail::fbatch& x, const detail::fbatch& y) { return x + y; }, out, a, b);
}

/// y += x.
template <FloatStorage T>
inline void add_inplace(T* y, const T* x, std::ptrdiff_t n) {
  detail::check_flat(n, "add_inplace");
  detail::check_ptr(y, n, "add_inplace", "y");
  detail::check_ptr(x, n, "add_inplace", "x");
  detail::map(n, [](const detail::fbatch& u, const detail::fbatch& v) { return u + v; }, y, static_cast<const T*>(y), x);
}

/// y += a * x (one fused multiply-add per element).
inline void axpy(float a, const float* x, float* y, std::ptrdiff_t n) {
  detail::check_flat(n, "axpy");
  detail::check_ptr(x, n, "axpy", "x");
  detail::check_ptr(y, n, "axpy", "y");
  const detail::fbatch ab(a);
  detail::map(
      n, [&](const detail::fbatch& u, const detail::fbatch& v) { return kernels::detail::fmadd(ab, v, u); }, y,
      static_cast<const float*>(y), x);
}

/// x = x * a - b over [0, n) on the calling thread: for callers that are already inside their
/// own parallel loop (the loss's per-row gradient).
inline void mul_sub_inplace(float* x, std::ptrdiff_t n, float a, float b) noexcept {
  detail::map_range(0, n, [&](const detail::fbatch& e) { return e * detail::fbatch(a) - detail::fbatch(b); }, x,
                    static_cast<const float*>(x));
}

/// y[lo, hi) += x[lo, hi) on the calling thread: for callers that must not fork (a part of an
/// exec::PhasedRegion). The same bits as add_inplace.
inline void add_range(float* y, const float* x, std::int64_t lo, std::int64_t hi) noexcept {
  detail::map_range(lo, hi, [](const detail::fbatch& a, const detail::fbatch& b) { return a + b; }, y,
                    static_cast<const float*>(y), x);
}

/// y[lo, hi) += a * x[lo, hi) on the calling thread (a part of an exec::PhasedRegion); the
/// same bits as axpy.
inline void axpy_range(float a, const float* x, float* y, std::int64_t lo, std::int64_t hi) noexcept {
  const detail::fbatch ab(a);
  detail::map_range(
      lo, hi, [&](const detail::fbatch& u, const detail::fbatch& v) { return kernels::detail::fmadd(ab, v, u); }, y,
      static_cast<const float*>(y), x);
}

/// y *= a, in place.
template <FloatStorage T>
inline void scale(T* y, float a, std::ptrdiff_t n) {
  detail::check_flat(n, "scale");
  detail::check_ptr(y, n, "scale", "y");
  const detail::fbatch ab(a);
  detail::map(n, [&](const detail::fbatch& u) { return u * ab; }, y, static_cast<const T*>(y));
}

/// out = a * x.
template <FloatStorage T>
inline void scale(const T* x, float a, T* out, std::ptrdiff_t n) {
  detail::check_flat(n, "scale");
  detail::check_ptr(x, n, "scale", "x");
  detail::check_ptr(out, n, "scale", "out");
  const detail::fbatch ab(a);
  detail::map(n, [&](const detail::fbatch& u) { return u * ab; }, out, x);
}

/// out = a * b (elementwise).
template <FloatStorage T>
inline void mul(const T* a, const T* b, T* out, std::ptrdiff_t n) {
  detail::check_flat(n, "mul");
  detail::check_ptr(a, n, "mul", "a");
  detail::check_ptr(b, n, "mul", "b");
  detail::check_ptr(out, n, "mul", "out");
  detail::map(n, [](const detail::fbatch& x, const detail::fbatch& y) { return x * y; }, out, a, b);
}

/// y[i] = v (rounded once to T).
template <FloatStorage T>
inline void fill(T* y, float v, std::ptrdiff_t n) {
  detail::check_flat(n, "fill");
  detail::check_ptr(y, n, "fill", "y");
  const T t = from_f32<T>(v);
  exec::parallel_for(0, n, detail::kParallelWork, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::ptrdiff_t i = lo; i < hi; ++i) y[i] = t;
  });
}

/// sum_i a[i] * b[i]; f32 accumulation, deterministic (see the file comment).
inline float dot(const float* a, const float* b, std::ptrdiff_t n) {
  detail::check_flat(n, "dot");
  detail::check_ptr(a, n, "dot", "a");
  detail::check_ptr(b, n, "dot", "b");
  return detail::chunked_reduce(n, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    return detail::chunk_sum(
        lo, hi,
        [](const detail::fbatch& s, const detail::fbatch& x, const detail::fbatch& y) { return kernels::detail::fmadd(x, y, s); },
        a, b);
  });
}

/// sum_i x[i]^2 (for gradient norms); f32 accumulation, deterministic.
template <FloatStorage T>
inline float sum_squares(const T* x, std::ptrdiff_t n) {
  detail::check_flat(n, "sum_squares");
  detail::check_ptr(x, n, "sum_squares", "x");
  return detail::chunked_reduce(n, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    return detail::chunk_sum(
        lo, hi, [](const detail::fbatch& s, const detail::fbatch& v) { return kernels::detail::fmadd(v, v, s); }, x);
  });
}

/// dst[i] = from_f32<D>(to_f32(src[i])) for any of f32 / bf16 / f16: round to nearest even,
/// NaN stays NaN, Inf stays Inf, bit-identical to edl's scalar conversions.
template <FloatStorage S, FloatStorage D>
inline void convert(const S* src, D* dst, std::ptrdiff_t n) {
  detail::check_flat(n, "convert");
  detail::check_ptr(src, n, "convert", "src");
  detail::check_ptr(dst, n, "convert", "dst");
  detail::map(n, [](const detail::fbatch& v) { return v; }, dst, src);
}

/// x[i] = to_f32(from_f32<T>(x[i])) in place: f32 values rounded to T's precision (round to
/// nearest even, bit-identical to convert() there and back), kept in f32 storage. A model
/// whose activations are bf16 or f16 (Policy's Compute) rounds with it where a kernel's f32
/// result becomes an activation. T = float leaves x as it is.
template <FloatStorage T>
inline void round_to(float* x, std::ptrdiff_t n) {
  detail::check_flat(n, "round_to");
  detail::check_ptr(x, n, "round_to", "x");
  if constexpr (!std::is_same_v<T, float>) {
    detail::map(
        n,
        [](const detail::fbatch& v) {
          alignas(64) T narrow[detail::kLanes];
          detail::store(narrow, v);
          return detail::load(narrow);
        },
        x, static_cast<const float*>(x));
  }
}

}  // namespace edl::kernels
