// edl/models/llama/config.hpp
// LlamaConfig: the HuggingFace config.json of Llama-family models (llama, mistral, qwen2, qwen3), with
// HF field names and HF defaults, validation naming the field at fault, the benchmark presets of
// shared/ANCHORS.md, and the parameter names and shapes in HF order.
//
//   auto c = edl::models::LlamaConfig::from_file("ckpt/config.json");   // validated
//   for (auto& [name, shape] : c.parameter_shapes()) ...                // model.embed_tokens.weight, ...
//   c.save("out/config.json");                                          // unknown fields kept
//
// Reading: a missing field takes the HF LlamaConfig default; num_key_value_heads defaults to
// num_attention_heads and head_dim to hidden_size / num_attention_heads. Fields edl does not know
// ("architectures", "transformers_version", ...) are kept in `extra` and written back, and written
// fields keep the order of the file they came from. Errors: errc::config for a missing or
// mistyped or out-of-range value (where = "<source> field <name>"), errc::unsupported for a
// valid HF setting edl does not implement (hidden_act other than silu, rope_scaling types other
// than linear/llama3/yarn/dynamic/longrope/default, model types other than
// llama/mistral/qwen2/qwen3/phi3 and the mixtures of experts mixtral/qwen2_moe/qwen3_moe).
//
// Mixtral (model_type "mixtral") is a Mistral whose every MLP is a sparse mixture of experts:
// num_local_experts SwiGLU experts, num_experts_per_tok chosen per token by a router; with
// output_router_logits the training loss adds router_aux_loss_coef x the load-balancing loss
// (and router_z_loss_coef x the router z-loss, a field of other MoE configs, 0 by default).
// Qwen2-MoE / Qwen3-MoE (qwen2_moe, qwen3_moe) are Qwen2 / Qwen3 with the same kind of block
// (num_experts of moe_intermediate_size; Qwen2-MoE adds a gated shared expert of
// shared_expert_intermediate_size) in layers l with (l + 1) % decoder_sparse_step == 0 that
// mlp_only_layers does not list; norm_topk_prob picks Mixtral's renormalised weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/json_config.hpp>

namespace edl::models {

using ojson = nlohmann::ordered_json;

/// rope_scaling as transformers reads it: {"rope_type" (or legacy "type"), ...}:
///   linear:   factor
///   llama3:   factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
///   yarn:     factor, [original_max_position_embeddings (default max_position_embeddings),
///             attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim, truncate]
///   dynamic:  factor (scaling starts past max_position_embeddings)
///   longrope: short_factor, long_factor, [factor (default max_position_embeddings /
///             original_max_position_embeddings), attention_factor, original_max_position_embeddings
///             (default the config's top-level field, as Phi-3 writes it, else max_position_embeddings)]
/// "default" means no scaling. yarn's factor is used as written, as current transformers does
/// (some releases replaced it by max_position_embeddings / original_max_position_embeddings).
struct RopeScaling {
  std::string rope_type = "linear";  // linear | llama3 | yarn | dynamic | longrope | default
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3 only
  double high_freq_factor = 4.0;  // llama3 only
  std::int64_t original_max_position_embeddings = 8192;  // llama3 (yarn, longrope: when given)
  bool has_original_max = false;                         // yarn / longrope: the field was given
  bool has_factor = true;                                // longrope: the field was given
  std::optional<double> attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;  // yarn (longrope: the first)
  bool truncate = true;                                  // yarn
  std::vector<double> short_factor, long_factor;         // longrope
  /// The object as read (other keys, and whether "type" and/or "rope_type" named the type).
  ojson raw = ojson::object();

  ojson to_json() const {
    ojson j = raw.is_object() ? raw : ojson::object();
    const bool has_type = j.contains("type"), has_rope_type = j.contains("rope_type");
    if (has_rope_type || !has_type) j["rope_type"] = rope_type;
    if (has_type) j["type"] = rope_type;
    if (rope_type != "default" && (rope_type != "longrope" || has_factor)) j["factor"] = factor;
    if (rope_type == "llama3" || has_original_max) j["original_max_position_embeddings"] = original_max_position_embeddings;
    if (rope_type == "llama3") {
      j["low_freq_factor"] = low_freq_factor;
      j["high_freq_factor"] = high_freq_factor;
    }
    const auto put = [&](const char* k, const std::optional<double>& v) { if (v) j[k] = *v; };
    put("attention_factor", attention_factor);
    put("beta_fast", beta_fast);
    put("beta_slow", beta_slow);
    put("mscale", mscale);
    put("mscale_all_dim", mscale_all_dim);
    if (rope_type == "yarn" && (!truncate || j.contains("truncate"))) j["truncate"] = truncate;
    if (rope_type == "longrope") {
      j["short_factor"] = short_factor;
      j["long_factor"] = long_factor;
    }
    return j;
  }
};

/// Which output head parameter_shapes() lists after the decoder.
enum class LlamaHead { causal_lm, sequence_classification, none };

struct LlamaConfig {
  std::string model_type = "llama";  // llama | mistral | qwen2 | qwen3 | mixtral | qwen2_moe | qwen3_moe
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 32;
  std::optional<std::int64_t> head_dim;  // nullopt: hidden_size / num_attention_heads
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool attention_bias = false;  // bias on q, k, v and o projections (qwen2: q, k, v always)
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  std::optional<std::int64_t> sliding_window;  // Mistral; nullopt = full attention
  std::string hidden_act = "silu";
  std::optional<std::int64_t> bos_token_id = 1;
  std::vector<std::int64_t> eos_token_id = {2};  // HF allows an int or a list
  bool eos_token_id_is_list = false;             // written back as it was read
  std::optional<std::int64_t> pad_token_id;
  std::string torch_dtype = "float32";
  double initializer_range = 0.02;
  std::int64_t num_labels = 2;               // sequence classification (HF: len(id2label))
  std::optional<std::string> problem_type;  // "single_label_classification", ...
  // Mixture of experts (HF MixtralConfig names and defaults; Qwen-MoE's num_experts is
  // num_local_experts here and written back under its own name).
  std::int64_t num_local_experts = 8;
  std::int64_t num_experts_per_tok = 2;
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;  // HF: the aux loss joins the loss only when set
  double router_jitter_noise = 0.0;   // HF: multiplicative noise on the block's input in training
  double router_z_loss_coef = 0.0;
  std::int64_t moe_intermediate_size = 0;            // qwen2_moe / qwen3_moe: each expert's width
  std::int64_t shared_expert_intermediate_size = 0;  // qwen2_moe: the shared expert's width
  bool norm_topk_prob = true;                        // mixtral: always; Qwen's flag (HF default false)
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;
  /// Fields edl does not interpret, kept verbatim.
  ojson extra = ojson::object();
  /// Names the config in errors: the file it came from, or "LlamaConfig".
  std::string source = "LlamaConfig";
  /// The multimodal model whose text model this config was read from ("gemma3":
  /// Gemma3ForConditionalGeneration, whose text_config it is), empty otherwise. Its checkpoints
  /// keep the text model's tensors under a prefix beside the vision tower's
  /// (models/llama/fused_checkpoint.hpp reads them under edl's names). Not written by to_json:
  /// what edl saves is the text model alone (Gemma3ForCausalLM).
  std::string multimodal_type;

