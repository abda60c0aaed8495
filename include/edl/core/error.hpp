// edl/core/error.hpp
// The one exception type of edl and the checks that raise it.
//
// Every run-time failure is an `edl::Error` whose message reads
//   [edl.<id-name>.<id-number>] <where>: <what was expected>, <what was found>
// e.g. "[edl.shape_mismatch.101] kernels.gemm: A is (4, 7), expected K = 8 columns".
// The id is stable (docs/errors.md lists them all) so programs can switch on `code()`,
// while the text names the object (file, tensor path, argument) for the person reading it.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace edl {

/// Stable error ids. Numbers never change meaning; new ids are appended.
enum class errc : int {
  shape_mismatch = 101,    // extents or ranks disagree
  invalid_argument = 102,  // a value outside its allowed range
  not_divisible = 103,     // a dimension does not split evenly over mesh axes
  unknown_axis = 104,      // a mesh axis name that the mesh does not have
  axis_reused = 105,       // one mesh axis used by two dimensions of a spec
  no_matching_rule = 106,  // no partition rule matches a parameter path
  dtype_mismatch = 107,    // an element type other than the one expected
  collective = 108,        // a collective called inconsistently across devices
  device_failure = 109,    // a simulated device threw; rethrown on the caller
  io = 201,                // a file could not be opened, read or written
  format = 202,            // a file's contents break its format's rules
  config = 203,            // a configuration value is missing or of the wrong type
  unsupported = 301,       // a valid request this build does not support
};

/// Short name of an id, as it appears in messages.
constexpr std::string_view errc_name(errc e) noexcept {
  switch (e) {
    case errc::shape_mismatch: return "shape_mismatch";
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_divisible: return "not_divisible";
    case errc::unknown_axis: return "unknown_axis";
    case errc::axis_reused: return "axis_reused";
    case errc::no_matching_rule: return "no_matching_rule";
    case errc::dtype_mismatch: return "dtype_mismatch";
    case errc::collective: return "collective";
    case errc::device_failure: return "device_failure";
    case errc::io: return "io";
    case errc::format: return "format";
    case errc::config: return "config";
    case errc::unsupported: return "unsupported";
  }
  return "unknown";
}

class Error : public std::runtime_error {
 public:
  Error(errc code, const std::string& where, const std::string& what)
      : std::runtime_error(format(code, where, what)), code_(code), where_(where), message_(what) {}

  errc code() const noexcept { return code_; }
  /// The object the error is about: an argument, a tensor path or a file.
  const std::string& where() const noexcept { return where_; }
  /// What is wrong, without the code and the object (what() holds all three).
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string format(errc code, const std::string& where, const std::string& what) {
    std::string s = "[edl.";
    s += errc_name(code);
    s += '.';
    s += std::to_string(static_cast<int>(code));
    s += "] ";
    s += where;
    s += ": ";
    s += what;
    return s;
  }
  errc code_;
  std::string where_;
  std::string message_;
};

namespace detail {

/// Streams every part into one string: concat("x is (", 4, ", ", 7, ")").
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

/// "(4, 7)" for any range of integers.
template <class Range>
std::string shape_str(const Range& r) {
  std::string s = "(";
  bool first = true;
  for (auto v : r) {
    if (!first) s += ", ";
    s += std::to_string(static_cast<long long>(v));
    first = false;
  }
  return s + ")";
}

[[noreturn]] inline void raise(errc code, const std::string& where, const std::string& what) {
  throw Error(code, where, what);
}

}  // namespace detail
}  // namespace edl

/// Always-on check for boundaries (arguments, files, configs, shard specs).
#define EDL_CHECK(cond, code, where, ...)                                              \
  do {                                                                                 \
    if (!(cond)) ::edl::detail::raise((code), (where), ::edl::detail::concat(__VA_ARGS__)); \
  } while (0)

/// Debug-only check for inner loops.
#ifdef NDEBUG
#define EDL_ASSERT(cond) ((void)0)
#else
#include <cassert>
#define EDL_ASSERT(cond) assert(cond)
#endif
