// edl/io/tfevents.hpp
// TensorBoard's event files (`events.out.tfevents.*`), scalars only: what `tensorboard
// --logdir` plots as curves, written without TensorFlow or protobuf.
//
//   io::EventFileWriter w("run/tensorboard");           // events.out.tfevents.<time>.<host>.<pid>.0
//   w.scalar("loss", 2.31f, /*step=*/10);
//   for (const auto& e : io::read_scalar_events(w.path())) ...   // {wall_time, step, tag, value}
//
// The file is a TFRecord stream: each record is a little-endian u64 length, the masked CRC-32C
// of those 8 bytes, the data, the masked CRC-32C of the data. Each record's data is a
// serialized tensorflow.Event (tensorflow/core/util/event.proto): wall_time (1, double), step
// (2, int64) and either file_version (3, "brain.Event:2", the first record) or a Summary (5)
// whose Values (1) carry tag (1) and simple_value (2, float). The writer flushes each record,
// so a crash leaves whole records (TensorBoard skips a torn last one).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <edl/core/error.hpp>
#include <edl/io/mmap.hpp>

namespace edl::io {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord files.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

/// TFRecord's masked CRC: rotated and offset, so that a CRC stored inside data does not
/// checksum to a fixed value.
inline std::uint32_t masked_crc32c(const void* data, std::size_t n) noexcept {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/// One scalar of an event file.
struct ScalarEvent {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string tag;
  float value = 0;
};

namespace detail {

inline void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_key(std::string& out, std::uint32_t field, std::uint32_t wire_type) { put_varint(out, field << 3 | wire_type); }
template <class T>
void put_fixed(std::string& out, T v) {  // x86 is little-endian, as the wire format
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
inline void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

/// An Event's header fields: wall_time and step.
inline std::string event_header(double wall_time, std::int64_t step) {
  std::string e;
  put_key(e, 1, 1);
  put_fixed(e, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<std::uint64_t>(step));
  return e;
}

/// Reads protobuf fields of one message; an error names the file and what is malformed.
class WireReader {
 public:
  WireReader(std::string_view data, const std::string& where) : d_(data), where_(where) {}
  bool done() const noexcept { return i_ >= d_.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      EDL_CHECK(i_ < d_.size(), errc::format, where_, "a varint runs past the end of its message");
      const auto b = static_cast<unsigned char>(d_[i_++]);
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    ::edl::detail::raise(errc::format, where_, "a varint longer than 10 bytes");
  }
  std::string_view take(std::size_t n) {
    EDL_CHECK(n <= d_.size() - i_, errc::format, where_, "a field of ", n, " bytes runs past the end of its message (",
              d_.size() - i_, " left)");
    const std::string_view s = d_.substr(i_, n);
    i_ += n;
    return s;
  }
  /// Skips a field of `wire_type` (one this reader does not use).
  void skip(std::uint32_t wire_type) {
    switch (wire_type) {
      case 0: varint(); return;
      case 1: take(8); return;
      case 2: take(varint()); return;
      case 5: take(4); return;
      default: ::edl::detail::raise(errc::format, where_, ::edl::detail::concat("unknown wire type ", wire_type));
    }
  }

 private:
  std::string_view d_;
  std::size_t i_ = 0;
  const std::string& where_;
};

template <class T>
T get_fixed(std::string_view b) {
  T v;
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

}  // namespace detail

/// Appends scalar events to a new event file in `dir` (created when missing).
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::filesystem::path& dir) {
    std::filesystem::create_directories(dir);
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    const double now = wall_time();
    path_ = (dir / ("events.out.tfevents." + std::to_string(static_cast<long long>(now)) + "." + host + "." +
                    std::to_string(static_cast<long>(::getpid())) + ".0"))
                .string();
    out_.open(path_, std::ios::binary | std::ios::trunc);
    EDL_CHECK(out_.good(), errc::io, path_, "cannot create the event file: ", detail::errno_text());
    std::string e = detail::event_header(now, 0);
    detail::put_bytes(e, 3, "brain.Event:2");
    record(e);
  }

  const std::string& path() const noexcept { return path_; }

  /// One scalar at `step`, as TensorBoard's simple_value.
  void scalar(std::string_view tag, float value, std::int64_t step) {
    std::string v;
    detail::put_bytes(v, 1, tag);
    detail::put_key(v, 2, 5);
    detail::put_fixed(v, value);
    std::string summary;
    detail::put_bytes(summary, 1, v);
    std::string e = detail::event_header(wall_time(), step);
    detail::put_bytes(e, 5, summary);
    record(e);
  }

 private:
  static double wall_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  void record(const std::string& data) {
    const std::uint64_t n = data.size();
    char head[12];
    std::memcpy(head, &n, 8);
    const std::uint32_t hc = masked_crc32c(head, 8), dc = masked_crc32c(data.data(), data.size());
    std::memcpy(head + 8, &hc, 4);
    out_.write(head, 12);
    out_.write(data.data(), static_cast<std::streamsize>(data.size()));
    out_.write(reinterpret_cast<const char*>(&dc), 4);
    out_.flush();
    EDL_CHECK(out_.good(), errc::io, path_, "write failed: ", detail::errno_text());
  }

  std::string path_;
  std::ofstream out_;
};

/// The scalar events of an event file, in order (other events, such as the file_version
/// record, are skipped). A bad checksum, a torn record or a malformed event is an edl::Error
/// naming the file and the record's offset.
inline std::vector<ScalarEvent> read_scalar_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", detail::errno_text());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<ScalarEvent> out;
  std::size_t off = 0;
  while (off < bytes.size()) {
    const std::string where = path + " record at byte " + std::to_string(off);
    EDL_CHECK(bytes.size() - off >= 12, errc::format, where, "a record header needs 12 bytes, found ", bytes.size() - off);
    const auto n = detail::get_fixed<std::uint64_t>(std::string_view(bytes).substr(off, 8));
    EDL_CHECK(detail::get_fixed<std::uint32_t>(std::string_view(bytes).substr(off + 8, 4)) ==
                  masked_crc32c(bytes.data() + off, 8),
              errc::format, where, "the length's checksum does not match");
    EDL_CHECK(n <= bytes.size() - off - 12 && bytes.size() - off - 12 - n >= 4, errc::format, where, "a record of ", n,
              " bytes runs past the end of the file");
    const std::string_view data = std::string_view(bytes).substr(off + 12, n);
    EDL_CHECK(detail::get_fixed<std::uint32_t>(std::string_view(bytes).substr(off + 12 + n, 4)) ==
                  masked_crc32c(data.data(), data.size()),
              errc::format, where, "the data's checksum does not match");
    off += 12 + n + 4;

    ScalarEvent head;
    std::vector<ScalarEvent> values;
    detail::WireReader ev(data, where);
    while (!ev.done()) {
      const std::uint64_t key = ev.varint();
      const auto field = static_cast<std::uint32_t>(key >> 3), wire = static_cast<std::uint32_t>(key & 7);
      if (field == 1 && wire == 1) head.wall_time = detail::get_fixed<double>(ev.take(8));
      else if (field == 2 && wire == 0) head.step = static_cast<std::int64_t>(ev.varint());
      else if (field == 5 && wire == 2) {
        detail::WireReader summary(ev.take(ev.varint()), where);
        while (!summary.done()) {
          const std::uint64_t sk = summary.varint();
          if (sk != (1u << 3 | 2)) {
            summary.skip(static_cast<std::uint32_t>(sk & 7));
            continue;
          }
          detail::WireReader value(summary.take(summary.varint()), where);
          ScalarEvent s;
          bool has_value = false;
          while (!value.done()) {
            const std::uint64_t vk = value.varint();
            if (vk == (1u << 3 | 2)) s.tag = std::string(value.take(value.varint()));
            else if (vk == (2u << 3 | 5)) s.value = detail::get_fixed<float>(value.take(4)), has_value = true;
            else value.skip(static_cast<std::uint32_t>(vk & 7));
          }
          if (has_value) values.push_back(std::move(s));
        }
      } else ev.skip(wire);
    }
    for (auto& v : values) {
      v.wall_time = head.wall_time;
      v.step = head.step;
      out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace edl::io
