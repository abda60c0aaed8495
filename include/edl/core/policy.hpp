// edl/core/policy.hpp
// Policy templates: one type bundles the choices that change layout or generated code
// (storage dtype of parameters, compute and accumulation types, quantization scheme,
// rematerialization), so a model is `LlamaForCausalLM<Policy<bf16>>` rather than a list
// of positional parameters. Values that only change numbers (eps, learning rate) stay
// run-time fields of configs.
#pragma once

#include <concepts>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/fixed_string.hpp>

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
// Rematerialization (gradient checkpointing) policies, JAX's jax.checkpoint_policies: which
// activations of a decoder layer forward keeps for backward; backward recomputes the others
// from the layer's input (which the caller always keeps) before running the layer's backward.
// Recomputation replays the same deterministic kernels, so every policy gives bitwise the
// same loss and gradients; only peak memory and step time change.
//
// Checkpoint names (JAX checkpoint_name), in forward order; each is [tokens, width] f32:
//   norm1     input_layernorm(x)                                     [T, hidden]
//   q, k, v   the q/k/v projections (q and k after rope: rope rotates
//             the projection output in place, so keeping it costs the same memory)
//   ctx       the attention core's output p.v (input of o_proj), with the per-row
//             log-sum-exp of the scores it needs ([batch, heads, seq], small)
//   attn_out  the residual stream after attention, x + o_proj(ctx)  [T, hidden]
//   norm2     post_attention_layernorm(attn_out)                     [T, hidden]
//   gate, up  the gate/up projections                                [T, intermediate]
//   act       silu(gate) * up, the input of down_proj                [T, intermediate]
// The layer's output (down_proj plus the residual) is the next layer's input, kept by the
// model under every policy, so it has no name. The [batch, heads, seq, seq] scores and
// probabilities are never stored under any policy: attention keeps only the log-sum-exp and
// its backward recomputes p from q, k (docs/modules.md).
inline constexpr Name checkpoint_names[] = {"norm1", "q", "k", "v", "ctx", "attn_out", "norm2", "gate", "up", "act"};

constexpr bool is_checkpoint_name(const Name& n) {
  for (const Name& c : checkpoint_names)
    if (c == n) return true;
  return false;
}

/// Keep every activation for backward (JAX: everything_saveable); nothing is recomputed.
struct everything_saveable {
  static constexpr const char* name = "everything_saveable";
  static constexpr bool saves(const Name&) { return true; }
};
/// Keep only each decoder layer's input; backward recomputes the layer's whole forward.
struct nothing_saveable {
  static constexpr const char* name = "nothing_saveable";
  static constexpr bool saves(const Name&) { return false; }
};
/// Keep the outputs of every matrix product: the q/k/v/o and gate/up projections and the
/// attention's p.v (ctx); recompute norms and the SwiGLU activation.
struct dots_saveable {
  static constexpr const char* name = "dots_saveable";
  static constexpr bool saves(const Name& n) {
    return n == "q" || n == "k" || n == "v" || n == "ctx" || n == "attn_out" || n == "gate" || n == "up";
  }
};
/// Keep the outputs of the products without batch dimensions, i.e. the weight projections
/// (q/k/v/o, gate/up); the attention products q.k and p.v are batched over (batch, head), so
/// ctx is not kept and backward recomputes the attention core (q.k, softmax, p.v) as well as
/// norms and activations. (q.k is never stored anyway, see above.)
struct dots_with_no_batch_dims_saveable {
  static constexpr const char* name = "dots_with_no_batch_dims_saveable";
  static constexpr bool saves(const Name& n) {
    return n == "q" || n == "k" || n == "v" || n == "attn_out" || n == "gate" || n == "up";
  }
};
/// Keep only the named activations (JAX: save_only_these_names), e.g.
/// save_only_these_names<"attn_out", "gate", "up">; at run time spelled
/// "save_only_these_names(attn_out, gate, up)" (parse below).
template <Name... Names>
struct save_only_these_names {
  static_assert((is_checkpoint_name(Names) && ...),
                "edl::remat::save_only_these_names: unknown checkpoint name (see edl::remat::checkpoint_names)");
  static constexpr const char* name = "save_only_these_names";
  static constexpr bool saves(const Name& n) { return ((n == Names) || ...); }
};

