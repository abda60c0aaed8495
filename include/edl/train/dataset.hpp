// edl/train/dataset.hpp
// Training data as sequences of token ids, a deterministic per-epoch order, and collation.
//
// Sources, by file name:
//   *.npy, 2-D [rows, length]  pre-tokenized rows, one sequence each (no separators added);
//                              rows longer than max_sequence_length are truncated at collate
//   *.npy, 1-D                 one token stream, cut into max_sequence_length pieces
//   *.bin                      one token stream of little-endian int32 (no header; what
//                              `np.array(ids, dtype="<i4").tofile(path)` writes), cut likewise
//   *.jsonl                    one JSON object per line; its "text" field is a document, or its
//                              "messages" (a conversation, rendered with the tokenizer's chat
//                              template as transformers' apply_chat_template(tokenize=False))
//   anything else              plain text; lines holding only "%" separate documents
//                              (Debian's fortunes format); no such line: the file is one document
// .npy element types: int32, int64, uint16, uint32. Documents are tokenized, each followed by
// eos, concatenated in file order (packing) and cut into max_sequence_length pieces; the last
// piece may be shorter. Consecutive stream sources share one packed stream.
//
// Order: epoch e visits the sequences in the permutation drawn from fold_in(key, e)
// (Fisher-Yates with counter-based draws), or in file order without shuffling: a pure
// function of (key, epoch), so a resumed run sees the same batches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/io/json.hpp>
#include <edl/io/mmap.hpp>
#include <edl/io/npy.hpp>
#include <edl/nn/module.hpp>
#include <edl/chat/conversation.hpp>
#include <edl/tokenizer/tokenizer.hpp>

namespace edl::train {

/// Sequences stored back to back: sequence i is tokens[offsets[i], offsets[i+1]). A sequence
/// may say which of its tokens the loss scores (`scored`, 1 = a target; supervised fine-tuning
/// scores completions only); without one, every token is scored. A packed sequence also says
/// where its documents start (`document_starts`, 1 = a document's first token): collate then
/// keeps attention inside each document and restarts the positions there.
class TokenDataset {
 public:
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(offsets_.size()) - 1; }
  std::int64_t num_tokens() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  std::span<const std::int32_t> operator[](std::int64_t i) const {
    const auto a = static_cast<std::size_t>(offsets_[static_cast<std::size_t>(i)]);
    const auto b = static_cast<std::size_t>(offsets_[static_cast<std::size_t>(i) + 1]);
    return {tokens_.data() + a, b - a};
  }
  void add(std::span<const std::int32_t> seq) {
    tokens_.insert(tokens_.end(), seq.begin(), seq.end());
    offsets_.push_back(static_cast<std::int64_t>(tokens_.size()));
    if (!scored_.empty() || masked_) scored_.resize(tokens_.size(), 1);
  }
  /// A sequence with its scored mask (scored.size() == seq.size()).
  void add(std::span<const std::int32_t> seq, std::span<const std::uint8_t> scored) {
    EDL_CHECK(scored.size() == seq.size(), errc::shape_mismatch, "TokenDataset::add", "the mask has ", scored.size(),
              " entries for ", seq.size(), " tokens");
    if (!masked_) scored_.assign(tokens_.size(), 1);
    masked_ = true;
    tokens_.insert(tokens_.end(), seq.begin(), seq.end());
    scored_.insert(scored_.end(), scored.begin(), scored.end());
    offsets_.push_back(static_cast<std::int64_t>(tokens_.size()));
  }
  /// Sequence i's mask of scored tokens, or empty when every token is scored.
  std::span<const std::uint8_t> scored(std::int64_t i) const {
    if (!masked_) return {};
    const auto a = static_cast<std::size_t>(offsets_[static_cast<std::size_t>(i)]);
    const auto b = static_cast<std::size_t>(offsets_[static_cast<std::size_t>(i) + 1]);
    return {scored_.data() + a, b - a};
  }
  /// Marks the documents of the last sequence added: starts[k] = 1 where a document begins.
  void set_document_starts(std::span<const std::uint8_t> starts) {
    EDL_CHECK(size() > 0 && static_cast<std::int64_t>(starts.size()) == static_cast<std::int64_t>((*this)[size() - 1].size()),
              errc::shape_mismatch, "TokenDataset::set_document_starts", "expected one entry per token of the last sequence, found ",
              starts.size());
    starts_.resize(tokens_.size() - starts.size(), 0);
    starts_.insert(starts_.end(), starts.begin(), starts.end());
  }
  /// Sequence i's document starts, or empty when it is one document.
  std::span<const std::uint8_t> document_starts(std::int64_t i) const {
    const auto a = static_cast<std::size_t>(offsets_[static_cast<std::size_t>(i)]);
    const auto b = static_cast<std::size_t>(offsets_[static_cast<std::size_t>(i) + 1]);
    if (starts_.size() < b) return {};
    return {starts_.data() + a, b - a};
  }
  /// Tokens the loss scores (as targets) in all sequences.
  std::int64_t num_scored() const noexcept {
    if (!masked_) return num_tokens();
    std::int64_t n = 0;
    for (auto v : scored_) n += v;
    return n;
  }
  template <class T>
  void add(const std::vector<T>& seq) {
    for (auto v : seq) tokens_.push_back(static_cast<std::int32_t>(v));
    offsets_.push_back(static_cast<std::int64_t>(tokens_.size()));
  }
  /// Cuts `stream` into pieces of `len` tokens (the last may be shorter) and adds them; with
  /// `eos` >= 0 the documents are marked (a document starts after each eos).
  void add_stream(const std::vector<std::int32_t>& stream, std::int64_t len, std::int64_t eos = -1) {
    std::vector<std::uint8_t> starts;
    for (std::size_t lo = 0; lo < stream.size(); lo += static_cast<std::size_t>(len)) {
      const std::size_t hi = std::min(stream.size(), lo + static_cast<std::size_t>(len));
      add(std::span<const std::int32_t>(stream.data() + lo, hi - lo));
      if (eos < 0) continue;
      starts.assign(hi - lo, 0);
      for (std::size_t t = lo; t < hi; ++t) starts[t - lo] = t == lo || stream[t - 1] == eos;
      set_document_starts(starts);
    }
  }

