// edl/tokenizer/tokenizer.hpp
// A tokenizer as the hub ships it: tokenizer.json (HF `tokenizers`' format) plus, when present,
// tokenizer_config.json (bos/eos/pad tokens, add_bos_token, chat_template, clean-up flag).
//
//   auto tok = tokenizer::Tokenizer::from_file("Llama-3.2-1B-Instruct");   // folder or tokenizer.json
//   auto ids = tok.encode("Hello <|eot_id|>", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// encode runs HF's pipeline: added tokens are found in the raw text first (special tokens
// written in the text become their ids), each remaining piece is normalized, pre-tokenized
// and tokenized by the model, and the post-processor adds BOS/EOS when asked. decode maps ids
// back to tokens and runs the decoder chain. Every component kind edl does not implement is
// refused at load, naming it: a tokenizer that loads encodes exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/json.hpp>
#include <edl/io/json_config.hpp>
#include <edl/tokenizer/added_tokens.hpp>
#include <edl/tokenizer/decoder.hpp>
#include <edl/tokenizer/model.hpp>
#include <edl/tokenizer/normalizer.hpp>
#include <edl/tokenizer/post_processor.hpp>
#include <edl/tokenizer/pre_tokenizer.hpp>

namespace edl::tokenizer {

class Tokenizer {
 public:
  using json = nlohmann::json;
  using ojson = nlohmann::ordered_json;

  /// From the text of a tokenizer.json and, optionally, a tokenizer_config.json document.
  /// (The text is parsed into an unordered document: nlohmann's ordered_json inserts in
  /// quadratic time, minutes for a 262k-token vocabulary; the text itself is what save() writes.)
  static Tokenizer from_text(std::string text, const ojson& config = nullptr, const std::string& source = "tokenizer.json") {
    const json j = io::parse_json<json>(text, source);
    Tokenizer t = build(j, config, source);
    t.text_ = std::move(text);
    return t;
  }

  /// From a tokenizer.json document and, optionally, a tokenizer_config.json document.
  static Tokenizer from_json(const json& j, const ojson& config = nullptr, const std::string& source = "tokenizer.json") {
    Tokenizer t = build(j, config, source);
    t.text_ = j.dump(2) + "\n";
    return t;
  }

 private:
  static Tokenizer build(const json& j, const ojson& config, const std::string& source) {
    if (!j.is_object()) detail::raise(errc::format, source, "expected a JSON object");
    Tokenizer t;
    t.config_ = config.is_object() ? config : ojson(nullptr);
    t.source_ = source;
    if (!j.contains("model")) detail::raise(errc::format, source, "has no \"model\"");
    t.model_ = Model::from_json(j["model"], source);
    if (j.contains("normalizer") && !j["normalizer"].is_null()) t.normalizer_ = Normalizer::from_json(j["normalizer"], source);
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
      t.pre_tokenizer_ = PreTokenizer::from_json(j["pre_tokenizer"], source);
    if (j.contains("post_processor") && !j["post_processor"].is_null())
      t.post_processor_ = PostProcessor::from_json(j["post_processor"], source);
    if (j.contains("decoder") && !j["decoder"].is_null()) t.decoder_ = Decoder::from_json(j["decoder"], source);

    if (j.contains("added_tokens")) {
      if (!j["added_tokens"].is_array()) detail::raise(errc::format, source + ": added_tokens", "expected an array");
      for (std::size_t i = 0; i < j["added_tokens"].size(); ++i)
        t.added_.push_back(AddedToken::from_json(j["added_tokens"][i], source + ": added_tokens[" + std::to_string(i) + "]"));
    }
    for (std::size_t i = 0; i < t.added_.size(); ++i) {
      auto& a = t.added_[i];
      t.added_by_id_[a.id] = i;
      t.added_by_content_[a.content] = i;
      if (a.normalized && t.normalizer_) t.normalized_matcher_.add(t.normalizer_->normalize(a.content), i);
      else if (a.normalized) t.normalized_matcher_.add(a.content, i);
      else t.raw_matcher_.add(a.content, i);
    }
    t.vocab_size_ = t.model_.size();
    for (const auto& a : t.added_) t.vocab_size_ = std::max(t.vocab_size_, a.id + 1);
    t.read_config();
    return t;
  }

 public:

  /// From a folder (tokenizer.json and, if present, tokenizer_config.json) or a tokenizer.json.
  static Tokenizer from_file(const std::string& path) {
    namespace fs = std::filesystem;
    fs::path file = path, dir = fs::path(path).parent_path();
    if (fs::is_directory(path)) {
      dir = path;
      file = dir / "tokenizer.json";
      if (!fs::exists(file))
        detail::raise(errc::io, path, "no tokenizer.json in this folder (edl reads HF tokenizer.json files; a "
                                      "SentencePiece tokenizer.model alone is not supported)");
    }
    ojson config = nullptr;
    if (auto c = dir / "tokenizer_config.json"; fs::exists(c)) config = io::JsonConfig::from_file(c.string()).json();
    return from_text(io::read_text_file(file.string()), config, file.string());
  }

