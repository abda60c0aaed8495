// edl/optim/optimizer.hpp
// Optimizers with PyTorch / optax semantics over any model with visit_params:
//   adamw     torch.optim.AdamW (decoupled weight decay: p -= lr*wd*p, then the Adam step)
//   sgd       torch.optim.SGD with momentum, dampening 0, optional Nesterov, decoupled=false
//             (weight decay added to the gradient, as torch does)
//   lion      Chen et al. 2023 (optax.lion): p -= lr * (sign(b1*m + (1-b1)*g) + wd*p); m = b2*m + (1-b2)*g
//   rmsprop   torch.optim.RMSprop: square_avg = alpha*square_avg + (1-alpha)*g^2 (centered: minus
//             grad_avg^2, grad_avg = alpha*grad_avg + (1-alpha)*g); p -= lr * g / (sqrt(.) + eps),
//             through a momentum buffer (buf = momentum*buf + g / (sqrt(.) + eps)) when momentum > 0;
//             weight decay added to the gradient, as torch does
//   adafactor Shazeer & Stern 2018 as optax.adafactor without momentum: factored second moments
//             (row and column means of g^2 + eps1) for matrices, full for vectors; decay
//             rate 1 - (t)^-0.8; update clipped to RMS 1; relative step off (lr is the step)
//
// State lives per parameter path in named slots (PyTorch's names: "exp_avg", "exp_avg_sq",
// "momentum_buffer", "square_avg", "grad_avg"), so it can be saved under "<path>.<slot>" and sharded like its
// parameter. When a parameter's storage is not f32 (bf16 params), the optimizer keeps an f32
// master copy in slot "master" and rounds to storage after each update (mixed precision).
// Weight decay applies to parameters of rank >= 2 by default (no decay on norms and biases);
// Options::decay_all applies it everywhere (torch's default).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>

namespace edl::optim {

enum class OptimizerKind { adamw, sgd, lion, adafactor, rmsprop };

inline OptimizerKind optimizer_from_name(std::string_view name) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "sgd") return OptimizerKind::sgd;
  if (name == "lion") return OptimizerKind::lion;
  if (name == "adafactor") return OptimizerKind::adafactor;
  if (name == "rmsprop") return OptimizerKind::rmsprop;
  detail::raise(errc::config, "optimizer",
                detail::concat("expected one of adamw, sgd, lion, adafactor, rmsprop; found \"", name, "\""));
}
inline const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::lion: return "lion";
    case OptimizerKind::adafactor: return "adafactor";
    case OptimizerKind::rmsprop: return "rmsprop";
  }
  return "?";
}

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::adamw;
  double b1 = 0.9, b2 = 0.999, eps = 1e-8;  // adamw, lion (b1, b2); sgd momentum = b1 when momentum < 0
  double weight_decay = 0.0;
  double momentum = 0.0;                    // sgd, rmsprop
  double rmsprop_alpha = 0.99;              // rmsprop: the squared average's decay (torch's alpha)
  bool rmsprop_centered = false;            // rmsprop: divide by the gradient's estimated variance
  bool nesterov = false;                    // sgd
  bool decay_all = false;                   // weight decay on every parameter (torch default)
  double adafactor_eps1 = 1e-30, adafactor_clip = 1.0, adafactor_decay = 0.8;
};

class Optimizer {
 public:
  using Slots = std::map<std::string, std::vector<float>>;  // slot name -> values

  Optimizer() = default;
  explicit Optimizer(OptimizerOptions o) : opt_(o) {
    EDL_CHECK(o.eps >= 0 && o.b1 >= 0 && o.b1 < 1 + 1e-12 && o.b2 >= 0 && o.b2 <= 1, errc::config, "optimizer",
              "betas must lie in [0, 1] and eps >= 0; found b1=", o.b1, " b2=", o.b2, " eps=", o.eps);
    EDL_CHECK(o.rmsprop_alpha >= 0 && o.rmsprop_alpha <= 1 && o.momentum >= 0, errc::config, "optimizer",
              "rmsprop_alpha must lie in [0, 1] and momentum >= 0; found ", o.rmsprop_alpha, " and ", o.momentum);
  }

  const OptimizerOptions& options() const noexcept { return opt_; }
  /// Number of updates applied so far (Adam's t after the last step).
  std::int64_t step_count() const noexcept { return step_; }
  void set_step_count(std::int64_t s) noexcept { step_ = s; }

  /// One update of every parameter that has a gradient, at learning rate `lr`.
  template <class Model>
  void step(Model& model, double lr) {
    begin_step();
    model.visit_params("", [&](std::string_view path, auto& p) {
      if (!p.has_grad()) return;
      update(std::string(path), p.data(), p.grad.data(), p.numel(), p.shape(), lr);
    });
  }

