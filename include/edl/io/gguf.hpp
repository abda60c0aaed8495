// edl/io/gguf.hpp
// Reading and writing GGUF files (llama.cpp's checkpoint format), versions 2 and 3.
//
// File layout (all little-endian; the layout of ggml's gguf.h):
//   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x      { string key | u32 value type | value }
//   n_tensors x { string name | u32 n_dims | n_dims x u64 ne | u32 ggml type | u64 offset }
//   zero padding up to a multiple of general.alignment (default 32), then the data section:
//   each tensor's bytes at data_start + offset.
// A string is a u64 byte count and the bytes (no terminator); a bool is one byte; an array
// value is u32 element type | u64 count | the elements (arrays of arrays do not exist).
// Dimensions are in ggml order: ne[0] is the innermost (contiguous) extent, so a PyTorch
// weight of shape (out, in) is stored with dims {in, out}.
//
// GgufFile::open memory-maps the file and validates all of it before anything is used,
// reporting each violation as edl::Error(errc::format) "<file>: <field>: <problem>":
//   - magic "GGUF"; version 2 or 3 (a byte-swapped version names big-endian files);
//   - n_tensors and n_kv fit in the bytes that remain (each tensor info needs >= 32 bytes,
//     each key/value >= 13), checked before anything is allocated;
//   - every string and array length fits in the bytes that remain; value types are 0..12;
//     arrays hold no arrays; keys are unique;
//   - general.alignment, if present, is an integer that is a nonzero power of two;
//   - tensor names are unique; 1 to 4 dims, none negative; the element count and the byte
//     count fit in 63 bits (checked multiplication); the ggml type is known; ne[0] is a
//     multiple of the type's block size;
//   - offsets are multiples of the alignment; every tensor's bytes lie inside the file;
//     no two tensors share a byte. (Gaps between tensors and a missing last padding are
//     accepted; llama.cpp's writer leaves neither, and neither does GgufWriter.)
// Metadata getters (get_u32, get_string, ...) raise edl::Error(errc::config) naming the key
// when it is missing or of another type; integer getters take any integer type whose value
// fits. Tensors stay in the mapping; spans stay valid while the GgufFile lives.
//
// GgufWriter collects key/values and tensors (bytes as a span, not owned, or a callback
// that streams them) and write() stores them atomically ("<path>.tmp-<pid>", fsync,
// rename): a failed write leaves the old file intact and no temp file behind.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/mmap.hpp>

namespace edl::io {

static_assert(std::endian::native == std::endian::little,
              "edl::io reads GGUF (little-endian) by reinterpreting bytes: a big-endian host is unsupported");

// ------------------------------------------------------------------------------------ types

/// ggml tensor types (the ids of ggml.h's enum ggml_type). Ids 4, 5 and 31..33 were removed
/// from ggml and are rejected like any unknown id.
enum class GgmlType : std::uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
};

/// A ggml type's storage: `block_size` elements (along ne[0]) take `block_bytes` bytes.
struct GgmlTypeTraits {
  std::string_view name;
  std::uint32_t block_size = 0;  // 0: not a type
  std::uint32_t block_bytes = 0;
};

/// Indexed by type id (ggml's type_traits, block sizes from ggml-common.h; QK_K = 256).
inline constexpr std::array<GgmlTypeTraits, 36> kGgmlTypeTraits = {{
    {"F32", 1, 4},        {"F16", 1, 2},       {"Q4_0", 32, 18},     {"Q4_1", 32, 20},
    {"", 0, 0},           {"", 0, 0},          {"Q5_0", 32, 22},     {"Q5_1", 32, 24},
    {"Q8_0", 32, 34},     {"Q8_1", 32, 36},    {"Q2_K", 256, 84},    {"Q3_K", 256, 110},
    {"Q4_K", 256, 144},   {"Q5_K", 256, 176},  {"Q6_K", 256, 210},   {"Q8_K", 256, 292},
    {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18},   {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},   {"IQ4_XS", 256, 136},
    {"I8", 1, 1},         {"I16", 1, 2},       {"I32", 1, 4},        {"I64", 1, 8},
    {"F64", 1, 8},        {"IQ1_M", 256, 56},  {"BF16", 1, 2},       {"", 0, 0},
    {"", 0, 0},           {"", 0, 0},          {"TQ1_0", 256, 54},   {"TQ2_0", 256, 66},
}};

/// True if `id` names a ggml type this reader knows the storage of.
constexpr bool is_known_ggml_type(std::uint32_t id) noexcept {
  return id < kGgmlTypeTraits.size() && kGgmlTypeTraits[id].block_size != 0;
}
/// The traits of a known type (a default, block_size 0, for an unknown one).
constexpr GgmlTypeTraits ggml_type_traits(GgmlType t) noexcept {
  const auto id = static_cast<std::uint32_t>(t);
  return id < kGgmlTypeTraits.size() ? kGgmlTypeTraits[id] : GgmlTypeTraits{};
}
constexpr std::uint32_t ggml_block_size(GgmlType t) noexcept { return ggml_type_traits(t).block_size; }
constexpr std::uint32_t ggml_block_bytes(GgmlType t) noexcept { return ggml_type_traits(t).block_bytes; }
constexpr std::string_view ggml_type_name(GgmlType t) noexcept {
  const auto n = ggml_type_traits(t).name;
  return n.empty() ? std::string_view("unknown") : n;
}

static_assert(ggml_block_size(GgmlType::Q8_0) == 32 && ggml_block_bytes(GgmlType::Q8_0) == 34);
static_assert(ggml_block_size(GgmlType::Q4_0) == 32 && ggml_block_bytes(GgmlType::Q4_0) == 18);
static_assert(ggml_block_bytes(GgmlType::F16) == 2 && ggml_block_bytes(GgmlType::BF16) == 2 &&
              ggml_block_bytes(GgmlType::F32) == 4);

