// Tests for edl/nn/module_tree.hpp: the printed tree holds every parameter with its shape,
// dtype and matching spec, counts that add up to the model's, and folds identical numbered
// layers (but not layers whose specs differ).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include <edl/models/llama/llama.hpp>
#include <edl/nn/module_tree.hpp>

namespace edl {
namespace {

models::LlamaConfig tree_config() {
  models::LlamaConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.validate();
  return c;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string with_commas(std::int64_t n) {
  std::string d = std::to_string(n), out;
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return out;
}

TEST(ModuleTree, EveryParameterWithShapeDtypeAndSpecAndFoldedLayers) {
  models::LlamaForCausalLM<> m(tree_config());
  const PartitionRules rules = llama_partition_rules();
  const std::string text = nn::module_repr(m, "LlamaForCausalLM", &rules);
  const auto lines = lines_of(text);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "LlamaForCausalLM: " + with_commas(m.param_count()) + " parameters (F32)") << text;
  // The three layers are alike: one folded entry, each parameter printed once for all of them.
  const std::int64_t per_layer = m.model.layers[0].param_count();
  EXPECT_NE(text.find("    layers: " + with_commas(3 * per_layer) + " parameters\n"), std::string::npos) << text;
  EXPECT_NE(text.find("      0-2: " + with_commas(per_layer) + " parameters each\n"), std::string::npos) << text;
  std::size_t leaves = 0;
  for (const auto& l : lines) leaves += l.find(" F32 ") != std::string::npos;
  EXPECT_EQ(leaves, 1u + 9u + 2u);  // embeddings, one layer's nine, the final norm, the head
  // Each parameter's line: its last name, its shape, its dtype and the spec its path matches.
  for (const auto& [path, shape] : nn::named_shapes(m)) {
    if (path.find("layers.") != std::string::npos && path.find("layers.0.") == std::string::npos) continue;
    const std::string leaf = path.substr(path.rfind('.') + 1);
    const std::string spec = rules.rules()[static_cast<std::size_t>(rules.match(path))].spec.str();
    EXPECT_NE(text.find(" " + leaf + " " + detail::shape_str(shape) + " F32 " + spec + "\n"), std::string::npos)
        << path << "\n" << text;
  }
  // Without rules: no specs. With a rule that sets layer 1 apart: it is printed on its own.
  EXPECT_EQ(nn::module_repr(m, "m").find("P("), std::string::npos);
  PartitionRules apart;
  apart.add("layers/1/", SpecValue{});
  for (const auto& r : rules.rules()) apart.add(r.pattern, r.spec);
  const std::string split = nn::module_repr(m, "m", &apart);
  EXPECT_NE(split.find("      0: " + with_commas(per_layer) + " parameters\n"), std::string::npos) << split;
  EXPECT_NE(split.find("      1: " + with_commas(per_layer) + " parameters\n"), std::string::npos) << split;
  EXPECT_NE(split.find("      2: " + with_commas(per_layer) + " parameters\n"), std::string::npos) << split;
}

TEST(ModuleTree, Bf16ParametersNameTheirDtype) {
  models::LlamaForCausalLM<BF16ParamsPolicy> m(tree_config());
  const std::string text = nn::module_repr(m, "LlamaForCausalLM");
  EXPECT_NE(text.find("(BF16)"), std::string::npos) << text;
  EXPECT_NE(text.find("weight (32, 16) BF16"), std::string::npos) << text;
}

}  // namespace
}  // namespace edl
