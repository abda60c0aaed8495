// edl/tokenizer/decoder.hpp
// The "decoder" of a tokenizer.json: tokens -> text, as HF `tokenizers` chains them: ByteLevel,
// Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece, BPEDecoder, Sequence. Each kind maps
// a list of token strings to a list (decode_chain); the result is their concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/tokenizer/normalizer.hpp>
#include <edl/tokenizer/unicode.hpp>

namespace edl::tokenizer {

class Decoder {
 public:
  enum class Kind { sequence, byte_level, metaspace, byte_fallback, fuse, strip, replace, word_piece, bpe };

  static Decoder from_json(const nlohmann::json& j, const std::string& where = "tokenizer.json") {
    const std::string at = where + ": decoder";
    const auto type = component_type(j, at);
    Decoder d;
    if (type == "Sequence") {
      d.kind_ = Kind::sequence;
      d.children_ = sequence_children<Decoder>(j, "decoders", at, [&](const auto& c) { return from_json(c, where); });
    } else if (type == "ByteLevel") {
      d.kind_ = Kind::byte_level;
    } else if (type == "Metaspace") {
      d.kind_ = Kind::metaspace;
      d.content_ = j.value("replacement", std::string("\xE2\x96\x81"));
      d.pattern_ = std::make_shared<Pattern>(Pattern::of_string(d.content_));
      std::string scheme = j.value("prepend_scheme", std::string());
      if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
      d.strip_first_ = scheme != "never";
    } else if (type == "ByteFallback") {
      d.kind_ = Kind::byte_fallback;
    } else if (type == "Fuse") {
      d.kind_ = Kind::fuse;
    } else if (type == "Strip") {
      d.kind_ = Kind::strip;
      d.content_ = j.at("content").get<std::string>();
      d.start_ = j.value("start", 0);
      d.stop_ = j.value("stop", 0);
    } else if (type == "Replace") {
      d.kind_ = Kind::replace;
      d.pattern_ = std::make_shared<Pattern>(Pattern::from_json(j.at("pattern"), at + " Replace"));
      d.content_ = j.at("content").get<std::string>();
    } else if (type == "WordPiece") {
      d.kind_ = Kind::word_piece;
      d.content_ = j.value("prefix", std::string("##"));
      d.cleanup_ = j.value("cleanup", true);
    } else if (type == "BPEDecoder") {
      d.kind_ = Kind::bpe;
      d.content_ = j.value("suffix", std::string("</w>"));
      d.pattern_ = std::make_shared<Pattern>(Pattern::of_string(d.content_));
    } else {
      detail::raise(errc::unsupported, at,
                    "decoder type '" + type +
                        "' is not supported (supported: Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, Strip, "
                        "Replace, WordPiece, BPEDecoder)");
    }
    return d;
  }

  std::string decode(std::vector<std::string> tokens) const {
    std::string s;
    for (const auto& t : decode_chain(std::move(tokens))) s += t;
    return s;
  }

  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const {
    switch (kind_) {
      case Kind::sequence:
        for (const auto& c : children_) tokens = c.decode_chain(std::move(tokens));
        return tokens;
      case Kind::byte_level: {
        std::string bytes;
        for (const auto& t : tokens) {
          if (auto b = unicode_to_bytes(t)) bytes += *b;
          else bytes += t;  // not byte-level characters (an added token): its own bytes
        }
        return {utf8_lossy(bytes)};
      }
      case Kind::metaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = pattern_->replace_all(tokens[i], i == 0 && strip_first_ ? "" : " ");
        return tokens;
      case Kind::byte_fallback: {
        std::vector<std::string> out;
        std::string pending;
        std::size_t count = 0;
        auto flush = [&] {
          if (!count) return;
          if (invalid_utf8_at(pending)) {
            for (std::size_t k = 0; k < count; ++k) out.push_back("\xEF\xBF\xBD");
          } else {
            out.push_back(pending);
          }
          pending.clear();
          count = 0;
        };
        for (auto& t : tokens) {
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
              std::isxdigit(static_cast<unsigned char>(t[4]))) {
            pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
            ++count;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        return out;
      }
      case Kind::fuse: {
        std::string s;
        for (const auto& t : tokens) s += t;
        return {s};
      }
      case Kind::strip:
        for (auto& t : tokens) {
          std::size_t b = 0, e = t.size();
          for (int k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0 && b + content_.size() <= e; ++k)
            b += content_.size();
          for (int k = 0; k < stop_ && e >= b + content_.size() && t.compare(e - content_.size(), content_.size(), content_) == 0; ++k)
            e -= content_.size();
          t = t.substr(b, e - b);
        }
        return tokens;
      case Kind::replace:
        for (auto& t : tokens) t = pattern_->replace_all(t, content_);
        return tokens;
      case Kind::word_piece:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          auto& t = tokens[i];
          if (i != 0) {
            if (t.compare(0, content_.size(), content_) == 0) t = t.substr(content_.size());
            else t = " " + t;
          }
          if (cleanup_) t = cleanup(t);
        }
        return tokens;
      case Kind::bpe:
        for (std::size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = pattern_->replace_all(tokens[i], i + 1 == tokens.size() ? "" : " ");
        return tokens;
    }
    return tokens;
  }

  /// transformers' clean_up_tokenization: the spaces an English word tokenizer put before
  /// punctuation and contractions.
  static std::string cleanup(std::string s) {
    static const std::vector<std::pair<Pattern, std::string>> rules = [] {
      std::vector<std::pair<Pattern, std::string>> r;
      for (auto [from, to] : {std::pair{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
                              {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}})
        r.emplace_back(Pattern::of_string(from), to);
      return r;
    }();
    for (const auto& [from, to] : rules) s = from.replace_all(s, to);
    return s;
  }

 private:
  Kind kind_ = Kind::sequence;
  std::vector<Decoder> children_;
  std::string content_;
  std::shared_ptr<Pattern> pattern_;
  int start_ = 0, stop_ = 0;
  bool strip_first_ = true, cleanup_ = true;
};

}  // namespace edl::tokenizer
