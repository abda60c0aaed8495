#include <edl/io/gguf.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using edl::errc;
using edl::io::GgmlType;
using edl::io::GgufFile;
using edl::io::GgufSink;
using edl::io::GgufValueType;
using edl::io::GgufWriter;

/// A fresh folder per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("edl_gguf_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path_)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
void patch(std::string& bytes, std::size_t pos, T v) {
  ASSERT_LE(pos + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + pos, &v, sizeof(T));
}
template <class T>
T peek(const std::string& bytes, std::size_t pos) {
  T v{};
  std::memcpy(&v, bytes.data() + pos, sizeof(T));
  return v;
}

/// The position just after the GGUF string `s` (u64 length, then the bytes) in `bytes`.
std::size_t after_string(const std::string& bytes, std::string_view s) {
  std::string enc(8, '\0');
  const std::uint64_t n = s.size();
  std::memcpy(enc.data(), &n, 8);
  enc += s;
  const auto pos = bytes.find(enc);
  EXPECT_NE(pos, std::string::npos) << "string '" << s << "' not in the file";
  EXPECT_EQ(bytes.find(enc, pos + 1), std::string::npos) << "string '" << s << "' twice in the file";
  return pos + enc.size();
}
/// Where the GGUF string `s` starts (its length field).
std::size_t at_string(const std::string& bytes, std::string_view s) { return after_string(bytes, s) - 8 - s.size(); }

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

/// A small valid file: keys of several types and three tensors (F32, F16 (2-D), Q8_0).
/// Tensor bytes live in static storage so the writer's spans stay valid.
GgufWriter small_writer() {
  static const std::vector<std::byte> a = pattern(4 * 4 * 2, 1), b = pattern(2 * 8 * 3, 2), q = pattern(34 * 2, 3);
  GgufWriter w;
  w.add_string("general.architecture", "llama")
      .add_u32("llama.block_count", 2)
      .add_string("k.one", "x")
      .add_string("k.two", "y")
      .add_f32("llama.rope.freq_base", 10000.0f)
      .add_string_array("tokenizer.ggml.tokens", {"<s>", "</s>", "hi"})
      .add_f32_array("tokenizer.ggml.scores", {0.0f, -1.0f, -2.5f})
      .add_i32_array("tokenizer.ggml.token_type", {3, 3, 1});
  w.add_tensor("a.weight", GgmlType::F32, {4, 2}, std::span<const std::byte>(a));
  w.add_tensor("b.weight", GgmlType::F16, {8, 3}, std::span<const std::byte>(b));
  w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, {64}, std::span<const std::byte>(q));
  return w;
}

std::string small_file_bytes(const TempDir& dir) {
  const std::string path = dir / "valid.gguf";
  small_writer().write(path);
  return read_bytes(path);
}

/// Opening `bytes` (written to a file) must throw errc::format whose message names the file
/// and holds every part of `parts`.
void expect_format_error(const TempDir& dir, const std::string& bytes, std::initializer_list<std::string_view> parts,
                         const std::string& file = "bad.gguf") {
  const std::string path = dir / file;
  write_bytes(path, bytes);
  try {
    (void)GgufFile::open(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const edl::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), errc::format) << what;
    EXPECT_NE(what.find(path), std::string::npos) << what;
    for (auto p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

/// Expects `fn` to throw edl::Error with code `code` and a message holding each of `parts`.
template <class Fn>
void expect_error(errc code, Fn&& fn, std::initializer_list<std::string_view> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const edl::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), code) << what;
    for (auto p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

// ------------------------------------------------------------------ ggml types

TEST(GgmlType, BlockTableMatchesGgml) {
  using edl::io::ggml_block_bytes;
  using edl::io::ggml_block_size;
  EXPECT_EQ(ggml_block_size(GgmlType::F32), 1u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::F32), 4u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::F16), 2u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::BF16), 2u);
  EXPECT_EQ(ggml_block_size(GgmlType::Q4_0), 32u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q4_0), 18u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q4_1), 20u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q5_0), 22u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q5_1), 24u);
  EXPECT_EQ(ggml_block_size(GgmlType::Q8_0), 32u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q8_0), 34u);
  EXPECT_EQ(ggml_block_size(GgmlType::Q4_K), 256u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q4_K), 144u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::Q6_K), 210u);
  for (std::uint32_t id : {0u, 1u, 2u, 3u, 6u, 7u, 8u, 10u, 11u, 12u, 13u, 14u, 15u, 30u})
    EXPECT_TRUE(edl::io::is_known_ggml_type(id)) << id;
  for (std::uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 39u, 1000u}) EXPECT_FALSE(edl::io::is_known_ggml_type(id)) << id;
  EXPECT_EQ(edl::io::ggml_type_name(GgmlType::Q8_0), "Q8_0");
  EXPECT_EQ(edl::io::ggml_type_name(static_cast<GgmlType>(4)), "unknown");
}

