// edl/chat/jinja/builtins.hpp
// jinja2's built-in filters and tests, and the Python str/dict/list methods templates call.
//
// Each one follows jinja2 3.1 (filters.py, tests.py) and CPython, including their corners:
// `|sort`, `|unique`, `|min` ignore case unless told otherwise, `|title` splits words at
// -({[< and whitespace while str.title() splits at any non-letter, `|first` of an empty list
// is Undefined, `|length` of a generator is a TypeError. `tojson` is transformers' override
// (json.dumps with ensure_ascii=False), not jinja2's HTML-safe one. Filters jinja2 has but
// chat templates do not use (groupby, truncate, wordwrap, urlize, ...) are not provided, so a
// template naming one fails at construction instead of rendering differently.
#pragma once

#include <edl/chat/jinja/evaluator.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace edl::chat::jinja {
namespace detail {

inline std::string need_str(const Value& v, std::string_view what) {
  if (!v.is_string()) type_error(std::string(what) + " must be str, not " + type_name(v));
  return v.str();
}

inline std::int64_t need_int(const Value& v, std::string_view what) {
  if (!v.is_integral()) type_error(std::string(what) + " must be an integer, not " + type_name(v));
  return v.as_int();
}

/// jinja2's make_attrgetter: "a.b.0" walks items (environment.getitem), digits become ints;
/// with a `def`ault, an Undefined step is replaced by it and the walk goes on from there.
inline Value get_path(Renderer& r, const Value& item, const Value& attribute, const Value& def = Value()) {
  auto fallback = [&](Value v) { return v.is_undefined() && !def.is_undefined() && !def.is_none() ? def : v; };
  if (attribute.is_integral()) return fallback(r.getitem(item, attribute));
  std::string path = need_str(attribute, "attribute");
  Value cur = item;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = fallback(digits ? r.getitem(cur, Value(static_cast<std::int64_t>(std::stoll(part.substr(0, 18))))) : r.getitem(cur, Value(part)));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

/// Sort and comparison key: lower-cased strings unless case_sensitive (jinja2's ignore_case).
inline Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return str_value(py_lower(u32(v)));
  return v;
}

inline std::vector<Value> sort_values(Renderer& r, std::vector<Value> items, bool reverse, bool case_sensitive,
                                      const Value& attribute) {
  std::vector<std::string> attrs;
  if (attribute.is_string()) {
    std::size_t s = 0;
    const std::string& a = attribute.str();
    while (true) {
      std::size_t c = a.find(',', s);
      attrs.push_back(a.substr(s, c == std::string::npos ? std::string::npos : c - s));
      if (c == std::string::npos) break;
      s = c + 1;
    }
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& it : items) {
    Value key;
    if (attribute.is_none() || attribute.is_undefined()) key = sort_key(it, case_sensitive);
    else if (attribute.is_integral()) key = sort_key(get_path(r, it, attribute), case_sensitive);
    else {
      std::vector<Value> parts;
      for (const auto& a : attrs) parts.push_back(sort_key(get_path(r, it, Value(a)), case_sensitive));
      key = parts.size() == 1 ? parts[0] : Value(std::move(parts), SeqKind::Tuple);
    }
    keyed.emplace_back(std::move(key), std::move(it));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

inline Value make_tuple2(Value a, Value b) { return Value(std::vector<Value>{std::move(a), std::move(b)}, SeqKind::Tuple); }

inline bool bool_arg(Args& a, std::size_t i, std::string_view name, bool def) {
  Value v = a.get(i, name, Value(def));
  return truthy(v);
}

// ---------------------------------------------------------------------------------------------
// Filters

inline Value f_abs(Renderer&, const Value& v, Args& a) {
  a.check("abs", 0);
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_integral()) {
    if (v.as_int() == std::numeric_limits<std::int64_t>::min()) checked(true, 0);
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_undefined()) undefined_error(v);
  type_error("bad operand type for abs(): '" + type_name(v) + "'");
}

inline Value f_attr(Renderer& r, const Value& v, Args& a) {
  Value name = a.get(0, "name");
  a.check("attr", 1);
  std::string n = need_str(name, "attribute name");
  if (v.is_undefined()) undefined_error(v);
  if (n.rfind("__", 0) == 0) return unsafe_attr(v, n);
  if (auto m = r.method(v, n)) return *m;
  if (v.is_object())
    if (auto x = v.object().attr(n)) return *x;
  return missing_attr(v, n);
}

inline Value f_batch(Renderer& r, const Value& v, Args& a) {
  std::int64_t n = need_int(a.get(0, "linecount"), "linecount");
  Value fill = a.get(1, "fill_with", Value(nullptr));
  a.check("batch", 2);
  if (n <= 0) fail(RenderFailure::value_error, "batch size must be positive");
  std::vector<Value> rows, cur;
  for (auto& x : r.iterate(v)) {
    if (static_cast<std::int64_t>(cur.size()) == n) rows.emplace_back(std::move(cur)), cur.clear();
    cur.push_back(x);
  }
  if (!cur.empty()) {
    if (!fill.is_none())
      while (static_cast<std::int64_t>(cur.size()) < n) cur.push_back(fill);
    rows.emplace_back(std::move(cur));
  }
  return make_generator(std::move(rows));
}

inline Value f_capitalize(Renderer&, const Value& v, Args& a) {
  a.check("capitalize", 0);
  return str_value(py_capitalize(decode_utf8(to_str(v))), v.is_markup());
}

inline Value f_center(Renderer&, const Value& v, Args& a) {
  std::int64_t width = need_int(a.get(0, "width", Value(std::int64_t{80})), "width");
  a.check("center", 1);
  auto s = decode_utf8(to_str(v));
  if (width <= static_cast<std::int64_t>(s.size())) return Value(to_str(v), v.is_markup());
  std::size_t marg = static_cast<std::size_t>(width) - s.size();
  std::size_t left = marg / 2 + (marg & static_cast<std::size_t>(width) & 1);
  return Value(std::string(left, ' ') + to_str(v) + std::string(marg - left, ' '), v.is_markup());
}

inline Value f_length(Renderer& r, const Value& v, Args& a) {
  a.check("length", 0);
  return Value(r.length(v));
}

inline Value f_default(Renderer&, const Value& v, Args& a) {
  Value def = a.get(0, "default_value", Value(""));
  bool boolean = bool_arg(a, 1, "boolean", false);
  a.check("default", 2);
  if (v.is_undefined() || (boolean && !truthy(v))) return def;
  return v;
}

inline Value f_dictsort(Renderer& r, const Value& v, Args& a) {
  bool cs = bool_arg(a, 0, "case_sensitive", false);
  Value by = a.get(1, "by", Value("key"));
  bool reverse = bool_arg(a, 2, "reverse", false);
  a.check("dictsort", 3);
  if (!v.is_dict()) type_error("dictsort needs a mapping, not " + type_name(v));
  std::string b = need_str(by, "by");
  if (b != "key" && b != "value") fail(RenderFailure::value_error, "You can only sort by either 'key' or 'value'");
  std::vector<Value> items;
  for (const auto& [k, x] : v.dict().items) items.push_back(make_tuple2(k, x));
  return Value(sort_values(r, std::move(items), reverse, cs, Value(std::int64_t{b == "key" ? 0 : 1})));
}

inline Value f_escape(Renderer&, const Value& v, Args& a) {
  a.check("escape", 0);
  if (v.is_markup()) return v;
  return Value(html_escape(to_str(v)), true);
}

inline Value f_forceescape(Renderer&, const Value& v, Args& a) {
  a.check("forceescape", 0);
  return Value(html_escape(to_str(v)), true);
}

inline Value f_first(Renderer& r, const Value& v, Args& a) {
  a.check("first", 0);
  if (v.is_iterator()) {
    auto& it = v.iter();
    if (it.pos < it.items.size()) return it.items[it.pos++];
  } else {
    auto items = r.iterate(v);
    if (!items.empty()) return items.front();
  }
  return Value::undefined("No first item, sequence was empty.");
}

inline Value f_last(Renderer& r, const Value& v, Args& a) {
  a.check("last", 0);
  if (v.is_iterator() || v.is_undefined()) type_error("'" + type_name(v) + "' object is not reversible");
  auto items = r.iterate(v);
  if (!items.empty()) return items.back();
  return Value::undefined("No last item, sequence was empty.");
}

inline Value f_float(Renderer&, const Value& v, Args& a) {
  Value def = a.get(0, "default", Value(0.0));
  a.check("float", 1);
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string())
    if (auto d = parse_py_float(v.str())) return Value(*d);
  return def;
}

inline Value f_format(Renderer&, const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty()) fail(RenderFailure::value_error, "can't handle positional and keyword arguments at the same time");
  Value arg;
  if (!a.kw.empty()) {
    auto d = std::make_shared<DictData>();
    for (auto& [k, x] : a.kw) d->set(Value(k), x);
    arg = Value(d);
  } else {
    arg = Value(a.pos, SeqKind::Tuple);
  }
  return Value(percent_format(to_str(v), arg), v.is_markup());
}

