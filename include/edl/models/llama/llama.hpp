// edl/models/llama/llama.hpp
// Llama on one device, with a hand-derived backward (docs/modules.md):
//   LlamaModel:        embed_tokens -> num_hidden_layers x DecoderLayer -> norm   (HF LlamaModel)
//   LlamaForCausalLM:  LlamaModel -> lm_head, tie_word_embeddings honoured        (HF names)
//
//   models::LlamaForCausalLM<> m(cfg);
//   m.init(Key::from_seed(0));                       // or nn::load_params(m, safetensors_file)
//   nn::TokenLayout lay{batch, seq};
//   auto metrics = m.forward_backward(ids, lay);     // labels = ids (HF shift inside); grads +=
//   m.logits(ids, lay, out);                          // [batch*seq, vocab]
//
// Gradient checkpointing: Pol::remat_t (core/policy.hpp) picks what each decoder layer keeps
// for backward, e.g. LlamaForCausalLM<with_remat<DefaultPolicy, remat::nothing_saveable>>;
// forward<R> / forward_backward<R> override it for one call, and so does a policy spelled at
// run time (remat::parse(gradient_checkpointing) gives the mask `drop` the layers take). Every
// policy gives bitwise the same loss and gradients.
//
// Mixtral (config().is_moe()): with output_router_logits, loss() and forward_backward() add
// router_aux_loss_coef x the load-balancing loss over every layer's routing (padding excluded
// through the layout's attention_mask) and router_z_loss_coef x the router z-loss, as
// MixtralForCausalLM does when given labels; LossMetrics::aux_loss and router_z_loss report
// them unscaled. With LossOptions::normalizer (micro-batches of one step), a micro-batch's
// router terms weigh valid / normalizer, so the step's sum is their token-weighted mean.
//
// With tied embeddings there is no lm_head parameter: the head reads
// model.embed_tokens.weight and its gradient is added to the embedding's (both paths sum).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/fused_checkpoint.hpp>
#include <edl/nn/decoder_layer.hpp>
#include <edl/nn/embedding.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/loss.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/quantize.hpp>
#include <edl/nn/rms_norm.hpp>

namespace edl::models {

/// nn::RopeConfig from the HF fields; layer l's (Gemma's sliding layers rotate with
/// rope_local_base_freq and no scaling; -1: the model's global rope).
inline nn::RopeConfig rope_config(const LlamaConfig& c, std::int64_t l = -1) {
  nn::RopeConfig r;
  r.theta = c.rope_theta;
  r.max_position_embeddings = static_cast<double>(c.max_position_embeddings);
  if (l >= 0 && c.layer_has_local_rope(l)) {
    r.theta = c.extra_number("rope_local_base_freq", 10000.0);
    return r;
  }
  if (c.rope_scaling && c.rope_scaling->rope_type != "default") {
    const RopeScaling& s = *c.rope_scaling;
    r.type = s.rope_type;
    r.factor = s.factor;
    r.low_freq_factor = s.low_freq_factor;
    r.high_freq_factor = s.high_freq_factor;
    r.original_max_position_embeddings = static_cast<double>(c.rope_original_max());
    if (s.rope_type == "longrope" && !s.has_factor)  // Phi-3: the ratio of the two contexts
      r.factor = r.max_position_embeddings / r.original_max_position_embeddings;
    r.attention_factor = s.attention_factor.value_or(0.0);
    r.beta_fast = s.beta_fast.value_or(32.0);
    r.beta_slow = s.beta_slow.value_or(1.0);
    r.mscale = s.mscale.value_or(0.0);
    r.mscale_all_dim = s.mscale_all_dim.value_or(0.0);
    r.truncate = s.truncate;
    r.short_factor = s.short_factor;
    r.long_factor = s.long_factor;
  }
  return r;
}

/// Layer l's config (a mixture-of-experts block where c.layer_is_sparse(l)).
/// The mixture-of-experts block of a sparse layer of c (every sparse layer has the same).
inline nn::MoeConfig moe_config(const LlamaConfig& c) {
  return nn::MoeConfig{.hidden = c.hidden_size,
                       .intermediate = c.expert_intermediate_size(),
                       .num_experts = c.num_local_experts,
                       .top_k = c.num_experts_per_tok,
                       .norm_topk_prob = c.qwen_moe() ? c.norm_topk_prob : true,
                       .shared_intermediate = c.shared_expert_size(),
                       .names = c.qwen_moe() ? nn::MoeConfig::Names::qwen : nn::MoeConfig::Names::mixtral,
                       .router_jitter_noise = c.router_jitter_noise};
}

inline nn::DecoderLayerConfig decoder_layer_config(const LlamaConfig& c, std::int64_t l = 0) {
  nn::DecoderLayerConfig d;
  d.attention.hidden = c.hidden_size;
  d.attention.num_heads = c.num_attention_heads;
  d.attention.num_kv_heads = c.num_key_value_heads;
  d.attention.head_dim = c.head_size();
  d.attention.qkv_bias = c.qkv_bias();
  d.attention.o_bias = c.o_bias();
  d.attention.sliding_window = c.layer_window(l);
  d.attention.rope = rope_config(c, l);
  d.attention.qk_norm = c.qk_norm();
  d.attention.qk_norm_eps = c.rms_norm_eps;
  d.attention.qk_norm_offset = c.norm_offset();
  d.attention.query_scale = c.query_scale();
  d.attention.softcap = c.attn_softcap();
  d.intermediate = c.intermediate_size;
  d.mlp_bias = c.mlp_bias;
  d.rms_norm_eps = c.rms_norm_eps;
  d.sandwich_norms = c.sandwich_norms();
  d.norm_offset = c.norm_offset();
  d.activation = c.is_gemma() ? kernels::GatedActivation::gelu_tanh : kernels::GatedActivation::silu;
  if (c.layer_is_sparse(l)) d.moe = moe_config(c);
  return d;
}

template <class Pol = DefaultPolicy>
class LlamaModel {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  struct Saved {
    typename nn::Embedding<Pol>::Saved embed_s;
    std::vector<std::vector<float>> hs;  // hs[l]: input of layer l; hs[L]: input of the final norm
    std::vector<typename nn::DecoderLayer<Pol>::Saved> layer_s;
    typename nn::RMSNorm<Pol>::Saved norm_s;
    std::int64_t tokens = 0;
    bool from_embeds = false;        // the batch came as TokenLayout::inputs_embeds
    float* embeds_grad = nullptr;    // TokenLayout::inputs_embeds_grad
  };

