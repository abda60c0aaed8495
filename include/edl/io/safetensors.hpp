// edl/io/safetensors.hpp
// Reading and writing safetensors files (the HuggingFace checkpoint format), single or sharded.
//
// File layout: an 8-byte little-endian u64 N, N bytes of JSON header, then the data region.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data region) plus an optional "__metadata__" string -> string map.
//
// SafeTensorsFile::open validates the header the way the Rust `safetensors` crate does, and
// reports every violation as edl::Error(errc::format) naming the file and the tensor:
//   - the file holds at least 8 bytes; N <= 100'000'000; 8 + N <= file size;
//   - the header is a JSON object (starting with '{');
//   - every entry is an object with a known dtype (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL),
//     a shape of non-negative integers and data_offsets [begin, end] with begin <= end;
//   - product(shape) * dtype size == end - begin (no overflow);
//   - sorted by offset, the tensors cover the data region exactly: each begins where the
//     previous one ends (no overlap, no gap) and the last ends at the end of the file;
//   - "__metadata__", if present, is an object of strings.
// names() lists tensors in data-offset order (for files written by HF or edl, the header order).
//
// Tensors are memory-mapped; read_into converts F32/BF16/F16/F64 to float, double, bf16 or
// f16 with round-to-nearest-even (one rounding, also from F64), and copies any dtype to itself.
//
// save_safetensors writes atomically ("<path>.tmp-<pid>", fsync, rename): a failed save leaves
// the old file intact and no temp file behind. The header is padded with spaces so the data
// region starts at a multiple of 8 bytes, as HF does.
//
// ShardedCheckpoint::open(dir) reads model.safetensors or model.safetensors.index.json
// (HF sharded layout: {"metadata": {"total_size": ...}, "weight_map": {name: file}}) and
// offers the same read API across files. save_sharded writes that layout.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include <edl/core/block_rows.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/json.hpp>
#include <edl/io/mmap.hpp>

namespace edl::io {

static_assert(std::endian::native == std::endian::little,
              "edl::io reads safetensors (little-endian) by reinterpreting bytes: a big-endian host is unsupported");

/// Where one tensor lives in a safetensors file.
struct TensorInfo {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets relative to the data region
  std::uint64_t end = 0;

