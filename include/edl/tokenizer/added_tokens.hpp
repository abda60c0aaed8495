// edl/tokenizer/added_tokens.hpp
// Added tokens (special and not) found in the text before the model sees it, as HF `tokenizers`
// does: leftmost-longest matches, single_word (only between non-word characters), lstrip/rstrip
// (the match swallows the whitespace beside it), and normalized (matched in the normalized text
// instead of the raw one).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/tokenizer/unicode.hpp>

namespace edl::tokenizer {

struct AddedToken {
  std::string content;
  std::int64_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;

  static AddedToken from_json(const nlohmann::json& j, const std::string& where) {
    if (!j.is_object() || !j.contains("content") || !j["content"].is_string() || !j.contains("id") ||
        !j["id"].is_number_integer() || j["id"].get<std::int64_t>() < 0)
      detail::raise(errc::format, where, "an added token needs a string \"content\" and a non-negative \"id\"; found " +
                                             j.dump().substr(0, 200));
    AddedToken t;
    t.content = j["content"].get<std::string>();
    t.id = j["id"].get<std::int64_t>();
    t.special = j.value("special", false);
    t.lstrip = j.value("lstrip", false);
    t.rstrip = j.value("rstrip", false);
    t.single_word = j.value("single_word", false);
    t.normalized = j.value("normalized", !t.special);
    if (t.content.empty()) detail::raise(errc::format, where, "an added token's content is empty");
    return t;
  }
};

/// A byte trie over added-token contents: leftmost-longest matching in one pass.
class AddedTokenMatcher {
 public:
  void add(std::string_view content, std::size_t token_index) {
    if (nodes_.empty()) nodes_.emplace_back();
    std::size_t n = 0;
    for (unsigned char c : content) {
      auto it = nodes_[n].next.find(c);
      if (it == nodes_[n].next.end()) {
        nodes_[n].next.emplace(c, nodes_.size());
        n = nodes_.size();
        nodes_.emplace_back();
      } else {
        n = it->second;
      }
    }
    nodes_[n].token = token_index;
  }
  bool empty() const noexcept { return nodes_.size() <= 1; }

  /// The longest token starting at s[i]: (token index, end offset).
  std::optional<std::pair<std::size_t, std::size_t>> longest_at(std::string_view s, std::size_t i) const {
    if (nodes_.empty()) return std::nullopt;
    std::optional<std::pair<std::size_t, std::size_t>> best;
    std::size_t n = 0;
    for (std::size_t k = i; k < s.size(); ++k) {
      auto it = nodes_[n].next.find(static_cast<unsigned char>(s[k]));
      if (it == nodes_[n].next.end()) break;
      n = it->second;
      if (nodes_[n].token) best = std::make_pair(*nodes_[n].token, k + 1);
    }
    return best;
  }

 private:
  struct Node {
    std::map<unsigned char, std::size_t> next;
    std::optional<std::size_t> token;
  };
  std::vector<Node> nodes_;
};

/// One piece of a text after added-token matching: either an added token (id) or plain text.
struct TextSplit {
  std::string text;
  std::optional<std::int64_t> id;
  bool at_start = false;
};

/// HF's AddedVocabulary::find_matches over one piece of text.
inline std::vector<TextSplit> split_on_added(const TextSplit& piece, const AddedTokenMatcher& matcher,
                                             const std::vector<AddedToken>& tokens) {
  const std::string_view s = piece.text;
  if (matcher.empty() || s.empty()) return {piece};
  auto ends_with_word = [&](std::size_t end) { return end > 0 && is_word_char(codepoint_at(s, char_start_before(s, end))); };
  auto starts_with_word = [&](std::size_t b) { return b < s.size() && is_word_char(codepoint_at(s, b)); };

  std::vector<TextSplit> out;
  std::size_t start_offset = 0;
  for (std::size_t i = 0; i < s.size();) {
    auto m = matcher.longest_at(s, i);
    if (!m) {
      i += utf8_length(static_cast<unsigned char>(s[i]));
      continue;
    }
    const AddedToken& t = tokens[m->first];
    std::size_t start = i, stop = m->second;
    i = stop;
    if (t.single_word && ((start != 0 && ends_with_word(start)) || (stop != s.size() && starts_with_word(stop)))) continue;
    if (t.lstrip) {
      std::size_t b = start;
      while (b > start_offset) {
        const std::size_t k = char_start_before(s, b);
        if (!is_whitespace(codepoint_at(s, k))) break;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        std::size_t n = 0;
        if (!is_whitespace(codepoint_at(s, stop, &n))) break;
        stop += n;
      }
      i = stop;
    }
    if (start_offset < start)
      out.push_back({std::string(s.substr(start_offset, start - start_offset)), std::nullopt, piece.at_start && start_offset == 0});
    out.push_back({std::string(s.substr(start, stop - start)), t.id, false});
    start_offset = stop;
  }
  if (start_offset < s.size())
    out.push_back({std::string(s.substr(start_offset)), std::nullopt, piece.at_start && start_offset == 0});
  return out;
}

}  // namespace edl::tokenizer
