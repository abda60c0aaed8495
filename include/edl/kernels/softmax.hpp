// edl/kernels/softmax.hpp
// Row-wise softmax, log-softmax, their backward passes and a fused cross-entropy, on
// contiguous row-major f32 arrays (rows x cols).
//
// Numerics: every row subtracts its maximum before exp (stable for any finite input);
// sums are f32 with a fixed vector-accumulator layout. -Inf entries (masked positions)
// get probability exactly 0. A row whose entries are all -Inf (fully masked) gives
//   softmax      -> all 0 (not NaN),
//   log_softmax  -> all -Inf,
//   cross_entropy-> loss +Inf, gradient 0.
// +Inf or NaN inputs give NaN in their row.
//
// Aliasing: y may equal x (in place); dx may equal dy; dlogits may equal logits.
// Parallel over rows; each row is computed by one thread with one fixed sequence of
// operations, so results are bit-identical for any thread count.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/simd.hpp>

namespace edl::kernels {

namespace detail {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// max over x[0, n); -Inf for an empty row.
inline float row_max(const float* x, std::ptrdiff_t n) noexcept {
  fbatch m0(kNegInf), m1(kNegInf);
  std::ptrdiff_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    m0 = xsimd::max(m0, load(x + j));
    m1 = xsimd::max(m1, load(x + j + kLanes));
  }
  for (; j + kLanes <= n; j += kLanes) m0 = xsimd::max(m0, load(x + j));
  if (j < n) m1 = xsimd::max(m1, load_partial(x + j, n - j, kNegInf));
  return hmax(xsimd::max(m0, m1));
}

/// sum_j exp(x_j - m); stores the exps in y when y is not null (y may equal x).
inline float row_exp_sum(const float* x, float* y, std::ptrdiff_t n, float m) noexcept {
  const fbatch mb(m);
  fbatch s0(0.0f), s1(0.0f);
  std::ptrdiff_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    const fbatch e0 = detail::exp(load(x + j) - mb);
    const fbatch e1 = detail::exp(load(x + j + kLanes) - mb);
    if (y) {
      store(y + j, e0);
      store(y + j + kLanes, e1);
    }
    s0 += e0;
    s1 += e1;
  }
  for (; j + kLanes <= n; j += kLanes) {
    const fbatch e = detail::exp(load(x + j) - mb);
    if (y) store(y + j, e);
    s0 += e;
  }
  if (j < n) {
    const fbatch e = detail::exp(load_partial(x + j, n - j, kNegInf) - mb);  // padding lanes: exp(-Inf) = 0
    if (y) store_partial(y + j, e, n - j);
    s1 += e;
  }
  return hsum(s0 + s1);
}

/// sum_j a_j * b_j (f32, fixed layout of 2 accumulators).
inline float row_dot(const float* a, const float* b, std::ptrdiff_t n) noexcept {
  fbatch s0(0.0f), s1(0.0f);
  std::ptrdiff_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    s0 = kernels::detail::fmadd(load(a + j), load(b + j), s0);
    s1 = kernels::detail::fmadd(load(a + j + kLanes), load(b + j + kLanes), s1);
  }
  for (; j + kLanes <= n; j += kLanes) s0 = kernels::detail::fmadd(load(a + j), load(b + j), s0);
  if (j < n) s1 = kernels::detail::fmadd(load_partial(a + j, n - j, 0.0f), load_partial(b + j, n - j, 0.0f), s1);
  return hsum(s0 + s1);
}

/// sum_j a_j.
inline float row_sum(const float* a, std::ptrdiff_t n) noexcept {
  fbatch s0(0.0f), s1(0.0f);
  std::ptrdiff_t j = 0;
  for (; j + 2 * kLanes <= n; j += 2 * kLanes) {
    s0 += load(a + j);
    s1 += load(a + j + kLanes);
  }
  for (; j + kLanes <= n; j += kLanes) s0 += load(a + j);
  if (j < n) s1 += load_partial(a + j, n - j, 0.0f);
  return hsum(s0 + s1);
}