  std::uint64_t nbytes() const noexcept { return end - begin; }
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

/// The largest header the Rust implementation accepts.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

namespace detail {

inline std::string tensor_where(const std::string& path, const std::string& name) {
  return path + " tensor " + name;
}

template <class T>
T load_unaligned(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// double -> float rounded to odd (truncate, then set the last bit if inexact). Rounding that
/// float once more to bf16/f16 (RNE) gives the correctly rounded double -> bf16/f16 result.
inline float f64_to_f32_round_odd(double d) noexcept {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  u |= 1u;
  return std::bit_cast<float>(u);
}

template <class T>
T from_f64(double d) noexcept {
  if constexpr (std::is_same_v<T, double>) return d;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(d);
  else return T(f64_to_f32_round_odd(d));
}

template <class T>
T from_float(float f) noexcept {
  if constexpr (std::is_same_v<T, double>) return static_cast<double>(f);
  else return from_f32<T>(f);
}

template <class T>
inline constexpr bool is_float_target = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                        std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

inline bool is_float_dtype(DType d) noexcept {
  return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16;
}

/// Converts `n` elements of dtype `src` at `p` into `out`.
template <class T>
void convert_elements(DType src, const std::byte* p, std::size_t n, T* out, const std::string& where) {
  if (src == dtype_v<T>) {
    if (n > 0) std::memcpy(out, p, n * sizeof(T));
    return;
  }
  if constexpr (is_float_target<T>) {
    switch (src) {
      case DType::f32:
        for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(load_unaligned<float>(p + 4 * i));
        return;
      case DType::bf16:
        for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(bf16::to_float(load_unaligned<std::uint16_t>(p + 2 * i)));
        return;
      case DType::f16:
        for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(f16::to_float(load_unaligned<std::uint16_t>(p + 2 * i)));
        return;
      case DType::f64:
        for (std::size_t i = 0; i < n; ++i) out[i] = from_f64<T>(load_unaligned<double>(p + 8 * i));
        return;
      default: break;
    }
  }
  ::edl::detail::raise(errc::dtype_mismatch, where,
                       ::edl::detail::concat("stored as ", dtype_name(src), ", cannot convert to ",
                                             dtype_name(dtype_v<T>),
                                             " (conversions: F32/BF16/F16/F64 -> float, double, bf16, f16; "
                                             "any dtype -> itself)"));
}

/// The validated contents of a header.
struct ParsedHeader {
  std::vector<std::string> names;  // data-offset order
  std::unordered_map<std::string, TensorInfo> infos;
  std::map<std::string, std::string> metadata;
  std::uint64_t header_bytes = 0;  // N
};

inline std::string json_snippet(const nlohmann::ordered_json& j) {
  std::string s = j.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

/// Validates `file` (the whole file's bytes) against the safetensors rules; `path` names it.
inline ParsedHeader parse_header(std::span<const std::byte> file, const std::string& path) {
  using ::edl::detail::concat;
  const std::uint64_t size = file.size();
  EDL_CHECK(size >= 8, errc::format, path, "a safetensors file starts with an 8-byte header length, but the file has only ",
            size, " bytes");
  const std::uint64_t n = load_unaligned<std::uint64_t>(file.data());
  EDL_CHECK(n <= kMaxHeaderBytes, errc::format, path, "header length ", n, " exceeds the limit of ", kMaxHeaderBytes,
            " bytes (corrupt length field?)");
  EDL_CHECK(8 + n <= size, errc::format, path, "header length ", n, " reaches byte ", 8 + n,
            ", beyond the end of the file (", size, " bytes)");
  const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n));
  EDL_CHECK(!text.empty() && text.front() == '{', errc::format, path,
            "the header must be a JSON object starting with '{', found ",
            text.empty() ? std::string("an empty header") : concat("'", text.front(), "'"));

  // The specification pads the header with spaces; a NUL byte is no JSON and no padding.
  EDL_CHECK(text.find('\0') == std::string_view::npos, errc::format, path, "the header holds a NUL byte at byte ",
            8 + text.find('\0'), " (only spaces may pad it)");
  const nlohmann::ordered_json h = parse_json(text, path + " header");
  EDL_CHECK(h.is_object(), errc::format, path, "the header must be a JSON object, found ", h.type_name());

  ParsedHeader out;
  out.header_bytes = n;
  const std::uint64_t data_size = size - 8 - n;
  struct Entry { std::string name; std::uint64_t begin, end; std::size_t order; };
  std::vector<Entry> entries;

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      EDL_CHECK(v.is_object() || v.is_null(), errc::format, path,
                "__metadata__ must be an object of strings, found ", v.type_name());
      if (v.is_object())
        for (auto m = v.begin(); m != v.end(); ++m) {
          EDL_CHECK(m.value().is_string(), errc::format, path, "__metadata__ entry \"", m.key(),
                    "\" must be a string, found ", json_snippet(m.value()));
          out.metadata[m.key()] = m.value().get<std::string>();
        }
      continue;
    }
    const std::string where = tensor_where(path, name);
    EDL_CHECK(!name.empty(), errc::format, path, "a tensor has an empty name");
    EDL_CHECK(v.is_object(), errc::format, where, "expected an object {dtype, shape, data_offsets}, found ",
              json_snippet(v));
    for (const char* key : {"dtype", "shape", "data_offsets"})
      EDL_CHECK(v.contains(key), errc::format, where, "missing \"", key, "\" (entry is ", json_snippet(v), ")");
    const auto& jd = v["dtype"];
    EDL_CHECK(jd.is_string(), errc::format, where, "dtype must be a string, found ", json_snippet(jd));
    TensorInfo info;
    info.dtype = dtype_from_name(jd.get<std::string>(), where);

