// edl/lora/config.hpp
// What a LoRA adapter is made of, PEFT's LoraConfig:
//
//   lora::LoraConfig c;
//   c.r = 16;  c.lora_alpha = 32;  c.lora_dropout = 0.05f;
//   c.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};   // or {"all-linear"}
//   c.target_regex = R"(.*\.layers\.[0-3]\.self_attn\.(q|v)_proj)";   // instead: a regex
//
// Which Linears get an adapter, as PEFT decides: a module path (HF names without ".weight",
// "model.layers.0.self_attn.q_proj") matches a name in target_modules when it equals it or
// ends with "." + name; "all-linear" is every Linear of the decoder (not lm_head); a
// target_regex must match the whole path (PEFT's re.fullmatch). JSON uses PEFT's field names
// (adapter_config.json and the training arguments' "lora" section).
#pragma once

#include <cmath>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/json_config.hpp>

namespace edl::lora {

struct LoraConfig {
  std::int64_t r = 8;
  double lora_alpha = 8.0;
  float lora_dropout = 0.0f;
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};  // PEFT's default for Llama
  std::string target_regex;                                        // non-empty: used instead
  bool use_rslora = false;
  std::uint64_t seed = 0;  // A's initialization (B starts at zero)

  /// alpha / r, or alpha / sqrt(r) with rsLoRA.
  float scale() const {
    return static_cast<float>(use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r))
                                         : lora_alpha / static_cast<double>(r));
  }

  void validate(const std::string& where = "lora") const {
    EDL_CHECK(r > 0, errc::config, where, "r must be positive, found ", r);
    EDL_CHECK(std::isfinite(lora_alpha) && lora_alpha > 0, errc::config, where, "lora_alpha must be positive, found ",
              lora_alpha);
    EDL_CHECK(lora_dropout >= 0.0f && lora_dropout < 1.0f, errc::config, where, "lora_dropout must lie in [0, 1), found ",
              lora_dropout);
    EDL_CHECK(!target_modules.empty() || !target_regex.empty(), errc::config, where,
              "target_modules is empty: name the modules to adapt (q_proj, v_proj, ... or all-linear)");
  }
};

/// The Linears of a Llama decoder layer an adapter can wrap.
inline const std::vector<std::string>& adaptable_modules() {
  static const std::vector<std::string> m = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return m;
}