inline void softmax_row(const float* x, float* y, std::ptrdiff_t n) noexcept {
  const float m = row_max(x, n);
  if (m == kNegInf) return row_fill(y, n, 0.0f);  // fully masked row
  const float inv = 1.0f / row_exp_sum(x, y, n, m);
  map_range(0, n, [&](const fbatch& e) { return e * fbatch(inv); }, y, static_cast<const float*>(y));
}

inline void log_softmax_row(const float* x, float* y, std::ptrdiff_t n) noexcept {
  const float m = row_max(x, n);
  if (m == kNegInf) return row_fill(y, n, kNegInf);
  const float ls = std::log(row_exp_sum(x, nullptr, n, m));
  map_range(0, n, [&](const fbatch& v) { return (v - fbatch(m)) - fbatch(ls); }, y, x);
}

/// Runs row(r) for every row in parallel (row grain from the row length).
template <class F>
inline void for_rows(std::ptrdiff_t rows, std::ptrdiff_t cols, F&& row) {
  exec::parallel_for(0, rows, row_grain(cols), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::ptrdiff_t r = lo; r < hi; ++r) row(r);
  });
}

}  // namespace detail

/// y = softmax(x) over one row of n, on the calling thread (softmax_rows' row, bit for bit).
inline void softmax_row(const float* x, float* y, std::ptrdiff_t n) noexcept { detail::softmax_row(x, y, n); }

/// y[r, :] = softmax(x[r, :]). A fully -Inf row gives zeros. y may equal x.
inline void softmax_rows(const float* x, float* y, std::ptrdiff_t rows, std::ptrdiff_t cols) {
  const std::ptrdiff_t n = detail::checked_area(rows, cols, "softmax_rows");
  detail::check_ptr(x, n, "softmax_rows", "x");
  detail::check_ptr(y, n, "softmax_rows", "y");
  detail::for_rows(rows, cols, [&](std::ptrdiff_t r) { detail::softmax_row(x + r * cols, y + r * cols, cols); });
}

/// y[r, :] = log_softmax(x[r, :]) = x - max - log(sum exp(x - max)). A fully -Inf row
/// gives -Inf everywhere. y may equal x.
inline void log_softmax_rows(const float* x, float* y, std::ptrdiff_t rows, std::ptrdiff_t cols) {
  const std::ptrdiff_t n = detail::checked_area(rows, cols, "log_softmax_rows");
  detail::check_ptr(x, n, "log_softmax_rows", "x");
  detail::check_ptr(y, n, "log_softmax_rows", "y");
  detail::for_rows(rows, cols, [&](std::ptrdiff_t r) { detail::log_softmax_row(x + r * cols, y + r * cols, cols); });
}

/// Backward of softmax from its output y: dx = y * (dy - sum_j(dy_j * y_j)) per row.
/// dx may equal dy.
inline void softmax_backward_rows(const float* y, const float* dy, float* dx, std::ptrdiff_t rows,
                                  std::ptrdiff_t cols) {
  const char* k = "softmax_backward_rows";
  const std::ptrdiff_t n = detail::checked_area(rows, cols, k);
  detail::check_ptr(y, n, k, "y");
  detail::check_ptr(dy, n, k, "dy");
  detail::check_ptr(dx, n, k, "dx");
  detail::for_rows(rows, cols, [&](std::ptrdiff_t r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    const detail::fbatch d(detail::row_dot(dyr, yr, cols));
    detail::map_range(0, cols, [&](const detail::fbatch& yv, const detail::fbatch& g) { return yv * (g - d); },
                      dx + r * cols, yr, dyr);
  });
}

/// Backward of log_softmax from its output y: dx = dy - exp(y) * sum_j(dy_j) per row
/// (exp(-Inf) = 0, so masked entries pass dy through). dx may equal dy.
inline void log_softmax_backward_rows(const float* y, const float* dy, float* dx, std::ptrdiff_t rows,
                                      std::ptrdiff_t cols) {
  const char* k = "log_softmax_backward_rows";
  const std::ptrdiff_t n = detail::checked_area(rows, cols, k);
  detail::check_ptr(y, n, k, "y");
  detail::check_ptr(dy, n, k, "dy");
  detail::check_ptr(dx, n, k, "dx");
  detail::for_rows(rows, cols, [&](std::ptrdiff_t r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    const detail::fbatch s(detail::row_sum(dyr, cols));
    detail::map_range(
        0, cols, [&](const detail::fbatch& yv, const detail::fbatch& g) { return kernels::detail::fnmadd(detail::exp(yv), s, g); },
        dx + r * cols, yr, dyr);
  });
}

