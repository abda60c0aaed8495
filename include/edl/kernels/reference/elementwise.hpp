// edl/kernels/reference/elementwise.hpp
// Naive reference twins of softmax.hpp, rms_norm.hpp, activations.hpp and elementwise.hpp:
// plain scalar loops, double arithmetic and double accumulation, no threads, no SIMD. They
// define what the fast kernels compute; tests compare against them and differentiate them
// numerically. T is float or double (double gives a full-precision forward for finite
// differences). Same argument order and edge-case conventions as the fast kernels
// (fully -Inf softmax row -> zeros, log_softmax -> -Inf, ignore_index rows -> 0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace edl::kernels::reference {

namespace detail {
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline constexpr double kGeluC = 0.7978845608028654;
inline constexpr double kGeluA = 0.044715;
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}  // namespace detail

template <class T>
void softmax_rows(const T* x, T* y, std::ptrdiff_t rows, std::ptrdiff_t cols) {
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    double m = detail::kNegInf;
    for (std::ptrdiff_t j = 0; j < cols; ++j) m = std::max(m, static_cast<double>(xr[j]));
    if (m == detail::kNegInf) {
      for (std::ptrdiff_t j = 0; j < cols; ++j) yr[j] = T(0);
      continue;
    }
    double s = 0;
    for (std::ptrdiff_t j = 0; j < cols; ++j) s += std::exp(static_cast<double>(xr[j]) - m);
    for (std::ptrdiff_t j = 0; j < cols; ++j) yr[j] = static_cast<T>(std::exp(static_cast<double>(xr[j]) - m) / s);
  }
}

template <class T>
void log_softmax_rows(const T* x, T* y, std::ptrdiff_t rows, std::ptrdiff_t cols) {
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    double m = detail::kNegInf;
    for (std::ptrdiff_t j = 0; j < cols; ++j) m = std::max(m, static_cast<double>(xr[j]));
    if (m == detail::kNegInf) {
      for (std::ptrdiff_t j = 0; j < cols; ++j) yr[j] = static_cast<T>(detail::kNegInf);
      continue;
    }
    double s = 0;
    for (std::ptrdiff_t j = 0; j < cols; ++j) s += std::exp(static_cast<double>(xr[j]) - m);
    const double ls = std::log(s);
    for (std::ptrdiff_t j = 0; j < cols; ++j) yr[j] = static_cast<T>(static_cast<double>(xr[j]) - m - ls);
  }
}

template <class T>
void softmax_backward_rows(const T* y, const T* dy, T* dx, std::ptrdiff_t rows, std::ptrdiff_t cols) {
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const std::ptrdiff_t o = r * cols;
    double d = 0;
    for (std::ptrdiff_t j = 0; j < cols; ++j) d += static_cast<double>(dy[o + j]) * y[o + j];
    for (std::ptrdiff_t j = 0; j < cols; ++j) dx[o + j] = static_cast<T>(y[o + j] * (dy[o + j] - d));
  }
}

template <class T>
void log_softmax_backward_rows(const T* y, const T* dy, T* dx, std::ptrdiff_t rows, std::ptrdiff_t cols) {
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const std::ptrdiff_t o = r * cols;
    double s = 0;
    for (std::ptrdiff_t j = 0; j < cols; ++j) s += dy[o + j];
    for (std::ptrdiff_t j = 0; j < cols; ++j)
      dx[o + j] = static_cast<T>(dy[o + j] - std::exp(static_cast<double>(y[o + j])) * s);
  }
}

template <class T, class Label>
std::ptrdiff_t cross_entropy_rows(const T* logits, std::ptrdiff_t rows, std::ptrdiff_t vocab, const Label* labels,
                                  T* loss_per_row, T* dlogits = nullptr, double grad_scale = 1.0,
                                  Label ignore_index = -100) {
  std::ptrdiff_t valid = 0;
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const T* x = logits + r * vocab;
    T* d = dlogits ? dlogits + r * vocab : nullptr;
    const Label l = labels[r];
    if (l == ignore_index) {
      loss_per_row[r] = T(0);
      if (d)
        for (std::ptrdiff_t j = 0; j < vocab; ++j) d[j] = T(0);
      continue;
    }
    ++valid;
    double m = detail::kNegInf;
    for (std::ptrdiff_t j = 0; j < vocab; ++j) m = std::max(m, static_cast<double>(x[j]));
    if (m == detail::kNegInf) {
      loss_per_row[r] = static_cast<T>(std::numeric_limits<double>::infinity());
      if (d)
        for (std::ptrdiff_t j = 0; j < vocab; ++j) d[j] = T(0);
      continue;
    }
    double s = 0;
    for (std::ptrdiff_t j = 0; j < vocab; ++j) s += std::exp(static_cast<double>(x[j]) - m);
    const double lse = m + std::log(s);
    loss_per_row[r] = static_cast<T>(lse - static_cast<double>(x[l]));
    if (d)
      for (std::ptrdiff_t j = 0; j < vocab; ++j)
        d[j] = static_cast<T>(grad_scale * (std::exp(static_cast<double>(x[j]) - lse) - (j == l ? 1.0 : 0.0)));
  }
  return valid;
}

