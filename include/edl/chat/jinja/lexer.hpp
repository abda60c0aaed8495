// edl/chat/jinja/lexer.hpp
// Template source to tokens, with jinja2's whitespace rules as transformers configures them.
//
// transformers renders chat templates with trim_blocks=True and lstrip_blocks=True, and the
// exact whitespace of a prompt decides its tokens, so this follows jinja2's lexer rule by rule:
//  - newlines are normalised to '\n' and one trailing newline of the source is dropped
//    (keep_trailing_newline=False);
//  - `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`, `-}}`, `-#}` all after it;
//  - lstrip_blocks removes spaces and tabs between a line start and `{%` or `{#` (not `{{`),
//    unless the tag is written `{%+`;
//  - trim_blocks removes the single newline right after `%}` or `#}` (not `}}`, not
//    `{% raw %}`), unless the tag ends `+%}`.
// `{% raw %}...{% endraw %}` is resolved here, as jinja2 does, and comments are dropped.
#pragma once

#include <edl/chat/jinja/value.hpp>
#include <edl/core/error.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace edl::chat::jinja {

/// A template error found before rendering: bad syntax, an unknown tag, filter or test.
[[noreturn]] inline void syntax_error(int line, const std::string& what, errc code = errc::format) {
  throw Error(code, "chat.jinja line " + std::to_string(line), what);
}

namespace detail {

struct Token {
  enum Type { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
  Type type = eof;
  std::string text;  // data, name, decoded string, operator
  std::int64_t ival = 0;
  double fval = 0;
  int line = 1;