/// GGUF metadata value types (gguf.h's enum gguf_type).
enum class GgufValueType : std::uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

constexpr std::string_view gguf_value_type_name(GgufValueType t) noexcept {
  switch (t) {
    case GgufValueType::U8: return "u8";
    case GgufValueType::I8: return "i8";
    case GgufValueType::U16: return "u16";
    case GgufValueType::I16: return "i16";
    case GgufValueType::U32: return "u32";
    case GgufValueType::I32: return "i32";
    case GgufValueType::F32: return "f32";
    case GgufValueType::Bool: return "bool";
    case GgufValueType::String: return "string";
    case GgufValueType::Array: return "array";
    case GgufValueType::U64: return "u64";
    case GgufValueType::I64: return "i64";
    case GgufValueType::F64: return "f64";
  }
  return "unknown";
}

/// The key of the data alignment; default 32 when absent.
inline constexpr std::string_view kGgufAlignmentKey = "general.alignment";
inline constexpr std::uint32_t kGgufDefaultAlignment = 32;

/// One key/value of a GGUF file. `raw` points into the mapped file: for a scalar its bytes
/// (for a string its characters), for an array its elements as stored (strings with their
/// u64 length prefixes).
struct GgufKv {
  std::string key;
  GgufValueType type = GgufValueType::U8;        // Array for arrays
  GgufValueType array_type = GgufValueType::U8;  // arrays: the element type
  std::uint64_t array_size = 0;                  // arrays: the element count
  std::span<const std::byte> raw;

  bool is_array() const noexcept { return type == GgufValueType::Array; }
};

/// Where one tensor lives in a GGUF file.
struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<std::int64_t> dims;  // ggml order: dims[0] = ne[0], the innermost extent
  std::uint64_t offset = 0;        // relative to the data section
  std::uint64_t numel = 0;
  std::uint64_t nbytes = 0;
  const std::byte* data = nullptr;  // into the mapped file

  std::span<const std::byte> bytes() const noexcept { return {data, static_cast<std::size_t>(nbytes)}; }
  /// The dims in row-major (PyTorch, safetensors) order: dims reversed.
  std::vector<std::int64_t> shape() const { return {dims.rbegin(), dims.rend()}; }
};

namespace detail::gguf {

using ::edl::detail::concat;

inline constexpr std::uint32_t kMaxDims = 4;
// The smallest encodings, to bound counts by the bytes left before allocating anything.
inline constexpr std::uint64_t kMinKvBytes = 8 + 4 + 1;              // empty key, type, 1-byte value
inline constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim

template <class T>
T load(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// a * b, or nullopt on u64 overflow.
inline std::optional<std::uint64_t> mul(std::uint64_t a, std::uint64_t b) noexcept {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}
inline std::optional<std::uint64_t> add(std::uint64_t a, std::uint64_t b) noexcept {
  if (b > std::numeric_limits<std::uint64_t>::max() - a) return std::nullopt;
  return a + b;
}
inline std::uint64_t align_up(std::uint64_t x, std::uint64_t alignment) noexcept {
  return (x + alignment - 1) / alignment * alignment;
}

/// A name from the file, quoted for a message: printable ASCII kept, other bytes as \xNN,
/// cut after 96 bytes (a hostile file can hold megabytes of anything in a name).
inline std::string quote(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "'";
  const std::size_t n = std::min<std::size_t>(s.size(), 96);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (n < s.size()) out += concat("'... (", s.size(), " bytes)");
  else out += "'";
  return out;
}

/// Bytes of one scalar of type `t`; 0 for strings (variable), arrays and unknown types.
constexpr std::uint64_t scalar_bytes(GgufValueType t) noexcept {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::Bool: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    default: return 0;
  }
}
constexpr bool is_known_value_type(std::uint32_t id) noexcept { return id <= 12; }
constexpr bool is_integer(GgufValueType t) noexcept {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::U16: case GgufValueType::I16:
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::U64: case GgufValueType::I64:
      return true;
    default: return false;
  }
}

/// The integer of type `t` at `p` converted to T, or nullopt if it does not fit.
template <class T>
std::optional<T> int_as(GgufValueType t, const std::byte* p) noexcept {
  auto fit = [](auto v) -> std::optional<T> {
    if (std::in_range<T>(v)) return static_cast<T>(v);
    return std::nullopt;
  };
  switch (t) {
    case GgufValueType::U8: return fit(load<std::uint8_t>(p));
    case GgufValueType::I8: return fit(load<std::int8_t>(p));
    case GgufValueType::U16: return fit(load<std::uint16_t>(p));
    case GgufValueType::I16: return fit(load<std::int16_t>(p));
    case GgufValueType::U32: return fit(load<std::uint32_t>(p));
    case GgufValueType::I32: return fit(load<std::int32_t>(p));
    case GgufValueType::U64: return fit(load<std::uint64_t>(p));
    case GgufValueType::I64: return fit(load<std::int64_t>(p));
    default: return std::nullopt;
  }
}

/// The integer of type `t` at `p` as text (for messages).
inline std::string int_text(GgufValueType t, const std::byte* p) {
  if (auto s = int_as<std::int64_t>(t, p)) return std::to_string(*s);
  if (auto u = int_as<std::uint64_t>(t, p)) return std::to_string(*u);
  return "?";
}

/// "u32", "string", "array of f32 (12 elements)".
inline std::string type_text(const GgufKv& kv) {
  if (!kv.is_array()) return std::string(gguf_value_type_name(kv.type));
  return concat("array of ", gguf_value_type_name(kv.array_type), " (", kv.array_size, " elements)");
}

