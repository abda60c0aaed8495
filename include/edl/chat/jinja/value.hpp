// edl/chat/jinja/value.hpp
// The values a chat template computes with, with Python's semantics.
//
// Chat templates are Python jinja2 programs, so every value here behaves as the Python object
// jinja2 would hold: `str(1.0)` is "1.0", `[1, 'a']` prints as "[1, 'a']", empty containers
// are false, `1 == 1.0 == True`, and a missing variable is jinja2's default `Undefined`
// (prints as "", is false and iterates as empty, but raises on arithmetic, attributes and
// calls). Strings are UTF-8 but measured, indexed and sliced in code points as Python does.
// Containers are shared and never mutated once built, which is all the immutable sandbox of
// transformers allows; the only mutable objects are namespaces and one-shot generators.
#pragma once

#include <edl/core/error.hpp>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edl::chat::jinja {

class Value;
struct Object;

namespace detail {

/// What went wrong while rendering, before the renderer adds the template line. `kind` is the
/// Python exception jinja2 would raise, so messages read like the Python ones.
struct RenderFailure {
  enum Kind { type_error, undefined_error, security_error, value_error, raised, limit } kind;
  std::string message;
};

[[noreturn]] inline void fail(RenderFailure::Kind kind, std::string message) {
  throw RenderFailure{kind, std::move(message)};
}
[[noreturn]] inline void type_error(std::string message) {
  fail(RenderFailure::type_error, std::move(message));
}

// ---------------------------------------------------------------------------------------------
// UTF-8 <-> code points. Invalid bytes decode to U+DC80..U+DCFF (Python's surrogateescape) and
// encode back to the same byte, so a template never loses or invents bytes.

inline std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
               cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)))
      ok = false;
    if (!ok) {
      out.push_back(0xDC00 + c);
      ++i;
    } else {
      out.push_back(cp);
      i += static_cast<std::size_t>(len);
    }
  }
  return out;
}

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));
  } else if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

inline std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

/// Number of code points, Python's len(str).
inline std::size_t utf8_length(std::string_view s) {
  for (char ch : s)
    if (static_cast<unsigned char>(ch) >= 0x80) return decode_utf8(s).size();
  return s.size();
}

/// Python's str.isspace for one code point.
inline bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// Case mapping is ICU's (Unicode's simple mappings, code point by code point), as Python's
// str methods use the Unicode database.
inline char32_t to_upper(char32_t c) { return static_cast<char32_t>(u_toupper(static_cast<UChar32>(c))); }
inline char32_t to_lower(char32_t c) { return static_cast<char32_t>(u_tolower(static_cast<UChar32>(c))); }

inline bool is_upper(char32_t c) { return to_lower(c) != c; }
inline bool is_lower(char32_t c) { return to_upper(c) != c; }
inline bool is_alpha(char32_t c) { return u_isalpha(static_cast<UChar32>(c)) != 0; }  // Python: categories L*
inline bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
/// Python's \w in a str pattern (letters, digits, '_'), for `wordcount`.
inline bool is_word(char32_t c) { return c == '_' || u_isalnum(static_cast<UChar32>(c)) != 0; }

/// Python's str.isprintable for one code point (used by repr): control, format and separator
/// characters other than the space are escaped.
inline bool is_printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c >= 0x80 && c <= 0xA0) return false;
  if (c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0x3000 ||
      c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF) ||
      (c >= 0xFFF9 && c <= 0xFFFB) || c == 0x61C || c == 0x180E)
    return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Numbers printed as Python prints them.

