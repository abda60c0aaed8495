// edl/io/npy.hpp
// NumPy .npy files, thinly over xtensor's xt::load_npy / xt::dump_npy, with edl::Error:
// errc::io when the file cannot be opened, errc::dtype_mismatch when its element type is not T
// (no implicit conversion: an int64 tokens.npy is read as std::int64_t), errc::format otherwise.
#pragma once

#include <fstream>
#include <stdexcept>
#include <string>

#include <xtensor/xarray.hpp>
#include <xtensor/xnpy.hpp>

#include <edl/core/error.hpp>
#include <edl/io/mmap.hpp>

namespace edl::io {

/// Reads a C-order .npy file of element type T.
template <class T>
xt::xarray<T> load_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", detail::errno_text());
  try {
    xt::xarray<T> a = xt::load_npy<T, xt::layout_type::row_major>(in);
    return a;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    if (what.find("formats not matching") != std::string::npos)
      ::edl::detail::raise(errc::dtype_mismatch, path, "element type differs from the one requested: " + what);
    ::edl::detail::raise(errc::format, path, "not a valid C-order .npy file: " + what);
  }
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