/// Checks dims and type of a tensor and computes its element and byte counts. Returns "" if
/// the tensor is valid, else the problem (the caller adds the file or the writer and the name).
inline std::string check_tensor(std::uint32_t type_id, std::span<const std::int64_t> dims, std::uint64_t& numel,
                                std::uint64_t& nbytes) {
  if (dims.empty() || dims.size() > kMaxDims)
    return concat("has ", dims.size(), " dims; a GGUF tensor has 1 to ", kMaxDims);
  constexpr auto max63 = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t n = 1;
  for (std::size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] < 0) return concat("ne[", k, "] = ", dims[k], " is negative");
    const auto m = mul(n, static_cast<std::uint64_t>(dims[k]));
    if (!m || *m > max63)
      return concat("dims ", ::edl::detail::shape_str(dims), " hold more than 2^63 - 1 elements (overflow)");
    n = *m;
  }
  if (!is_known_ggml_type(type_id))
    return concat("unknown ggml type id ", type_id, " (known: 0-3, 6-30, 34, 35)");
  const GgmlTypeTraits& tr = kGgmlTypeTraits[type_id];
  if (static_cast<std::uint64_t>(dims[0]) % tr.block_size != 0)
    return concat("ne[0] = ", dims[0], " is not a multiple of the ", tr.name, " block size ", tr.block_size);
  // ne[0] is a multiple of the block size, so n is too.
  const auto b = mul(n / tr.block_size, tr.block_bytes);
  if (!b || *b > max63)
    return concat("dims ", ::edl::detail::shape_str(dims), " of ", tr.name, " need more than 2^63 - 1 bytes (overflow)");
  numel = n;
  nbytes = *b;
  return {};
}

/// Reads a GGUF file front to back. Every read checks the bytes left first; `field` is a
/// callable giving the field's name, built only when a check fails.
class Cursor {
 public:
  Cursor(std::span<const std::byte> file, const std::string& path) : file_(file), path_(path) {}

  std::uint64_t pos() const noexcept { return pos_; }
  std::uint64_t size() const noexcept { return file_.size(); }
  std::uint64_t remaining() const noexcept { return file_.size() - pos_; }

