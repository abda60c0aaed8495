#include <edl/io/npy.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/config.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using edl::DType;
using edl::errc;
using edl::io::SafeTensorsFile;
using edl::io::ShardedCheckpoint;
using edl::io::TensorList;
using edl::io::TensorRef;

std::string data_dir() {
  const char* d = std::getenv("EDL_TEST_DATA");
  return d ? d : "tests/data";
}

/// A fresh folder per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("edl_io_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }
  const fs::path& path() const { return path_; }
  std::vector<std::string> files() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path_)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

 private:
  fs::path path_;
};

/// Writes an 8-byte length (`n`, or the header's size), the header and `data` bytes.
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes,
               std::optional<std::uint64_t> n = std::nullopt) {
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t len = n ? *n : header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<char> zeros(data_bytes, 0);
  f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const char* p, std::size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(p, static_cast<std::streamsize>(n));
}

/// Opening `path` must throw errc::format naming the file and (if given) the tensor.
void expect_format_error(const std::string& path, const std::string& tensor, const std::string& text = "") {
  try {
    (void)SafeTensorsFile::open(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format) << e.what();
    EXPECT_NE(e.where().find(path), std::string::npos) << e.what();
    if (!tensor.empty()) {
      EXPECT_NE(e.where().find("tensor " + tensor), std::string::npos) << e.what();
    }
    if (!text.empty()) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
}

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// ------------------------------------------------------------------ round trips

TEST(SafeTensors, RoundTripIsBitExactForEveryDType) {
  TempDir dir;
  const std::vector<float> f32 = {1.0f, -0.0f, 3.14159265f, 1e-40f /*subnormal*/, -65504.5f,
                                  std::numeric_limits<float>::infinity(), std::nanf("")};
  std::vector<edl::bf16> b16;
  std::vector<edl::f16> h16;
  for (float v : f32) {
    b16.push_back(edl::bf16(v));
    h16.push_back(edl::f16(v));
  }
  const std::vector<double> f64 = {1.0 / 3.0, -2.5, 1e300};
  const std::vector<std::int64_t> i64 = {-1, 0, std::numeric_limits<std::int64_t>::max()};
  const std::vector<std::uint8_t> u8 = {0, 7, 255};
  const std::vector<bool> boolean_src = {true, false};
  const bool boolean[] = {true, false};

  TensorList t;
  t.emplace_back("a.f32", TensorRef(f32, {7}));
  t.emplace_back("b.bf16", TensorRef(b16, {7, 1}));
  t.emplace_back("c.f16", TensorRef(h16, {1, 7}));
  t.emplace_back("d.f64", TensorRef(f64, {3}));
  t.emplace_back("e.i64", TensorRef(i64, {3}));
  t.emplace_back("f.u8", TensorRef(u8, {3}));
  t.emplace_back("g.bool", TensorRef(std::span<const bool>(boolean, 2), {2}));
  const std::vector<float> scalar = {42.0f}, empty;
  t.emplace_back("h.scalar", TensorRef(scalar, {}));
  t.emplace_back("i.empty", TensorRef(empty, {0, 3}));
  const std::string path = dir / "all.safetensors";
  edl::io::save_safetensors(path, t, {{"format", "pt"}, {"note", "edl test"}});

  const auto f = SafeTensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16", "d.f64", "e.i64", "f.u8", "g.bool",
                                                 "h.scalar", "i.empty"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "edl test");
  EXPECT_EQ((8 + f.header_bytes()) % 8, 0u) << "data region must start 8-byte aligned";
  // Raw bytes are exactly what was written.
  for (const auto& [name, ref] : t) {
    const auto b = f.bytes(name);
    ASSERT_EQ(b.size(), ref.data.size()) << name;
    if (!b.empty()) {
      EXPECT_EQ(std::memcmp(b.data(), ref.data.data(), b.size()), 0) << name;
    }
    EXPECT_EQ(f.info(name).dtype, ref.dtype) << name;
    EXPECT_EQ(f.info(name).shape, ref.shape) << name;
  }
  const auto rf = f.read_vector<float>("a.f32");
  for (std::size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(bits(rf[i]), bits(f32[i])) << i;
  EXPECT_EQ(f.read_vector<edl::bf16>("b.bf16"), b16);
  EXPECT_EQ(f.read_vector<edl::f16>("c.f16"), h16);
  EXPECT_EQ(f.read_vector<double>("d.f64"), f64);
  EXPECT_EQ(f.read_vector<std::int64_t>("e.i64"), i64);
  EXPECT_EQ(f.read_vector<std::uint8_t>("f.u8"), u8);
  bool bb[2] = {false, true};
  f.read_into<bool>("g.bool", std::span<bool>(bb, 2));
  EXPECT_TRUE(bb[0] && !bb[1]);
  (void)boolean_src;
  EXPECT_EQ(f.read_f32("h.scalar")(), 42.0f);
  EXPECT_EQ(f.read_f32("i.empty").size(), 0u);

  // The header is compact JSON padded with spaces, as HF writes it.
  const auto raw = read_bytes(path);
  const std::string header(raw.data() + 8, f.header_bytes());
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.substr(0, 16), "{\"__metadata__\":");
  const auto last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
}