/// repr(float): the shortest digits that round-trip, in fixed notation for 1e-4 <= |x| < 1e16
/// and scientific otherwise, always with a '.0' or an exponent so it reads as a float.
inline std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  auto epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  int exp = std::stoi(sci.substr(epos + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = neg ? "-" : "";
  if (exp >= -5 + 1 && exp < 16) {  // Python uses fixed notation for -4 <= exp < 16
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<std::size_t>(-exp - 1), '0');
      out += digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits;
      out.append(static_cast<std::size_t>(exp + 1 - static_cast<int>(digits.size())), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp + 1));
      out += '.';
      out += digits.substr(static_cast<std::size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + eb;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------

enum class Kind : std::uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Iterator, Object };

/// Which Python sequence a List value stands for: they differ in repr and equality only.
enum class SeqKind : std::uint8_t { List, Tuple, DictKeys, DictValues, DictItems };

struct ListData;
struct DictData;
struct IterData;

/// One value of a template. Copies are cheap: payloads are shared, and shared payloads are
/// never changed (except a Namespace's attributes and a generator's position, as in Python).
class Value {
 public:
  Value() = default;  // Undefined with no hint
  Value(std::nullptr_t) : kind_(Kind::None) {}
  Value(bool b) : kind_(Kind::Bool) { num_.b = b; }
  Value(int v) : Value(static_cast<std::int64_t>(v)) {}
  Value(std::int64_t v) : kind_(Kind::Int) { num_.i = v; }
  Value(double v) : kind_(Kind::Float) { num_.f = v; }
  Value(std::string s, bool markup = false)
      : kind_(Kind::String), markup_(markup), ptr_(std::make_shared<std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(std::vector<Value> items, SeqKind kind = SeqKind::List);
  Value(std::shared_ptr<DictData> d) : kind_(Kind::Dict), ptr_(std::move(d)) {}
  Value(std::shared_ptr<IterData> it) : kind_(Kind::Iterator), ptr_(std::move(it)) {}
  Value(std::shared_ptr<Object> o) : kind_(Kind::Object), ptr_(std::move(o)) {}

  /// jinja2's Undefined. `hint` is the error message used when the value is misused; an
  /// `unsafe` one stands for an attribute the sandbox refused (calling it is a SecurityError).
  static Value undefined(std::string hint, bool unsafe = false) {
    Value v;
    v.ptr_ = std::make_shared<std::string>(std::move(hint));
    v.markup_ = unsafe;
    return v;
  }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  /// Python's numbers include bool.
  bool is_number() const { return kind_ == Kind::Bool || kind_ == Kind::Int || kind_ == Kind::Float; }
  /// int or bool, Python's `isinstance(x, int)`.
  bool is_integral() const { return kind_ == Kind::Bool || kind_ == Kind::Int; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_iterator() const { return kind_ == Kind::Iterator; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_markup() const { return kind_ == Kind::String && markup_; }
  bool is_unsafe() const { return kind_ == Kind::Undefined && markup_; }

  bool as_bool() const { return num_.b; }
  std::int64_t as_int() const { return kind_ == Kind::Bool ? (num_.b ? 1 : 0) : num_.i; }
  double as_float() const { return kind_ == Kind::Float ? num_.f : static_cast<double>(as_int()); }
  const std::string& str() const { return *static_cast<const std::string*>(ptr_.get()); }
  const std::string& undefined_hint() const {
    static const std::string none;
    return ptr_ ? *static_cast<const std::string*>(ptr_.get()) : none;
  }
  const ListData& list() const { return *static_cast<const ListData*>(ptr_.get()); }
  const DictData& dict() const { return *static_cast<const DictData*>(ptr_.get()); }
  IterData& iter() const { return *static_cast<IterData*>(ptr_.get()); }
  Object& object() const { return *static_cast<Object*>(ptr_.get()); }
  const void* identity() const { return ptr_.get(); }

 private:
  Kind kind_ = Kind::Undefined;
  bool markup_ = false;  // String: a markupsafe.Markup; Undefined: refused by the sandbox
  union {
    bool b;
    std::int64_t i;
    double f;
  } num_{};
  std::shared_ptr<void> ptr_;  // payload by kind; shared payloads are treated as immutable
};

struct ListData {
  std::vector<Value> items;
  SeqKind kind = SeqKind::List;
};

/// A Python dict: insertion-ordered; keys compare with Python's == (so 1, 1.0 and True are
/// one key). Lookup is linear, which is fastest for the few keys a message or tool has.
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  void set(Value key, Value value);
};

/// A one-shot Python generator (what select, map, items ... return): truthy even when empty,
/// without len(), and exhausted once iterated.
struct IterData {
  std::vector<Value> items;
  std::size_t pos = 0;
  std::string type_name = "generator";
};

inline Value::Value(std::vector<Value> items, SeqKind kind)
    : kind_(Kind::List), ptr_(std::make_shared<ListData>(ListData{std::move(items), kind})) {}

inline Value make_dict(std::vector<std::pair<Value, Value>> items = {}) {
  auto d = std::make_shared<DictData>();
  for (auto& [k, v] : items) d->set(std::move(k), std::move(v));
  return Value(std::move(d));
}

inline Value make_generator(std::vector<Value> items, std::string type_name = "generator") {
  auto it = std::make_shared<IterData>();
  it->items = std::move(items);
  it->type_name = std::move(type_name);
  return Value(std::move(it));
}

/// Positional and keyword arguments of one call, with the template line for messages.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;

  /// Argument `i` or keyword `name`, else `def`; a name given both ways is a TypeError.
  Value get(std::size_t i, std::string_view name, Value def = Value()) {
    for (auto& [k, v] : kw)
      if (k == name) {
        if (i < pos.size())
          detail::type_error("got multiple values for argument '" + std::string(name) + "'");
        used_kw.push_back(k);
        return v;
      }
    if (i < pos.size()) return pos[i];
    return def;
  }
  bool has(std::size_t i, std::string_view name) const {
    if (i < pos.size()) return true;
    for (auto& [k, v] : kw)
      if (k == name) return true;
    return false;
  }
  /// Refuses extra positional or unknown keyword arguments, as Python would.
  void check(std::string_view fn, std::size_t max_pos) const {
    if (pos.size() > max_pos)
      detail::type_error(std::string(fn) + "() takes at most " + std::to_string(max_pos) +
                         " positional argument(s) (" + std::to_string(pos.size()) + " given)");
    for (auto& [k, v] : kw)
      if (std::find(used_kw.begin(), used_kw.end(), k) == used_kw.end())
        detail::type_error(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
  }
  std::vector<std::string> used_kw;
};

/// Objects with attributes or a call: namespaces, loop contexts, functions, methods, macros.
struct Object {
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  virtual std::string repr(int /*depth*/) const { return "<" + type_name() + " object>"; }
  /// The attribute, or nullopt when there is none (the caller makes the Undefined).
  virtual std::optional<Value> attr(std::string_view) const { return std::nullopt; }
  virtual bool callable() const { return false; }
  virtual Value call(Args&) { detail::type_error("'" + type_name() + "' object is not callable"); }
};

namespace detail {

/// Python's repr of a str (single quotes unless the text has ' and no ").
inline std::string py_str_repr(std::string_view s) {
  bool has_sq = s.find('\'') != std::string_view::npos;
  bool has_dq = s.find('"') != std::string_view::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : decode_utf8(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!is_printable(c) || (c >= 0xDC80 && c <= 0xDCFF)) {
      char buf[16];
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out += q;
  return out;
}

inline constexpr int max_nesting = 512;  // deeper values are refused rather than recursed into

}  // namespace detail

/// Python's type name of a value, for messages ("'int' object is not iterable").
inline std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return v.is_markup() ? "Markup" : "str";
    case Kind::List:
      switch (v.list().kind) {
        case SeqKind::List: return "list";
        case SeqKind::Tuple: return "tuple";
        case SeqKind::DictKeys: return "dict_keys";
        case SeqKind::DictValues: return "dict_values";
        case SeqKind::DictItems: return "dict_items";
      }
      return "list";
    case Kind::Dict: return "dict";
    case Kind::Iterator: return v.iter().type_name;
    case Kind::Object: return v.object().type_name();
  }
  return "object";
}

inline std::string repr(const Value& v, int depth = 0);

/// str(v): what `{{ v }}` prints.
inline std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.as_bool() ? "True" : "False";
    case Kind::Int: return std::to_string(v.as_int());
    case Kind::Float: return detail::float_repr(v.as_float());
    case Kind::String: return v.str();
    default: return repr(v);
  }
}

