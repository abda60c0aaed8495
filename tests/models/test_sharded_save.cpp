// Tests for edl/models/llama/sharded_save.hpp: a sharded model written block by block, on any
// mesh, is byte for byte the folder save_pretrained writes for the gathered model (plain,
// tied, fused Phi-3, mixture of experts on ep ranks, bf16 storage, a dtype conversion, HF
// shards with an index), and it loads back on another mesh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded_pretrained.hpp>
#include <edl/models/llama/sharded_save.hpp>

#include "../support/folder_bytes.hpp"
#include "../support/same_params.hpp"
#include "../support/temp_dir.hpp"

namespace edl::models {
namespace {

namespace fs = std::filesystem;

using test_support::expect_same_folder;
using test_support::fixture;

TEST(ShardedSave, EqualsSavePretrainedOfTheGatheredModel) {
  struct Case {
    const char* folder;
    MeshDims dims;
  };
  for (const Case& c : {Case{"tiny_hf", {1, 2, 1, 2, 1}}, Case{"tiny_hf", {2, 1, 1, 1, 2}}, Case{"tiny_phi3", {1, 1, 1, 2, 1}},
                        Case{"tiny_phi3", {1, 2, 1, 1, 1}}, Case{"tiny_gemma3", {1, 2, 1, 1, 1}},
                        Case{"tiny_mixtral", {1, 1, 2, 1, 1}}, Case{"tiny_mixtral", {1, 2, 2, 1, 1}},
                        // hidden 16 over fsdp = 3, vocabulary 64 over fsdp x tp = 6: uneven blocks
                        Case{"tiny_hf", {1, 3, 1, 1, 1}}, Case{"tiny_hf", {1, 3, 1, 2, 1}}, Case{"tiny_phi3", {1, 3, 1, 1, 1}}}) {
    const auto mesh = create_mesh(c.dims);
    const std::string where = std::string(c.folder) + " on " + mesh.shape().axes_str();
    auto sm = from_pretrained_sharded<>(fixture(c.folder), mesh);
    test_support::TempDir want("sharded_save_want"), got("sharded_save_got");
    save_pretrained(want.p, sm.gather_model());
    const ShardedSaveStats st = save_pretrained_sharded(got.p, sm);
    expect_same_folder(want.p, got.p, where);
    // Each distinct block once: the tensors' bytes, no more.
    std::int64_t bytes = 0;
    for (const auto& n : sm.names()) {
      std::int64_t e = 4;  // F32
      for (auto x : sm.param(n).layout().global_shape()) e *= x;
      bytes += e;
    }
    EXPECT_EQ(st.bytes_written, bytes) << where;
    // It loads back on other meshes, one device and an uneven split, as the model it was.
    auto before = sm.gather_model();
    for (const MeshDims& other : {MeshDims{1, 1, 1, 1, 1}, MeshDims{1, 3, 1, 1, 1}}) {
      auto back = from_pretrained_sharded<>(got.p, create_mesh(other));
      auto after = back.gather_model();
      test_support::expect_same_params(before, after, where);
    }
  }
}

TEST(ShardedSave, DtypesAndShardsFollowSavePretrained) {
  const auto mesh = create_mesh({1, 2, 1, 2, 1});
  auto sm = from_pretrained_sharded<>(fixture("tiny_hf"), mesh);
  for (const SavePretrainedOptions o : {SavePretrainedOptions{.max_shard_bytes = 20'000, .dtype = std::nullopt},
                                        SavePretrainedOptions{.dtype = DType::bf16},
                                        SavePretrainedOptions{.max_shard_bytes = 30'000, .dtype = DType::f16}}) {
    test_support::TempDir want("sharded_save_want"), got("sharded_save_got");
    save_pretrained(want.p, sm.gather_model(), o);
    save_pretrained_sharded(got.p, sm, o);
    expect_same_folder(want.p, got.p, "max_shard_bytes " + std::to_string(o.max_shard_bytes));
  }
  // bf16 parameters are written as they are stored.
  auto sb = from_pretrained_sharded<BF16ParamsPolicy>(fixture("tiny_hf"), mesh);
  test_support::TempDir want("sharded_save_want"), got("sharded_save_got");
  save_pretrained(want.p, sb.gather_model());
  save_pretrained_sharded(got.p, sb);
  expect_same_folder(want.p, got.p, "bf16 parameters");
  // A re-save with fewer files leaves no stale shard behind.
  save_pretrained_sharded(got.p, sb, {.max_shard_bytes = 10'000, .dtype = std::nullopt});
  save_pretrained_sharded(got.p, sb);
  expect_same_folder(want.p, got.p, "re-saved as one file");
}

}  // namespace
}  // namespace edl::models
