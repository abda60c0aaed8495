// edl/models/llama/gguf.hpp
// Llama models as llama.cpp GGUF files (architecture "llama"), both ways (docs/gguf.md):
//
//   models::save_gguf("m.gguf", model, {.type = "q8_0", .tokenizer_dir = "ckpt/"});  // llama.cpp loads it
//   auto m = models::from_gguf<>("m.gguf");                                          // f32/f16/bf16/q8_0/q4_0
//
// The file follows llama.cpp's convert_hf_to_gguf.py (LlamaModel): metadata llama.* (context,
// embedding and feed-forward lengths, block count, heads, kv heads, rms eps, rope base and
// dimension count, key/value lengths when head_dim != hidden / heads), tensors token_embd,
// blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
// ffn_down}, output_norm and output (absent when the embeddings are tied), each 2-D weight
// stored [out, in] row-major, which is GGUF dims {in, out}. Norms and biases are F32.
// Mixtral (convert_hf_to_gguf.py's MixtralModel, still architecture "llama"): llama.expert_count
// and llama.expert_used_count, the router as blk.N.ffn_gate_inp (F32) and each expert Linear
// merged into one 3-D tensor, blk.N.ffn_{gate,up,down}_exps with dims {in, out, experts}
// (w1, w3, w2 of expert 0, then 1, ...).
//
// The rope permutation: HF rotates the two halves of each head (x_i with x_{i + D/2});
// llama.cpp rotates adjacent pairs (x_{2i} with x_{2i+1}). So the rows of q_proj (n_head
// heads) and k_proj (n_kv_head heads), and their biases, are stored reordered: file row
// h*D + 2j + s holds HF row h*D + s*D/2 + j (j < D/2, s in {0, 1}). from_gguf undoes it. The
// permutation moves whole rows, so quantized blocks move as they are.
//
// Types: "f32" and "f16" store every 2-D weight so; "q8_0" and "q4_0" store the decoder's
// Linears in that block format (a Linear already quantized to it is written block for block,
// another is dequantized and quantized again) and token_embd / output in q8_0, as llama.cpp
// does (GgufSaveOptions::embeddings chooses otherwise). A weight whose row does not split into
// blocks of 32 falls back to F16, as convert_hf_to_gguf.py does.
//
// Rope scaling: linear as llama.rope.scaling.{type,factor}; llama3 as the tensor rope_freqs.weight
// (a factor per frequency, what llama.cpp reads) plus edl.rope_scaling.* keys (what edl reads).
// The vocabulary (tokenizer.ggml.*) comes from an HF tokenizer.json: byte-level BPE as "gpt2",
// BPE with byte_fallback as "llama"; without one, a byte-level placeholder of the model's size.
//
// Reading: F32, F16, BF16, Q8_0 and Q4_0 tensors. Embeddings, norms and the head become the
// policy's dtype (quantized ones dequantized); decoder Linears stored Q8_0 / Q4_0 become
// quantized Linears holding the file's bytes. Every problem is an edl::Error whose where() is
// the file and whose message names the tensor or key.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numbers>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/policy.hpp>
#include <edl/io/gguf.hpp>
#include <edl/io/json_config.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/matrix.hpp>
#include <edl/quant/quantize.hpp>

namespace edl::models {

struct GgufSaveOptions {
  /// Storage of the 2-D weights: f32 | f16 | q8_0 | q4_0 (general.file_type 0, 1, 7, 2).
  std::string type = "f32";
  /// A folder holding tokenizer.json (and optionally tokenizer_config.json); empty: a
  /// placeholder vocabulary of the model's size (ids 0-255 the bytes, <s> </s> <pad> at the
  /// config's special ids).
  std::filesystem::path tokenizer_dir;
  /// general.name (empty: the file name without .gguf).
  std::string name;
  /// Storage of token_embd and output: empty for llama.cpp's choice (q8_0 in q8_0 and q4_0
  /// files, else `type`), or f32 | f16 | q8_0 | q4_0.
  std::string embeddings;
};

// ============================================================================ the permutation

/// The file row (llama.cpp order) holding HF row `r` of q_proj / k_proj with heads of `head_dim`.
constexpr std::int64_t gguf_rope_row(std::int64_t r, std::int64_t head_dim) noexcept {
  const std::int64_t h = r / head_dim, i = r % head_dim, half = head_dim / 2;
  return h * head_dim + 2 * (i % half) + i / half;
}
/// The HF row stored at file row `g` (the inverse of gguf_rope_row).
constexpr std::int64_t hf_rope_row(std::int64_t g, std::int64_t head_dim) noexcept {
  const std::int64_t h = g / head_dim, i = g % head_dim, half = head_dim / 2;
  return h * head_dim + (i % 2) * half + i / 2;
}

/// Reorders the rows of a [rows, row_bytes] matrix between HF's order and llama.cpp's
/// (convert_hf_to_gguf.py's LlamaModel.permute with `n_head` heads): to_gguf moves HF row r to
/// file row gguf_rope_row(r, D), otherwise the inverse; D = rows / n_head must be even.
inline void permute_rope_rows(std::span<const std::byte> in, std::span<std::byte> out, std::int64_t rows,
                              std::int64_t n_head, bool to_gguf) {
  EDL_CHECK(rows > 0 && n_head > 0 && rows % n_head == 0 && (rows / n_head) % 2 == 0 && in.size() == out.size() &&
                in.size() % static_cast<std::size_t>(rows) == 0,
            errc::shape_mismatch, "models::permute_rope_rows", rows, " rows of ", in.size(), " bytes in all (", out.size(),
            " out) do not split into ", n_head, " heads of an even dimension");
  const std::size_t rb = in.size() / static_cast<std::size_t>(rows);
  const std::int64_t D = rows / n_head;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t g = gguf_rope_row(r, D);
    const std::int64_t src = to_gguf ? r : g, dst = to_gguf ? g : r;
    std::memcpy(out.data() + static_cast<std::size_t>(dst) * rb, in.data() + static_cast<std::size_t>(src) * rb, rb);
  }
}