  // ---------------------------------------------------------------- encode

  /// Token ids of `text` (valid UTF-8). add_special_tokens: the post-processor's BOS/EOS.
  /// Special tokens written in the text are matched either way.
  std::vector<std::int64_t> encode(std::string_view text, bool add_special_tokens = false) const {
    if (auto bad = invalid_utf8_at(text))
      detail::raise(errc::invalid_argument, source_ + ": encode",
                    detail::concat("text is not valid UTF-8 (byte offset ", *bad, ")"));
    std::vector<std::int64_t> ids;
    ids.reserve(text.size() / 3 + 4);
    std::vector<TextSplit> splits = split_on_added({std::string(text), std::nullopt, true}, raw_matcher_, added_);
    std::vector<Piece> words;
    for (auto& s : splits) {
      if (s.id) {
        ids.push_back(*s.id);
        continue;
      }
      if (normalizer_) s.text = normalizer_->normalize(std::move(s.text));
      for (auto& n : split_on_added(s, normalized_matcher_, added_)) {
        if (n.id) {
          ids.push_back(*n.id);
          continue;
        }
        words.assign(1, Piece{std::move(n.text), n.at_start});
        if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(words);
        for (const auto& w : words) model_.tokenize(w.text, ids, source_);
      }
    }
    if (add_special_tokens && post_processor_) return post_processor_->process(std::move(ids));
    return ids;
  }

  // ---------------------------------------------------------------- decode

  /// The text of `ids`; skip_special_tokens drops special added tokens. The clean-up of
  /// tokenizer_config.json's clean_up_tokenization_spaces applies as in transformers.
  std::string decode(std::span<const std::int64_t> ids, bool skip_special_tokens = false) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (auto id : ids) {
      if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
        if (!(skip_special_tokens && added_[it->second].special)) tokens.push_back(added_[it->second].content);
        continue;
      }
      const std::string* t = model_.id_to_token(id);
      if (!t)
        detail::raise(errc::invalid_argument, source_ + ": decode",
                      detail::concat("id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
      tokens.push_back(*t);
    }
    std::string s;
    if (decoder_) {
      s = decoder_->decode(std::move(tokens));
    } else {
      for (std::size_t i = 0; i < tokens.size(); ++i) s += (i ? " " : "") + tokens[i];
    }
    return clean_up_spaces_ ? Decoder::cleanup(std::move(s)) : s;
  }
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special_tokens = false) const {
    return decode(std::span<const std::int64_t>(ids), skip_special_tokens);
  }

  // ---------------------------------------------------------------- vocabulary