  LlamaModel() = default;
  explicit LlamaModel(const LlamaConfig& c)
      : embed_tokens(c.vocab_size, c.hidden_size), norm(c.hidden_size, c.rms_norm_eps, c.norm_offset()), cfg_(c) {
    c.validate();
    layers.reserve(static_cast<std::size_t>(c.num_hidden_layers));
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) layers.emplace_back(decoder_layer_config(c, l));
  }

  nn::Embedding<Pol> embed_tokens;
  std::vector<nn::DecoderLayer<Pol>> layers;
  nn::RMSNorm<Pol> norm;

  const LlamaConfig& config() const noexcept { return cfg_; }

  /// What the embeddings are multiplied by (Gemma: sqrt(hidden_size) rounded to the weights'
  /// type, as HF casts it; else 1).
  float embed_scale() const noexcept {
    return to_f32(from_f32<typename Pol::param_t>(static_cast<float>(cfg_.embed_scale())));
  }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    embed_tokens.visit_params(nn::join_path(prefix, "embed_tokens"), f);
    for (std::size_t l = 0; l < layers.size(); ++l)
      layers[l].visit_params(nn::join_path(prefix, "layers." + std::to_string(l)), f);
    norm.visit_params(nn::join_path(prefix, "norm"), f);
  }
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    for (std::size_t l = 0; l < layers.size(); ++l)
      layers[l].visit_linears(nn::join_path(prefix, "layers." + std::to_string(l)), f);
  }
  std::int64_t param_count() const noexcept {
    std::int64_t n = embed_tokens.param_count() + norm.param_count();
    for (const auto& l : layers) n += l.param_count();
    return n;
  }
  double flops_forward(std::int64_t batch, std::int64_t seq) const noexcept {
    double f = 0;
    for (const auto& l : layers) f += l.flops_forward(batch, seq);
    return f;
  }
  void init(Key key, float std = -1.0f) {
    nn::init_params(*this, key, std >= 0 ? std : static_cast<float>(cfg_.initializer_range));
  }

  /// hidden [T, hidden_size] after the final norm; the layers keep what R saves (or what a
  /// policy spelled at run time keeps: `drop`, remat::parse's bits).
  template <remat::RematPolicy R = typename Pol::remat_t>
  void forward(const std::int64_t* ids, const nn::TokenLayout& layout, float* hidden, Saved& s,
               remat::DropMask drop = remat::dropped_by<R>()) const {
    const std::int64_t T = layout.tokens(), H = cfg_.hidden_size;
    const std::size_t L = layers.size();
    s.tokens = T;
    s.hs.resize(L + 1);
    s.layer_s.resize(L);
    for (auto& h : s.hs) h.resize(static_cast<std::size_t>(T * H));
    s.embeds_grad = layout.inputs_embeds_grad;
    s.from_embeds = layout.inputs_embeds != nullptr;
    if (s.from_embeds) {
      std::copy(layout.inputs_embeds, layout.inputs_embeds + T * H, s.hs[0].data());
      s.embed_s.ids.clear();
    } else {
      EDL_CHECK(ids != nullptr, errc::invalid_argument, "LlamaModel.forward", "needs token ids or inputs_embeds");
      embed_tokens.forward(ids, T, s.hs[0].data(), s.embed_s);
    }
    if (const float e = embed_scale(); e != 1.0f) kernels::scale(s.hs[0].data(), e, static_cast<std::ptrdiff_t>(T * H));
    nn::round_activations<Pol>(s.hs[0]);
    for (std::size_t l = 0; l < L; ++l) layers[l].forward(s.hs[l].data(), layout, s.hs[l + 1].data(), s.layer_s[l], drop);
    norm.forward(s.hs[L].data(), T, hidden, s.norm_s);
  }

  /// Accumulates every gradient from dhidden [T, hidden_size].
  void backward(const float* dhidden, Saved& s) {
    const std::size_t n = static_cast<std::size_t>(s.tokens * cfg_.hidden_size);
    std::vector<float> a(n), b(n);
    norm.backward(dhidden, s.norm_s, a.data());
    for (std::size_t l = layers.size(); l-- > 0;) {
      layers[l].backward(a.data(), s.layer_s[l], b.data());
      std::swap(a, b);
    }
    if (const float e = embed_scale(); e != 1.0f) kernels::scale(a.data(), e, static_cast<std::ptrdiff_t>(n));
    if (!s.from_embeds) embed_tokens.backward(a.data(), s.embed_s);
    else if (s.embeds_grad) kernels::add_inplace(s.embeds_grad, a.data(), static_cast<std::ptrdiff_t>(n));
  }

 private:
  LlamaConfig cfg_;
};

