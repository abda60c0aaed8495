// edl/models/llama/auto_model.hpp
// The head a checkpoint names (config.json's "architectures"), read as HF's AutoModel and
// EasyDeL's AutoEasyDeLModelFor... classes read it.
//
//   auto any = models::auto_from_pretrained(dir);      // the head the folder names
//   std::visit([&](auto& m) { ... }, any);             // LlamaForCausalLM or LlamaForSequenceClassification
//   auto cls = models::sequence_classification_from_pretrained(dir);   // a classifier from either
//
// A classifier read from a causal-LM checkpoint (fine-tuning a released base model to classify,
// HF's "newly initialized: score.weight") gets the decoder's weights and a new score head drawn
// from N(0, initializer_range) by `head_key`; the checkpoint's lm_head is left unread.
#pragma once

#include <filesystem>
#include <string>
#include <variant>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sequence_classification.hpp>

namespace edl::models {

/// The head config.json's "architectures" names: ...ForSequenceClassification is a classifier;
/// ...ForCausalLM, or no "architectures" (older and hand-written configs), a causal LM. Other
/// heads (token classification, question answering, ...) are an error naming the field.
inline LlamaHead head_of(const LlamaConfig& cfg) {
  const auto it = cfg.extra.find("architectures");
  if (it == cfg.extra.end() || it->is_null()) return LlamaHead::causal_lm;
  EDL_CHECK(it->is_array() && !it->empty() && (*it)[0].is_string(), errc::config, cfg.where("architectures"),
            "expected a list of class names, found ", it->dump());
  const std::string name = (*it)[0].get<std::string>();
  if (name.ends_with("ForSequenceClassification")) return LlamaHead::sequence_classification;
  if (name.ends_with("ForCausalLM") || name.ends_with("ForConditionalGeneration")) return LlamaHead::causal_lm;
  ::edl::detail::raise(errc::unsupported, cfg.where("architectures"),
                       "edl reads ...ForCausalLM and ...ForSequenceClassification heads, found \"" + name + "\"");
}

/// A LlamaForSequenceClassification from `dir` (config.json and safetensors weights): a
/// classifier's checkpoint is read whole; a causal LM's gives the decoder, and the score head is
/// drawn from N(0, initializer_range) by `head_key` (its lm_head is not read). num_labels comes
/// from config.json (num_labels or id2label; HF's default 2).
template <class Pol = DefaultPolicy>
LlamaForSequenceClassification<Pol> sequence_classification_from_pretrained(const std::filesystem::path& dir,
                                                                           const LoadOptions& opt = {},
                                                                           Key head_key = Key::from_seed(0)) {
  const std::string w = (dir / "config.json").string();
  EDL_CHECK(dir.extension() != ".gguf", errc::unsupported, dir.string(),
            "a GGUF file holds a causal LM; a classifier reads a safetensors folder");
  EDL_CHECK(opt.transform_rules.empty(), errc::unsupported, w,
            "loading rules apply to causal LMs (from_pretrained); a classifier reads HF's names");
  const auto cfg = LlamaConfig::from_file(w);
  const LlamaHead head = head_of(cfg);
  const auto ckpt = io::ShardedCheckpoint::open(dir.string());
  // As from_pretrained: the decoder's shapes are checked against the tensors present before
  // anything the size of the config's claim is allocated (the heads are checked on loading).
  LoadOptions lenient = opt;
  lenient.allow_missing = lenient.allow_unexpected = true;
  detail::check_shapes_before_allocating(cfg, ckpt, lenient);
  LlamaForSequenceClassification<Pol> m(cfg);
  if (head == LlamaHead::sequence_classification) {
    load_weights(m, ckpt, opt);
    return m;
  }
  // A causal LM's checkpoint: everything but the head.
  const LoadReport r = load_weights(m, ckpt, lenient);
  for (const std::string& name : r.missing)
    EDL_CHECK(opt.allow_missing || name == "score.weight", errc::format, detail::checkpoint_source(ckpt) + " tensor " + name,
              "the model needs this parameter, but the checkpoint does not hold it");
  for (const std::string& name : r.unexpected)
    EDL_CHECK(opt.allow_unexpected || name == "lm_head.weight", errc::format,
              detail::checkpoint_source(ckpt) + " tensor " + name, "the classifier has no such parameter");
  m.score.init(head_key, static_cast<float>(cfg.initializer_range));
  return m;
}

/// The models auto_from_pretrained returns.
template <class Pol = DefaultPolicy>
using AnyLlama = std::variant<LlamaForCausalLM<Pol>, LlamaForSequenceClassification<Pol>>;

/// The model `dir` names in config.json's "architectures" (HF's AutoModel.from_pretrained):
/// from_pretrained's causal LM, or sequence_classification_from_pretrained's classifier. A
/// .gguf file is a causal LM.
template <class Pol = DefaultPolicy>
AnyLlama<Pol> auto_from_pretrained(const std::filesystem::path& dir, const LoadOptions& opt = {}) {
  if (dir.extension() != ".gguf" &&
      head_of(LlamaConfig::from_file((dir / "config.json").string())) == LlamaHead::sequence_classification)
    return sequence_classification_from_pretrained<Pol>(dir, opt);
  return from_pretrained<Pol>(dir, opt);
}

}  // namespace edl::models
