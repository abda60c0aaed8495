// edl/tokenizer/unicode.hpp
// The Unicode a tokenizer needs, from libraries that keep up with the standard:
//
//   Regex            PCRE2 in UTF mode with Unicode properties (\p{L}, \s, case folding), JIT
//                    compiled: the Split patterns of GPT-2, Llama 3 and Qwen run as written.
//   normalize()      NFC / NFD / NFKC / NFKD through ICU; lowercase() ICU's full case mapping.
//   is_whitespace()  Unicode White_Space, is_word_char() alphanumeric or '_' (the rules HF
//                    `tokenizers` applies around added tokens).
//   utf8 helpers     code points, byte-level (GPT-2) tables.
//
// Hand-written Unicode tables go stale and get classes wrong at the edges; PCRE2 and ICU are in
// every Debian release (libpcre2-dev, libicu-dev).
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <edl/core/error.hpp>

namespace edl::tokenizer {

// ---------------------------------------------------------------- UTF-8

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

/// Length of the UTF-8 sequence starting with byte c (1 for a stray continuation byte, so that
/// scanning always advances).
inline std::size_t utf8_length(unsigned char c) noexcept {
  return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}

/// Decodes the code point at s[i] (valid UTF-8 assumed: callers validate text on entry).
inline std::uint32_t codepoint_at(std::string_view s, std::size_t i, std::size_t* len = nullptr) noexcept {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = std::min(utf8_length(c), s.size() - i);
  std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  if (len) *len = n;
  return cp;
}

/// Offset of the character that ends at `end` (end > 0; valid UTF-8): scanning backwards.
inline std::size_t char_start_before(std::string_view s, std::size_t end) noexcept {
  std::size_t k = end - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) >> 6) == 2) --k;
  return k;
}

/// Length of the well-formed UTF-8 sequence at s[i] (i < s.size()), or 0 when none starts
/// there. Well-formed as Unicode's Table 3-7 defines it: no overlong forms (C0, C1, E0 80-9F,
/// F0 80-8F), no surrogates (ED A0-BF), nothing above U+10FFFF (F4 90-, F5-FF). When 0,
/// `prefix` gets the length of the longest start of a well-formed sequence there (at least 1:
/// the "maximal subpart" that one U+FFFD replaces). PCRE2 matches with PCRE2_NO_UTF_CHECK
/// after this check, so it must be exactly PCRE2's own notion of valid UTF-8 (a lead byte F6
/// once passed it and crashed the JIT-compiled matcher; found by fuzzing).
inline std::size_t utf8_sequence_at(std::string_view s, std::size_t i, std::size_t* prefix = nullptr) noexcept {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    if (prefix) *prefix = 1;
    return 0;
  }
  std::size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    const auto x = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) break;
  }
  if (k == n) return n;
  if (prefix) *prefix = k;
  return 0;
}

/// Byte offset of the first invalid UTF-8 sequence, or nullopt when s is valid.
inline std::optional<std::size_t> invalid_utf8_at(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence_at(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

/// Replaces each invalid UTF-8 sequence with U+FFFD, as String::from_utf8_lossy does (one
/// replacement per maximal invalid prefix).
inline std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t bad = 1;
    if (const std::size_t n = utf8_sequence_at(s, i, &bad)) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

// ---------------------------------------------------------------- byte-level alphabet

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

/// The byte-level form of raw bytes (each byte -> its GPT-2 code point, UTF-8 encoded).
inline std::string bytes_to_unicode(std::string_view bytes) {
  static const std::array<std::string, 256> enc = [] {
    std::array<std::string, 256> e;
    for (int b = 0; b < 256; ++b) append_utf8(e[b], byte_to_codepoint()[b]);
    return e;
  }();
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) s += enc[b];
  return s;
}

/// Inverse of bytes_to_unicode; nullopt when a code point is not one of the 256.
inline std::optional<std::string> unicode_to_bytes(std::string_view u) {
  static const std::unordered_map<std::uint32_t, unsigned char> inv = [] {
    std::unordered_map<std::uint32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_codepoint()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  if (invalid_utf8_at(u)) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < u.size();) {
    std::size_t n = 0;
    auto it = inv.find(codepoint_at(u, i, &n));
    if (it == inv.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += n;
  }
  return out;
}

// ---------------------------------------------------------------- character classes

inline bool is_whitespace(std::uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

/// Rust's char::is_alphanumeric (Alphabetic or Numeric) or '_': what "word" means to
/// single_word added tokens.
inline bool is_word_char(std::uint32_t cp) {
  if (cp == '_') return true;
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  const auto t = u_charType(c);
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

// ---------------------------------------------------------------- normalization

enum class NormalForm { nfc, nfd, nfkc, nfkd };

inline std::string normalize(std::string_view s, NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = form == NormalForm::nfc    ? icu::Normalizer2::getNFCInstance(status)
                              : form == NormalForm::nfd  ? icu::Normalizer2::getNFDInstance(status)
                              : form == NormalForm::nfkc ? icu::Normalizer2::getNFKCInstance(status)
                                                         : icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status)) detail::raise(errc::unsupported, "ICU", "no Unicode normalizer available");
  auto us = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<std::int32_t>(s.size())));
  if (n->isNormalized(us, status) && U_SUCCESS(status)) return std::string(s);
  status = U_ZERO_ERROR;
  icu::UnicodeString out = n->normalize(us, status);
  if (U_FAILURE(status)) detail::raise(errc::invalid_argument, "ICU", "normalization failed");
  std::string r;
  out.toUTF8String(r);
  return r;
}

/// Full Unicode lowercase (root locale), as Rust's str::to_lowercase.
inline std::string lowercase(std::string_view s) {
  auto us = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<std::int32_t>(s.size())));
  us.toLower(icu::Locale::getRoot());
  std::string r;
  us.toUTF8String(r);
  return r;
}

// ---------------------------------------------------------------- regular expressions

/// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Matching is const and thread-safe:
/// each call brings its own match data.
class Regex {
 public:
  Regex() = default;
  Regex(std::string_view pattern, const std::string& where) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      detail::raise(errc::format, where,
                    detail::concat("regex '", pattern, "' does not compile at offset ", off, ": ",
                                   reinterpret_cast<const char*>(msg)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
    code_ = std::shared_ptr<pcre2_code>(code, pcre2_code_free);
  }

  bool empty() const noexcept { return !code_; }
  const std::string& pattern() const noexcept { return pattern_; }

  /// Every non-overlapping match [begin, end) of s, left to right (an empty match advances by
  /// one character, as Rust's and Oniguruma's find_iter do). s must be valid UTF-8.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    if (!code_) return out;
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    std::size_t start = 0;
    while (start <= s.size()) {
      int rc = pcre2_match(code_.get(), subject, s.size(), start, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) detail::raise(errc::invalid_argument, "regex '" + pattern_ + "'", "matching failed (PCRE2 error)");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      std::size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: not a piece; step over one character
        if (b >= s.size()) break;
        start = b + utf8_length(static_cast<unsigned char>(s[b]));
        continue;
      }
      out.emplace_back(b, e);
      start = e;
    }
    return out;
  }

 private:
  std::string pattern_;
  std::shared_ptr<pcre2_code> code_;
};

}  // namespace edl::tokenizer