  template <class Field>
  void need(std::uint64_t n, const Field& field) const {
    if (n > remaining())
      ::edl::detail::raise(errc::format, path_,
                           concat(field(), ": needs ", n, " bytes at offset ", pos_, ", but the file ends at ", size(),
                                  " bytes (truncated?)"));
  }
  template <class T, class Field>
  T read(const Field& field) {
    need(sizeof(T), field);
    const T v = load<T>(file_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  template <class Field>
  std::span<const std::byte> take(std::uint64_t n, const Field& field) {
    need(n, field);
    std::span<const std::byte> s = file_.subspan(static_cast<std::size_t>(pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return s;
  }
  /// A u64 length and that many bytes.
  template <class Field>
  std::string_view read_string(const Field& field) {
    const auto n = read<std::uint64_t>([&] { return concat(field(), " length"); });
    if (n > remaining())
      ::edl::detail::raise(errc::format, path_,
                           concat(field(), ": string length ", n, " passes the end of the file (", remaining(),
                                  " bytes remain at offset ", pos_, " of ", size(), ")"));
    const auto s = take(n, field);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

  /// The bytes read since offset `start`.
  std::span<const std::byte> since(std::uint64_t start) const noexcept {
    return file_.subspan(static_cast<std::size_t>(start), static_cast<std::size_t>(pos_ - start));
  }

  [[noreturn]] void fail(const std::string& what) const { ::edl::detail::raise(errc::format, path_, what); }

 private:
  std::span<const std::byte> file_;
  const std::string& path_;
  std::uint64_t pos_ = 0;
};


/// Reads and checks one value of type `type_id` (an array's elements included) into `kv`.
template <class Field>
void read_value(Cursor& c, std::uint32_t type_id, GgufKv& kv, const Field& field) {
  if (!is_known_value_type(type_id)) c.fail(concat(field(), ": unknown value type ", type_id, " (known: 0-12)"));
  kv.type = static_cast<GgufValueType>(type_id);
  if (kv.type == GgufValueType::String) {
    const auto s = c.read_string(field);
    kv.raw = std::as_bytes(std::span<const char>(s.data(), s.size()));
    return;
  }
  if (kv.type != GgufValueType::Array) {
    kv.raw = c.take(scalar_bytes(kv.type), [&] { return concat(field(), " (", gguf_value_type_name(kv.type), ")"); });
    return;
  }
  const auto et = c.read<std::uint32_t>([&] { return concat(field(), " array element type"); });
  if (et == static_cast<std::uint32_t>(GgufValueType::Array))
    c.fail(concat(field(), ": an array of arrays (nested arrays are not part of GGUF)"));
  if (!is_known_value_type(et)) c.fail(concat(field(), ": unknown array element type ", et, " (known: 0-8, 10-12)"));
  kv.array_type = static_cast<GgufValueType>(et);
  kv.array_size = c.read<std::uint64_t>([&] { return concat(field(), " array length"); });
  // Bound the count by the bytes left before walking it: a hostile count cannot make the
  // loop below (or a caller's vector) larger than the file.
  const std::uint64_t min_elem = kv.array_type == GgufValueType::String ? 8 : scalar_bytes(kv.array_type);
  if (kv.array_size > c.remaining() / min_elem)
    c.fail(concat(field(), ": array of ", kv.array_size, " ", gguf_value_type_name(kv.array_type),
                  " passes the end of the file (", c.remaining(), " bytes remain at offset ", c.pos(), " of ", c.size(),
                  ", each element takes at least ", min_elem, ")"));
  const std::uint64_t start = c.pos();
  if (kv.array_type == GgufValueType::String) {
    for (std::uint64_t i = 0; i < kv.array_size; ++i) (void)c.read_string([&] { return concat(field(), "[", i, "]"); });
  } else {
    (void)c.take(kv.array_size * min_elem, field);
  }
  kv.raw = c.since(start);
}

/// The validated contents of a GGUF file.
struct Parsed {
  std::uint32_t version = 3;
  std::uint32_t alignment = kGgufDefaultAlignment;
  std::uint64_t data_offset = 0;  // where the data section starts in the file
  std::vector<GgufKv> kvs;
  std::unordered_map<std::string, std::size_t> kv_index;
  std::vector<GgufTensorInfo> tensors;
  std::unordered_map<std::string, std::size_t> tensor_index;
};

inline std::uint32_t byteswap32(std::uint32_t v) noexcept {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}

/// Validates `file` (the whole file's bytes) against the GGUF rules; `path` names it.
inline Parsed parse(std::span<const std::byte> file, const std::string& path) {
  Cursor c(file, path);
  Parsed out;

  // ---- header
  const auto magic = c.take(4, [] { return std::string("magic (a GGUF file starts with \"GGUF\")"); });
  if (std::memcmp(magic.data(), "GGUF", 4) != 0)
    c.fail(concat("magic: expected \"GGUF\", found ",
                  quote(std::string_view(reinterpret_cast<const char*>(magic.data()), 4)), " (not a GGUF file)"));
  out.version = c.read<std::uint32_t>([] { return std::string("version"); });
  if (out.version != 2 && out.version != 3) {
    const std::uint32_t swapped = byteswap32(out.version);
    if (swapped == 2 || swapped == 3)
      c.fail(concat("version: reads as ", out.version, ", i.e. version ", swapped,
                    " stored big-endian; edl reads little-endian GGUF only"));
    c.fail(concat("version: ", out.version, " is not supported (edl reads GGUF versions 2 and 3)"));
  }
  const auto n_tensors = c.read<std::uint64_t>([] { return std::string("n_tensors"); });
  const auto n_kv = c.read<std::uint64_t>([] { return std::string("n_kv"); });
  if (n_kv > c.remaining() / kMinKvBytes)
    c.fail(concat("n_kv: ", n_kv, " key/values (at least ", kMinKvBytes, " bytes each) pass the end of the file (",
                  c.remaining(), " bytes remain after the header)"));
  if (n_tensors > (c.remaining() - n_kv * kMinKvBytes) / kMinTensorInfoBytes)
    c.fail(concat("n_tensors: ", n_tensors, " tensor infos (at least ", kMinTensorInfoBytes,
                  " bytes each) pass the end of the file (", c.remaining(), " bytes remain after the header, ", n_kv,
                  " key/values take at least ", n_kv * kMinKvBytes, " of them)"));

  // ---- key/values
  // Counts are bounded by the file's size, but entries of garbage fail one by one: reserve
  // only a modest amount up front.
  out.kvs.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n_kv, 4096)));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    GgufKv kv;
    kv.key = std::string(c.read_string([&] { return concat("key #", i); }));
    const auto field = [&] { return concat("key ", quote(kv.key)); };
    const auto [it, inserted] = out.kv_index.emplace(kv.key, out.kvs.size());
    if (!inserted) c.fail(concat(field(), ": duplicate key (key #", it->second, " and key #", i, ")"));
    const auto type_id = c.read<std::uint32_t>([&] { return concat(field(), " value type"); });
    read_value(c, type_id, kv, field);
    out.kvs.push_back(std::move(kv));
  }

  if (const auto it = out.kv_index.find(std::string(kGgufAlignmentKey)); it != out.kv_index.end()) {
    const GgufKv& kv = out.kvs[it->second];
    const auto field = quote(kv.key);
    if (kv.is_array() || !is_integer(kv.type))
      c.fail(concat("key ", field, ": stored as ", type_text(kv), ", expected an integer (u32)"));
    const auto a = int_as<std::uint32_t>(kv.type, kv.raw.data());
    if (!a || *a == 0 || (*a & (*a - 1)) != 0)
      c.fail(concat("key ", field, ": alignment ", int_text(kv.type, kv.raw.data()),
                    " is not a nonzero power of two (in u32)"));
    out.alignment = *a;
  }

  // ---- tensor infos
  out.tensors.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n_tensors, 4096)));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = std::string(c.read_string([&] { return concat("tensor #", i, " name"); }));
    const auto field = [&] { return concat("tensor ", quote(t.name)); };
    const auto [it, inserted] = out.tensor_index.emplace(t.name, out.tensors.size());
    if (!inserted) c.fail(concat(field(), ": duplicate tensor name (tensor #", it->second, " and tensor #", i, ")"));
    const auto n_dims = c.read<std::uint32_t>([&] { return concat(field(), " n_dims"); });
    if (n_dims == 0 || n_dims > kMaxDims)
      c.fail(concat(field(), ": n_dims = ", n_dims, "; a GGUF tensor has 1 to ", kMaxDims, " dims"));
    std::array<std::int64_t, kMaxDims> ne{};
    for (std::uint32_t k = 0; k < n_dims; ++k)
      ne[k] = c.read<std::int64_t>([&] { return concat(field(), " ne[", k, "]"); });
    const auto type_id = c.read<std::uint32_t>([&] { return concat(field(), " type"); });
    t.offset = c.read<std::uint64_t>([&] { return concat(field(), " offset"); });
    const std::string problem = check_tensor(type_id, std::span<const std::int64_t>(ne.data(), n_dims), t.numel, t.nbytes);
    if (!problem.empty()) c.fail(concat(field(), ": ", problem));
    t.type = static_cast<GgmlType>(type_id);
    t.dims.assign(ne.begin(), ne.begin() + n_dims);
    out.tensors.push_back(std::move(t));
  }

  // ---- data section: starts at the next multiple of the alignment (header_end <= file size
  // < 2^63 and alignment <= 2^31, so this cannot overflow).
  out.data_offset = align_up(c.pos(), out.alignment);
  struct Range {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<Range> ranges;
  ranges.reserve(out.tensors.size());
  const std::uint64_t size = c.size();
  for (std::size_t i = 0; i < out.tensors.size(); ++i) {
    GgufTensorInfo& t = out.tensors[i];
    const std::string field = concat("tensor ", quote(t.name));
    if (t.offset % out.alignment != 0)
      c.fail(concat(field, ": offset ", t.offset, " is not a multiple of general.alignment ", out.alignment));
    const auto begin = add(out.data_offset, t.offset);
    const auto end = begin ? add(*begin, t.nbytes) : std::nullopt;
    if (!end)
      c.fail(concat(field, ": data offset ", t.offset, " + ", t.nbytes, " bytes overflows 64 bits (the file has ", size,
                    " bytes)"));
    if (*end > size)
      c.fail(concat(field, ": data [", *begin, ", ", *end, ") passes the end of the file (", size, " bytes); offset ",
                    t.offset, " in the data section at ", out.data_offset, ", ", t.nbytes, " bytes"));
    t.data = file.data() + *begin;
    if (t.nbytes > 0) ranges.push_back({*begin, *end, i});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.index < b.index;
  });
  const Range* reach = nullptr;  // the range that ends last among those seen
  for (const Range& r : ranges) {
    if (reach != nullptr && r.begin < reach->end)
      c.fail(concat("tensor ", quote(out.tensors[r.index].name), ": data [", r.begin, ", ", r.end, ") overlaps tensor ",
                    quote(out.tensors[reach->index].name), " [", reach->begin, ", ", reach->end, ")"));
    if (reach == nullptr || r.end > reach->end) reach = &r;
  }
  return out;
}

}  // namespace detail::gguf

