// edl/kernels/activations.hpp
// Activations of the gated MLPs (SiLU and fused SwiGLU for Llama; GELU, tanh approximation, and
// fused GeGLU for Gemma), forward and backward, lane-wise over flat arrays of n elements.
//
//   silu(x)            = x * sigmoid(x),            sigmoid(x) = 1 / (1 + exp(-x))
//   silu'(x)           = s * (1 + x * (1 - s)),     s = sigmoid(x)
//   silu_mul(g, u)     = silu(g) * u                (SwiGLU: down(silu(gate(h)) * up(h)))
//   gelu_tanh(x)       = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = x sigmoid(2u)
//   gated_mul(act, g, u) = act(g) * u            (silu: SwiGLU; gelu_tanh: GeGLU)
//   softcap(x)         = cap tanh(x / cap),        softcap'(x) = 1 - tanh^2(x / cap)
//
// Forward kernels take f32, bf16 or f16 storage (computed in f32, rounded once); backward
// kernels are f32. Every output may alias any input of the same type (in place). Each
// element is computed by the same lane-wise instructions wherever it sits, so results do
// not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/simd.hpp>

namespace edl::kernels {

namespace detail {
/// silu'(x) = s * (1 + x * (1 - s)), with 1 - s computed without cancellation.
inline fbatch silu_grad(const fbatch& x) noexcept {
  fbatch s, oms;
  sigmoid_pair(x, s, oms);
  return s * kernels::detail::fmadd(x, oms, fbatch(1.0f));
}
/// silu(g) * u, lane-wise: silu_mul's operation, also applied serially to a range by callers
/// that must not fork (a part of an exec::PhasedRegion).
struct SiluMulOp {
  fbatch operator()(const fbatch& g, const fbatch& u) const noexcept { return g * sigmoid(g) * u; }
};
inline constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluA = 0.044715f;
/// gelu_tanh(x) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh(u)) = sigmoid(2u)
/// has no cancellation for negative x.
inline fbatch gelu_tanh(const fbatch& v) noexcept {
  const fbatch u2 = fbatch(2.0f * kGeluC) * kernels::detail::fmadd(fbatch(kGeluA) * v, v * v, v);
  return v * sigmoid(u2);
}
/// gelu_tanh'(x): with t = tanh(u), s = sigmoid(2u): 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s), so
/// gelu' = s + 2 x s (1 - s) du/dx, du/dx = sqrt(2/pi) (1 + 3 a x^2).
inline fbatch gelu_tanh_grad(const fbatch& v) noexcept {
  const fbatch v2 = v * v;
  const fbatch u2 = fbatch(2.0f * kGeluC) * kernels::detail::fmadd(fbatch(kGeluA) * v, v2, v);
  fbatch s, oms;
  sigmoid_pair(u2, s, oms);
  const fbatch du2 = fbatch(2.0f * kGeluC) * kernels::detail::fmadd(fbatch(3.0f * kGeluA), v2, fbatch(1.0f));
  return kernels::detail::fmadd(v * s * oms, du2, s);
}
/// gelu_tanh(g) * u, lane-wise (GeGLU, Gemma's MLP).
struct GeluTanhMulOp {
  fbatch operator()(const fbatch& g, const fbatch& u) const noexcept { return gelu_tanh(g) * u; }
};
}  // namespace detail

namespace detail {
/// out = op(gate, up) lane-wise, kernel `k`'s checks first: the forward of a gated activation.
template <class Op, FloatStorage T>
inline void gated_map(const char* k, Op op, const T* gate, const T* up, T* out, std::ptrdiff_t n) {
  check_size(n, k, "n");
  check_ptr(gate, n, k, "gate");
  check_ptr(up, n, k, "up");
  check_ptr(out, n, k, "out");
  map(n, op, out, gate, up);
}
}  // namespace detail

/// The activation of a gated MLP: down(act(gate x) * up x). silu: SwiGLU (Llama, Mistral, Qwen,
/// Phi-3); gelu_tanh: GeGLU with the tanh GELU (Gemma's gelu_pytorch_tanh).
enum class GatedActivation { silu, gelu_tanh };

/// y = silu(x), n elements.
template <FloatStorage T>
inline void silu(const T* x, T* y, std::ptrdiff_t n) {
  detail::check_size(n, "silu", "n");
  detail::check_ptr(x, n, "silu", "x");
  detail::check_ptr(y, n, "silu", "y");
  detail::map(n, [](const detail::fbatch& v) { return v * detail::sigmoid(v); }, y, x);
}

/// dx = dy * silu'(x).
inline void silu_backward(const float* x, const float* dy, float* dx, std::ptrdiff_t n) {
  const char* k = "silu_backward";
  detail::check_size(n, k, "n");
  detail::check_ptr(x, n, k, "x");
  detail::check_ptr(dy, n, k, "dy");
  detail::check_ptr(dx, n, k, "dx");
  detail::map(
      n, [](const detail::fbatch& v, const detail::fbatch& g) { return g * detail::silu_grad(v); },
      dx, x, dy);
}

/// out = silu(gate) * up (SwiGLU).
template <FloatStorage T>
inline void silu_mul(const T* gate, const T* up, T* out, std::ptrdiff_t n) {
  detail::gated_map("silu_mul", detail::SiluMulOp{}, gate, up, out, n);
}

/// gate[lo, hi) = silu(gate) * up over that range, on the calling thread: for callers that
/// must not fork (a part of an exec::PhasedRegion). The same bits as silu_mul.
inline void silu_mul_range(float* gate, const float* up, std::int64_t lo, std::int64_t hi) noexcept {
  detail::map_range(lo, hi, detail::SiluMulOp{}, gate, static_cast<const float*>(gate), up);
}

namespace detail {
/// The loop of a gated activation's backward, kernel `k`: step(g, u, d, dg, du) lane-wise over
/// n elements (full vectors, then the tail), in parallel.
template <class Step>
inline void gated_backward(const char* k, const float* gate, const float* up, const float* d_out, float* d_gate,
                           float* d_up, std::ptrdiff_t n, Step step) {
  check_size(n, k, "n");
  check_ptr(gate, n, k, "gate");
  check_ptr(up, n, k, "up");
  check_ptr(d_out, n, k, "d_out");
  check_ptr(d_gate, n, k, "d_gate");
  check_ptr(d_up, n, k, "d_up");
  exec::parallel_for(0, n, kParallelWork, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    std::ptrdiff_t i = lo;
    fbatch dg, du;
    for (; i + kLanes <= hi; i += kLanes) {
      step(load(gate + i), load(up + i), load(d_out + i), dg, du);
      store(d_gate + i, dg);
      store(d_up + i, du);
    }
    if (i < hi) {
      const std::ptrdiff_t m = hi - i;
      step(load_partial(gate + i, m, 0.0f), load_partial(up + i, m, 0.0f), load_partial(d_out + i, m, 0.0f), dg, du);
      store_partial(d_gate + i, dg, m);
      store_partial(d_up + i, du, m);
    }
  });
}
}  // namespace detail

