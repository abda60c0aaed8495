// edl/chat/jinja/evaluator.hpp
// Renders a parsed template: scopes, operators, filters, tests and Python methods.
//
// Everything here mirrors what jinja2 does inside transformers' ImmutableSandboxedEnvironment:
//  - scopes: a for loop body gets a fresh scope per iteration (assignments do not survive the
//    iteration, let alone the loop), `if` does not open a scope, macros see the variables of
//    the scope that defined them as they are when called, and `namespace()` objects are the
//    only way to carry state out of a loop;
//  - the sandbox: no method that mutates a list or dict may be called (`xs.append` is an
//    "unsafe" Undefined whose call is a SecurityError), ranges are capped at 100000;
//  - filters that return Python generators (select, map, items, unique, batch ...) return
//    one-shot generators here too: always true, no len(), exhausted after one pass.
// Bounded work: macro recursion depth, nesting of values and the number of executed steps are
// limited so that no input can crash or hang the process.
#pragma once

#include <edl/chat/jinja/parser.hpp>
#include <edl/chat/jinja/value.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edl::chat::jinja {

/// A function callable from templates (globals such as raise_exception, bound methods).
struct Function : Object {
  std::string name;
  std::function<Value(Args&)> fn;
  Function(std::string n, std::function<Value(Args&)> f) : name(std::move(n)), fn(std::move(f)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  std::string repr(int) const override { return "<built-in function " + name + ">"; }
  bool callable() const override { return true; }
  Value call(Args& a) override { return fn(a); }
};

inline Value make_function(std::string name, std::function<Value(Args&)> fn) {
  return Value(std::static_pointer_cast<Object>(std::make_shared<Function>(std::move(name), std::move(fn))));
}

/// jinja2's namespace(): the one object templates may assign attributes on.
struct Namespace : Object {
  DictData attrs;
  std::string type_name() const override { return "Namespace"; }
  std::string repr(int depth) const override {
    auto d = std::make_shared<DictData>(attrs);
    return "<Namespace " + jinja::repr(Value(d), depth) + ">";
  }
  std::optional<Value> attr(std::string_view name) const override {
    if (const Value* v = attrs.find(Value(std::string(name)))) return *v;
    return std::nullopt;
  }
};

namespace detail {

using Step = std::int64_t;

inline Value int_value(std::int64_t v) { return Value(v); }
inline Value size_value(std::size_t v) { return Value(static_cast<std::int64_t>(v)); }

[[noreturn]] inline void undefined_error(const Value& u) {
  if (u.is_unsafe()) fail(RenderFailure::security_error, u.undefined_hint());
  fail(RenderFailure::undefined_error, u.undefined_hint().empty() ? "value is undefined" : u.undefined_hint());
}

inline std::string object_desc(const Value& v) {
  if (v.is_none()) return "None";
  return "'" + type_name(v) + " object'";
}

inline Value missing_attr(const Value& obj, std::string_view name) {
  return Value::undefined(object_desc(obj) + " has no attribute '" + std::string(name) + "'");
}

inline Value unsafe_attr(const Value& obj, std::string_view name) {
  return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(obj) + "' object is unsafe.", true);
}

struct Scope : std::enable_shared_from_this<Scope> {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Scope> parent;

  explicit Scope(std::shared_ptr<Scope> p = nullptr) : parent(std::move(p)) {}
  const Value* lookup(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      for (auto it = s->vars.rbegin(); it != s->vars.rend(); ++it)
        if (it->first == name) return &it->second;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& kv : vars)
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

// ---------------------------------------------------------------------------------------------
// Strings in code points

inline std::u32string u32(const Value& v) { return decode_utf8(v.str()); }
inline Value str_value(std::u32string_view s, bool markup = false) { return Value(encode_utf8(s), markup); }

inline std::u32string strip_cps(std::u32string s, const Value& chars, bool left, bool right) {
  std::u32string set;
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) {
    if (!chars.is_string()) type_error("strip arg must be None or str");
    set = decode_utf8(chars.str());
  }
  auto in = [&](char32_t c) { return ws ? is_space(c) : set.find(c) != std::u32string::npos; };
  std::size_t b = 0, e = s.size();
  if (left)
    while (b < e && in(s[b])) ++b;
  if (right)
    while (e > b && in(s[e - 1])) --e;
  return s.substr(b, e - b);
}

inline std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out += c;
    }
  }
  return out;
}

/// markupsafe's rule: combining Markup with a plain str escapes the str.
inline std::string as_markup_text(const Value& v) { return v.is_markup() ? v.str() : html_escape(to_str(v)); }

/// Python's str.splitlines() boundaries.
inline bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

inline std::vector<std::u32string> split_lines(const std::u32string& s, bool keepends = false) {
  std::vector<std::u32string> out;
  std::size_t i = 0, start = 0;
  while (i < s.size()) {
    if (is_line_break(s[i])) {
      std::size_t end = i;
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      ++i;
      out.push_back(s.substr(start, (keepends ? i : end) - start));
      start = i;
    } else {
      ++i;
    }
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

inline std::u32string py_upper(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c == 0xDF) out += U"SS";  // German sharp s upper-cases to two letters in Python
    else out += to_upper(c);
  }
  return out;
}
inline std::u32string py_lower(std::u32string s) {
  for (auto& c : s) c = to_lower(c);
  return s;
}
inline std::u32string py_capitalize(std::u32string s) {
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = i == 0 ? to_upper(s[i]) : to_lower(s[i]);
  return s;
}
/// str.title(): a letter after a non-letter starts a word.
inline std::u32string py_title_method(std::u32string s) {
  bool prev_cased = false;
  for (auto& c : s) {
    bool cased = is_upper(c) || is_lower(c);
    c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = cased;
  }
  return s;
}
/// jinja2's |title: words are split at runs of [-\s({\[<]; each piece is capitalised.
inline std::u32string jinja_title(const std::u32string& s) {
  auto sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c); };
  std::u32string out;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = i;
    bool in_sep = sep(s[i]);
    while (j < s.size() && sep(s[j]) == in_sep) ++j;
    std::u32string piece = s.substr(i, j - i);
    if (in_sep) out += piece;
    else {
      out += to_upper(piece[0]);
      out += py_lower(piece.substr(1));
    }
    i = j;
  }
  return out;
}