  bool is_op(std::string_view o) const { return type == op && text == o; }
  bool is_name(std::string_view n) const { return type == name && text == n; }
};

inline std::string describe(const Token& t) {
  switch (t.type) {
    case Token::data: return "template data";
    case Token::var_begin: return "'{{'";
    case Token::var_end: return "end of print statement '}}'";
    case Token::block_begin: return "'{%'";
    case Token::block_end: return "end of statement block '%}'";
    case Token::name: return "'" + t.text + "'";
    case Token::string: return "string";
    case Token::integer: return "integer";
    case Token::floating: return "float";
    case Token::op: return "'" + t.text + "'";
    case Token::eof: return "end of template";
  }
  return "token";
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 splits on \r\n, \r and \n and rejoins with \n, dropping one final empty line.
    src_.reserve(source.size());
    for (std::size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    for (std::size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') newlines_.push_back(i);
  }

  std::vector<Token> run() {
    std::size_t pos = 0, n = src_.size();
    bool line_starting = true;
    while (pos < n) {
      std::size_t p = pos;
      while (p + 1 < n && !(src_[p] == '{' && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#'))) ++p;
      if (p + 1 >= n) {
        emit_data(src_.substr(pos), pos);
        break;
      }
      char kind = src_[p + 1];
      std::size_t q = p + 2;
      char sign = 0;
      if (q < n && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];

      std::size_t raw_after = 0;  // end of `{% raw %}` when this tag is one
      if (kind == '%') raw_after = match_raw_begin(q);

      std::string text = src_.substr(pos, p - pos);
      text = strip_before(text, sign, kind != '{', line_starting);
      emit_data(std::move(text), pos);

      if (kind == '#') {
        pos = lex_comment(p, q, line_starting);
      } else if (raw_after) {
        pos = lex_raw(raw_after, line_starting);
      } else {
        pos = lex_tag(p, q, kind == '%', line_starting);
      }
    }
    tokens_.push_back(Token{Token::eof, "", 0, 0, line_at(n)});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<std::size_t> newlines_;  // positions of '\n', for line numbers
  std::vector<Token> tokens_;

  int line_at(std::size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin());
  }

  void emit_data(std::string text, std::size_t pos) {
    if (text.empty()) return;
    tokens_.push_back(Token{Token::data, std::move(text), 0, 0, line_at(pos)});
  }

  bool ws_at(std::size_t i) const { return i < src_.size() && is_ws_byte(src_[i]); }
  static bool is_ws_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

  /// Python's `\s*` from `i` (Unicode whitespace, as jinja2's patterns are str patterns).
  std::size_t skip_ws(std::size_t i) const {
    while (i < src_.size()) {
      auto c = static_cast<unsigned char>(src_[i]);
      if (c < 0x80) {
        if (!is_space(c)) break;
        ++i;
        continue;
      }
      std::size_t len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      auto cps = decode_utf8(std::string_view(src_).substr(i, len));
      if (cps.size() != 1 || !is_space(cps[0])) break;
      i += len;
    }
    return i;
  }

  bool starts(std::size_t i, std::string_view s) const { return src_.compare(i, s.size(), s) == 0; }

  /// The text before a tag after `-` (strip all whitespace) or lstrip_blocks (strip spaces
  /// between the line start and a block or comment tag).
  static std::string strip_before(const std::string& text, char sign, bool lstrip, bool line_starting) {
    if (sign == '-') {
      auto cps = decode_utf8(text);
      std::size_t e = cps.size();
      while (e > 0 && is_space(cps[e - 1])) --e;
      return encode_utf8(std::u32string_view(cps).substr(0, e));
    }
    if (sign == '+' || !lstrip) return text;
    std::size_t nl = text.rfind('\n');
    std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos >= text.size()) return text;  // `\s+` needs at least one character
    for (char32_t c : decode_utf8(std::string_view(text).substr(l_pos)))
      if (!is_space(c)) return text;
    return text.substr(0, l_pos);
  }

  /// `{%(-|+|)\s*raw\s*(-%}\s*|%})`: returns the position after it, or 0.
  std::size_t match_raw_begin(std::size_t q) const {
    std::size_t r = skip_ws(q);
    if (!starts(r, "raw")) return 0;
    r = skip_ws(r + 3);
    if (starts(r, "-%}")) return skip_ws(r + 3);
    if (starts(r, "%}")) return r + 2;
    return 0;
  }

  std::size_t lex_comment(std::size_t p, std::size_t q, bool& line_starting) {
    std::size_t e = src_.find("#}", q);
    if (e == std::string::npos) syntax_error(line_at(p), "missing end of comment tag '#}'");
    std::size_t after = e + 2;
    if (e > q && src_[e - 1] == '-') after = skip_ws(after);
    else if (e > q && src_[e - 1] == '+') {
    } else if (after < src_.size() && src_[after] == '\n') ++after;
    line_starting = src_[after - 1] == '\n';
    return after;
  }

  std::size_t lex_raw(std::size_t start, bool& line_starting) {
    line_starting = src_[start - 1] == '\n';
    for (std::size_t m = src_.find("{%", start); m != std::string::npos; m = src_.find("{%", m + 1)) {
      std::size_t r = m + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r = skip_ws(r);
      if (!starts(r, "endraw")) continue;
      r = skip_ws(r + 6);
      std::size_t after;
      if (starts(r, "+%}")) after = r + 3;
      else if (starts(r, "-%}")) after = skip_ws(r + 3);
      else if (starts(r, "%}")) after = (r + 2 < src_.size() && src_[r + 2] == '\n') ? r + 3 : r + 2;
      else continue;
      emit_data(strip_before(src_.substr(start, m - start), sign, true, line_starting), start);
      line_starting = src_[after - 1] == '\n';
      return after;
    }
    syntax_error(line_at(start), "missing end of raw directive '{% endraw %}'");
  }

  std::size_t lex_tag(std::size_t p, std::size_t q, bool block, bool& line_starting) {
    tokens_.push_back(Token{block ? Token::block_begin : Token::var_begin, "", 0, 0, line_at(p)});
    std::string stack;  // open brackets; the tag cannot end inside them (as in jinja2)
    std::size_t i = q, n = src_.size();
    while (true) {
      i = skip_ws(i);
      if (i >= n)
        syntax_error(line_at(p), block ? "unexpected end of template, expected end of statement block '%}'"
                                       : "unexpected end of template, expected end of print statement '}}'");
      int line = line_at(i);
      if (stack.empty()) {
        std::size_t after = 0;
        if (block) {
          if (starts(i, "-%}")) after = skip_ws(i + 3);
          else if (starts(i, "+%}")) after = i + 3;
          else if (starts(i, "%}")) after = (i + 2 < n && src_[i + 2] == '\n') ? i + 3 : i + 2;
        } else {
          if (starts(i, "-}}")) after = skip_ws(i + 3);
          else if (starts(i, "}}")) after = i + 2;
        }
        if (after) {
          tokens_.push_back(Token{block ? Token::block_end : Token::var_end, "", 0, 0, line});
          line_starting = src_[after - 1] == '\n';
          return after;
        }
      }
      char c = src_[i];
      if (c >= '0' && c <= '9') {
        i = lex_number(i, line);
      } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        std::size_t s = i;
        while (i < n && (src_[i] == '_' || std::isalnum(static_cast<unsigned char>(src_[i])))) ++i;
        tokens_.push_back(Token{Token::name, src_.substr(s, i - s), 0, 0, line});
      } else if (c == '\'' || c == '"') {
        i = lex_string(i, line);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (starts(i, t)) op = t;
        if (op.empty()) {
          if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos)
            syntax_error(line, std::string("unexpected char '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          stack += op[0];
        } else if (op == ")" || op == "]" || op == "}") {
          char want = op == ")" ? '(' : op == "]" ? '[' : '{';
          if (stack.empty()) syntax_error(line, "unexpected '" + op + "'");
          if (stack.back() != want) {
            char open = stack.back();
            syntax_error(line, "unexpected '" + op + "', expected '" + (open == '(' ? ")" : open == '[' ? "]" : "}") + "'");
          }
          stack.pop_back();
        }
        tokens_.push_back(Token{Token::op, op, 0, 0, line});
        i += op.size();
      }
    }
  }

  std::size_t lex_number(std::size_t i, int line) {
    std::size_t n = src_.size(), s = i;
    auto digits = [&](std::size_t j, auto pred) {
      // (\d+_)*\d+ style runs: digits with single underscores between them
      std::size_t k = j;
      while (k < n && (pred(src_[k]) || (src_[k] == '_' && k + 1 < n && pred(src_[k + 1]) && k > j))) ++k;
      return k;
    };
    auto dec = [](char ch) { return ch >= '0' && ch <= '9'; };
    if (src_[i] == '0' && i + 1 < n && std::string_view("xXoObB").find(src_[i + 1]) != std::string_view::npos) {
      int base = (src_[i + 1] == 'x' || src_[i + 1] == 'X') ? 16 : (src_[i + 1] == 'o' || src_[i + 1] == 'O') ? 8 : 2;
      std::size_t k = i + 2;
      std::string ds;
      while (k < n) {
        char ch = src_[k];
        int d = dec(ch) ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10 : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : 99;
        if (ch == '_') { ++k; continue; }
        if (d >= base) break;
        ds += ch;
        ++k;
      }
      if (!ds.empty()) {
        std::int64_t v = 0;
        auto r = std::from_chars(ds.data(), ds.data() + ds.size(), v, base);
        if (r.ec != std::errc()) syntax_error(line, "integer literal too large");
        tokens_.push_back(Token{Token::integer, "", v, 0, line});
        return k;
      }
    }
    std::size_t k = digits(i, dec);
    bool is_float = false;
    bool after_dot = s > 0 && src_[s - 1] == '.';  // jinja2's (?<!\.): `x.1.2` is x[1][2]
    if (!after_dot && k + 1 < n && src_[k] == '.' && dec(src_[k + 1])) {
      k = digits(k + 1, dec);
      is_float = true;
    }
    if (!after_dot && k < n && (src_[k] == 'e' || src_[k] == 'E')) {
      std::size_t e = k + 1;
      if (e < n && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < n && dec(src_[e])) {
        k = digits(e, dec);
        is_float = true;
      }
    }
    std::string text;
    for (std::size_t j = s; j < k; ++j)
      if (src_[j] != '_') text += src_[j];
    if (is_float) {
      tokens_.push_back(Token{Token::floating, "", 0, std::strtod(text.c_str(), nullptr), line});
    } else {
      std::int64_t v = 0;
      auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (r.ec != std::errc()) syntax_error(line, "integer literal too large: " + text);
      tokens_.push_back(Token{Token::integer, "", v, 0, line});
    }
    return k;
  }

  /// A quoted string, decoded the way jinja2 does (Python's unicode-escape).
  std::size_t lex_string(std::size_t i, int line) {
    char q = src_[i];
    std::size_t k = i + 1, n = src_.size();
    while (k < n && src_[k] != q) k += src_[k] == '\\' ? 2 : 1;
    if (k >= n) syntax_error(line, "unexpected end of string");
    tokens_.push_back(Token{Token::string, unescape(std::string_view(src_).substr(i + 1, k - i - 1), line), 0, 0, line});
    return k + 1;
  }

  static std::string unescape(std::string_view raw, int line) {
    auto cps = decode_utf8(raw);
    std::string out;
    auto hex = [&](std::size_t at, int count) -> long {
      long v = 0;
      for (int d = 0; d < count; ++d) {
        if (at + d >= cps.size()) return -1;
        char32_t c = cps[at + d];
        int x = (c >= '0' && c <= '9') ? int(c - '0') : (c >= 'a' && c <= 'f') ? int(c - 'a' + 10) : (c >= 'A' && c <= 'F') ? int(c - 'A' + 10) : -1;
        if (x < 0) return -1;
        v = v * 16 + x;
      }
      return v;
    };
    for (std::size_t i = 0; i < cps.size(); ++i) {
      char32_t c = cps[i];
      if (c != '\\') {
        append_utf8(out, c);
        continue;
      }
      if (i + 1 >= cps.size()) syntax_error(line, "string literal ends with a backslash");
      char32_t e = cps[++i];
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          int count = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          long v = hex(i + 1, count);
          if (v < 0 || v > 0x10FFFF) syntax_error(line, "truncated or invalid \\" + std::string(1, char(e)) + " escape in string literal");
          append_utf8(out, static_cast<char32_t>(v));
          i += static_cast<std::size_t>(count);
          break;
        }
        case 'N': syntax_error(line, "\\N{...} escapes in string literals are not supported", errc::unsupported);
        default:
          if (e >= '0' && e <= '7') {
            int v = int(e - '0');
            for (int d = 0; d < 2 && i + 1 < cps.size() && cps[i + 1] >= '0' && cps[i + 1] <= '7'; ++d) v = v * 8 + int(cps[++i] - '0');
            append_utf8(out, static_cast<char32_t>(v));
          } else if (e >= 0x80) {
            // jinja2 first applies backslashreplace, so `\é` becomes the text `\xe9`.
            char buf[16];
            if (e < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(e));
            else if (e < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(e));
            else std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(e));
            out += buf;
          } else {
            out += '\\';
            append_utf8(out, e);
          }
      }
    }
    return out;
  }
};

}  // namespace detail
}  // namespace edl::chat::jinja