TEST(SafeTensors, ConvertsWithRoundToNearestEven) {
  TempDir dir;
  // Values that round differently under truncation and under RNE.
  const std::vector<float> f32 = {1.00390625f /* 1 + 2^-8: bf16 tie -> 1.0 (even) */,
                                  1.01171875f /* 1 + 3*2^-8: tie -> 1 + 2^-6 (even) */,
                                  1.0f + 0x1p-8f + 0x1p-20f /* above the tie -> up */, 0.1f, -7.7f};
  std::vector<edl::bf16> b16;
  for (float v : f32) b16.push_back(edl::bf16(v));
  // 1 + 2^-8 + 2^-40 in double: rounds to a float bf16-tie (1 + 2^-8); correct rounding to bf16
  // goes up to 1 + 2^-7, a double rounding through float would go down to 1.0.
  const std::vector<double> f64 = {1.0 + 0x1p-8 + 0x1p-40, -(1.0 + 0x1p-8 + 0x1p-40), 0.1, 1e-30, 1e300};
  TensorList t;
  t.emplace_back("f32", TensorRef(f32, {5}));
  t.emplace_back("bf16", TensorRef(b16, {5}));
  t.emplace_back("f64", TensorRef(f64, {5}));
  const std::string path = dir / "conv.safetensors";
  edl::io::save_safetensors(path, t);
  const auto f = SafeTensorsFile::open(path);

  // F32 -> bf16 / f16: identical to the core conversions (RNE).
  const auto as_bf16 = f.read_vector<edl::bf16>("f32");
  const auto as_f16 = f.read_vector<edl::f16>("f32");
  for (std::size_t i = 0; i < f32.size(); ++i) {
    EXPECT_EQ(as_bf16[i].bits, edl::bf16(f32[i]).bits) << i;
    EXPECT_EQ(as_f16[i].bits, edl::f16(f32[i]).bits) << i;
  }
  EXPECT_EQ(as_bf16[0].to_float(), 1.0f);
  EXPECT_EQ(as_bf16[1].to_float(), 1.015625f);
  EXPECT_EQ(as_bf16[2].to_float(), 1.0078125f);
  // BF16 -> f32 is exact.
  const auto widened = f.read_vector<float>("bf16");
  for (std::size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(widened[i], b16[i].to_float());
  // F64 -> f32 / bf16 / f16 round once, to nearest even.
  const auto d32 = f.read_vector<float>("f64");
  const auto d16 = f.read_vector<edl::bf16>("f64");
  const auto dh = f.read_vector<edl::f16>("f64");
  for (std::size_t i = 0; i < f64.size(); ++i) EXPECT_EQ(bits(d32[i]), bits(static_cast<float>(f64[i]))) << i;
  EXPECT_EQ(d16[0].to_float(), 1.0078125f);
  EXPECT_EQ(d16[1].to_float(), -1.0078125f);
  EXPECT_EQ(d16[2].bits, edl::bf16(0.1f).bits);
  EXPECT_EQ(dh[0].to_float(), 1.00390625f);  // f16 has 10 bits: 1 + 2^-8 is exact, 2^-40 rounds off
  EXPECT_EQ(dh[3].bits, 0u);                 // 1e-30 underflows to +0 in f16
  EXPECT_EQ(dh[4].bits, 0x7c00u);            // 1e300 overflows to +Inf
  EXPECT_TRUE(std::isinf(d16[4].to_float()));
  // read_f32 keeps the shape.
  const auto a = f.read_f32("bf16");
  ASSERT_EQ(a.dimension(), 1u);
  EXPECT_EQ(a.shape()[0], 5u);
}

TEST(SafeTensors, ReadBlockEqualsTheSliceOfTheTensor) {
  // A [3, 4, 5] tensor stored as f32 and as bf16; every block read equals naive index loops
  // over the whole tensor read with read_vector.
  TempDir dir;
  std::vector<float> v(60);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.37f * static_cast<float>(i) - 7.1f;
  std::vector<edl::bf16> b;
  for (float x : v) b.push_back(edl::bf16(x));
  TensorList t;
  t.emplace_back("w", TensorRef(v, {3, 4, 5}));
  t.emplace_back("w16", TensorRef(b, {3, 4, 5}));
  t.emplace_back("flat", TensorRef(v, {60}));
  const std::string path = dir / "blocks.safetensors";
  edl::io::save_safetensors(path, t);
  const auto f = SafeTensorsFile::open(path);
  const std::vector<std::int64_t> shape = {3, 4, 5};
  for (const std::string name : {"w", "w16", "flat"}) {
    const std::vector<float> whole = f.read_vector<float>(name);
    for (const auto& [off, blk] : std::vector<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>>{
             {{0, 0, 0}, {3, 4, 5}}, {{1, 2, 0}, {2, 2, 5}}, {{0, 1, 3}, {3, 3, 2}}, {{2, 3, 4}, {1, 1, 1}}}) {
      std::vector<float> out(static_cast<std::size_t>(blk[0] * blk[1] * blk[2]));
      f.read_block<float>(name, shape, off, blk, std::span<float>(out));  // "flat" is viewed as [3, 4, 5]
      std::size_t k = 0;
      for (std::int64_t i = 0; i < blk[0]; ++i)
        for (std::int64_t j = 0; j < blk[1]; ++j)
          for (std::int64_t l = 0; l < blk[2]; ++l, ++k)
            ASSERT_EQ(out[k], whole[static_cast<std::size_t>(((off[0] + i) * 4 + off[1] + j) * 5 + off[2] + l)])
                << name << " " << i << "," << j << "," << l;
    }
  }
  // A block past the end, a view of another element count, a short destination: errors that
  // name the tensor, before any read.
  std::vector<float> out(10);
  const std::vector<std::int64_t> off = {2, 0, 0}, blk = {2, 1, 5}, small = {1, 2, 5}, other = {3, 4, 6};
  auto expect_error = [&](auto&& call, errc code) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const edl::Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.where()).find("w"), std::string::npos) << e.where();
    }
  };
  expect_error([&] { f.read_block<float>("w", shape, off, blk, std::span<float>(out)); }, errc::invalid_argument);
  expect_error([&] { f.read_block<float>("w", other, off, small, std::span<float>(out)); }, errc::shape_mismatch);
  expect_error([&] { f.read_block<float>("w", shape, off, small, std::span<float>(out.data(), 9)); },
               errc::shape_mismatch);
}