/// Fused cross-entropy over rows of logits (rows x vocab), one pass per row:
///   loss_per_row[r] = logsumexp(logits[r, :]) - logits[r, labels[r]]
///   dlogits[r, :]   = grad_scale * (softmax(logits[r, :]) - onehot(labels[r]))   (if dlogits)
/// Rows whose label equals ignore_index get loss 0 and a zero gradient. Returns the number
/// of rows not ignored (for a mean over a sequence chunked through this call, pass
/// grad_scale = 1 / total_valid and sum loss_per_row / total_valid).
/// Label is std::int32_t or std::int64_t; a label outside [0, vocab) that is not
/// ignore_index throws edl::Error (invalid_argument). dlogits may equal logits (the
/// gradient overwrites the logits, saving a rows x vocab buffer). A row of all -Inf
/// logits gives loss +Inf and a zero gradient.
template <class Label>
  requires(std::is_same_v<Label, std::int32_t> || std::is_same_v<Label, std::int64_t>)
inline std::ptrdiff_t cross_entropy_rows(const float* logits, std::ptrdiff_t rows, std::ptrdiff_t vocab,
                                         const Label* labels, float* loss_per_row, float* dlogits = nullptr,
                                         float grad_scale = 1.0f, Label ignore_index = -100) {
  const char* k = "cross_entropy_rows";
  detail::check_size(rows, k, "rows");
  detail::check_size(vocab, k, "vocab");
  const std::ptrdiff_t n = detail::checked_area(rows, vocab, k);
  detail::check_ptr(logits, n, k, "logits");
  detail::check_ptr(labels, rows, k, "labels");
  detail::check_ptr(loss_per_row, rows, k, "loss_per_row");
  std::ptrdiff_t valid = 0;
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const Label l = labels[r];
    if (l == ignore_index) continue;
    EDL_CHECK(l >= 0 && l < vocab, errc::invalid_argument, detail::kname(k),
              "labels[", r, "] = ", static_cast<long long>(l), ", expected in [0, ", vocab, ") or ignore_index ",
              static_cast<long long>(ignore_index));
    ++valid;
  }
  detail::for_rows(rows, vocab, [&](std::ptrdiff_t r) {
    const float* x = logits + r * vocab;
    float* d = dlogits ? dlogits + r * vocab : nullptr;
    const Label l = labels[r];
    if (l == ignore_index) {
      loss_per_row[r] = 0.0f;
      if (d) detail::row_fill(d, vocab, 0.0f);
      return;
    }
    const float xl = x[l];  // read before d (possibly == x) is overwritten
    const float m = detail::row_max(x, vocab);
    if (m == detail::kNegInf) {
      loss_per_row[r] = std::numeric_limits<float>::infinity();
      if (d) detail::row_fill(d, vocab, 0.0f);
      return;
    }
    const float s = detail::row_exp_sum(x, d, vocab, m);  // d holds exp(x - m)
    loss_per_row[r] = (m - xl) + std::log(s);
    if (d) {
      const float c = grad_scale / s;
      detail::map_range(0, vocab, [&](const detail::fbatch& e) { return e * detail::fbatch(c); }, d,
                        static_cast<const float*>(d));
      d[l] -= grad_scale;
    }
  });
  return valid;
}

/// y[j] = p[j] * (dp[j] - d) * scale: the softmax backward of one row, in SIMD.
inline void softmax_grad_row(const float* p, float* dp, float d, float scale, std::int64_t n) noexcept {
  namespace kd = detail;
  const kd::fbatch db(d), sb(scale);
  std::ptrdiff_t j = 0;
  for (; j + kd::kLanes <= n; j += kd::kLanes)
    kd::store(dp + j, kd::load(p + j) * (kd::load(dp + j) - db) * sb);
  for (; j < n; ++j) dp[j] = p[j] * (dp[j] - d) * scale;
}

}  // namespace edl::kernels