    const auto& js = v["shape"];
    EDL_CHECK(js.is_array(), errc::format, where, "shape must be an array of non-negative integers, found ",
              json_snippet(js));
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : js) {
      EDL_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<std::int64_t>() >= 0), errc::format, where,
                "shape must be an array of non-negative integers, found ", json_snippet(js));
      const std::uint64_t e = d.get<std::uint64_t>();
      EDL_CHECK(e <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), errc::format, where,
                "shape extent ", e, " is too large");
      info.shape.push_back(static_cast<std::int64_t>(e));
      if (e != 0 && numel > std::numeric_limits<std::uint64_t>::max() / e) overflow = true;
      else numel *= e;
    }
    const auto& jo = v["data_offsets"];
    EDL_CHECK(jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(),
              errc::format, where, "data_offsets must be [begin, end] with non-negative integers, found ",
              json_snippet(jo));
    info.begin = jo[0].get<std::uint64_t>();
    info.end = jo[1].get<std::uint64_t>();
    EDL_CHECK(info.begin <= info.end, errc::format, where, "data_offsets [", info.begin, ", ", info.end,
              "]: begin must not exceed end");
    EDL_CHECK(info.end <= data_size, errc::format, where, "data_offsets [", info.begin, ", ", info.end,
              "] end beyond the data region of ", data_size, " bytes");
    const std::uint64_t esize = dtype_size(info.dtype);
    EDL_CHECK(!overflow && numel <= std::numeric_limits<std::uint64_t>::max() / esize, errc::format, where,
              "shape ", ::edl::detail::shape_str(info.shape), " overflows a 64-bit byte count");
    EDL_CHECK(numel * esize == info.end - info.begin, errc::format, where, "shape ",
              ::edl::detail::shape_str(info.shape), " x ", dtype_name(info.dtype), " (", esize, " bytes) needs ",
              numel * esize, " bytes, but data_offsets [", info.begin, ", ", info.end, "] span ",
              info.end - info.begin);
    entries.push_back({name, info.begin, info.end, entries.size()});
    out.infos.emplace(name, std::move(info));
  }

  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    const std::string where = tensor_where(path, e.name);
    EDL_CHECK(e.begin >= pos, errc::format, where, "data_offsets [", e.begin, ", ", e.end, "] overlap tensor ",
              prev ? prev->name : std::string("?"), " which ends at ", pos);
    EDL_CHECK(e.begin == pos, errc::format, where, "data_offsets [", e.begin, ", ", e.end, "] leave a gap of ",
              e.begin - pos, " bytes after ", prev ? "tensor " + prev->name : std::string("the header"),
              " (which ends at ", pos, "): tensors must cover the data region contiguously");
    pos = e.end;
    prev = &e;
    out.names.push_back(e.name);
  }
  EDL_CHECK(pos == data_size, errc::format, path, "the tensors cover ", pos, " bytes of the data region but it holds ",
            data_size, " bytes (", data_size - pos, " trailing bytes", prev ? " after tensor " + prev->name : std::string(),
            ")");
  return out;
}

}  // namespace detail

/// A memory-mapped, validated safetensors file. Move-only; spans stay valid while it lives.
class SafeTensorsFile {
 public:
  static SafeTensorsFile open(const std::string& path) {
    SafeTensorsFile f;
    f.map_ = MappedFile(path);
    f.header_ = detail::parse_header(f.map_.bytes(), path);
    return f;
  }

  const std::string& path() const noexcept { return map_.path(); }
  /// Tensor names in data-offset order.
  const std::vector<std::string>& names() const noexcept { return header_.names; }
  std::size_t size() const noexcept { return header_.names.size(); }
  bool contains(const std::string& name) const { return header_.infos.count(name) > 0; }
  const std::map<std::string, std::string>& metadata() const noexcept { return header_.metadata; }
  std::uint64_t header_bytes() const noexcept { return header_.header_bytes; }
  std::uint64_t data_bytes() const noexcept { return map_.size() - 8 - header_.header_bytes; }
  std::uint64_t file_bytes() const noexcept { return map_.size(); }

  const TensorInfo& info(const std::string& name) const {
    auto it = header_.infos.find(name);
    EDL_CHECK(it != header_.infos.end(), errc::format, detail::tensor_where(path(), name),
              "no such tensor in the file (it holds ", header_.names.size(), " tensors)");
    return it->second;
  }
  /// The tensor's raw little-endian bytes.
  std::span<const std::byte> bytes(const std::string& name) const {
    const TensorInfo& i = info(name);
    return {map_.data() + 8 + header_.header_bytes + i.begin, static_cast<std::size_t>(i.nbytes())};
  }

