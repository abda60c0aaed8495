// edl/tokenizer/model.hpp
// The "model" of a tokenizer.json: a word -> token ids. BPE as HF `tokenizers` runs it
// (merges by rank, byte_fallback to <0xXX> tokens, unk_token with fuse_unk, ignore_merges,
// continuing_subword_prefix / end_of_word_suffix; merges written as "a b" strings or
// ["a", "b"] pairs) and WordLevel. Other model types are refused at load.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/tokenizer/unicode.hpp>

namespace edl::tokenizer {

/// string -> id with lookups by string_view (no temporary strings on the hot path).
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, std::int64_t, StringHash, std::equal_to<>>;

class Model {
 public:
  enum class Kind { bpe, word_level };

  static Model from_json(const nlohmann::json& j, const std::string& where = "tokenizer.json") {
    const std::string at = where + ": model";
    if (!j.is_object()) detail::raise(errc::format, at, "expected an object");
    const std::string type = j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                             : j.contains("merges")                      ? "BPE"
                                                                         : "";
    Model m;
    if (type == "BPE") {
      m.kind_ = Kind::bpe;
    } else if (type == "WordLevel") {
      m.kind_ = Kind::word_level;
    } else {
      detail::raise(errc::unsupported, at, "model type '" + type + "' is not supported (supported: BPE, WordLevel)");
    }
    if (!j.contains("vocab") || !j["vocab"].is_object()) detail::raise(errc::format, at, "needs a \"vocab\" object");
    for (const auto& [tok, id] : j["vocab"].items()) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0)
        detail::raise(errc::format, at + ".vocab[\"" + tok + "\"]", "expected a non-negative integer id; found " + id.dump());
      m.add_token(tok, id.get<std::int64_t>());
    }
    auto opt_string = [&](const char* k) -> std::optional<std::string> {
      if (!j.contains(k) || j[k].is_null()) return std::nullopt;
      if (!j[k].is_string()) detail::raise(errc::format, at + "." + k, "expected a string or null; found " + j[k].dump());
      return j[k].get<std::string>();
    };
    m.unk_token_ = opt_string("unk_token");
    if (m.unk_token_ && !m.vocab_.count(*m.unk_token_) && m.kind_ == Kind::word_level)
      detail::raise(errc::format, at + ".unk_token", "'" + *m.unk_token_ + "' is not in the vocab");
    if (m.kind_ == Kind::word_level) return m;