TEST(SafeTensors, ReadErrorsNameTheTensor) {
  TempDir dir;
  const std::string path = dir / "e.safetensors";
  TensorList t;
  const std::vector<std::int32_t> ids = {1, 2, 3, 4};
  const std::vector<float> w(6, 1.0f);
  t.emplace_back("w", TensorRef(w, {2, 3}));
  t.emplace_back("ids", TensorRef(ids, {4}));
  edl::io::save_safetensors(path, t);
  const auto f = SafeTensorsFile::open(path);
  std::vector<float> small(5);
  try {
    f.read_into<float>("w", small);
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::shape_mismatch);
    EXPECT_EQ(e.where(), path + " tensor w");
    EXPECT_NE(std::string(e.what()).find("holds 6 elements (2, 3), but the destination has 5"), std::string::npos)
        << e.what();
  }
  try {
    (void)f.read_f32("model.missing.weight");
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_EQ(e.where(), path + " tensor model.missing.weight");
  }
  try {
    (void)f.read_f32("ids");
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::dtype_mismatch);
    EXPECT_NE(std::string(e.what()).find("stored as I32, cannot convert to F32"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.read_vector<std::int32_t>("ids"), ids);
  EXPECT_FALSE(f.contains("x"));
  EXPECT_TRUE(f.contains("ids"));
}

