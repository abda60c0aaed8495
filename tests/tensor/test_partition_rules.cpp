// Tests for edl/tensor/partition_rules.hpp: first match wins, separators '.' and '/' both
// match, short specs replicate the rest, and errors name the parameter path and the rule.
#include <gtest/gtest.h>

#include <edl/mesh/all.hpp>
#include <edl/tensor/all.hpp>

namespace edl {
namespace {

TEST(PartitionRules, FirstMatchWins) {
  PartitionRules rules{{"q_proj", SpecValue{{{"tp"}, {}}}}, {"proj", SpecValue{{{}, {"tp"}}}}, {".*", SpecValue{}}};
  MeshShape mesh({"dp", "tp"}, {1, 2});
  EXPECT_EQ(rules.spec_for("model.layers.0.self_attn.q_proj.weight", {4, 4}, mesh), (SpecValue{{{"tp"}, {}}}));
  EXPECT_EQ(rules.spec_for("model.layers.0.self_attn.o_proj.weight", {4, 4}, mesh), (SpecValue{{{}, {"tp"}}}));
  EXPECT_EQ(rules.spec_for("model.norm.weight", {4}, mesh), (SpecValue{{{}}}));
}

TEST(PartitionRules, NoMatchNamesThePath) {
  PartitionRules rules{{"q_proj", SpecValue{{{"tp"}}}}};
  MeshShape mesh({"tp"}, {2});
  try {
    (void)rules.spec_for("model.embed_tokens.weight", {8, 4}, mesh);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::no_matching_rule);
    EXPECT_EQ(e.where(), "model.embed_tokens.weight");
  }
}

TEST(PartitionRules, RuleThatDoesNotFitNamesPathAndRule) {
  PartitionRules rules{{"weight", SpecValue{{{"tp"}, {}, {}}}}, {"bias", SpecValue{{{"tp"}}}}};
  MeshShape mesh({"tp"}, {4});
  try {
    (void)rules.spec_for("lm_head.weight", {8, 4}, mesh);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("\"weight\""), std::string::npos);
  }
  // A dimension the axes do not divide is a valid (uneven) split.
  EXPECT_EQ(rules.spec_for("model.layers.1.self_attn.q_proj.bias", {6}, mesh), (SpecValue{{{"tp"}}}));
  EXPECT_THROW(PartitionRules({{"(unclosed", SpecValue{}}}), Error);
}

TEST(PartitionRules, DefaultLlamaRulesShardEveryTinyParameter) {
  auto mesh = create_mesh({1, 2, 2, 1});
  const auto rules = llama_partition_rules();
  const std::int64_t H = 64, F = 128, V = 256;
  struct Case {
    std::string path;
    std::vector<std::int64_t> shape;
    SpecValue expected;
  };
  const SpecValue col{{{"tp"}, {"fsdp", "sp"}}}, row{{{"fsdp", "sp"}, {"tp"}}}, rep{{{}}};
  const std::vector<Case> cases = {
      {"model.embed_tokens.weight", {V, H}, col},
      {"model.layers.0.self_attn.q_proj.weight", {H, H}, col},
      {"model.layers.0.self_attn.k_proj.weight", {H / 2, H}, col},
      {"model.layers.0.self_attn.o_proj.weight", {H, H}, row},
      {"model.layers.11.mlp.gate_proj.weight", {F, H}, col},
      {"model.layers.11.mlp.up_proj.weight", {F, H}, col},
      {"model.layers.11.mlp.down_proj.weight", {H, F}, row},
      {"model.layers.3.input_layernorm.weight", {H}, rep},
      {"model.layers.3.post_attention_layernorm.weight", {H}, rep},
      {"model.layers.3.self_attn.q_norm.weight", {H / 4}, rep},
      {"model.layers.3.self_attn.k_norm.weight", {H / 4}, rep},
      {"model.norm.weight", {H}, rep},
      {"lm_head.weight", {V, H}, col},
      {"model.layers.0.self_attn.q_proj.bias", {H}, SpecValue{{{"tp"}}}},
      {"model.layers.0.self_attn.o_proj.bias", {H}, rep},
      {"model.layers.11.mlp.gate_proj.bias", {F}, SpecValue{{{"tp"}}}},
      {"model.layers.11.mlp.up_proj.bias", {F}, SpecValue{{{"tp"}}}},
      {"model.layers.11.mlp.down_proj.bias", {H}, rep},
  };
  for (const auto& c : cases) EXPECT_EQ(rules.spec_for(c.path, c.shape, mesh.shape()), c.expected) << c.path;
  // The rules shard real tensors: fsdp x tp holds a quarter of each matrix per device.
  xt::xarray<float> w = xt::zeros<float>({static_cast<std::size_t>(F), static_cast<std::size_t>(H)});
  auto s = shard(w, rules.spec_for("model.layers.0.mlp.up_proj.weight", {F, H}, mesh.shape()), mesh);
  EXPECT_EQ(s.local_bytes() * 4, static_cast<std::int64_t>(w.size() * sizeof(float)));
}

}  // namespace
}  // namespace edl

// EasyDeL's get_names_from_partition_spec: the axes a spec splits over, in order, each once.
TEST(PartitionSpec, AxisNamesInOrder) {
  EXPECT_EQ(edl::SpecValue({{"dp", "fsdp"}, {}, {"tp"}}).axis_names(), (std::vector<std::string>{"dp", "fsdp", "tp"}));
  EXPECT_EQ(edl::SpecValue({{"tp"}, {"fsdp", "sp"}}).axis_names(), (std::vector<std::string>{"tp", "fsdp", "sp"}));
  EXPECT_TRUE(edl::SpecValue({{}, {}}).axis_names().empty());
  EXPECT_EQ(edl::llama_partition_rules()
                .spec_for("model.layers.0.block_sparse_moe.experts.3.w2.weight", {16, 24},
                          edl::create_mesh({1, 2, 1, 1}).shape())
                .axis_names(),
            (std::vector<std::string>{"fsdp", "sp", "tp"}));
}