    if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"].get<double>() != 0.0)
      detail::raise(errc::unsupported, at + ".dropout", "BPE dropout is a training-time augmentation; edl encodes without it");
    m.continuing_prefix_ = opt_string("continuing_subword_prefix").value_or("");
    m.end_suffix_ = opt_string("end_of_word_suffix").value_or("");
    m.fuse_unk_ = j.value("fuse_unk", false);
    m.byte_fallback_ = j.value("byte_fallback", false);
    m.ignore_merges_ = j.value("ignore_merges", false);
    if (m.byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        auto it = m.vocab_.find(std::string_view(name));
        m.byte_ids_[b] = it == m.vocab_.end() ? -1 : it->second;
      }
    }
    if (!j.contains("merges") || !j["merges"].is_array()) detail::raise(errc::format, at, "BPE needs a \"merges\" array");
    std::int64_t rank = 0;
    for (const auto& mj : j["merges"]) {
      std::string a, b;
      if (mj.is_string()) {
        const auto s = mj.get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          detail::raise(errc::format, at + ".merges[" + std::to_string(rank) + "]",
                        "expected \"left right\" (one space); found '" + s + "'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
        a = mj[0].get<std::string>();
        b = mj[1].get<std::string>();
      } else {
        detail::raise(errc::format, at + ".merges[" + std::to_string(rank) + "]",
                      "expected \"left right\" or [\"left\", \"right\"]; found " + mj.dump());
      }
      const auto ia = m.vocab_.find(a), ib = m.vocab_.find(b);
      std::string merged = a + b.substr(std::min(m.continuing_prefix_.size(), b.size()) *
                                        (b.compare(0, m.continuing_prefix_.size(), m.continuing_prefix_) == 0));
      const auto im = m.vocab_.find(merged);
      if (ia == m.vocab_.end() || ib == m.vocab_.end() || im == m.vocab_.end())
        detail::raise(errc::format, at + ".merges[" + std::to_string(rank) + "]",
                      "merge '" + a + "' + '" + b + "' uses a token that is not in the vocab");
      m.merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank, im->second));
      ++rank;
    }
    return m;
  }

  Kind kind() const noexcept { return kind_; }
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  std::optional<std::int64_t> token_to_id(std::string_view token) const {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(std::int64_t id) const {
    if (id < 0 || id >= size() || !has_[static_cast<std::size_t>(id)]) return nullptr;
    return &tokens_[static_cast<std::size_t>(id)];
  }

  /// Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<std::int64_t>& out, const std::string& where) const {
    if (word.empty()) return;
    if (kind_ == Kind::word_level) {
      if (auto id = token_to_id(word)) return out.push_back(*id);
      if (!unk_token_) detail::raise(errc::invalid_argument, where, "word '" + std::string(word) + "' is not in the vocab and there is no unk_token");
      return out.push_back(vocab_.find(*unk_token_)->second);
    }
    if (ignore_merges_)
      if (auto id = token_to_id(word)) return out.push_back(*id);
    if (word.size() <= kCachedWordBytes) {
      std::lock_guard<std::mutex> lock(cache_->mutex);
      auto it = cache_->words.find(word);
      if (it != cache_->words.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const std::size_t first = out.size();
    merge_word(word, out, where);
    if (word.size() <= kCachedWordBytes) {
      std::lock_guard<std::mutex> lock(cache_->mutex);
      if (cache_->words.size() >= kCacheCapacity) cache_->words.clear();
      cache_->words.emplace(std::string(word), std::vector<std::int64_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
    }
  }

 private:
  static constexpr std::size_t kCachedWordBytes = 256;
  static constexpr std::size_t kCacheCapacity = 1 << 16;

  static std::uint64_t pair_key(std::int64_t a, std::int64_t b) {
    return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint64_t>(b);
  }

  void add_token(const std::string& tok, std::int64_t id) {
    if (id >= (std::int64_t{1} << 31)) detail::raise(errc::format, "tokenizer.json: model.vocab", "id " + std::to_string(id) + " is too large");
    vocab_[tok] = id;
    if (static_cast<std::size_t>(id) >= tokens_.size()) {
      tokens_.resize(static_cast<std::size_t>(id) + 1);
      has_.resize(static_cast<std::size_t>(id) + 1, false);
    }
    tokens_[static_cast<std::size_t>(id)] = tok;
    has_[static_cast<std::size_t>(id)] = true;
  }

  /// HF's BPE::merge_word: characters (with prefix/suffix, byte fallback, unk fusing), then the
  /// lowest-ranked adjacent pair merged first, leftmost on ties.
  void merge_word(std::string_view w, std::vector<std::int64_t>& out, const std::string& where) const {
    struct Symbol {
      std::int64_t id;
      int prev, next;
      bool alive;
    };
    std::vector<Symbol> sym;
    std::optional<std::int64_t> unk;  // a pending unk (fuse_unk joins neighbours into one)
    auto push = [&](std::int64_t id) { sym.push_back({id, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, true}); };
    std::string buf;
    for (std::size_t i = 0; i < w.size();) {
      std::size_t n = utf8_length(static_cast<unsigned char>(w[i]));
      n = std::min(n, w.size() - i);
      const bool is_first = i == 0, is_last = i + n == w.size();
      std::string_view ch = w.substr(i, n);
      i += n;
      if (!continuing_prefix_.empty() || !end_suffix_.empty()) {
        buf.assign(is_first ? "" : continuing_prefix_);
        buf.append(ch);
        if (is_last) buf.append(end_suffix_);
        ch = buf;
      }
      if (auto it = vocab_.find(ch); it != vocab_.end()) {
        if (unk) push(*unk), unk.reset();
        push(it->second);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
        if (all) {
          for (unsigned char b : ch) push(byte_ids_[b]);
          continue;
        }
      }
      if (unk_token_) {
        auto u = vocab_.find(*unk_token_);
        if (u == vocab_.end()) detail::raise(errc::format, where, "unk_token '" + *unk_token_ + "' is not in the vocab");
        if (unk && !fuse_unk_) push(*unk);
        if (!unk || !fuse_unk_) unk = u->second;
      }
    }
    if (unk) push(*unk);
    if (sym.empty()) return;
    sym.back().next = -1;

    struct Merge {
      std::int64_t rank;
      int pos;
      std::int64_t new_id;
      bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Merge, std::vector<Merge>, std::greater<>> queue;
    auto consider = [&](int pos) {
      const int nx = sym[static_cast<std::size_t>(pos)].next;
      if (nx < 0) return;
      auto it = merges_.find(pair_key(sym[static_cast<std::size_t>(pos)].id, sym[static_cast<std::size_t>(nx)].id));
      if (it != merges_.end()) queue.push({it->second.first, pos, it->second.second});
    };
    for (int k = 0; k + 1 < static_cast<int>(sym.size()); ++k) consider(k);
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      auto& left = sym[static_cast<std::size_t>(top.pos)];
      if (!left.alive || left.next < 0) continue;
      auto& right = sym[static_cast<std::size_t>(left.next)];
      auto it = merges_.find(pair_key(left.id, right.id));
      if (it == merges_.end() || it->second.second != top.new_id) continue;  // stale entry
      left.id = top.new_id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) sym[static_cast<std::size_t>(right.next)].prev = top.pos;
      if (left.prev >= 0) consider(left.prev);
      consider(top.pos);
    }
    for (const auto& s : sym)
      if (s.alive) out.push_back(s.id);
  }

  struct Cache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<std::int64_t>, StringHash, std::equal_to<>> words;
  };

  Kind kind_ = Kind::bpe;
  Vocab vocab_;
  std::vector<std::string> tokens_;
  std::vector<bool> has_;
  std::unordered_map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> merges_;  // (a, b) -> (rank, merged id)
  std::optional<std::string> unk_token_;
  std::string continuing_prefix_, end_suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<std::int64_t, 256> byte_ids_{};
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();
};

}  // namespace edl::tokenizer