TEST(SafeTensors, MissingFileIsAnIoErrorWithErrnoText) {
  TempDir dir;
  try {
    (void)SafeTensorsFile::open(dir / "nope.safetensors");
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::io);
    EXPECT_EQ(e.where(), dir / "nope.safetensors");
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ header rules

TEST(SafeTensorsHeader, EveryRuleViolationIsAFormatErrorNamingFileAndTensor) {
  TempDir dir;
  int k = 0;
  auto file = [&](const std::string& header, std::size_t data, std::optional<std::uint64_t> n = std::nullopt) {
    const std::string p = dir / ("bad" + std::to_string(k++) + ".safetensors");
    write_raw(p, header, data, n);
    return p;
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW((void)SafeTensorsFile::open(file(ok, 8)));

  {  // shorter than the 8-byte length
    const std::string p = dir / "short.safetensors";
    write_bytes(p, "\x05\x00\x00", 3);
    expect_format_error(p, "", "only 3 bytes");
  }
  expect_format_error(file(ok, 8, ok.size() + 9), "", "beyond the end of the file");   // N past the end
  expect_format_error(file(ok, 8, 1ull << 40), "", "exceeds the limit");               // absurd N
  expect_format_error(file("", 0), "", "starting with '{'");                            // empty header
  expect_format_error(file("[1,2]", 0), "", "starting with '{'");                       // not an object
  expect_format_error(file(R"({"a":{"dtype":"F32",)", 0), "", "not valid JSON");        // truncated JSON
  expect_format_error(file(R"({"a":{"dtype":"F32" "shape":[]}})", 0), "", "line 1, column");  // bad JSON
  expect_format_error(file(R"({"a":[1,2]})", 0), "a", "expected an object");
  // Found by fuzzing or by hand, each once accepted: duplicate tensor names (the last one won),
  // a tensor named "", NUL bytes as padding, deep nesting (a stack overflow when dumped), and a
  // number beyond a double (an uncaught nlohmann::out_of_range).
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
                      "", "duplicate key \"a\"");
  expect_format_error(file(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), "", "empty name");
  expect_format_error(file(ok + std::string("\0\0", 2), 8), "", "NUL byte");
  expect_format_error(file("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 0), "", "nested deeper");
  expect_format_error(file(R"({"__metadata__":{"x":"1"},"a":{"dtype":"F32","shape":[1e309],"data_offsets":[0,4]}})", 4), "",
                      "not valid JSON");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "a", "missing \"data_offsets\"");
  expect_format_error(file(R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2), "a",
                      "unknown dtype \"F8\"");
  expect_format_error(file(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8), "a", "dtype must be a string");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "a", "non-negative");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8), "a", "non-negative");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8), "a", "shape must be");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "a",
                      "needs 12 bytes, but data_offsets [0, 8] span 8");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "a",
                      "begin must not exceed end");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8), "a",
                      "data_offsets must be");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8), "a",
                      "data_offsets must be");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "a",
                      "beyond the data region of 8 bytes");
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8),
                      "a", "overflows");
  // Overlap: b starts inside a.
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                      "b", "overlap tensor a");
  // Gap (hole) between a and b.
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                           20),
                      "b", "gap of 4 bytes after tensor a");
  // Hole at the start.
  expect_format_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "a",
                      "gap of 4 bytes after the header");
  // Bytes after the last tensor.
  expect_format_error(file(ok, 12), "", "4 trailing bytes after tensor a");
  // Metadata must be strings.
  expect_format_error(file(R"({"__metadata__":{"n":3},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "",
                      "__metadata__ entry \"n\" must be a string");
  expect_format_error(file(R"({"__metadata__":[1],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "",
                      "__metadata__ must be an object");
}

TEST(SafeTensorsHeader, HeaderOrderMayDifferFromOffsetOrder) {
  TempDir dir;
  // b comes first in the JSON but second in the data: valid, names() follows the data.
  const std::string p = dir / "unsorted.safetensors";
  write_raw(p,
            R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
            R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
            R"("z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
            8);
  const auto f = SafeTensorsFile::open(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "z"}));
  EXPECT_EQ(f.info("b").begin, 4u);
}

