// edl/core/policy.hpp
// Policy templates: one type bundles the choices that change layout or generated code
// (storage dtype of parameters, compute and accumulation types, quantization scheme,
// rematerialization), so a model is `LlamaForCausalLM<Policy<bf16>>` rather than a list
// of positional parameters. Values that only change numbers (eps, learning rate) stay
// run-time fields of configs.
#pragma once

#include <type_traits>

#include <edl/core/dtype.hpp>

namespace edl {

namespace quant {
/// No quantization: weights are stored in the policy's parameter dtype.
struct none {
  static constexpr const char* name = "none";
  static constexpr bool quantized = false;
};
}  // namespace quant

/// A quantization scheme names itself and says whether it changes the weight layout.
template <class Q>
concept QuantScheme = requires {
  { Q::name } -> std::convertible_to<const char*>;
  { Q::quantized } -> std::convertible_to<bool>;
};

namespace remat {
/// Keep every activation for backward (JAX: everything_saveable).
struct everything_saveable { static constexpr const char* name = "everything_saveable"; };
}  // namespace remat

/// Precision and representation policy.
///  Param:   dtype parameters are stored in (f32, bf16, f16)
///  Compute: dtype activations are computed and stored in between kernels
///  Accum:   dtype of every reduction (dot products, norms, softmax sums); f32 in edl
template <FloatStorage Param = float, FloatStorage Compute = float, class Accum = float,
          QuantScheme Quant = quant::none, class Remat = remat::everything_saveable>
struct Policy {
  static_assert(std::is_same_v<Accum, float>,
                "edl::Policy: accumulation is always f32; bf16/f16 are storage types only");
  using param_t = Param;
  using compute_t = Compute;
  using accum_t = Accum;
  using quant_t = Quant;
  using remat_t = Remat;
};

template <class Pol>
concept PolicyLike = requires {
  typename Pol::param_t;
  typename Pol::compute_t;
  typename Pol::accum_t;
  typename Pol::quant_t;
  typename Pol::remat_t;
} && QuantScheme<typename Pol::quant_t>;

using DefaultPolicy = Policy<>;
/// bf16 parameters, f32 compute and accumulation: halves weight memory traffic.
using BF16ParamsPolicy = Policy<bf16, float>;

template <PolicyLike Pol, class P>
using with_param = Policy<P, typename Pol::compute_t, typename Pol::accum_t, typename Pol::quant_t,
                          typename Pol::remat_t>;
template <PolicyLike Pol, QuantScheme Q>
using with_quant = Policy<typename Pol::param_t, typename Pol::compute_t, typename Pol::accum_t, Q,
                          typename Pol::remat_t>;
template <PolicyLike Pol, class R>
using with_remat = Policy<typename Pol::param_t, typename Pol::compute_t, typename Pol::accum_t,
                          typename Pol::quant_t, R>;

}  // namespace edl
