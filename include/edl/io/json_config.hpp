// edl/io/json_config.hpp
// A small wrapper over a JSON object (config.json and friends) with typed getters whose errors
// name the file, the field, the expected type and the value found:
//
//   auto c = edl::io::JsonConfig::from_file("config.json");
//   int64_t h = c.get<int64_t>("hidden_size");             // required
//   double eps = c.get<double>("rms_norm_eps", 1e-6);      // default when missing or null
//   std::optional<int64_t> w = c.optional<int64_t>("sliding_window");
//
// Unknown fields are kept as they are, in their order, so writing back preserves them.
// Errors: errc::io (file cannot be read/written), errc::format (not valid JSON: the message gives
// line, column and byte; a duplicate key; nesting too deep: io/json.hpp), errc::config (missing field or wrong type; where = "<source> field <key>").
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/json.hpp>
#include <edl/io/mmap.hpp>

namespace edl::io {

using ojson = nlohmann::ordered_json;

class JsonConfig {
 public:
  JsonConfig() : j_(ojson::object()) {}
  /// `source` names the document in errors (a file path, or e.g. "LlamaConfig").
  explicit JsonConfig(ojson j, std::string source = "config") : j_(std::move(j)), source_(std::move(source)) {
    EDL_CHECK(j_.is_object(), errc::config, source_, "expected a JSON object, found ", j_.type_name());
  }

  static JsonConfig parse(const std::string& text, const std::string& source = "config") {
    ojson j = parse_json(text, source);
    EDL_CHECK(j.is_object(), errc::format, source, "expected a JSON object, found ", j.type_name());
    return JsonConfig(std::move(j), source);
  }

  static JsonConfig from_file(const std::string& path) {
    return parse(read_text_file(path), path);
  }

  const ojson& json() const noexcept { return j_; }
  ojson& json() noexcept { return j_; }
  const std::string& source() const noexcept { return source_; }
  void set_source(std::string s) { source_ = std::move(s); }

  bool has(const std::string& key) const { return j_.contains(key); }
  /// Present and not null.
  bool has_value(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  std::string where(const std::string& key) const { return source_ + " field " + key; }

  /// Required field of type T (bool, integers, floating point, std::string, std::vector<...>, ojson).
  template <class T>
  T get(const std::string& key) const {
    EDL_CHECK(has(key), errc::config, where(key), "missing required field (expected ", type_name<T>(), ")");
    return convert<T>(j_[key], where(key));
  }
  /// Field of type T, or `fallback` when it is missing or null.
  template <class T>
  T get(const std::string& key, const T& fallback) const {
    if (!has_value(key)) return fallback;
    return convert<T>(j_[key], where(key));
  }
  /// Field of type T, or nullopt when missing or null.
  template <class T>
  std::optional<T> optional(const std::string& key) const {
    if (!has_value(key)) return std::nullopt;
    return convert<T>(j_[key], where(key));
  }

  template <class T>
  void set(const std::string& key, const T& value) { j_[key] = value; }
  void erase(const std::string& key) { j_.erase(key); }

  std::string dump(int indent = 2) const { return j_.dump(indent); }
  /// Writes the document (pretty, newline-terminated) atomically.
  void save(const std::string& path) const { write_file_atomic(path, dump(2) + "\n"); }

  /// Converts one JSON value to T; errors name `where`, the expected type and the value found.
  template <class T>
  static T convert(const ojson& v, const std::string& where) {
    auto fail = [&]() {
      std::string found = v.dump();
      if (found.size() > 60) found = found.substr(0, 57) + "...";
      ::edl::detail::raise(errc::config, where,
                           ::edl::detail::concat("expected ", type_name<T>(), ", found ", found, " (", v.type_name(), ")"));
    };
    if constexpr (std::is_same_v<T, ojson>) {
      return v;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) fail();
      return v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (v.is_number_integer()) {
        if (v.is_number_unsigned()) {
          const auto u = v.get<std::uint64_t>();
          if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) fail();
          return static_cast<T>(u);
        }
        const auto s = v.get<std::int64_t>();
        if (s < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
            (s > 0 && static_cast<std::uint64_t>(s) > static_cast<std::uint64_t>(std::numeric_limits<T>::max())))
          fail();
        return static_cast<T>(s);
      }
      if (v.is_number_float()) {  // 2048.0 is accepted as 2048, 0.5 is not an integer
        const double d = v.get<double>();
        // max() + 1 is a power of two, exact in a double: d < 2^63 (not d <= 2^63 - 1, which
        // rounds to 2^63 and would let 2^63 through to an undefined conversion).
        if (std::floor(d) != d || d < static_cast<double>(std::numeric_limits<T>::min()) ||
            d >= static_cast<double>(std::numeric_limits<T>::max()) + 1.0)
          fail();
        return static_cast<T>(d);
      }
      fail();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) fail();
      const double d = v.get<double>();
      if (std::fabs(d) > static_cast<double>(std::numeric_limits<T>::max())) fail();  // 1e300 into a float
      return static_cast<T>(d);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) fail();
      return v.get<std::string>();
    } else if constexpr (is_vector<T>::value) {
      if (!v.is_array()) fail();
      T out;
      std::size_t i = 0;
      for (const auto& e : v) out.push_back(convert<typename T::value_type>(e, where + "[" + std::to_string(i++) + "]"));
      return out;
    } else {
      static_assert(sizeof(T) == 0, "JsonConfig: unsupported field type");
    }
    return T{};
  }

  template <class T>
  static std::string type_name() {
    if constexpr (std::is_same_v<T, ojson>) return "a JSON value";
    else if constexpr (std::is_same_v<T, bool>) return "a boolean";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else if constexpr (std::is_same_v<T, std::string>) return "a string";
    else if constexpr (is_vector<T>::value) return "an array of " + type_name<typename T::value_type>().substr(2) + "s";
    else return "a value";
  }

 private:
  template <class T> struct is_vector : std::false_type {};
  template <class U, class A> struct is_vector<std::vector<U, A>> : std::true_type {};

  ojson j_;
  std::string source_ = "config";
};

}  // namespace edl::io
