// edl/optim/clip.hpp
// Global gradient norm and clipping (optax.clip_by_global_norm / torch clip_grad_norm_).
// The norm sums each parameter's squares in f64, parameters in visit order, so it is the same
// on every thread count and mesh shape.
#pragma once

#include <cmath>
#include <string_view>

#include <edl/kernels/elementwise.hpp>

namespace edl::optim {

/// sqrt(sum over parameters of sum(grad^2)); parameters without a gradient count as zero.
template <class Model>
double global_grad_norm(Model& model) {
  double sq = 0.0;
  model.visit_params("", [&](std::string_view, auto& p) {
    if (p.has_grad()) {
      const float* g = p.grad.data();
      double s = 0.0;
      for (std::int64_t i = 0; i < p.numel(); ++i) s += static_cast<double>(g[i]) * g[i];
      sq += s;
    }
  });
  return std::sqrt(sq);
}

/// Scales every gradient by min(1, max_norm / norm) (no-op when max_norm <= 0); returns the
/// norm before clipping.
template <class Model>
double clip_by_global_norm(Model& model, double max_norm) {
  const double norm = global_grad_norm(model);
  if (max_norm > 0 && norm > max_norm) {
    const float s = static_cast<float>(max_norm / (norm + 1e-6));
    model.visit_params("", [&](std::string_view, auto& p) {
      if (p.has_grad()) kernels::scale(p.grad.data(), s, p.numel());
    });
  }
  return norm;
}

template <class Model>
void zero_grad(Model& model) {
  model.visit_params("", [](std::string_view, auto& p) { p.zero_grad(); });
}

}  // namespace edl::optim