// ------------------------------------------------------------------ round trips

TEST(GgufFile, RoundTripsMetadataOfEveryType) {
  TempDir dir;
  const std::string path = dir / "meta.gguf";
  GgufWriter w;
  w.add_string("s", "héllo")
      .add_string("empty", "")
      .add_u32("u32", 4000000000u)
      .add_i32("i32", -7)
      .add_f32("f32", 1e-5f)
      .add_bool("yes", true)
      .add_bool("no", false)
      .add_u64("u64", 1ull << 40)
      .add_i64("i64", -(1ll << 40))
      .add_f64("f64", 1.0 / 3.0)
      .add_u8("u8", 200)
      .add_i8("i8", -100)
      .add_u16("u16", 60000)
      .add_i16("i16", -30000)
      .add_string_array("strs", {"a", "", "ccc"})
      .add_i32_array("i32s", {1, -2, 3})
      .add_u32_array("u32s", {7, 8})
      .add_f32_array("f32s", {0.5f, -1.5f})
      .add_f32_array("none", {});
  const std::uint64_t written = w.write(path);
  EXPECT_EQ(written, fs::file_size(path));

  const auto f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_FALSE(f.has("general.alignment")) << "written only if set";
  EXPECT_TRUE(f.tensors().empty());
  ASSERT_EQ(f.kvs().size(), 19u);
  EXPECT_EQ(f.kvs()[0].key, "s");
  EXPECT_EQ(f.kvs()[18].key, "none");
  EXPECT_EQ(f.get_string("s"), "héllo");
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.get_u32("u32"), 4000000000u);
  EXPECT_EQ(f.get_i32("i32"), -7);
  EXPECT_EQ(f.get_f32("f32"), 1e-5f);
  EXPECT_TRUE(f.get_bool("yes"));
  EXPECT_FALSE(f.get_bool("no"));
  EXPECT_EQ(f.get_u64("u64"), 1ull << 40);
  EXPECT_EQ(f.get_i64("i64"), -(1ll << 40));
  EXPECT_EQ(f.get_f64("f64"), 1.0 / 3.0);
  EXPECT_EQ(f.get_f32("f64"), static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(f.get_u32("u8"), 200u);
  EXPECT_EQ(f.get_i32("i8"), -100);
  EXPECT_EQ(f.get_u32("u16"), 60000u);
  EXPECT_EQ(f.get_i64("i16"), -30000);
  EXPECT_EQ(f.get_string_array("strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_i32_array("i32s"), (std::vector<std::int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_i32_array("u32s"), (std::vector<std::int32_t>{7, 8}));
  EXPECT_EQ(f.get_int_array<std::uint64_t>("u32s"), (std::vector<std::uint64_t>{7, 8}));
  EXPECT_EQ(f.get_f32_array("f32s"), (std::vector<float>{0.5f, -1.5f}));
  EXPECT_TRUE(f.get_f32_array("none").empty());

  const auto* kv = f.find("strs");
  ASSERT_NE(kv, nullptr);
  EXPECT_TRUE(kv->is_array());
  EXPECT_EQ(kv->array_type, GgufValueType::String);
  EXPECT_EQ(kv->array_size, 3u);
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_TRUE(f.has("u8"));
  EXPECT_FALSE(f.has("nope"));
}

TEST(GgufFile, IntegerGettersTakeAnyIntegerTypeThatFits) {
  TempDir dir;
  const std::string path = dir / "ints.gguf";
  GgufWriter w;
  w.add_i32("neg", -1).add_u64("big", 1ull << 33).add_i64("small", 5).add_i32_array("mixed", {1, -1});
  w.write(path);
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f.get_u32("small"), 5u);
  EXPECT_EQ(f.get_i32("small"), 5);
  EXPECT_EQ(f.get_u64("big"), 1ull << 33);
  EXPECT_EQ(f.get_i64("neg"), -1);
  expect_error(errc::config, [&] { (void)f.get_u32("neg"); }, {path, "key 'neg'", "-1", "does not fit in u32"});
  expect_error(errc::config, [&] { (void)f.get_i32("big"); }, {path, "key 'big'", "8589934592", "i32"});
  expect_error(errc::config, [&] { (void)f.get_int_array<std::uint32_t>("mixed"); },
               {path, "key 'mixed'", "element 1", "u32"});
}

TEST(GgufFile, MissingKeyOrWrongTypeNamesTheKey) {
  TempDir dir;
  const std::string path = dir / "types.gguf";
  GgufWriter w;
  w.add_string("name", "x").add_u32("n", 3).add_f32("eps", 1e-6f).add_i32_array("ids", {1});
  w.write(path);
  const auto f = GgufFile::open(path);
  expect_error(errc::config, [&] { (void)f.get_u32("llama.block_count"); },
               {path, "key 'llama.block_count'", "missing"});
  expect_error(errc::config, [&] { (void)f.at("nope"); }, {path, "key 'nope'", "missing"});
  expect_error(errc::config, [&] { (void)f.get_u32("name"); }, {path, "key 'name'", "stored as string", "integer"});
  expect_error(errc::config, [&] { (void)f.get_string("n"); }, {path, "key 'n'", "stored as u32", "expected string"});
  expect_error(errc::config, [&] { (void)f.get_f32("n"); }, {path, "key 'n'", "stored as u32"});
  expect_error(errc::config, [&] { (void)f.get_bool("eps"); }, {path, "key 'eps'", "stored as f32", "bool"});
  expect_error(errc::config, [&] { (void)f.get_u32("ids"); }, {path, "key 'ids'", "array of i32 (1 elements)"});
  expect_error(errc::config, [&] { (void)f.get_f32_array("ids"); }, {path, "key 'ids'", "array of f32"});
  expect_error(errc::config, [&] { (void)f.get_string_array("name"); }, {path, "key 'name'", "array of string"});
}

TEST(GgufFile, RoundTripsTensorsOfEachType) {
  TempDir dir;
  const std::string path = dir / "tensors.gguf";
  std::vector<float> f32(5 * 3);
  for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = 0.25f * static_cast<float>(i) - 1.0f;
  const auto f16 = pattern(8 * 2 * 2, 7);        // raw halves, dims {8, 2}
  const auto q8 = pattern(34 * 2 * 3, 8);        // Q8_0, dims {64, 3}: 2 blocks a row
  const auto bf = pattern(2 * 6, 9);             // BF16, dims {6}
  const auto q4 = pattern(18 * 1 * 2 * 2, 10);   // Q4_0, dims {32, 2, 2}
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_tensor("token_embd.weight", GgmlType::F32, {5, 3}, std::as_bytes(std::span<const float>(f32)));
  w.add_tensor("blk.0.attn_norm.weight", GgmlType::F16, {8, 2}, std::span<const std::byte>(f16));
  w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, {64, 3}, std::span<const std::byte>(q8));
  w.add_tensor("bf", GgmlType::BF16, {6}, std::span<const std::byte>(bf));
  w.add_tensor("q4", GgmlType::Q4_0, {32, 2, 2}, std::span<const std::byte>(q4));
  w.write(path);

  const auto f = GgufFile::open(path);
  ASSERT_EQ(f.tensors().size(), 5u);
  struct Want {
    const char* name;
    GgmlType type;
    std::vector<std::int64_t> dims;
    std::span<const std::byte> bytes;
  };
  const std::vector<Want> want = {
      {"token_embd.weight", GgmlType::F32, {5, 3}, std::as_bytes(std::span<const float>(f32))},
      {"blk.0.attn_norm.weight", GgmlType::F16, {8, 2}, f16},
      {"blk.0.attn_q.weight", GgmlType::Q8_0, {64, 3}, q8},
      {"bf", GgmlType::BF16, {6}, bf},
      {"q4", GgmlType::Q4_0, {32, 2, 2}, q4},
  };
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto& t = f.tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, want[i].name) << "file order";
    EXPECT_EQ(t.type, want[i].type);
    EXPECT_EQ(t.dims, want[i].dims);
    EXPECT_EQ(t.nbytes, want[i].bytes.size());
    EXPECT_EQ(t.offset % 32, 0u);
    EXPECT_EQ((f.data_offset() + t.offset) % 32, 0u);
    ASSERT_EQ(t.bytes().size(), want[i].bytes.size());
    EXPECT_EQ(std::memcmp(t.bytes().data(), want[i].bytes.data(), t.nbytes), 0);
    EXPECT_EQ(f.data_of(t.name).data(), t.data);
    EXPECT_EQ(&f.tensor(t.name), &t);
  }
  EXPECT_EQ(f.tensor("q4").numel, 128u);
  EXPECT_EQ(f.tensor("q4").shape(), (std::vector<std::int64_t>{2, 2, 32}));
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").numel, 192u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.file_bytes() % 32, 0u) << "every tensor is padded to the alignment, the last too";
  EXPECT_TRUE(f.has_tensor("bf"));
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  expect_error(errc::format, [&] { (void)f.tensor("output.weight"); },
               {path, "tensor 'output.weight'", "no such tensor", "5 tensors"});
  expect_error(errc::format, [&] { (void)f.data_of("output.weight"); }, {path, "tensor 'output.weight'"});

  // A moved file keeps its spans.
  const std::byte* p = f.tensors()[0].data;
  GgufFile g = GgufFile::open(path);
  GgufFile h = std::move(g);
  EXPECT_EQ(std::memcmp(h.data_of("token_embd.weight").data(), p, 60), 0);
}