inline Value f_indent(Renderer&, const Value& v, Args& a) {
  Value width = a.get(0, "width", Value(std::int64_t{4}));
  bool first = bool_arg(a, 1, "first", false);
  bool blank = bool_arg(a, 2, "blank", false);
  a.check("indent", 3);
  std::u32string ind = width.is_string() ? u32(width) : std::u32string(static_cast<std::size_t>(std::max<std::int64_t>(0, std::min<std::int64_t>(need_int(width, "width"), 10000))), U' ');
  std::u32string s = decode_utf8(to_str(v)) + U"\n";
  auto lines = split_lines(s);
  std::u32string rv;
  if (blank) {
    for (std::size_t k = 0; k < lines.size(); ++k) rv += (k ? U"\n" + ind : U"") + lines[k];
  } else {
    rv = lines.empty() ? U"" : lines[0];
    if (lines.size() > 1) {
      rv += U"\n";
      for (std::size_t k = 1; k < lines.size(); ++k) rv += (k > 1 ? U"\n" : U"") + (lines[k].empty() ? lines[k] : ind + lines[k]);
    }
  }
  if (first) rv = ind + rv;
  return str_value(rv, v.is_markup());
}

inline Value f_int(Renderer&, const Value& v, Args& a) {
  Value def = a.get(0, "default", Value(std::int64_t{0}));
  std::int64_t base = need_int(a.get(1, "base", Value(std::int64_t{10})), "base");
  a.check("int", 2);
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) {
    double d = v.as_float();
    if (std::isnan(d)) return def;
    if (std::isinf(d) || std::fabs(d) >= 9.2e18) fail(RenderFailure::limit, "cannot convert float to a 64-bit integer");
    return Value(static_cast<std::int64_t>(d));
  }
  if (v.is_string()) {
    if (base != 0 && (base < 2 || base > 36)) fail(RenderFailure::value_error, "int() base must be >= 2 and <= 36, or 0");
    if (auto i = parse_py_int(v.str(), static_cast<int>(base))) return Value(*i);
    if (auto d = parse_py_float(v.str())) {
      if (std::isnan(*d)) return def;
      if (std::isinf(*d) || std::fabs(*d) >= 9.2e18) fail(RenderFailure::limit, "cannot convert float to a 64-bit integer");
      return Value(static_cast<std::int64_t>(*d));
    }
  }
  return def;
}

