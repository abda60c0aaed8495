// edl/tokenizer/tokenizer.hpp
// Byte-level tokenizers, saved and loaded as HuggingFace tokenizer.json:
//
//   ByteLevelBPE   GPT-2 style byte-level BPE: text -> pre-tokens (GPT-2's split pattern) ->
//                  bytes -> merges applied by rank. train() learns merges on a corpus;
//                  from_file() loads an HF tokenizer.json (model.type "BPE", byte-level
//                  pre-tokenizer); save() writes one that HF `tokenizers` loads.
//   ByteTokenizer  the same with no merges: ids 0-255 are the bytes, then the specials
//                  <s> (256, bos), </s> (257, eos), <pad> (258): vocab 259.
//
//   auto tok = tokenizer::ByteLevelBPE::train(docs, 1024);  // merges of the most frequent pairs
//   auto ids = tok.encode("héllo");                         // decode(encode(s)) == s for any bytes
//   tok.save("out/tokenizer.json");
//
// Pre-tokenization follows GPT-2's pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  with one approximation: without Unicode tables, every byte
// >= 0x80 counts as a letter (exact on ASCII; non-ASCII letters, the common case, agree).
// Special tokens are not recognized inside text passed to encode() (they are ids the data
// pipeline inserts).
//
// Its own layer (after io/, before train/ and generate/) so that serving loads a tokenizer
// without the trainer.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/mmap.hpp>

namespace edl::tokenizer {

using ojson = nlohmann::ordered_json;

namespace detail {

/// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to 256 + n.
inline const std::array<std::uint32_t, 256>& byte_to_codepoint() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    std::uint32_t n = 0;
    for (int b = 0; b < 256; ++b) t[b] = direct[b] ? static_cast<std::uint32_t>(b) : 256 + n++;
    return t;
  }();
  return table;
}

inline void append_utf8(std::string& s, std::uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// Code points of a UTF-8 string; nullopt when it is not valid UTF-8.
inline std::optional<std::vector<std::uint32_t>> utf8_codepoints(std::string_view s) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return std::nullopt;
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return std::nullopt;
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += static_cast<std::size_t>(len);
  }
  return out;
}

/// The byte-level form of raw bytes (each byte -> its GPT-2 code point, UTF-8 encoded).
inline std::string bytes_to_unicode(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) append_utf8(s, byte_to_codepoint()[b]);
  return s;
}