template <class Pol = DefaultPolicy>
class LlamaForCausalLM {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  using T = typename Pol::param_t;
  struct Saved {
    typename LlamaModel<Pol>::Saved model_s;
    std::vector<float> hidden;  // [T, hidden_size]
    std::int64_t batch = 0, seq = 0;
  };

  LlamaForCausalLM() = default;
  explicit LlamaForCausalLM(const LlamaConfig& c) : model(c), tied_(c.tie_word_embeddings) {
    if (!tied_) lm_head = nn::ColumnLinear<Pol>(c.hidden_size, c.vocab_size, false);
  }

  LlamaModel<Pol> model;
  nn::ColumnLinear<Pol> lm_head;  // unused (empty) when tied

  const LlamaConfig& config() const noexcept { return model.config(); }
  bool tied() const noexcept { return tied_; }
  /// Where the weight of Linear `linear_path` lives in a checkpoint that fuses it with others
  /// (Phi-3's qkv_proj, gate_up_proj): the fused tensor and the Linear's rows in it; nullopt
  /// when it is stored as itself. PEFT adapters of the model follow the same layout
  /// (lora/peft.hpp).
  std::optional<FusedSlice> fused_weight(const std::string& linear_path) const {
    return fused_slice(config(), linear_path + ".weight");
  }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    model.visit_params(nn::join_path(prefix, "model"), f);
    if (!tied_) lm_head.visit_params(nn::join_path(prefix, "lm_head"), f);
  }
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    model.visit_linears(nn::join_path(prefix, "model"), f);
    if (!tied_) lm_head.visit_linears(nn::join_path(prefix, "lm_head"), f);
  }
  std::int64_t param_count() const noexcept { return model.param_count() + (tied_ ? 0 : lm_head.param_count()); }
  double flops_forward(std::int64_t batch, std::int64_t seq) const noexcept {
    return static_cast<double>(batch * seq) * flops_per_token(seq);
  }
  /// Random weights (then quantized when the policy names a format).
  void init(Key key, float std = -1.0f) {
    nn::init_params(*this, key, std >= 0 ? std : static_cast<float>(config().initializer_range));
    quantize_as_policy();
  }
  /// Quantizes the decoder's Linears to the policy's format (quant::none: nothing to do).
  void quantize_as_policy() {
    if constexpr (Pol::quant_t::quantized) {
      nn::QuantizationConfig q;
      q.method = quant::format_of<typename Pol::quant_t>();
      nn::quantize(*this, q);
    }
  }

  /// The head's weight [vocab, hidden] and its gradient (the embedding's when tied).
  const T* head_weight() const { return tied_ ? model.embed_tokens.weight.data() : lm_head.weight.data(); }
  float* head_grad() { return tied_ ? model.embed_tokens.weight.trainable_grad() : lm_head.weight.trainable_grad(); }

  /// f(weight, grad) with the head's weight [vocab, hidden] and its gradient (null unless
  /// `grad`): a quantized lm_head gives a dequantized f32 copy and no gradient (it is frozen).
  template <class F>
  auto with_head(bool grad, F&& f) {
    if (!tied_ && lm_head.is_quantized()) {
      std::vector<float> w(static_cast<std::size_t>(config().vocab_size * config().hidden_size));
      lm_head.qweight.dequantize(w.data());
      return f(static_cast<const float*>(w.data()), static_cast<float*>(nullptr));
    }
    return f(head_weight(), grad ? head_grad() : nullptr);
  }

  /// Forward to the final hidden states (kept in s.hidden); the layers keep what R saves (or
  /// what a policy spelled at run time keeps: `drop`, remat::parse's bits).
  template <remat::RematPolicy R = typename Pol::remat_t>
  void forward(const std::int64_t* ids, const nn::TokenLayout& layout, Saved& s,
               remat::DropMask drop = remat::dropped_by<R>()) const {
    s.batch = layout.batch;
    s.seq = layout.seq;
    s.hidden.resize(static_cast<std::size_t>(layout.tokens() * config().hidden_size));
    model.forward(ids, layout, s.hidden.data(), s.model_s, drop);
  }

  /// Full logits [T, vocab] (inference and tests).
  void logits(const std::int64_t* ids, const nn::TokenLayout& layout, float* out) const {
    Saved s;
    forward<remat::everything_saveable>(ids, layout, s);  // no backward: nothing to recompute
    apply_lm_head(s.hidden.data(), layout.tokens(), out);
  }

  /// HF's output_hidden_states: num_hidden_layers + 1 arrays [T, hidden], as transformers'
  /// LlamaModel returns them: the embeddings (layer 0's input), each layer's output but the
  /// last, and the final normed states (what the head reads).
  std::vector<std::vector<float>> hidden_states(const std::int64_t* ids, const nn::TokenLayout& layout) const {
    Saved s;
    forward<remat::everything_saveable>(ids, layout, s);
    std::vector<std::vector<float>> out(s.model_s.hs.begin(), s.model_s.hs.end() - 1);
    out.push_back(std::move(s.hidden));
    return out;
  }

  /// HF's output_attentions: per layer, the attention probabilities [batch, heads, seq, seq]
  /// (nn::Attention::probabilities). Opt-in: training never stores them; this call runs a
  /// forward and recomputes them from each layer's q, k and log-sum-exp.
  std::vector<std::vector<float>> attentions(const std::int64_t* ids, const nn::TokenLayout& layout) const {
    Saved s;
    forward<remat::everything_saveable>(ids, layout, s);
    std::vector<std::vector<float>> out;
    for (std::size_t l = 0; l < model.layers.size(); ++l)
      out.push_back(model.layers[l].self_attn.probabilities(s.model_s.layer_s[l].attn_s));
    return out;
  }

  /// The seeds' flops_per_token: forward FLOPs per token of one sequence of seq_len tokens
  /// (every projection, attention over the causal pairs), plus the head's when include_loss,
  /// times 3 when include_backward (the backward is twice the forward). The trainer's MFU is
  /// flops_per_token(seq, true, true) x tokens/s over the peak.
  double flops_per_token(std::int64_t seq_len, bool include_loss = true, bool include_backward = false) const noexcept {
    double f = model.flops_forward(1, seq_len);
    if (include_loss)
      f += 2.0 * static_cast<double>(seq_len) * static_cast<double>(config().hidden_size) *
           static_cast<double>(config().vocab_size);
    f /= static_cast<double>(seq_len);
    return include_backward ? 3.0 * f : f;
  }

  /// EasyDeL's apply_lm_head: logits [rows, vocab] of final hidden states [rows, hidden] (after
  /// the final norm, as Saved::hidden holds them): the head, or the tied embedding.
  /// (Gemma 2's final_logit_softcapping included.)
  void apply_lm_head(const float* hidden, std::int64_t rows, float* out) const {
    const std::int64_t V = config().vocab_size;
    if (!tied_ && lm_head.is_quantized()) lm_head.apply(hidden, rows, out);
    else nn::gemm_ops::mm_nt(hidden, head_weight(), out, rows, V, config().hidden_size);
    nn::round_activations<Pol>(out, static_cast<std::size_t>(rows * V));
    if (const float cap = static_cast<float>(config().final_softcap()); cap > 0) kernels::softcap_rows(out, rows, V, cap);
  }

  /// opt with what the model's loss needs besides (Gemma 2's final logit soft-capping, the
  /// logits' rounding to the compute dtype as apply_lm_head rounds them): every
  /// caller of nn::causal_lm_loss on this model's hidden states passes its options through here.
  nn::LossOptions loss_options(nn::LossOptions opt) const {
    opt.logit_softcap = static_cast<float>(config().final_softcap());
    opt.logit_dtype = dtype_v<typename Pol::compute_t>;
    return opt;
  }

  /// The seeds' can_generate(): a causal LM generates (generate/ takes it).
  static constexpr bool can_generate() noexcept { return true; }

  /// Loss only (no gradients). labels [batch, seq] (null: ids), HF shift applied.
  nn::LossMetrics loss(const std::int64_t* ids, const nn::TokenLayout& layout, const std::int64_t* labels = nullptr,
                       const nn::LossOptions& opt = {}) const {
    Saved s;
    EDL_CHECK(ids != nullptr || labels != nullptr, errc::invalid_argument, "LlamaForCausalLM.loss",
              "inputs_embeds without token ids need labels");
    forward(ids, layout, s);
    nn::LossMetrics m = const_cast<LlamaForCausalLM&>(*this).with_head(false, [&](const auto* w, float*) {
      return nn::causal_lm_loss(s.hidden.data(), layout.batch, layout.seq, config().hidden_size, w, config().vocab_size,
                                labels ? labels : ids, loss_options(opt));
    });
    router_losses(s, layout, opt, m, false);
    return m;
  }

  /// Forward, chunked loss and backward: ACCUMULATES every parameter gradient. The layers keep
  /// what R saves, or what `drop` (remat::parse's bits of a policy spelled at run time) keeps.
  template <remat::RematPolicy R = typename Pol::remat_t>
  nn::LossMetrics forward_backward(const std::int64_t* ids, const nn::TokenLayout& layout,
                                   const std::int64_t* labels = nullptr, const nn::LossOptions& opt = {},
                                   remat::DropMask drop = remat::dropped_by<R>()) {
    EDL_CHECK(ids != nullptr || labels != nullptr, errc::invalid_argument, "LlamaForCausalLM.forward_backward",
              "inputs_embeds without token ids need labels");
    Saved s;
    forward(ids, layout, s, drop);
    std::vector<float> dhidden(s.hidden.size());
    nn::LossMetrics m = with_head(true, [&](const auto* w, float* grad) {
      return nn::causal_lm_loss(s.hidden.data(), layout.batch, layout.seq, config().hidden_size, w, config().vocab_size,
                                labels ? labels : ids, loss_options(opt), dhidden.data(), grad);
    });
    router_losses(s, layout, opt, m, true);
    model.backward(dhidden.data(), s.model_s);
    return m;
  }

  /// The routers' input jitter (config().router_jitter_noise) for the next forwards: drawn from
  /// `key` (a training step's; the trainer sets one per micro-batch), or none (evaluation,
  /// inference: no jitter, as transformers outside training).
  void set_router_jitter(std::optional<Key> key) {
    for (auto& L : model.layers)
      if (L.is_sparse()) L.block_sparse_moe.jitter_key = key;
  }

  /// The router losses of a mixture-of-experts forward (config().output_router_logits) added
  /// to m, and with `backward` their gradients to the routers' (before model.backward).
  void router_losses(Saved& s, const nn::TokenLayout& layout, const nn::LossOptions& opt, nn::LossMetrics& m,
                     bool backward) const {
    std::vector<typename nn::MoE<Pol>::Saved*> routed;  // the sparse layers' routing
    for (std::size_t l = 0; l < model.layers.size(); ++l)
      if (model.layers[l].is_sparse()) routed.push_back(&s.model_s.layer_s[l].moe_s);
    add_router_losses(config(), routed, layout.attention_mask, opt, m, backward);
  }

  /// The router losses over `routed` (every sparse layer's routing of the same tokens; `mask`
  /// their attention mask or null) added to m (its `tokens` set), and with `backward` their
  /// gradients to each routing's dlogits_extra. On a mesh each device passes its own tokens and
  /// `sum_devices` sums the counts over the devices that hold the batch's others.
  static void add_router_losses(const LlamaConfig& c, std::span<typename nn::MoE<Pol>::Saved* const> routed,
                                const std::int64_t* mask, const nn::LossOptions& opt, nn::LossMetrics& m, bool backward,
                                const std::function<void(std::span<double>)>& sum_devices = {}) {
    if (!c.is_moe() || !c.output_router_logits || routed.empty()) return;
    // A micro-batch's share of the step (normalizer: the step's target tokens).
    double weight = 1.0;
    if (opt.normalizer > 0) weight = static_cast<double>(m.tokens) / opt.normalizer;
    const auto coef = [&](double c_) { return backward ? static_cast<float>(c_ * weight) : 0.0f; };
    const nn::MoeConfig mc = moe_config(c);
    m.aux_loss = nn::MoE<Pol>::load_balancing_loss(routed, mc, mask, coef(c.router_aux_loss_coef), sum_devices);
    m.loss += weight * c.router_aux_loss_coef * m.aux_loss;
    if (c.router_z_loss_coef > 0) {
      m.router_z_loss = nn::MoE<Pol>::router_z_loss(routed, mc, mask, coef(c.router_z_loss_coef), sum_devices);
      m.loss += weight * c.router_z_loss_coef * m.router_z_loss;
    }
  }

 private:
  bool tied_ = false;
};