/// Backward of out = silu(gate) * up:
///   d_up   = d_out * silu(gate)
///   d_gate = d_out * up * silu'(gate)
/// d_gate may alias gate or d_out, d_up may alias up or d_out.
inline void silu_mul_backward(const float* gate, const float* up, const float* d_out, float* d_gate, float* d_up,
                              std::ptrdiff_t n) {
  using detail::fbatch;
  detail::gated_backward("silu_mul_backward", gate, up, d_out, d_gate, d_up, n,
                         [](const fbatch& g, const fbatch& u, const fbatch& d, fbatch& dg, fbatch& du) {
                           fbatch s, oms;
                           detail::sigmoid_pair(g, s, oms);
                           du = d * (g * s);
                           dg = d * u * (s * kernels::detail::fmadd(g, oms, fbatch(1.0f)));
                         });
}

/// y = gelu(x), tanh approximation (PyTorch approximate="tanh", "gelu_pytorch_tanh").
template <FloatStorage T>
inline void gelu_tanh(const T* x, T* y, std::ptrdiff_t n) {
  detail::check_size(n, "gelu_tanh", "n");
  detail::check_ptr(x, n, "gelu_tanh", "x");
  detail::check_ptr(y, n, "gelu_tanh", "y");
  detail::map(n, [](const detail::fbatch& v) { return detail::gelu_tanh(v); }, y, x);
}