/// Inverse of bytes_to_unicode; nullopt when a code point is not one of the 256.
inline std::optional<std::string> unicode_to_bytes(std::string_view u) {
  static const std::unordered_map<std::uint32_t, unsigned char> inv = [] {
    std::unordered_map<std::uint32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_codepoint()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  auto cps = utf8_codepoints(u);
  if (!cps) return std::nullopt;
  std::string out;
  for (auto cp : *cps) {
    auto it = inv.find(cp);
    if (it == inv.end()) return std::nullopt;
    out += static_cast<char>(it->second);
  }
  return out;
}

enum class CharClass { letter, number, space, other };
inline CharClass char_class(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return CharClass::letter;
  if (c >= '0' && c <= '9') return CharClass::number;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return CharClass::space;
  return CharClass::other;
}

/// GPT-2 pre-tokenization (see the header comment): calls f(piece) for each piece, in order.
template <class F>
void pretokenize(std::string_view s, F&& f) {
  const std::size_t n = s.size();
  std::size_t i = 0;
  auto cls = [&](std::size_t k) { return char_class(static_cast<unsigned char>(s[k])); };
  while (i < n) {
    if (s[i] == '\'') {  // contractions (case-sensitive, as GPT-2)
      std::size_t len = 0;
      for (std::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"})
        if (s.substr(i, c.size()) == c) { len = c.size(); break; }
      if (len) { f(s.substr(i, len)); i += len; continue; }
    }
    std::size_t j = i;
    if (s[i] == ' ' && i + 1 < n && cls(i + 1) != CharClass::space) j = i + 1;
    const CharClass c = cls(j);
    if (c != CharClass::space) {
      std::size_t k = j + 1;
      while (k < n && cls(k) == c) ++k;
      f(s.substr(i, k - i));
      i = k;
      continue;
    }
    std::size_t k = i;
    while (k < n && cls(k) == CharClass::space) ++k;
    if (k < n && k - i >= 2) k -= 1;  // \s+(?!\S): leave the last space to the next word
    f(s.substr(i, k - i));
    i = k;
  }
}

}  // namespace detail

class ByteLevelBPE {
 public:
  static constexpr const char* kBos = "<s>";
  static constexpr const char* kEos = "</s>";
  static constexpr const char* kPad = "<pad>";

  /// Bytes 0-255 as ids 0-255, then <s>, </s>, <pad>; no merges.
  static ByteLevelBPE byte_level() {
    ByteLevelBPE t;
    for (int b = 0; b < 256; ++b) {
      t.tokens_.push_back(std::string(1, static_cast<char>(b)));
      t.special_.push_back(false);
      t.byte_id_[b] = b;
    }
    for (const char* s : {kBos, kEos, kPad}) t.add_special(s);
    t.find_specials();
    return t;
  }

  /// Learns merges on `docs` until the vocabulary holds `vocab_size` tokens (259 + merges):
  /// each round merges the adjacent pair with the highest count over all pre-tokens; ties go
  /// to the smallest (left id, right id). Stops early when no pair is left.
  static ByteLevelBPE train(const std::vector<std::string>& docs, std::int64_t vocab_size) {
    ByteLevelBPE t = byte_level();
    EDL_CHECK(vocab_size >= t.vocab_size(), errc::invalid_argument, "ByteLevelBPE::train",
              "vocab_size must be at least ", t.vocab_size(), " (bytes and specials), found ", vocab_size);
    std::map<std::string, std::int64_t> counts;
    for (const auto& d : docs) detail::pretokenize(d, [&](std::string_view p) { ++counts[std::string(p)]; });
    std::vector<std::vector<std::int32_t>> words;
    std::vector<std::int64_t> freq;
    for (const auto& [w, c] : counts) {
      std::vector<std::int32_t> ids;
      for (unsigned char b : w) ids.push_back(b);
      if (ids.size() >= 2) { words.push_back(std::move(ids)); freq.push_back(c); }
    }
    std::unordered_map<std::uint64_t, std::int64_t> pairs;
    auto key = [](std::int32_t a, std::int32_t b) { return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b); };
    while (t.vocab_size() < vocab_size) {
      pairs.clear();
      for (std::size_t w = 0; w < words.size(); ++w)
        for (std::size_t i = 0; i + 1 < words[w].size(); ++i) pairs[key(words[w][i], words[w][i + 1])] += freq[w];
      std::uint64_t best = 0;
      std::int64_t best_count = 0;
      for (const auto& [k, c] : pairs)
        if (c > best_count || (c == best_count && k < best)) { best = k; best_count = c; }
      if (best_count == 0) break;
      const std::int32_t a = static_cast<std::int32_t>(best >> 32), b = static_cast<std::int32_t>(best & 0xffffffffu);
      const std::int32_t id = static_cast<std::int32_t>(t.tokens_.size());
      t.add_merge(a, b, t.tokens_[a] + t.tokens_[b]);
      for (auto& w : words) {
        std::size_t o = 0;
        for (std::size_t i = 0; i < w.size(); ++i) {
          if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) { w[o++] = id; ++i; }
          else w[o++] = w[i];
        }
        w.resize(o);
      }
    }
    return t;
  }

  /// Reads an HF tokenizer.json with a byte-level BPE model.
  static ByteLevelBPE from_json(const ojson& j, const std::string& source = "tokenizer.json") {
    auto fail = [&](const std::string& field, const std::string& msg) {
      ::edl::detail::raise(errc::format, source + " field " + field, msg);
    };
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) fail("model", "missing or not an object");
    const ojson& m = j["model"];
    if (!m.contains("type") || m["type"] != "BPE")
      fail("model.type", "expected \"BPE\", found " + (m.contains("type") ? m["type"].dump() : std::string("nothing")));
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail("model.vocab", "missing or not an object");
    // The pre-tokenizer must be byte-level (alone or inside a Sequence).
    bool byte_level = false;
    if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
      const ojson& p = j["pre_tokenizer"];
      if (p.value("type", "") == "ByteLevel") byte_level = true;
      if (p.value("type", "") == "Sequence" && p.contains("pretokenizers"))
        for (const auto& q : p["pretokenizers"])
          if (q.value("type", "") == "ByteLevel") byte_level = true;
    }
    if (!byte_level) fail("pre_tokenizer", "expected a ByteLevel pre-tokenizer (only byte-level BPE is supported)");

    ByteLevelBPE t;
    std::map<std::int64_t, std::pair<std::string, bool>> by_id;  // id -> (bytes or content, special)
    std::unordered_map<std::string, std::int64_t> vocab;         // byte-level string -> id
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const auto& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a.contains("content")) fail("added_tokens", "entry without id/content");
        by_id[a["id"].get<std::int64_t>()] = {a["content"].get<std::string>(), true};
      }
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<std::int64_t>() < 0)
        fail("model.vocab", "id of \"" + it.key() + "\" must be a non-negative integer");
      const std::int64_t id = it.value().get<std::int64_t>();
      vocab[it.key()] = id;
      if (by_id.count(id)) continue;  // an added (special) token also listed in the vocab
      auto bytes = detail::unicode_to_bytes(it.key());
      if (!bytes) fail("model.vocab", "token \"" + it.key() + "\" is not in the byte-level alphabet");
      by_id[id] = {*bytes, false};
    }
    if (by_id.empty()) fail("model.vocab", "is empty");
    const std::int64_t n = by_id.rbegin()->first + 1;
    t.tokens_.assign(static_cast<std::size_t>(n), std::string());
    t.special_.assign(static_cast<std::size_t>(n), false);
    t.present_.assign(static_cast<std::size_t>(n), false);
    for (const auto& [id, e] : by_id) {
      t.tokens_[static_cast<std::size_t>(id)] = e.first;
      t.special_[static_cast<std::size_t>(id)] = e.second;
      t.present_[static_cast<std::size_t>(id)] = true;
    }
    for (int b = 0; b < 256; ++b) {  // a byte missing from the vocab is an error only when encoded
      auto it = vocab.find(detail::bytes_to_unicode(std::string(1, static_cast<char>(b))));
      t.byte_id_[b] = it == vocab.end() ? -1 : it->second;
    }
    if (m.contains("merges") && m["merges"].is_array()) {
      std::size_t rank = 0;
      for (const auto& e : m["merges"]) {
        std::string l, r;
        if (e.is_string()) {
          const std::string s = e.get<std::string>();
          const auto sp = s.find(' ');
          if (sp == std::string::npos) fail("model.merges", "entry \"" + s + "\" is not \"left right\"");
          l = s.substr(0, sp);
          r = s.substr(sp + 1);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
          l = e[0].get<std::string>();
          r = e[1].get<std::string>();
        } else {
          fail("model.merges", "entry " + e.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
        auto il = vocab.find(l), ir = vocab.find(r), im = vocab.find(l + r);
        if (il == vocab.end() || ir == vocab.end() || im == vocab.end())
          fail("model.merges", "merge " + std::to_string(rank) + " (\"" + l + "\", \"" + r +
                                   "\") uses a token missing from the vocab");
        t.merges_[key(il->second, ir->second)] = {static_cast<std::int64_t>(rank), im->second};
        t.merge_list_.emplace_back(il->second, ir->second);
        ++rank;
      }
    }
    t.find_specials();
    return t;
  }

  static ByteLevelBPE from_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", io::detail::errno_text());
    std::stringstream ss;
    ss << in.rdbuf();
    ojson j;
    try {
      j = ojson::parse(ss.str());
    } catch (const std::exception& e) {
      ::edl::detail::raise(errc::format, path, std::string("not valid JSON: ") + e.what());
    }
    return from_json(j, path);
  }

  /// HF tokenizer.json (model BPE, byte-level pre-tokenizer and decoder).
  ojson to_json() const {
    ojson added = ojson::array();
    ojson vocab = ojson::object();
    for (std::size_t id = 0; id < tokens_.size(); ++id) {
      if (!present_[id]) continue;
      if (special_[id]) {
        added.push_back({{"id", id}, {"content", tokens_[id]}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"special", true}});
        vocab[tokens_[id]] = id;
      } else {
        vocab[detail::bytes_to_unicode(tokens_[id])] = id;
      }
    }
    ojson merges = ojson::array();
    for (const auto& [a, b] : merge_list_)
      merges.push_back(detail::bytes_to_unicode(tokens_[static_cast<std::size_t>(a)]) + " " +
                       detail::bytes_to_unicode(tokens_[static_cast<std::size_t>(b)]));
    ojson j = ojson::object();
    j["version"] = "1.0";
    j["truncation"] = nullptr;
    j["padding"] = nullptr;
    j["added_tokens"] = added;
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    j["post_processor"] = nullptr;
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    j["model"] = {{"type", "BPE"},          {"dropout", nullptr},
                  {"unk_token", nullptr},   {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                  {"byte_fallback", false}, {"ignore_merges", false},
                  {"vocab", vocab},         {"merges", merges}};
    return j;
  }
  void save(const std::string& path) const { io::write_file_atomic(path, to_json().dump(2) + "\n"); }

  /// Token ids of `text` (no bos/eos added).
  std::vector<std::int64_t> encode(std::string_view text) const {
    std::vector<std::int64_t> out;
    out.reserve(text.size());
    auto byte = [&](unsigned char b) {
      EDL_CHECK(byte_id_[b] >= 0, errc::invalid_argument, "ByteLevelBPE::encode", "byte ", static_cast<int>(b),
                " has no token in this vocabulary");
      return byte_id_[b];
    };
    if (merges_.empty()) {
      for (unsigned char b : text) out.push_back(byte(b));
      return out;
    }
    std::vector<std::int64_t> sym;
    detail::pretokenize(text, [&](std::string_view piece) {
      sym.clear();
      for (unsigned char b : piece) sym.push_back(byte(b));
      while (sym.size() >= 2) {  // merge the lowest-rank pair, leftmost first
        std::int64_t best_rank = std::numeric_limits<std::int64_t>::max(), best_id = -1;
        std::size_t at = 0;
        for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
          auto it = merges_.find(key(sym[i], sym[i + 1]));
          if (it != merges_.end() && it->second.first < best_rank) {
            best_rank = it->second.first;
            best_id = it->second.second;
            at = i;
          }
        }
        if (best_id < 0) break;
        const std::int64_t a = sym[at], b = sym[at + 1];
        std::size_t o = 0;
        for (std::size_t i = 0; i < sym.size(); ++i) {
          if (i >= at && i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) { sym[o++] = best_id; ++i; }
          else sym[o++] = sym[i];
        }
        sym.resize(o);
      }
      out.insert(out.end(), sym.begin(), sym.end());
    });
    return out;
  }

  /// Text of `ids`; special tokens are dropped unless keep_special.
  std::string decode(std::span<const std::int64_t> ids, bool keep_special = false) const {
    std::string s;
    for (auto id : ids) {
      EDL_CHECK(id >= 0 && id < vocab_size() && present_[static_cast<std::size_t>(id)], errc::invalid_argument,
                "ByteLevelBPE::decode", "id ", id, " is not in the vocabulary (size ", vocab_size(), ")");
      if (special_[static_cast<std::size_t>(id)] && !keep_special) continue;
      s += tokens_[static_cast<std::size_t>(id)];
    }
    return s;
  }
  std::string decode(const std::vector<std::int64_t>& ids, bool keep_special = false) const {
    return decode(std::span<const std::int64_t>(ids), keep_special);
  }

  /// Largest id + 1.
  std::int64_t vocab_size() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  std::size_t num_merges() const noexcept { return merge_list_.size(); }
  std::optional<std::int64_t> bos_id() const { return bos_; }
  std::optional<std::int64_t> eos_id() const { return eos_; }
  std::optional<std::int64_t> pad_id() const { return pad_; }
  /// Id of a special token by its content.
  std::optional<std::int64_t> special_id(std::string_view content) const {
    for (std::size_t i = 0; i < tokens_.size(); ++i)
      if (special_[i] && tokens_[i] == content) return static_cast<std::int64_t>(i);
    return std::nullopt;
  }
  /// Raw bytes of a (non-special) token.
  const std::string& token_bytes(std::int64_t id) const { return tokens_.at(static_cast<std::size_t>(id)); }

 private:
  static std::uint64_t key(std::int64_t a, std::int64_t b) {
    return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b);
  }
  void add_special(const std::string& s) {
    tokens_.push_back(s);
    special_.push_back(true);
    present_.resize(tokens_.size(), true);
  }
  void add_merge(std::int64_t a, std::int64_t b, std::string bytes) {
    const std::int64_t id = vocab_size();
    tokens_.push_back(std::move(bytes));
    special_.push_back(false);
    present_.resize(tokens_.size(), true);
    merges_[key(a, b)] = {static_cast<std::int64_t>(merge_list_.size()), id};
    merge_list_.emplace_back(a, b);
  }
  void find_specials() {
    present_.resize(tokens_.size(), true);
    auto first = [&](std::initializer_list<const char*> names) -> std::optional<std::int64_t> {
      for (const char* n : names)
        if (auto id = special_id(n)) return id;
      return std::nullopt;
    };
    bos_ = first({"<s>", "<|begin_of_text|>", "<bos>", "<|bos|>", "<|startoftext|>"});
    eos_ = first({"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|im_end|>"});
    pad_ = first({"<pad>", "<|pad|>", "[PAD]", "<|padding|>"});
  }

  std::vector<std::string> tokens_;  // raw bytes (specials: their content)
  std::vector<bool> special_, present_;
  std::array<std::int64_t, 256> byte_id_ = [] {
    std::array<std::int64_t, 256> a{};
    a.fill(-1);
    return a;
  }();
  std::unordered_map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> merges_;  // (a, b) -> (rank, id)
  std::vector<std::pair<std::int64_t, std::int64_t>> merge_list_;
  std::optional<std::int64_t> bos_, eos_, pad_;
};

/// The byte-level tokenizer: ids 0-255 are bytes, 256 <s>, 257 </s>, 258 <pad>.
struct ByteTokenizer : ByteLevelBPE {
  ByteTokenizer() : ByteLevelBPE(ByteLevelBPE::byte_level()) {}
};

using Tokenizer = ByteLevelBPE;

}  // namespace edl::tokenizer