/// Keep every activation but the named ones (JAX: save_anything_except_these_names, also
/// spelled save_any_names_but_these), e.g. save_anything_except_these_names<"gate", "up">; at
/// run time "save_anything_except_these_names(gate, up)".
template <Name... Names>
struct save_anything_except_these_names {
  static_assert((is_checkpoint_name(Names) && ...),
                "edl::remat::save_anything_except_these_names: unknown checkpoint name (see edl::remat::checkpoint_names)");
  static constexpr const char* name = "save_anything_except_these_names";
  static constexpr bool saves(const Name& n) { return !((n == Names) || ...); }
};
template <Name... Names>
using save_any_names_but_these = save_anything_except_these_names<Names...>;

template <class R>
concept RematPolicy = requires(const Name& n) {
  { R::name } -> std::convertible_to<const char*>;
  { R::saves(n) } -> std::same_as<bool>;
};

/// Keep what either policy keeps (JAX: save_from_both_policies), e.g.
/// save_from_both_policies<dots_with_no_batch_dims_saveable, save_only_these_names<"act">>; at
/// run time "save_from_both_policies(dots_with_no_batch_dims_saveable, save_only_these_names(act))".
template <RematPolicy A, RematPolicy B>
struct save_from_both_policies {
  static constexpr const char* name = "save_from_both_policies";
  static constexpr bool saves(const Name& n) { return A::saves(n) || B::saves(n); }
};

/// The checkpoint names a policy does not keep, as bits (bit i: checkpoint_names[i]): how a
/// decoder layer applies a policy, whether it is a type (dropped_by<R>) or spelled at run time
/// (parse).
using DropMask = std::uint32_t;
template <RematPolicy R>
constexpr DropMask dropped_by() {
  DropMask bits = 0;
  for (std::size_t i = 0; i < std::size(checkpoint_names); ++i)
    if (!R::saves(checkpoint_names[i])) bits |= DropMask{1} << i;
  return bits;
}

/// The plain run-time names (TrainingArguments.gradient_checkpointing, edl bench train
/// --remat); JAX's checkpoint_dots and checkpoint_dots_with_no_batch_dims are accepted as the
/// other names of dots_saveable and dots_with_no_batch_dims_saveable (jax.checkpoint_policies).
inline constexpr const char* runtime_names[] = {"everything_saveable", "nothing_saveable", "dots_saveable",
                                                "dots_with_no_batch_dims_saveable"};
/// The policies that take arguments at run time, spelled as their JAX calls.
inline constexpr const char* runtime_calls[] = {"save_only_these_names(NAME, ...)",
                                                "save_anything_except_these_names(NAME, ...)",
                                                "save_any_names_but_these(NAME, ...)",
                                                "save_from_both_policies(POLICY, POLICY)"};

namespace detail {
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}
/// The comma-separated arguments of a call's parentheses, split at top level only.
inline std::vector<std::string_view> split_arguments(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    else if (s[i] == ')') --depth;
    else if (s[i] == ',' && depth == 0) {
      out.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  out.push_back(trim(s.substr(start)));
  return out;
}
}  // namespace detail