namespace detail::llama_gguf {

using io::GgmlType;
using ::edl::detail::concat;

// llama.cpp's token types (llama_token_type).
inline constexpr std::int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

inline GgmlType parse_type(const std::string& s, const std::string& where, const char* field) {
  if (s == "f32") return GgmlType::F32;
  if (s == "f16") return GgmlType::F16;
  if (s == "q8_0") return GgmlType::Q8_0;
  if (s == "q4_0") return GgmlType::Q4_0;
  ::edl::detail::raise(errc::invalid_argument, where,
                       concat(field, " must be f32, f16, q8_0 or q4_0, found \"", s, "\""));
}
/// general.file_type (llama_ftype) of a file whose weights are mostly `t`.
constexpr std::uint32_t file_type(GgmlType t) noexcept {
  switch (t) {
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q8_0: return 7;
    default: return 0;
  }
}
constexpr bool is_block_type(GgmlType t) noexcept { return t == GgmlType::Q8_0 || t == GgmlType::Q4_0; }
constexpr GgmlType ggml_of(quant::Format f) noexcept {
  return f == quant::Format::q8_0 ? GgmlType::Q8_0 : f == quant::Format::q4_0 ? GgmlType::Q4_0 : GgmlType::F32;
}
inline std::int64_t row_bytes(GgmlType t, std::int64_t cols) {
  return cols / io::ggml_block_size(t) * io::ggml_block_bytes(t);
}
/// The type a weight with rows of `cols` is stored in: `t`, or F16 when the rows do not split
/// into blocks of `t` (convert_hf_to_gguf.py's fallback).
inline GgmlType fit_type(GgmlType t, std::int64_t cols) {
  return is_block_type(t) && cols % io::ggml_block_size(t) != 0 ? GgmlType::F16 : t;
}

/// Writes one row of n f32 values as type t (n a multiple of t's block size).
inline void encode_row(GgmlType t, const float* x, std::int64_t n, std::byte* out) {
  switch (t) {
    case GgmlType::F32: std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float)); return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n; ++i) {
        const f16 h(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q8_0: quant::quantize_row_q8_0(x, reinterpret_cast<quant::BlockQ8_0*>(out), n); return;
    case GgmlType::Q4_0: quant::quantize_row_q4_0(x, reinterpret_cast<quant::BlockQ4_0*>(out), n); return;
    default: break;
  }
  ::edl::detail::raise(errc::unsupported, "models::save_gguf", concat("cannot write ggml type ", io::ggml_type_name(t)));
}

constexpr bool is_readable(GgmlType t) noexcept {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || is_block_type(t);
}
/// Reads one stored row of n values of type t (is_readable(t)) as f32.
inline void decode_row(GgmlType t, const std::byte* in, std::int64_t n, float* out) {
  switch (t) {
    case GgmlType::F32: std::memcpy(out, in, static_cast<std::size_t>(n) * sizeof(float)); return;
    case GgmlType::F16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, in + 2 * i, 2);
        out[i] = f16::from_bits(b).to_float();
      }
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, in + 2 * i, 2);
        out[i] = bf16::from_bits(b).to_float();
      }
      return;
    case GgmlType::Q8_0: {
      // Copied out: a block (34 bytes) in the mapping is not aligned for f16.
      quant::BlockQ8_0 blk;
      for (std::int64_t b = 0; b < n / 32; ++b) {
        std::memcpy(&blk, in + b * 34, sizeof blk);
        quant::dequantize_row_q8_0(&blk, out + b * 32, 32);
      }
      return;
    }
    case GgmlType::Q4_0: {
      quant::BlockQ4_0 blk;
      for (std::int64_t b = 0; b < n / 32; ++b) {
        std::memcpy(&blk, in + b * 18, sizeof blk);
        quant::dequantize_row_q4_0(&blk, out + b * 32, 32);
      }
      return;
    }
    default: break;
  }
}

// ---------------------------------------------------------------------------- writing

/// A weight to write: `rows` rows of `cols` values, read as f32 by row_f32 (HF row order), or
/// copied as blocks from `q` when the file stores its format (q: one matrix, or one per expert
/// of `experts`, each rows / q.size() rows). rope_heads > 0 writes the rows in llama.cpp's rope
/// order for that many heads. vector: a 1-D tensor (rows values, cols 1). experts > 0: a 3-D
/// tensor of that many [rows / experts, cols] matrices (llama.cpp's ffn_*_exps).
struct Source {
  std::int64_t rows = 0, cols = 0;
  std::function<void(std::int64_t, float*)> row_f32;
  std::vector<const quant::Matrix*> q;
  std::int64_t rope_heads = 0;
  bool vector = false;
  std::int64_t experts = 0;
};

template <class T, class Spec>
Source param_source(const nn::Param<T, Spec>& p, std::int64_t rows, std::int64_t cols) {
  Source s;
  s.rows = rows;
  s.cols = cols;
  s.row_f32 = [&p, cols](std::int64_t r, float* out) {
    const T* v = p.data() + r * cols;
    for (std::int64_t j = 0; j < cols; ++j) out[j] = to_f32(v[j]);
  };
  return s;
}
/// A 1-D parameter (norm weight, bias) as a column: one value a row, so the rope order applies.
template <class T, class Spec>
Source vector_source(const nn::Param<T, Spec>& p) {
  Source s = param_source(p, p.numel(), 1);
  s.vector = true;
  return s;
}
template <class Lin>
Source linear_source(const Lin& lin) {
  if (!lin.is_quantized()) return param_source(lin.weight, lin.out_features(), lin.in_features());
  const quant::Matrix& q = lin.qweight;
  Source s;
  s.rows = q.rows();
  s.cols = q.cols();
  s.row_f32 = [&q](std::int64_t r, float* out) { quant::Matrix::dequantize_row(q.view(), r, out); };
  s.q = {&q};
  return s;
}
/// The same Linear of each of `n` experts (`lin(e)`) as one 3-D tensor, expert after expert.
template <class LinOf>
Source experts_source(std::int64_t n, LinOf&& lin) {
  std::vector<Source> parts;
  for (std::int64_t e = 0; e < n; ++e) parts.push_back(linear_source(lin(e)));
  Source s;
  s.experts = n;
  s.rows = n * parts.front().rows;
  s.cols = parts.front().cols;
  const std::int64_t per = parts.front().rows;
  bool blocks = true;
  for (const Source& p : parts) blocks = blocks && p.q.size() == 1 && p.q[0]->format() == parts.front().q[0]->format();
  if (blocks)
    for (const Source& p : parts) s.q.push_back(p.q[0]);
  s.row_f32 = [parts = std::move(parts), per](std::int64_t r, float* out) {
    parts[static_cast<std::size_t>(r / per)].row_f32(r % per, out);
  };
  return s;
}

/// Adds tensor `name` of type t, streamed row block by row block when the file is written.
inline void add_source(io::GgufWriter& w, const std::string& name, GgmlType t, Source src) {
  std::vector<std::int64_t> dims = src.vector    ? std::vector<std::int64_t>{src.rows}
                                  : src.experts ? std::vector<std::int64_t>{src.cols, src.rows / src.experts, src.experts}
                                                : std::vector<std::int64_t>{src.cols, src.rows};
  w.add_tensor(name, t, std::move(dims), [src = std::move(src), t](io::GgufSink& sink) {
    const std::int64_t rb = row_bytes(t, src.cols);
    const std::int64_t chunk = std::max<std::int64_t>(1, (std::int64_t{1} << 22) / rb);
    const bool copy_blocks = !src.q.empty() && ggml_of(src.q.front()->format()) == t;
    const std::int64_t per_matrix = src.q.empty() ? src.rows : src.rows / static_cast<std::int64_t>(src.q.size());
    const std::int64_t D = src.rope_heads > 0 ? src.rows / src.rope_heads : 0;
    std::vector<std::byte> buf(static_cast<std::size_t>(std::min(chunk, src.rows) * rb));
    for (std::int64_t r0 = 0; r0 < src.rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, src.rows - r0);
      exec::parallel_for(0, n, std::max<std::int64_t>(1, 16384 / src.cols), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
        std::vector<float> x(copy_blocks ? 0 : static_cast<std::size_t>(src.cols));
        for (std::ptrdiff_t i = lo; i < hi; ++i) {
          const std::int64_t g = r0 + i, r = D > 0 ? hf_rope_row(g, D) : g;  // file row g holds HF row r
          std::byte* dst = buf.data() + i * rb;
          if (copy_blocks) {
            src.q[static_cast<std::size_t>(r / per_matrix)]->view().copy_row(r % per_matrix, dst);
          } else {
            src.row_f32(r, x.data());
            encode_row(t, x.data(), src.cols, dst);
          }
        }
      });
      sink.write(std::span<const std::byte>(buf.data(), static_cast<std::size_t>(n * rb)));
    }
  });
}