 private:
  std::vector<std::int32_t> tokens_;
  std::vector<std::int64_t> offsets_{0};
  std::vector<std::uint8_t> scored_;  // per token when masked_
  std::vector<std::uint8_t> starts_;  // per token of the packed sequences (a prefix of tokens_)
  bool masked_ = false;
};

/// Packs the sequences of `ds` into rows of at most `max_length` tokens (TRL's best-fit
/// decreasing: longest first, each into the fullest row it fits), marking where each row's
/// documents start so that they never attend to each other. A sequence longer than
/// max_length is cut to its first max_length tokens. Deterministic: ties keep dataset order.
inline TokenDataset pack_documents(const TokenDataset& ds, std::int64_t max_length) {
  EDL_CHECK(max_length > 0, errc::invalid_argument, "pack_documents", "max_length must be positive, found ", max_length);
  const auto len = [&](std::int64_t i) { return std::min<std::int64_t>(static_cast<std::int64_t>(ds[i].size()), max_length); };
  std::vector<std::int64_t> order(static_cast<std::size_t>(ds.size()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return len(a) > len(b); });
  std::vector<std::vector<std::int64_t>> rows;
  std::multimap<std::int64_t, std::size_t> room;  // space left -> row (equal space: the earlier row)
  for (std::int64_t i : order) {
    if (len(i) == 0) continue;
    auto it = room.lower_bound(len(i));
    std::size_t r;
    std::int64_t left;
    if (it == room.end()) {
      r = rows.size();
      rows.emplace_back();
      left = max_length;
    } else {
      r = it->second;
      left = it->first;
      room.erase(it);
    }
    rows[r].push_back(i);
    if (left - len(i) > 0) room.emplace(left - len(i), r);
  }
  TokenDataset out;
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> scored, starts;
  for (const auto& row : rows) {
    ids.clear();
    scored.clear();
    starts.clear();
    for (std::int64_t i : row) {
      const auto n = static_cast<std::size_t>(len(i));
      const auto seq = ds[i].first(n);
      const auto m = ds.scored(i);
      ids.insert(ids.end(), seq.begin(), seq.end());
      for (std::size_t t = 0; t < n; ++t) {
        scored.push_back(m.empty() ? 1 : m[t]);
        starts.push_back(t == 0);
      }
    }
    out.add(ids, scored);
    out.set_document_starts(starts);
  }
  return out;
}