  /// The two halves of step() for callers that hold tensors rather than a model (the sharded
  /// optimizer updates each device's blocks): begin_step() counts the update (Adam's t), then
  /// update_tensor() for each tensor. `shape` is the parameter's full shape (it decides weight
  /// decay: matrices only, unless decay_all), even when `value` is one block of it.
  void begin_step() noexcept { ++step_; }
  template <class T>
  void update_tensor(const std::string& path, T* value, const float* grad, std::int64_t n,
                     const std::vector<std::int64_t>& shape, double lr) {
    update(path, value, grad, n, shape, lr);
  }

  /// The values of one slot, or null when the parameter has no such slot (yet).
  const std::vector<float>* find_slot(const std::string& path, const std::string& slot) const {
    const auto p = state_.find(path);
    if (p == state_.end()) return nullptr;
    const auto s = p->second.find(slot);
    return s == p->second.end() ? nullptr : &s->second;
  }

  /// Every slot of every parameter: f(path, slot name, values).
  template <class F>
  void visit_state(F&& f) {
    for (auto& [path, slots] : state_)
      for (auto& [slot, v] : slots) f(path, slot, v);
  }
  template <class F>
  void visit_state(F&& f) const {
    for (const auto& [path, slots] : state_)
      for (const auto& [slot, v] : slots) f(path, slot, v);
  }
  /// Sets a slot (loading a checkpoint); sizes are checked on the next step.
  void set_slot(const std::string& path, const std::string& slot, std::vector<float> v) {
    state_[path][slot] = std::move(v);
  }
  std::int64_t state_bytes() const {
    std::int64_t b = 0;
    visit_state([&](const std::string&, const std::string&, const std::vector<float>& v) {
      b += static_cast<std::int64_t>(v.size() * sizeof(float));
    });
    return b;
  }

 private:
  std::vector<float>& slot(Slots& s, const std::string& path, const char* name, std::size_t n, float init = 0.f) {
    auto& v = s[name];
    if (v.empty()) v.assign(n, init);
    EDL_CHECK(v.size() == n, errc::shape_mismatch, path + "." + name, "optimizer state holds ", v.size(),
              " values, the parameter has ", n);
    return v;
  }

