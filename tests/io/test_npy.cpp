// tests/io/test_npy.cpp: edl's .npy reader against what xtensor (numpy's layout) writes, and
// every malformed header refused before allocating.
#include <edl/io/npy.hpp>

#include <cstring>
#include <string>

#include <gtest/gtest.h>
#include <xtensor/xnpy.hpp>

namespace {

using edl::errc;
using edl::io::parse_npy;

std::span<const std::byte> bytes(const std::string& s) { return std::as_bytes(std::span<const char>(s.data(), s.size())); }

/// A version 1.0 .npy file with header dictionary `dict` and `data`.
std::string npy(const std::string& dict, const std::string& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + data;
}

std::string error_of(const std::string& file, errc code = errc::format) {
  try {
    (void)parse_npy<std::int64_t>(bytes(file), "t.npy");
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.where(), "t.npy");
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(Npy, ReadsWhatNumpyLayoutWriters) {
  const xt::xarray<std::int64_t> a = {{1, -2, 3}, {4, 5, 1ll << 40}};
  EXPECT_EQ(parse_npy<std::int64_t>(bytes(xt::dump_npy(a)), "a.npy"), a);
  const xt::xarray<float> f = {0.5f, -1.25f};
  EXPECT_EQ(parse_npy<float>(bytes(xt::dump_npy(f)), "f.npy"), f);
  const xt::xarray<std::uint16_t> u = {{1, 65535}};
  EXPECT_EQ(parse_npy<std::uint16_t>(bytes(xt::dump_npy(u)), "u.npy"), u);
  // A scalar and an empty array.
  std::int64_t seven = 7;
  const auto s = parse_npy<std::int64_t>(bytes(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }",
                                                   std::string(reinterpret_cast<char*>(&seven), 8))), "s.npy");
  EXPECT_EQ(s.dimension(), 0u);
  EXPECT_EQ(s(), 7);
  EXPECT_EQ(parse_npy<std::int64_t>(bytes(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (0, 3), }", "")), "e")
                .size(), 0u);
}

TEST(Npy, TheElementTypeMustBeTheOneAsked) {
  const xt::xarray<std::int32_t> a = {1, 2};
  EXPECT_NE(error_of(xt::dump_npy(a), errc::dtype_mismatch).find("'<i4' differs"), std::string::npos);
}

TEST(Npy, MalformedHeadersAreRefusedBeforeAllocating) {
  const std::string eight(8, '\0');
  const auto dict = [](const std::string& shape) {
    return "{'descr': '<i8', 'fortran_order': False, 'shape': " + shape + ", }";
  };
  EXPECT_NE(error_of("\x93NUMP").find("not a .npy file"), std::string::npos);
  EXPECT_NE(error_of(npy(dict("(2,)"), eight)).find("needs 16 data bytes, the file holds 8"), std::string::npos);
  EXPECT_NE(error_of(npy(dict("(1,)"), eight + "x")).find("the file holds 9"), std::string::npos);
  // Found by fuzzing: a zero extent made the element count 0 while the other extents'
  // product overflowed inside xtensor's stride computation.
  EXPECT_NE(error_of(npy(dict("(0, 4611686018427387904, 4611686018427387904)"), "")).find("overflows"),
            std::string::npos);
  EXPECT_NE(error_of(npy(dict("(99999999999999999999,)"), "")).find("dimension too large"), std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<i8', 'fortran_order': True, 'shape': (1,), }", eight)).find("C-order"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<i8', 'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", eight))
                .find("'descr' twice"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<i8', 'shape': (1,), }", eight)).find("must give"), std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '>i8', 'fortran_order': False, 'shape': (1,), }", eight), errc::dtype_mismatch)
                .find("'>i8'"),
            std::string::npos);
  std::string long_header = npy(dict("(1,)"), eight);
  long_header[8] = '\xff', long_header[9] = '\xff';
  EXPECT_NE(error_of(long_header).find("beyond the end of the file"), std::string::npos);
}

}  // namespace