/// Documents of a text file: split on lines holding only "%" (fortunes), else the whole file.
inline std::vector<std::string> read_text_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", io::detail::errno_text());
  std::vector<std::string> docs;
  std::string line, doc;
  bool separated = false;
  auto flush = [&] {
    if (!doc.empty()) docs.push_back(doc);
    doc.clear();
  };
  while (std::getline(in, line)) {
    std::string_view l = line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l == "%") {
      separated = true;
      flush();
    } else {
      doc += line;
      doc += '\n';
    }
  }
  flush();
  (void)separated;  // without "%" lines the file is one document
  return docs;
}

/// The documents of a JSON-lines file: each line's "text", or its "messages" rendered with
/// `tokenizer`'s chat template (an error naming the line when there is no tokenizer or template);
/// blank lines skipped.
inline std::vector<std::string> read_jsonl_documents(const std::string& path, const tokenizer::Tokenizer* tokenizer = nullptr) {
  std::ifstream in(path, std::ios::binary);
  EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", io::detail::errno_text());
  std::vector<std::string> docs;
  std::string line;
  std::int64_t n = 0;
  std::optional<chat::ChatTemplate> chat_template;  // parsed at the first "messages" record
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + " line " + std::to_string(n);
    // ordered: a conversation's keys reach the template as written
    const nlohmann::ordered_json j = io::parse_json(line, where);
    if (j.is_object() && j.contains("messages")) {
      EDL_CHECK(tokenizer != nullptr && tokenizer->chat_template(), errc::invalid_argument, where,
                "a \"messages\" record is rendered with the tokenizer's chat template, and ",
                tokenizer ? "the tokenizer has none (tokenizer_config.json \"chat_template\")" : "there is no tokenizer");
      if (!chat_template) chat_template = chat::chat_template_of(*tokenizer, where);
      docs.push_back(chat::render_conversation(*chat_template, *tokenizer, j, {}, where));
      continue;
    }
    EDL_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), errc::format, where,
              "expected an object with a string field \"text\" or a \"messages\" array");
    docs.push_back(j["text"].get<std::string>());
  }
  return docs;
}