TEST(GgufFile, HonoursASetAlignment) {
  TempDir dir;
  const std::string path = dir / "align.gguf";
  const auto a = pattern(4 * 3, 1), b = pattern(4 * 5, 2);
  GgufWriter w;
  w.set_alignment(64).add_string("general.name", "x");
  w.add_tensor("a", GgmlType::F32, {3}, std::span<const std::byte>(a));
  w.add_tensor("b", GgmlType::F32, {5}, std::span<const std::byte>(b));
  w.write(path);
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.get_u32("general.alignment"), 64u);
  EXPECT_EQ(f.find("general.alignment")->type, GgufValueType::U32);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensor("a").offset, 0u);
  EXPECT_EQ(f.tensor("b").offset, 64u);
  EXPECT_EQ(std::memcmp(f.data_of("b").data(), b.data(), b.size()), 0);
}

TEST(GgufFile, ReadsVersion2) {
  TempDir dir;
  std::string bytes = small_file_bytes(dir);
  patch<std::uint32_t>(bytes, 4, 2);
  const std::string path = dir / "v2.gguf";
  write_bytes(path, bytes);
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), 3u);
}

TEST(GgufFile, WriterStreamsTensorsFromACallback) {
  TempDir dir;
  const std::string path = dir / "cb.gguf";
  const auto bytes = pattern(34 * 4, 5);  // Q8_0 {128}
  GgufWriter w;
  w.add_tensor("q", GgmlType::Q8_0, {128}, [&](GgufSink& sink) {
    EXPECT_EQ(sink.remaining(), bytes.size());
    sink.write(std::span<const std::byte>(bytes).first(50));
    sink.write(std::span<const std::byte>(bytes).subspan(50));
  });
  EXPECT_EQ(w.tensor_bytes("q"), bytes.size());
  w.write(path);
  const auto f = GgufFile::open(path);
  ASSERT_EQ(f.data_of("q").size(), bytes.size());
  EXPECT_EQ(std::memcmp(f.data_of("q").data(), bytes.data(), bytes.size()), 0);
}

