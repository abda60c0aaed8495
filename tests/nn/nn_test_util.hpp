// Helpers shared by tests/nn and tests/models: random data and finite-difference checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace edl_nn_test {

inline std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

template <class T>
void fill_randn(T* p, std::size_t n, unsigned seed, float scale) {
  auto v = randn(n, seed, scale);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(v[i]);
}

/// L = sum c_i y_i in double.
inline double functional(const float* y, const std::vector<float>& c) {
  double s = 0;
  for (std::size_t i = 0; i < c.size(); ++i) s += static_cast<double>(c[i]) * static_cast<double>(y[i]);
  return s;
}

/// Compares analytic[i] with the central difference of loss() in x[i] for up to `samples`
/// indices spread over [0, n). Tolerance: |a - fd| <= tol * max(max |fd|, max |a|) + atol.
template <class F>
void expect_fd(const std::string& what, float* x, std::size_t n, const float* analytic, F&& loss, int samples = 24,
               float h = 1e-2f, double tol = 1e-2, double atol = 1e-6) {
  std::vector<std::size_t> idx;
  const std::size_t step = std::max<std::size_t>(1, n / static_cast<std::size_t>(samples));
  for (std::size_t i = (n > 1 ? 1 : 0) % std::max<std::size_t>(n, 1); i < n && idx.size() < static_cast<std::size_t>(samples); i += step)
    idx.push_back(i);
  std::vector<double> fd(idx.size());
  double scale = 0;
  for (std::size_t k = 0; k < idx.size(); ++k) {
    float& v = x[idx[k]];
    const float old = v;
    v = old + h;
    const double lp = loss();
    v = old - h;
    const double lm = loss();
    v = old;
    fd[k] = (lp - lm) / (2.0 * static_cast<double>(h));
    scale = std::max({scale, std::fabs(fd[k]), std::fabs(static_cast<double>(analytic[idx[k]]))});
  }
  for (std::size_t k = 0; k < idx.size(); ++k)
    EXPECT_NEAR(analytic[idx[k]], fd[k], tol * scale + atol) << what << " index " << idx[k] << " (scale " << scale << ")";
}

inline double max_abs(const float* p, std::size_t n) {
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(p[i])));
  return m;
}

}  // namespace edl_nn_test