// ------------------------------------------------------------------------------------ reader

/// A memory-mapped, validated GGUF file. Move-only; spans and pointers stay valid while it lives.
///
///   auto f = edl::io::GgufFile::open("model.gguf");
///   std::uint32_t L = f.get_u32("llama.block_count");
///   const auto& q = f.tensor("blk.0.attn_q.weight");   // q.type, q.dims {C, C}, q.bytes()
class GgufFile {
 public:
  static GgufFile open(const std::string& path) {
    GgufFile f;
    f.map_ = MappedFile(path);
    f.p_ = detail::gguf::parse(f.map_.bytes(), f.map_.path());
    return f;
  }

  const std::string& path() const noexcept { return map_.path(); }
  std::uint32_t version() const noexcept { return p_.version; }
  /// general.alignment, or 32.
  std::uint32_t alignment() const noexcept { return p_.alignment; }
  /// Where the data section starts in the file (past its end for a file without tensors,
  /// whose last padding is optional).
  std::uint64_t data_offset() const noexcept { return p_.data_offset; }
  std::uint64_t file_bytes() const noexcept { return map_.size(); }

  // ---- metadata

  /// Key/values in file order.
  const std::vector<GgufKv>& kvs() const noexcept { return p_.kvs; }
  bool has(const std::string& key) const { return p_.kv_index.count(key) > 0; }
  /// The key/value, or nullptr if the file has no such key.
  const GgufKv* find(const std::string& key) const {
    const auto it = p_.kv_index.find(key);
    return it == p_.kv_index.end() ? nullptr : &p_.kvs[it->second];
  }
  /// The key/value; errc::config naming the key if it is missing.
  const GgufKv& at(const std::string& key) const {
    const GgufKv* kv = find(key);
    if (kv == nullptr)
      ::edl::detail::raise(errc::config, path(),
                           ::edl::detail::concat("key ", detail::gguf::quote(key), ": missing (the file has ",
                                                 p_.kvs.size(), " keys)"));
    return *kv;
  }

  std::string get_string(const std::string& key) const {
    const GgufKv& kv = expect(key, GgufValueType::String, "string");
    return {reinterpret_cast<const char*>(kv.raw.data()), kv.raw.size()};
  }
  bool get_bool(const std::string& key) const {
    return detail::gguf::load<std::uint8_t>(expect(key, GgufValueType::Bool, "bool").raw.data()) != 0;
  }
  /// An f32 value (an f64 one is rounded to float).
  float get_f32(const std::string& key) const { return static_cast<float>(get_f64(key)); }
  /// An f32 or f64 value.
  double get_f64(const std::string& key) const {
    const GgufKv& kv = at(key);
    if (kv.is_array() || (kv.type != GgufValueType::F32 && kv.type != GgufValueType::F64)) wrong_type(kv, "f32 or f64");
    return kv.type == GgufValueType::F32 ? double(detail::gguf::load<float>(kv.raw.data()))
                                         : detail::gguf::load<double>(kv.raw.data());
  }
  /// An integer of any GGUF integer type whose value fits in T.
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  T get_int(const std::string& key) const {
    const GgufKv& kv = at(key);
    if (kv.is_array() || !detail::gguf::is_integer(kv.type)) wrong_type(kv, concat_type<T>("an integer that fits in "));
    const auto v = detail::gguf::int_as<T>(kv.type, kv.raw.data());
    if (!v)
      ::edl::detail::raise(errc::config, path(),
                           ::edl::detail::concat("key ", detail::gguf::quote(key), ": value ",
                                                 detail::gguf::int_text(kv.type, kv.raw.data()), " (",
                                                 gguf_value_type_name(kv.type), ") does not fit in ", int_name<T>()));
    return *v;
  }
  std::uint32_t get_u32(const std::string& key) const { return get_int<std::uint32_t>(key); }
  std::int32_t get_i32(const std::string& key) const { return get_int<std::int32_t>(key); }
  std::uint64_t get_u64(const std::string& key) const { return get_int<std::uint64_t>(key); }
  std::int64_t get_i64(const std::string& key) const { return get_int<std::int64_t>(key); }