/// llama3 rope scaling as llama.cpp applies it: one factor per frequency that divides it
/// (convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors, HF's _compute_llama3_parameters).
inline std::vector<float> llama3_rope_factors(const LlamaConfig& c) {
  const RopeScaling& s = *c.rope_scaling;
  const std::int64_t D = c.head_size();
  const double low_wavelen = static_cast<double>(s.original_max_position_embeddings) / s.low_freq_factor;
  const double high_wavelen = static_cast<double>(s.original_max_position_embeddings) / s.high_freq_factor;
  std::vector<float> f;
  for (std::int64_t i = 0; i < D; i += 2) {
    const double freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(i) / static_cast<double>(D));
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(static_cast<float>(s.factor));
    } else {
      const double smooth = (static_cast<double>(s.original_max_position_embeddings) / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      f.push_back(static_cast<float>(1.0 / ((1 - smooth) / s.factor + smooth)));
    }
  }
  return f;
}

// ---------------------------------------------------------------------------- vocabulary

/// What the tokenizer.ggml.* keys hold.
struct Vocab {
  std::string model = "llama";  // llama (sentencepiece-style) | gpt2 (byte-level BPE)
  std::string pre = "default";
  std::vector<std::string> tokens;
  std::vector<float> scores;  // llama only
  std::vector<std::int32_t> types;
  std::vector<std::string> merges;  // gpt2 only
  std::optional<std::int64_t> bos, eos, unk, pad;
  std::optional<bool> add_bos, add_eos;
  std::vector<std::pair<std::string, std::string>> chat_templates;  // (name, template); "" is the default
};

/// Added tokens that llama.cpp's converter makes control tokens although they are not "special".
inline bool looks_special(const std::string& t) {
  const auto wrapped = [&](std::string_view a, std::string_view b) {
    return t.size() >= a.size() + b.size() && t.compare(0, a.size(), a) == 0 &&
           t.compare(t.size() - b.size(), b.size(), b) == 0;
  };
  return t == "<pad>" || t == "<mask>" || wrapped("<|", "|>") || wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>");
}