inline Value f_items(Renderer&, const Value& v, Args& a) {
  a.check("items", 0);
  if (v.is_undefined()) return make_generator({});
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& [k, x] : v.dict().items) items.push_back(make_tuple2(k, x));
  return make_generator(std::move(items));
}

inline Value f_join(Renderer& r, const Value& v, Args& a) {
  Value d = a.get(0, "d", Value(""));
  Value attribute = a.get(1, "attribute", Value(nullptr));
  a.check("join", 2);
  std::string sep = to_str(d), out;
  bool first = true;
  for (auto& x : r.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute.is_none() ? x : get_path(r, x, attribute));
  }
  return Value(std::move(out));
}

inline Value f_list(Renderer& r, const Value& v, Args& a) {
  a.check("list", 0);
  return Value(r.iterate(v));
}

inline Value f_lower(Renderer&, const Value& v, Args& a) {
  a.check("lower", 0);
  return str_value(py_lower(decode_utf8(to_str(v))), v.is_markup());
}

inline Value f_upper(Renderer&, const Value& v, Args& a) {
  a.check("upper", 0);
  return str_value(py_upper(decode_utf8(to_str(v))), v.is_markup());
}

inline Value f_map(Renderer& r, const Value& v, Args& a) {
  std::vector<Value> items = r.iterate(v), out;
  bool by_attr = false;
  Value attribute, def;
  for (auto& [k, x] : a.kw)
    if (k == "attribute") by_attr = true, attribute = x;
  if (by_attr) {
    for (auto& [k, x] : a.kw) {
      if (k == "default") def = x;
      else if (k != "attribute") type_error("Unexpected keyword argument '" + k + "'");
    }
    if (!a.pos.empty()) type_error("map() with attribute= takes no positional arguments");
    for (auto& x : items) out.push_back(get_path(r, x, attribute, def));
    return make_generator(std::move(out));
  }
  if (a.pos.empty()) type_error("map requires a filter argument");
  std::string name = need_str(a.pos[0], "filter name");
  Args rest;
  rest.line = a.line;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (auto& x : items) {
    Args copy = rest;
    out.push_back(r.apply_filter(name, x, copy));
  }
  return make_generator(std::move(out));
}

inline Value min_max(Renderer& r, const Value& v, Args& a, bool want_max, const char* name) {
  bool cs = bool_arg(a, 0, "case_sensitive", false);
  Value attribute = a.get(1, "attribute", Value(nullptr));
  a.check(name, 2);
  std::vector<Value> items = r.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  std::size_t best = 0;
  auto key = [&](const Value& x) { return sort_key(attribute.is_none() ? x : get_path(r, x, attribute), cs); };
  Value bk = key(items[0]);
  for (std::size_t k = 1; k < items.size(); ++k) {
    Value kk = key(items[k]);
    int c = compare(kk, bk);
    if (want_max ? c > 0 : c < 0) best = k, bk = kk;
  }
  return items[best];
}
inline Value f_max(Renderer& r, const Value& v, Args& a) { return min_max(r, v, a, true, "max"); }
inline Value f_min(Renderer& r, const Value& v, Args& a) { return min_max(r, v, a, false, "min"); }

inline Value f_replace(Renderer&, const Value& v, Args& a) {
  Value old_v = a.get(0, "old"), new_v = a.get(1, "new"), count = a.get(2, "count", Value(nullptr));
  a.check("replace", 3);
  std::u32string s = decode_utf8(to_str(v));
  std::u32string o = decode_utf8(to_str(old_v)), n = decode_utf8(v.is_markup() ? as_markup_text(new_v) : to_str(new_v));
  std::int64_t maxc = count.is_none() ? -1 : need_int(count, "count");
  std::u32string out;
  std::int64_t done = 0;
  if (o.empty()) {
    for (std::size_t k = 0; k <= s.size(); ++k) {
      if (maxc < 0 || done < maxc) out += n, ++done;
      if (k < s.size()) out += s[k];
    }
    return str_value(out, v.is_markup());
  }
  std::size_t pos = 0;
  while (maxc < 0 || done < maxc) {
    std::size_t p = s.find(o, pos);
    if (p == std::u32string::npos) break;
    out += s.substr(pos, p - pos) + n;
    pos = p + o.size();
    ++done;
  }
  out += s.substr(pos);
  return str_value(out, v.is_markup());
}

