// edl/tokenizer/pre_tokenizer.hpp
// The "pre_tokenizer" of a tokenizer.json: one normalized piece of text -> the words the model
// tokenizes one by one. Kinds as HF `tokenizers` defines them: Sequence, Split (string or regex,
// with the five delimiter behaviors and invert), ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Punctuation. Unknown kinds are refused at load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/tokenizer/normalizer.hpp>
#include <edl/tokenizer/unicode.hpp>

namespace edl::tokenizer {

/// A piece of text on its way to the model. at_start: the piece begins at offset 0 of the text
/// passed to encode (Metaspace's prepend_scheme "first" looks at it).
struct Piece {
  std::string text;
  bool at_start = false;
};

/// How a Split keeps the delimiters it finds (HF's SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

/// Splits s at `matches` (sorted, non-overlapping) by `behavior`; empty pieces are dropped.
inline std::vector<Piece> split_pieces(const Piece& p, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                                       SplitBehavior behavior, bool invert) {
  struct Span {
    std::size_t b, e;
    bool is_match;
  };
  std::vector<Span> spans;
  std::size_t last = 0;
  for (auto [b, e] : matches) {
    if (b > last) spans.push_back({last, b, invert});
    spans.push_back({b, e, !invert});
    last = e;
  }
  if (last < p.text.size() || spans.empty()) spans.push_back({last, p.text.size(), invert});

  std::vector<Span> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::removed:
      for (const auto& s : spans)
        if (!s.is_match) kept.push_back(s);
      break;
    case SplitBehavior::isolated: kept = spans; break;
    case SplitBehavior::merged_with_previous:
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !kept.empty()) kept.back().e = s.e;
        else kept.push_back(s);
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) kept.back().b = it->b;
        else kept.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::contiguous:
      for (std::size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].is_match == previous_match) kept.back().e = spans[i].e;
        else kept.push_back(spans[i]);
        previous_match = spans[i].is_match;
      }
      break;
  }
  std::vector<Piece> out;
  for (const auto& s : kept)
    if (s.e > s.b) out.push_back({p.text.substr(s.b, s.e - s.b), p.at_start && s.b == 0});
  return out;
}

