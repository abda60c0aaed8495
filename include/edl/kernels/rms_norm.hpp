// edl/kernels/rms_norm.hpp
// RMSNorm as Hugging Face's LlamaRMSNorm, forward and backward, rows x cols row-major:
//   inv_rms[r] = 1 / sqrt(mean_j(x[r, j]^2) + eps)
//   y[r, j]    = weight[j] * (x[r, j] * inv_rms[r])
// Arithmetic is f32 whatever the storage type (x, y, weight may be f32, bf16 or f16 in the
// forward; the result is rounded once, RNE). HF rounds x * inv_rms to the storage dtype
// before multiplying by weight; edl keeps it in f32, which differs by at most one rounding.
//
// Backward (f32), with g = weight * dy:
//   dx[r, j]    = inv_rms[r] * g_j - x[r, j] * inv_rms[r]^3 / cols * sum_k(g_k * x[r, k])
//   dweight[j] += sum_r dy[r, j] * x[r, j] * inv_rms[r]
// dweight is reduced over fixed chunks of detail::kRowChunk rows (independent of the
// thread count) whose partial sums are combined in chunk order, so it is bit-identical for
// any number of threads.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/simd.hpp>

namespace edl::kernels {

namespace detail {

/// sum_j x_j^2 in f32 (fixed layout of 2 accumulators).
template <class T>
inline float row_sum_squares(const T* x, std::ptrdiff_t n) noexcept {
  fbatch s0(0.0f), s1(0.0f);
  std::ptrdiff_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    const fbatch a = load(x + j), b = load(x + j + kLanes);
    s0 = kernels::detail::fmadd(a, a, s0);
    s1 = kernels::detail::fmadd(b, b, s1);
  }
  for (; j + kLanes <= n; j += kLanes) {
    const fbatch a = load(x + j);
    s0 = kernels::detail::fmadd(a, a, s0);
  }
  if (j < n) {
    const fbatch a = load_partial(x + j, n - j, 0.0f);
    s1 = kernels::detail::fmadd(a, a, s1);
  }
  return hsum(s0 + s1);
}

}  // namespace detail

/// RMSNorm forward. x, y: rows x cols; weight: cols; inv_rms: rows (saved for backward, may
/// be null for inference). eps > 0 typical (Llama: 1e-5 or 1e-6). y may equal x.
/// y = (offset + weight) * x / rms: offset 0 for Llama, 1 for Gemma (weights stored around 0).
template <FloatStorage T, FloatStorage W>
inline void rms_norm_forward(const T* x, const W* weight, T* y, float* inv_rms, std::ptrdiff_t rows,
                             std::ptrdiff_t cols, float eps, float offset = 0.0f) {
  const char* k = "rms_norm_forward";
  const std::ptrdiff_t n = detail::checked_area(rows, cols, k);
  detail::check_ptr(x, n, k, "x");
  detail::check_ptr(weight, rows > 0 ? cols : 0, k, "weight");
  detail::check_ptr(y, n, k, "y");
  EDL_CHECK(eps >= 0.0f, errc::invalid_argument, detail::kname(k), "eps = ", eps, ", expected >= 0");
  exec::parallel_for(0, rows, detail::row_grain(cols), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::ptrdiff_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      const float ms = detail::row_sum_squares(xr, cols) / static_cast<float>(cols);
      const float ir = 1.0f / std::sqrt(ms + eps);
      if (inv_rms) inv_rms[r] = ir;
      const detail::fbatch irb(ir);
      if (offset == 0.0f)
        detail::map_range(
            0, cols, [&](const detail::fbatch& xv, const detail::fbatch& wv) { return wv * (xv * irb); }, y + r * cols,
            xr, weight);
      else  // Gemma: (offset + w), in f32 as HF's (1.0 + weight.float())
        detail::map_range(
            0, cols,
            [&](const detail::fbatch& xv, const detail::fbatch& wv) { return (wv + detail::fbatch(offset)) * (xv * irb); },
            y + r * cols, xr, weight);
    }
  });
}