/// repr(v): how a value prints inside a container.
inline std::string repr(const Value& v, int depth) {
  if (depth > detail::max_nesting) detail::fail(detail::RenderFailure::limit, "value nested too deeply to print");
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::String:
      return v.is_markup() ? "Markup(" + detail::py_str_repr(v.str()) + ")" : detail::py_str_repr(v.str());
    case Kind::List: {
      const auto& l = v.list();
      std::string open = "[", close = "]";
      switch (l.kind) {
        case SeqKind::List: break;
        case SeqKind::Tuple: open = "(", close = l.items.size() == 1 ? ",)" : ")"; break;
        case SeqKind::DictKeys: open = "dict_keys([", close = "])"; break;
        case SeqKind::DictValues: open = "dict_values([", close = "])"; break;
        case SeqKind::DictItems: open = "dict_items([", close = "])"; break;
      }
      std::string out = open;
      for (std::size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += repr(l.items[i], depth + 1);
      }
      return out + close;
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += repr(k, depth + 1) + ": " + repr(val, depth + 1);
      }
      return out + "}";
    }
    case Kind::Iterator: return "<" + v.iter().type_name + " object>";
    case Kind::Object: return v.object().repr(depth + 1);
    default: return to_str(v);
  }
}

/// Python truthiness.
inline bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.as_bool();
    case Kind::Int: return v.as_int() != 0;
    case Kind::Float: return v.as_float() != 0.0;
    case Kind::String: return !v.str().empty();
    case Kind::List: return !v.list().items.empty();
    case Kind::Dict: return !v.dict().items.empty();
    default: return true;  // generators, namespaces, functions
  }
}

