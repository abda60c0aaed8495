// Tests for edl/io/tfevents.hpp: CRC-32C against RFC 3720's vectors, an event's bytes against
// the protobuf encoding written out by hand from event.proto / summary.proto, the reader's
// round trip, and damaged files named.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/tfevents.hpp>
#include "support/temp_dir.hpp"

using namespace edl;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// The records' data of a TFRecord stream, by a reading of the format independent of the
/// library's (lengths only; the checksums are checked by hand below).
std::vector<std::string> records(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t off = 0;
  while (off + 12 <= bytes.size()) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[off + static_cast<std::size_t>(i)]);
    out.push_back(bytes.substr(off + 12, n));
    off += 12 + n + 4;
  }
  EXPECT_EQ(off, bytes.size());
  return out;
}

}  // namespace

TEST(TfEvents, Crc32cMatchesRfc3720) {
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) up[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
  for (int i = 0; i < 32; ++i) down[static_cast<std::size_t>(i)] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(io::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(io::crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(io::crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(io::crc32c(down.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(io::crc32c("123456789", 9), 0xE3069283u);
  const std::uint32_t c = io::crc32c("123456789", 9);
  EXPECT_EQ(io::masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TfEvents, ScalarEventIsTheProtobufEncodingOfEventAndSummary) {
  test_support::TempDir dir("tfevents_bytes");
  std::string path;
  {
    io::EventFileWriter w(dir.p);
    path = w.path();
    w.scalar("loss", 2.5f, 7);
    w.scalar("eval/acc", -0.125f, 300);
  }
  EXPECT_EQ(std::filesystem::path(path).parent_path(), dir.p);
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::string bytes = slurp(path);
  // Every record's checksums, as TFRecord defines them.
  for (std::size_t off = 0; off < bytes.size();) {
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data() + off, 8);
    std::uint32_t hc = 0, dc = 0;
    std::memcpy(&hc, bytes.data() + off + 8, 4);
    std::memcpy(&dc, bytes.data() + off + 12 + n, 4);
    EXPECT_EQ(hc, io::masked_crc32c(bytes.data() + off, 8));
    EXPECT_EQ(dc, io::masked_crc32c(bytes.data() + off + 12, n));
    off += 12 + n + 4;
  }
  const auto r = records(bytes);
  ASSERT_EQ(r.size(), 3u);
  // Event{wall_time (1, fixed64) = t, step (2, varint), file_version (3) | summary (5)}.
  const auto wall_time = [](const std::string& e) {
    EXPECT_EQ(static_cast<unsigned char>(e[0]), 0x09);
    double t = 0;
    std::memcpy(&t, e.data() + 1, 8);
    return t;
  };
  const double t0 = wall_time(r[0]);
  EXPECT_GT(t0, 1.6e9);  // seconds since 1970, after 2020
  EXPECT_EQ(r[0].substr(9), std::string("\x10\x00\x1a\x0d" "brain.Event:2", 17));
  EXPECT_GE(wall_time(r[1]), t0);
  // step 7; summary (5, 13 bytes) { value (1, 11 bytes) { tag (1) "loss", simple_value (2, fixed32) 2.5 } }
  EXPECT_EQ(r[1].substr(9), std::string("\x10\x07\x2a\x0d\x0a\x0b\x0a\x04loss\x15\x00\x00\x20\x40", 17));
  // step 300 = varint ac 02; -0.125f = 0xbe000000
  EXPECT_EQ(r[2].substr(9), std::string("\x10\xac\x02\x2a\x11\x0a\x0f\x0a\x08" "eval/acc\x15\x00\x00\x00\xbe", 22));

  const auto ev = io::read_scalar_events(path);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].tag, "loss");
  EXPECT_EQ(ev[0].value, 2.5f);
  EXPECT_EQ(ev[0].step, 7);
  EXPECT_EQ(ev[0].wall_time, wall_time(r[1]));
  EXPECT_EQ(ev[1].tag, "eval/acc");
  EXPECT_EQ(ev[1].value, -0.125f);
  EXPECT_EQ(ev[1].step, 300);
}

TEST(TfEvents, DamagedFilesAreNamed) {
  test_support::TempDir dir("tfevents_damaged");
  std::string path;
  {
    io::EventFileWriter w(dir.p);
    path = w.path();
    w.scalar("loss", 1.0f, 1);
  }
  const std::string good = slurp(path);
  const auto expect_error = [&](const std::string& bytes, const std::string& what) {
    const std::string bad = dir.file("bad", bytes);
    try {
      io::read_scalar_events(bad);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), errc::format) << what;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  };
  for (std::size_t i = 0; i < good.size(); i += 7) {  // any flipped byte breaks a checksum
    std::string b = good;
    b[i] = static_cast<char>(b[i] ^ 0x20);
    expect_error(b, "byte " + std::to_string(i) + " flipped");
  }
  for (std::size_t cut : {good.size() - 1, good.size() - 5, std::size_t{5}}) expect_error(good.substr(0, cut), "cut");
  EXPECT_THROW(io::read_scalar_events((dir.p / "missing").string()), Error);
  EXPECT_TRUE(io::read_scalar_events(dir.file("empty", "")).empty());
}