namespace detail {

inline bool ends_with(const std::string& s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

/// Reads an integer .npy as int32 values and its shape.
inline std::vector<std::int32_t> load_token_npy(const std::string& path, std::vector<std::size_t>& shape) {
  auto take = [&](const auto& a) {
    shape.assign(a.shape().begin(), a.shape().end());
    std::vector<std::int32_t> v(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto x = a.data()[i];
      EDL_CHECK(static_cast<std::int64_t>(x) >= 0 && static_cast<std::int64_t>(x) <= INT32_MAX, errc::format, path,
                "token ", static_cast<std::int64_t>(x), " at flat index ", i, " is not a valid id");
      v[i] = static_cast<std::int32_t>(x);
    }
    return v;
  };
  try { return take(io::load_npy<std::int32_t>(path)); } catch (const Error& e) { if (e.code() != errc::dtype_mismatch) throw; }
  try { return take(io::load_npy<std::int64_t>(path)); } catch (const Error& e) { if (e.code() != errc::dtype_mismatch) throw; }
  try { return take(io::load_npy<std::uint16_t>(path)); } catch (const Error& e) { if (e.code() != errc::dtype_mismatch) throw; }
  try { return take(io::load_npy<std::uint32_t>(path)); } catch (const Error& e) { if (e.code() != errc::dtype_mismatch) throw; }
  ::edl::detail::raise(errc::dtype_mismatch, path, "token .npy files must hold int32, int64, uint16 or uint32");
}

inline std::vector<std::int32_t> load_token_bin(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", io::detail::errno_text());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string b = ss.str();
  EDL_CHECK(b.size() % 4 == 0, errc::format, path, "a .bin token file holds little-endian int32 values: its size (",
            b.size(), " bytes) must be a multiple of 4");
  std::vector<std::int32_t> v(b.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    EDL_CHECK(v[i] >= 0, errc::format, path, "token ", v[i], " at index ", i, " is negative");
  return v;
}

}  // namespace detail

struct DataOptions {
  std::int64_t max_sequence_length = 2048;
  std::int64_t eos_id = -1;  // appended after each text document; < 0: nothing
  std::int64_t vocab_size = 0;  // > 0: every token must be below it
  bool document_boundaries = false;  // streams: documents (ending at eos) do not attend to each other
};

/// Loads `files` (see the header comment) into sequences of at most max_sequence_length tokens
/// (2-D .npy rows keep their length).
inline TokenDataset load_dataset(const std::vector<std::string>& files, const tokenizer::Tokenizer* tokenizer,
                                 const DataOptions& opt) {
  EDL_CHECK(opt.max_sequence_length > 0, errc::invalid_argument, "load_dataset", "max_sequence_length must be positive");
  TokenDataset ds;
  std::vector<std::int32_t> stream;
  EDL_CHECK(!opt.document_boundaries || opt.eos_id >= 0, errc::invalid_argument, "load_dataset",
            "document boundaries in a token stream are found at eos: give an eos id");
  auto flush = [&] {
    ds.add_stream(stream, opt.max_sequence_length, opt.document_boundaries ? opt.eos_id : -1);
    stream.clear();
  };
  auto add_docs = [&](const std::vector<std::string>& docs, const std::string& path) {
    EDL_CHECK(tokenizer != nullptr, errc::invalid_argument, path, "text data needs a tokenizer");
    for (const auto& d : docs) {
      // A stray non-UTF-8 byte becomes U+FFFD (as Python's open(errors="replace")).
      for (auto id : tokenizer->encode(tokenizer::utf8_lossy(d))) stream.push_back(static_cast<std::int32_t>(id));
      if (opt.eos_id >= 0) stream.push_back(static_cast<std::int32_t>(opt.eos_id));
    }
  };
  for (const auto& f : files) {
    EDL_CHECK(std::filesystem::is_regular_file(f), errc::io, f, "no such file");
    if (detail::ends_with(f, ".npy")) {
      std::vector<std::size_t> shape;
      auto v = detail::load_token_npy(f, shape);
      if (shape.size() == 1) {
        stream.insert(stream.end(), v.begin(), v.end());
      } else {
        EDL_CHECK(shape.size() == 2, errc::format, f, "expected a 1-D stream or 2-D [rows, length] array, found rank ",
                  shape.size());
        flush();
        for (std::size_t r = 0; r < shape[0]; ++r)
          ds.add(std::span<const std::int32_t>(v.data() + r * shape[1], shape[1]));
      }
    } else if (detail::ends_with(f, ".bin")) {
      auto v = detail::load_token_bin(f);
      stream.insert(stream.end(), v.begin(), v.end());
    } else if (detail::ends_with(f, ".jsonl")) {
      add_docs(read_jsonl_documents(f, tokenizer), f);
    } else {
      add_docs(read_text_documents(f), f);
    }
  }
  flush();
  if (opt.vocab_size > 0)
    for (std::int64_t i = 0; i < ds.size(); ++i)
      for (auto t : ds[i])
        EDL_CHECK(t < opt.vocab_size, errc::invalid_argument, "load_dataset", "token ", t, " in sequence ", i,
                  " is outside the model's vocabulary (vocab_size ", opt.vocab_size, ")");
  return ds;
}

/// The order of epoch `epoch`: a permutation of [0, n) drawn from fold_in(key, epoch)
/// (Fisher-Yates, draw i = random_bits_at(k, i)), or 0..n-1 when !shuffle.
inline std::vector<std::int64_t> epoch_order(std::int64_t n, Key key, std::int64_t epoch, bool shuffle) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  if (!shuffle) return p;
  const Key k = fold_in(key, static_cast<std::uint32_t>(epoch));
  for (std::int64_t i = n - 1; i > 0; --i) {
    const std::uint64_t bits = (static_cast<std::uint64_t>(random_bits_at(k, 2 * static_cast<std::uint64_t>(i))) << 32) |
                               random_bits_at(k, 2 * static_cast<std::uint64_t>(i) + 1);
    const std::int64_t j = static_cast<std::int64_t>(bits % static_cast<std::uint64_t>(i + 1));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

enum class Truncation { keep_start, keep_end };
inline Truncation truncation_from_name(const std::string& s) {
  if (s == "keep_start") return Truncation::keep_start;
  if (s == "keep_end") return Truncation::keep_end;
  ::edl::detail::raise(errc::config, "truncation_mode", "expected keep_start or keep_end, found \"" + s + "\"");
}

/// The part of a row's values (tokens, or a per-token mask) that truncation to max_length by
/// `mode` keeps: the first or the last max_length (an empty mask stays empty).
template <class T>
std::span<const T> truncated(std::span<const T> v, std::int64_t max_length, Truncation mode) {
  if (static_cast<std::int64_t>(v.size()) <= max_length) return v;
  const auto keep = static_cast<std::size_t>(max_length);
  return mode == Truncation::keep_start ? v.first(keep) : v.last(keep);
}

/// A padded batch [batch, seq], row-major.
struct Batch {
  std::int64_t batch = 0, seq = 0;
  std::vector<std::int64_t> input_ids, attention_mask, labels;
  std::vector<std::int64_t> position_ids, segment_ids;  // packed rows (documents); else empty
  /// The layout the model's forward takes.
  nn::TokenLayout layout() const noexcept {
    return {batch, seq, position_ids.empty() ? nullptr : position_ids.data(), attention_mask.data(),
            segment_ids.empty() ? nullptr : segment_ids.data()};
  }
  /// Targets the loss scores (HF shift: label[s + 1] for s < seq - 1, not ignore_index).
  std::int64_t target_tokens(std::int64_t ignore_index = -100) const {
    std::int64_t n = 0;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t s = 1; s < seq; ++s) n += labels[static_cast<std::size_t>(b * seq + s)] != ignore_index;
    return n;
  }
};

/// Pads (right) to the longest sequence, truncating sequences longer than max_length by
/// `mode` (keep_start: the first max_length tokens, keep_end: the last). Padding has pad_id,
/// attention_mask 0 and label -100; so has every token whose `scored` entry is 0 (scored[r]
/// empty, or no `scored`: every token of row r is a label). With `starts` (document starts
/// per row, as TokenDataset::document_starts; any row may have none) the batch has segment_ids
/// (1, 2, ... per document of a row; padding 0) and position_ids restarting at each document,
/// and a document's first token is no target (as transformers' DataCollatorWithFlattening).
inline Batch collate(const std::vector<std::span<const std::int32_t>>& seqs, std::int64_t max_length,
                     std::int64_t pad_id, Truncation mode = Truncation::keep_end,
                     const std::vector<std::span<const std::uint8_t>>* scored = nullptr,
                     const std::vector<std::span<const std::uint8_t>>* starts = nullptr) {
  Batch b;
  b.batch = static_cast<std::int64_t>(seqs.size());
  for (const auto& s : seqs) b.seq = std::max<std::int64_t>(b.seq, std::min<std::int64_t>(static_cast<std::int64_t>(s.size()), max_length));
  const std::size_t n = static_cast<std::size_t>(b.batch * b.seq);
  b.input_ids.assign(n, pad_id);
  b.attention_mask.assign(n, 0);
  b.labels.assign(n, -100);
  bool documents = false;
  if (starts)
    for (const auto& st : *starts) documents = documents || !st.empty();
  if (documents) {
    b.position_ids.assign(n, 0);
    b.segment_ids.assign(n, 0);
  }
  for (std::int64_t r = 0; r < b.batch; ++r) {
    const auto s = truncated(seqs[static_cast<std::size_t>(r)], max_length, mode);
    const auto m = truncated(scored ? (*scored)[static_cast<std::size_t>(r)] : std::span<const std::uint8_t>{}, max_length, mode);
    const auto st = truncated(documents ? (*starts)[static_cast<std::size_t>(r)] : std::span<const std::uint8_t>{},
                              max_length, mode);
    std::int64_t segment = 0, pos = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const std::size_t at = static_cast<std::size_t>(r * b.seq) + i;
      b.input_ids[at] = s[i];
      b.attention_mask[at] = 1;
      b.labels[at] = m.empty() || m[i] ? s[i] : -100;
      if (!documents) continue;
      const bool start = i == 0 || (!st.empty() && st[i]);
      if (start) {
        ++segment;
        pos = 0;
        if (i > 0) b.labels[at] = -100;  // not predicted from the previous document
      }
      b.segment_ids[at] = segment;
      b.position_ids[at] = pos++;
    }
  }
  return b;
}

/// Padding-free: the sequences side by side in one row (each truncated to max_length by
/// `mode`), as documents that do not attend to each other (TRL's padding_free, transformers'
/// DataCollatorWithFlattening): no padding is computed, and each sequence's loss is what it
/// would be in a padded batch.
inline Batch collate_padding_free(const std::vector<std::span<const std::int32_t>>& seqs, std::int64_t max_length,
                                  std::int64_t pad_id, Truncation mode = Truncation::keep_end,
                                  const std::vector<std::span<const std::uint8_t>>* scored = nullptr) {
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> mask, starts;
  for (std::size_t r = 0; r < seqs.size(); ++r) {
    const auto s = truncated(seqs[r], max_length, mode);
    const auto m = truncated(scored ? (*scored)[r] : std::span<const std::uint8_t>{}, max_length, mode);
    ids.insert(ids.end(), s.begin(), s.end());
    for (std::size_t i = 0; i < s.size(); ++i) {
      mask.push_back(m.empty() ? 1 : m[i]);
      starts.push_back(i == 0);
    }
  }
  const std::vector<std::span<const std::int32_t>> row{ids};
  const std::vector<std::span<const std::uint8_t>> row_mask{mask}, row_starts{starts};
  return collate(row, static_cast<std::int64_t>(ids.size()), pad_id, mode, &row_mask, &row_starts);
}

/// The batch of dataset rows `rows` (in that order): collate with their scored masks and
/// document starts, or collate_padding_free.
inline Batch collate_rows(const TokenDataset& ds, std::span<const std::int64_t> rows, std::int64_t max_length,
                          std::int64_t pad_id, Truncation mode = Truncation::keep_end, bool padding_free = false) {
  std::vector<std::span<const std::int32_t>> seqs;
  std::vector<std::span<const std::uint8_t>> scored, starts;
  for (std::int64_t i : rows) {
    seqs.push_back(ds[i]);
    scored.push_back(ds.scored(i));
    starts.push_back(ds.document_starts(i));
  }
  if (padding_free) return collate_padding_free(seqs, max_length, pad_id, mode, &scored);
  return collate(seqs, max_length, pad_id, mode, &scored, &starts);
}

/// A user's collator (the seeds' data_collator): the batch of dataset rows `rows`, in that
/// order, in place of collate_rows. Rows of a preference pair stay adjacent (chosen, then
/// rejected). The trainer checks what it returns (check_batch) before the model sees it.
using DataCollator = std::function<Batch(const TokenDataset& data, std::span<const std::int64_t> rows)>;

/// A batch the model can take: positive shape, every vector batch * seq long (position and
/// segment ids may be empty), ids in [0, vocab_size), labels in [0, vocab_size) or -100, a
/// 0/1 attention mask. `where` names the batch's origin in the error.
inline void check_batch(const Batch& b, std::int64_t vocab_size, const std::string& where) {
  EDL_CHECK(b.batch > 0 && b.seq > 0, errc::invalid_argument, where, "expected a batch of positive shape, found [",
            b.batch, ", ", b.seq, "]");
  const std::size_t n = static_cast<std::size_t>(b.batch * b.seq);
  const auto sized = [&](const std::vector<std::int64_t>& v, const char* name, bool optional) {
    EDL_CHECK(v.size() == n || (optional && v.empty()), errc::invalid_argument, where, name, " has ", v.size(),
              " entries, expected batch * seq = ", n, optional ? " (or none)" : "");
  };
  sized(b.input_ids, "input_ids", false);
  sized(b.attention_mask, "attention_mask", false);
  sized(b.labels, "labels", false);
  sized(b.position_ids, "position_ids", true);
  sized(b.segment_ids, "segment_ids", true);
  for (std::size_t i = 0; i < n; ++i) {
    EDL_CHECK(b.input_ids[i] >= 0 && b.input_ids[i] < vocab_size, errc::invalid_argument, where, "input_ids[", i,
              "] is ", b.input_ids[i], ", outside the vocabulary [0, ", vocab_size, ")");
    EDL_CHECK(b.labels[i] == -100 || (b.labels[i] >= 0 && b.labels[i] < vocab_size), errc::invalid_argument, where,
              "labels[", i, "] is ", b.labels[i], ", expected -100 or an id below ", vocab_size);
    EDL_CHECK(b.attention_mask[i] == 0 || b.attention_mask[i] == 1, errc::invalid_argument, where,
              "attention_mask[", i, "] is ", b.attention_mask[i], ", expected 0 or 1");
  }
}

/// Pads (right) the rows of `b` to a multiple of `multiple` positions (transformers'
/// pad_to_multiple_of): what a sequence-parallel mesh axis splits. Padding has pad_id,
/// attention_mask 0, label -100 (and segment 0, position 0 in packed batches).
inline void pad_to_multiple(Batch& b, std::int64_t multiple, std::int64_t pad_id) {
  if (multiple <= 1 || b.seq % multiple == 0) return;
  const std::int64_t S = (b.seq + multiple - 1) / multiple * multiple;
  const auto widen = [&](std::vector<std::int64_t>& v, std::int64_t fill) {
    if (v.empty()) return;
    std::vector<std::int64_t> w(static_cast<std::size_t>(b.batch * S), fill);
    for (std::int64_t r = 0; r < b.batch; ++r)
      std::copy(v.begin() + r * b.seq, v.begin() + (r + 1) * b.seq, w.begin() + r * S);
    v = std::move(w);
  };
  widen(b.input_ids, pad_id);
  widen(b.attention_mask, 0);
  widen(b.labels, -100);
  widen(b.position_ids, 0);
  widen(b.segment_ids, 0);
  b.seq = S;
}

/// Appends rows of padding until the batch size is a multiple of `multiple`: what the data axes
/// of a mesh split. A padding row holds pad_id and no target (label -100); its first position
/// is attended (attention_mask 1, the rest 0) so that no query of it is left without a key, and
/// in packed batches it is one document (segment 1, positions from 0). Losses, accuracies and
/// token counts are those of the batch without it.
inline void pad_rows_to_multiple(Batch& b, std::int64_t multiple, std::int64_t pad_id) {
  if (multiple <= 1 || b.batch % multiple == 0) return;
  const std::int64_t rows = (b.batch + multiple - 1) / multiple * multiple - b.batch;
  const auto n = static_cast<std::size_t>(rows * b.seq);
  b.input_ids.insert(b.input_ids.end(), n, pad_id);
  b.labels.insert(b.labels.end(), n, -100);
  for (std::int64_t r = 0; r < rows; ++r) {
    b.attention_mask.push_back(1);
    b.attention_mask.insert(b.attention_mask.end(), static_cast<std::size_t>(b.seq - 1), 0);
  }
  if (!b.segment_ids.empty()) b.segment_ids.insert(b.segment_ids.end(), n, 1);
  if (!b.position_ids.empty())
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t s = 0; s < b.seq; ++s) b.position_ids.push_back(s);
  b.batch += rows;
}

}  // namespace edl::train