/// llama.cpp's name of a byte-level BPE pre-tokenizer (tokenizer.ggml.pre), from tokenizer.json's
/// pre_tokenizer: GPT-2's ByteLevel regex, Llama 3's or Qwen2's split pattern, else "default".
inline std::string detect_pre(const io::ojson& pre) {
  if (!pre.is_object()) return "default";
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") return pre.value("use_regex", true) ? "gpt-2" : "default";
  if (type != "Sequence" || !pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) return "default";
  for (const auto& p : pre["pretokenizers"]) {
    if (!p.is_object() || p.value("type", "") != "Split" || !p.contains("pattern")) continue;
    const io::ojson& pat = p["pattern"];
    if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string()) continue;
    const std::string re = pat["Regex"].get<std::string>();
    if (re == R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")
      return "llama-bpe";
    if (re == R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")
      return "qwen2";
  }
  return "default";
}

/// GPT-2's byte-to-text mapping (bytes_to_unicode): printable bytes stand for themselves, the
/// others for U+0100 + n; as UTF-8.
inline std::string gpt2_byte_text(int b) {
  const auto direct = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  std::uint32_t cp = static_cast<std::uint32_t>(b);
  if (!direct(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += direct(c) ? 0 : 1;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// A vocabulary for a model saved without a tokenizer: byte-level ("gpt2", no merges) with
/// ids 0-255 the bytes (edl's ByteTokenizer), "<s>" / "</s>" / "<pad>" at the config's special
/// ids and "[PAD<i>]" for the other ids. llama.cpp tokenizes any text with it (a sentencepiece
/// vocabulary without all 256 byte tokens makes llama.cpp's tokenizer throw).
inline Vocab placeholder_vocab(const LlamaConfig& c) {
  Vocab v;
  v.model = "gpt2";
  const std::int64_t V = c.vocab_size;
  const auto valid = [&](std::optional<std::int64_t> id) { return id && *id >= 0 && *id < V ? id : std::nullopt; };
  v.bos = valid(c.bos_token_id);
  v.eos = valid(c.eos_token_id.empty() ? std::nullopt : std::optional<std::int64_t>(c.eos_token_id[0]));
  v.pad = valid(c.pad_token_id);
  for (std::int64_t i = 0; i < V; ++i) {
    v.tokens.push_back(i < 256 ? gpt2_byte_text(static_cast<int>(i)) : concat("[PAD", i, "]"));
    v.types.push_back(i < 256 ? kNormal : kUnused);
  }
  const std::pair<std::optional<std::int64_t>, const char*> specials[] = {{v.bos, "<s>"}, {v.eos, "</s>"}, {v.pad, "<pad>"}};
  for (const auto& [id, text] : specials)
    if (id && v.types[static_cast<std::size_t>(*id)] != kControl) {
      v.tokens[static_cast<std::size_t>(*id)] = text;
      v.types[static_cast<std::size_t>(*id)] = kControl;
    }
  return v;
}

/// The vocabulary of an HF tokenizer.json (model BPE: byte-level, or with byte_fallback as
/// Llama 1/2's) and tokenizer_config.json in `dir`, padded to the model's vocab_size with
/// "[PAD<i>]" tokens, as convert_hf_to_gguf.py writes it.
inline Vocab read_vocab(const std::filesystem::path& dir, const LlamaConfig& c) {
  namespace fs = std::filesystem;
  const fs::path tj = dir / "tokenizer.json";
  const std::string src = tj.string();
  if (!fs::exists(tj)) {
    EDL_CHECK(!fs::exists(dir / "tokenizer.model"), errc::unsupported, dir.string(),
              "has tokenizer.model (sentencepiece) but no tokenizer.json; edl reads the vocabulary from tokenizer.json");
    ::edl::detail::raise(errc::io, dir.string(), "no tokenizer.json in the tokenizer folder");
  }
  const io::JsonConfig doc = io::JsonConfig::from_file(src);
  const io::ojson& j = doc.json();
  EDL_CHECK(j.contains("model") && j["model"].is_object(), errc::format, src, "field model: missing or not an object");
  const io::ojson& model = j["model"];
  const std::string type = model.value("type", "");
  EDL_CHECK(type == "BPE", errc::unsupported, src, "field model.type: \"", type,
            "\"; edl writes BPE vocabularies (byte-level, or with byte_fallback) to GGUF");
  EDL_CHECK(model.contains("vocab") && model["vocab"].is_object(), errc::format, src, "field model.vocab: missing or not an object");
  const bool byte_fallback = model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>();

  Vocab v;
  v.model = byte_fallback ? "llama" : "gpt2";
  v.pre = byte_fallback ? "default" : detect_pre(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : io::ojson());
  const std::int64_t V = c.vocab_size;
  v.tokens.assign(static_cast<std::size_t>(V), std::string());
  v.types.assign(static_cast<std::size_t>(V), kUnused);
  const auto place = [&](std::int64_t id, const std::string& text, std::int32_t t, const char* field) {
    EDL_CHECK(id >= 0 && id < V, errc::config, src, "field ", field, ": token \"", text, "\" has id ", id,
              ", outside the model's vocab_size ", V);
    v.tokens[static_cast<std::size_t>(id)] = text;
    v.types[static_cast<std::size_t>(id)] = t;
  };
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    EDL_CHECK(it.value().is_number_integer(), errc::format, src, "field model.vocab: token \"", it.key(), "\" has no integer id");
    const std::string& k = it.key();
    const bool is_byte = byte_fallback && k.size() == 6 && k.compare(0, 3, "<0x") == 0 && k[5] == '>';
    place(it.value().get<std::int64_t>(), k, is_byte ? kByte : kNormal, "model.vocab");
  }
  std::map<std::string, std::int64_t> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& a : j["added_tokens"]) {
      EDL_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                    a["content"].is_string(),
                errc::format, src, "field added_tokens: an entry without an integer id and a string content");
      const std::string text = a["content"].get<std::string>();
      const bool special = a.value("special", false) || looks_special(text);
      place(a["id"].get<std::int64_t>(), text, special ? kControl : kUserDefined, "added_tokens");
      added.emplace(text, a["id"].get<std::int64_t>());
    }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string u = model["unk_token"].get<std::string>();
    const auto it = model["vocab"].find(u);
    if (it != model["vocab"].end() && it.value().is_number_integer()) {
      v.unk = it.value().get<std::int64_t>();
      if (*v.unk >= 0 && *v.unk < V) v.types[static_cast<std::size_t>(*v.unk)] = kUnknown;
    }
  }
  std::set<std::string> seen;
  for (std::int64_t i = 0; i < V; ++i) {
    std::string& t = v.tokens[static_cast<std::size_t>(i)];
    if (t.empty()) {
      t = concat("[PAD", i, "]");
      v.types[static_cast<std::size_t>(i)] = kUnused;
    }
    // llama.cpp maps text to id and asserts that both directions agree.
    EDL_CHECK(seen.insert(t).second, errc::format, src, "token \"", t, "\" (id ", i,
              ") appears twice; llama.cpp needs every token text once");
  }
  if (v.model == "llama") {
    // sentencepiece BPE scores are minus the merge order, which is the vocabulary order.
    for (std::int64_t i = 0; i < V; ++i)
      v.scores.push_back(v.types[static_cast<std::size_t>(i)] == kNormal ? -static_cast<float>(i) : 0.0f);
  } else if (model.contains("merges") && model["merges"].is_array()) {
    for (const auto& m : model["merges"]) {
      if (m.is_string()) {
        v.merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        // transformers >= 4.45 writes pairs; a space inside a part is written as U+0120 (gguf-py's SpecialVocab).
        std::string s;
        for (int k = 0; k < 2; ++k) {
          if (k) s += ' ';
          for (char ch : m[k].get<std::string>()) {
            if (ch == ' ') s += "\xc4\xa0";
            else s += ch;
          }
        }
        v.merges.push_back(std::move(s));
      } else {
        ::edl::detail::raise(errc::format, src, "field model.merges: expected strings \"a b\" or pairs [\"a\", \"b\"]");
      }
    }
  }

  // tokenizer_config.json: special tokens (looked up among the added tokens), add_*_token, chat template.
  const fs::path tc = dir / "tokenizer_config.json";
  if (fs::exists(tc)) {
    const io::JsonConfig cdoc = io::JsonConfig::from_file(tc.string());
    const io::ojson& t = cdoc.json();
    const std::pair<const char*, std::optional<std::int64_t>*> kinds[] = {
        {"bos", &v.bos}, {"eos", &v.eos}, {"unk", &v.unk}, {"pad", &v.pad}};
    for (const auto& [kind, slot] : kinds) {
      const std::string key = std::string(kind) + "_token";
      if (!t.contains(key)) continue;
      std::string content;
      if (t[key].is_string()) content = t[key].get<std::string>();
      else if (t[key].is_object() && t[key].contains("content") && t[key]["content"].is_string())
        content = t[key]["content"].get<std::string>();
      else continue;
      if (const auto it = added.find(content); it != added.end()) *slot = it->second;
    }
    if (t.contains("add_bos_token") && t["add_bos_token"].is_boolean()) v.add_bos = t["add_bos_token"].get<bool>();
    if (t.contains("add_eos_token") && t["add_eos_token"].is_boolean()) v.add_eos = t["add_eos_token"].get<bool>();
    if (t.contains("chat_template")) {
      const io::ojson& ct = t["chat_template"];
      if (ct.is_string()) {
        v.chat_templates.emplace_back("", ct.get<std::string>());
      } else if (ct.is_array()) {
        for (const auto& e : ct)
          if (e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") && e["template"].is_string()) {
            const std::string n = e["name"].get<std::string>();
            v.chat_templates.emplace_back(n == "default" ? "" : n, e["template"].get<std::string>());
          }
      }
    }
  }
  // Then the model config's ids, as gguf-py's SpecialVocab falls back to config.json.
  const auto fallback = [&](std::optional<std::int64_t>& slot, std::optional<std::int64_t> id) {
    if (!slot && id && *id >= 0 && *id < V) slot = id;
  };
  fallback(v.bos, c.bos_token_id);
  fallback(v.eos, c.eos_token_id.empty() ? std::nullopt : std::optional<std::int64_t>(c.eos_token_id[0]));
  fallback(v.pad, c.pad_token_id);
  return v;
}