template <class T, class W>
void rms_norm_forward(const T* x, const W* weight, T* y, double* inv_rms, std::ptrdiff_t rows, std::ptrdiff_t cols,
                      double eps) {
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const std::ptrdiff_t o = r * cols;
    double ss = 0;
    for (std::ptrdiff_t j = 0; j < cols; ++j) ss += static_cast<double>(x[o + j]) * x[o + j];
    const double ir = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    if (inv_rms) inv_rms[r] = ir;
    for (std::ptrdiff_t j = 0; j < cols; ++j)
      y[o + j] = static_cast<T>(static_cast<double>(weight[j]) * (static_cast<double>(x[o + j]) * ir));
  }
}

/// dweight is accumulated (+=), like the fast kernel.
template <class T>
void rms_norm_backward(const T* x, const T* weight, const double* inv_rms, const T* dy, T* dx, T* dweight,
                       std::ptrdiff_t rows, std::ptrdiff_t cols) {
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const std::ptrdiff_t o = r * cols;
    const double ir = inv_rms[r];
    double c = 0;
    for (std::ptrdiff_t j = 0; j < cols; ++j) c += static_cast<double>(weight[j]) * dy[o + j] * x[o + j];
    for (std::ptrdiff_t j = 0; j < cols; ++j) {
      dx[o + j] = static_cast<T>(ir * weight[j] * dy[o + j] - static_cast<double>(x[o + j]) * ir * ir * ir * c / cols);
    }
  }
  if (dweight)
    for (std::ptrdiff_t j = 0; j < cols; ++j) {
      double s = 0;
      for (std::ptrdiff_t r = 0; r < rows; ++r) s += static_cast<double>(dy[r * cols + j]) * x[r * cols + j] * inv_rms[r];
      dweight[j] = static_cast<T>(dweight[j] + s);
    }
}

template <class T>
void silu(const T* x, T* y, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) y[i] = static_cast<T>(x[i] * detail::sigmoid(x[i]));
}

template <class T>
void silu_backward(const T* x, const T* dy, T* dx, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const double s = detail::sigmoid(x[i]);
    dx[i] = static_cast<T>(dy[i] * s * (1.0 + x[i] * (1.0 - s)));
  }
}

template <class T>
void silu_mul(const T* gate, const T* up, T* out, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) out[i] = static_cast<T>(gate[i] * detail::sigmoid(gate[i]) * up[i]);
}

template <class T>
void silu_mul_backward(const T* gate, const T* up, const T* d_out, T* d_gate, T* d_up, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const double g = gate[i], u = up[i], d = d_out[i], s = detail::sigmoid(g);
    d_up[i] = static_cast<T>(d * g * s);
    d_gate[i] = static_cast<T>(d * u * s * (1.0 + g * (1.0 - s)));
  }
}

template <class T>
void gelu_tanh(const T* x, T* y, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<T>(0.5 * v * (1.0 + std::tanh(detail::kGeluC * (v + detail::kGeluA * v * v * v))));
  }
}

template <class T>
void gelu_tanh_backward(const T* x, const T* dy, T* dx, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double t = std::tanh(detail::kGeluC * (v + detail::kGeluA * v * v * v));
    const double du = detail::kGeluC * (1.0 + 3.0 * detail::kGeluA * v * v);
    dx[i] = static_cast<T>(dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du));
  }
}

template <class T>
void add(const T* a, const T* b, T* out, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<double>(a[i]) + b[i]);
}

template <class T>
void axpy(double a, const T* x, T* y, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) y[i] = static_cast<T>(y[i] + a * x[i]);
}

template <class T>
void mul(const T* a, const T* b, T* out, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<double>(a[i]) * b[i]);
}

template <class T>
double dot(const T* a, const T* b, std::ptrdiff_t n) {
  double s = 0;
  for (std::ptrdiff_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

template <class T>
double sum_squares(const T* x, std::ptrdiff_t n) {
  double s = 0;
  for (std::ptrdiff_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace edl::kernels::reference
