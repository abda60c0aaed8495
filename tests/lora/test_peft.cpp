// PEFT adapter folders: a PEFT-layout adapter made by the PyTorch reference (scripts/lora_reference.py)
// gives its logits and gradients; save/load round trips; malformed folders give clear errors.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include <edl/io/safetensors.hpp>
#include <edl/lora/peft.hpp>
#include <edl/models/llama/llama.hpp>

#include "lora_test_util.hpp"

using namespace edl;
using namespace edl_lora_test;

namespace {

fs::path reference() { return tiny_hf() / "lora"; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}
void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(2); }

// A copy of the reference adapter folder whose config is edited by `edit`.
fs::path edited_copy(const TempDir& t, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = t.path / "edited";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(reference() / "adapter" / lora::kAdapterWeightsFile, dir / lora::kAdapterWeightsFile);
  auto j = read_json(reference() / "adapter" / lora::kAdapterConfigFile);
  edit(j);
  write_json(dir / lora::kAdapterConfigFile, j);
  return dir;
}

}  // namespace

TEST(LoraPeft, PeftAdapterLogitsAndGradientsMatchThePyTorchReference) {
  auto m = models::from_pretrained(tiny_hf());
  const lora::LoraConfig c = lora::load_adapter(reference() / "adapter", m);
  EXPECT_EQ(c.r, 4);
  EXPECT_EQ(c.target_modules.size(), 7u);
  const auto ids = tokens();
  const auto want = io::load_npy<float>((reference() / "logits.npy").string());
  const auto got = logits(m, ids);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(max_abs_diff(got, want.data()), 1e-4);

  // d loss / d lora_A, lora_B against torch's autograd.
  m.forward_backward(ids.data(), nn::TokenLayout{2, 8});
  const auto grads = io::SafeTensorsFile::open((reference() / "grads.safetensors").string());
  std::size_t checked = 0;
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (path.find(".lora_") == std::string_view::npos) return;
    const auto g = grads.read_vector<float>(std::string(lora::kPeftPrefix) + std::string(path));
    ASSERT_EQ(g.size(), p.grad.size()) << path;
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      scale = std::max(scale, double(std::fabs(g[i])));
      worst = std::max(worst, double(std::fabs(g[i] - p.grad.data()[i])));
    }
    EXPECT_LE(worst, 1e-4 * scale + 1e-7) << path;
    ++checked;
  });
  EXPECT_EQ(checked, 28u);

  // Merged weights give the reference's merged logits.
  lora::merge_lora(m);
  const auto merged = io::load_npy<float>((reference() / "merged_logits.npy").string());
  EXPECT_LT(max_abs_diff(logits(m, ids), merged.data()), 1e-4);
}

TEST(LoraPeft, SaveThenLoadGivesTheSameAdapterBitForBit) {
  TempDir t("roundtrip");
  auto m = models::from_pretrained(tiny_hf());
  lora::load_adapter(reference() / "adapter", m);
  lora::save_adapter(t.path / "out", m, "tiny_hf");
  const auto j = read_json(t.path / "out" / lora::kAdapterConfigFile);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["base_model_name_or_path"], "tiny_hf");
  const auto f = io::SafeTensorsFile::open((t.path / "out" / lora::kAdapterWeightsFile).string());
  EXPECT_TRUE(f.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_EQ(f.size(), 28u);

  auto again = models::from_pretrained(tiny_hf());
  lora::load_adapter(t.path / "out", again);
  const auto a = lora::split_lora_params(m), b = lora::split_lora_params(again);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].values, b[i].values) << a[i].name;
  }
  // Saving over an existing folder replaces it whole; no temporary folder is left.
  lora::save_adapter(t.path / "out", again, "tiny_hf");
  for (const auto& e : fs::directory_iterator(t.path)) EXPECT_EQ(e.path().filename(), "out");
}

TEST(LoraPeft, MalformedAdapterFoldersGiveErrorsNamingTheField) {
  TempDir t("malformed");
  auto m = models::from_pretrained(tiny_hf());
  const auto load = [&](const fs::path& dir) { return error_of([&] { lora::load_adapter(dir, m); }); };

  EXPECT_NE(load(t.path).find("adapter_config.json is missing"), std::string::npos);
  EXPECT_NE(load(edited_copy(t, [](auto& j) { j["use_dora"] = true; })).find("use_dora"), std::string::npos);
  EXPECT_NE(load(edited_copy(t, [](auto& j) { j["bias"] = "all"; })).find("bias"), std::string::npos);
  EXPECT_NE(load(edited_copy(t, [](auto& j) { j["peft_type"] = "IA3"; })).find("peft_type"), std::string::npos);
  EXPECT_NE(load(edited_copy(t, [](auto& j) { j["modules_to_save"] = {"lm_head"}; })).find("modules_to_save"),
            std::string::npos);
  EXPECT_NE(load(edited_copy(t, [](auto& j) { j["target_modules"] = {"q_proj", "c_attn"}; })).find("c_attn"),
            std::string::npos);
  // r in the config differs from the tensors'.
  EXPECT_NE(load(edited_copy(t, [](auto& j) { j["r"] = 8; })).find("r = 4"), std::string::npos);
  // A target the file has no tensors for; tensors for modules the config does not target.
  EXPECT_NE(load(edited_copy(t, [](auto& j) { j["target_modules"] = {"q_proj"}; })).find("has no place"),
            std::string::npos);
  {
    const fs::path dir = t.path / "missing";
    fs::create_directories(dir);
    fs::copy_file(reference() / "adapter" / lora::kAdapterConfigFile, dir / lora::kAdapterConfigFile);
    const auto src = io::SafeTensorsFile::open((reference() / "adapter" / lora::kAdapterWeightsFile).string());
    std::vector<std::vector<float>> keep;
    io::TensorList list;
    for (const auto& n : src.names()) {
      if (n.find("layers.1.mlp.down_proj.lora_B") != std::string::npos) continue;
      keep.push_back(src.read_vector<float>(n));
    }
    std::size_t k = 0;
    for (const auto& n : src.names())
      if (n.find("layers.1.mlp.down_proj.lora_B") == std::string::npos)
        list.emplace_back(n, io::TensorRef(keep[k++], src.info(n).shape));
    io::save_safetensors((dir / lora::kAdapterWeightsFile).string(), list);
    const std::string e = load(dir);
    EXPECT_NE(e.find("down_proj.lora_B.weight\" is missing"), std::string::npos) << e;
  }
  // After every failure the model is as it was.
  EXPECT_FALSE(lora::lora_is_enabled(m));
}