  // ------------------------------------------------------------------ derived values
  std::int64_t head_size() const {
    return head_dim ? *head_dim : (num_attention_heads > 0 ? hidden_size / num_attention_heads : 0);
  }
  std::int64_t q_size() const { return num_attention_heads * head_size(); }
  std::int64_t kv_size() const { return num_key_value_heads * head_size(); }
  /// Bias on q/k/v projections (attention_bias, or always for qwen2) and on o_proj.
  bool qkv_bias() const { return attention_bias || model_type == "qwen2" || model_type == "qwen2_moe"; }
  bool o_bias() const { return attention_bias; }
  /// RMSNorm (over head_dim, eps rms_norm_eps) of each query and key head before rope: qwen3, gemma 3.
  bool qk_norm() const { return model_type == "qwen3" || model_type == "qwen3_moe" || model_type == "gemma3_text"; }
  /// Gemma 2 and 3 (text): (1 + w) norms, sandwich norms, GeGLU, scaled embeddings, per-layer windows.
  bool is_gemma() const { return model_type == "gemma2" || model_type == "gemma3_text"; }
  /// Gemma's soft-capping of the attention scores (attn_logit_softcapping) and of the final
  /// logits (final_logit_softcapping): x <- cap tanh(x / cap); 0 = none.
  double attn_softcap() const { return is_gemma() ? extra_number("attn_logit_softcapping", 0.0) : 0.0; }
  double final_softcap() const { return is_gemma() ? extra_number("final_logit_softcapping", 0.0) : 0.0; }
  /// Added to every RMSNorm weight: 1 for Gemma (HF GemmaRMSNorm), else 0.
  float norm_offset() const { return is_gemma() ? 1.0f : 0.0f; }
  /// Norms on the attention's and the MLP's outputs as well (Gemma).
  bool sandwich_norms() const { return is_gemma(); }
  /// The factor the embeddings are multiplied by: sqrt(hidden_size) for Gemma, else 1.
  double embed_scale() const { return is_gemma() ? std::sqrt(static_cast<double>(hidden_size)) : 1.0; }
  /// The scores' scale: query_pre_attn_scalar^-0.5 for Gemma; 0 = 1 / sqrt(head_dim).
  double query_scale() const { return is_gemma() ? 1.0 / std::sqrt(extra_number("query_pre_attn_scalar", 256)) : 0.0; }
  /// Gemma's sliding layers: layer_types[l] == "sliding_attention", or (without layer_types) for
  /// Gemma 3 every layer but the last of each group of sliding_window_pattern, for Gemma 2 the
  /// even layers.
  bool layer_is_sliding(std::int64_t l) const {
    if (!is_gemma()) return attention_window().has_value();
    if (extra.contains("layer_types") && extra["layer_types"].is_array())
      return extra["layer_types"][static_cast<std::size_t>(l)] == "sliding_attention";
    if (model_type == "gemma2") return l % 2 == 0;
    return (l + 1) % static_cast<std::int64_t>(extra_number("sliding_window_pattern", 6)) != 0;
  }
  /// Gemma 3's sliding layers rotate with rope_local_base_freq and no scaling.
  bool layer_has_local_rope(std::int64_t l) const { return model_type == "gemma3_text" && layer_is_sliding(l); }
  /// Layer l's attention window (Gemma: the sliding layers'; others: every layer's).
  std::optional<std::int64_t> layer_window(std::int64_t l) const {
    if (!is_gemma()) return attention_window();
    return layer_is_sliding(l) ? sliding_window : std::nullopt;
  }
  /// A number kept in `extra` (fields only some families read), or `fallback` when absent or null.
  double extra_number(const char* name, double fallback) const {
    return extra.contains(name) && extra[name].is_number() ? extra[name].get<double>() : fallback;
  }
  /// A mixture-of-experts model: Mixtral (block_sparse_moe in every layer) or Qwen-MoE (mlp).
  bool is_moe() const { return model_type == "mixtral" || qwen_moe(); }
  bool qwen_moe() const { return model_type == "qwen2_moe" || model_type == "qwen3_moe"; }
  /// Phi-3: q/k/v and gate/up stored fused in checkpoints (models/llama/fused_checkpoint.hpp).
  bool fused_projections() const { return model_type == "phi3"; }
  /// Checkpoints name (or cut) this model's tensors otherwise than edl's parameters do: Phi-3's
  /// fused projections, a multimodal model's text tensors under their prefix.
  bool checkpoint_names_differ() const { return fused_projections() || !multimodal_type.empty(); }
  /// Layer l's MLP is a mixture of experts.
  bool layer_is_sparse(std::int64_t l) const {
    if (!is_moe()) return false;
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) != mlp_only_layers.end()) return false;
    return (l + 1) % decoder_sparse_step == 0;
  }
  /// Each expert's intermediate size.
  std::int64_t expert_intermediate_size() const { return qwen_moe() ? moe_intermediate_size : intermediate_size; }
  /// The shared expert's intermediate size (0: none; qwen2_moe only).
  std::int64_t shared_expert_size() const { return model_type == "qwen2_moe" ? shared_expert_intermediate_size : 0; }
  /// Sliding attention window in effect (qwen2 and qwen3 use it only with use_sliding_window: true).
  std::optional<std::int64_t> attention_window() const {
    if ((model_type == "qwen2" || model_type == "qwen3" || qwen_moe()) &&
        !(extra.contains("use_sliding_window") && extra["use_sliding_window"].is_boolean() &&
          extra["use_sliding_window"].get<bool>()))
      return std::nullopt;
    return sliding_window;
  }

  // ------------------------------------------------------------------ validation
  std::string where(const std::string& field) const { return source + " field " + field; }

  /// Throws naming the first field at fault.
  void validate() const {
    auto positive = [&](const char* name, std::int64_t v) {
      EDL_CHECK(v > 0, errc::config, where(name), "must be positive, found ", v);
    };
    EDL_CHECK(model_type == "llama" || model_type == "mistral" || model_type == "qwen2" || model_type == "qwen3" ||
                  model_type == "phi3" || is_gemma() || is_moe(),
              errc::unsupported, where("model_type"),
              "expected llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, mixtral, qwen2_moe or qwen3_moe, found \"",
              model_type, "\"");
    // Phi-4-mini is a "phi3" that rotates part of each head; edl rotates whole heads.
    EDL_CHECK(!extra.contains("partial_rotary_factor") || !extra["partial_rotary_factor"].is_number() ||
                  extra["partial_rotary_factor"].get<double>() == 1.0,
              errc::unsupported, where("partial_rotary_factor"), "rotary embeddings over part of each head are not "
              "supported (edl rotates the whole head); found ", extra.contains("partial_rotary_factor") ?
              extra["partial_rotary_factor"].dump() : std::string());
    positive("vocab_size", vocab_size);
    positive("hidden_size", hidden_size);
    positive("intermediate_size", intermediate_size);
    positive("num_hidden_layers", num_hidden_layers);
    positive("num_attention_heads", num_attention_heads);
    positive("num_key_value_heads", num_key_value_heads);
    positive("max_position_embeddings", max_position_embeddings);
    // Bounds far above any released model, so that sizes from a stranger's config.json can be
    // multiplied without overflow (parameter_count stays below 2^63) and never reach an
    // allocation of exabytes: the loader compares them with the tensors before allocating.
    auto bounded = [&](const char* name, std::int64_t v, std::int64_t limit) {
      EDL_CHECK(v <= limit, errc::config, where(name), "is ", v, ", above the largest edl accepts (", limit, ")");
    };
    bounded("vocab_size", vocab_size, std::int64_t{1} << 24);
    bounded("hidden_size", hidden_size, std::int64_t{1} << 20);
    bounded("intermediate_size", intermediate_size, std::int64_t{1} << 22);
    bounded("num_hidden_layers", num_hidden_layers, std::int64_t{1} << 12);
    bounded("num_attention_heads", num_attention_heads, std::int64_t{1} << 14);
    bounded("num_key_value_heads", num_key_value_heads, std::int64_t{1} << 14);
    bounded("max_position_embeddings", max_position_embeddings, std::int64_t{1} << 26);
    bounded("num_labels", num_labels, std::int64_t{1} << 24);
    if (head_dim) {
      positive("head_dim", *head_dim);
      bounded("head_dim", *head_dim, std::int64_t{1} << 14);
    } else {
      EDL_CHECK(hidden_size % num_attention_heads == 0, errc::config, where("num_attention_heads"),
                "hidden_size (", hidden_size, ") must be divisible by num_attention_heads (", num_attention_heads,
                ") unless head_dim is given");
    }
    EDL_CHECK(head_size() % 2 == 0, errc::config, where("head_dim"), "rotary embeddings need an even head_dim, found ",
              head_size());
    EDL_CHECK(num_attention_heads % num_key_value_heads == 0, errc::config, where("num_key_value_heads"),
              "num_attention_heads (", num_attention_heads, ") must be divisible by num_key_value_heads (",
              num_key_value_heads, ")");
    EDL_CHECK(rms_norm_eps > 0, errc::config, where("rms_norm_eps"), "must be positive, found ", rms_norm_eps);
    EDL_CHECK(rope_theta > 0, errc::config, where("rope_theta"), "must be positive, found ", rope_theta);
    if (is_gemma()) {
      validate_gemma();
    } else {
      EDL_CHECK(hidden_act == "silu", errc::unsupported, where("hidden_act"), "only \"silu\" is supported, found \"",
                hidden_act, "\"");
    }
    if (sliding_window) positive("sliding_window", *sliding_window);
    EDL_CHECK(num_labels >= 0, errc::config, where("num_labels"), "must be non-negative, found ", num_labels);
    if (is_moe()) {
      positive("num_local_experts", num_local_experts);
      bounded("num_local_experts", num_local_experts, std::int64_t{1} << 12);
      EDL_CHECK(num_experts_per_tok > 0 && num_experts_per_tok <= num_local_experts, errc::config,
                where("num_experts_per_tok"), "must be in [1, num_local_experts = ", num_local_experts, "], found ",
                num_experts_per_tok);
      EDL_CHECK(router_aux_loss_coef >= 0, errc::config, where("router_aux_loss_coef"),
                "must be non-negative, found ", router_aux_loss_coef);
      EDL_CHECK(router_z_loss_coef >= 0, errc::config, where("router_z_loss_coef"), "must be non-negative, found ",
                router_z_loss_coef);
      EDL_CHECK(router_jitter_noise >= 0 && router_jitter_noise < 1, errc::config, where("router_jitter_noise"),
                "must be in [0, 1), found ", router_jitter_noise);
      if (qwen_moe()) {
        positive("moe_intermediate_size", moe_intermediate_size);
        bounded("moe_intermediate_size", moe_intermediate_size, std::int64_t{1} << 22);
        EDL_CHECK(shared_expert_intermediate_size >= 0, errc::config, where("shared_expert_intermediate_size"),
                  "must be non-negative, found ", shared_expert_intermediate_size);
        bounded("shared_expert_intermediate_size", shared_expert_intermediate_size, std::int64_t{1} << 22);
      }
      positive("decoder_sparse_step", decoder_sparse_step);
      for (const std::int64_t l : mlp_only_layers)
        EDL_CHECK(l >= 0 && l < num_hidden_layers, errc::config, where("mlp_only_layers"),
                  "lists layer ", l, ", outside [0, num_hidden_layers = ", num_hidden_layers, ")");
    }
    if (rope_scaling) {
      const auto& r = *rope_scaling;
      EDL_CHECK(r.rope_type == "linear" || r.rope_type == "llama3" || r.rope_type == "default" ||
                    r.rope_type == "yarn" || r.rope_type == "dynamic" || r.rope_type == "longrope",
                errc::unsupported, where("rope_scaling.rope_type"),
                "expected linear, llama3, yarn, dynamic, longrope or default, found \"", r.rope_type, "\"");
      if (r.rope_type != "default")
        EDL_CHECK(r.factor > 0, errc::config, where("rope_scaling.factor"), "must be positive, found ", r.factor);
      if (r.rope_type == "llama3") {
        EDL_CHECK(r.low_freq_factor > 0, errc::config, where("rope_scaling.low_freq_factor"),
                  "must be positive, found ", r.low_freq_factor);
        EDL_CHECK(r.high_freq_factor > r.low_freq_factor, errc::config, where("rope_scaling.high_freq_factor"),
                  "must exceed low_freq_factor (", r.low_freq_factor, "), found ", r.high_freq_factor);
      }
      if (r.rope_type == "llama3" || r.has_original_max)
        EDL_CHECK(r.original_max_position_embeddings > 0, errc::config,
                  where("rope_scaling.original_max_position_embeddings"), "must be positive, found ",
                  r.original_max_position_embeddings);
      if (r.rope_type == "yarn") {
        EDL_CHECK(!r.attention_factor || *r.attention_factor > 0, errc::config, where("rope_scaling.attention_factor"),
                  "must be positive, found ", r.attention_factor.value_or(0));
        EDL_CHECK(r.beta_fast.value_or(32) > r.beta_slow.value_or(1) && r.beta_slow.value_or(1) > 0, errc::config,
                  where("rope_scaling.beta_fast"), "expected beta_fast > beta_slow > 0, found ", r.beta_fast.value_or(32),
                  " and ", r.beta_slow.value_or(1));
      }
      if (r.rope_type == "longrope") {
        const std::size_t half = static_cast<std::size_t>(head_size() / 2);
        for (const auto* f : {&r.short_factor, &r.long_factor}) {
          const char* name = f == &r.short_factor ? "rope_scaling.short_factor" : "rope_scaling.long_factor";
          EDL_CHECK(f->size() == half, errc::config, where(name), "expected head_dim / 2 = ", half, " values, found ",
                    f->size());
          for (const double v : *f) EDL_CHECK(v > 0 && std::isfinite(v), errc::config, where(name),
                                              "values must be positive, found ", v);
        }
        EDL_CHECK(!r.attention_factor || *r.attention_factor > 0, errc::config, where("rope_scaling.attention_factor"),
                  "must be positive, found ", r.attention_factor.value_or(0));
        EDL_CHECK(rope_original_max() > 0, errc::config, where("original_max_position_embeddings"),
                  "must be positive, found ", rope_original_max());
      }
    }
  }

  /// Gemma's own fields (kept in `extra`): what edl runs, and what it refuses by name.
  void validate_gemma() const {
    const auto field = [&](const char* name) -> const ojson* { return extra.contains(name) ? &extra[name] : nullptr; };
    const std::string act = field("hidden_activation") && field("hidden_activation")->is_string()
                                ? field("hidden_activation")->get<std::string>() : hidden_act;
    EDL_CHECK(act == "gelu_pytorch_tanh", errc::unsupported, where("hidden_activation"),
              "Gemma's MLP runs the tanh GELU (\"gelu_pytorch_tanh\"), found \"", act, "\"");
    for (const char* name : {"query_pre_attn_scalar", "sliding_window_pattern", "rope_local_base_freq"})
      if (const ojson* v = field(name); v && !v->is_null())
        EDL_CHECK(v->is_number() && v->get<double>() > 0, errc::config, where(name), "must be a positive number, found ",
                  v->dump());
    for (const char* name : {"final_logit_softcapping", "attn_logit_softcapping"})
      if (const ojson* v = field(name); v && !v->is_null())
        EDL_CHECK(v->is_number() && v->get<double>() > 0, errc::config, where(name),
                  "must be a positive number or null, found ", v->dump());
    EDL_CHECK(!field("use_bidirectional_attention") || field("use_bidirectional_attention")->is_null() ||
                  *field("use_bidirectional_attention") == false,
              errc::unsupported, where("use_bidirectional_attention"), "edl runs causal attention only");
    if (const ojson* t = field("layer_types")) {
      EDL_CHECK(t->is_array() && static_cast<std::int64_t>(t->size()) == num_hidden_layers, errc::config,
                where("layer_types"), "expected a list of num_hidden_layers = ", num_hidden_layers, " layer types");
      for (const ojson& v : *t)
        EDL_CHECK(v == "sliding_attention" || v == "full_attention", errc::unsupported, where("layer_types"),
                  "expected sliding_attention or full_attention, found ", v.dump());
    }
    EDL_CHECK(sliding_window.has_value(), errc::config, where("sliding_window"), "Gemma's sliding layers need a window");
  }

  /// The context the rope scaling was pretrained on: rope_scaling's original_max_position_embeddings,
  /// else (longrope) the top-level field Phi-3 writes, else max_position_embeddings.
  std::int64_t rope_original_max() const {
    if (rope_scaling && rope_scaling->has_original_max) return rope_scaling->original_max_position_embeddings;
    if (rope_scaling && rope_scaling->rope_type == "llama3") return rope_scaling->original_max_position_embeddings;
    if (extra.contains("original_max_position_embeddings") && extra["original_max_position_embeddings"].is_number_integer())
      return extra["original_max_position_embeddings"].get<std::int64_t>();
    return max_position_embeddings;
  }

  // ------------------------------------------------------------------ JSON
  static const std::vector<std::string>& known_fields() {
    static const std::vector<std::string> k = {
        "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
        "rope_theta", "rope_scaling", "attention_bias", "mlp_bias", "tie_word_embeddings", "sliding_window",
        "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "initializer_range",
        "num_labels", "problem_type"};
    return k;
  }
  /// Fields read only for a mixture-of-experts model (kept in `extra` for the others).
  static const std::vector<std::string>& moe_fields() {
    static const std::vector<std::string> k = {
        "num_local_experts", "num_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
        "router_jitter_noise", "router_z_loss_coef", "moe_intermediate_size", "shared_expert_intermediate_size",
        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"};
    return k;
  }

  /// Reads a config.json object (missing fields take HF defaults) and validates it.
  static LlamaConfig from_json(const ojson& j, const std::string& source = "LlamaConfig") {
    const io::JsonConfig c(j, source);
    if (c.get<std::string>("model_type", "llama") == "gemma3") return from_multimodal_json(j, source);
    LlamaConfig cfg;
    cfg.source = source;
    cfg.model_type = c.get<std::string>("model_type", "llama");
    // Fields a config leaves out take its class's defaults: LlamaConfig's, or Gemma3TextConfig's
    // (a Gemma 3 multimodal config's text_config lists only what differs from them).
    const bool g3 = cfg.model_type == "gemma3_text";
    cfg.vocab_size = c.get<std::int64_t>("vocab_size", g3 ? 262208 : cfg.vocab_size);
    cfg.hidden_size = c.get<std::int64_t>("hidden_size", g3 ? 2304 : cfg.hidden_size);
    cfg.intermediate_size = c.get<std::int64_t>("intermediate_size", g3 ? 9216 : cfg.intermediate_size);
    cfg.num_hidden_layers = c.get<std::int64_t>("num_hidden_layers", g3 ? 26 : cfg.num_hidden_layers);
    cfg.num_attention_heads = c.get<std::int64_t>("num_attention_heads", g3 ? 8 : cfg.num_attention_heads);
    cfg.num_key_value_heads = c.get<std::int64_t>("num_key_value_heads", g3 ? 4 : cfg.num_attention_heads);
    cfg.head_dim = c.has("head_dim") || !g3 ? c.optional<std::int64_t>("head_dim") : std::optional<std::int64_t>(256);
    cfg.max_position_embeddings = c.get<std::int64_t>("max_position_embeddings", g3 ? 131072 : cfg.max_position_embeddings);
    cfg.rms_norm_eps = c.get<double>("rms_norm_eps", cfg.rms_norm_eps);
    cfg.rope_theta = c.get<double>("rope_theta", g3 ? 1e6 : cfg.rope_theta);
    cfg.attention_bias = c.get<bool>("attention_bias", false);
    cfg.mlp_bias = c.get<bool>("mlp_bias", false);
    const bool gemma = cfg.is_gemma();
    cfg.tie_word_embeddings = c.get<bool>("tie_word_embeddings", gemma);  // Gemma3TextConfig: tied
    if (c.has("sliding_window")) cfg.sliding_window = c.optional<std::int64_t>("sliding_window");
    else if (cfg.model_type == "mistral") cfg.sliding_window = 4096;  // MistralConfig default
    else if (gemma) cfg.sliding_window = 4096;                        // Gemma3TextConfig default
    cfg.hidden_act = c.get<std::string>("hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
    cfg.bos_token_id = c.has("bos_token_id") ? c.optional<std::int64_t>("bos_token_id") : std::optional<std::int64_t>(g3 ? 2 : 1);
    if (g3) cfg.eos_token_id = {1};
    if (c.has("eos_token_id")) {
      const ojson& e = j["eos_token_id"];
      cfg.eos_token_id_is_list = e.is_array();
      if (e.is_null()) cfg.eos_token_id.clear();
      else if (e.is_array()) cfg.eos_token_id = c.get<std::vector<std::int64_t>>("eos_token_id");
      else cfg.eos_token_id = {c.get<std::int64_t>("eos_token_id")};
    }
    cfg.pad_token_id = c.has("pad_token_id") || !g3 ? c.optional<std::int64_t>("pad_token_id") : std::optional<std::int64_t>(0);
    cfg.torch_dtype = c.get<std::string>("torch_dtype", c.get<std::string>("dtype", "float32"));
    cfg.initializer_range = c.get<double>("initializer_range", cfg.initializer_range);
    if (c.has_value("id2label") && j["id2label"].is_object()) cfg.num_labels = static_cast<std::int64_t>(j["id2label"].size());
    else cfg.num_labels = c.get<std::int64_t>("num_labels", 2);
    cfg.problem_type = c.optional<std::string>("problem_type");
    if (cfg.is_moe()) {
      if (cfg.qwen_moe()) {  // Qwen2MoeConfig / Qwen3MoeConfig defaults
        const bool q2 = cfg.model_type == "qwen2_moe";
        cfg.num_local_experts = c.get<std::int64_t>("num_experts", q2 ? 60 : 128);
        cfg.num_experts_per_tok = c.get<std::int64_t>("num_experts_per_tok", q2 ? 4 : 8);
        cfg.moe_intermediate_size = c.get<std::int64_t>("moe_intermediate_size", q2 ? 1408 : 768);
        if (q2) cfg.shared_expert_intermediate_size = c.get<std::int64_t>("shared_expert_intermediate_size", 5632);
        cfg.norm_topk_prob = c.get<bool>("norm_topk_prob", false);
        cfg.decoder_sparse_step = c.get<std::int64_t>("decoder_sparse_step", 1);
        if (c.has_value("mlp_only_layers")) cfg.mlp_only_layers = c.get<std::vector<std::int64_t>>("mlp_only_layers");
      } else {
        cfg.num_local_experts = c.get<std::int64_t>("num_local_experts", cfg.num_local_experts);
        cfg.num_experts_per_tok = c.get<std::int64_t>("num_experts_per_tok", cfg.num_experts_per_tok);
      }
      cfg.router_aux_loss_coef = c.get<double>("router_aux_loss_coef", cfg.router_aux_loss_coef);
      cfg.output_router_logits = c.get<bool>("output_router_logits", false);
      cfg.router_jitter_noise = c.get<double>("router_jitter_noise", 0.0);
      cfg.router_z_loss_coef = c.get<double>("router_z_loss_coef", 0.0);
    }

    if (c.has_value("rope_scaling")) {
      const ojson& r = j["rope_scaling"];
      EDL_CHECK(r.is_object(), errc::config, cfg.where("rope_scaling"), "expected null or an object, found ",
                r.dump());
      const auto field = [&](const char* key) -> const ojson& {
        EDL_CHECK(r.contains(key), errc::config, cfg.where(std::string("rope_scaling.") + key), "missing");
        return r[key];
      };
      const auto num = [&](const char* key) {
        return io::JsonConfig::convert<double>(field(key), cfg.where(std::string("rope_scaling.") + key));
      };
      RopeScaling rs;
      rs.raw = r;
      const char* type_key = r.contains("rope_type") && !r["rope_type"].is_null() ? "rope_type" : "type";
      EDL_CHECK(r.contains(type_key) && !r[type_key].is_null(), errc::config, cfg.where("rope_scaling.rope_type"),
                "missing (expected \"rope_type\" or \"type\": linear | llama3 | yarn | dynamic | longrope)");
      rs.rope_type = io::JsonConfig::convert<std::string>(r[type_key], cfg.where(std::string("rope_scaling.") + type_key));
      const auto opt = [&](const char* key) -> std::optional<double> {
        if (!r.contains(key) || r[key].is_null()) return std::nullopt;
        return num(key);
      };
      const auto factors = [&](const char* key) {
        const ojson& v = field(key);
        const std::string at = cfg.where(std::string("rope_scaling.") + key);
        EDL_CHECK(v.is_array(), errc::config, at, "expected a list of numbers, found ", v.dump());
        std::vector<double> out;
        for (const ojson& e : v) out.push_back(io::JsonConfig::convert<double>(e, at));
        return out;
      };
      if (rs.rope_type == "linear" || rs.rope_type == "llama3" || rs.rope_type == "yarn" || rs.rope_type == "dynamic")
        rs.factor = num("factor");
      if (rs.rope_type == "llama3") {
        rs.low_freq_factor = num("low_freq_factor");
        rs.high_freq_factor = num("high_freq_factor");
      }
      if (rs.rope_type == "llama3" ||
          ((rs.rope_type == "yarn" || rs.rope_type == "longrope") && r.contains("original_max_position_embeddings") &&
           !r["original_max_position_embeddings"].is_null())) {
        rs.original_max_position_embeddings = io::JsonConfig::convert<std::int64_t>(
            field("original_max_position_embeddings"), cfg.where("rope_scaling.original_max_position_embeddings"));
        rs.has_original_max = rs.rope_type != "llama3";
      }
      if (rs.rope_type == "yarn" || rs.rope_type == "longrope") rs.attention_factor = opt("attention_factor");
      if (rs.rope_type == "yarn") {
        // HF reads `beta_fast or 32`: a 0 or null means the default.
        rs.beta_fast = opt("beta_fast");
        rs.beta_slow = opt("beta_slow");
        if (rs.beta_fast && *rs.beta_fast == 0) rs.beta_fast.reset();
        if (rs.beta_slow && *rs.beta_slow == 0) rs.beta_slow.reset();
        rs.mscale = opt("mscale");
        rs.mscale_all_dim = opt("mscale_all_dim");
        if (r.contains("truncate") && !r["truncate"].is_null())
          rs.truncate = io::JsonConfig::convert<bool>(r["truncate"], cfg.where("rope_scaling.truncate"));
      }
      if (rs.rope_type == "longrope") {
        rs.short_factor = factors("short_factor");
        rs.long_factor = factors("long_factor");
        rs.has_factor = r.contains("factor") && !r["factor"].is_null();
        if (rs.has_factor) rs.factor = num("factor");
      }
      cfg.rope_scaling = std::move(rs);
    }

    const auto& known = known_fields();
    const auto& moe = moe_fields();
    for (auto it = j.begin(); it != j.end(); ++it) {
      cfg.key_order_.push_back(it.key());
      if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
      if (cfg.is_moe() && std::find(moe.begin(), moe.end(), it.key()) != moe.end()) continue;
      cfg.extra[it.key()] = it.value();
    }
    cfg.validate();
    return cfg;
  }

  /// Gemma3ForConditionalGeneration's config.json (model_type "gemma3"): the text model's
  /// config is its text_config (Gemma3TextConfig's defaults for what it leaves out; token ids
  /// and torch_dtype from the top level when text_config has none). The vision tower's fields
  /// are not read: edl runs the text model.
  static LlamaConfig from_multimodal_json(const ojson& j, const std::string& source) {
    const std::string at = source + ": text_config";
    EDL_CHECK(j.contains("text_config") && j["text_config"].is_object(), errc::config, at,
              "a gemma3 (Gemma3ForConditionalGeneration) config keeps its text model's fields in a text_config "
              "object; found ", j.contains("text_config") ? j["text_config"].dump() : std::string("none"));
    ojson t = j["text_config"];
    if (!t.contains("model_type")) t["model_type"] = "gemma3_text";
    EDL_CHECK(t["model_type"] == "gemma3_text", errc::unsupported, at + ".model_type",
              "expected \"gemma3_text\", found ", t["model_type"].dump());
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "tie_word_embeddings"})
      if (!t.contains(k) && j.contains(k)) t[k] = j[k];
    t["architectures"] = ojson::array({"Gemma3ForCausalLM"});  // what a saved copy is
    LlamaConfig cfg = from_json(t, at);
    cfg.source = source;
    cfg.multimodal_type = "gemma3";
    return cfg;
  }

  static LlamaConfig from_file(const std::string& path) {
    const io::JsonConfig c = io::JsonConfig::from_file(path);
    return from_json(c.json(), path);
  }

  /// A hash of every field (EasyDeL's static_hash): configs with the same fields hash alike
  /// whatever their documents' key order; FNV-1a 64 over the key-sorted JSON text, so the value
  /// is the same on every machine and run.
  std::uint64_t static_hash() const {
    const std::string text = nlohmann::json::parse(to_json().dump()).dump();
    std::uint64_t h = 1469598103934665603ull;
    for (const unsigned char ch : text) {
      h ^= ch;
      h *= 1099511628211ull;
    }
    return h;
  }

  /// The HF config.json object: every known field, then `extra`; fields keep the order of the
  /// document this config was read from.
  ojson to_json() const {
    ojson k = ojson::object();
    const auto was_present = [&](const std::string& f) {
      return std::find(key_order_.begin(), key_order_.end(), f) != key_order_.end();
    };
    k["model_type"] = model_type;
    k["vocab_size"] = vocab_size;
    k["hidden_size"] = hidden_size;
    k["intermediate_size"] = intermediate_size;
    k["num_hidden_layers"] = num_hidden_layers;
    k["num_attention_heads"] = num_attention_heads;
    k["num_key_value_heads"] = num_key_value_heads;
    k["head_dim"] = head_size();
    k["max_position_embeddings"] = max_position_embeddings;
    k["rms_norm_eps"] = rms_norm_eps;
    k["rope_theta"] = rope_theta;
    if (!is_gemma() || rope_scaling || was_present("rope_scaling"))
      k["rope_scaling"] = rope_scaling ? rope_scaling->to_json() : ojson(nullptr);
    k["attention_bias"] = attention_bias;
    if (!is_gemma() || mlp_bias || was_present("mlp_bias")) k["mlp_bias"] = mlp_bias;
    k["tie_word_embeddings"] = tie_word_embeddings;
    if (sliding_window || model_type != "llama" || was_present("sliding_window"))
      k["sliding_window"] = sliding_window ? ojson(*sliding_window) : ojson(nullptr);
    if (!is_gemma() || was_present("hidden_act")) k["hidden_act"] = hidden_act;
    k["bos_token_id"] = bos_token_id ? ojson(*bos_token_id) : ojson(nullptr);
    if (eos_token_id.empty() && !eos_token_id_is_list) k["eos_token_id"] = nullptr;
    else if (eos_token_id_is_list || eos_token_id.size() != 1) k["eos_token_id"] = eos_token_id;
    else k["eos_token_id"] = eos_token_id[0];
    if (pad_token_id || was_present("pad_token_id"))
      k["pad_token_id"] = pad_token_id ? ojson(*pad_token_id) : ojson(nullptr);
    k["torch_dtype"] = torch_dtype;
    k["initializer_range"] = initializer_range;
    if (num_labels != 2 || was_present("num_labels")) k["num_labels"] = num_labels;
    if (is_moe()) {
      k[qwen_moe() ? "num_experts" : "num_local_experts"] = num_local_experts;
      k["num_experts_per_tok"] = num_experts_per_tok;
      k["router_aux_loss_coef"] = router_aux_loss_coef;
      k["output_router_logits"] = output_router_logits;
      k["router_jitter_noise"] = router_jitter_noise;
      if (router_z_loss_coef != 0 || was_present("router_z_loss_coef")) k["router_z_loss_coef"] = router_z_loss_coef;
      if (qwen_moe()) {
        k["moe_intermediate_size"] = moe_intermediate_size;
        if (model_type == "qwen2_moe") k["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
        k["norm_topk_prob"] = norm_topk_prob;
        k["decoder_sparse_step"] = decoder_sparse_step;
        k["mlp_only_layers"] = mlp_only_layers;
      }
    }
    if (problem_type || was_present("problem_type"))
      k["problem_type"] = problem_type ? ojson(*problem_type) : ojson(nullptr);

    ojson ex = extra.is_object() ? extra : ojson::object();
    // An id2label of another size would override num_labels when HF reads the file back.
    if (ex.contains("id2label") && ex["id2label"].is_object() &&
        static_cast<std::int64_t>(ex["id2label"].size()) != num_labels) {
      ex.erase("id2label");
      ex.erase("label2id");
      k["num_labels"] = num_labels;
    }
    ojson out = ojson::object();
    for (const auto& key : key_order_) {
      if (k.contains(key)) out[key] = k[key];
      else if (ex.contains(key)) out[key] = ex[key];
    }
    for (auto it = k.begin(); it != k.end(); ++it)
      if (!out.contains(it.key())) out[it.key()] = it.value();
    for (auto it = ex.begin(); it != ex.end(); ++it)
      if (!out.contains(it.key())) out[it.key()] = it.value();
    return out;
  }

  /// Writes config.json (pretty) atomically.
  void save(const std::string& path) const { io::write_file_atomic(path, to_json().dump(2) + "\n"); }

  // ------------------------------------------------------------------ presets
  static std::vector<std::string> preset_names() { return {"tiny", "small", "gqa1b", "small_moe", "small_wide"}; }

  /// The benchmark configs of shared/ANCHORS.md (HF LlamaForCausalLM, untied, eps 1e-5, theta 1e4),
  /// and a mixture-of-experts pair: small_moe, small with 8 experts of small's MLP, 2 per token
  /// (Mixtral-shaped), and small_wide, the dense model with the same active parameters per
  /// token (one MLP twice as wide).
  static LlamaConfig preset(const std::string& name) {
    struct P { const char* name; std::int64_t h, i, l, nh, nkv, v, pos, experts, per_tok; };
    static const P presets[] = {{"tiny", 288, 768, 6, 6, 6, 32000, 256, 0, 0},
                                {"small", 768, 2048, 12, 12, 12, 32000, 1024, 0, 0},
                                {"gqa1b", 2048, 5632, 22, 32, 4, 32000, 2048, 0, 0},
                                {"small_moe", 768, 2048, 12, 12, 12, 32000, 1024, 8, 2},
                                {"small_wide", 768, 4096, 12, 12, 12, 32000, 1024, 0, 0}};
    for (const P& p : presets) {
      if (name != p.name) continue;
      LlamaConfig c;
      c.source = "LlamaConfig preset " + name;
      c.hidden_size = p.h;
      c.intermediate_size = p.i;
      c.num_hidden_layers = p.l;
      c.num_attention_heads = p.nh;
      c.num_key_value_heads = p.nkv;
      c.vocab_size = p.v;
      c.max_position_embeddings = p.pos;
      c.rms_norm_eps = 1e-5;
      c.rope_theta = 10000.0;
      c.tie_word_embeddings = false;
      c.extra["architectures"] = {"LlamaForCausalLM"};
      if (p.experts > 0) {
        c.model_type = "mixtral";
        c.num_local_experts = p.experts;
        c.num_experts_per_tok = p.per_tok;
        c.extra["architectures"] = {"MixtralForCausalLM"};
      }
      c.validate();
      return c;
    }
    std::string valid;
    for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    ::edl::detail::raise(errc::invalid_argument, "LlamaConfig::preset",
                         "unknown preset \"" + name + "\", expected one of " + valid);
  }

  // ------------------------------------------------------------------ parameters
  /// Parameter names and shapes in HF names and HF order (named_parameters() of
  /// LlamaForCausalLM, or ...ForSequenceClassification with head = sequence_classification).
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> parameter_shapes(
      LlamaHead head = LlamaHead::causal_lm) const {
    const std::int64_t H = hidden_size, I = intermediate_size, V = vocab_size, Q = q_size(), KV = kv_size();
    std::vector<std::pair<std::string, std::vector<std::int64_t>>> p;
    p.push_back({"model.embed_tokens.weight", {V, H}});
    for (std::int64_t l = 0; l < num_hidden_layers; ++l) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      p.push_back({pre + "input_layernorm.weight", {H}});
      const std::pair<const char*, std::int64_t> qkv[] = {{"q_proj", Q}, {"k_proj", KV}, {"v_proj", KV}};
      for (const auto& [n, out] : qkv) {
        p.push_back({pre + "self_attn." + n + ".weight", {out, H}});
        if (qkv_bias()) p.push_back({pre + "self_attn." + n + ".bias", {out}});
      }
      p.push_back({pre + "self_attn.o_proj.weight", {H, Q}});
      if (o_bias()) p.push_back({pre + "self_attn.o_proj.bias", {H}});
      if (qk_norm()) {  // one weight per head_dim, shared by the heads
        p.push_back({pre + "self_attn.q_norm.weight", {head_size()}});
        p.push_back({pre + "self_attn.k_norm.weight", {head_size()}});
      }
      p.push_back({pre + "post_attention_layernorm.weight", {H}});
      if (sandwich_norms()) p.push_back({pre + "pre_feedforward_layernorm.weight", {H}});
      if (layer_is_sparse(l) && !qwen_moe()) {  // HF Mixtral: w1 gate, w2 down, w3 up
        p.push_back({pre + "block_sparse_moe.gate.weight", {num_local_experts, H}});
        for (std::int64_t e = 0; e < num_local_experts; ++e) {
          const std::string ex = pre + "block_sparse_moe.experts." + std::to_string(e) + ".";
          p.push_back({ex + "w1.weight", {I, H}});
          p.push_back({ex + "w2.weight", {H, I}});
          p.push_back({ex + "w3.weight", {I, H}});
        }
        continue;
      }
      if (layer_is_sparse(l)) {  // HF Qwen-MoE: mlp.gate, mlp.experts.J.*_proj, mlp.shared_expert*
        const std::int64_t Ie = moe_intermediate_size, Is = shared_expert_size();
        p.push_back({pre + "mlp.gate.weight", {num_local_experts, H}});
        for (std::int64_t e = 0; e < num_local_experts; ++e) {
          const std::string ex = pre + "mlp.experts." + std::to_string(e) + ".";
          p.push_back({ex + "gate_proj.weight", {Ie, H}});
          p.push_back({ex + "up_proj.weight", {Ie, H}});
          p.push_back({ex + "down_proj.weight", {H, Ie}});
        }
        if (Is > 0) {
          p.push_back({pre + "mlp.shared_expert.gate_proj.weight", {Is, H}});
          p.push_back({pre + "mlp.shared_expert.up_proj.weight", {Is, H}});
          p.push_back({pre + "mlp.shared_expert.down_proj.weight", {H, Is}});
          p.push_back({pre + "mlp.shared_expert_gate.weight", {1, H}});
        }
        continue;
      }
      const std::tuple<const char*, std::int64_t, std::int64_t> mlp[] = {
          {"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}};
      for (const auto& [n, out, in] : mlp) {
        p.push_back({pre + "mlp." + n + ".weight", {out, in}});
        if (mlp_bias) p.push_back({pre + "mlp." + n + ".bias", {out}});
      }
      if (sandwich_norms()) p.push_back({pre + "post_feedforward_layernorm.weight", {H}});
    }
    p.push_back({"model.norm.weight", {H}});
    if (head == LlamaHead::causal_lm && !tie_word_embeddings) p.push_back({"lm_head.weight", {V, H}});
    if (head == LlamaHead::sequence_classification) p.push_back({"score.weight", {num_labels, H}});
    return p;
  }

  std::int64_t parameter_count(LlamaHead head = LlamaHead::causal_lm) const {
    std::int64_t n = 0;
    for (const auto& [name, shape] : parameter_shapes(head)) {
      std::int64_t k = 1;
      for (auto d : shape) k *= d;
      n += k;
    }
    return n;
  }

 private:
  std::vector<std::string> key_order_;  // field order of the document read
};

}  // namespace edl::models