/// RMSNorm backward. inv_rms comes from the forward. Writes dx (rows x cols; may equal dy)
/// and accumulates dweight += (cols; may be null to skip the weight gradient).
inline void rms_norm_backward(const float* x, const float* weight, const float* inv_rms, const float* dy, float* dx,
                              float* dweight, std::ptrdiff_t rows, std::ptrdiff_t cols) {
  using detail::fbatch;
  const char* k = "rms_norm_backward";
  const std::ptrdiff_t n = detail::checked_area(rows, cols, k);
  detail::check_ptr(x, n, k, "x");
  detail::check_ptr(weight, rows > 0 ? cols : 0, k, "weight");
  detail::check_ptr(inv_rms, rows, k, "inv_rms");
  detail::check_ptr(dy, n, k, "dy");
  detail::check_ptr(dx, n, k, "dx");
  if (n == 0) return;

  const std::ptrdiff_t chunks = (rows + detail::kRowChunk - 1) / detail::kRowChunk;
  std::vector<float> partial(dweight ? static_cast<std::size_t>(chunks * cols) : 0);
  const float inv_cols = 1.0f / static_cast<float>(cols);

  const std::ptrdiff_t grain =
      std::max<std::ptrdiff_t>(1, detail::kParallelWork / std::max<std::ptrdiff_t>(detail::kRowChunk * cols, 1));
  exec::parallel_for(0, chunks, grain, [&](std::ptrdiff_t clo, std::ptrdiff_t chi) {
    for (std::ptrdiff_t c = clo; c < chi; ++c) {
      float* p = dweight ? partial.data() + c * cols : nullptr;
      if (p) detail::row_fill(p, cols, 0.0f);
      const std::ptrdiff_t r_end = std::min(rows, (c + 1) * detail::kRowChunk);
      for (std::ptrdiff_t r = c * detail::kRowChunk; r < r_end; ++r) {
        const float* xr = x + r * cols;
        const float* dyr = dy + r * cols;
        const float ir = inv_rms[r];
        const fbatch irb(ir);
        // c_r = sum_k weight_k * dy_k * x_k, one fixed accumulator layout.
        fbatch s0(0.0f), s1(0.0f);
        std::ptrdiff_t j = 0;
        for (; j + 2 * detail::kLanes <= cols; j += 2 * detail::kLanes) {
          s0 = kernels::detail::fmadd(detail::load(weight + j) * detail::load(dyr + j), detail::load(xr + j), s0);
          s1 = kernels::detail::fmadd(detail::load(weight + j + detail::kLanes) * detail::load(dyr + j + detail::kLanes),
                          detail::load(xr + j + detail::kLanes), s1);
        }
        for (; j + detail::kLanes <= cols; j += detail::kLanes)
          s0 = kernels::detail::fmadd(detail::load(weight + j) * detail::load(dyr + j), detail::load(xr + j), s0);
        if (j < cols)
          s1 = kernels::detail::fmadd(detail::load_partial(weight + j, cols - j, 0.0f) * detail::load_partial(dyr + j, cols - j, 0.0f),
                          detail::load_partial(xr + j, cols - j, 0.0f), s1);
        const float dot = detail::hsum(s0 + s1);
        const fbatch coef(ir * ir * ir * inv_cols * dot);
        if (p) {  // p += dy * x * inv_rms (before dx overwrites dy when they alias)
          detail::map_range(
              0, cols,
              [&](const fbatch& pv, const fbatch& g, const fbatch& xv) { return kernels::detail::fmadd(g * xv, irb, pv); }, p,
              static_cast<const float*>(p), dyr, xr);
        }
        detail::map_range(
            0, cols,
            [&](const fbatch& wv, const fbatch& g, const fbatch& xv) { return kernels::detail::fmsub(irb, wv * g, xv * coef); },
            dx + r * cols, weight, dyr, xr);
      }
    }
  });

  if (!dweight) return;
  // Combine chunk partials in chunk order, column blocks in parallel.
  const std::ptrdiff_t col_grain = std::max<std::ptrdiff_t>(
      detail::kLanes, detail::kParallelWork / std::max<std::ptrdiff_t>(chunks, 1) / detail::kLanes * detail::kLanes);
  exec::parallel_for(0, cols, col_grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    auto sum_chunks = [&](std::ptrdiff_t j, auto load_fn) {
      fbatch acc = load_fn(partial.data() + j);
      for (std::ptrdiff_t c = 1; c < chunks; ++c) acc += load_fn(partial.data() + c * cols + j);
      return acc;
    };
    std::ptrdiff_t j = lo;
    for (; j + detail::kLanes <= hi; j += detail::kLanes) {
      const fbatch acc = sum_chunks(j, [](const float* q) { return detail::load(q); });
      detail::store(dweight + j, detail::load(dweight + j) + acc);
    }
    if (j < hi) {
      const std::ptrdiff_t m = hi - j;
      const fbatch acc = sum_chunks(j, [m](const float* q) { return detail::load_partial(q, m, 0.0f); });
      detail::store_partial(dweight + j, detail::load_partial(dweight + j, m, 0.0f) + acc, m);
    }
  });
}

}  // namespace edl::kernels
