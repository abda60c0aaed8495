// edl/io/json.hpp
// parse_json: the one way edl reads a JSON document that comes from outside (config.json, a
// safetensors header, an index, tokenizer.json, adapter_config.json, a request body).
// nlohmann's parser alone accepts two things edl must refuse:
//   - any nesting depth: parsing is iterative, but dumping (error snippets) and destroying a
//     value recurse, so a header of a million '[' overflows the stack later, far from the read;
//   - duplicate keys, the last one winning silently: the safetensors specification forbids
//     them, and in a config a second "hidden_size" hides a mistake.
// Both become an errc::format error naming the document, the key (as a JSON pointer) and the
// position. Syntax errors name line and column.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>

namespace edl::io {

/// Deeper documents are refused: the deepest that edl reads (chat messages with tool calls,
/// tokenizer.json's pre-tokenizer sequences) are under 10 levels.
inline constexpr int kMaxJsonDepth = 128;

namespace detail {

/// "line L, column C" of byte `pos` of `text`.
inline std::string json_position(std::string_view text, std::size_t pos) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < pos && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return ::edl::detail::concat("line ", line, ", column ", col, " (byte ", pos, ")");
}

/// A JSON pointer escape of one key ("~" -> "~0", "/" -> "~1").
inline std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

}  // namespace detail

/// Parses `text` as one JSON value (ordered_json keeps the keys' order; json sorts them).
/// Errors (errc::format, where = `source`): not valid JSON (line, column), nesting deeper than
/// `max_depth`, or a key given twice in one object.
template <class Json = nlohmann::ordered_json>
Json parse_json(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth) {
  // Per open object: the keys seen so far, and the path to it for messages.
  struct Open {
    bool object;
    std::unordered_set<std::string> keys;
    std::string last_key;
  };
  std::vector<Open> open;
  const auto path = [&] {
    std::string p;
    for (const auto& o : open)
      if (o.object && !o.last_key.empty()) p += "/" + detail::pointer_token(o.last_key);
    return p.empty() ? std::string("/") : p;
  };
  using Event = typename Json::parse_event_t;
  auto callback = [&](int depth, Event event, Json& parsed) -> bool {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        EDL_CHECK(depth < max_depth, errc::format, source, "JSON nested deeper than ", max_depth, " levels (at ",
                  path(), ")");
        open.push_back({event == Event::object_start, {}, {}});
        break;
      case Event::object_end:
      case Event::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case Event::key: {
        if (open.empty() || !open.back().object) break;
        const std::string& key = parsed.template get_ref<const std::string&>();
        EDL_CHECK(open.back().keys.insert(key).second, errc::format, source, "duplicate key \"", key, "\" in the object at ",
                  path());
        open.back().last_key = key;
        break;
      }
      case Event::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::parse_error& e) {
    ::edl::detail::raise(errc::format, source,
                         ::edl::detail::concat("not valid JSON at ",
                                               detail::json_position(text, e.byte > 0 ? e.byte - 1 : 0), ": ",
                                               e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range: a number beyond a double (1e309)
    ::edl::detail::raise(errc::format, source, ::edl::detail::concat("not valid JSON: ", e.what()));
  }
}

}  // namespace edl::io