/// The policy spelled `text` at run time, as the names it drops: "" and "none" (keep
/// everything), runtime_names and JAX's other spellings of them, and the calls
/// save_only_these_names(attn_out, gate), save_anything_except_these_names(gate, up) (also
/// save_any_names_but_these) over checkpoint_names, and save_from_both_policies(p, q) of any
/// two spellings (a name is kept if either keeps it). Equals dropped_by of the same policy
/// type. Errors (errc `code`, naming `where`) say what was expected.
inline DropMask parse(std::string_view text, const std::string& where = "remat", errc code = errc::invalid_argument) {
  const std::string_view t = detail::trim(text);
  if (t.empty() || t == "none" || t == "everything_saveable") return dropped_by<everything_saveable>();
  if (t == "nothing_saveable") return dropped_by<nothing_saveable>();
  if (t == "dots_saveable" || t == "checkpoint_dots") return dropped_by<dots_saveable>();
  if (t == "dots_with_no_batch_dims_saveable" || t == "checkpoint_dots_with_no_batch_dims")
    return dropped_by<dots_with_no_batch_dims_saveable>();
  const auto expected = [] {
    std::string v = "\"\", none";
    for (const char* n : runtime_names) v += std::string(", ") + n;
    for (const char* n : runtime_calls) v += std::string(", ") + n;
    return v;
  };
  const std::size_t open = t.find('(');
  EDL_CHECK(open != std::string_view::npos && t.back() == ')', code, where, "expected one of ", expected(),
            "; found \"", t, "\"");
  const std::string_view fn = detail::trim(t.substr(0, open));
  const std::vector<std::string_view> args = detail::split_arguments(t.substr(open + 1, t.size() - open - 2));
  if (fn == "save_from_both_policies") {
    EDL_CHECK(args.size() == 2 && !args[0].empty() && !args[1].empty(), code, where,
              "save_from_both_policies takes two policies, found \"", t, "\"");
    return parse(args[0], where, code) & parse(args[1], where, code);  // dropped only where both drop
  }
  const bool only = fn == "save_only_these_names";
  EDL_CHECK(only || fn == "save_anything_except_these_names" || fn == "save_any_names_but_these", code, where,
            "expected one of ", expected(), "; found \"", t, "\"");
  DropMask named = 0;
  for (std::string_view a : args) {
    if (a.size() >= 2 && (a.front() == '"' || a.front() == '\'') && a.back() == a.front()) a = a.substr(1, a.size() - 2);
    std::size_t i = 0;
    while (i < std::size(checkpoint_names) && checkpoint_names[i].view() != a) ++i;
    if (i == std::size(checkpoint_names)) {
      std::string names;
      for (const Name& n : checkpoint_names) names += (names.empty() ? "" : ", ") + std::string(n.view());
      ::edl::detail::raise(code, where,
                           ::edl::detail::concat(fn, ": \"", a, "\" is not a checkpoint name (", names, ")"));
    }
    named |= DropMask{1} << i;
  }
  const DropMask all = dropped_by<nothing_saveable>();
  return only ? all & ~named : named;
}

/// Whether mask d drops the activation called N, e.g. drops<"norm1">(d) (an unknown name does
/// not compile).
template <Name N>
constexpr bool drops(DropMask d) noexcept {
  static_assert(is_checkpoint_name(N), "edl::remat::drops: unknown checkpoint name (see edl::remat::checkpoint_names)");
  std::size_t i = 0;
  while (!(checkpoint_names[i] == N)) ++i;
  return (d >> i) & 1u;
}
}  // namespace remat

/// Precision and representation policy.
///  Param:   dtype parameters are stored in (f32, bf16, f16)
///  Compute: dtype of the activations between kernels (f32 storage holding Compute's values:
///           each kernel's result is rounded to it, nn::round_activations)
///  Accum:   dtype of every reduction (dot products, norms, softmax sums); f32 in edl
///  Quant:   weight quantization scheme
///  Remat:   which activations forward keeps for backward (remat:: above)
template <FloatStorage Param = float, FloatStorage Compute = float, class Accum = float,
          QuantScheme Quant = quant::none, remat::RematPolicy Remat = remat::everything_saveable>
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
} && QuantScheme<typename Pol::quant_t> && remat::RematPolicy<typename Pol::remat_t>;

using DefaultPolicy = Policy<>;
/// bf16 parameters, f32 compute and accumulation: halves weight memory traffic.
using BF16ParamsPolicy = Policy<bf16, float>;
/// f16 parameters (the seeds' `half()`), f32 compute and accumulation. f16 keeps 3 more
/// mantissa bits than bf16 but overflows past 65504: for weights that are known to fit.
using F16ParamsPolicy = Policy<f16, float>;
/// f32 parameters, bf16 activations (the seeds' dtype=bfloat16), f32 accumulation: the values
/// a bf16 run computes, with every kernel in f32 (docs/modules.md, "Compute dtype").
using BF16ComputePolicy = Policy<float, bf16>;
/// bf16 parameters and bf16 activations, f32 accumulation.
using BF16Policy = Policy<bf16, bf16>;

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
