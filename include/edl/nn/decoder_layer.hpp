// edl/nn/decoder_layer.hpp
// One pre-norm Llama decoder layer (HF LlamaDecoderLayer):
//   h = x + attn(input_layernorm(x))
//   y = h + mlp(post_attention_layernorm(h))
// or, for a mixture-of-experts layer (HF MixtralDecoderLayer, DecoderLayerConfig::moe set),
//   y = h + block_sparse_moe(post_attention_layernorm(h))
// or, with sandwich norms (HF Gemma2/Gemma3DecoderLayer, DecoderLayerConfig::sandwich_norms),
//   h = x + attn_output_norm(attn(input_layernorm(x)))
//   y = h + mlp_output_norm(mlp(post_attention_layernorm(h)))
// where HF names the norms input_layernorm, post_attention_layernorm (attn_output_norm here),
// pre_feedforward_layernorm (post_attention_layernorm here: the norm before the MLP in every
// family) and post_feedforward_layernorm (mlp_output_norm); their outputs' inputs (the attention's
// and the MLP's outputs) are kept under every remat policy.
// Saved: norm outputs, h, and the sub-modules' Saved (x itself stays with the caller).
//
// Gradient checkpointing: forward keeps only the activations the remat policy saves
// (Pol::remat_t, or forward<R> for one call; core/policy.hpp names them); backward first
// recomputes the others from x with forward's kernels -- bitwise the same values -- then runs
// the layer's backward, then frees the recomputed ones again, so at most one layer's full set
// of activations is alive at a time. everything_saveable keeps all and recomputes nothing.
// A mixture-of-experts block keeps its routing and its experts' activations under every
// policy (the gate/up/act names are the dense MLP's); the norms and attention follow it.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/kernels/activations.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/nn/attention.hpp>
#include <edl/nn/mlp.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/moe.hpp>
#include <edl/nn/rms_norm.hpp>

namespace edl::nn {

struct DecoderLayerConfig {
  AttentionConfig attention;
  std::int64_t intermediate = 0;
  bool mlp_bias = false;
  double rms_norm_eps = 1e-6;
  std::optional<MoeConfig> moe;  // set: a sparse mixture-of-experts block instead of the MLP
  bool sandwich_norms = false;   // Gemma: norms on the attention's and the MLP's outputs too
  float norm_offset = 0;         // Gemma: every norm scales by (1 + w)
  kernels::GatedActivation activation = kernels::GatedActivation::silu;
};

/// What a decoder layer runs between its modules on one device: nothing. A device of a mesh
/// passes its own (models::ShardedLlama's), which gathers the attention's input over sp, takes
/// its rows back from the attention's output and sums the row-parallel outputs over tp. The
/// layer's code is the same on both; only these calls differ.
struct LocalLayer {
  /// This device's rows of the layer (the attention runs over the layout's, which a mesh
  /// widens to the whole sequence).
  std::int64_t tokens(const TokenLayout& layout) const noexcept { return layout.tokens(); }
  /// The attention's input: n1 itself (a mesh gathers it over sp into `gathered`).
  const float* attention_input(const std::vector<float>& n1, std::vector<float>& /*gathered*/) const noexcept {
    return n1.data();
  }
  /// out [tokens, hidden] = the attention's output, which run(dst) writes for the attention's
  /// rows (a mesh: into its own buffer, then this device's rows summed over tp).
  template <class Run>
  void attention_output(float* out, std::size_t /*n*/, Run&& run) const {
    run(out);
  }
  /// dn1 [tokens, hidden] = d(attention input) from d(attention output), through
  /// run(d output, d input) over the attention's rows.
  template <class Run>
  void attention_backward(const float* dout, float* dn1, std::size_t /*n*/, Run&& run) const {
    run(dout, dn1);
  }
  /// The MLP's output, and its input gradient: summed over tp on a mesh.
  void sum_row_parallel(float* /*y*/, std::size_t /*n*/) const noexcept {}
  /// The experts' dispatch of a mixture-of-experts layer (an ep mesh's; none here).
  std::nullptr_t experts() const noexcept { return nullptr; }
};

template <class Pol>
class DecoderLayer {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  struct Saved {
    typename RMSNorm<Pol>::Saved norm1_s, norm2_s, attn_out_norm_s, mlp_out_norm_s;
    typename Attention<Pol>::Saved attn_s;
    typename MLP<Pol>::Saved mlp_s;
    typename MoE<Pol>::Saved moe_s;
    std::vector<float> n1, h, n2;  // [T, hidden]
    std::vector<float> g;          // on an sp mesh: n1 gathered over the sequence, the attention's input
    std::vector<float> ao, mo;     // sandwich norms: the attention's and the MLP's outputs [T, hidden]
    const float* x = nullptr;      // the layer's input, owned by the caller
    std::int64_t tokens = 0;
    std::uint32_t dropped = 0;     // bit i: remat::checkpoint_names[i] was not kept
  };