inline std::size_t cp_find(const std::u32string& hay, const std::u32string& needle, std::size_t from = 0) {
  return hay.find(needle, from);
}

inline std::vector<Value> py_split(const std::u32string& s, const Value& sep, std::int64_t maxsplit, bool from_right) {
  std::vector<std::u32string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Whitespace split: runs of whitespace separate, leading/trailing whitespace ignored.
    if (!from_right) {
      std::size_t i = 0, n = s.size();
      std::int64_t splits = 0;
      while (true) {
        while (i < n && is_space(s[i])) ++i;
        if (i >= n) break;
        if (maxsplit >= 0 && splits >= maxsplit) {  // the rest, trailing whitespace included
          parts.push_back(s.substr(i));
          break;
        }
        std::size_t j = i;
        while (j < n && !is_space(s[j])) ++j;
        parts.push_back(s.substr(i, j - i));
        ++splits;
        i = j;
      }
    } else {
      std::ptrdiff_t i = static_cast<std::ptrdiff_t>(s.size()) - 1;
      std::int64_t splits = 0;
      while (true) {
        while (i >= 0 && is_space(s[static_cast<std::size_t>(i)])) --i;
        if (i < 0) break;
        if (maxsplit >= 0 && splits >= maxsplit) {  // the rest, leading whitespace included
          parts.push_back(s.substr(0, static_cast<std::size_t>(i) + 1));
          break;
        }
        std::ptrdiff_t j = i;
        while (j >= 0 && !is_space(s[static_cast<std::size_t>(j)])) --j;
        parts.push_back(s.substr(static_cast<std::size_t>(j + 1), static_cast<std::size_t>(i - j)));
        ++splits;
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    if (!sep.is_string()) type_error("must be str or None, not " + type_name(sep));
    std::u32string d = decode_utf8(sep.str());
    if (d.empty()) fail(RenderFailure::value_error, "empty separator");
    if (!from_right) {
      std::size_t start = 0;
      std::int64_t splits = 0;
      while (maxsplit < 0 || splits < maxsplit) {
        std::size_t p = s.find(d, start);
        if (p == std::u32string::npos) break;
        parts.push_back(s.substr(start, p - start));
        start = p + d.size();
        ++splits;
      }
      parts.push_back(s.substr(start));
    } else {
      std::size_t end = s.size();
      std::int64_t splits = 0;
      while (maxsplit < 0 || splits < maxsplit) {
        if (end < d.size()) break;
        std::size_t p = s.rfind(d, end - d.size());
        if (p == std::u32string::npos) break;
        parts.push_back(s.substr(p + d.size(), end - p - d.size()));
        end = p;
        ++splits;
      }
      parts.push_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.push_back(str_value(p));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Numbers

inline std::int64_t checked(bool overflow, std::int64_t v) {
  if (overflow) fail(RenderFailure::limit, "integer overflow (edl's template integers are 64-bit)");
  return v;
}

/// a op b on 64-bit integers, refusing overflow (Python ints are unbounded; ours are not).
inline std::int64_t int_arith(char op, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  bool o = op == '+' ? __builtin_add_overflow(a, b, &r) : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                                                    : __builtin_mul_overflow(a, b, &r);
  return checked(o, r);
}

inline std::int64_t py_floordiv(std::int64_t a, std::int64_t b) {
  if (b == 0) fail(RenderFailure::value_error, "integer division or modulo by zero");
  if (a == std::numeric_limits<std::int64_t>::min() && b == -1) checked(true, 0);
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
inline std::int64_t py_mod(std::int64_t a, std::int64_t b) {
  if (b == 0) fail(RenderFailure::value_error, "integer division or modulo by zero");
  if (b == -1) return 0;
  std::int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}
/// CPython's float divmod.
inline std::pair<double, double> py_float_divmod(double vx, double wx) {
  if (wx == 0.0) fail(RenderFailure::value_error, "float division by zero");
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
  return {floordiv, mod};
}

/// Python's float(str): surrounding whitespace, underscores between digits, inf and nan.
inline std::optional<double> parse_py_float(std::string_view text) {
  auto cps = strip_cps(decode_utf8(text), Value(nullptr), true, true);
  std::string s;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    char32_t c = cps[i];
    if (c >= 0x80) return std::nullopt;
    if (c == '_') {
      if (i == 0 || i + 1 >= cps.size() || !is_digit(cps[i - 1]) || !is_digit(cps[i + 1])) return std::nullopt;
      continue;
    }
    s += static_cast<char>(c);
  }
  if (s.empty()) return std::nullopt;
  std::string low;
  for (char c : s) low += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string body = (low[0] == '+' || low[0] == '-') ? low.substr(1) : low;
  if (body == "inf" || body == "infinity") return low[0] == '-' ? -INFINITY : INFINITY;
  if (body == "nan") return NAN;
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-')) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

/// Python's int(str, base): whitespace, sign, underscores between digits; base 0 reads prefixes.
inline std::optional<std::int64_t> parse_py_int(std::string_view text, int base) {
  auto cps = strip_cps(decode_utf8(text), Value(nullptr), true, true);
  std::string s;
  for (char32_t c : cps) {
    if (c >= 0x80) return std::nullopt;
    s += static_cast<char>(c);
  }
  std::size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  if (i + 1 < s.size() && s[i] == '0') {
    char p = lower(s[i + 1]);
    int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb && (base == 0 || base == pb)) {
      base = pb;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return std::nullopt;
  std::int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = lower(s[i]);
    if (c == '_') {
      if (!prev_digit || i + 1 >= s.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) checked(true, 0);
    prev_digit = true;
  }
  return neg ? -v : v;
}

// ---------------------------------------------------------------------------------------------
// printf-style and str.format formatting (the subset templates use).

struct Spec {
  char fill = ' ';
  char align = 0;
  char sign = '-';
  bool alt = false, zero = false;
  int width = -1, precision = -1;
  char type = 0;
};

inline std::string pad(std::string body, const Spec& sp, char default_align) {
  std::size_t len = utf8_length(body);
  if (sp.width < 0 || len >= static_cast<std::size_t>(sp.width)) return body;
  std::size_t n = static_cast<std::size_t>(sp.width) - len;
  char al = sp.align ? sp.align : default_align;
  if (al == '<') return body + std::string(n, sp.fill);
  if (al == '^') return std::string(n / 2, sp.fill) + body + std::string(n - n / 2, sp.fill);
  if (al == '=' && !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' '))
    return body.substr(0, 1) + std::string(n, sp.fill) + body.substr(1);
  return std::string(n, sp.fill) + body;
}

inline std::string format_number(const Value& v, const Spec& sp) {
  char t = sp.type;
  std::string body;
  if (t == 'd' || t == 'i' || t == 'u' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || (t == 0 && v.is_integral())) {
    if (!v.is_number()) type_error("%d format: a real number is required, not " + type_name(v));
    std::int64_t x = v.is_float() ? static_cast<std::int64_t>(v.as_float()) : v.as_int();
    bool neg = x < 0;
    std::uint64_t ux = neg ? 0 - static_cast<std::uint64_t>(x) : static_cast<std::uint64_t>(x);
    int base = (t == 'x' || t == 'X') ? 16 : t == 'o' ? 8 : t == 'b' ? 2 : 10;
    std::string digits;
    do {
      int d = static_cast<int>(ux % static_cast<std::uint64_t>(base));
      digits += static_cast<char>(d < 10 ? '0' + d : (t == 'X' ? 'A' : 'a') + d - 10);
      ux /= static_cast<std::uint64_t>(base);
    } while (ux);
    std::reverse(digits.begin(), digits.end());
    body = digits;
    if (neg) body = "-" + body;
    else if (sp.sign == '+') body = "+" + body;
    else if (sp.sign == ' ') body = " " + body;
  } else {
    if (!v.is_number()) type_error("must be real number, not " + type_name(v));
    double x = v.as_float();
    int prec = sp.precision < 0 ? 6 : std::min(sp.precision, 100);
    char buf[512];
    char ct = t == 0 ? 'r' : t;
    if (ct == 'r') {
      body = float_repr(x);
    } else {
      if (ct != 'f' && ct != 'F' && ct != 'e' && ct != 'E' && ct != 'g' && ct != 'G' && ct != '%')
        fail(RenderFailure::value_error, std::string("unsupported format character '") + ct + "'");
      if (ct == '%') {
        std::snprintf(buf, sizeof buf, "%.*f%%", prec, x * 100);
      } else {
        char fmt[8] = {'%', '.', '*', ct, 0};
        std::snprintf(buf, sizeof buf, fmt, prec, x);
      }
      body = buf;
    }
    if (x >= 0 && sp.sign == '+') body = "+" + body;
    else if (x >= 0 && sp.sign == ' ') body = " " + body;
  }
  if (sp.zero && sp.width > 0 && !sp.align) {
    Spec z = sp;
    z.fill = '0';
    z.align = '=';
    return pad(body, z, '>');
  }
  return pad(body, sp, '>');
}

/// printf-style `str % args` as Python's str.__mod__ (s r d i u f F e E g G x X o c %).
inline std::string percent_format(const std::string& fmt, const Value& arg) {
  std::vector<Value> args;
  const DictData* mapping = nullptr;
  if (arg.is_list() && arg.list().kind == SeqKind::Tuple) args = arg.list().items;
  else if (arg.is_dict()) mapping = &arg.dict(), args.push_back(arg);
  else args.push_back(arg);
  std::size_t next = 0;
  std::string out;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail(RenderFailure::value_error, "incomplete format");
    Value v;
    bool have = false;
    if (fmt[i] == '(') {
      std::size_t e = fmt.find(')', i);
      if (e == std::string::npos || !mapping) fail(RenderFailure::type_error, "format requires a mapping");
      const Value* f = mapping->find(Value(fmt.substr(i + 1, e - i - 1)));
      if (!f) fail(RenderFailure::value_error, "KeyError: '" + fmt.substr(i + 1, e - i - 1) + "'");
      v = *f;
      have = true;
      i = e + 1;
    }
    Spec sp;
    for (; i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos; ++i) {
      if (fmt[i] == '-') sp.align = '<';
      else if (fmt[i] == '+') sp.sign = '+';
      else if (fmt[i] == ' ' && sp.sign != '+') sp.sign = ' ';
      else if (fmt[i] == '#') sp.alt = true;
      else if (fmt[i] == '0') sp.zero = true;
    }
    if (sp.align == '<') sp.zero = false;
    auto read_int = [&]() {
      int n = 0;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) n = std::min(n * 10 + (fmt[i++] - '0'), 100000);
      return n;
    };
    if (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) sp.width = read_int();
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      sp.precision = read_int();
    }
    if (i >= fmt.size()) fail(RenderFailure::value_error, "incomplete format");
    char t = fmt[i];
    if (t == '%') {
      out += '%';
      continue;
    }
    if (!have) {
      if (mapping) v = args[0];
      else if (next >= args.size()) type_error("not enough arguments for format string");
      else v = args[next++];
    }
    if (t == 's' || t == 'r' || t == 'a') {
      std::string s = t == 's' ? to_str(v) : repr(v);
      if (sp.precision >= 0) s = encode_utf8(decode_utf8(s).substr(0, static_cast<std::size_t>(sp.precision)));
      out += pad(s, sp, '>');
    } else if (t == 'c') {
      out += pad(v.is_string() ? v.str() : encode_utf8(std::u32string(1, static_cast<char32_t>(v.as_int()))), sp, '>');
    } else {
      sp.type = t == 'F' ? 'F' : t;
      if (v.is_string() || !v.is_number()) type_error("%" + std::string(1, t) + " format: a real number is required, not " + type_name(v));
      out += format_number(v, sp);
    }
  }
  if (!mapping && next < args.size()) type_error("not all arguments converted during string formatting");
  return out;
}

inline Spec parse_spec(const std::string& s) {
  Spec sp;
  std::size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    sp.fill = s[0];
    sp.align = s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    sp.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp.sign = s[i++];
  if (i < s.size() && s[i] == '#') sp.alt = true, ++i;
  if (i < s.size() && s[i] == '0') sp.zero = true, ++i;
  int w = 0;
  bool hw = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) w = std::min(w * 10 + (s[i++] - '0'), 100000), hw = true;
  if (hw) sp.width = w;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int p = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) p = std::min(p * 10 + (s[i++] - '0'), 100);
    sp.precision = p;
  }
  if (i < s.size()) sp.type = s[i++];
  if (i != s.size()) fail(RenderFailure::value_error, "Invalid format specifier '" + s + "'");
  return sp;
}