inline Value f_reverse(Renderer& r, const Value& v, Args& a) {
  a.check("reverse", 0);
  if (v.is_string()) {
    auto s = u32(v);
    std::reverse(s.begin(), s.end());
    return str_value(s, v.is_markup());
  }
  if (v.is_iterator()) {
    auto items = r.iterate(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (v.is_list() || v.is_dict()) {
    auto items = r.iterate(v);
    std::reverse(items.begin(), items.end());
    return make_generator(std::move(items), v.is_dict() ? "dict_reversekeyiterator" : "list_reverseiterator");
  }
  if (v.is_undefined()) return Value(std::vector<Value>{});
  type_error("argument to reversed() must be a sequence");
}

inline Value f_round(Renderer&, const Value& v, Args& a) {
  std::int64_t precision = need_int(a.get(0, "precision", Value(std::int64_t{0})), "precision");
  std::string method = need_str(a.get(1, "method", Value("common")), "method");
  a.check("round", 2);
  if (method != "common" && method != "ceil" && method != "floor")
    type_error("method must be 'common', 'ceil' or 'floor'");
  if (!v.is_number()) {
    if (v.is_undefined()) undefined_error(v);
    type_error("type " + type_name(v) + " doesn't define __round__ method");
  }
  precision = std::max<std::int64_t>(-300, std::min<std::int64_t>(precision, 300));
  if (method == "common") {
    if (v.is_integral()) {
      if (precision >= 0) return Value(v.as_int());
      double p = std::pow(10.0, static_cast<double>(-precision));
      return Value(static_cast<std::int64_t>(std::nearbyint(static_cast<double>(v.as_int()) / p) * p));
    }
    double x = v.as_float();
    if (!std::isfinite(x)) return Value(x);
    if (precision == 0) return Value(std::nearbyint(x));
    if (precision > 0) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<std::int64_t>(precision, 300)), x);
      return Value(std::strtod(buf, nullptr));
    }
    double p = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(x / p) * p);
  }
  double p = std::pow(10.0, static_cast<double>(precision));
  double y = v.as_float() * p;
  return Value((method == "ceil" ? std::ceil(y) : std::floor(y)) / p);
}

inline Value f_safe(Renderer&, const Value& v, Args& a) {
  a.check("safe", 0);
  return Value(to_str(v), true);
}

inline Value select_impl(Renderer& r, const Value& v, Args& a, bool by_attr, bool keep) {
  std::vector<Value> out;
  std::size_t off = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) type_error("Missing parameter for attribute name");
    attribute = a.pos[0];
    off = 1;
  }
  std::string test;
  bool has_test = a.pos.size() > off;
  if (has_test) test = need_str(a.pos[off], "test name");
  Args rest;
  rest.line = a.line;
  if (has_test) rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off + 1), a.pos.end());
  rest.kw = a.kw;
  for (auto& x : r.iterate(v)) {
    Value y = by_attr ? get_path(r, x, attribute) : x;
    bool ok;
    if (has_test) {
      Args copy = rest;
      ok = r.apply_test(test, y, copy);
    } else {
      ok = truthy(y);
    }
    if (ok == keep) out.push_back(x);
  }
  return make_generator(std::move(out));
}
inline Value f_select(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, false, true); }
inline Value f_reject(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, false, false); }
inline Value f_selectattr(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, true, true); }
inline Value f_rejectattr(Renderer& r, const Value& v, Args& a) { return select_impl(r, v, a, true, false); }

inline Value f_sort(Renderer& r, const Value& v, Args& a) {
  bool reverse = bool_arg(a, 0, "reverse", false);
  bool cs = bool_arg(a, 1, "case_sensitive", false);
  Value attribute = a.get(2, "attribute", Value(nullptr));
  a.check("sort", 3);
  return Value(sort_values(r, r.iterate(v), reverse, cs, attribute));
}

inline Value f_string(Renderer&, const Value& v, Args& a) {
  a.check("string", 0);
  if (v.is_string()) return v;
  return Value(to_str(v));
}

inline Value f_sum(Renderer& r, const Value& v, Args& a) {
  Value attribute = a.get(0, "attribute", Value(nullptr));
  Value acc = a.get(1, "start", Value(std::int64_t{0}));
  a.check("sum", 2);
  for (auto& x : r.iterate(v)) acc = r.binop("+", acc, attribute.is_none() ? x : get_path(r, x, attribute));
  return acc;
}

inline Value f_title(Renderer&, const Value& v, Args& a) {
  a.check("title", 0);
  return str_value(jinja_title(decode_utf8(to_str(v))), v.is_markup());
}

inline Value f_tojson(Renderer&, const Value& v, Args& a) {
  bool ensure_ascii = bool_arg(a, 0, "ensure_ascii", false);
  Value indent = a.get(1, "indent", Value(nullptr));
  Value separators = a.get(2, "separators", Value(nullptr));
  bool sort_keys = bool_arg(a, 3, "sort_keys", false);
  a.check("tojson", 4);
  std::string s = to_json(v, indent, separators, sort_keys);
  if (!ensure_ascii) return Value(std::move(s));
  std::string out;
  for (char32_t c : decode_utf8(s)) {
    if (c < 0x80) {
      out += static_cast<char>(c);
      continue;
    }
    auto put = [&](unsigned u) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    };
    if (c >= 0x10000) {
      put(0xD800 + ((c - 0x10000) >> 10));
      put(0xDC00 + ((c - 0x10000) & 0x3FF));
    } else {
      put(static_cast<unsigned>(c));
    }
  }
  return Value(std::move(out));
}