TEST(GgufWriter, AFailedWriteLeavesTheOldFileAndNoTempFile) {
  TempDir dir;
  const std::string path = dir / "model.gguf";
  small_writer().write(path);
  const std::string before = read_bytes(path);

  const auto good = pattern(4 * 4, 1);
  auto attempt = [&](std::function<void(GgufSink&)> fill) {
    GgufWriter w;
    w.add_string("general.name", "new");
    w.add_tensor("good", GgmlType::F32, {4}, std::span<const std::byte>(good));
    w.add_tensor("streamed", GgmlType::F32, {8}, std::move(fill));
    w.write(path);
  };
  // The callback throws midway.
  EXPECT_THROW(attempt([](GgufSink& s) {
                 s.write(std::as_bytes(std::span<const float>(std::vector<float>(4).data(), 4)));
                 throw std::runtime_error("disk full (simulated)");
               }),
               std::runtime_error);
  // The callback writes too few bytes.
  expect_error(errc::invalid_argument, [&] { attempt([](GgufSink&) {}); },
               {path, "tensor 'streamed'", "wrote 0 bytes", "32"});
  // The callback writes too many bytes.
  expect_error(errc::invalid_argument, [&] {
    attempt([](GgufSink& s) {
      const std::vector<float> v(9);
      s.write(std::span<const float>(v));
    });
  }, {path, "tensor 'streamed'", "36 bytes", "32"});
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"model.gguf"});
  EXPECT_NO_THROW((void)GgufFile::open(path));
}