inline std::string apply_spec(const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  Spec sp = parse_spec(spec);
  if (v.is_string() || (sp.type == 's')) {
    if (!v.is_string()) type_error("Unknown format code 's' for object of type '" + type_name(v) + "'");
    std::string s = v.str();
    if (sp.precision >= 0) s = encode_utf8(decode_utf8(s).substr(0, static_cast<std::size_t>(sp.precision)));
    return pad(s, sp, '<');
  }
  if (v.is_number()) {
    if (sp.zero && !sp.align) sp.fill = '0', sp.align = '=';
    Spec z = sp;
    z.zero = false;
    if (sp.type == 0 && v.is_float() && sp.precision >= 0) z.type = 'g';
    return format_number(v, z);
  }
  type_error("unsupported format string passed to " + type_name(v) + ".__format__");
}

// ---------------------------------------------------------------------------------------------
// Slicing (Python's PySlice_AdjustIndices)

inline std::vector<std::size_t> slice_indices(std::size_t len, const Value& start, const Value& stop, const Value& step) {
  auto arg = [](const Value& v) -> std::optional<std::int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!v.is_integral()) type_error("slice indices must be integers or None");
    return v.as_int();
  };
  auto L = static_cast<std::int64_t>(len);
  std::int64_t st = arg(step).value_or(1);
  if (st == 0) fail(RenderFailure::value_error, "slice step cannot be zero");
  auto adjust = [&](std::optional<std::int64_t> x, std::int64_t def) {
    if (!x) return def;
    std::int64_t v = *x;
    if (v < 0) {
      v += L;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= L) {
      v = st < 0 ? L - 1 : L;
    }
    return v;
  };
  std::int64_t b = adjust(arg(start), st < 0 ? L - 1 : 0);
  std::int64_t e = adjust(arg(stop), st < 0 ? -1 : L);
  std::vector<std::size_t> out;
  for (std::int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(static_cast<std::size_t>(i));
  return out;
}

}  // namespace detail