inline Value f_trim(Renderer&, const Value& v, Args& a) {
  Value chars = a.get(0, "chars", Value(nullptr));
  a.check("trim", 1);
  return str_value(strip_cps(decode_utf8(to_str(v)), chars, true, true), v.is_markup());
}

inline Value f_unique(Renderer& r, const Value& v, Args& a) {
  bool cs = bool_arg(a, 0, "case_sensitive", false);
  Value attribute = a.get(1, "attribute", Value(nullptr));
  a.check("unique", 2);
  std::vector<Value> out, seen;
  for (auto& x : r.iterate(v)) {
    Value k = sort_key(attribute.is_none() ? x : get_path(r, x, attribute), cs);
    if (k.is_list() && k.list().kind == SeqKind::List) type_error("unhashable type: 'list'");
    if (k.is_dict()) type_error("unhashable type: 'dict'");
    bool dup = false;
    for (const auto& s : seen)
      if (equals(s, k)) dup = true;
    if (!dup) seen.push_back(k), out.push_back(x);
  }
  return make_generator(std::move(out));
}

inline Value f_wordcount(Renderer&, const Value& v, Args& a) {
  a.check("wordcount", 0);
  std::int64_t n = 0;
  bool in = false;
  for (char32_t c : decode_utf8(to_str(v))) {
    bool w = is_word(c);
    if (w && !in) ++n;
    in = w;
  }
  return Value(n);
}

// ---------------------------------------------------------------------------------------------
// Tests

inline bool t_defined(Renderer&, const Value& v, Args&) { return !v.is_undefined(); }
inline bool t_undefined(Renderer&, const Value& v, Args&) { return v.is_undefined(); }
inline bool t_none(Renderer&, const Value& v, Args&) { return v.is_none(); }
inline bool t_boolean(Renderer&, const Value& v, Args&) { return v.is_bool(); }
inline bool t_false(Renderer&, const Value& v, Args&) { return v.is_bool() && !v.as_bool(); }
inline bool t_true(Renderer&, const Value& v, Args&) { return v.is_bool() && v.as_bool(); }
inline bool t_integer(Renderer&, const Value& v, Args&) { return v.is_int(); }
inline bool t_float(Renderer&, const Value& v, Args&) { return v.is_float(); }
inline bool t_number(Renderer&, const Value& v, Args&) { return v.is_number(); }
inline bool t_string(Renderer&, const Value& v, Args&) { return v.is_string(); }
inline bool t_mapping(Renderer&, const Value& v, Args&) { return v.is_dict(); }
inline bool t_iterable(Renderer&, const Value& v, Args&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_iterator() || v.is_undefined() ||
         (v.is_object() && dynamic_cast<LoopContext*>(&v.object()));
}
inline bool t_sequence(Renderer&, const Value& v, Args&) {
  return v.is_string() || v.is_dict() || v.is_undefined() ||
         (v.is_list() && (v.list().kind == SeqKind::List || v.list().kind == SeqKind::Tuple));
}
inline bool t_callable(Renderer&, const Value& v, Args&) {
  return v.is_undefined() || (v.is_object() && v.object().callable());
}
inline bool t_escaped(Renderer&, const Value& v, Args&) { return v.is_markup(); }
inline bool t_lower(Renderer&, const Value& v, Args&) {
  auto s = decode_utf8(to_str(v));
  bool cased = false;
  for (char32_t c : s) {
    if (is_upper(c)) return false;
    if (is_lower(c)) cased = true;
  }
  return cased;
}
inline bool t_upper(Renderer&, const Value& v, Args&) {
  auto s = decode_utf8(to_str(v));
  bool cased = false;
  for (char32_t c : s) {
    if (is_lower(c)) return false;
    if (is_upper(c)) cased = true;
  }
  return cased;
}
inline Value test_arg(Args& a, const char* name) {
  if (a.pos.empty() && a.kw.empty()) type_error(std::string("test '") + name + "' takes one argument");
  return a.pos.empty() ? a.kw[0].second : a.pos[0];
}
inline bool t_even(Renderer& r, const Value& v, Args&) { return equals(r.binop("%", v, Value(std::int64_t{2})), Value(std::int64_t{0})); }
inline bool t_odd(Renderer& r, const Value& v, Args&) { return equals(r.binop("%", v, Value(std::int64_t{2})), Value(std::int64_t{1})); }
inline bool t_divisibleby(Renderer& r, const Value& v, Args& a) {
  return equals(r.binop("%", v, test_arg(a, "divisibleby")), Value(std::int64_t{0}));
}
inline bool t_eq(Renderer&, const Value& v, Args& a) { return equals(v, test_arg(a, "eq")); }
inline bool t_ne(Renderer&, const Value& v, Args& a) { return !equals(v, test_arg(a, "ne")); }
inline bool t_lt(Renderer&, const Value& v, Args& a) { return compare(v, test_arg(a, "lt"), "<") < 0; }
inline bool t_le(Renderer&, const Value& v, Args& a) { return compare(v, test_arg(a, "le"), "<=") <= 0; }
inline bool t_gt(Renderer&, const Value& v, Args& a) { return compare(v, test_arg(a, "gt"), ">") > 0; }
inline bool t_ge(Renderer&, const Value& v, Args& a) { return compare(v, test_arg(a, "ge"), ">=") >= 0; }
inline bool t_in(Renderer& r, const Value& v, Args& a) { return r.contains(test_arg(a, "in"), v); }
inline bool t_sameas(Renderer&, const Value& v, Args& a) {
  Value o = test_arg(a, "sameas");
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Kind::None:
    case Kind::Undefined: return v.is_none() || v.identity() == o.identity();
    case Kind::Bool:
    case Kind::Int: return v.as_int() == o.as_int();
    case Kind::Float: return false;
    default: return v.identity() == o.identity();
  }
}
inline bool t_filter(Renderer&, const Value& v, Args&) { return v.is_string() && filter_table().count(v.str()); }
inline bool t_test(Renderer&, const Value& v, Args&) { return v.is_string() && test_table().count(v.str()); }

