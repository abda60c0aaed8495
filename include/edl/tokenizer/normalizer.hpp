// edl/tokenizer/normalizer.hpp
// The "normalizer" of a tokenizer.json: text -> text before pre-tokenization, as HF `tokenizers`
// defines each kind: Sequence, NFC/NFD/NFKC/NFKD, Lowercase, Strip, Prepend, Replace.
// A kind edl does not implement is refused at load (never skipped).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/tokenizer/unicode.hpp>

namespace edl::tokenizer {

/// The "type" of a tokenizer.json component, or an error naming the component (`at`).
inline std::string component_type(const nlohmann::json& j, const std::string& at) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    detail::raise(errc::format, at, "expected an object with a \"type\"; found " + j.dump().substr(0, 200));
  return j["type"].get<std::string>();
}

/// The children of a Sequence component (the array under `key`), each read by `read`.
template <class T, class Read>
std::vector<T> sequence_children(const nlohmann::json& j, const char* key, const std::string& at, Read read) {
  if (!j.contains(key) || !j[key].is_array())
    detail::raise(errc::format, at, std::string("Sequence needs a \"") + key + "\" array");
  std::vector<T> out;
  for (const auto& c : j[key]) out.push_back(read(c));
  return out;
}

/// A literal string or a regex, as tokenizer.json writes a pattern: {"String": s} | {"Regex": r}.
struct Pattern {
  std::string literal;
  Regex regex;
  bool is_regex = false;

  static Pattern of_string(std::string s) {
    Pattern p;
    p.literal = std::move(s);
    return p;
  }

  static Pattern from_json(const nlohmann::json& j, const std::string& where) {
    Pattern p;
    if (j.is_object() && j.contains("String") && j["String"].is_string()) {
      p.literal = j["String"].get<std::string>();
    } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
      p.is_regex = true;
      p.regex = Regex(j["Regex"].get<std::string>(), where);
    } else if (j.is_string()) {
      p.literal = j.get<std::string>();
    } else {
      detail::raise(errc::format, where, "pattern must be {\"String\": ...} or {\"Regex\": ...}; found " + j.dump());
    }
    return p;
  }

  /// Matches [begin, end) in s, left to right, non-overlapping.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view s) const {
    if (is_regex) return regex.find_all(s);
    std::vector<std::pair<std::size_t, std::size_t>> out;
    if (literal.empty()) return out;
    for (std::size_t at = s.find(literal); at != std::string_view::npos; at = s.find(literal, at + literal.size()))
      out.emplace_back(at, at + literal.size());
    return out;
  }

  std::string replace_all(std::string_view s, std::string_view content) const {
    std::string out;
    std::size_t last = 0;
    for (auto [b, e] : find_all(s)) {
      out.append(s.substr(last, b - last));
      out.append(content);
      last = e;
    }
    out.append(s.substr(last));
    return out;
  }
};

class Normalizer {
 public:
  enum class Kind { sequence, nfc, nfd, nfkc, nfkd, lowercase, strip, prepend, replace };

  static Normalizer from_json(const nlohmann::json& j, const std::string& where = "tokenizer.json") {
    const std::string at = where + ": normalizer";
    const auto type = component_type(j, at);
    Normalizer n;
    if (type == "Sequence") {
      n.kind_ = Kind::sequence;
      n.children_ = sequence_children<Normalizer>(j, "normalizers", at, [&](const auto& c) { return from_json(c, where); });
    } else if (type == "NFC") {
      n.kind_ = Kind::nfc;
    } else if (type == "NFD") {
      n.kind_ = Kind::nfd;
    } else if (type == "NFKC") {
      n.kind_ = Kind::nfkc;
    } else if (type == "NFKD") {
      n.kind_ = Kind::nfkd;
    } else if (type == "Lowercase") {
      n.kind_ = Kind::lowercase;
    } else if (type == "Strip") {
      n.kind_ = Kind::strip;
      n.left_ = j.value("strip_left", true);
      n.right_ = j.value("strip_right", true);
    } else if (type == "Prepend") {
      n.kind_ = Kind::prepend;
      n.content_ = j.at("prepend").get<std::string>();
    } else if (type == "Replace") {
      n.kind_ = Kind::replace;
      n.pattern_ = std::make_shared<Pattern>(Pattern::from_json(j.at("pattern"), at + " Replace"));
      n.content_ = j.at("content").get<std::string>();
    } else {
      detail::raise(errc::unsupported, at,
                    "normalizer type '" + type +
                        "' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace)");
    }
    return n;
  }

  std::string normalize(std::string s) const {
    switch (kind_) {
      case Kind::sequence:
        for (const auto& c : children_) s = c.normalize(std::move(s));
        return s;
      case Kind::nfc: return tokenizer::normalize(s, NormalForm::nfc);
      case Kind::nfd: return tokenizer::normalize(s, NormalForm::nfd);
      case Kind::nfkc: return tokenizer::normalize(s, NormalForm::nfkc);
      case Kind::nfkd: return tokenizer::normalize(s, NormalForm::nfkd);
      case Kind::lowercase: return tokenizer::lowercase(s);
      case Kind::strip: return strip(s);
      case Kind::prepend: return s.empty() ? s : content_ + s;
      case Kind::replace: return pattern_->replace_all(s, content_);
    }
    return s;
  }

 private:
  std::string strip(const std::string& s) const {
    std::size_t b = 0, e = s.size();
    if (left_)
      while (b < e) {
        std::size_t n = 0;
        if (!is_whitespace(codepoint_at(s, b, &n))) break;
        b += n;
      }
    if (right_)
      while (e > b) {
        const std::size_t k = char_start_before(s, e);
        if (!is_whitespace(codepoint_at(s, k))) break;
        e = k;
      }
    return s.substr(b, e - b);
  }

  Kind kind_ = Kind::sequence;
  std::vector<Normalizer> children_;
  std::string content_;
  std::shared_ptr<Pattern> pattern_;
  bool left_ = true, right_ = true;
};

}  // namespace edl::tokenizer
