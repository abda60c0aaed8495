// Tests for edl/io/planned_safetensors.hpp: a folder laid out first and filled range by range,
// in any order, is byte for byte the folder save_sharded writes for the same tensors (one
// file or several with the index), and a range outside its tensor is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <edl/io/planned_safetensors.hpp>

#include "../support/folder_bytes.hpp"
#include "../support/temp_dir.hpp"

namespace edl::io {
namespace {

namespace fs = std::filesystem;

using test_support::expect_same_folder;

TEST(PlannedSafetensors, FilledInPiecesEqualsSaveSharded) {
  std::vector<float> a(6 * 5), b(7);
  std::vector<std::uint16_t> c(4 * 3);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i) - 3.0f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i * i);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<std::uint16_t>(0x3f80 + i);
  const TensorList list{{"layer.a", TensorRef(a, {6, 5})},
                        {"b", TensorRef(b, {7})},
                        {"c.bf16", TensorRef(DType::bf16, {4, 3}, std::as_bytes(std::span<const std::uint16_t>(c)))}};
  TensorShapes shapes;
  for (const auto& [name, t] : list) shapes.emplace_back(name, TensorShape{t.dtype, t.shape});
  for (std::uint64_t max_shard : {std::uint64_t{1} << 20, std::uint64_t{100}}) {  // one file; two with an index
    test_support::TempDir want("planned_want"), got("planned_got");
    save_sharded(want.p.string(), list, max_shard, {{"format", "pt"}});
    const PlannedFolder plan(shapes, max_shard, {{"format", "pt"}});
    plan.create(got.p);
    // Every tensor in ranges of 8 bytes, in a shuffled order, by two writers.
    struct Piece {
      std::string name;
      std::uint64_t at, n;
      const std::byte* data;
    };
    std::vector<Piece> pieces;
    for (const auto& [name, t] : list)
      for (std::uint64_t at = 0; at < t.data.size(); at += 8)
        pieces.push_back({name, at, std::min<std::uint64_t>(8, t.data.size() - at), t.data.data() + at});
    std::shuffle(pieces.begin(), pieces.end(), std::mt19937(3));
    PlannedWriter w1(got.p, plan), w2(got.p, plan);
    for (std::size_t i = 0; i < pieces.size(); ++i)
      (i % 2 ? w1 : w2).write(pieces[i].name, pieces[i].at, std::span<const std::byte>(pieces[i].data, pieces[i].n));
    w1.sync();
    w2.sync();
    EXPECT_EQ(plan.files().size(), max_shard == 100 ? 2u : 1u);  // a (120 bytes) alone; b and c
    expect_same_folder(want.p, got.p, "max_shard " + std::to_string(max_shard));
    // And it reads back.
    const auto ck = ShardedCheckpoint::open(got.p.string());
    EXPECT_EQ(ck.read_vector<float>("b"), b);
  }
}

TEST(PlannedSafetensors, RangesOutsideATensorAndUnknownNamesAreRefused) {
  test_support::TempDir dir("planned_bad");
  const PlannedFolder plan({{"w", TensorShape{DType::f32, {2, 2}}}}, 1 << 20);
  plan.create(dir.p);
  PlannedWriter w(dir.p, plan);
  const std::vector<std::byte> four(4), eight(8);
  EXPECT_NO_THROW(w.write("w", 12, four));
  EXPECT_THROW(w.write("w", 12, eight), Error);
  EXPECT_THROW(w.write("w", 17, std::span<const std::byte>()), Error);
  EXPECT_THROW(w.write("v", 0, four), Error);
  EXPECT_THROW(PlannedFolder({{"w", TensorShape{}}, {"w", TensorShape{}}}, 1 << 20), Error);
  EXPECT_THROW(PlannedFolder({{"", TensorShape{}}}, 1 << 20), Error);
  // A writer of a folder that was never created names the file.
  test_support::TempDir empty("planned_empty");
  PlannedWriter none(empty.p, plan);
  try {
    none.write("w", 0, four);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::io);
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace edl::io