/// Decides, per module path, whether `cfg` targets it.
class TargetMatcher {
 public:
  explicit TargetMatcher(const LoraConfig& cfg, std::string where = "lora") : cfg_(cfg), where_(std::move(where)) {
    if (!cfg.target_regex.empty()) {
      try {
        re_ = std::regex(cfg.target_regex, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        ::edl::detail::raise(errc::config, where_,
                             ::edl::detail::concat("target_modules regex \"", cfg.target_regex, "\" is invalid: ", e.what()));
      }
    }
  }
  bool matches(const std::string& path) const {
    if (!cfg_.target_regex.empty()) return std::regex_match(path, re_);
    for (const std::string& t : cfg_.target_modules)
      if (name_matches(path, t)) return true;
    return false;
  }
  /// Whether target name `t` names the module at `path` (all-linear: any decoder Linear).
  static bool name_matches(const std::string& path, const std::string& t) {
    if (t == "all-linear") return path.rfind("lm_head", 0) != 0;
    return path == t || (path.size() > t.size() && path.compare(path.size() - t.size(), t.size(), t) == 0 &&
                         path[path.size() - t.size() - 1] == '.');
  }

 private:
  LoraConfig cfg_;
  std::string where_;
  std::regex re_;
};

/// The adapter's own fields, PEFT's names: r, lora_alpha, lora_dropout, target_modules (a list
/// of names, or the regex string), use_rslora (the training arguments' "lora" section).
inline nlohmann::ordered_json to_json(const LoraConfig& cfg) {
  nlohmann::ordered_json j;
  j["r"] = cfg.r;
  j["lora_alpha"] = cfg.lora_alpha;
  j["lora_dropout"] = cfg.lora_dropout;
  if (cfg.target_regex.empty()) j["target_modules"] = cfg.target_modules;
  else j["target_modules"] = cfg.target_regex;
  j["use_rslora"] = cfg.use_rslora;
  return j;
}

/// PEFT's adapter_config.json fields for `cfg` (peft_type LORA, bias none).
inline nlohmann::ordered_json to_peft_json(const LoraConfig& cfg, const std::string& base_model) {
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model;
  const nlohmann::ordered_json fields = to_json(cfg);
  for (const auto& [key, value] : fields.items()) j[key] = value;
  j["bias"] = "none";
  j["use_dora"] = false;
  j["fan_in_fan_out"] = false;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["rank_pattern"] = nlohmann::ordered_json::object();
  j["alpha_pattern"] = nlohmann::ordered_json::object();
  j["inference_mode"] = true;
  return j;
}

/// A LoraConfig from PEFT's adapter_config.json (or the training arguments' "lora" section,
/// `where` names it in errors). Settings edl does not implement are refused by name: DoRA,
/// a bias other than "none", modules_to_save, layers_to_transform, rank/alpha patterns,
/// fan_in_fan_out, a peft_type other than LORA.
template <class Json>
LoraConfig from_peft_json(const Json& j, const std::string& where) {
  EDL_CHECK(j.is_object(), errc::config, where, "expected a JSON object, found ", j.type_name());
  LoraConfig c;
  const auto number = [&](const char* key, auto& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    EDL_CHECK(j[key].is_number(), errc::config, where, "\"", key, "\" must be a number, found ", j[key].dump());
    // Range-checked: an r of 1e20 is an error, not an undefined conversion (found by fuzzing).
    out = io::JsonConfig::convert<std::remove_reference_t<decltype(out)>>(io::ojson(j[key]), where + " field " + key);
  };
  const auto refuse_if = [&](const char* key, bool bad, const char* expected) {
    EDL_CHECK(!bad, errc::unsupported, where, "\"", key, "\" is ", j[key].dump(), ": edl supports only ", expected);
  };
  if (j.contains("peft_type")) refuse_if("peft_type", j["peft_type"] != "LORA", "\"LORA\"");
  number("r", c.r);
  number("lora_alpha", c.lora_alpha);
  number("lora_dropout", c.lora_dropout);
  if (j.contains("use_rslora") && !j["use_rslora"].is_null()) {
    EDL_CHECK(j["use_rslora"].is_boolean(), errc::config, where, "\"use_rslora\" must be true or false, found ",
              j["use_rslora"].dump());
    c.use_rslora = j["use_rslora"].template get<bool>();
  }
  if (j.contains("seed")) number("seed", c.seed);
  if (j.contains("target_modules") && !j["target_modules"].is_null()) {
    const auto& t = j["target_modules"];
    if (t.is_string()) {
      const std::string s = t.template get<std::string>();
      c.target_modules.clear();
      if (s == "all-linear") c.target_modules = {s};
      else c.target_regex = s;
    } else {
      EDL_CHECK(t.is_array(), errc::config, where, "\"target_modules\" must be a list of module names or a regex, found ",
                t.dump());
      c.target_modules.clear();
      for (const auto& e : t) {
        EDL_CHECK(e.is_string(), errc::config, where, "\"target_modules\" entries must be strings, found ", e.dump());
        c.target_modules.push_back(e.template get<std::string>());
      }
    }
  }
  if (j.contains("bias")) refuse_if("bias", j["bias"] != "none", "\"none\"");
  if (j.contains("use_dora")) refuse_if("use_dora", j["use_dora"] == true, "false (DoRA is not implemented)");
  if (j.contains("lora_bias")) refuse_if("lora_bias", j["lora_bias"] == true, "false");
  if (j.contains("fan_in_fan_out")) refuse_if("fan_in_fan_out", j["fan_in_fan_out"] == true, "false (Llama's Linears are [out, in])");
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern"})
    if (j.contains(key))
      refuse_if(key, !(j[key].is_null() || (j[key].is_array() && j[key].empty())), "null");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (j.contains(key)) refuse_if(key, !(j[key].is_null() || (j[key].is_object() && j[key].empty())), "{}");
  c.validate(where);
  return c;
}

}  // namespace edl::lora