  /// Copies the tensor into `out` (exactly numel elements), converting as documented above.
  template <StorageType T>
  void read_into(const std::string& name, std::span<T> out) const {
    const TensorInfo& i = info(name);
    const std::string where = detail::tensor_where(path(), name);
    EDL_CHECK(out.size() == static_cast<std::size_t>(i.numel()), errc::shape_mismatch, where, "holds ", i.numel(),
              " elements ", ::edl::detail::shape_str(i.shape), ", but the destination has ", out.size());
    detail::convert_elements<T>(i.dtype, bytes(name).data(), out.size(), out.data(), where);
  }
  template <StorageType T>
  std::vector<T> read_vector(const std::string& name) const {
    static_assert(!std::is_same_v<T, bool>, "std::vector<bool> is packed: use read_into with a bool buffer");
    std::vector<T> v(static_cast<std::size_t>(info(name).numel()));
    read_into<T>(name, std::span<T>(v));
    return v;
  }
  /// Copies the block at `offset` of extent `block` of the tensor, viewed as a row-major
  /// array of shape `shape` (the stored shape, or another of the same element count, e.g. a
  /// 1-D optimizer slot seen as its parameter's matrix), into `out` (block's element count),
  /// converting as read_into does. Only the block's bytes are touched, so a mesh device that
  /// reads its shard of a memory-mapped file reads that shard from disk, not the tensor.
  template <StorageType T>
  void read_block(const std::string& name, std::span<const std::int64_t> shape, std::span<const std::int64_t> offset,
                  std::span<const std::int64_t> block, std::span<T> out) const {
    const TensorInfo& i = info(name);
    const std::string where = detail::tensor_where(path(), name);
    std::int64_t n = 1, bn = 1;
    for (auto d : shape) n *= d;
    EDL_CHECK(n == i.numel(), errc::shape_mismatch, where, "holds ", i.numel(), " elements ",
              ::edl::detail::shape_str(i.shape), ", expected ", n, " ", ::edl::detail::shape_str(shape));
    EDL_CHECK(offset.size() == shape.size() && block.size() == shape.size(), errc::invalid_argument, where,
              "block of rank ", block.size(), " at an offset of rank ", offset.size(), " in a tensor of rank ", shape.size());
    for (std::size_t k = 0; k < shape.size(); ++k) {
      EDL_CHECK(offset[k] >= 0 && block[k] >= 0 && offset[k] + block[k] <= shape[k], errc::invalid_argument, where,
                "block ", ::edl::detail::shape_str(block), " at ", ::edl::detail::shape_str(offset),
                " reaches past the tensor's shape ", ::edl::detail::shape_str(shape), " in dimension ", k);
      bn *= block[k];
    }
    EDL_CHECK(out.size() == static_cast<std::size_t>(bn), errc::shape_mismatch, where, "block ",
              ::edl::detail::shape_str(block), " has ", bn, " elements, but the destination has ", out.size());
    if (bn == 0) return;
    const std::byte* base = bytes(name).data();
    const std::size_t esize = dtype_size(i.dtype);
    ::edl::detail::for_each_block_row(shape, offset, block, [&](std::int64_t g, std::int64_t b, std::int64_t row) {
      detail::convert_elements<T>(i.dtype, base + static_cast<std::size_t>(g) * esize, static_cast<std::size_t>(row),
                                  out.data() + b, where);
    });
  }

  /// The tensor as an f32 array of its shape.
  xt::xarray<float> read_f32(const std::string& name) const {
    const TensorInfo& i = info(name);
    std::vector<std::size_t> shape(i.shape.begin(), i.shape.end());
    xt::xarray<float> a(shape);
    read_into<float>(name, std::span<float>(a.data(), a.size()));
    return a;
  }

 private:
  SafeTensorsFile() = default;
  MappedFile map_;
  detail::ParsedHeader header_;
};

// ------------------------------------------------------------------------------------ writer

/// One tensor to write: dtype, shape and its raw little-endian bytes (not owned).
struct TensorRef {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;