  std::vector<std::string> get_string_array(const std::string& key) const {
    const GgufKv& kv = expect_array(key, "string", [](GgufValueType t) { return t == GgufValueType::String; });
    std::vector<std::string> v;
    v.reserve(static_cast<std::size_t>(kv.array_size));
    std::size_t pos = 0;
    for (std::uint64_t i = 0; i < kv.array_size; ++i) {  // lengths were checked by open()
      const auto n = static_cast<std::size_t>(detail::gguf::load<std::uint64_t>(kv.raw.data() + pos));
      v.emplace_back(reinterpret_cast<const char*>(kv.raw.data() + pos + 8), n);
      pos += 8 + n;
    }
    return v;
  }
  /// An array of f32 (or f64, rounded to float).
  std::vector<float> get_f32_array(const std::string& key) const {
    const GgufKv& kv = expect_array(key, "f32 or f64", [](GgufValueType t) {
      return t == GgufValueType::F32 || t == GgufValueType::F64;
    });
    std::vector<float> v(static_cast<std::size_t>(kv.array_size));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = kv.array_type == GgufValueType::F32 ? detail::gguf::load<float>(kv.raw.data() + 4 * i)
                                                 : static_cast<float>(detail::gguf::load<double>(kv.raw.data() + 8 * i));
    return v;
  }
  /// An array of any GGUF integer type whose every value fits in T.
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  std::vector<T> get_int_array(const std::string& key) const {
    const GgufKv& kv = expect_array(key, concat_type<T>("integers that fit in "), detail::gguf::is_integer);
    const std::size_t esize = static_cast<std::size_t>(detail::gguf::scalar_bytes(kv.array_type));
    std::vector<T> v(static_cast<std::size_t>(kv.array_size));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto x = detail::gguf::int_as<T>(kv.array_type, kv.raw.data() + esize * i);
      if (!x)
        ::edl::detail::raise(errc::config, path(),
                             ::edl::detail::concat("key ", detail::gguf::quote(key), ": element ", i, " = ",
                                                   detail::gguf::int_text(kv.array_type, kv.raw.data() + esize * i),
                                                   " (", gguf_value_type_name(kv.array_type), ") does not fit in ",
                                                   int_name<T>()));
      v[i] = *x;
    }
    return v;
  }
  std::vector<std::int32_t> get_i32_array(const std::string& key) const { return get_int_array<std::int32_t>(key); }

  // ---- tensors

  /// Tensor infos in file order.
  const std::vector<GgufTensorInfo>& tensors() const noexcept { return p_.tensors; }
  bool has_tensor(const std::string& name) const { return p_.tensor_index.count(name) > 0; }
  /// The tensor, or nullptr if the file has no such tensor.
  const GgufTensorInfo* find_tensor(const std::string& name) const {
    const auto it = p_.tensor_index.find(name);
    return it == p_.tensor_index.end() ? nullptr : &p_.tensors[it->second];
  }
  /// The tensor; errc::format naming it if the file has no such tensor.
  const GgufTensorInfo& tensor(const std::string& name) const {
    const GgufTensorInfo* t = find_tensor(name);
    if (t == nullptr)
      ::edl::detail::raise(errc::format, path(),
                           ::edl::detail::concat("tensor ", detail::gguf::quote(name), ": no such tensor in the file (it holds ",
                                                 p_.tensors.size(), " tensors)"));
    return *t;
  }
  /// The tensor's bytes as stored (ggml layout of its type).
  std::span<const std::byte> data_of(const std::string& name) const { return tensor(name).bytes(); }

 private:
  GgufFile() = default;

  template <class T>
  static std::string int_name() {
    return ::edl::detail::concat(std::is_signed_v<T> ? "i" : "u", 8 * sizeof(T));
  }
  template <class T>
  static std::string concat_type(const char* prefix) {
    return prefix + int_name<T>();
  }
  [[noreturn]] void wrong_type(const GgufKv& kv, const std::string& expected) const {
    ::edl::detail::raise(errc::config, path(),
                         ::edl::detail::concat("key ", detail::gguf::quote(kv.key), ": stored as ",
                                               detail::gguf::type_text(kv), ", expected ", expected));
  }
  const GgufKv& expect(const std::string& key, GgufValueType t, const char* expected) const {
    const GgufKv& kv = at(key);
    if (kv.is_array() || kv.type != t) wrong_type(kv, expected);
    return kv;
  }
  template <class Pred>
  const GgufKv& expect_array(const std::string& key, const std::string& elements, Pred ok) const {
    const GgufKv& kv = at(key);
    if (!kv.is_array() || !ok(kv.array_type)) wrong_type(kv, "an array of " + elements);
    return kv;
  }

  MappedFile map_;
  detail::gguf::Parsed p_;
};

// ------------------------------------------------------------------------------------ writer