TEST(SafeTensorsHeader, TruncatedOrScrambledFilesNeverCrash) {
  TempDir dir;
  TensorList t;
  const std::vector<float> norm(5, 1.0f);
  const std::vector<edl::bf16> head(6, edl::bf16(0.5f));
  t.emplace_back("model.norm.weight", TensorRef(norm, {5}));
  t.emplace_back("lm_head.weight", TensorRef(head, {2, 3}));
  const std::string good = dir / "good.safetensors";
  edl::io::save_safetensors(good, t, {{"format", "pt"}});
  const auto bytes = read_bytes(good);
  const std::string p = dir / "cut.safetensors";
  // Every proper prefix of the file is rejected with a format error.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(p, bytes.data(), n);
    try {
      (void)SafeTensorsFile::open(p);
      ADD_FAILURE() << "prefix of " << n << " bytes accepted";
    } catch (const edl::Error& e) {
      EXPECT_EQ(e.code(), errc::format) << n << ": " << e.what();
    }
  }
  // Every single-byte change in the length field or header either still parses to a valid file
  // or gives a format error; nothing else (no crash, no other exception).
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  for (std::size_t i = 0; i < 8 + n; ++i) {
    for (unsigned char v : {0x00, 0x22, 0x2c, 0x5d, 0x7b, 0x7d, 0xff, 0x31}) {
      auto copy = bytes;
      copy[i] = static_cast<char>(v);
      write_bytes(p, copy.data(), copy.size());
      try {
        const auto f = SafeTensorsFile::open(p);
        for (const auto& name : f.names()) (void)f.bytes(name);
      } catch (const edl::Error& e) {
        EXPECT_EQ(e.code(), errc::format) << i << ": " << e.what();
      }
    }
  }
}

// ------------------------------------------------------------------ atomic save

TEST(SafeTensorsSave, FailureMidwayKeepsTheOldFileAndLeavesNoTemp) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  const std::vector<float> v1 = {1, 2, 3, 4}, v2 = {5, 6, 7, 8};
  TensorList t1;
  t1.emplace_back("x", TensorRef(v1, {4}));
  t1.emplace_back("y", TensorRef(v1, {2, 2}));
  edl::io::save_safetensors(path, t1);

  // A writer hook that throws after the first tensor reached the temp file.
  TensorList t2;
  t2.emplace_back("x", TensorRef(v2, {4}));
  t2.emplace_back("y", TensorRef(v2, {2, 2}));
  edl::io::SaveOptions opt;
  bool temp_seen = false;
  opt.after_tensor = [&](const std::string& name) {
    temp_seen = fs::exists(path + ".tmp-" + std::to_string(::getpid()));
    if (name == "x") throw edl::Error(errc::io, path, "simulated disk full");
  };
  EXPECT_THROW(edl::io::save_safetensors(path, t2, {}, opt), edl::Error);
  EXPECT_TRUE(temp_seen) << "the save must go through a temp file";
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(SafeTensorsFile::open(path).read_vector<float>("x"), v1);

  // A tensor whose bytes disagree with its shape: refused before anything is written.
  TensorList bad;
  bad.emplace_back("x", TensorRef(v2, {4}));
  bad.emplace_back("y", TensorRef(v2, {3, 2}));
  try {
    edl::io::save_safetensors(path, bad);
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::shape_mismatch);
    EXPECT_EQ(e.where(), path + " tensor y");
  }
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(SafeTensorsFile::open(path).read_vector<float>("y"), v1);

  // Duplicate names are refused too.
  TensorList dup;
  dup.emplace_back("x", TensorRef(v2, {4}));
  dup.emplace_back("x", TensorRef(v2, {4}));
  EXPECT_THROW(edl::io::save_safetensors(path, dup), edl::Error);

  // A successful save replaces the file.
  edl::io::save_safetensors(path, t2);
  EXPECT_EQ(SafeTensorsFile::open(path).read_vector<float>("x"), v2);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model.safetensors"});
}

TEST(SafeTensorsSave, UnwritableDestinationIsAnIoError) {
  try {
    edl::io::save_safetensors("/nonexistent-dir-edl/x.safetensors", {});
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::io);
    EXPECT_EQ(e.where(), "/nonexistent-dir-edl/x.safetensors");
  }
}

// ------------------------------------------------------------------ sharded