  TensorRef(DType d, std::vector<std::int64_t> s, std::span<const std::byte> bytes)
      : dtype(d), shape(std::move(s)), data(bytes) {}
  template <StorageType T>
  TensorRef(std::span<const T> values, std::vector<std::int64_t> s)
      : dtype(dtype_v<T>), shape(std::move(s)), data(std::as_bytes(values)) {}
  template <StorageType T>
  TensorRef(const std::vector<T>& values, std::vector<std::int64_t> s)
      : TensorRef(std::span<const T>(values.data(), values.size()), std::move(s)) {}
  /// A TensorRef does not own its bytes: a temporary vector would dangle.
  template <StorageType T>
  TensorRef(std::vector<T>&& values, std::vector<std::int64_t> s) = delete;
  template <StorageType T>
  TensorRef(const xt::xarray<T>& a)  // NOLINT: implicit on purpose
      : dtype(dtype_v<T>),
        shape(a.shape().begin(), a.shape().end()),
        data(std::as_bytes(std::span<const T>(a.data(), a.size()))) {}
  template <StorageType T>
  TensorRef(xt::xarray<T>&& a) = delete;  // would dangle

  std::uint64_t expected_bytes() const {
    std::uint64_t n = dtype_size(dtype);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

/// Tensors to save, in file order.
using TensorList = std::vector<std::pair<std::string, TensorRef>>;

struct SaveOptions {
  /// Called after each tensor's bytes are written to the temp file (tests use it to fail midway).
  std::function<void(const std::string& name)> after_tensor;
};

namespace detail {

inline void check_tensor_list(const TensorList& tensors, const std::string& path) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    const std::string where = tensor_where(path, name);
    EDL_CHECK(!name.empty() && name != "__metadata__", errc::invalid_argument, where, "invalid tensor name");
    EDL_CHECK(seen.insert(name).second, errc::invalid_argument, where, "listed twice");
    for (auto d : t.shape)
      EDL_CHECK(d >= 0, errc::invalid_argument, where, "negative extent in shape ", ::edl::detail::shape_str(t.shape));
    EDL_CHECK(t.data.size() == t.expected_bytes(), errc::shape_mismatch, where, "shape ",
              ::edl::detail::shape_str(t.shape), " x ", dtype_name(t.dtype), " needs ", t.expected_bytes(),
              " bytes, but ", t.data.size(), " were given");
  }
}

/// The padded header (without the 8-byte length) for tensors of the given names, dtypes,
/// shapes and byte counts, in that order (the data region holds them back to back).
template <class Entries, class Bytes>
std::string build_header(const Entries& tensors, Bytes&& bytes_of, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    const std::uint64_t n = bytes_of(t);
    h[name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');  // data region starts 8-byte aligned
  return s;
}

inline std::string build_header(const TensorList& tensors, const std::map<std::string, std::string>& metadata) {
  return build_header(tensors, [](const TensorRef& t) { return static_cast<std::uint64_t>(t.data.size()); }, metadata);
}

}  // namespace detail

/// Writes `tensors` (in order) and `metadata` to `path` atomically. Returns the file size.
inline std::uint64_t save_safetensors(const std::string& path, const TensorList& tensors,
                                      const std::map<std::string, std::string>& metadata = {},
                                      const SaveOptions& options = {}) {
  detail::check_tensor_list(tensors, path);
  const std::string header = detail::build_header(tensors, metadata);
  AtomicFile f(path);
  const std::uint64_t n = header.size();
  f.write(&n, 8);
  f.write(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    // Re-checked here so that a tensor whose buffer changed after the header was built cannot
    // produce a file whose header lies about its data.
    EDL_CHECK(t.data.size() == t.expected_bytes(), errc::shape_mismatch, detail::tensor_where(path, name),
              "byte count changed while saving");
    f.write(t.data.data(), t.data.size());
    if (options.after_tensor) options.after_tensor(name);
  }
  const std::uint64_t total = f.bytes_written();
  f.commit();
  return total;
}

// ------------------------------------------------------------------------------------ sharded

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

/// One checkpoint spread over one or more safetensors files (HF layout), read as one.
class ShardedCheckpoint {
 public:
  /// `path` is a folder (model.safetensors.index.json preferred, else model.safetensors), a
  /// .safetensors file, or an index .json file.
  static ShardedCheckpoint open(const std::string& path) {
    namespace fs = std::filesystem;
    ShardedCheckpoint c;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      const fs::path index = fs::path(path) / kIndexFileName, single = fs::path(path) / kSingleFileName;
      if (fs::exists(index, ec)) c.open_index(index.string());
      else if (fs::exists(single, ec)) c.open_single(single.string());
      else
        ::edl::detail::raise(errc::io, path,
                             ::edl::detail::concat("folder holds neither ", kIndexFileName, " nor ", kSingleFileName));
    } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
      c.open_index(path);
    } else {
      c.open_single(path);
    }
    return c;
  }

  /// Tensor names: shard by shard (in file-name order), each in data-offset order.
  const std::vector<std::string>& names() const noexcept { return names_; }
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  /// Paths of the shard files, in file-name order.
  std::vector<std::string> files() const {
    std::vector<std::string> v;
    for (const auto& s : shards_) v.push_back(s.path());
    return v;
  }
  /// The index file, or "" for a single-file checkpoint.
  const std::string& index_path() const noexcept { return index_path_; }
  /// The index's "metadata" object (empty for a single file).
  const nlohmann::ordered_json& index_metadata() const noexcept { return index_metadata_; }

  const SafeTensorsFile& shard_of(const std::string& name) const {
    auto it = where_.find(name);
    EDL_CHECK(it != where_.end(), errc::format, source_ + " tensor " + name, "no such tensor in the checkpoint (",
              names_.size(), " tensors in ", shards_.size(), " file(s))");
    return shards_[it->second];
  }
  const std::string& file_of(const std::string& name) const { return shard_of(name).path(); }
  const TensorInfo& info(const std::string& name) const { return shard_of(name).info(name); }
  std::span<const std::byte> bytes(const std::string& name) const { return shard_of(name).bytes(name); }
  template <StorageType T>
  void read_into(const std::string& name, std::span<T> out) const { shard_of(name).read_into<T>(name, out); }
  template <StorageType T>
  std::vector<T> read_vector(const std::string& name) const { return shard_of(name).read_vector<T>(name); }
  xt::xarray<float> read_f32(const std::string& name) const { return shard_of(name).read_f32(name); }

  /// Sum of the tensors' byte sizes.
  std::uint64_t total_bytes() const {
    std::uint64_t n = 0;
    for (const auto& name : names_) n += info(name).nbytes();
    return n;
  }

 private:
  ShardedCheckpoint() = default;

  void open_single(const std::string& file) {
    source_ = file;
    shards_.push_back(SafeTensorsFile::open(file));
    for (const auto& n : shards_[0].names()) {
      where_[n] = 0;
      names_.push_back(n);
    }
  }

  void open_index(const std::string& index) {
    namespace fs = std::filesystem;
    source_ = index_path_ = index;
    std::ifstream in(index, std::ios::binary);
    EDL_CHECK(in.good(), errc::io, index, "cannot open for reading: ", detail::errno_text());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    nlohmann::ordered_json j = parse_json(text, index);
    EDL_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), errc::format, index,
              "expected an object with a \"weight_map\" object {tensor name: file name}");
    if (j.contains("metadata")) index_metadata_ = j["metadata"];
    const fs::path dir = fs::path(index).parent_path();
    std::map<std::string, std::vector<std::string>> by_file;  // file name -> tensors (sorted files)
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      EDL_CHECK(it.value().is_string(), errc::format, index + " tensor " + it.key(),
                "weight_map value must be a file name, found ", detail::json_snippet(it.value()));
      const std::string file = it.value().get<std::string>();
      EDL_CHECK(!file.empty() && file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
                    file.find('\0') == std::string::npos && file != "." && file != "..",
                errc::format, index + " tensor " + it.key(),
                "weight_map file must be a plain file name in the index's folder, found \"", file, "\"");
      by_file[file].push_back(it.key());
    }
    for (const auto& [file, tensors] : by_file) {
      const std::size_t k = shards_.size();
      shards_.push_back(SafeTensorsFile::open((dir / file).string()));
      const SafeTensorsFile& s = shards_.back();
      std::set<std::string> listed(tensors.begin(), tensors.end());
      for (const auto& t : tensors)
        EDL_CHECK(s.contains(t), errc::format, index + " tensor " + t, "the index maps it to ", s.path(),
                  ", but that file does not hold it");
      for (const auto& n : s.names())
        if (listed.count(n)) {
          where_[n] = k;
          names_.push_back(n);
        }
    }
  }

  std::string source_, index_path_;
  nlohmann::ordered_json index_metadata_ = nlohmann::ordered_json::object();
  std::vector<SafeTensorsFile> shards_;
  std::unordered_map<std::string, std::size_t> where_;
  std::vector<std::string> names_;
};