/// Receives one tensor's bytes from a GgufWriter::add_tensor callback. Writing more than the
/// tensor's byte count throws; writing fewer makes GgufWriter::write throw.
class GgufSink {
 public:
  void write(std::span<const std::byte> bytes) {
    EDL_CHECK(bytes.size() <= remaining(), errc::invalid_argument, *path_, "tensor ",
              detail::gguf::quote(*name_), ": the callback writes ", written_ + bytes.size(), " bytes, but the tensor has ",
              expected_);
    file_->write(bytes.data(), bytes.size());
    written_ += bytes.size();
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void write(std::span<const T> values) {
    write(std::as_bytes(values));
  }
  std::uint64_t written() const noexcept { return written_; }
  std::uint64_t remaining() const noexcept { return expected_ - written_; }

 private:
  friend class GgufWriter;
  GgufSink(AtomicFile& f, const std::string& path, const std::string& name, std::uint64_t expected)
      : file_(&f), path_(&path), name_(&name), expected_(expected) {}
  AtomicFile* file_;
  const std::string* path_;
  const std::string* name_;
  std::uint64_t expected_;
  std::uint64_t written_ = 0;
};

/// Builds a GGUF v3 file: key/values and tensors in the order added, then write(path).
///
///   edl::io::GgufWriter w;
///   w.add_string("general.architecture", "llama").add_u32("llama.block_count", 2);
///   w.add_tensor("token_embd.weight", GgmlType::F32, {C, V}, std::as_bytes(std::span(emb)));  // emb: (V, C)
///   w.write("model.gguf");
///
/// Tensor bytes given as a span are not copied: they must live until write() returns.
/// general.alignment is written only if set (set_alignment, or add_u32 of that key).
class GgufWriter {
 public:
  GgufWriter& add_u8(std::string key, std::uint8_t v) { return scalar(std::move(key), GgufValueType::U8, v); }
  GgufWriter& add_i8(std::string key, std::int8_t v) { return scalar(std::move(key), GgufValueType::I8, v); }
  GgufWriter& add_u16(std::string key, std::uint16_t v) { return scalar(std::move(key), GgufValueType::U16, v); }
  GgufWriter& add_i16(std::string key, std::int16_t v) { return scalar(std::move(key), GgufValueType::I16, v); }
  GgufWriter& add_u32(std::string key, std::uint32_t v) {
    if (key == kGgufAlignmentKey) return set_alignment(v);
    return scalar(std::move(key), GgufValueType::U32, v);
  }
  GgufWriter& add_i32(std::string key, std::int32_t v) { return scalar(std::move(key), GgufValueType::I32, v); }
  GgufWriter& add_u64(std::string key, std::uint64_t v) { return scalar(std::move(key), GgufValueType::U64, v); }
  GgufWriter& add_i64(std::string key, std::int64_t v) { return scalar(std::move(key), GgufValueType::I64, v); }
  GgufWriter& add_f32(std::string key, float v) { return scalar(std::move(key), GgufValueType::F32, v); }
  GgufWriter& add_f64(std::string key, double v) { return scalar(std::move(key), GgufValueType::F64, v); }
  GgufWriter& add_bool(std::string key, bool v) {
    return scalar(std::move(key), GgufValueType::Bool, static_cast<std::uint8_t>(v ? 1 : 0));
  }
  GgufWriter& add_string(std::string key, std::string_view v) {
    std::string enc;
    put(enc, static_cast<std::uint32_t>(GgufValueType::String));
    put_string(enc, v);
    return add_kv(std::move(key), std::move(enc));
  }
  GgufWriter& add_string_array(std::string key, const std::vector<std::string>& v) {
    std::string enc = array_head(GgufValueType::String, v.size());
    for (const auto& s : v) put_string(enc, s);
    return add_kv(std::move(key), std::move(enc));
  }
  GgufWriter& add_i32_array(std::string key, const std::vector<std::int32_t>& v) {
    return array(std::move(key), GgufValueType::I32, v);
  }
  GgufWriter& add_u32_array(std::string key, const std::vector<std::uint32_t>& v) {
    return array(std::move(key), GgufValueType::U32, v);
  }
  GgufWriter& add_f32_array(std::string key, const std::vector<float>& v) {
    return array(std::move(key), GgufValueType::F32, v);
  }

  /// Sets general.alignment (a nonzero power of two) and writes it as a u32 key; calling it
  /// again replaces the value.
  GgufWriter& set_alignment(std::uint32_t alignment) {
    EDL_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, errc::invalid_argument, "io.GgufWriter",
              "key 'general.alignment': ", alignment, " is not a nonzero power of two");
    alignment_ = alignment;
    std::string enc;
    put(enc, static_cast<std::uint32_t>(GgufValueType::U32));
    put(enc, alignment);
    const auto it = std::find_if(kvs_.begin(), kvs_.end(), [](const Kv& kv) { return kv.key == kGgufAlignmentKey; });
    if (it != kvs_.end()) it->value = std::move(enc);
    else {
      kvs_.push_back({std::string(kGgufAlignmentKey), std::move(enc)});
      keys_.insert(kvs_.back().key);
    }
    return *this;
  }
  std::uint32_t alignment() const noexcept { return alignment_; }