TEST(GgufWriter, RejectsBadTensorsAndKeys) {
  const auto b = pattern(64, 1);
  const std::span<const std::byte> s(b);
  GgufWriter w;
  w.add_u32("n", 1);
  w.add_tensor("t", GgmlType::F32, {16}, s);
  expect_error(errc::invalid_argument, [&] { w.add_u32("n", 2); }, {"key 'n'", "added twice"});
  expect_error(errc::invalid_argument, [&] { w.add_tensor("t", GgmlType::F32, {16}, s); }, {"tensor 't'", "twice"});
  expect_error(errc::shape_mismatch, [&] { w.add_tensor("u", GgmlType::F32, {15}, s); },
               {"tensor 'u'", "need 60 bytes", "64 were given"});
  expect_error(errc::invalid_argument, [&] { w.add_tensor("q", GgmlType::Q8_0, {16}, s); },
               {"tensor 'q'", "not a multiple of the Q8_0 block size 32"});
  expect_error(errc::invalid_argument, [&] { w.add_tensor("d", GgmlType::F32, {1, 1, 1, 1, 16}, s); },
               {"tensor 'd'", "5 dims"});
  expect_error(errc::invalid_argument, [&] { w.add_tensor("z", GgmlType::F32, {}, s); }, {"tensor 'z'", "0 dims"});
  expect_error(errc::invalid_argument, [&] { w.add_tensor("n", GgmlType::F32, {-1}, s); }, {"tensor 'n'", "negative"});
  expect_error(errc::invalid_argument, [&] { w.add_tensor("x", static_cast<GgmlType>(4), {16}, s); },
               {"tensor 'x'", "unknown ggml type id 4"});
  expect_error(errc::invalid_argument, [&] { w.set_alignment(48); }, {"general.alignment", "power of two"});
  expect_error(errc::invalid_argument, [&] { w.set_alignment(0); }, {"general.alignment"});
  expect_error(errc::invalid_argument, [&] { w.add_u64("general.alignment", 64); }, {"general.alignment", "u32"});
  w.add_u32("general.alignment", 16).set_alignment(128);  // the last value wins, one key
  EXPECT_EQ(w.alignment(), 128u);
  EXPECT_EQ(w.num_kvs(), 2u);
  EXPECT_EQ(w.num_tensors(), 1u);
}

// ------------------------------------------------------------------ malformed files

TEST(GgufFile, EveryTruncationIsAnErrorNotACrash) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  std::uint64_t data_end = 0;
  {
    const std::string path = dir / "full.gguf";
    write_bytes(path, bytes);
    const auto f = GgufFile::open(path);
    for (const auto& t : f.tensors()) data_end = std::max(data_end, f.data_offset() + t.offset + t.nbytes);
  }
  ASSERT_GT(data_end, 0u);
  ASSERT_LE(data_end, bytes.size());
  const std::string path = dir / "cut.gguf";
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    SCOPED_TRACE(n);
    write_bytes(path, std::string_view(bytes).substr(0, n));
    if (n < data_end) {
      try {
        (void)GgufFile::open(path);
        ADD_FAILURE() << "no error for a file cut at " << n << " of " << bytes.size() << " bytes";
      } catch (const edl::Error& e) {
        EXPECT_EQ(e.code(), errc::format) << e.what();
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      }
    } else {
      EXPECT_NO_THROW((void)GgufFile::open(path)) << "only the padding after the last tensor is missing";
    }
  }
  // The first fields name themselves.
  expect_format_error(dir, "", {"magic"});
  expect_format_error(dir, bytes.substr(0, 6), {"version", "needs 4 bytes at offset 4"});
  expect_format_error(dir, bytes.substr(0, 12), {"n_tensors"});
  expect_format_error(dir, bytes.substr(0, 20), {"n_kv"});
  expect_format_error(dir, bytes.substr(0, 30), {"n_kv: 8 key/values", "6 bytes remain"});
}

TEST(GgufFile, CorruptBytesAreErrorsNotCrashes) {
  // Overwrite each header byte with a few values: the reader may accept the result (a changed
  // character in a name) but must never fail other than by edl::Error.
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const std::string path = dir / "flip.gguf";
  std::size_t errors = 0;
  const std::size_t header = at_string(bytes, "blk.0.attn_q.weight") + 8 + 19 + 4 + 8 + 4 + 8;
  for (std::size_t i = 0; i < header; ++i)
    for (unsigned char v : {0x00, 0x80, 0xff}) {
      std::string b = bytes;
      if (static_cast<unsigned char>(b[i]) == v) continue;
      b[i] = static_cast<char>(v);
      write_bytes(path, b);
      try {
        (void)GgufFile::open(path);
      } catch (const edl::Error& e) {
        ++errors;
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      }
    }
  EXPECT_GT(errors, 0u);
}