  /// The checkpoint names R does not keep, as Saved::dropped bits (remat::dropped_by).
  template <remat::RematPolicy R>
  static constexpr std::uint32_t dropped_by() {
    return remat::dropped_by<R>();
  }

  DecoderLayer() = default;
  explicit DecoderLayer(const DecoderLayerConfig& c)
      : input_layernorm(c.attention.hidden, c.rms_norm_eps, c.norm_offset),
        self_attn(c.attention),
        post_attention_layernorm(c.attention.hidden, c.rms_norm_eps, c.norm_offset),
        hidden_(c.attention.hidden) {
    if (c.moe) block_sparse_moe = MoE<Pol>(*c.moe);
    else mlp = MLP<Pol>(c.attention.hidden, c.intermediate, c.mlp_bias, c.activation);
    sparse_ = c.moe.has_value();
    sandwich_ = c.sandwich_norms;
    EDL_CHECK(!(sandwich_ && sparse_), errc::unsupported, "nn.DecoderLayer",
              "sandwich norms around a mixture-of-experts block are not supported");
    if (sandwich_) {
      attn_output_norm = RMSNorm<Pol>(c.attention.hidden, c.rms_norm_eps, c.norm_offset);
      mlp_output_norm = RMSNorm<Pol>(c.attention.hidden, c.rms_norm_eps, c.norm_offset);
    }
  }

  RMSNorm<Pol> input_layernorm;
  Attention<Pol> self_attn;
  RMSNorm<Pol> post_attention_layernorm;
  MLP<Pol> mlp;                 // empty in a mixture-of-experts layer
  MoE<Pol> block_sparse_moe;    // empty in a dense layer
  RMSNorm<Pol> attn_output_norm, mlp_output_norm;  // sandwich norms; empty without