/// "model-00002-of-00005.safetensors"
inline std::string shard_file_name(std::size_t index1, std::size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index1, count);
  return buf;
}

namespace detail {

/// The first tensor of each shard when tensors of `sizes` bytes are cut into shards of at most
/// `max_shard_bytes` in order (a tensor larger than the limit gets a shard of its own).
inline std::vector<std::size_t> shard_starts(const std::vector<std::uint64_t>& sizes, std::uint64_t max_shard_bytes) {
  std::vector<std::size_t> first;
  std::uint64_t current = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (first.empty() || (current > 0 && current + sizes[i] > max_shard_bytes)) {
      first.push_back(i);
      current = 0;
    }
    current += sizes[i];
  }
  return first;
}

/// Removes the weight files of folder `dir` (model.safetensors, its index, model-*-of-*
/// shards) not in `keep`: leftovers of an earlier save with another layout, so that opening
/// the folder sees only the new one.
inline void remove_other_weight_files(const std::string& dir, const std::set<std::string>& keep) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(dir), ec)) {
    const std::string f = e.path().filename().string();
    const bool ours = f == kSingleFileName || f == kIndexFileName ||
                      (f.rfind("model-", 0) == 0 && f.find("-of-") != std::string::npos && f.size() > 12 &&
                       f.compare(f.size() - 12, 12, ".safetensors") == 0);
    if (ours && !keep.count(f)) fs::remove(e.path(), ec);
  }
}