TEST(ShardedCheckpoint, RoundTripWithATinyShardLimit) {
  TempDir dir;
  std::vector<std::vector<float>> values;
  for (int i = 0; i < 7; ++i) {
    std::vector<float> v(static_cast<std::size_t>(3 + i));
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(i * 100 + static_cast<int>(j)) + 0.25f;
    values.push_back(v);
  }
  TensorList t;
  std::vector<std::string> names;
  for (int i = 0; i < 7; ++i) {
    names.push_back("layer." + std::to_string(i) + ".weight");
    t.emplace_back(names.back(), TensorRef(values[static_cast<std::size_t>(i)], {3 + i}));
  }
  // 40-byte shards: 12+16 | 20 | 24 | 28 | 32 | 36 bytes.
  const auto written = edl::io::save_sharded(dir.path().string(), t, 40, {{"format", "pt"}});
  ASSERT_EQ(written.size(), 7u);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{
                             "model-00001-of-00006.safetensors", "model-00002-of-00006.safetensors",
                             "model-00003-of-00006.safetensors", "model-00004-of-00006.safetensors",
                             "model-00005-of-00006.safetensors", "model-00006-of-00006.safetensors",
                             "model.safetensors.index.json"}));
  std::ifstream idx_in(dir / "model.safetensors.index.json");
  const auto idx = nlohmann::json::parse(idx_in);
  EXPECT_EQ(idx["metadata"]["total_size"], 4 * (3 + 4 + 5 + 6 + 7 + 8 + 9));
  EXPECT_EQ(idx["weight_map"]["layer.0.weight"], "model-00001-of-00006.safetensors");
  EXPECT_EQ(idx["weight_map"]["layer.1.weight"], "model-00001-of-00006.safetensors");
  EXPECT_EQ(idx["weight_map"]["layer.6.weight"], "model-00006-of-00006.safetensors");

  const auto c = ShardedCheckpoint::open(dir.path().string());
  EXPECT_EQ(c.names(), names);
  EXPECT_EQ(c.files().size(), 6u);
  EXPECT_EQ(c.index_path(), dir / "model.safetensors.index.json");
  EXPECT_EQ(c.total_bytes(), 4u * (3 + 4 + 5 + 6 + 7 + 8 + 9));
  for (int i = 0; i < 7; ++i) {
    const auto& n = names[static_cast<std::size_t>(i)];
    EXPECT_EQ(c.read_vector<float>(n), values[static_cast<std::size_t>(i)]) << n;
    EXPECT_EQ(c.info(n).shape, std::vector<std::int64_t>{3 + i});
  }
  EXPECT_EQ(c.file_of("layer.2.weight"), dir / "model-00002-of-00006.safetensors");
  EXPECT_EQ(c.read_f32("layer.3.weight").size(), 6u);
  // The index file path opens the same checkpoint.
  EXPECT_EQ(ShardedCheckpoint::open(dir / "model.safetensors.index.json").names(), names);

  // Saving again with a large limit gives one model.safetensors and removes the old shards.
  edl::io::save_sharded(dir.path().string(), t, 1 << 20);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model.safetensors"});
  const auto single = ShardedCheckpoint::open(dir.path().string());
  EXPECT_EQ(single.names(), names);
  EXPECT_EQ(single.index_path(), "");
  EXPECT_EQ(single.read_vector<float>("layer.6.weight"), values[6]);
}