TEST(GgufFile, RejectsABadMagic) {
  TempDir dir;
  std::string bytes = small_file_bytes(dir);
  bytes[3] = 'L';
  expect_format_error(dir, bytes, {"magic", "expected \"GGUF\"", "'GGUL'"});
}

TEST(GgufFile, RejectsUnsupportedVersions) {
  TempDir dir;
  std::string bytes = small_file_bytes(dir);
  for (std::uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    patch<std::uint32_t>(bytes, 4, v);
    expect_format_error(dir, bytes, {"version: " + std::to_string(v), "not supported"});
  }
  patch<std::uint32_t>(bytes, 4, 0x03000000u);
  expect_format_error(dir, bytes, {"version", "big-endian"});
}

TEST(GgufFile, RejectsCountsPastTheEndBeforeAllocating) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  for (std::uint64_t n : {std::uint64_t{1000}, std::uint64_t{1} << 40, ~std::uint64_t{0}}) {
    std::string b = bytes;
    patch<std::uint64_t>(b, 8, n);
    expect_format_error(dir, b, {"n_tensors: " + std::to_string(n), "pass the end of the file"});
    b = bytes;
    patch<std::uint64_t>(b, 16, n);
    expect_format_error(dir, b, {"n_kv: " + std::to_string(n), "pass the end of the file"});
  }
  // Counts that fit the bytes but not the contents: tensor infos or data read as keys.
  for (std::uint64_t n : {9u, 12u, 20u}) {
    std::string b = bytes;
    patch<std::uint64_t>(b, 16, n);
    expect_format_error(dir, b, {});
  }
}

TEST(GgufFile, RejectsStringLengthsPastTheEnd) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  for (std::uint64_t n : {std::uint64_t{1} << 20, std::uint64_t{1} << 62, ~std::uint64_t{0}}) {
    std::string b = bytes;
    patch<std::uint64_t>(b, at_string(bytes, "general.architecture"), n);  // key #0's length
    expect_format_error(dir, b, {"key #0", "string length " + std::to_string(n), "passes the end of the file"});
    b = bytes;
    patch<std::uint64_t>(b, at_string(bytes, "llama"), n);  // a string value
    expect_format_error(dir, b, {"key 'general.architecture'", "passes the end of the file"});
    b = bytes;
    patch<std::uint64_t>(b, at_string(bytes, "hi"), n);  // a string in an array
    expect_format_error(dir, b, {"key 'tokenizer.ggml.tokens'[2]", "passes the end of the file"});
    b = bytes;
    patch<std::uint64_t>(b, at_string(bytes, "b.weight"), n);  // tensor #1's name
    expect_format_error(dir, b, {"tensor #1 name", "passes the end of the file"});
  }
}

TEST(GgufFile, RejectsArrayLengthsPastTheEnd) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  // Array value: u32 type (9), u32 element type, u64 count.
  const std::size_t strings = after_string(bytes, "tokenizer.ggml.tokens") + 8;
  const std::size_t floats = after_string(bytes, "tokenizer.ggml.scores") + 8;
  ASSERT_EQ(peek<std::uint64_t>(bytes, strings), 3u);
  ASSERT_EQ(peek<std::uint64_t>(bytes, floats), 3u);
  for (std::uint64_t n : {std::uint64_t{1} << 20, std::uint64_t{1} << 61, ~std::uint64_t{0}}) {
    std::string b = bytes;
    patch<std::uint64_t>(b, strings, n);
    expect_format_error(dir, b, {"key 'tokenizer.ggml.tokens'", "array of " + std::to_string(n) + " string",
                                 "passes the end of the file"});
    b = bytes;
    patch<std::uint64_t>(b, floats, n);
    expect_format_error(dir, b, {"key 'tokenizer.ggml.scores'", "array of " + std::to_string(n) + " f32",
                                 "passes the end of the file"});
  }
}