inline const std::map<std::string, FilterFn, std::less<>>& filter_table() {
  static const std::map<std::string, FilterFn, std::less<>> t = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
      {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
      {"float", f_float}, {"forceescape", f_forceescape}, {"format", f_format}, {"indent", f_indent},
      {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length},
      {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
      {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr},
      {"sort", f_sort}, {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson},
      {"trim", f_trim}, {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
  };
  return t;
}

inline const std::map<std::string, TestFn, std::less<>>& test_table() {
  static const std::map<std::string, TestFn, std::less<>> t = {
      {"!=", t_ne}, {"<", t_lt}, {"<=", t_le}, {"==", t_eq}, {">", t_gt}, {">=", t_ge},
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},
      {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"escaped", t_escaped},
      {"even", t_even}, {"false", t_false}, {"filter", t_filter}, {"float", t_float}, {"ge", t_ge},
      {"greaterthan", t_gt}, {"gt", t_gt}, {"in", t_in}, {"integer", t_integer}, {"iterable", t_iterable},
      {"le", t_le}, {"lessthan", t_lt}, {"lower", t_lower}, {"lt", t_lt}, {"mapping", t_mapping},
      {"ne", t_ne}, {"none", t_none}, {"number", t_number}, {"odd", t_odd}, {"sameas", t_sameas},
      {"sequence", t_sequence}, {"string", t_string}, {"test", t_test}, {"true", t_true},
      {"undefined", t_undefined}, {"upper", t_upper},
  };
  return t;
}

// ---------------------------------------------------------------------------------------------
// Python methods

/// str.format with auto/explicit positions, names, .attr and [key] and simple format specs.
inline std::string str_format(Renderer& r, const std::string& fmt, Args& a) {
  std::string out;
  std::size_t auto_idx = 0;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      fail(RenderFailure::value_error, "Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    std::size_t e = fmt.find('}', i);
    if (e == std::string::npos) fail(RenderFailure::value_error, "Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, e - i - 1);
    i = e;
    std::string spec, conv;
    if (auto colon = field.find(':'); colon != std::string::npos) spec = field.substr(colon + 1), field.resize(colon);
    if (auto bang = field.find('!'); bang != std::string::npos) conv = field.substr(bang + 1), field.resize(bang);
    std::size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    std::string head = field.substr(0, k);
    Value v;
    if (head.empty()) {
      if (auto_idx >= a.pos.size()) fail(RenderFailure::value_error, "Replacement index " + std::to_string(auto_idx) + " out of range for positional args tuple");
      v = a.pos[auto_idx++];
    } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      std::size_t idx = static_cast<std::size_t>(std::stoul(head.substr(0, 9)));
      if (idx >= a.pos.size()) fail(RenderFailure::value_error, "Replacement index " + head + " out of range for positional args tuple");
      v = a.pos[idx];
    } else {
      bool found = false;
      for (auto& [kk, x] : a.kw)
        if (kk == head) v = x, found = true;
      if (!found) fail(RenderFailure::value_error, "KeyError: '" + head + "'");
    }
    while (k < field.size()) {
      if (field[k] == '.') {
        std::size_t s = ++k;
        while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
        v = r.getattr(v, field.substr(s, k - s));
      } else {
        std::size_t close = field.find(']', k);
        if (close == std::string::npos) fail(RenderFailure::value_error, "Missing ']' in format string");
        std::string key = field.substr(k + 1, close - k - 1);
        bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        v = r.getitem(v, digits ? Value(static_cast<std::int64_t>(std::stoll(key.substr(0, 18)))) : Value(key));
        k = close + 1;
      }
    }
    if (conv == "r" || conv == "a") v = Value(repr(v));
    else if (conv == "s") v = Value(to_str(v));
    else if (!conv.empty()) fail(RenderFailure::value_error, "Unknown conversion specifier " + conv);
    out += apply_spec(v, spec);
  }
  return out;
}

inline Value str_method(Renderer& r, const Value& self, const std::string& name, Args& a) {
  bool mk = self.is_markup();
  auto s = [&] { return u32(self); };
  auto opt_int = [&](std::size_t i, const char* n, std::int64_t def) {
    Value v = a.get(i, n, Value(nullptr));
    return v.is_none() ? def : need_int(v, n);
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Value chars = a.get(0, "chars", Value(nullptr));
    a.check(name, 1);
    return str_value(strip_cps(s(), chars, name != "rstrip", name != "lstrip"), mk);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase" || name == "casefold") {
    a.check(name, 0);
    auto x = s();
    if (name == "upper") x = py_upper(x);
    else if (name == "lower" || name == "casefold") x = py_lower(x);
    else if (name == "title") x = py_title_method(x);
    else if (name == "capitalize") x = py_capitalize(x);
    else
      for (auto& c : x) c = is_upper(c) ? to_lower(c) : to_upper(c);
    return str_value(x, mk);
  }
  if (name == "split" || name == "rsplit") {
    Value sep = a.get(0, "sep", Value(nullptr));
    std::int64_t maxsplit = need_int(a.get(1, "maxsplit", Value(std::int64_t{-1})), "maxsplit");
    a.check(name, 2);
    return Value(py_split(s(), sep, maxsplit, name == "rsplit"));
  }
  if (name == "splitlines") {
    bool keep = bool_arg(a, 0, "keepends", false);
    a.check(name, 1);
    std::vector<Value> out;
    for (auto& l : split_lines(s(), keep)) out.push_back(str_value(l, mk));
    return Value(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    Value prefix = a.get(0, "prefix");
    a.check(name, 3);
    auto x = s();
    auto n = static_cast<std::int64_t>(x.size());
    std::int64_t b = opt_int(1, "start", 0), e = opt_int(2, "end", n);
    if (b < 0) b = std::max<std::int64_t>(0, b + n);
    if (e < 0) e = std::max<std::int64_t>(0, e + n);
    e = std::min(e, n);
    std::vector<Value> cands = prefix.is_list() && prefix.list().kind == SeqKind::Tuple ? prefix.list().items : std::vector<Value>{prefix};
    for (const auto& c : cands) {
      if (!c.is_string()) type_error(name + " first arg must be str or a tuple of str, not " + type_name(c));
      auto p = u32(c);
      auto len = static_cast<std::int64_t>(p.size());
      if (b > n || e - b < len) continue;
      std::size_t at = static_cast<std::size_t>(name == "startswith" ? b : e - len);
      if (x.compare(at, p.size(), p) == 0) return Value(true);
    }
    return Value(false);
  }
  if (name == "replace") {
    Args b;
    b.pos = a.pos;
    b.kw = a.kw;
    if (b.pos.size() > 3) type_error("replace expected at most 3 arguments");
    return f_replace(r, self, b);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    std::string sub = need_str(a.get(0, "sub"), "substring");
    a.check(name, 3);
    auto x = s();
    auto n = static_cast<std::int64_t>(x.size());
    std::int64_t b = opt_int(1, "start", 0), e = opt_int(2, "end", n);
    if (b < 0) b = std::max<std::int64_t>(0, b + n);
    if (e < 0) e = std::max<std::int64_t>(0, e + n);
    e = std::min(e, n);
    auto p = decode_utf8(sub);
    if (name == "count") {
      if (b > e) return Value(std::int64_t{0});
      auto hay = x.substr(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b));
      if (p.empty()) return Value(static_cast<std::int64_t>(hay.size() + 1));
      std::int64_t cnt = 0;
      for (std::size_t at = hay.find(p); at != std::u32string::npos; at = hay.find(p, at + p.size())) ++cnt;
      return Value(cnt);
    }
    std::int64_t found = -1;
    if (b <= e && e - b >= static_cast<std::int64_t>(p.size())) {
      auto hay = x.substr(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b));
      std::size_t at = (name == "find" || name == "index") ? hay.find(p) : hay.rfind(p);
      if (at != std::u32string::npos) found = b + static_cast<std::int64_t>(at);
    }
    if (found < 0 && (name == "index" || name == "rindex")) fail(RenderFailure::value_error, "substring not found");
    return Value(found);
  }
  if (name == "join") {
    Value it = a.get(0, "iterable");
    a.check(name, 1);
    std::string out;
    bool first = true;
    for (auto& x : r.iterate(it)) {
      if (!x.is_string()) type_error("sequence item: expected str instance, " + type_name(x) + " found");
      if (!first) out += self.str();
      first = false;
      out += mk ? as_markup_text(x) : x.str();
    }
    return Value(std::move(out), mk);
  }
  if (name == "format") return Value(str_format(r, self.str(), a), mk);
  if (name == "partition" || name == "rpartition") {
    std::string sep = need_str(a.get(0, "sep"), "separator");
    a.check(name, 1);
    if (sep.empty()) fail(RenderFailure::value_error, "empty separator");
    const std::string& x = self.str();
    std::size_t at = name == "partition" ? x.find(sep) : x.rfind(sep);
    if (at == std::string::npos)
      return name == "partition" ? Value(std::vector<Value>{self, Value(""), Value("")}, SeqKind::Tuple)
                                 : Value(std::vector<Value>{Value(""), Value(""), self}, SeqKind::Tuple);
    return Value(std::vector<Value>{Value(x.substr(0, at)), Value(sep), Value(x.substr(at + sep.size()))}, SeqKind::Tuple);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string fix = need_str(a.get(0, "prefix"), "prefix");
    a.check(name, 1);
    const std::string& x = self.str();
    if (name == "removeprefix" && x.compare(0, fix.size(), fix) == 0) return Value(x.substr(fix.size()), mk);
    if (name == "removesuffix" && !fix.empty() && x.size() >= fix.size() && x.compare(x.size() - fix.size(), fix.size(), fix) == 0)
      return Value(x.substr(0, x.size() - fix.size()), mk);
    return self;
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    std::int64_t width = need_int(a.get(0, "width"), "width");
    std::string fill = name == "zfill" ? "0" : to_str(a.get(1, "fillchar", Value(" ")));
    a.check(name, name == "zfill" ? 1 : 2);
    auto x = s();
    if (decode_utf8(fill).size() != 1) type_error("The fill character must be exactly one character long");
    char32_t f = decode_utf8(fill)[0];
    if (width <= static_cast<std::int64_t>(x.size())) return self;
    std::size_t marg = static_cast<std::size_t>(std::min<std::int64_t>(width, 1 << 24)) - x.size();
    if (name == "ljust") return str_value(x + std::u32string(marg, f), mk);
    if (name == "rjust") return str_value(std::u32string(marg, f) + x, mk);
    if (name == "zfill") {
      if (!x.empty() && (x[0] == '-' || x[0] == '+')) return str_value(x.substr(0, 1) + std::u32string(marg, U'0') + x.substr(1), mk);
      return str_value(std::u32string(marg, U'0') + x, mk);
    }
    std::size_t left = marg / 2 + (marg & static_cast<std::size_t>(width) & 1);
    return str_value(std::u32string(left, f) + x + std::u32string(marg - left, f), mk);
  }
  if (name.rfind("is", 0) == 0) {
    a.check(name, 0);
    auto x = s();
    if (name == "isupper") return Value(t_upper(r, self, a));
    if (name == "islower") return Value(t_lower(r, self, a));
    if (x.empty()) return Value(false);
    auto all = [&](auto pred) { return std::all_of(x.begin(), x.end(), pred); };
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return Value(all(is_digit));
    if (name == "isalpha") return Value(all(is_alpha));
    if (name == "isalnum") return Value(all([](char32_t c) { return is_alpha(c) || is_digit(c); }));
    if (name == "isspace") return Value(all(is_space));
    if (name == "istitle") return Value(py_title_method(x) == x && std::any_of(x.begin(), x.end(), is_upper));
  }
  fail(RenderFailure::type_error, "str method '" + name + "' is not supported");
}