inline void add_vocab(io::GgufWriter& w, const Vocab& v) {
  w.add_string("tokenizer.ggml.model", v.model);
  w.add_string("tokenizer.ggml.pre", v.pre);
  w.add_string_array("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.add_f32_array("tokenizer.ggml.scores", v.scores);
  w.add_i32_array("tokenizer.ggml.token_type", v.types);
  if (v.model == "gpt2") w.add_string_array("tokenizer.ggml.merges", v.merges);  // llama.cpp requires the key
  const std::pair<const char*, std::optional<std::int64_t>> ids[] = {{"tokenizer.ggml.bos_token_id", v.bos},
                                                                     {"tokenizer.ggml.eos_token_id", v.eos},
                                                                     {"tokenizer.ggml.unknown_token_id", v.unk},
                                                                     {"tokenizer.ggml.padding_token_id", v.pad}};
  for (const auto& [key, id] : ids)
    if (id) w.add_u32(key, static_cast<std::uint32_t>(*id));
  if (v.add_bos) w.add_bool("tokenizer.ggml.add_bos_token", *v.add_bos);
  if (v.add_eos) w.add_bool("tokenizer.ggml.add_eos_token", *v.add_eos);
  std::vector<std::string> named;
  for (const auto& [name, text] : v.chat_templates) {
    w.add_string(name.empty() ? std::string("tokenizer.chat_template") : "tokenizer.chat_template." + name, text);
    if (!name.empty()) named.push_back(name);
  }
  if (!named.empty()) w.add_string_array("tokenizer.chat_templates", named);
}

// ---------------------------------------------------------------------------- reading

/// The llama3 rope scaling a file's rope_freqs.weight encodes: the edl.rope_scaling.* keys
/// save_gguf writes, else the settings of Llama 3.1 and 3.2 (factor 8 or 32, low 1, high 4,
/// 8192 positions) when one reproduces the factors.
inline std::optional<RopeScaling> llama3_scaling(const io::GgufFile& f, const io::GgufTensorInfo& t, LlamaConfig c) {
  std::vector<float> have(static_cast<std::size_t>(t.numel));
  if (t.type == GgmlType::F32) std::memcpy(have.data(), t.data, have.size() * sizeof(float));
  else return std::nullopt;
  std::vector<RopeScaling> candidates;
  if (f.has("edl.rope_scaling.factor")) {
    RopeScaling s;
    s.rope_type = "llama3";
    s.factor = f.get_f64("edl.rope_scaling.factor");
    s.low_freq_factor = f.get_f64("edl.rope_scaling.low_freq_factor");
    s.high_freq_factor = f.get_f64("edl.rope_scaling.high_freq_factor");
    s.original_max_position_embeddings = f.get_i64("edl.rope_scaling.original_max_position_embeddings");
    candidates.push_back(s);
  }
  for (double factor : {8.0, 32.0, 16.0}) {
    RopeScaling s;
    s.rope_type = "llama3";
    s.factor = factor;
    s.low_freq_factor = 1.0;
    s.high_freq_factor = 4.0;
    s.original_max_position_embeddings = 8192;
    candidates.push_back(s);
  }
  for (RopeScaling& s : candidates) {
    s.raw = {{"rope_type", "llama3"}};
    c.rope_scaling = s;
    const std::vector<float> want = llama3_rope_factors(c);
    bool same = want.size() == have.size();
    for (std::size_t i = 0; same && i < want.size(); ++i)
      same = std::fabs(want[i] - have[i]) <= 1e-5f * std::max(1.0f, std::fabs(want[i]));
    if (same) return s;
  }
  return std::nullopt;
}

/// The LlamaConfig of a llama GGUF file.
inline LlamaConfig config_of(const io::GgufFile& f) {
  const std::string src = f.path();
  const std::string arch = f.get_string("general.architecture");
  EDL_CHECK(arch == "llama", errc::unsupported, src, "key 'general.architecture': \"", arch,
            "\"; edl reads GGUF files of the \"llama\" architecture");
  const auto key = [](const char* k) { return std::string("llama.") + k; };
  LlamaConfig c;
  c.source = src;
  c.model_type = "llama";
  if (f.has(key("expert_count")) && f.get_i64(key("expert_count")) > 0) {  // Mixtral: merged ffn_*_exps tensors
    c.model_type = "mixtral";
    c.num_local_experts = f.get_i64(key("expert_count"));
    EDL_CHECK(f.has(key("expert_used_count")), errc::format, src,
              "key 'llama.expert_used_count': missing; a mixture of experts (llama.expert_count ", c.num_local_experts,
              ") needs it");
    c.num_experts_per_tok = f.get_i64(key("expert_used_count"));
    EDL_CHECK(f.has_tensor("blk.0.ffn_gate_exps.weight"), errc::unsupported, src,
              "tensor 'blk.0.ffn_gate_exps.weight': missing; edl reads experts merged into ffn_{gate,up,down}_exps "
              "(the layout of llama.cpp's converter since 2024), not one tensor per expert");
  }
  c.hidden_size = f.get_i64(key("embedding_length"));
  c.num_hidden_layers = f.get_i64(key("block_count"));
  c.intermediate_size = f.get_i64(key("feed_forward_length"));
  c.num_attention_heads = f.get_i64(key("attention.head_count"));
  c.num_key_value_heads = f.has(key("attention.head_count_kv")) ? f.get_i64(key("attention.head_count_kv")) : c.num_attention_heads;
  EDL_CHECK(c.num_attention_heads > 0, errc::config, src, "key 'llama.attention.head_count': must be positive, found ",
            c.num_attention_heads);
  std::int64_t D = c.hidden_size / c.num_attention_heads;
  if (f.has(key("attention.key_length"))) D = f.get_i64(key("attention.key_length"));
  if (D * c.num_attention_heads != c.hidden_size || f.has(key("attention.key_length"))) c.head_dim = D;
  if (f.has(key("attention.value_length")))
    EDL_CHECK(f.get_i64(key("attention.value_length")) == D, errc::unsupported, src, "key 'llama.attention.value_length': ",
              f.get_i64(key("attention.value_length")), " differs from the key length ", D,
              "; edl's heads have one head_dim");
  if (f.has(key("rope.dimension_count")))
    EDL_CHECK(f.get_i64(key("rope.dimension_count")) == D, errc::unsupported, src, "key 'llama.rope.dimension_count': ",
              f.get_i64(key("rope.dimension_count")), " rotary dimensions of a head of ", D,
              "; edl rotates the whole head");
  c.max_position_embeddings = f.has(key("context_length")) ? f.get_i64(key("context_length")) : 2048;
  c.rms_norm_eps = f.get_f64(key("attention.layer_norm_rms_epsilon"));
  c.rope_theta = f.has(key("rope.freq_base")) ? f.get_f64(key("rope.freq_base")) : 10000.0;
  // Rope scaling: llama.cpp's linear (rope.scaling.type / factor), or llama3 as rope_freqs.weight.
  std::string scaling = f.has(key("rope.scaling.type")) ? f.get_string(key("rope.scaling.type")) : "linear";
  double factor = 0;
  if (f.has(key("rope.scaling.factor"))) factor = f.get_f64(key("rope.scaling.factor"));
  else if (f.has(key("rope.scale_linear"))) factor = f.get_f64(key("rope.scale_linear"));
  if (scaling == "linear" && factor != 0 && factor != 1) {
    RopeScaling s;
    s.rope_type = "linear";
    s.factor = factor;
    s.raw = {{"rope_type", "linear"}};
    c.rope_scaling = s;
  } else {
    EDL_CHECK(scaling == "linear" || scaling == "none", errc::unsupported, src, "key 'llama.rope.scaling.type': \"",
              scaling, "\"; edl reads linear scaling, or llama3's as rope_freqs.weight");
  }
  if (f.has(key("attention.sliding_window"))) c.sliding_window = f.get_i64(key("attention.sliding_window"));
  c.attention_bias = f.has_tensor("blk.0.attn_q.bias");
  c.mlp_bias = f.has_tensor("blk.0.ffn_gate.bias");
  c.tie_word_embeddings = !f.has_tensor("output.weight");
  const io::GgufTensorInfo& emb = f.tensor("token_embd.weight");
  EDL_CHECK(emb.dims.size() == 2, errc::shape_mismatch, src, "tensor 'token_embd.weight': dims ",
            ::edl::detail::shape_str(emb.dims), ", expected {embedding_length, vocab}");
  c.vocab_size = emb.dims[1];
  if (const io::GgufTensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
    EDL_CHECK(!c.rope_scaling, errc::unsupported, src,
              "tensor 'rope_freqs.weight' together with linear rope scaling: edl applies one or the other");
    c.rope_scaling = llama3_scaling(f, *rf, c);
    EDL_CHECK(c.rope_scaling.has_value(), errc::unsupported, src,
              "tensor 'rope_freqs.weight': rope frequency factors that no llama3 scaling edl knows reproduces");
  }
  // Special tokens, with llama.cpp's defaults for a sentencepiece vocabulary.
  const bool spm = f.has("tokenizer.ggml.model") && f.get_string("tokenizer.ggml.model") == "llama";
  const auto id = [&](const char* k, std::optional<std::int64_t> fallback) -> std::optional<std::int64_t> {
    return f.has(k) ? std::optional<std::int64_t>(f.get_i64(k)) : fallback;
  };
  c.bos_token_id = id("tokenizer.ggml.bos_token_id", spm ? std::optional<std::int64_t>(1) : std::nullopt);
  const auto eos = id("tokenizer.ggml.eos_token_id", spm ? std::optional<std::int64_t>(2) : std::nullopt);
  c.eos_token_id = eos ? std::vector<std::int64_t>{*eos} : std::vector<std::int64_t>{};
  c.pad_token_id = id("tokenizer.ggml.padding_token_id", std::nullopt);
  c.extra["architectures"] = {c.model_type == "mixtral" ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  c.validate();
  return c;
}

/// Loads the model's tensors from `f`, checking each against the config; `used` collects names.
class Loader {
 public:
  explicit Loader(const io::GgufFile& f) : f_(f), src_(f.path()) {}

  /// The tensor `name` (HF `hf`), which must exist, have dims `dims` (ggml order) and a type edl reads.
  const io::GgufTensorInfo& get(const std::string& name, const std::string& hf, const std::vector<std::int64_t>& dims) {
    const io::GgufTensorInfo* t = f_.find_tensor(name);
    EDL_CHECK(t != nullptr, errc::format, src_, "tensor '", name, "' (", hf,
              "): missing; the model the llama.* keys describe needs it");
    EDL_CHECK(t->dims == dims, errc::shape_mismatch, src_, "tensor '", name, "' (", hf, "): dims ",
              ::edl::detail::shape_str(t->dims), " (ggml order), expected ", ::edl::detail::shape_str(dims));
    EDL_CHECK(is_readable(t->type), errc::unsupported, src_, "tensor '", name, "' (", hf, "): ggml type ",
              io::ggml_type_name(t->type), " is not supported (edl reads F32, F16, BF16, Q8_0 and Q4_0)");
    used_.insert(name);
    return *t;
  }

  /// A [rows, cols] parameter (a 1-D one: cols == rows == numel with vector) in HF row order.
  template <class T, class Spec>
  void param(nn::Param<T, Spec>& p, const std::string& name, const std::string& hf, std::int64_t rope_heads = 0) {
    constexpr bool vec = Spec::rank == 1;
    std::int64_t rows = p.numel(), cols = 1;
    if constexpr (!vec) {
      rows = static_cast<std::int64_t>(p.value.shape()[0]);
      cols = static_cast<std::int64_t>(p.value.shape()[1]);
    }
    const io::GgufTensorInfo& t = get(name, hf, vec ? std::vector<std::int64_t>{rows} : std::vector<std::int64_t>{cols, rows});
    const std::int64_t D = rope_heads > 0 ? rows / rope_heads : 0;
    if (vec && !is_block_type(t.type)) {  // one row of numel values (a block type cannot split into rows of 1)
      std::vector<float> x(static_cast<std::size_t>(rows));
      decode_row(t.type, t.data, rows, x.data());
      for (std::int64_t r = 0; r < rows; ++r) p.data()[r] = from_f32<T>(x[static_cast<std::size_t>(D > 0 ? gguf_rope_row(r, D) : r)]);
      return;
    }
    EDL_CHECK(!vec, errc::unsupported, src_, "tensor '", name, "' (", hf, "): a 1-D tensor of type ",
              io::ggml_type_name(t.type), "; edl reads 1-D tensors as F32, F16 or BF16");
    const std::int64_t rb = row_bytes(t.type, cols);
    exec::parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / cols), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      std::vector<float> x(static_cast<std::size_t>(cols));
      for (std::ptrdiff_t r = lo; r < hi; ++r) {
        const std::int64_t g = D > 0 ? gguf_rope_row(r, D) : r;
        T* out = p.data() + r * cols;
        if constexpr (std::is_same_v<T, float>) {
          decode_row(t.type, t.data + g * rb, cols, out);
        } else {
          decode_row(t.type, t.data + g * rb, cols, x.data());
          for (std::int64_t j = 0; j < cols; ++j) out[j] = from_f32<T>(x[static_cast<std::size_t>(j)]);
        }
      }
    });
  }

  /// A decoder Linear: Q8_0 / Q4_0 tensors become its quantized weight (the bytes, rows in HF
  /// order), others its weight parameter; then the bias when it has one.
  template <class Lin>
  void linear(Lin& lin, const std::string& name, const std::string& hf, std::int64_t rope_heads = 0) {
    const std::string w = name + ".weight", hw = hf + ".weight";
    const std::int64_t rows = lin.out_features(), cols = lin.in_features();
    const io::GgufTensorInfo& t = get(w, hw, {cols, rows});
    if (is_block_type(t.type)) rows_into(lin, t, 0, w, hw, rope_heads);
    else param(lin.weight, w, hw, rope_heads);
    if (lin.has_bias()) param(lin.bias, name + ".bias", hf + ".bias", rope_heads);
  }

  /// Expert e's Linear of `experts` from the 3-D tensor `name` (llama.cpp's ffn_*_exps: dims
  /// {in, out, experts}, expert after expert).
  template <class Lin>
  void expert_linear(Lin& lin, const std::string& name, const std::string& hf, std::int64_t e, std::int64_t experts) {
    const std::int64_t rows = lin.out_features(), cols = lin.in_features();
    rows_into(lin, get(name, hf, {cols, rows, experts}), e * rows, name, hf, 0);
  }

  /// Lin's weight from rows [first, first + out) of tensor t: block types as the file's bytes
  /// (a quantized Linear), others decoded into the weight parameter.
  template <class Lin>
  void rows_into(Lin& lin, const io::GgufTensorInfo& t, std::int64_t first, const std::string& name,
                 const std::string& hf, std::int64_t rope_heads) {
    const std::int64_t rows = lin.out_features(), cols = lin.in_features();
    const std::int64_t rb = row_bytes(t.type, cols), D = rope_heads > 0 ? rows / rope_heads : 0;
    const auto file_row = [&](std::int64_t r) { return t.data + (first + (D > 0 ? gguf_rope_row(r, D) : r)) * rb; };
    if (is_block_type(t.type)) {
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * rb));
      for (std::int64_t r = 0; r < rows; ++r) std::memcpy(bytes.data() + r * rb, file_row(r), static_cast<std::size_t>(rb));
      const quant::Format fmt = t.type == GgmlType::Q8_0 ? quant::Format::q8_0 : quant::Format::q4_0;
      const std::string where = concat(src_, " tensor '", name, "' (", hf, ")");
      lin.set_quantized(quant::Matrix::from_bytes(fmt, rows, cols, bytes, nullptr, where), where);
      return;
    }
    using T = typename std::remove_reference_t<decltype(lin)>::T;
    exec::parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / cols), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      std::vector<float> x(static_cast<std::size_t>(cols));
      for (std::ptrdiff_t r = lo; r < hi; ++r) {
        decode_row(t.type, file_row(r), cols, x.data());
        T* out = lin.weight.data() + r * cols;
        for (std::int64_t j = 0; j < cols; ++j) out[j] = from_f32<T>(x[static_cast<std::size_t>(j)]);
      }
    });
  }

  /// Tensors of the file that no parameter took (rope_freqs.weight is the config's).
  void check_all_used() const {
    for (const io::GgufTensorInfo& t : f_.tensors())
      EDL_CHECK(used_.count(t.name) || t.name == "rope_freqs.weight", errc::format, src_, "tensor '", t.name,
                "': not a tensor of the llama model the keys describe (", used_.size(), " tensors matched)");
  }

 private:
  const io::GgufFile& f_;
  std::string src_;
  std::set<std::string> used_;
};

}  // namespace detail::llama_gguf