TEST(GgufFile, RejectsUnknownValueTypesAndNestedArrays) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const std::size_t type = after_string(bytes, "llama.block_count");
  ASSERT_EQ(peek<std::uint32_t>(bytes, type), 4u);
  for (std::uint32_t t : {13u, 100u, 0xffffffffu}) {
    std::string b = bytes;
    patch<std::uint32_t>(b, type, t);
    expect_format_error(dir, b, {"key 'llama.block_count'", "unknown value type " + std::to_string(t)});
  }
  const std::size_t elem = after_string(bytes, "tokenizer.ggml.token_type") + 4;
  ASSERT_EQ(peek<std::uint32_t>(bytes, elem), 5u);
  std::string b = bytes;
  patch<std::uint32_t>(b, elem, 13);
  expect_format_error(dir, b, {"key 'tokenizer.ggml.token_type'", "unknown array element type 13"});
  patch<std::uint32_t>(b, elem, 9);
  expect_format_error(dir, b, {"key 'tokenizer.ggml.token_type'", "nested arrays"});
}

TEST(GgufFile, RejectsDuplicateKeys) {
  TempDir dir;
  std::string bytes = small_file_bytes(dir);
  const std::size_t k2 = after_string(bytes, "k.two") - 3;
  bytes.replace(k2, 3, "one");
  expect_format_error(dir, bytes, {"key 'k.one'", "duplicate key", "key #2 and key #3"});
}

TEST(GgufFile, RejectsABadAlignment) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.set_alignment(64);
  w.write(dir / "a64.gguf");
  const std::string bytes = read_bytes(dir / "a64.gguf");
  const std::size_t type = after_string(bytes, "general.alignment");
  ASSERT_EQ(peek<std::uint32_t>(bytes, type + 4), 64u);
  for (std::uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
    std::string b = bytes;
    patch<std::uint32_t>(b, type + 4, a);
    expect_format_error(dir, b, {"key 'general.alignment'", "alignment " + std::to_string(a), "power of two"});
  }
  std::string b = bytes;
  patch<std::uint32_t>(b, type, static_cast<std::uint32_t>(GgufValueType::F32));
  expect_format_error(dir, b, {"key 'general.alignment'", "stored as f32", "integer"});
  // Another integer type with a power-of-two value is accepted.
  b = bytes;
  patch<std::uint32_t>(b, type, static_cast<std::uint32_t>(GgufValueType::I32));
  write_bytes(dir / "i32.gguf", b);
  EXPECT_EQ(GgufFile::open(dir / "i32.gguf").alignment(), 64u);
}

/// Positions of a tensor info's fields in `bytes` (the info of the tensor named `name`).
struct InfoPos {
  std::size_t n_dims, ne0, type, offset;
};
InfoPos info_pos(const std::string& bytes, std::string_view name) {
  InfoPos p{};
  p.n_dims = after_string(bytes, name);
  p.ne0 = p.n_dims + 4;
  p.type = p.ne0 + 8 * peek<std::uint32_t>(bytes, p.n_dims);
  p.offset = p.type + 4;
  return p;
}

TEST(GgufFile, RejectsBadDimCounts) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const auto p = info_pos(bytes, "b.weight");
  for (std::uint32_t n : {0u, 5u, 1000u, 0xffffffffu}) {
    std::string b = bytes;
    patch<std::uint32_t>(b, p.n_dims, n);
    expect_format_error(dir, b, {"tensor 'b.weight'", "n_dims = " + std::to_string(n), "1 to 4"});
  }
}

TEST(GgufFile, RejectsNegativeAndOverflowingDims) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const auto p = info_pos(bytes, "b.weight");  // F16 {8, 3}
  std::string b = bytes;
  patch<std::int64_t>(b, p.ne0 + 8, -3);
  expect_format_error(dir, b, {"tensor 'b.weight'", "ne[1] = -3 is negative"});
  b = bytes;
  patch<std::int64_t>(b, p.ne0, std::int64_t{1} << 32);
  patch<std::int64_t>(b, p.ne0 + 8, std::int64_t{1} << 32);
  expect_format_error(dir, b, {"tensor 'b.weight'", "overflow"});
  // The element count fits in 63 bits but the byte count does not (F16: 2 bytes each).
  b = bytes;
  patch<std::int64_t>(b, p.ne0, std::int64_t{1} << 31);
  patch<std::int64_t>(b, p.ne0 + 8, std::int64_t{1} << 31);
  expect_format_error(dir, b, {"tensor 'b.weight'", "bytes (overflow)"});
}

TEST(GgufFile, RejectsUnknownGgmlTypes) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const auto p = info_pos(bytes, "a.weight");
  for (std::uint32_t t : {4u, 5u, 31u, 33u, 36u, 39u, 0xffffffffu}) {
    std::string b = bytes;
    patch<std::uint32_t>(b, p.type, t);
    expect_format_error(dir, b, {"tensor 'a.weight'", "unknown ggml type id " + std::to_string(t)});
  }
}

