// edl/io/npy.hpp
// NumPy .npy files. Reading is edl's own strict parser (a file from outside is checked whole
// before anything is allocated; xtensor's reader trusted the header's shape); writing is
// xtensor's xt::dump_npy. Errors: errc::io when the file cannot be opened,
// errc::dtype_mismatch when its element type is not T (no implicit conversion: an int64
// tokens.npy is read as std::int64_t), errc::format otherwise.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>

#include <edl/core/error.hpp>
#include <edl/io/mmap.hpp>

namespace edl::io {

namespace detail::npy {

/// The numpy descr ('<i8', '|u1', ...) of T; the byte order is little-endian (the only one
/// edl reads, as every x86 and ARM numpy writes).
template <class T>
constexpr std::string_view descr_of() {
  if constexpr (std::is_same_v<T, float>) return "f4";
  else if constexpr (std::is_same_v<T, double>) return "f8";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "i8";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "i4";
  else if constexpr (std::is_same_v<T, std::int16_t>) return "i2";
  else if constexpr (std::is_same_v<T, std::int8_t>) return "i1";
  else if constexpr (std::is_same_v<T, std::uint64_t>) return "u8";
  else if constexpr (std::is_same_v<T, std::uint32_t>) return "u4";
  else if constexpr (std::is_same_v<T, std::uint16_t>) return "u2";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "u1";
  else static_assert(sizeof(T) == 0, "load_npy: unsupported element type");
}

/// The header dictionary: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

/// A small parser for the one Python literal numpy writes: a dict of a string, a bool and a
/// tuple of non-negative integers. Anything else is an error naming the byte.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : t_(text), where_(where) {}