// ============================================================================ the API

/// The LlamaConfig a llama-architecture GGUF file describes (llama.* keys, tensors present).
inline LlamaConfig gguf_config(const std::filesystem::path& file) {
  return detail::llama_gguf::config_of(io::GgufFile::open(file.string()));
}

/// Writes `m` as a llama-architecture GGUF v3 file that llama.cpp loads (see the header
/// comment for the layout, the types and the rope permutation). The file is written atomically.
///
///   models::save_gguf("tiny.gguf", model, {.type = "f16", .tokenizer_dir = "ckpt/"});
template <class Pol>
void save_gguf(const std::filesystem::path& file, const LlamaForCausalLM<Pol>& m, const GgufSaveOptions& opt = {}) {
  namespace g = detail::llama_gguf;
  using io::GgmlType;
  const std::string where = file.string();
  const GgmlType type = g::parse_type(opt.type, where, "type");
  const GgmlType emb_type = !opt.embeddings.empty() ? g::parse_type(opt.embeddings, where, "embeddings")
                            : g::is_block_type(type) ? GgmlType::Q8_0
                                                     : type;
  const LlamaConfig& c = m.config();
  EDL_CHECK(c.model_type != "qwen2", errc::unsupported, where,
            "a qwen2 model has its own GGUF architecture (\"qwen2\"); edl writes \"llama\" files");
  EDL_CHECK(!c.qwen_moe(), errc::unsupported, where, "a ", c.model_type,
            " model (its router and shared expert) has its own GGUF architecture (\"qwen2moe\", \"qwen3moe\"); edl "
            "writes \"llama\" files, whose experts are Mixtral's");
  EDL_CHECK(!c.is_gemma(), errc::unsupported, where, "a Gemma model ((1 + w) and sandwich norms, GeGLU, scaled "
            "embeddings) has its own GGUF architecture (\"", c.model_type == "gemma2" ? "gemma2" : "gemma3",
            "\"); edl writes \"llama\" files");
  EDL_CHECK(!c.qk_norm(), errc::unsupported, where, "a ", c.model_type,
            " model normalises each q and k head (self_attn.q_norm / k_norm), which llama.cpp's llama graph does not; "
            "it has its own GGUF architecture (\"", c.model_type, "\") and edl writes \"llama\" files");
  EDL_CHECK(c.head_size() * c.num_attention_heads == c.hidden_size || !c.attention_bias, errc::unsupported, where,
            "llama.cpp's llama graph takes q/k biases of hidden_size values, so it cannot run this model (head_dim ",
            c.head_size(), " x ", c.num_attention_heads, " heads != hidden_size ", c.hidden_size, ")");
  EDL_CHECK(!c.rope_scaling || c.rope_scaling->rope_type == "linear" || c.rope_scaling->rope_type == "llama3" ||
                c.rope_scaling->rope_type == "default",
            errc::unsupported, where, "rope_scaling.rope_type \"", c.rope_scaling ? c.rope_scaling->rope_type : "",
            "\": edl writes linear and llama3 rope scaling to GGUF, not yarn, dynamic or longrope");
  auto& mm = const_cast<LlamaForCausalLM<Pol>&>(m);  // members are read only
  const auto u32 = [&](const char* field, std::int64_t v) {
    EDL_CHECK(v >= 0 && v <= 0xffffffffLL, errc::invalid_argument, where, "config field ", field, " = ", v,
              " does not fit in a GGUF u32");
    return static_cast<std::uint32_t>(v);
  };

  io::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.type", "model");
  w.add_string("general.name", opt.name.empty() ? file.stem().string() : opt.name);
  w.add_u32("llama.block_count", u32("num_hidden_layers", c.num_hidden_layers));
  w.add_u32("llama.context_length", u32("max_position_embeddings", c.max_position_embeddings));
  w.add_u32("llama.embedding_length", u32("hidden_size", c.hidden_size));
  w.add_u32("llama.feed_forward_length", u32("intermediate_size", c.intermediate_size));
  w.add_u32("llama.attention.head_count", u32("num_attention_heads", c.num_attention_heads));
  w.add_u32("llama.attention.head_count_kv", u32("num_key_value_heads", c.num_key_value_heads));
  if (c.is_moe()) {  // Mixtral: llama.cpp's llama graph with a routed FFN (softmax, top-k, renormalised)
    w.add_u32("llama.expert_count", u32("num_local_experts", c.num_local_experts));
    w.add_u32("llama.expert_used_count", u32("num_experts_per_tok", c.num_experts_per_tok));
  }
  w.add_f32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  if (c.head_size() * c.num_attention_heads != c.hidden_size) {
    w.add_u32("llama.attention.key_length", u32("head_dim", c.head_size()));
    w.add_u32("llama.attention.value_length", u32("head_dim", c.head_size()));
  }
  w.add_u32("general.file_type", g::file_type(type));
  w.add_u32("llama.vocab_size", u32("vocab_size", c.vocab_size));
  w.add_u32("llama.rope.dimension_count", u32("head_dim", c.head_size()));
  if (c.attention_window()) w.add_u32("llama.attention.sliding_window", u32("sliding_window", *c.attention_window()));
  const bool llama3 = c.rope_scaling && c.rope_scaling->rope_type == "llama3";
  if (c.rope_scaling && c.rope_scaling->rope_type == "linear") {
    w.add_string("llama.rope.scaling.type", "linear");
    w.add_f32("llama.rope.scaling.factor", static_cast<float>(c.rope_scaling->factor));
  }
  if (llama3) {  // llama.cpp reads rope_freqs.weight; edl reads these back exactly
    w.add_f64("edl.rope_scaling.factor", c.rope_scaling->factor);
    w.add_f64("edl.rope_scaling.low_freq_factor", c.rope_scaling->low_freq_factor);
    w.add_f64("edl.rope_scaling.high_freq_factor", c.rope_scaling->high_freq_factor);
    w.add_u32("edl.rope_scaling.original_max_position_embeddings",
              u32("rope_scaling.original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings));
  }
  g::add_vocab(w, opt.tokenizer_dir.empty() ? g::placeholder_vocab(c) : g::read_vocab(opt.tokenizer_dir, c));
  w.add_u32("general.quantization_version", 2);

  // Tensors. The factors of llama3 rope scaling first, as convert_hf_to_gguf.py writes them.
  std::vector<float> rope_factors;
  if (llama3) {
    rope_factors = g::llama3_rope_factors(c);
    w.add_tensor("rope_freqs.weight", GgmlType::F32, {static_cast<std::int64_t>(rope_factors.size())},
                 std::as_bytes(std::span<const float>(rope_factors)));
  }
  const std::int64_t H = c.hidden_size, V = c.vocab_size;
  const auto weight = [&](const std::string& name, GgmlType t, g::Source s) {
    const GgmlType fit = g::fit_type(t, s.cols);
    g::add_source(w, name, fit, std::move(s));
  };
  weight("token_embd.weight", emb_type, g::param_source(mm.model.embed_tokens.weight, V, H));
  for (std::size_t l = 0; l < mm.model.layers.size(); ++l) {
    auto& L = mm.model.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    const auto linear = [&](const std::string& name, auto& lin, std::int64_t rope_heads) {
      g::Source s = g::linear_source(lin);
      s.rope_heads = rope_heads;
      weight(b + name + ".weight", type, std::move(s));
      if (lin.has_bias()) {
        g::Source bs = g::vector_source(lin.bias);
        bs.rope_heads = rope_heads;
        g::add_source(w, b + name + ".bias", GgmlType::F32, std::move(bs));
      }
    };
    g::add_source(w, b + "attn_norm.weight", GgmlType::F32, g::vector_source(L.input_layernorm.weight));
    linear("attn_q", L.self_attn.q_proj, c.num_attention_heads);
    linear("attn_k", L.self_attn.k_proj, c.num_key_value_heads);
    linear("attn_v", L.self_attn.v_proj, 0);
    linear("attn_output", L.self_attn.o_proj, 0);
    g::add_source(w, b + "ffn_norm.weight", GgmlType::F32, g::vector_source(L.post_attention_layernorm.weight));
    if (L.is_sparse()) {  // the router in F32 (as convert_hf_to_gguf.py), each expert Linear as one 3-D tensor
      auto& moe = L.block_sparse_moe;
      const auto E = static_cast<std::int64_t>(moe.experts.size());
      g::add_source(w, b + "ffn_gate_inp.weight", GgmlType::F32, g::linear_source(moe.gate));
      const auto at = [&](std::int64_t e) -> auto& { return moe.experts[static_cast<std::size_t>(e)]; };
      weight(b + "ffn_gate_exps.weight", type, g::experts_source(E, [&](std::int64_t e) -> auto& { return at(e).gate_proj; }));
      weight(b + "ffn_down_exps.weight", type, g::experts_source(E, [&](std::int64_t e) -> auto& { return at(e).down_proj; }));
      weight(b + "ffn_up_exps.weight", type, g::experts_source(E, [&](std::int64_t e) -> auto& { return at(e).up_proj; }));
      continue;
    }
    linear("ffn_gate", L.mlp.gate_proj, 0);
    linear("ffn_up", L.mlp.up_proj, 0);
    linear("ffn_down", L.mlp.down_proj, 0);
  }
  g::add_source(w, "output_norm.weight", GgmlType::F32, g::vector_source(mm.model.norm.weight));
  if (!m.tied()) weight("output.weight", emb_type, g::linear_source(mm.lm_head));
  w.write(file.string());
}

/// Reads a llama-architecture GGUF file (F32, F16, BF16, Q8_0 and Q4_0 tensors) into a new
/// LlamaForCausalLM: config from the llama.* keys, q/k rows back in HF order, embeddings, norms
/// and head in Pol's dtype, decoder Linears stored Q8_0 / Q4_0 as quantized Linears with the
/// file's blocks. A policy that names a quantization then quantizes the remaining Linears.
///
///   auto m = models::from_gguf<>("tiny-q8_0.gguf");   // q/k/v/o and MLP Linears hold q8_0 blocks
template <class Pol = DefaultPolicy>
LlamaForCausalLM<Pol> from_gguf(const std::filesystem::path& file) {
  const io::GgufFile f = io::GgufFile::open(file.string());
  LlamaConfig c = detail::llama_gguf::config_of(f);
  using T = typename Pol::param_t;
  c.torch_dtype = std::is_same_v<T, bf16> ? "bfloat16" : std::is_same_v<T, f16> ? "float16" : "float32";
  LlamaForCausalLM<Pol> m(c);
  detail::llama_gguf::Loader ld(f);
  ld.param(m.model.embed_tokens.weight, "token_embd.weight", "model.embed_tokens.weight");
  for (std::size_t l = 0; l < m.model.layers.size(); ++l) {
    auto& L = m.model.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".", hb = "model.layers." + std::to_string(l) + ".";
    ld.param(L.input_layernorm.weight, b + "attn_norm.weight", hb + "input_layernorm.weight");
    ld.linear(L.self_attn.q_proj, b + "attn_q", hb + "self_attn.q_proj", c.num_attention_heads);
    ld.linear(L.self_attn.k_proj, b + "attn_k", hb + "self_attn.k_proj", c.num_key_value_heads);
    ld.linear(L.self_attn.v_proj, b + "attn_v", hb + "self_attn.v_proj");
    ld.linear(L.self_attn.o_proj, b + "attn_output", hb + "self_attn.o_proj");
    ld.param(L.post_attention_layernorm.weight, b + "ffn_norm.weight", hb + "post_attention_layernorm.weight");
    if (L.is_sparse()) {
      auto& moe = L.block_sparse_moe;
      const auto E = static_cast<std::int64_t>(moe.experts.size());
      const std::string hm = hb + "block_sparse_moe.";
      ld.param(moe.gate.weight, b + "ffn_gate_inp.weight", hm + "gate.weight");
      for (std::int64_t e = 0; e < E; ++e) {
        auto& ex = moe.experts[static_cast<std::size_t>(e)];
        const std::string he = hm + "experts." + std::to_string(e) + ".";
        ld.expert_linear(ex.gate_proj, b + "ffn_gate_exps.weight", he + "w1.weight", e, E);
        ld.expert_linear(ex.down_proj, b + "ffn_down_exps.weight", he + "w2.weight", e, E);
        ld.expert_linear(ex.up_proj, b + "ffn_up_exps.weight", he + "w3.weight", e, E);
      }
      continue;
    }
    ld.linear(L.mlp.gate_proj, b + "ffn_gate", hb + "mlp.gate_proj");
    ld.linear(L.mlp.up_proj, b + "ffn_up", hb + "mlp.up_proj");
    ld.linear(L.mlp.down_proj, b + "ffn_down", hb + "mlp.down_proj");
  }
  ld.param(m.model.norm.weight, "output_norm.weight", "model.norm.weight");
  if (!m.tied()) ld.param(m.lm_head.weight, "output.weight", "lm_head.weight");
  ld.check_all_used();
  m.quantize_as_policy();
  return m;
}

}  // namespace edl::models
