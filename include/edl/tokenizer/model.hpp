// edl/tokenizer/model.hpp
// The "model" of a tokenizer.json: a word -> token ids. BPE as HF `tokenizers` runs it
// (merges by rank, byte_fallback to <0xXX> tokens, unk_token with fuse_unk, ignore_merges,
// continuing_subword_prefix / end_of_word_suffix; merges written as "a b" strings or
// ["a", "b"] pairs), Unigram (SentencePiece's: the segmentation of highest total score by
// Viterbi, unknown characters at the lowest score minus 10 and fused, byte_fallback) and
// WordLevel. Other model types are refused at load.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
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
  enum class Kind { bpe, unigram, word_level };

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
    } else if (type == "Unigram") {
      return unigram_from_json(j, at);
    } else {
      detail::raise(errc::unsupported, at, "model type '" + type + "' is not supported (supported: BPE, Unigram, WordLevel)");
    }
    if (!j.contains("vocab") || !j["vocab"].is_object()) detail::raise(errc::format, at, "needs a \"vocab\" object");
    // The id table holds a string per id up to the largest: ids far beyond the number of entries
    // would let a small file allocate gigabytes. Real vocabularies number their n entries 0 ..
    // n - 1; the slack admits ids left to added tokens.
    const std::int64_t n = static_cast<std::int64_t>(j["vocab"].size()), id_limit = n + kIdSlack;
    for (const auto& [tok, id] : j["vocab"].items()) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0)
        detail::raise(errc::format, at + ".vocab[\"" + tok + "\"]", "expected a non-negative integer id; found " + id.dump());
      if (id.get<std::int64_t>() >= id_limit)
        detail::raise(errc::format, at + ".vocab[\"" + tok + "\"]",
                      "id " + id.dump() + " is beyond a vocabulary of " + std::to_string(n) + " entries (ids below " +
                          std::to_string(id_limit) + ": the entry count plus " + std::to_string(kIdSlack) + ")");
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
    if (m.byte_fallback_) m.find_byte_tokens();
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
      // The merged token drops the right side's continuing_subword_prefix (HF's BPE does).
      const bool prefixed = !m.continuing_prefix_.empty() && b.rfind(m.continuing_prefix_, 0) == 0;
      const std::string merged = a + (prefixed ? b.substr(m.continuing_prefix_.size()) : b);
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
    if (kind_ == Kind::unigram) return unigram_tokenize(word, out, where);
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
  static constexpr std::int64_t kIdSlack = std::int64_t{1} << 16;  // ids a vocabulary may skip
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
      if (has_byte_tokens(ch)) {
        for (unsigned char b : ch) push(byte_ids_[b]);
        continue;
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

  /// byte_fallback's tokens <0x00> ... <0xFF> (-1 where the vocab lacks one).
  void find_byte_tokens() {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = vocab_.find(std::string_view(name));
      byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    }
  }

  /// Whether byte_fallback can spell `piece` as byte tokens (every byte has one).
  bool has_byte_tokens(std::string_view piece) const {
    if (!byte_fallback_) return false;
    for (unsigned char b : piece)
      if (byte_ids_[b] < 0) return false;
    return true;
  }

  static Model unigram_from_json(const nlohmann::json& j, const std::string& at) {
    Model m;
    m.kind_ = Kind::unigram;
    if (!j.contains("vocab") || !j["vocab"].is_array() || j["vocab"].empty())
      detail::raise(errc::format, at, "Unigram needs a non-empty \"vocab\" array of [piece, score]");
    double min_score = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < j["vocab"].size(); ++i) {
      const auto& e = j["vocab"][i];
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
        detail::raise(errc::format, at + ".vocab[" + std::to_string(i) + "]", "expected [piece, score]; found " + e.dump().substr(0, 100));
      const auto piece = e[0].get<std::string>();
      m.add_token(piece, static_cast<std::int64_t>(i));
      m.scores_.push_back(e[1].get<double>());
      min_score = std::min(min_score, m.scores_.back());
      m.max_piece_bytes_ = std::max(m.max_piece_bytes_, piece.size());
    }
    if (j.contains("unk_id") && !j["unk_id"].is_null()) {
      const auto u = j["unk_id"].get<std::int64_t>();
      if (u < 0 || u >= m.size()) detail::raise(errc::format, at + ".unk_id", "is not an id of the vocab: " + std::to_string(u));
      m.unk_id_ = u;
    }
    m.unk_score_ = min_score - 10.0;  // SentencePiece's kUnkPenalty
    m.byte_fallback_ = j.value("byte_fallback", false);
    if (m.byte_fallback_) m.find_byte_tokens();
    return m;
  }

  /// HF's Unigram::encode_optimized: the best-scoring path over the lattice of vocabulary
  /// pieces (ties keep the first path found), a character no piece covers costs unk_score;
  /// consecutive unknowns fuse, then an unknown piece becomes byte tokens when byte_fallback
  /// has them all.
  void unigram_tokenize(std::string_view w, std::vector<std::int64_t>& out, const std::string& where) const {
    struct Best {
      std::int64_t id = -1;
      double score = 0;
      std::size_t start = 0;
      bool set = false;
    };
    std::vector<Best> best(w.size() + 1);
    best[0].set = true;
    for (std::size_t start = 0; start < w.size();) {
      const std::size_t ch = std::min(utf8_length(static_cast<unsigned char>(w[start])), w.size() - start);
      if (best[start].set) {
        bool single = false;
        for (std::size_t end = start + 1; end <= w.size() && end - start <= max_piece_bytes_; ++end) {
          if (end < w.size() && (static_cast<unsigned char>(w[end]) >> 6) == 2) continue;  // not a character boundary
          auto it = vocab_.find(w.substr(start, end - start));
          if (it == vocab_.end()) continue;
          const double cand = best[start].score + scores_[static_cast<std::size_t>(it->second)];
          if (!best[end].set || cand > best[end].score) best[end] = {it->second, cand, start, true};
          if (end - start == ch) single = true;
        }
        if (!single) {
          const double cand = best[start].score + unk_score_;
          if (!best[start + ch].set || cand > best[start + ch].score) best[start + ch] = {-1, cand, start, true};
        }
      }
      start += ch;
    }
    // Back from the end: pieces in reverse, unknown runs fused.
    std::vector<std::pair<std::size_t, std::size_t>> spans;  // [start, end) of each piece
    std::vector<bool> unknown;
    for (std::size_t end = w.size(); end > 0;) {
      const Best& b = best[end];
      const bool unk = b.id < 0 || (unk_id_ && b.id == *unk_id_);
      if (unk && !unknown.empty() && unknown.back()) spans.back().first = b.start;
      else spans.emplace_back(b.start, end), unknown.push_back(unk);
      end = b.start;
    }
    for (std::size_t k = spans.size(); k-- > 0;) {
      const auto piece = w.substr(spans[k].first, spans[k].second - spans[k].first);
      if (auto it = vocab_.find(piece); it != vocab_.end()) {
        out.push_back(it->second);
        continue;
      }
      if (has_byte_tokens(piece)) {
        for (unsigned char b : piece) out.push_back(byte_ids_[b]);
        continue;
      }
      if (!unk_id_) detail::raise(errc::invalid_argument, where, "'" + std::string(piece) + "' is not in the vocab and the Unigram model has no unk_id");
      out.push_back(*unk_id_);
    }
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
  std::vector<double> scores_;  // Unigram: log-probability of each piece
  double unk_score_ = 0;
  std::size_t max_piece_bytes_ = 0;
  std::optional<std::int64_t> unk_id_;
  std::shared_ptr<Cache> cache_ = std::make_shared<Cache>();
};

}  // namespace edl::tokenizer