  Header parse() {
    Header h;
    bool descr = false, order = false, shape = false;
    expect('{');
    while (true) {
      skip();
      if (peek() == '}') break;
      const std::string key = quoted();
      expect(':');
      skip();
      if (key == "descr") {
        EDL_CHECK(!descr, errc::format, where_, "the header gives 'descr' twice");
        h.descr = quoted(), descr = true;
      } else if (key == "fortran_order") {
        EDL_CHECK(!order, errc::format, where_, "the header gives 'fortran_order' twice");
        h.fortran_order = boolean(), order = true;
      } else if (key == "shape") {
        EDL_CHECK(!shape, errc::format, where_, "the header gives 'shape' twice");
        h.shape = tuple(), shape = true;
      } else {
        fail(::edl::detail::concat("unknown header key '", key, "'"));
      }
      skip();
      if (peek() == ',') ++i_;
      else if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    skip();
    EDL_CHECK(i_ == t_.size(), errc::format, where_, "unexpected bytes after the header dictionary at byte ", i_);
    EDL_CHECK(descr && order && shape, errc::format, where_,
              "the header must give 'descr', 'fortran_order' and 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    ::edl::detail::raise(errc::format, where_, ::edl::detail::concat("not a valid .npy header at byte ", i_, ": ", what));
  }
  char peek() const { return i_ < t_.size() ? t_[i_] : '\0'; }
  void skip() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\t')) ++i_;
  }
  void expect(char c) {
    skip();
    if (peek() != c) fail(::edl::detail::concat("expected '", c, "'"));
    ++i_;
  }
  std::string quoted() {
    skip();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    const std::size_t end = t_.find(q, i_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(t_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return s;
  }
  bool boolean() {
    if (t_.substr(i_, 4) == "True") return i_ += 4, true;
    if (t_.substr(i_, 5) == "False") return i_ += 5, false;
    fail("expected True or False");
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    while (true) {
      skip();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("expected a non-negative integer");
      std::int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail("dimension too large");
        v = v * 10 + (peek() - '0');
        ++i_;
      }
      if (dims.size() == 32) fail("more than 32 dimensions");
      dims.push_back(v);
      skip();
      if (peek() == ',') ++i_;
      else if (peek() != ')') fail("expected ',' or ')'");
    }
    ++i_;
    return dims;
  }

  std::string_view t_;
  const std::string& where_;
  std::size_t i_ = 0;
};

}  // namespace detail::npy

/// Parses the bytes of a C-order .npy file of element type T (versions 1.0, 2.0, 3.0).
/// Everything is checked before anything is allocated: the data must be exactly what the shape
/// needs, so no header can ask for more memory than the file holds.
template <class T>
xt::xarray<T> parse_npy(std::span<const std::byte> file, const std::string& where) {
  const auto* p = reinterpret_cast<const unsigned char*>(file.data());
  const std::size_t size = file.size();
  EDL_CHECK(size >= 10 && std::memcmp(p, "\x93NUMPY", 6) == 0, errc::format, where,
            "not a .npy file (it starts with the magic \\x93NUMPY and a version)");
  const unsigned major = p[6];
  EDL_CHECK(major >= 1 && major <= 3, errc::format, where, ".npy version ", major, ".", unsigned(p[7]),
            " is not supported (1.0, 2.0 and 3.0 are)");
  std::size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = std::size_t(p[8]) | std::size_t(p[9]) << 8;
    offset = 10;
  } else {
    EDL_CHECK(size >= 12, errc::format, where, "the file ends inside the header length");
    header_len = std::size_t(p[8]) | std::size_t(p[9]) << 8 | std::size_t(p[10]) << 16 | std::size_t(p[11]) << 24;
    offset = 12;
  }
  EDL_CHECK(header_len <= size - offset, errc::format, where, "the header length ", header_len,
            " reaches beyond the end of the file (", size, " bytes)");
  const std::string_view text(reinterpret_cast<const char*>(p) + offset, header_len);
  const detail::npy::Header h = detail::npy::HeaderParser(text, where).parse();
  EDL_CHECK(!h.fortran_order, errc::format, where, "only C-order arrays are read (fortran_order is True)");
  const std::string_view want = detail::npy::descr_of<T>();
  const bool little = !h.descr.empty() && (h.descr[0] == '<' || h.descr[0] == '|' || h.descr[0] == '=');
  EDL_CHECK(h.descr.size() >= 2 && (little || h.descr[0] == '>'), errc::format, where, "descr '", h.descr,
            "' is not a numpy type string such as '<f4'");
  EDL_CHECK(std::string_view(h.descr).substr(1) == want && (little || sizeof(T) == 1), errc::dtype_mismatch, where,
            "element type '", h.descr, "' differs from the one requested ('<", want, "')");
  // The product of the non-zero extents must fit too (an empty array's strides are still
  // products of its other extents).
  std::uint64_t numel = 1, nonzero = 1;
  for (const std::int64_t d : h.shape) {
    const auto u = static_cast<std::uint64_t>(d);
    EDL_CHECK(d == 0 || nonzero <= (std::uint64_t{1} << 62) / sizeof(T) / u, errc::format, where, "shape ",
              ::edl::detail::shape_str(h.shape), " overflows a 64-bit byte count");
    if (d != 0) nonzero *= u;
    numel *= u;
  }
  const std::uint64_t data = size - offset - header_len;
  EDL_CHECK(numel * sizeof(T) == data, errc::format, where, "shape ", ::edl::detail::shape_str(h.shape), " of ",
            sizeof(T), "-byte elements needs ", numel * sizeof(T), " data bytes, the file holds ", data);
  std::vector<std::size_t> shape(h.shape.begin(), h.shape.end());
  xt::xarray<T> a = xt::xarray<T>::from_shape(shape);
  if (numel) std::memcpy(a.data(), p + offset + header_len, numel * sizeof(T));
  return a;
}

/// Reads a C-order .npy file of element type T.
template <class T>
xt::xarray<T> load_npy(const std::string& path) {
  const MappedFile f(path);
  return parse_npy<T>(f.bytes(), path);
}

/// Writes `a` as a .npy file.
template <class E>
void save_npy(const std::string& path, const E& a) {
  try {
    xt::dump_npy(path, a);
  } catch (const std::runtime_error& e) {
    ::edl::detail::raise(errc::io, path, std::string("cannot write: ") + e.what());
  }
}

}  // namespace edl::io
