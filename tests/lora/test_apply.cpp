// lora::apply_lora / merge_lora / unwrap_lora / split_lora_params / config_of on the tiny model.
#include <gtest/gtest.h>

#include <cstring>

#include <edl/lora/apply.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/quantize.hpp>

#include "lora_test_util.hpp"

using namespace edl;
using namespace edl_lora_test;

namespace {

lora::LoraConfig all_linear(std::int64_t r = 4) {
  lora::LoraConfig c;
  c.r = r;
  c.lora_alpha = 8;
  c.target_modules = {"all-linear"};
  return c;
}

// Gives every adapter nonzero B (a trained adapter).
template <class M>
void randomize_b(M& m, float scale = 0.2f) {
  std::uint32_t i = 0;
  m.visit_linears("", [&](const std::string&, auto& lin) {
    if (!lin.lora) return;
    fill_normal(fold_in(Key::from_seed(99), i++), 0, std::span<float>(lin.lora->B.data(), lin.lora->B.value.size()),
                0.0f, scale);
  });
}

}  // namespace

TEST(LoraApply, FreshAdapterLeavesLogitsBitForBitAndFreezesTheBase) {
  auto m = models::from_pretrained(tiny_hf());
  const auto ids = tokens();
  const auto before = logits(m, ids);
  EXPECT_FALSE(lora::lora_is_enabled(m));
  EXPECT_EQ(lora::apply_lora(m, all_linear()), 14);  // 7 Linears x 2 layers, not lm_head
  EXPECT_TRUE(lora::lora_is_enabled(m));
  const auto after = logits(m, ids);
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);

  // Training touches adapters only: the base gets no gradient buffer and keeps its bits.
  m.forward_backward(ids.data(), nn::TokenLayout{2, 8});
  std::int64_t adapter_grads = 0;
  m.visit_params("", [&](std::string_view path, auto& p) {
    const bool adapter = path.find(".lora_") != std::string_view::npos;
    EXPECT_EQ(p.has_grad(), adapter) << path;
    if (!adapter) {
      EXPECT_EQ(p.grad.size(), 0u) << path;
    }
    adapter_grads += adapter;
  });
  EXPECT_EQ(adapter_grads, 28);
}

TEST(LoraApply, MergedEqualsUnmergedAndUnwrapRestoresTheBase) {
  auto m = models::from_pretrained(tiny_hf());
  const auto ids = tokens();
  const auto base = logits(m, ids);
  lora::apply_lora(m, all_linear());
  randomize_b(m);
  const auto adapted = logits(m, ids);
  EXPECT_GT(max_abs_diff(adapted, base.data()), 1e-2);  // the adapter does change the model

  auto merged = m;
  EXPECT_EQ(lora::merge_lora(merged), 14);
  EXPECT_FALSE(lora::lora_is_enabled(merged));
  EXPECT_LT(max_abs_diff(logits(merged, ids), adapted.data()), 2e-5);
  merged.visit_params("", [](std::string_view path, auto& p) { EXPECT_FALSE(p.frozen) << path; });

  EXPECT_EQ(lora::unwrap_lora(m), 14);
  const auto unwrapped = logits(m, ids);
  EXPECT_EQ(std::memcmp(unwrapped.data(), base.data(), base.size() * sizeof(float)), 0);
}

TEST(LoraApply, QLoRAMergeDequantizesTheBase) {
  models::LlamaConfig c;
  c.vocab_size = 64, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 1;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 32;
  models::LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(5));
  nn::quantize(m, {quant::Format::nf4});
  const std::vector<std::int64_t> ids = {1, 5, 9, 13, 2, 7, 11, 3};
  lora::apply_lora(m, all_linear(8));
  randomize_b(m, 0.05f);
  const auto adapted = logits(m, ids, 1);
  EXPECT_TRUE(nn::is_quantized(m));
  lora::merge_lora(m);
  EXPECT_FALSE(nn::is_quantized(m));
  EXPECT_LT(max_abs_diff(logits(m, ids, 1), adapted.data()), 1e-4);
}

TEST(LoraApply, TargetsFollowPeftNamesAndRegexes) {
  auto m = models::from_pretrained(tiny_hf());
  lora::LoraConfig c;
  c.target_modules = {"q_proj", "v_proj"};
  EXPECT_EQ(lora::apply_lora(m, c), 4);
  lora::LoraConfig back = lora::config_of(m);
  EXPECT_EQ(back.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_TRUE(back.target_regex.empty());
  lora::unwrap_lora(m);

  c.target_regex = R"(model\.layers\.1\.mlp\.(up|down)_proj)";
  EXPECT_EQ(lora::apply_lora(m, c), 2);
  back = lora::config_of(m);  // a subset of the up/down Linears: written back as exact paths
  ASSERT_FALSE(back.target_regex.empty());
  auto again = models::from_pretrained(tiny_hf());
  EXPECT_EQ(lora::apply_lora(again, back), 2);
  EXPECT_EQ(lora::split_lora_params(again).size(), 4u);
  EXPECT_EQ(lora::split_lora_params(again)[0].name, "model.layers.1.mlp.up_proj.lora_A.weight");
}

TEST(LoraApply, BadTargetsAreRefusedBeforeAnythingChanges) {
  auto m = models::from_pretrained(tiny_hf());
  lora::LoraConfig c;
  c.target_modules = {"q_proj", "qkv_proj"};
  try {
    lora::apply_lora(m, c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv_proj"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(lora::lora_is_enabled(m));
  m.visit_params("", [](std::string_view path, auto& p) { EXPECT_FALSE(p.frozen) << path; });
  c.target_modules = {"lm_head"};
  EXPECT_THROW(lora::apply_lora(m, c), Error);
  c.target_modules = {"q_proj"};
  c.r = 0;
  EXPECT_THROW(lora::apply_lora(m, c), Error);
  c.r = 4;
  c.target_regex = "nothing\\.here";
  EXPECT_THROW(lora::apply_lora(m, c), Error);
  c.target_regex = "(unclosed";
  EXPECT_THROW(lora::apply_lora(m, c), Error);
}