inline bool is_str_method(std::string_view n) {
  static const char* names[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize", "swapcase",
                                "casefold", "split", "rsplit", "splitlines", "startswith", "endswith", "replace",
                                "find", "rfind", "index", "rindex", "count", "join", "format", "partition",
                                "rpartition", "removeprefix", "removesuffix", "center", "ljust", "rjust", "zfill",
                                "isupper", "islower", "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum",
                                "isspace", "istitle"};
  for (const char* m : names)
    if (n == m) return true;
  return false;
}

}  // namespace detail

inline std::optional<Value> Renderer::method(const Value& obj, const std::string& name) {
  using namespace detail;
  Renderer* self = this;
  auto bind = [&](auto impl) {
    Value recv = obj;
    return make_function(name, [self, recv, impl, n = name](Args& a) -> Value { return impl(*self, recv, n, a); });
  };
  switch (obj.kind()) {
    case Kind::String:
      if (is_str_method(name)) return bind(str_method);
      if (name == "encode" || name == "format_map" || name == "expandtabs" || name == "translate" || name == "maketrans")
        return bind([](Renderer&, const Value&, const std::string& n, Args&) -> Value {
          fail(RenderFailure::type_error, "str method '" + n + "' is not supported");
        });
      return std::nullopt;
    case Kind::Dict:
      if (name == "get")
        return bind([](Renderer&, const Value& d, const std::string&, Args& a) -> Value {
          Value key = a.get(0, "key"), def = a.get(1, "default", Value(nullptr));
          a.check("get", 2);
          if (const Value* v = d.dict().find(key)) return *v;
          return def;
        });
      if (name == "items" || name == "keys" || name == "values")
        return bind([](Renderer&, const Value& d, const std::string& n, Args& a) -> Value {
          a.check(n, 0);
          std::vector<Value> out;
          for (const auto& [k, v] : d.dict().items) out.push_back(n == "items" ? make_tuple2(k, v) : n == "keys" ? k : v);
          return Value(std::move(out), n == "items" ? SeqKind::DictItems : n == "keys" ? SeqKind::DictKeys : SeqKind::DictValues);
        });
      if (name == "copy")
        return bind([](Renderer&, const Value& d, const std::string&, Args& a) -> Value {
          a.check("copy", 0);
          return Value(std::make_shared<DictData>(d.dict()));
        });
      if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update")
        return unsafe_attr(obj, name);
      return std::nullopt;
    case Kind::List: {
      SeqKind k = obj.list().kind;
      if (k != SeqKind::List && k != SeqKind::Tuple) return std::nullopt;
      if (name == "index" || name == "count")
        return bind([](Renderer&, const Value& l, const std::string& n, Args& a) -> Value {
          Value x = a.get(0, "value");
          a.check(n, 1);
          std::int64_t cnt = 0, i = 0;
          for (const auto& y : l.list().items) {
            if (equals(x, y)) {
              if (n == "index") return Value(i);
              ++cnt;
            }
            ++i;
          }
          if (n == "index") fail(RenderFailure::value_error, repr(x) + " is not in list");
          return Value(cnt);
        });
      if (k == SeqKind::List && name == "copy")
        return bind([](Renderer&, const Value& l, const std::string&, Args& a) -> Value {
          a.check("copy", 0);
          return Value(l.list().items);
        });
      if (k == SeqKind::List && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                                 name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
        return unsafe_attr(obj, name);
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

}  // namespace edl::chat::jinja
