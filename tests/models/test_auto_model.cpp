// models/llama/auto_model.hpp: the head config.json's "architectures" names. A causal LM's
// folder gives from_pretrained's model; a classifier's folder gives the classifier it saved; a
// classifier read from a causal LM's folder has its decoder and a score head drawn by the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

#include <edl/io/json_config.hpp>
#include <edl/models/llama/auto_model.hpp>
#include "support/temp_dir.hpp"

using namespace edl;
using models::LlamaConfig;
using models::LlamaForCausalLM;
using models::LlamaForSequenceClassification;
namespace fs = std::filesystem;

namespace {

fs::path tiny_hf() {
  const char* env = std::getenv("EDL_TEST_DATA");
  return fs::path(env ? env : "tests/data") / "tiny_hf";
}

template <class M>
std::vector<float> values(M& m) {
  std::vector<float> v;
  m.visit_params("", [&](std::string_view, auto& p) { v.insert(v.end(), p.data(), p.data() + p.value.size()); });
  return v;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// Copies tiny_hf's folder with config.json's "architectures" (and num_labels) changed.
void copy_with_architecture(const fs::path& to, const std::string& architecture, bool huge = false) {
  fs::create_directories(to);
  fs::copy_file(tiny_hf() / "model.safetensors", to / "model.safetensors");
  auto cfg = LlamaConfig::from_file((tiny_hf() / "config.json").string());
  cfg.extra["architectures"] = {architecture};
  cfg.num_labels = 3;
  if (huge) cfg.hidden_size = std::int64_t{1} << 20, cfg.intermediate_size = std::int64_t{1} << 22;
  cfg.save((to / "config.json").string());
}

}  // namespace

TEST(AutoModel, TheHeadFollowsTheArchitectures) {
  if (!fs::exists(tiny_hf() / "model.safetensors")) FAIL() << "no fixture at " << tiny_hf() << " (EDL_TEST_DATA)";
  test_support::TempDir tmp("auto_model");

  // A causal LM's folder: from_pretrained's model.
  auto any = models::auto_from_pretrained(tiny_hf());
  ASSERT_TRUE(std::holds_alternative<LlamaForCausalLM<>>(any));
  auto want = models::from_pretrained(tiny_hf());
  EXPECT_EQ(values(std::get<LlamaForCausalLM<>>(any)), values(want));

  // A classifier from it: the decoder's weights, a score head N(0, initializer_range) by the key.
  const auto cls = models::sequence_classification_from_pretrained(tiny_hf(), {}, Key::from_seed(5));
  auto decoder = cls.model;
  EXPECT_EQ(values(decoder), values(want.model));
  EXPECT_EQ(cls.num_labels(), want.config().num_labels);
  auto score = cls.score;
  auto drawn = cls.score;
  drawn.init(Key::from_seed(5), static_cast<float>(want.config().initializer_range));
  EXPECT_EQ(values(score), values(drawn));
  double sq = 0;
  for (float x : values(score)) sq += static_cast<double>(x) * x;
  const double rms = std::sqrt(sq / static_cast<double>(score.weight.value.size()));
  EXPECT_GT(rms, 0.3 * want.config().initializer_range);
  EXPECT_LT(rms, 3.0 * want.config().initializer_range);

  // The classifier saved: its folder names it, and auto_from_pretrained gives it back whole.
  auto saved = cls;
  models::save_pretrained(tmp.p / "cls", saved);
  auto back = models::auto_from_pretrained(tmp.p / "cls");
  ASSERT_TRUE(std::holds_alternative<LlamaForSequenceClassification<>>(back));
  EXPECT_EQ(values(std::get<LlamaForSequenceClassification<>>(back)), values(saved));
  const auto again = models::sequence_classification_from_pretrained(tmp.p / "cls", {}, Key::from_seed(99));
  auto again_score = again.score;
  EXPECT_EQ(values(again_score), values(score));  // read, not drawn

  // A folder that names a classifier but holds no score head is an error naming the tensor.
  copy_with_architecture(tmp.p / "no_score", "LlamaForSequenceClassification");
  const std::string e1 = error_of([&] { models::auto_from_pretrained(tmp.p / "no_score"); });
  EXPECT_NE(e1.find("score.weight"), std::string::npos) << e1;
  // A config whose sizes the weights beside it do not have is an error naming a tensor, before
  // anything of the config's size (here terabytes) is allocated.
  copy_with_architecture(tmp.p / "huge", "LlamaForCausalLM", /*huge=*/true);
  const std::string e3 = error_of([&] { models::sequence_classification_from_pretrained(tmp.p / "huge"); });
  EXPECT_NE(e3.find("model.embed_tokens.weight"), std::string::npos) << e3;
  EXPECT_NE(e3.find("has shape"), std::string::npos) << e3;
  // Heads edl does not build are named.
  copy_with_architecture(tmp.p / "token_cls", "LlamaForTokenClassification");
  const std::string e2 = error_of([&] { models::auto_from_pretrained(tmp.p / "token_cls"); });
  EXPECT_NE(e2.find("LlamaForTokenClassification"), std::string::npos) << e2;
  EXPECT_NE(e2.find("architectures"), std::string::npos) << e2;
  // "architectures" must be a list of names.
  auto cfg = LlamaConfig::from_file((tiny_hf() / "config.json").string());
  cfg.extra["architectures"] = "LlamaForCausalLM";
  EXPECT_THROW(models::head_of(cfg), Error);
  cfg.extra.erase("architectures");
  EXPECT_EQ(models::head_of(cfg), models::LlamaHead::causal_lm);  // older configs
}