/// model.safetensors.index.json's text: metadata.total_size and a name-sorted weight_map.
inline std::string index_json(std::uint64_t total, const std::map<std::string, std::string>& weight_map) {
  nlohmann::ordered_json idx;
  idx["metadata"] = {{"total_size", total}};
  idx["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : weight_map) idx["weight_map"][k] = v;
  return idx.dump(2) + "\n";
}

}  // namespace detail

/// Writes `tensors` into folder `dir` in the HF layout: one model.safetensors when everything
/// fits in `max_shard_bytes`, else model-0000i-of-0000N.safetensors files (tensors in the given
/// order, a new shard whenever the next tensor would overflow the current one; a tensor larger
/// than the limit gets a shard of its own) plus model.safetensors.index.json with
/// metadata.total_size and a name-sorted weight_map. Every file is written atomically, the index
/// last; shard files and an index left from an earlier save with another layout are removed.
/// Returns the paths written (shards first, index last).
inline std::vector<std::string> save_sharded(const std::string& dir, const TensorList& tensors,
                                             std::uint64_t max_shard_bytes,
                                             const std::map<std::string, std::string>& metadata = {}) {
  namespace fs = std::filesystem;
  EDL_CHECK(max_shard_bytes > 0, errc::invalid_argument, "io.save_sharded", "max_shard_bytes must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  EDL_CHECK(fs::is_directory(dir), errc::io, dir, "cannot create folder: ", ec.message());
  detail::check_tensor_list(tensors, dir);

  std::vector<std::uint64_t> sizes;
  for (const auto& nt : tensors) sizes.push_back(nt.second.data.size());
  const std::vector<std::size_t> first = detail::shard_starts(sizes, max_shard_bytes);
  std::vector<TensorList> shards;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (shards.size() < first.size() && i == first[shards.size()]) shards.emplace_back();
    shards.back().push_back(tensors[i]);
    total += sizes[i];
  }
  if (shards.empty()) shards.emplace_back();

  std::vector<std::string> written;
  std::set<std::string> keep;
  const fs::path d(dir);
  if (shards.size() == 1) {
    written.push_back((d / kSingleFileName).string());
    save_safetensors(written.back(), shards[0], metadata);
    keep.insert(kSingleFileName);
  } else {
    std::map<std::string, std::string> weight_map;
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string name = shard_file_name(i + 1, shards.size());
      written.push_back((d / name).string());
      save_safetensors(written.back(), shards[i], metadata);
      keep.insert(name);
      for (const auto& nt : shards[i]) weight_map[nt.first] = name;
    }
    written.push_back((d / kIndexFileName).string());
    write_file_atomic(written.back(), detail::index_json(total, weight_map));
    keep.insert(kIndexFileName);
  }
  detail::remove_other_weight_files(dir, keep);
  return written;
}

}  // namespace edl::io