// =============================================================================================

class Renderer;

namespace detail {

using FilterFn = Value (*)(Renderer&, const Value&, Args&);
using TestFn = bool (*)(Renderer&, const Value&, Args&);

inline const std::map<std::string, FilterFn, std::less<>>& filter_table();
inline const std::map<std::string, TestFn, std::less<>>& test_table();

struct LoopState {
  std::vector<Value> items;
  std::size_t index0 = 0;
  Value last_changed;
  bool has_changed = false;
};

/// The `loop` variable of a for loop.
struct LoopContext : Object {
  std::shared_ptr<LoopState> st = std::make_shared<LoopState>();
  std::string type_name() const override { return "LoopContext"; }
  std::string repr(int) const override {
    return "<LoopContext " + std::to_string(st->index0 + 1) + "/" + std::to_string(st->items.size()) + ">";
  }
  bool callable() const override { return true; }
  Value call(Args&) override { fail(RenderFailure::type_error, "Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier."); }
  std::optional<Value> attr(std::string_view n) const override {
    auto i = static_cast<std::int64_t>(st->index0);
    auto len = static_cast<std::int64_t>(st->items.size());
    if (n == "index") return Value(i + 1);
    if (n == "index0") return Value(i);
    if (n == "revindex") return Value(len - i);
    if (n == "revindex0") return Value(len - i - 1);
    if (n == "first") return Value(i == 0);
    if (n == "last") return Value(i == len - 1);
    if (n == "length") return Value(len);
    if (n == "depth") return Value(std::int64_t{1});
    if (n == "depth0") return Value(std::int64_t{0});
    if (n == "previtem")
      return i > 0 ? st->items[static_cast<std::size_t>(i - 1)] : Value::undefined("there is no previous item");
    if (n == "nextitem")
      return i + 1 < len ? st->items[static_cast<std::size_t>(i + 1)] : Value::undefined("there is no next item");
    if (n == "cycle") {
      auto s = st;
      return make_function("cycle", [s](Args& a) -> Value {
        if (a.pos.empty()) type_error("no items for cycling given");
        return a.pos[s->index0 % a.pos.size()];
      });
    }
    if (n == "changed") {
      auto s = st;
      return make_function("changed", [s](Args& a) -> Value {
        Value v(a.pos, SeqKind::Tuple);
        if (!s->has_changed || !equals(v, s->last_changed)) {
          s->has_changed = true;
          s->last_changed = v;
          return Value(true);
        }
        return Value(false);
      });
    }
    return std::nullopt;
  }
};

}  // namespace detail