  /// A mixture-of-experts layer (block_sparse_moe in place of mlp).
  bool is_sparse() const noexcept { return sparse_; }
  /// Norms on the attention's and the MLP's outputs (Gemma).
  bool has_sandwich_norms() const noexcept { return sandwich_; }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    input_layernorm.visit_params(join_path(prefix, "input_layernorm"), f);
    self_attn.visit_params(join_path(prefix, "self_attn"), f);
    if (sandwich_) {  // HF Gemma's names
      attn_output_norm.visit_params(join_path(prefix, "post_attention_layernorm"), f);
      post_attention_layernorm.visit_params(join_path(prefix, "pre_feedforward_layernorm"), f);
    } else {
      post_attention_layernorm.visit_params(join_path(prefix, "post_attention_layernorm"), f);
    }
    if (sparse_) block_sparse_moe.visit_params(join_path(prefix, moe_name()), f);
    else mlp.visit_params(join_path(prefix, "mlp"), f);
    if (sandwich_) mlp_output_norm.visit_params(join_path(prefix, "post_feedforward_layernorm"), f);
  }
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    self_attn.visit_linears(join_path(prefix, "self_attn"), f);
    if (sparse_) block_sparse_moe.visit_linears(join_path(prefix, moe_name()), f);
    else mlp.visit_linears(join_path(prefix, "mlp"), f);
  }
  std::int64_t param_count() const noexcept {
    return input_layernorm.param_count() + self_attn.param_count() + post_attention_layernorm.param_count() +
           (sparse_ ? block_sparse_moe.param_count() : mlp.param_count()) +
           (sandwich_ ? attn_output_norm.param_count() + mlp_output_norm.param_count() : 0);
  }
  /// What runs: with experts, the router and k experts per token.
  double flops_forward(std::int64_t batch, std::int64_t seq) const noexcept {
    return self_attn.flops_forward(batch, seq) +
           (sparse_ ? block_sparse_moe.flops_forward(batch * seq) : mlp.flops_forward(batch * seq));
  }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  /// y [T, hidden]; keeps what the remat policy R saves (default: the policy's), or what a
  /// policy spelled at run time keeps (`drop`: remat::parse's bits). `between` runs what a mesh
  /// needs between the modules (LocalLayer: nothing).
  template <remat::RematPolicy R = typename Pol::remat_t, class Between = LocalLayer>
  void forward(const float* x, const TokenLayout& layout, float* y, Saved& s,
               remat::DropMask drop = remat::dropped_by<R>(), const Between& between = {}) const {
    const std::int64_t T = between.tokens(layout);
    const std::size_t n = static_cast<std::size_t>(T * hidden_);
    s.x = x;
    s.tokens = T;
    s.dropped = 0;
    s.n1.resize(n);
    s.h.resize(n);
    s.n2.resize(n);
    input_layernorm.forward(x, T, s.n1.data(), s.norm1_s);
    const float* attn_in = between.attention_input(s.n1, s.g);
    // The attention's and the MLP's outputs end in a row-parallel projection: rounded to the
    // compute dtype once a mesh has summed them over tp, as are the residual sums.
    float* attn_out = sandwich_ ? (s.ao.resize(n), s.ao.data()) : s.h.data();
    between.attention_output(attn_out, n, [&](float* dst) { self_attn.forward(attn_in, layout, dst, s.attn_s); });
    round_activations<Pol>(attn_out, n);
    if (sandwich_) attn_output_norm.forward(s.ao.data(), T, s.h.data(), s.attn_out_norm_s);
    kernels::add_inplace(s.h.data(), x, static_cast<std::ptrdiff_t>(n));
    round_activations<Pol>(s.h);
    post_attention_layernorm.forward(s.h.data(), T, s.n2.data(), s.norm2_s);
    float* mlp_out = !sparse_ && sandwich_ ? (s.mo.resize(n), s.mo.data()) : y;
    if (sparse_) block_sparse_moe.forward(s.n2.data(), T, mlp_out, s.moe_s, between.experts());
    else mlp.forward(s.n2.data(), T, mlp_out, s.mlp_s);
    between.sum_row_parallel(mlp_out, n);
    round_activations<Pol>(mlp_out, n);
    if (mlp_out != y) mlp_output_norm.forward(s.mo.data(), T, y, s.mlp_out_norm_s);
    kernels::add_inplace(y, s.h.data(), static_cast<std::ptrdiff_t>(n));
    round_activations<Pol>(y, n);
    release(s, drop);
  }
  void apply(const float* x, const TokenLayout& layout, float* y) const {
    Saved s;
    forward<remat::everything_saveable>(x, layout, y, s);
  }

  /// Accumulates every parameter gradient; writes dx [T, hidden] (dx must not alias dy).
  /// Recomputes what forward did not keep first (the caller still holds x), and frees it
  /// after, so `s` is left as forward left it. `between` must be forward's.
  template <class Between = LocalLayer>
  void backward(const float* dy, Saved& s, float* dx, const Between& between = {}) {
    const std::uint32_t dropped = s.dropped;
    rematerialize(s, between);
    const std::size_t n = s.h.size();
    std::vector<float> a(n), dh(dy, dy + n), b;
    if (sparse_) {
      block_sparse_moe.backward(dy, s.moe_s, a.data(), between.experts());  // d n2
    } else if (sandwich_) {
      b.resize(n);
      mlp_output_norm.backward(dy, s.mlp_out_norm_s, b.data());  // d mo
      mlp.backward(b.data(), s.mlp_s, a.data());
    } else {
      mlp.backward(dy, s.mlp_s, a.data());
    }
    between.sum_row_parallel(a.data(), n);
    post_attention_layernorm.backward(a.data(), s.norm2_s, a.data());  // d h (via the norm)
    kernels::add_inplace(dh.data(), a.data(), static_cast<std::ptrdiff_t>(n));
    const float* dattn = dh.data();
    if (sandwich_) {
      b.resize(n);
      attn_output_norm.backward(dh.data(), s.attn_out_norm_s, b.data());  // d ao
      dattn = b.data();
    }
    between.attention_backward(dattn, a.data(), n, [&](const float* dout, float* din) {
      self_attn.backward(dout, s.attn_s, din);  // d n1
    });
    input_layernorm.backward(a.data(), s.norm1_s, dx);  // d x (via the norm)
    kernels::add_inplace(dx, dh.data(), static_cast<std::ptrdiff_t>(n));
    round_activations<Pol>(dx, n);  // the residual stream's gradient, as its values
    release(s, dropped);
  }

 private:
  /// Frees what drop names (the layer's checkpoint names, remat::checkpoint_names), as forward
  /// does under a remat policy; backward recomputes it.
  static void release(Saved& s, remat::DropMask d) {
    using remat::drops;
    if (drops<"norm1">(d)) {
      std::vector<float>().swap(s.n1);
      std::vector<float>().swap(s.g);
    }
    Attention<Pol>::release(s.attn_s, drops<"q">(d), drops<"k">(d), drops<"v">(d), drops<"ctx">(d));
    if (drops<"attn_out">(d)) std::vector<float>().swap(s.h);
    if (drops<"norm2">(d)) std::vector<float>().swap(s.n2);
    MLP<Pol>::release(s.mlp_s, drops<"gate">(d), drops<"up">(d), drops<"act">(d));
    s.dropped = d;
  }

  /// Recomputes, in forward order and with forward's calls between the modules, every
  /// activation forward dropped; each step reads only values that were kept or are already
  /// recomputed, so all equal forward's bit for bit (on a mesh every device runs the same
  /// steps, so the collectives pair up).
  template <class Between>
  void rematerialize(Saved& s, const Between& between) const {
    using remat::drops;
    const std::uint32_t d = s.dropped;
    if (d == 0) return;
    EDL_CHECK(s.x != nullptr, errc::invalid_argument, "nn.DecoderLayer.backward",
              "Saved holds no input: call forward first");
    const std::int64_t T = s.tokens;
    const std::size_t n = static_cast<std::size_t>(T * hidden_);
    if (drops<"norm1">(d)) {
      s.n1.resize(n);
      input_layernorm.forward(s.x, T, s.n1.data(), s.norm1_s);
    }
    const float* attn_in = drops<"norm1">(d) ? between.attention_input(s.n1, s.g) : s.g.empty() ? s.n1.data() : s.g.data();
    self_attn.rematerialize(attn_in, s.attn_s, drops<"q">(d), drops<"k">(d), drops<"v">(d), drops<"ctx">(d));
    if (drops<"attn_out">(d)) {
      s.h.resize(n);
      if (sandwich_) {  // the attention's output ao is kept: h = x + norm(ao)
        attn_output_norm.forward(s.ao.data(), T, s.h.data(), s.attn_out_norm_s);
      } else {
        between.attention_output(s.h.data(), n, [&](float* dst) {
          self_attn.o_proj.forward(s.attn_s.ctx.data(), s.attn_s.batch * s.attn_s.seq, dst, s.attn_s.o_s);
        });
        round_activations<Pol>(s.h);
      }
      kernels::add_inplace(s.h.data(), s.x, static_cast<std::ptrdiff_t>(n));
      round_activations<Pol>(s.h);
    }
    if (drops<"norm2">(d)) {
      s.n2.resize(n);
      post_attention_layernorm.forward(s.h.data(), T, s.n2.data(), s.norm2_s);
    }
    s.norm2_s.x = s.h.data();
    if (sparse_) MoE<Pol>::point_at(s.moe_s, s.n2.data());  // the experts keep their own inputs
    else mlp.rematerialize(s.n2.data(), T, s.mlp_s, drops<"gate">(d), drops<"up">(d), drops<"act">(d));
    s.dropped = 0;
  }

  /// HF's module name of the block: Mixtral's block_sparse_moe, Qwen-MoE's mlp.
  const char* moe_name() const noexcept {
    return block_sparse_moe.config().names == MoeConfig::Names::qwen ? "mlp" : "block_sparse_moe";
  }

  std::int64_t hidden_ = 0;
  bool sparse_ = false, sandwich_ = false;
};

}  // namespace edl::nn