TEST(ShardedCheckpoint, IndexErrorsNameTensorAndFile) {
  TempDir dir;
  TensorList t;
  const std::vector<float> a = {1, 2}, b = {3, 4};
  t.emplace_back("a", TensorRef(a, {2}));
  t.emplace_back("b", TensorRef(b, {2}));
  edl::io::save_sharded(dir.path().string(), t, 8);
  const std::string index = dir / "model.safetensors.index.json";
  auto write_index = [&](const std::string& s) { std::ofstream(index, std::ios::trunc) << s; };

  write_index(R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors",
                  "b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  try {
    (void)ShardedCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_EQ(e.where(), index + " tensor c");
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors, but that file does not hold it"),
              std::string::npos)
        << e.what();
  }
  write_index(R"({"weight_map":{"a":"model-00009-of-00009.safetensors"}})");
  try {
    (void)ShardedCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::io);
    EXPECT_NE(e.where().find("model-00009-of-00009.safetensors"), std::string::npos);
  }
  write_index(R"({"weight_map":{"a":"../outside.safetensors"}})");
  try {
    (void)ShardedCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_EQ(e.where(), index + " tensor a");
  }
  write_index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors\u0000x"}})");
  try {  // a NUL inside a file name (which the OS would cut there)
    (void)ShardedCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format);
  }
  write_index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors","a":"model-00002-of-00002.safetensors"}})");
  try {
    (void)ShardedCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_NE(std::string(e.what()).find("duplicate key \"a\" in the object at /weight_map"), std::string::npos) << e.what();
  }
  write_index(R"({"weight_map": )");
  try {
    (void)ShardedCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  write_index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors"}})");
  const auto c = ShardedCheckpoint::open(dir.path().string());  // tensors not in the map are not exposed
  EXPECT_EQ(c.names(), std::vector<std::string>{"a"});
  try {
    (void)c.info("b");
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::format);
    EXPECT_EQ(e.where(), index + " tensor b");
  }
  fs::remove(index);
  fs::remove(dir / "model-00001-of-00002.safetensors");
  fs::remove(dir / "model-00002-of-00002.safetensors");
  try {
    (void)ShardedCheckpoint::open(dir.path().string());
    FAIL();
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), errc::io);
    EXPECT_NE(std::string(e.what()).find("neither model.safetensors.index.json nor model.safetensors"),
              std::string::npos);
  }
}

// ------------------------------------------------------------------ the tiny HF fixture

TEST(TinyHfFixture, TensorsMatchTheConfigAndKnownValues) {
  const std::string dir = data_dir() + "/tiny_hf";
  const auto cfg = edl::models::LlamaConfig::from_file(dir + "/config.json");
  const auto ckpt = ShardedCheckpoint::open(dir);
  const auto shapes = cfg.parameter_shapes();
  ASSERT_EQ(ckpt.names().size(), shapes.size());
  std::int64_t params = 0;
  for (const auto& [name, shape] : shapes) {
    ASSERT_TRUE(ckpt.contains(name)) << name;
    EXPECT_EQ(ckpt.info(name).dtype, DType::f32) << name;
    EXPECT_EQ(ckpt.info(name).shape, shape) << name;
    params += ckpt.info(name).numel();
  }
  EXPECT_EQ(params, cfg.parameter_count());
  EXPECT_EQ(params, 6736);
  // RMSNorm weights are ones; the matrices are N(0, 0.3) draws.
  for (const auto& [name, shape] : shapes) {
    const auto a = ckpt.read_f32(name);
    if (name.find("norm") != std::string::npos) {
      for (float v : a) EXPECT_EQ(v, 1.0f) << name;
    } else {
      double s2 = 0;
      for (float v : a) s2 += double(v) * v;
      const double std_dev = std::sqrt(s2 / double(a.size()));
      EXPECT_GT(std_dev, 0.2) << name;
      EXPECT_LT(std_dev, 0.4) << name;
    }
  }
  // Values read by the oracle's own numpy reader when the fixture was made.
  const auto k = ckpt.read_vector<float>("model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(k[0], 0x1.7325d4p-4f);
  EXPECT_EQ(k[1], 0x1.dedf9p-5f);
  EXPECT_EQ(k[2], 0x1.dd8a88p-3f);
  double sum = 0;
  for (float v : k) sum += v;
  EXPECT_NEAR(sum, 1.8878779516089708, 1e-12);
  // Oracle outputs: logits [2, 8, 64] f32 for tokens [2, 8] int64; a gradient for every parameter.
  const auto tokens = edl::io::load_npy<std::int64_t>(dir + "/oracle/tokens.npy");
  ASSERT_EQ(tokens.shape(), (std::vector<std::size_t>{2, 8}));
  EXPECT_EQ(tokens(0, 0), 54);
  EXPECT_EQ(tokens(1, 7), 46);
  const auto logits = edl::io::load_npy<float>(dir + "/oracle/logits.npy");
  EXPECT_EQ(logits.shape(), (std::vector<std::size_t>{2, 8, 64}));
  EXPECT_EQ(logits(0, 0, 0), 1.3400594f);
  EXPECT_THROW((void)edl::io::load_npy<double>(dir + "/oracle/logits.npy"), edl::Error);
  const auto grads = SafeTensorsFile::open(dir + "/oracle/grads.safetensors");
  for (const auto& [name, shape] : shapes) EXPECT_EQ(grads.info(name).shape, shape) << name;
}

}  // namespace