class PreTokenizer {
 public:
  enum class Kind { sequence, split, byte_level, metaspace, digits, whitespace, whitespace_split, punctuation };

  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where = "tokenizer.json") {
    const std::string at = where + ": pre_tokenizer";
    const auto type = component_type(j, at);
    PreTokenizer t;
    if (type == "Sequence") {
      t.kind_ = Kind::sequence;
      t.children_ = sequence_children<PreTokenizer>(j, "pretokenizers", at, [&](const auto& c) { return from_json(c, where); });
    } else if (type == "Split") {
      t.kind_ = Kind::split;
      t.pattern_ = std::make_shared<Pattern>(Pattern::from_json(j.at("pattern"), at + " Split"));
      t.behavior_ = behavior_from(j.value("behavior", std::string("Isolated")), at);
      t.invert_ = j.value("invert", false);
    } else if (type == "ByteLevel") {
      t.kind_ = Kind::byte_level;
      t.add_prefix_space_ = j.value("add_prefix_space", true);
      t.use_regex_ = j.value("use_regex", true);
      if (t.use_regex_) t.pattern_ = gpt2_pattern(at);
    } else if (type == "Metaspace") {
      t.kind_ = Kind::metaspace;
      t.replacement_ = j.value("replacement", std::string("\xE2\x96\x81"));
      t.pattern_ = std::make_shared<Pattern>(Pattern::of_string(t.replacement_));
      t.split_ = j.value("split", true);
      std::string scheme = j.value("prepend_scheme", std::string());
      if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";  // older files
      if (scheme != "always" && scheme != "first" && scheme != "never")
        detail::raise(errc::format, at, "Metaspace prepend_scheme must be always, first or never; found '" + scheme + "'");
      t.prepend_ = scheme;
    } else if (type == "Digits") {
      t.kind_ = Kind::digits;
      t.individual_digits_ = j.value("individual_digits", false);
    } else if (type == "Whitespace") {
      t.kind_ = Kind::whitespace;
      t.pattern_ = std::make_shared<Pattern>();
      t.pattern_->is_regex = true;
      t.pattern_->regex = Regex("\\w+|[^\\w\\s]+", at);
    } else if (type == "WhitespaceSplit") {
      t.kind_ = Kind::whitespace_split;
    } else if (type == "Punctuation") {
      t.kind_ = Kind::punctuation;
      t.behavior_ = behavior_from(j.value("behavior", std::string("Isolated")), at);
    } else {
      detail::raise(errc::unsupported, at,
                    "pre-tokenizer type '" + type +
                        "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace, Digits, Whitespace, "
                        "WhitespaceSplit, Punctuation)");
    }
    return t;
  }

  /// The GPT-2 pattern ByteLevel splits with when use_regex is set.
  static std::shared_ptr<Pattern> gpt2_pattern(const std::string& where) {
    auto p = std::make_shared<Pattern>();
    p->is_regex = true;
    p->regex = Regex("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", where);
    return p;
  }

  /// Splits every piece; byte-level kinds also map the bytes to their byte-level characters.
  void pre_tokenize(std::vector<Piece>& pieces) const {
    if (kind_ == Kind::sequence) {
      for (const auto& c : children_) c.pre_tokenize(pieces);
      return;
    }
    std::vector<Piece> out;
    out.reserve(pieces.size());
    for (auto& p : pieces) {
      for (auto& q : split_one(std::move(p))) out.push_back(std::move(q));
    }
    pieces = std::move(out);
  }

 private:
  static SplitBehavior behavior_from(const std::string& b, const std::string& at) {
    if (b == "Removed") return SplitBehavior::removed;
    if (b == "Isolated") return SplitBehavior::isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
    if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
    if (b == "Contiguous") return SplitBehavior::contiguous;
    detail::raise(errc::format, at, "unknown split behavior '" + b + "'");
  }

  template <class Pred>
  static std::vector<std::pair<std::size_t, std::size_t>> char_matches(std::string_view s, Pred pred) {
    std::vector<std::pair<std::size_t, std::size_t>> m;
    for (std::size_t i = 0; i < s.size();) {
      std::size_t n = 0;
      if (pred(codepoint_at(s, i, &n))) m.emplace_back(i, i + n);
      i += n;
    }
    return m;
  }

  std::vector<Piece> split_one(Piece p) const {
    switch (kind_) {
      case Kind::split: return split_pieces(p, pattern_->find_all(p.text), behavior_, invert_);
      case Kind::byte_level: {
        if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
        std::vector<Piece> words = use_regex_ ? split_pieces(p, pattern_->find_all(p.text), SplitBehavior::isolated, false)
                                              : std::vector<Piece>{p};
        for (auto& w : words) w.text = bytes_to_unicode(w.text);
        return words;
      }
      case Kind::metaspace: {
        static const Pattern space = Pattern::of_string(" ");
        Piece q{space.replace_all(p.text, replacement_), p.at_start};
        const bool starts = q.text.compare(0, replacement_.size(), replacement_) == 0;
        if (!starts && (prepend_ == "always" || (prepend_ == "first" && p.at_start))) q.text = replacement_ + q.text;
        if (!split_) return {q};
        return split_pieces(q, pattern_->find_all(q.text), SplitBehavior::merged_with_next, false);
      }
      case Kind::digits: {
        auto m = char_matches(p.text, [](std::uint32_t c) {
          const auto t = u_charType(static_cast<UChar32>(c));
          return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
        });
        return split_pieces(p, m, individual_digits_ ? SplitBehavior::isolated : SplitBehavior::contiguous, false);
      }
      case Kind::whitespace: return split_pieces(p, pattern_->find_all(p.text), SplitBehavior::removed, true);
      case Kind::whitespace_split:
        return split_pieces(p, char_matches(p.text, [](std::uint32_t c) { return is_whitespace(c); }),
                            SplitBehavior::removed, false);
      case Kind::punctuation:
        return split_pieces(p, char_matches(p.text, [](std::uint32_t c) { return u_ispunct(static_cast<UChar32>(c)) != 0; }),
                            behavior_, false);
      case Kind::sequence: break;
    }
    return {p};
  }

  Kind kind_ = Kind::sequence;
  std::vector<PreTokenizer> children_;
  std::shared_ptr<Pattern> pattern_;
  SplitBehavior behavior_ = SplitBehavior::isolated;
  bool invert_ = false, add_prefix_space_ = false, use_regex_ = true, split_ = true, individual_digits_ = false;
  std::string replacement_, prepend_ = "always";
};

}  // namespace edl::tokenizer
