// Tests for edl/models/llama/sharded_pretrained.hpp: a HF folder loaded straight onto a mesh
// equals from_pretrained sharded, bit for bit (plain, fused Phi-3, Gemma 3 nested, mixture of
// experts on ep ranks, bf16 storage), reads exactly the bytes of the blocks the devices hold,
// and a folder that disagrees with its config is an error naming the tensor.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded_pretrained.hpp>

#include "../support/folder_bytes.hpp"
#include "../support/same_params.hpp"
#include "../support/temp_dir.hpp"

namespace edl::models {
namespace {

namespace fs = std::filesystem;

using test_support::fixture;
using test_support::expect_same_params;

TEST(ShardedPretrained, EqualsFromPretrainedShardedAndReadsOnlyTheHeldBlocks) {
  struct Case {
    const char* folder;
    MeshDims dims;
  };
  for (const Case& c : {Case{"tiny_hf", {1, 2, 1, 2, 1}}, Case{"tiny_hf", {2, 1, 1, 1, 2}}, Case{"tiny_phi3", {1, 1, 1, 2, 1}},
                        Case{"tiny_gemma3", {1, 2, 1, 1, 1}}, Case{"tiny_mixtral", {1, 1, 2, 1, 1}}}) {
    const std::string where = std::string(c.folder) + " on " + create_mesh(c.dims).shape().axes_str();
    auto want = from_pretrained<>(fixture(c.folder));
    auto mesh = create_mesh(c.dims);
    ShardedLoadStats st;
    auto sm = from_pretrained_sharded<>(fixture(c.folder), mesh, llama_partition_rules(), &st);
    auto got = sm.gather_model();
    expect_same_params(want, got, where);
    // Every device here holds its blocks; each was read once, in the file's dtype.
    const auto ckpt = io::ShardedCheckpoint::open(fixture(c.folder).string());
    std::int64_t blocks = 0, elements = 0;
    for (const auto& name : sm.names())
      for (std::int64_t d = 0; d < mesh.size(); ++d)
        if (sm.param(name).layout().local_elements(d) > 0) ++blocks, elements += sm.param(name).layout().local_elements(d);
    EXPECT_EQ(st.blocks_read, blocks) << where;
    const auto esize = static_cast<std::int64_t>(dtype_size(ckpt.info(ckpt.names().front()).dtype));
    EXPECT_EQ(st.parameter_bytes_read, elements * esize) << where;
  }
  // bf16 storage rounds as from_pretrained<BF16ParamsPolicy> does.
  auto want = from_pretrained<BF16ParamsPolicy>(fixture("tiny_hf"));
  auto sm = from_pretrained_sharded<BF16ParamsPolicy>(fixture("tiny_hf"), create_mesh({1, 2, 1, 1, 1}));
  auto got = sm.gather_model();
  expect_same_params(want, got, "bf16");
}

TEST(ShardedPretrained, AFolderThatDisagreesWithItsConfigNamesTheTensor) {
  test_support::TempDir dir("sharded_pretrained_bad");
  for (const auto& e : fs::directory_iterator(fixture("tiny_hf")))
    if (e.is_regular_file()) fs::copy_file(e.path(), dir.p / e.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir.p / "config.json"));
  cfg["intermediate_size"] = cfg["intermediate_size"].get<int>() * 2;
  std::ofstream(dir.p / "config.json") << cfg.dump();
  try {
    from_pretrained_sharded<>(dir.p, create_mesh({1, 2, 1, 1, 1}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("mlp.gate_proj.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(from_pretrained_sharded<>(dir.p / "missing", create_mesh({1, 2, 1, 1, 1})), Error);
}

}  // namespace
}  // namespace edl::models
