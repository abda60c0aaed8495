// edl/nn/mlp.hpp
// Gated feed-forward as HF LlamaMLP: y = down( act(gate x) * up x ), act = silu (SwiGLU) or,
// for Gemma, the tanh GELU (GeGLU, kernels::GatedActivation).
//   gate, up: [intermediate, hidden] column-parallel; down: [hidden, intermediate] row-parallel.
// Saved: gate x, up x and a = silu(gate x) * up x ([T, intermediate] each).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/kernels/activations.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/module.hpp>

namespace edl::nn {

template <class Pol>
class MLP {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  struct Saved {
    typename ColumnLinear<Pol>::Saved gate_s, up_s;
    typename RowLinear<Pol>::Saved down_s;
    std::vector<float> g, u, a;  // [T, intermediate]
  };

  MLP() = default;
  MLP(std::int64_t hidden, std::int64_t intermediate, bool bias = false,
      kernels::GatedActivation act = kernels::GatedActivation::silu)
      : gate_proj(hidden, intermediate, bias), up_proj(hidden, intermediate, bias), down_proj(intermediate, hidden, bias),
        hidden_(hidden), inter_(intermediate), act_(act) {}

  ColumnLinear<Pol> gate_proj, up_proj;
  RowLinear<Pol> down_proj;

  kernels::GatedActivation activation() const noexcept { return act_; }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    gate_proj.visit_params(join_path(prefix, "gate_proj"), f);
    up_proj.visit_params(join_path(prefix, "up_proj"), f);
    down_proj.visit_params(join_path(prefix, "down_proj"), f);
  }
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    gate_proj.visit_linears(join_path(prefix, "gate_proj"), f);
    up_proj.visit_linears(join_path(prefix, "up_proj"), f);
    down_proj.visit_linears(join_path(prefix, "down_proj"), f);
  }
  std::int64_t param_count() const noexcept {
    return gate_proj.param_count() + up_proj.param_count() + down_proj.param_count();
  }
  double flops_forward(std::int64_t tokens) const noexcept {
    return gate_proj.flops_forward(tokens) + up_proj.flops_forward(tokens) + down_proj.flops_forward(tokens);
  }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  void forward(const float* x, std::int64_t tokens, float* y, Saved& s) const {
    forward_parts(x, tokens, s, true, true, true);
    down_proj.forward(s.a.data(), tokens, y, s.down_s);
  }

  // Rematerialization (DecoderLayer under a remat policy): release() frees what a policy
  // does not keep, rematerialize() recomputes it with forward's kernels (bitwise equal).

  /// Frees gate x (g), up x (u) and a, as asked.
  static void release(Saved& s, bool g, bool u, bool a) {
    if (g) std::vector<float>().swap(s.g);
    if (u) std::vector<float>().swap(s.u);
    if (a) std::vector<float>().swap(s.a);
  }
  /// Recomputes what release() freed from the same x [tokens, hidden] forward had, and
  /// re-points the projections' Saved at x and a.
  void rematerialize(const float* x, std::int64_t tokens, Saved& s, bool g, bool u, bool a) const {
    forward_parts(x, tokens, s, g, u, a);
    s.gate_s.point_at(x, tokens);
    s.up_s.point_at(x, tokens);
    s.down_s.point_at(s.a.data(), tokens);
  }

  void apply(const float* x, std::int64_t tokens, float* y) const {
    Saved s;
    forward(x, tokens, y, s);
  }

  /// Accumulates the three weight gradients; writes dx [T, hidden].
  void backward(const float* dy, Saved& s, float* dx) {
    const std::size_t n = s.a.size();
    std::vector<float> da(n), dg(n);
    down_proj.backward(dy, s.down_s, da.data());
    kernels::gated_mul_backward(act_, s.g.data(), s.u.data(), da.data(), dg.data(), da.data(),
                                static_cast<std::ptrdiff_t>(n));
    gate_proj.backward(dg.data(), s.gate_s, dx, false);
    up_proj.backward(da.data(), s.up_s, dx, true);
  }

 private:
  void forward_parts(const float* x, std::int64_t tokens, Saved& s, bool g, bool u, bool a) const {
    const std::size_t n = static_cast<std::size_t>(tokens * inter_);
    if (g) {
      s.g.resize(n);
      gate_proj.forward(x, tokens, s.g.data(), s.gate_s);
      round_activations<Pol>(s.g);
    }
    if (u) {
      s.u.resize(n);
      up_proj.forward(x, tokens, s.u.data(), s.up_s);
      round_activations<Pol>(s.u);
    }
    if (a) {
      s.a.resize(n);
      kernels::gated_mul(act_, s.g.data(), s.u.data(), s.a.data(), static_cast<std::ptrdiff_t>(n));
      round_activations<Pol>(s.a);
    }
  }

  std::int64_t hidden_ = 0, inter_ = 0;
  kernels::GatedActivation act_ = kernels::GatedActivation::silu;
};

}  // namespace edl::nn