/// dx = dy * gelu_tanh'(x).
inline void gelu_tanh_backward(const float* x, const float* dy, float* dx, std::ptrdiff_t n) {
  const char* k = "gelu_tanh_backward";
  detail::check_size(n, k, "n");
  detail::check_ptr(x, n, k, "x");
  detail::check_ptr(dy, n, k, "dy");
  detail::check_ptr(dx, n, k, "dx");
  detail::map(
      n, [](const detail::fbatch& v, const detail::fbatch& g) { return g * detail::gelu_tanh_grad(v); }, dx, x, dy);
}

/// x[0, n) <- cap tanh(x / cap) (Gemma's soft-capping of scores and logits), on the calling
/// thread; with dfactor, dfactor[0, n) <- 1 - tanh^2, the factor its backward multiplies by.
inline void softcap_row(float* x, float* dfactor, std::ptrdiff_t n, float cap) noexcept {
  using detail::fbatch;
  const fbatch c(cap);
  for (std::ptrdiff_t i = 0; i < n; i += detail::kLanes) {
    const std::ptrdiff_t m = std::min<std::ptrdiff_t>(detail::kLanes, n - i);
    const fbatch t = xsimd::tanh(detail::load_partial(x + i, m, 0.0f) / c);
    detail::store_partial(x + i, t * c, m);
    if (dfactor) detail::store_partial(dfactor + i, fbatch(1.0f) - t * t, m);
  }
}

/// softcap_row over each of `rows` rows of `cols` values, rows in parallel (final logits).
inline void softcap_rows(float* x, std::int64_t rows, std::int64_t cols, float cap) {
  exec::parallel_for(0, rows, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::ptrdiff_t r = lo; r < hi; ++r) softcap_row(x + r * cols, nullptr, cols, cap);
  });
}

/// out = act(gate) * up: silu_mul, or GeGLU's gelu_tanh(gate) * up.
template <FloatStorage T>
inline void gated_mul(GatedActivation act, const T* gate, const T* up, T* out, std::ptrdiff_t n) {
  if (act == GatedActivation::silu) return silu_mul(gate, up, out, n);
  detail::gated_map("gated_mul", detail::GeluTanhMulOp{}, gate, up, out, n);
}

/// gate[lo, hi) = act(gate) * up over that range, on the calling thread (silu_mul_range's twin).
inline void gated_mul_range(GatedActivation act, float* gate, const float* up, std::int64_t lo, std::int64_t hi) noexcept {
  if (act == GatedActivation::silu) return silu_mul_range(gate, up, lo, hi);
  detail::map_range(lo, hi, detail::GeluTanhMulOp{}, gate, static_cast<const float*>(gate), up);
}

/// Backward of out = act(gate) * up: d_up = d_out act(gate), d_gate = d_out up act'(gate).
/// d_gate may alias gate or d_out, d_up may alias up or d_out.
inline void gated_mul_backward(GatedActivation act, const float* gate, const float* up, const float* d_out,
                               float* d_gate, float* d_up, std::ptrdiff_t n) {
  if (act == GatedActivation::silu) return silu_mul_backward(gate, up, d_out, d_gate, d_up, n);
  using detail::fbatch;
  detail::gated_backward("gated_mul_backward", gate, up, d_out, d_gate, d_up, n,
                         [](const fbatch& g, const fbatch& u, const fbatch& d, fbatch& dg, fbatch& du) {
                           du = d * detail::gelu_tanh(g);
                           dg = d * u * detail::gelu_tanh_grad(g);
                         });
}

}  // namespace edl::kernels