/// Executes a parsed template against a root scope. One Renderer per render call.
class Renderer {
 public:
  using ScopePtr = detail::ScopePtr;

  Renderer(const detail::Program& prog, ScopePtr root) : prog_(prog), root_(std::move(root)) {}

  std::string render() {
    std::string out;
    exec(prog_.body, root_, out);
    return out;
  }

  int line() const { return line_; }

  // ---- value operations shared with the filters ------------------------------------------

  /// The items a for loop (or list()) visits: list items, dict keys, string characters.
  std::vector<Value> iterate(const Value& v) {
    switch (v.kind()) {
      case Kind::Undefined: return {};
      case Kind::List: return v.list().items;
      case Kind::Dict: {
        std::vector<Value> keys;
        for (const auto& kv : v.dict().items) keys.push_back(kv.first);
        return keys;
      }
      case Kind::String: {
        std::vector<Value> chars;
        for (char32_t c : detail::u32(v)) chars.push_back(detail::str_value(std::u32string(1, c), v.is_markup()));
        return chars;
      }
      case Kind::Iterator: {
        auto& it = v.iter();
        std::vector<Value> rest(it.items.begin() + static_cast<std::ptrdiff_t>(it.pos), it.items.end());
        it.pos = it.items.size();
        return rest;
      }
      case Kind::Object:
        if (auto* loop = dynamic_cast<detail::LoopContext*>(&v.object())) return loop->st->items;
        break;
      default: break;
    }
    detail::type_error("'" + type_name(v) + "' object is not iterable");
  }

  std::int64_t length(const Value& v) {
    switch (v.kind()) {
      case Kind::Undefined: return 0;
      case Kind::String: return static_cast<std::int64_t>(detail::utf8_length(v.str()));
      case Kind::List: return static_cast<std::int64_t>(v.list().items.size());
      case Kind::Dict: return static_cast<std::int64_t>(v.dict().items.size());
      default: detail::type_error("object of type '" + type_name(v) + "' has no len()");
    }
  }