  /// Adds a tensor whose bytes (ggml layout of `type`, dims in ggml order) are `bytes`, which
  /// must hold exactly the tensor's byte count and stay alive until write() returns.
  GgufWriter& add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> dims,
                         std::span<const std::byte> bytes) {
    Tensor t = make_tensor(std::move(name), type, std::move(dims));
    EDL_CHECK(bytes.size() == t.nbytes, errc::shape_mismatch, "io.GgufWriter", "tensor ",
              detail::gguf::quote(t.name), ": dims ", ::edl::detail::shape_str(t.dims), " of ", ggml_type_name(type),
              " need ", t.nbytes, " bytes, but ", bytes.size(), " were given");
    t.bytes = bytes;
    return push(std::move(t));
  }
  /// Adds a tensor whose bytes `fill` writes to the sink during write(), exactly its byte count.
  GgufWriter& add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> dims,
                         std::function<void(GgufSink&)> fill) {
    EDL_CHECK(static_cast<bool>(fill), errc::invalid_argument, "io.GgufWriter", "tensor ", detail::gguf::quote(name),
              ": empty callback");
    Tensor t = make_tensor(std::move(name), type, std::move(dims));
    t.fill = std::move(fill);
    return push(std::move(t));
  }

  std::size_t num_kvs() const noexcept { return kvs_.size(); }
  std::size_t num_tensors() const noexcept { return tensors_.size(); }
  /// A tensor's byte count (ggml_nbytes), for a callback's bookkeeping.
  std::uint64_t tensor_bytes(const std::string& name) const {
    for (const Tensor& t : tensors_)
      if (t.name == name) return t.nbytes;
    ::edl::detail::raise(errc::invalid_argument, "io.GgufWriter",
                         ::edl::detail::concat("tensor ", detail::gguf::quote(name), ": not added"));
  }

  /// Writes the file atomically: header, key/values, tensor infos, zero padding to the
  /// alignment, then each tensor padded to the alignment. Returns the file size.
  std::uint64_t write(const std::string& path) const {
    std::string head;
    head.append("GGUF", 4);
    put(head, std::uint32_t{3});
    put(head, static_cast<std::uint64_t>(tensors_.size()));
    put(head, static_cast<std::uint64_t>(kvs_.size()));
    for (const Kv& kv : kvs_) {
      put_string(head, kv.key);
      head += kv.value;
    }
    std::uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      put_string(head, t.name);
      put(head, static_cast<std::uint32_t>(t.dims.size()));
      for (auto d : t.dims) put(head, d);
      put(head, static_cast<std::uint32_t>(t.type));
      put(head, offset);
      const auto next = detail::gguf::add(offset, t.nbytes);
      EDL_CHECK(next && *next <= std::numeric_limits<std::uint64_t>::max() - alignment_, errc::invalid_argument, path,
                "the tensors' bytes overflow 64-bit offsets at tensor ", detail::gguf::quote(t.name));
      offset = detail::gguf::align_up(*next, alignment_);
    }

    AtomicFile f(path);
    f.write(head.data(), head.size());
    pad(f, head.size());
    for (const Tensor& t : tensors_) {
      if (t.fill) {
        GgufSink sink(f, path, t.name, t.nbytes);
        t.fill(sink);
        EDL_CHECK(sink.written() == t.nbytes, errc::invalid_argument, path, "tensor ", detail::gguf::quote(t.name),
                  ": the callback wrote ", sink.written(), " bytes, but the tensor has ", t.nbytes);
      } else {
        f.write(t.bytes.data(), t.bytes.size());
      }
      pad(f, t.nbytes);
    }
    const std::uint64_t total = f.bytes_written();
    f.commit();
    return total;
  }

 private:
  struct Kv {
    std::string key;
    std::string value;  // u32 type, then the encoded value
  };
  struct Tensor {
    std::string name;
    GgmlType type = GgmlType::F32;
    std::vector<std::int64_t> dims;
    std::uint64_t nbytes = 0;
    std::span<const std::byte> bytes;
    std::function<void(GgufSink&)> fill;
  };

  template <class T>
  static void put(std::string& out, T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  static void put_string(std::string& out, std::string_view s) {
    put(out, static_cast<std::uint64_t>(s.size()));
    out.append(s.data(), s.size());
  }
  static std::string array_head(GgufValueType elem, std::size_t n) {
    std::string enc;
    put(enc, static_cast<std::uint32_t>(GgufValueType::Array));
    put(enc, static_cast<std::uint32_t>(elem));
    put(enc, static_cast<std::uint64_t>(n));
    return enc;
  }
  template <class T>
  GgufWriter& scalar(std::string key, GgufValueType type, T v) {
    std::string enc;
    put(enc, static_cast<std::uint32_t>(type));
    put(enc, v);
    return add_kv(std::move(key), std::move(enc));
  }
  template <class T>
  GgufWriter& array(std::string key, GgufValueType elem, const std::vector<T>& v) {
    std::string enc = array_head(elem, v.size());
    if (!v.empty()) enc.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    return add_kv(std::move(key), std::move(enc));
  }
  GgufWriter& add_kv(std::string key, std::string enc) {
    EDL_CHECK(key != kGgufAlignmentKey, errc::invalid_argument, "io.GgufWriter",
              "key 'general.alignment': must be a u32 (use set_alignment or add_u32)");
    EDL_CHECK(keys_.insert(key).second, errc::invalid_argument, "io.GgufWriter", "key ", detail::gguf::quote(key),
              ": added twice");
    kvs_.push_back({std::move(key), std::move(enc)});
    return *this;
  }
  /// A checked tensor (not yet added).
  Tensor make_tensor(std::string name, GgmlType type, std::vector<std::int64_t> dims) const {
    const std::string where = "io.GgufWriter";
    EDL_CHECK(!tensor_names_.count(name), errc::invalid_argument, where, "tensor ", detail::gguf::quote(name),
              ": added twice");
    Tensor t;
    std::uint64_t numel = 0;
    const std::string problem = detail::gguf::check_tensor(static_cast<std::uint32_t>(type), dims, numel, t.nbytes);
    EDL_CHECK(problem.empty(), errc::invalid_argument, where, "tensor ", detail::gguf::quote(name), ": ", problem);
    t.name = std::move(name);
    t.type = type;
    t.dims = std::move(dims);
    return t;
  }
  GgufWriter& push(Tensor t) {
    tensor_names_.insert(t.name);
    tensors_.push_back(std::move(t));
    return *this;
  }
  void pad(AtomicFile& f, std::uint64_t written) const {
    static constexpr char zeros[256] = {};
    std::uint64_t n = detail::gguf::align_up(written, alignment_) - written;
    while (n > 0) {
      const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, sizeof zeros));
      f.write(zeros, k);
      n -= k;
    }
  }

  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
  std::unordered_set<std::string> keys_, tensor_names_;
  std::uint32_t alignment_ = kGgufDefaultAlignment;
};

}  // namespace edl::io