TEST(GgufFile, RejectsRowsThatAreNotWholeBlocks) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const auto p = info_pos(bytes, "blk.0.attn_q.weight");  // Q8_0 {64}
  std::string b = bytes;
  patch<std::int64_t>(b, p.ne0, 48);
  expect_format_error(dir, b, {"tensor 'blk.0.attn_q.weight'", "ne[0] = 48", "Q8_0 block size 32"});
  // F32 {4, 2} read as Q4_0: 4 is not a multiple of 32.
  const auto a = info_pos(bytes, "a.weight");
  b = bytes;
  patch<std::uint32_t>(b, a.type, 2);
  expect_format_error(dir, b, {"tensor 'a.weight'", "Q4_0 block size 32"});
}

TEST(GgufFile, RejectsMisalignedOffsets) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const auto p = info_pos(bytes, "b.weight");
  std::string b = bytes;
  const auto off = peek<std::uint64_t>(bytes, p.offset);
  patch<std::uint64_t>(b, p.offset, off + 4);
  expect_format_error(dir, b, {"tensor 'b.weight'", "offset " + std::to_string(off + 4),
                               "not a multiple of general.alignment 32"});
}

TEST(GgufFile, RejectsDataPastTheEndOfTheFile) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  const auto p = info_pos(bytes, "blk.0.attn_q.weight");
  std::string b = bytes;
  patch<std::uint64_t>(b, p.offset, std::uint64_t{1} << 40);
  expect_format_error(dir, b, {"tensor 'blk.0.attn_q.weight': data [", "passes the end of the file (" +
                                                                          std::to_string(bytes.size()) + " bytes)"});
  b = bytes;
  patch<std::uint64_t>(b, p.offset, ~std::uint64_t{31});  // aligned, but offset + size overflows
  expect_format_error(dir, b, {"tensor 'blk.0.attn_q.weight'", "overflows 64 bits"});
  // The last tensor's data cut short by one byte.
  const std::string path = dir / "full.gguf";
  write_bytes(path, bytes);
  const auto f = GgufFile::open(path);
  const auto& t = f.tensor("blk.0.attn_q.weight");
  const std::uint64_t end = f.data_offset() + t.offset + t.nbytes;
  expect_format_error(dir, bytes.substr(0, end - 1),
                      {"tensor 'blk.0.attn_q.weight': data [" + std::to_string(end - t.nbytes) + ", " +
                           std::to_string(end) + ") passes the end of the file (" + std::to_string(end - 1) +
                           " bytes)"});
}

TEST(GgufFile, RejectsOverlappingTensors) {
  TempDir dir;
  const std::string bytes = small_file_bytes(dir);
  // b.weight (48 bytes at 32) moved to offset 0, onto a.weight (32 bytes at 0).
  std::string b = bytes;
  patch<std::uint64_t>(b, info_pos(bytes, "b.weight").offset, 0);
  expect_format_error(dir, b, {"tensor 'b.weight'", "overlaps tensor 'a.weight'"});
  // a.weight moved onto the second half of b.weight (which spans [32, 80)).
  b = bytes;
  ASSERT_EQ(peek<std::uint64_t>(bytes, info_pos(bytes, "b.weight").offset), 32u);
  patch<std::uint64_t>(b, info_pos(bytes, "a.weight").offset, 64);
  expect_format_error(dir, b, {"tensor 'a.weight'", "overlaps tensor 'b.weight'"});
}

TEST(GgufFile, RejectsDuplicateTensorNames) {
  TempDir dir;
  std::string bytes = small_file_bytes(dir);
  const std::size_t name = after_string(bytes, "b.weight") - 8;
  bytes[name] = 'a';
  expect_format_error(dir, bytes, {"tensor 'a.weight'", "duplicate tensor name", "tensor #0 and tensor #1"});
}

TEST(GgufFile, QuotesUnprintableNames) {
  TempDir dir;
  std::string bytes = small_file_bytes(dir);
  const auto p = info_pos(bytes, "a.weight");
  bytes[p.n_dims - 1] = '\n';  // a.weigh\n
  patch<std::uint32_t>(bytes, p.type, 4);
  expect_format_error(dir, bytes, {"tensor 'a.weigh\\x0a'", "unknown ggml type id 4"});
}

TEST(GgufFile, MissingFileIsAnIoError) {
  TempDir dir;
  expect_error(errc::io, [&] { (void)GgufFile::open(dir / "none.gguf"); }, {"none.gguf"});
}

}  // namespace