/// The seeds' update_module: `m`'s weights under its config with the fields of `overrides`
/// replaced (config.json names, e.g. rope_theta, rope_scaling, rms_norm_eps,
/// max_position_embeddings, sliding_window). A change of a parameter's shape or of the set of
/// parameters is an error naming the tensor; quantized models are refused (their blocks are
/// not parameters; update the float model, then quantize).
template <class Pol>
LlamaForCausalLM<Pol> update_module(LlamaForCausalLM<Pol>& m, const nlohmann::ordered_json& overrides) {
  EDL_CHECK(!nn::is_quantized(m), errc::unsupported, "update_module",
            "the model is quantized: update the float model, then quantize it");
  EDL_CHECK(overrides.is_object(), errc::invalid_argument, "update_module",
            "expected an object of config.json fields, found ", overrides.type_name());
  nlohmann::ordered_json j = m.config().to_json();
  for (const auto& [k, v] : overrides.items()) j[k] = v;
  LlamaConfig cfg = LlamaConfig::from_json(j, "update_module overrides");
  cfg.validate();
  LlamaForCausalLM<Pol> out(cfg);
  const auto have = nn::named_shapes(m), want = nn::named_shapes(out);
  for (std::size_t i = 0; i < std::max(have.size(), want.size()); ++i) {
    EDL_CHECK(i < have.size() && i < want.size() && have[i].first == want[i].first, errc::invalid_argument,
              "update_module", "the overrides change the model's parameters: \"",
              i < want.size() ? want[i].first : have[i].first, "\" ", i < want.size() ? "is new" : "is gone");
    EDL_CHECK(have[i].second == want[i].second, errc::shape_mismatch, "update_module", "the overrides change \"",
              have[i].first, "\" from shape ", ::edl::detail::shape_str(have[i].second), " to ",
              ::edl::detail::shape_str(want[i].second));
  }
  // Same names, same shapes, same order: copy each parameter as it is stored.
  std::vector<std::pair<const void*, std::size_t>> src;
  m.visit_params("", [&](std::string_view, auto& p) { src.emplace_back(p.data(), p.value.size() * sizeof(*p.data())); });
  std::size_t i = 0;
  out.visit_params("", [&](std::string_view, auto& p) {
    std::memcpy(p.data(), src[i].first, src[i].second);
    ++i;
  });
  return out;
}

}  // namespace edl::models