  template <class T>
  void update(const std::string& path, T* value, const float* grad, std::int64_t n64, const std::vector<std::int64_t>& shape,
              double lr) {
    const std::size_t n = static_cast<std::size_t>(n64);
    Slots& s = state_[path];
    // f32 parameters update in place; other storage goes through an f32 master copy.
    float* w = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      w = value;
    } else {
      auto& master = s["master"];
      if (master.empty()) {
        master.resize(n);
        for (std::size_t i = 0; i < n; ++i) master[i] = to_f32(value[i]);
      }
      w = master.data();
    }
    const bool decay = opt_.decay_all || shape.size() >= 2;
    const float wd = decay ? static_cast<float>(opt_.weight_decay) : 0.f;
    const float flr = static_cast<float>(lr);
    const float b1 = static_cast<float>(opt_.b1), b2 = static_cast<float>(opt_.b2), eps = static_cast<float>(opt_.eps);
    constexpr std::ptrdiff_t grain = 1 << 14;
    switch (opt_.kind) {
      case OptimizerKind::adamw: {
        float* m = slot(s, path, "exp_avg", n).data();
        float* v = slot(s, path, "exp_avg_sq", n).data();
        // torch: step_size = lr / bc1; denom = sqrt(v) / sqrt(bc2) + eps; p -= step_size * m / denom
        const double bc1 = 1.0 - std::pow(opt_.b1, static_cast<double>(step_));
        const double bc2 = 1.0 - std::pow(opt_.b2, static_cast<double>(step_));
        const float step_size = static_cast<float>(lr / bc1);
        const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
        const float decay_mul = 1.f - flr * wd;
        exec::parallel_for(0, static_cast<std::ptrdiff_t>(n), grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
          for (std::ptrdiff_t i = lo; i < hi; ++i) {
            const float g = grad[i];
            w[i] *= decay_mul;
            m[i] = m[i] * b1 + (1.f - b1) * g;  // torch lerp_(grad, 1 - beta1)
            v[i] = v[i] * b2 + (1.f - b2) * g * g;
            const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
            w[i] -= step_size * (m[i] / denom);
          }
        });
        break;
      }
      case OptimizerKind::sgd: {
        const float mu = static_cast<float>(opt_.momentum);
        float* buf = mu > 0 ? slot(s, path, "momentum_buffer", n).data() : nullptr;
        const bool first = step_ == 1;
        exec::parallel_for(0, static_cast<std::ptrdiff_t>(n), grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
          for (std::ptrdiff_t i = lo; i < hi; ++i) {
            float g = grad[i] + wd * w[i];
            if (buf) {
              buf[i] = first ? g : mu * buf[i] + g;  // torch: the first step copies the gradient
              g = opt_.nesterov ? g + mu * buf[i] : buf[i];
            }
            w[i] -= flr * g;
          }
        });
        break;
      }
      case OptimizerKind::lion: {
        float* m = slot(s, path, "exp_avg", n).data();
        exec::parallel_for(0, static_cast<std::ptrdiff_t>(n), grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
          for (std::ptrdiff_t i = lo; i < hi; ++i) {
            const float g = grad[i];
            const float c = b1 * m[i] + (1.f - b1) * g;
            const float sgn = static_cast<float>((c > 0.f) - (c < 0.f));
            w[i] -= flr * (sgn + wd * w[i]);
            m[i] = b2 * m[i] + (1.f - b2) * g;
          }
        });
        break;
      }
      case OptimizerKind::rmsprop: {
        const float alpha = static_cast<float>(opt_.rmsprop_alpha), mu = static_cast<float>(opt_.momentum);
        float* sq = slot(s, path, "square_avg", n).data();
        float* ga = opt_.rmsprop_centered ? slot(s, path, "grad_avg", n).data() : nullptr;
        float* buf = mu > 0 ? slot(s, path, "momentum_buffer", n).data() : nullptr;
        exec::parallel_for(0, static_cast<std::ptrdiff_t>(n), grain, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
          for (std::ptrdiff_t i = lo; i < hi; ++i) {
            const float g = grad[i] + wd * w[i];
            sq[i] = alpha * sq[i] + (1.f - alpha) * g * g;  // torch: mul_(alpha).addcmul_(g, g, 1 - alpha)
            float var = sq[i];
            if (ga) {
              ga[i] = alpha * ga[i] + (1.f - alpha) * g;  // torch: lerp_(g, 1 - alpha)
              var -= ga[i] * ga[i];
            }
            const float avg = std::sqrt(var) + eps;
            if (buf) {
              buf[i] = mu * buf[i] + g / avg;
              w[i] -= flr * buf[i];
            } else {
              w[i] -= flr * (g / avg);
            }
          }
        });
        break;
      }
      case OptimizerKind::adafactor: adafactor(s, path, w, grad, n, shape, flr, wd); break;
    }
    if constexpr (!std::is_same_v<T, float>)
      for (std::size_t i = 0; i < n; ++i) value[i] = from_f32<T>(w[i]);
  }

  void adafactor(Slots& s, const std::string& path, float* w, const float* grad, std::size_t n,
                 const std::vector<std::int64_t>& shape, float lr, float wd) {
    const double beta2 = 1.0 - std::pow(static_cast<double>(step_), -opt_.adafactor_decay);
    const float eps1 = static_cast<float>(opt_.adafactor_eps1);
    std::vector<float> u(n);
    if (shape.size() >= 2) {  // factored over the last two dimensions
      const std::size_t cols = static_cast<std::size_t>(shape.back());
      const std::size_t rows = n / cols;
      auto& vr = slot(s, path, "exp_avg_sq_row", rows);
      auto& vc = slot(s, path, "exp_avg_sq_col", cols);
      std::vector<double> rmean(rows, 0.0), cmean(cols, 0.0);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) {
          const double g2 = static_cast<double>(grad[r * cols + c]) * grad[r * cols + c] + eps1;
          rmean[r] += g2 / static_cast<double>(cols);
          cmean[c] += g2 / static_cast<double>(rows);
        }
      double rsum = 0.0;
      for (std::size_t r = 0; r < rows; ++r) {
        vr[r] = static_cast<float>(beta2 * vr[r] + (1.0 - beta2) * rmean[r]);
        rsum += vr[r];
      }
      for (std::size_t c = 0; c < cols; ++c) vc[c] = static_cast<float>(beta2 * vc[c] + (1.0 - beta2) * cmean[c]);
      const double rmean_all = rsum / static_cast<double>(rows);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) {
          const double v = static_cast<double>(vr[r]) * vc[c] / rmean_all;
          u[r * cols + c] = static_cast<float>(grad[r * cols + c] / std::sqrt(v));
        }
    } else {
      auto& v = slot(s, path, "exp_avg_sq", n);
      for (std::size_t i = 0; i < n; ++i) {
        v[i] = static_cast<float>(beta2 * v[i] + (1.0 - beta2) * (static_cast<double>(grad[i]) * grad[i] + eps1));
        u[i] = grad[i] / std::sqrt(v[i]);
      }
    }
    double sq = 0.0;
    for (float x : u) sq += static_cast<double>(x) * x;
    const double rms = std::sqrt(sq / static_cast<double>(std::max<std::size_t>(n, 1)));
    const float clip = static_cast<float>(1.0 / std::max(1.0, rms / opt_.adafactor_clip));
    for (std::size_t i = 0; i < n; ++i) w[i] -= lr * (u[i] * clip + wd * w[i]);
  }

  OptimizerOptions opt_;
  std::int64_t step_ = 0;
  std::map<std::string, Slots> state_;
};

}  // namespace edl::optim
