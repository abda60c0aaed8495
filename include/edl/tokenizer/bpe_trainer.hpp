// edl/tokenizer/bpe_trainer.hpp
// Tokenizers edl makes itself: GPT-2-style byte-level BPE, written as an HF tokenizer.json
// that `tokenizers` and transformers load, and read back through tokenizer::Tokenizer.
//
//   auto tok = tokenizer::train_byte_level_bpe(docs, 1024);  // merges of the most frequent pairs
//   auto ids = tok.encode("héllo");                          // decode(encode(s)) == s for any text
//   tok.save("out/");                                        // out/tokenizer.json
//
//   byte_level_tokenizer()  ids 0-255 are the bytes, then <s> (256, bos), </s> (257, eos),
//                           <pad> (258): vocab 259, no merges.
//
// Pre-tokenization is the ByteLevel pre-tokenizer's own (GPT-2's pattern through PCRE2), so
// training counts exactly the words that encoding will see.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/tokenizer/tokenizer.hpp>

namespace edl::tokenizer {

namespace detail {

/// tokenizer.json of a byte-level BPE whose tokens are `tokens` (raw bytes; the first 256 are
/// the bytes), merges given as pairs of ids, and the specials <s>, </s>, <pad> after the bytes.
inline nlohmann::json byte_level_bpe_json(const std::vector<std::string>& tokens,
                                          const std::vector<std::pair<std::int32_t, std::int32_t>>& merges) {
  using json = nlohmann::json;
  static constexpr const char* kSpecials[] = {"<s>", "</s>", "<pad>"};
  json vocab = json::object(), added = json::array(), merge_list = json::array();
  for (std::size_t id = 0; id < 256; ++id) vocab[bytes_to_unicode(tokens[id])] = id;
  for (std::size_t k = 0; k < 3; ++k) {
    vocab[kSpecials[k]] = 256 + k;
    added.push_back({{"id", 256 + k}, {"content", kSpecials[k]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  for (std::size_t id = 259; id < tokens.size(); ++id) vocab[bytes_to_unicode(tokens[id])] = id;
  for (const auto& [a, b] : merges)
    merge_list.push_back(bytes_to_unicode(tokens[static_cast<std::size_t>(a)]) + " " +
                         bytes_to_unicode(tokens[static_cast<std::size_t>(b)]));
  json j = json::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", merge_list}};
  return j;
}

}  // namespace detail

/// Bytes 0-255 as ids 0-255, then <s>, </s>, <pad>; no merges.
inline Tokenizer byte_level_tokenizer() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  return Tokenizer::from_json(detail::byte_level_bpe_json(tokens, {}), nullptr, "byte_level_tokenizer");
}

/// Learns merges on `docs` until the vocabulary holds `vocab_size` tokens (259 + merges): each
/// round merges the adjacent pair with the highest count over all words; ties go to the
/// smallest (left id, right id). Stops early when no pair is left.
inline Tokenizer train_byte_level_bpe(const std::vector<std::string>& docs, std::int64_t vocab_size) {
  EDL_CHECK(vocab_size >= 259, errc::invalid_argument, "train_byte_level_bpe",
            "vocab_size must be at least 259 (bytes and specials), found ", vocab_size);
  const auto gpt2 = PreTokenizer::gpt2_pattern("train_byte_level_bpe");
  std::map<std::string, std::int64_t> counts;
  for (const auto& d : docs) {
    const std::string text = utf8_lossy(d);
    for (auto [b, e] : gpt2->find_all(text)) ++counts[text.substr(b, e - b)];
  }
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (int k = 0; k < 3; ++k) tokens.emplace_back();  // the specials' ids
  std::vector<std::pair<std::int32_t, std::int32_t>> merges;
  std::vector<std::vector<std::int32_t>> words;
  std::vector<std::int64_t> freq;
  for (const auto& [w, c] : counts) {
    std::vector<std::int32_t> ids;
    for (unsigned char b : w) ids.push_back(b);
    if (ids.size() >= 2) {
      words.push_back(std::move(ids));
      freq.push_back(c);
    }
  }
  std::unordered_map<std::uint64_t, std::int64_t> pairs;
  auto key = [](std::int32_t a, std::int32_t b) { return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b); };
  while (static_cast<std::int64_t>(tokens.size()) < vocab_size) {
    pairs.clear();
    for (std::size_t w = 0; w < words.size(); ++w)
      for (std::size_t i = 0; i + 1 < words[w].size(); ++i) pairs[key(words[w][i], words[w][i + 1])] += freq[w];
    std::uint64_t best = 0;
    std::int64_t best_count = 0;
    for (const auto& [k, c] : pairs)
      if (c > best_count || (c == best_count && k < best)) {
        best = k;
        best_count = c;
      }
    if (best_count == 0) break;
    const auto a = static_cast<std::int32_t>(best >> 32), b = static_cast<std::int32_t>(best & 0xffffffffu);
    const auto id = static_cast<std::int32_t>(tokens.size());
    tokens.push_back(tokens[static_cast<std::size_t>(a)] + tokens[static_cast<std::size_t>(b)]);
    merges.emplace_back(a, b);
    for (auto& w : words) {
      std::size_t o = 0;
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          w[o++] = id;
          ++i;
        } else {
          w[o++] = w[i];
        }
      }
      w.resize(o);
    }
  }
  return Tokenizer::from_json(detail::byte_level_bpe_json(tokens, merges), nullptr, "train_byte_level_bpe");
}

}  // namespace edl::tokenizer
