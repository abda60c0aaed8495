// edl/tokenizer/post_processor.hpp
// The "post_processor" of a tokenizer.json: the special tokens around an encoded text when the
// caller asks for them (add_special_tokens): TemplateProcessing, BertProcessing,
// RobertaProcessing, ByteLevel (nothing to add) and Sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/tokenizer/normalizer.hpp>

namespace edl::tokenizer {

class PostProcessor {
 public:
  /// An item of a template: the ids of a special token, or the text's own ids (is_sequence).
  struct Item {
    bool is_sequence = false;
    std::vector<std::int64_t> ids;
  };

  static PostProcessor from_json(const nlohmann::json& j, const std::string& where = "tokenizer.json") {
    const std::string at = where + ": post_processor";
    const auto type = component_type(j, at);
    PostProcessor p;
    if (type == "Sequence") {
      if (!j.contains("processors") || !j["processors"].is_array())
        detail::raise(errc::format, at, "Sequence needs a \"processors\" array");
      for (const auto& c : j["processors"]) {
        auto q = from_json(c, where);
        if (!q.template_.empty()) p.template_ = q.template_;  // ByteLevel adds nothing; the last template wins
      }
    } else if (type == "ByteLevel") {
    } else if (type == "TemplateProcessing") {
      if (!j.contains("single") || !j["single"].is_array()) detail::raise(errc::format, at, "TemplateProcessing needs a \"single\" array");
      const auto& specials = j.contains("special_tokens") ? j["special_tokens"] : nlohmann::json::object();
      for (const auto& item : j["single"]) {
        if (item.contains("Sequence")) {
          p.template_.push_back({true, {}});
        } else if (item.contains("SpecialToken")) {
          const auto name = item["SpecialToken"].at("id").get<std::string>();
          if (!specials.contains(name) || !specials[name].contains("ids"))
            detail::raise(errc::format, at, "special token '" + name + "' of the template is not in special_tokens");
          p.template_.push_back({false, specials[name]["ids"].get<std::vector<std::int64_t>>()});
        } else {
          detail::raise(errc::format, at, "template item must be Sequence or SpecialToken; found " + item.dump());
        }
      }
    } else if (type == "BertProcessing" || type == "RobertaProcessing") {
      auto id_of = [&](const char* k) {
        if (!j.contains(k) || !j[k].is_array() || j[k].size() != 2 || !j[k][1].is_number_integer())
          detail::raise(errc::format, at, std::string(type) + " needs \"" + k + "\": [token, id]");
        return j[k][1].get<std::int64_t>();
      };
      p.template_ = {{false, {id_of("cls")}}, {true, {}}, {false, {id_of("sep")}}};
    } else {
      detail::raise(errc::unsupported, at,
                    "post-processor type '" + type +
                        "' is not supported (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)");
    }
    return p;
  }

  /// A template of bos?, text, eos? (what transformers builds from add_bos_token/add_eos_token).
  static PostProcessor bos_eos(std::optional<std::int64_t> bos, std::optional<std::int64_t> eos) {
    PostProcessor p;
    if (bos) p.template_.push_back({false, {*bos}});
    p.template_.push_back({true, {}});
    if (eos) p.template_.push_back({false, {*eos}});
    return p;
  }

  std::vector<std::int64_t> process(std::vector<std::int64_t> ids) const {
    if (template_.empty()) return ids;
    std::vector<std::int64_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& item : template_) {
      if (item.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
    return out;
  }

 private:
  std::vector<Item> template_;
};

}  // namespace edl::tokenizer