/// Python's ==: numbers by value across bool/int/float, sequences of the same type element-wise,
/// dicts regardless of order. Undefined equals only Undefined.
inline bool equals(const Value& a, const Value& b, int depth = 0) {
  if (depth > detail::max_nesting) detail::fail(detail::RenderFailure::limit, "value nested too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.str() == b.str();
    case Kind::List: {
      const auto &x = a.list(), &y = b.list();
      bool seq_a = x.kind == SeqKind::List || x.kind == SeqKind::Tuple;
      if (x.kind != y.kind && !(x.kind == SeqKind::DictItems && y.kind == SeqKind::DictItems)) return false;
      if (!seq_a && x.kind == SeqKind::DictValues) return a.identity() == b.identity();
      if (x.items.size() != y.items.size()) return false;
      for (std::size_t i = 0; i < x.items.size(); ++i)
        if (!equals(x.items[i], y.items[i], depth + 1)) return false;
      return true;
    }
    case Kind::Dict: {
      const auto &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* o = y.find(k);
        if (!o || !equals(v, *o, depth + 1)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

inline const Value* DictData::find(const Value& key) const {
  for (const auto& kv : items)
    if (equals(kv.first, key)) return &kv.second;
  return nullptr;
}

inline void DictData::set(Value key, Value value) {
  for (auto& kv : items)
    if (equals(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

/// Python's ordering (<): numbers, strings (by code point, which UTF-8 byte order preserves)
/// and lists/tuples element by element. Anything else is a TypeError, as in Python.
inline int compare(const Value& a, const Value& b, std::string_view op = "<") {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.list().kind == b.list().kind &&
      (a.list().kind == SeqKind::List || a.list().kind == SeqKind::Tuple)) {
    const auto &x = a.list().items, &y = b.list().items;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined()) detail::fail(detail::RenderFailure::undefined_error, a.undefined_hint());
  if (b.is_undefined()) detail::fail(detail::RenderFailure::undefined_error, b.undefined_hint());
  detail::type_error("'" + std::string(op) + "' not supported between instances of '" + type_name(a) +
                     "' and '" + type_name(b) + "'");
}

// ---------------------------------------------------------------------------------------------
// JSON in and out.

/// Message, tool and context JSON as template values (objects keep their key order).
inline Value from_json(const nlohmann::ordered_json& j, int depth = 0) {
  if (depth > detail::max_nesting)
    throw Error(errc::invalid_argument, "chat.jinja", "input JSON nested deeper than 512 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(nullptr);
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return Value(static_cast<std::int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<DictData>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d->items.emplace_back(Value(it.key()), from_json(it.value(), depth + 1));
      return Value(std::move(d));
    }
    default:
      throw Error(errc::invalid_argument, "chat.jinja", "binary or discarded JSON values cannot be template data");
  }
}

namespace detail {

/// json.dumps's string escaping with ensure_ascii=False.
inline void json_escape(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

struct JsonStyle {
  bool pretty = false;      // indent given (even 0 or "")
  std::string indent;       // one level
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

inline std::string json_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return float_repr(x);
}

inline std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Kind::String: return k.str();
    case Kind::Bool: return k.as_bool() ? "true" : "false";
    case Kind::None: return "null";
    case Kind::Int: return std::to_string(k.as_int());
    case Kind::Float: return json_float(k.as_float());
    default: type_error("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

inline void dump_json(std::string& out, const Value& v, const JsonStyle& st, int level) {
  if (level > max_nesting) fail(RenderFailure::limit, "value nested too deeply for tojson");
  auto newline = [&](int l) {
    out += '\n';
    for (int i = 0; i < l; ++i) out += st.indent;
  };
  switch (v.kind()) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.as_int()); return;
    case Kind::Float: out += json_float(v.as_float()); return;
    case Kind::String: json_escape(out, v.str()); return;
    case Kind::List: {
      const auto& l = v.list();
      if (l.kind != SeqKind::List && l.kind != SeqKind::Tuple) break;
      if (l.items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += st.item_sep;
        if (st.pretty) newline(level + 1);
        dump_json(out, l.items[i], st, level + 1);
      }
      if (st.pretty) newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      const auto& d = v.dict();
      if (d.items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : d.items) entries.emplace_back(json_key(k), &val);
      if (st.sort_keys) {
        for (const auto& [k, val] : d.items)
          if (!k.is_string()) type_error("'<' not supported between dict keys of different types");
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      bool first = true;
      for (const auto& [k, val] : entries) {
        if (!first) out += st.item_sep;
        first = false;
        if (st.pretty) newline(level + 1);
        json_escape(out, k);
        out += st.key_sep;
        dump_json(out, *val, st, level + 1);
      }
      if (st.pretty) newline(level);
      out += '}';
      return;
    }
    case Kind::Undefined:
      // json.dumps(Undefined) is a TypeError in Python; jinja2 reports what was undefined.
      fail(RenderFailure::type_error, "Object of type Undefined is not JSON serializable");
    default: break;
  }
  type_error("Object of type " + type_name(v) + " is not JSON serializable");
}

}  // namespace detail

/// transformers' tojson: json.dumps(x, ensure_ascii=False, indent, separators, sort_keys).
inline std::string to_json(const Value& v, const Value& indent = Value(nullptr),
                           const Value& separators = Value(nullptr), bool sort_keys = false) {
  detail::JsonStyle st;
  if (!indent.is_none() && !indent.is_undefined()) {
    st.pretty = true;
    if (indent.is_string()) st.indent = indent.str();
    else if (indent.is_integral()) st.indent.assign(static_cast<std::size_t>(std::max<std::int64_t>(0, std::min<std::int64_t>(indent.as_int(), 256))), ' ');
    else detail::type_error("tojson indent must be an int or a str, not " + type_name(indent));
    st.item_sep = ",";
  }
  if (!separators.is_none() && !separators.is_undefined()) {
    if (!separators.is_list() || separators.list().items.size() != 2 ||
        !separators.list().items[0].is_string() || !separators.list().items[1].is_string())
      detail::type_error("tojson separators must be a pair of strings");
    st.item_sep = separators.list().items[0].str();
    st.key_sep = separators.list().items[1].str();
  }
  st.sort_keys = sort_keys;
  std::string out;
  detail::dump_json(out, v, st, 0);
  return out;
}

}  // namespace edl::chat::jinja