  /// Largest id + 1 (model vocabulary and added tokens).
  std::int64_t vocab_size() const noexcept { return vocab_size_; }
  std::optional<std::int64_t> bos_id() const { return bos_; }
  std::optional<std::int64_t> eos_id() const { return eos_; }
  std::optional<std::int64_t> pad_id() const { return pad_; }
  std::optional<std::int64_t> token_to_id(std::string_view token) const {
    if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) return added_[it->second].id;
    return model_.token_to_id(token);
  }
  /// The token string of an id (the vocabulary's form: byte-level or ▁ characters), if any.
  std::optional<std::string> id_to_token(std::int64_t id) const {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
    if (const std::string* t = model_.id_to_token(id)) return *t;
    return std::nullopt;
  }
  bool is_special(std::int64_t id) const {
    auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && added_[it->second].special;
  }
  const std::vector<AddedToken>& added_tokens() const noexcept { return added_; }

  /// tokenizer_config.json's chat_template (the "default" one when it is a named list).
  const std::optional<std::string>& chat_template() const noexcept { return chat_template_; }
  /// tokenizer_config.json's bos_token / eos_token (what chat templates print); unset when the
  /// config does not name one.
  const std::optional<std::string>& bos_token() const noexcept { return bos_token_; }
  const std::optional<std::string>& eos_token() const noexcept { return eos_token_; }
  const ojson& config() const noexcept { return config_; }
  /// The tokenizer.json text (as read, or as built by from_json).
  const std::string& to_text() const noexcept { return text_; }

  /// Writes tokenizer.json and, when the tokenizer came with one, tokenizer_config.json into
  /// `dir`, each atomically.
  void save(const std::string& dir) const {
    namespace fs = std::filesystem;
    fs::path d = dir;
    if (d.extension() == ".json") d = d.parent_path();  // a tokenizer.json path names its folder
    io::write_file_atomic((d / "tokenizer.json").string(), text_);
    if (config_.is_object()) io::write_file_atomic((d / "tokenizer_config.json").string(), config_.dump(2) + "\n");
  }

 private:
  /// bos/eos/pad from tokenizer_config.json (strings or {"content": ...} objects); without one,
  /// the usual names among the special tokens. transformers' Llama and Gemma tokenizers rebuild
  /// the post-processor from add_bos_token/add_eos_token: so does edl.
  void read_config() {
    auto token_of = [&](const char* key) -> std::optional<std::string> {
      if (!config_.is_object() || !config_.contains(key) || config_[key].is_null()) return std::nullopt;
      const auto& v = config_[key];
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
      detail::raise(errc::format, source_ + ": tokenizer_config.json " + key, "expected a string or {\"content\": ...}; found " + v.dump());
    };
    auto id_of = [&](const char* key, std::initializer_list<const char*> fallback) -> std::optional<std::int64_t> {
      if (auto name = token_of(key)) {
        auto id = token_to_id(*name);
        if (!id) detail::raise(errc::format, source_ + ": tokenizer_config.json " + key, "token '" + *name + "' is not in the vocabulary");
        return id;
      }
      if (config_.is_object()) return std::nullopt;
      for (const char* n : fallback)
        if (auto it = added_by_content_.find(n); it != added_by_content_.end()) return added_[it->second].id;
      return std::nullopt;
    };
    bos_ = id_of("bos_token", {"<s>", "<|begin_of_text|>", "<bos>", "<|bos|>", "<|startoftext|>"});
    eos_ = id_of("eos_token", {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|im_end|>"});
    pad_ = id_of("pad_token", {"<pad>", "<|pad|>", "[PAD]", "<|padding|>"});
    bos_token_ = token_of("bos_token");
    eos_token_ = token_of("eos_token");
    if (!config_.is_object()) return;
    clean_up_spaces_ = config_.value("clean_up_tokenization_spaces", false);
    const std::string cls = config_.value("tokenizer_class", std::string());
    const bool rebuilds = cls.rfind("LlamaTokenizer", 0) == 0 || cls.rfind("GemmaTokenizer", 0) == 0 ||
                          cls.rfind("CodeLlamaTokenizer", 0) == 0;
    if (rebuilds && (config_.contains("add_bos_token") || config_.contains("add_eos_token"))) {
      const bool add_bos = config_.value("add_bos_token", true), add_eos = config_.value("add_eos_token", false);
      post_processor_ = PostProcessor::bos_eos(add_bos ? bos_ : std::nullopt, add_eos ? eos_ : std::nullopt);
    }
    if (config_.contains("chat_template")) {
      const auto& ct = config_["chat_template"];
      if (ct.is_string()) {
        chat_template_ = ct.get<std::string>();
      } else if (ct.is_array()) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        for (const auto& e : ct)
          if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template"))
            chat_template_ = e["template"].get<std::string>();
      }
    }
  }

  std::string text_;  // the tokenizer.json as read (save() writes it back unchanged)
  ojson config_;
  std::string source_;
  Model model_;
  std::optional<Normalizer> normalizer_;
  std::optional<PreTokenizer> pre_tokenizer_;
  std::optional<PostProcessor> post_processor_;
  std::optional<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::int64_t, std::size_t> added_by_id_;
  std::unordered_map<std::string, std::size_t> added_by_content_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::int64_t vocab_size_ = 0;
  std::optional<std::int64_t> bos_, eos_, pad_;
  std::optional<std::string> bos_token_, eos_token_;
  std::optional<std::string> chat_template_;
  bool clean_up_spaces_ = false;
};

/// Text that grows token by token (HF's DecodeStream): step() returns the new text once it
/// is complete (a multi-byte character split across tokens waits for its last byte), and what
/// the decoder does at a word's start (Metaspace, Strip) is decided with the previous tokens in
/// view, so the pieces concatenate to decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false)
      : tok_(&tok), skip_(skip_special_tokens) {}

  std::string step(std::int64_t id) {
    if (prefix_.empty() && !ids_.empty()) {
      std::string p = tok_->decode(ids_, skip_);
      if (!ends_with_replacement(p)) {
        prefix_ = std::move(p);
        prefix_index_ = ids_.size();
      }
    }
    ids_.push_back(id);
    std::string s = tok_->decode(ids_, skip_);
    if (s.size() > prefix_.size() && !ends_with_replacement(s)) {
      if (s.compare(0, prefix_.size(), prefix_) != 0)
        detail::raise(errc::invalid_argument, "StreamDecoder",
                      detail::concat("token ", id, " changed text already streamed ('", prefix_, "' -> '", s, "')"));
      std::string added = s.substr(prefix_.size());
      const std::size_t new_prefix_index = ids_.size() - prefix_index_;
      ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
      prefix_ = tok_->decode(ids_, skip_);
      prefix_index_ = new_prefix_index;
      return added;
    }
    return {};
  }

 private:
  static bool ends_with_replacement(const std::string& s) {
    return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
  }
  const Tokenizer* tok_;
  bool skip_;
  std::vector<std::int64_t> ids_;
  std::string prefix_;
  std::size_t prefix_index_ = 0;
};

}  // namespace edl::tokenizer