  /// environment.getattr: attribute first (methods), then item.
  Value getattr(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) detail::undefined_error(obj);
    if (name.size() > 1 && name[0] == '_' && name[1] == '_') return detail::unsafe_attr(obj, name);
    if (auto m = method(obj, name)) return *m;
    switch (obj.kind()) {
      case Kind::Dict:
        if (const Value* v = obj.dict().find(Value(name))) return *v;
        break;
      case Kind::Object:
        if (auto v = obj.object().attr(name)) return *v;
        break;
      default: break;
    }
    return detail::missing_attr(obj, name);
  }

  /// environment.getitem: item first, then attribute for string keys.
  Value getitem(const Value& obj, const Value& key) {
    if (obj.is_undefined()) detail::undefined_error(obj);
    switch (obj.kind()) {
      case Kind::Dict:
        if (const Value* v = obj.dict().find(key)) return *v;
        break;
      case Kind::List: {
        const auto& l = obj.list();
        if ((l.kind == SeqKind::List || l.kind == SeqKind::Tuple) && key.is_integral()) {
          auto n = static_cast<std::int64_t>(l.items.size());
          std::int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
          if (i >= 0 && i < n) return l.items[static_cast<std::size_t>(i)];
          return Value::undefined(detail::object_desc(obj) + " has no element " + to_str(key));
        }
        break;
      }
      case Kind::String:
        if (key.is_integral()) {
          auto cps = detail::u32(obj);
          auto n = static_cast<std::int64_t>(cps.size());
          std::int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
          if (i >= 0 && i < n) return detail::str_value(std::u32string(1, cps[static_cast<std::size_t>(i)]), obj.is_markup());
          return Value::undefined(detail::object_desc(obj) + " has no element " + to_str(key));
        }
        break;
      default: break;
    }
    if (key.is_string()) {
      if (key.str().size() > 1 && key.str()[0] == '_' && key.str()[1] == '_') return detail::unsafe_attr(obj, key.str());
      if (auto m = method(obj, key.str())) return *m;
      if (obj.is_object())
        if (auto v = obj.object().attr(key.str())) return *v;
      return detail::missing_attr(obj, key.str());
    }
    return Value::undefined(detail::object_desc(obj) + " has no element " + repr(key));
  }

  Value call(const Value& fn, Args& args) {
    if (fn.is_undefined()) detail::undefined_error(fn);
    if (fn.is_object() && fn.object().callable()) return fn.object().call(args);
    detail::type_error("'" + type_name(fn) + "' object is not callable");
  }

  Value apply_filter(const std::string& name, const Value& v, Args& args) {
    const auto& t = detail::filter_table();
    auto it = t.find(name);
    if (it == t.end()) detail::fail(detail::RenderFailure::type_error, "no filter named '" + name + "'");
    return it->second(*this, v, args);
  }

  bool apply_test(const std::string& name, const Value& v, Args& args) {
    const auto& t = detail::test_table();
    auto it = t.find(name);
    if (it == t.end()) detail::fail(detail::RenderFailure::type_error, "no test named '" + name + "'");
    return it->second(*this, v, args);
  }

  Value binop(const std::string& op, const Value& a, const Value& b) {
    using detail::checked;
    if (a.is_undefined()) detail::undefined_error(a);
    if (b.is_undefined()) detail::undefined_error(b);
    if (a.is_number() && b.is_number()) {
      bool fl = a.is_float() || b.is_float();
      double x = a.as_float(), y = b.as_float();
      std::int64_t i = a.as_int(), j = b.as_int();
      if (op == "+") return fl ? Value(x + y) : Value(detail::int_arith('+', i, j));
      if (op == "-") return fl ? Value(x - y) : Value(detail::int_arith('-', i, j));
      if (op == "*") return fl ? Value(x * y) : Value(detail::int_arith('*', i, j));
      if (op == "/") {
        if (y == 0) detail::fail(detail::RenderFailure::value_error, "division by zero");
        return Value(x / y);
      }
      if (op == "//") return fl ? Value(detail::py_float_divmod(x, y).first) : Value(detail::py_floordiv(i, j));
      if (op == "%") return fl ? Value(detail::py_float_divmod(x, y).second) : Value(detail::py_mod(i, j));
      if (op == "**") {
        if (!fl && j >= 0) {
          std::int64_t acc = 1, base = i;
          for (std::int64_t e = j; e > 0; e >>= 1) {
            if (e & 1) acc = detail::int_arith('*', acc, base);
            if (e > 1) base = detail::int_arith('*', base, base);
          }
          return Value(acc);
        }
        if (x == 0 && y < 0) detail::fail(detail::RenderFailure::value_error, "0.0 cannot be raised to a negative power");
        if (x < 0 && std::floor(y) != y) detail::fail(detail::RenderFailure::value_error, "complex results are not supported");
        return Value(std::pow(x, y));
      }
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (a.is_markup() || b.is_markup()) return Value(detail::as_markup_text(a) + detail::as_markup_text(b), true);
        return Value(a.str() + b.str());
      }
      if (a.is_list() && b.is_list() && a.list().kind == b.list().kind &&
          (a.list().kind == SeqKind::List || a.list().kind == SeqKind::Tuple)) {
        std::vector<Value> items = a.list().items;
        items.insert(items.end(), b.list().items.begin(), b.list().items.end());
        return Value(std::move(items), a.list().kind);
      }
    }
    if (op == "*") {
      const Value* seq = a.is_integral() ? &b : &a;
      const Value* cnt = a.is_integral() ? &a : &b;
      if (cnt->is_integral() && (seq->is_string() || (seq->is_list() && (seq->list().kind == SeqKind::List || seq->list().kind == SeqKind::Tuple)))) {
        std::int64_t n = std::max<std::int64_t>(0, cnt->as_int());
        std::size_t unit = seq->is_string() ? seq->str().size() : seq->list().items.size();
        if (unit && static_cast<double>(n) * static_cast<double>(unit) > 64.0 * 1024 * 1024)
          detail::fail(detail::RenderFailure::limit, "sequence repetition result too large");
        if (seq->is_string()) {
          std::string s;
          for (std::int64_t k = 0; k < n; ++k) s += seq->str();
          return Value(std::move(s), seq->is_markup());
        }
        std::vector<Value> items;
        for (std::int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list().items.begin(), seq->list().items.end());
        return Value(std::move(items), seq->list().kind);
      }
    }
    if (op == "%" && a.is_string()) return Value(detail::percent_format(a.str(), b), a.is_markup());
    detail::type_error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  }

  bool contains(const Value& container, const Value& item) {
    switch (container.kind()) {
      case Kind::String:
        if (!item.is_string()) detail::type_error("'in <string>' requires string as left operand, not " + type_name(item));
        return container.str().find(item.str()) != std::string::npos;
      case Kind::List:
        for (const auto& x : container.list().items)
          if (equals(x, item)) return true;
        return false;
      case Kind::Dict: return container.dict().find(item) != nullptr;
      case Kind::Undefined: return false;
      case Kind::Iterator: {
        auto& it = container.iter();
        while (it.pos < it.items.size())
          if (equals(it.items[it.pos++], item)) return true;
        return false;
      }
      default: detail::type_error("argument of type '" + type_name(container) + "' is not iterable");
    }
  }

  std::optional<Value> method(const Value& obj, const std::string& name);

 private:
  enum class Flow { normal, brk, cont };

  const detail::Program& prog_;
  ScopePtr root_;
  int line_ = 1;
  int macro_depth_ = 0;
  detail::Step steps_ = 0;
  const Value* block_input_ = nullptr;  // the rendered body a block filter applies to
  std::vector<ScopePtr> macro_scopes_;  // scopes that define macros, kept for the whole render

  static constexpr int max_macro_depth = 100;
  static constexpr detail::Step max_steps = 10'000'000;

  void step() {
    if (++steps_ > max_steps) detail::fail(detail::RenderFailure::limit, "template exceeded 10000000 execution steps");
  }

  /// A macro refers to its defining scope without owning it: the scope owns the macro, and
  /// the Renderer keeps every defining scope alive until the render ends (no cycle to leak).
  struct Macro : Object {
    Renderer* r;
    const detail::Node* def;
    detail::Scope* closure;
    Macro(Renderer* rr, const detail::Node* d, detail::Scope* c) : r(rr), def(d), closure(c) {}
    std::string type_name() const override { return "Macro"; }
    std::string repr(int) const override { return "<Macro '" + def->text + "'>"; }
    bool callable() const override { return true; }
    Value call(Args& a) override { return r->call_macro(*def, closure, a); }
  };

  Value call_macro(const detail::Node& def, detail::Scope* closure, Args& args) {
    struct Depth {
      int& d;
      explicit Depth(int& dd) : d(dd) {
        if (++d > max_macro_depth) detail::fail(detail::RenderFailure::limit, "maximum macro recursion depth (100) exceeded");
      }
      ~Depth() { --d; }
    } guard(macro_depth_);
    auto scope = std::make_shared<detail::Scope>(closure->shared_from_this());
    const auto& params = def.params;
    if (args.pos.size() > params.size() && !def.uses_varargs)
      detail::type_error("macro '" + def.text + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
    std::vector<bool> used_kw(args.kw.size(), false);
    for (std::size_t k = 0; k < params.size(); ++k) {
      const auto& [pname, pdef] = params[k];
      std::optional<Value> v;
      if (k < args.pos.size()) v = args.pos[k];
      for (std::size_t w = 0; w < args.kw.size(); ++w)
        if (args.kw[w].first == pname) {
          if (v) detail::type_error("macro '" + def.text + "' got multiple values for argument '" + pname + "'");
          v = args.kw[w].second;
          used_kw[w] = true;
        }
      if (!v) v = pdef ? eval(*pdef, scope) : Value::undefined("parameter '" + pname + "' was not provided");
      scope->set(pname, *v);
    }
    auto kwargs = std::make_shared<DictData>();
    for (std::size_t w = 0; w < args.kw.size(); ++w)
      if (!used_kw[w]) {
        if (!def.uses_kwargs) detail::type_error("macro '" + def.text + "' takes no keyword argument '" + args.kw[w].first + "'");
        kwargs->set(Value(args.kw[w].first), args.kw[w].second);
      }
    if (def.uses_varargs) {
      std::vector<Value> extra;
      for (std::size_t k = params.size(); k < args.pos.size(); ++k) extra.push_back(args.pos[k]);
      scope->set("varargs", Value(std::move(extra), SeqKind::Tuple));
    }
    if (def.uses_kwargs) scope->set("kwargs", Value(kwargs));
    std::string out;
    int saved = line_;
    exec(def.body, scope, out);
    line_ = saved;
    return Value(std::move(out));
  }

  // ---- statements ---------------------------------------------------------------------------

  Flow exec(const detail::Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& n : body) {
      Flow f = exec_node(*n, scope, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  void assign(const detail::Target& t, const Value& v, const ScopePtr& scope) {
    if (!t.attr.empty()) {
      const Value* ns = scope->lookup(t.name);
      auto* obj = ns && ns->is_object() ? dynamic_cast<Namespace*>(&ns->object()) : nullptr;
      if (!obj) detail::fail(detail::RenderFailure::type_error, "cannot assign attribute on non-namespace object");
      obj->attrs.set(Value(t.attr), v);
      return;
    }
    if (!t.is_tuple) {
      scope->set(t.name, v);
      return;
    }
    std::vector<Value> items = iterate(v);
    if (items.size() != t.items.size()) {
      if (items.size() > t.items.size())
        detail::fail(detail::RenderFailure::value_error, "too many values to unpack (expected " + std::to_string(t.items.size()) + ")");
      detail::fail(detail::RenderFailure::value_error, "not enough values to unpack (expected " + std::to_string(t.items.size()) +
                                                           ", got " + std::to_string(items.size()) + ")");
    }
    for (std::size_t k = 0; k < items.size(); ++k) assign(t.items[k], items[k], scope);
  }

  Value filtered_block(const detail::Expr& filter, Value input, const ScopePtr& scope) {
    const Value* saved = block_input_;
    block_input_ = &input;
    Value r = eval(filter, scope);
    block_input_ = saved;
    return r;
  }

  Flow exec_node(const detail::Node& n, const ScopePtr& scope, std::string& out) {
    using K = detail::Node::K;
    line_ = n.line;
    step();
    switch (n.k) {
      case K::Text: out += n.text; break;
      case K::Print: out += to_str(eval(*n.expr, scope)); break;
      case K::If: {
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond, scope))) return exec(body, scope, out);
        return exec(n.else_body, scope, out);
      }
      case K::For: return exec_for(n, scope, out);
      case K::Set: assign(n.target, eval(*n.expr, scope), scope); break;
      case K::SetBlock: {
        std::string body;
        exec(n.body, scope, body);
        Value v(std::move(body));
        if (n.filter) v = filtered_block(*n.filter, v, scope);
        assign(n.target, v, scope);
        break;
      }
      case K::Macro:
        macro_scopes_.push_back(scope);
        scope->set(n.text, Value(std::static_pointer_cast<Object>(std::make_shared<Macro>(this, &n, scope.get()))));
        break;
      case K::FilterBlock: {
        std::string body;
        exec(n.body, scope, body);
        out += to_str(filtered_block(*n.filter, Value(std::move(body)), scope));
        break;
      }
      case K::With: {
        auto inner = std::make_shared<detail::Scope>(scope);
        std::vector<Value> vals;
        for (const auto& p : n.params) vals.push_back(eval(*p.second, scope));
        for (std::size_t k = 0; k < vals.size(); ++k) inner->set(n.params[k].first, vals[k]);
        return exec(n.body, inner, out);
      }
      case K::Generation: return exec(n.body, scope, out);
      case K::Break: return Flow::brk;
      case K::Continue: return Flow::cont;
    }
    if (out.size() > (std::size_t{1} << 28)) detail::fail(detail::RenderFailure::limit, "rendered output exceeds 256 MiB");
    return Flow::normal;
  }

  Flow exec_for(const detail::Node& n, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.expr, scope));
    if (n.cond) {
      std::vector<Value> kept;
      for (auto& item : items) {
        step();
        auto probe = std::make_shared<detail::Scope>(scope);
        assign(n.target, item, probe);
        if (truthy(eval(*n.cond, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, scope, out);
    auto loop = std::make_shared<detail::LoopContext>();
    loop->st->items = items;
    Value loop_value(std::static_pointer_cast<Object>(loop));
    for (std::size_t k = 0; k < items.size(); ++k) {
      step();
      loop->st->index0 = k;
      auto iter_scope = std::make_shared<detail::Scope>(scope);
      iter_scope->set("loop", loop_value);
      assign(n.target, items[k], iter_scope);
      Flow f = exec(n.body, iter_scope, out);
      if (f == Flow::brk) break;
    }
    return Flow::normal;
  }

  // ---- expressions --------------------------------------------------------------------------

  Args eval_args(const detail::Expr& e, const ScopePtr& scope) {
    Args a;
    a.line = e.line;
    for (const auto& x : e.args) a.pos.push_back(eval(*x, scope));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, scope));
    return a;
  }

 public:
  Value eval(const detail::Expr& e, const ScopePtr& scope) {
    using K = detail::Expr::K;
    line_ = e.line;
    step();
    switch (e.k) {
      case K::Const: return e.value;
      case K::Name: {
        if (const Value* v = scope->lookup(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case K::List:
      case K::Tuple: {
        std::vector<Value> items;
        for (const auto& x : e.args) items.push_back(eval(*x, scope));
        return Value(std::move(items), e.k == K::Tuple ? SeqKind::Tuple : SeqKind::List);
      }
      case K::Dict: {
        auto d = std::make_shared<DictData>();
        for (std::size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], scope);
          if (key.is_list() && key.list().kind == SeqKind::List) detail::type_error("unhashable type: 'list'");
          if (key.is_dict()) detail::type_error("unhashable type: 'dict'");
          d->set(std::move(key), eval(*e.args[k + 1], scope));
        }
        return Value(std::move(d));
      }
      case K::Getattr: return getattr(eval(*e.a, scope), e.name);
      case K::Getitem: {
        Value obj = eval(*e.a, scope);
        return getitem(obj, eval(*e.b, scope));
      }
      case K::Slice: {
        Value obj = eval(*e.a, scope);
        Value parts[3];
        for (int k = 0; k < 3; ++k) parts[k] = e.args[static_cast<std::size_t>(k)] ? eval(*e.args[static_cast<std::size_t>(k)], scope) : Value(nullptr);
        if (obj.is_undefined()) detail::undefined_error(obj);
        if (obj.is_string()) {
          auto cps = detail::u32(obj);
          std::u32string r;
          for (auto i : detail::slice_indices(cps.size(), parts[0], parts[1], parts[2])) r += cps[i];
          return detail::str_value(r, obj.is_markup());
        }
        if (obj.is_list() && (obj.list().kind == SeqKind::List || obj.list().kind == SeqKind::Tuple)) {
          const auto& items = obj.list().items;
          std::vector<Value> r;
          for (auto i : detail::slice_indices(items.size(), parts[0], parts[1], parts[2])) r.push_back(items[i]);
          return Value(std::move(r), obj.list().kind);
        }
        return Value::undefined(detail::object_desc(obj) + " has no element slice");
      }
      case K::Call: {
        Value fn = eval(*e.a, scope);
        Args a = eval_args(e, scope);
        return call(fn, a);
      }
      case K::Filter: {
        Value v = e.a ? eval(*e.a, scope) : (block_input_ ? *block_input_ : Value());
        Args a = eval_args(e, scope);
        line_ = e.line;
        return apply_filter(e.name, v, a);
      }
      case K::Test: {
        Value v = eval(*e.a, scope);
        Args a = eval_args(e, scope);
        line_ = e.line;
        return Value(apply_test(e.name, v, a));
      }
      case K::Neg:
      case K::Pos: {
        Value v = eval(*e.a, scope);
        if (v.is_undefined()) detail::undefined_error(v);
        if (v.is_float()) return Value(e.k == K::Neg ? -v.as_float() : v.as_float());
        if (v.is_integral()) {
          if (e.k == K::Pos) return Value(v.as_int());
          return Value(detail::int_arith('-', 0, v.as_int()));
        }
        detail::type_error(std::string("bad operand type for unary ") + (e.k == K::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
      }
      case K::Not: return Value(!truthy(eval(*e.a, scope)));
      case K::Binary: {
        Value a = eval(*e.a, scope);
        Value b = eval(*e.b, scope);
        line_ = e.line;
        return binop(e.name, a, b);
      }
      case K::Concat: {
        std::string s;
        for (const auto& x : e.args) s += to_str(eval(*x, scope));
        return Value(std::move(s));
      }
      case K::Compare: {
        Value left = eval(*e.args[0], scope);
        for (std::size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.args[k + 1], scope);
          const std::string& op = e.ops[k];
          bool r;
          if (op == "==") r = equals(left, right);
          else if (op == "!=") r = !equals(left, right);
          else if (op == "in") r = contains(right, left);
          else if (op == "notin") r = !contains(right, left);
          else {
            int c = compare(left, right, op);
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case K::And: {
        Value a = eval(*e.a, scope);
        return truthy(a) ? eval(*e.b, scope) : a;
      }
      case K::Or: {
        Value a = eval(*e.a, scope);
        return truthy(a) ? a : eval(*e.b, scope);
      }
      case K::Cond: {
        if (truthy(eval(*e.b, scope))) return eval(*e.a, scope);
        if (e.c) return eval(*e.c, scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      }
    }
    return Value();
  }
};

}  // namespace edl::chat::jinja

#include <edl/chat/jinja/builtins.hpp>
