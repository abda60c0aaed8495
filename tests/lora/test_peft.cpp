// PEFT adapter folders: a PEFT-layout adapter made by the PyTorch reference (scripts/lora_reference.py)
// gives its logits and gradients; save/load round trips; malformed folders give clear errors.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <span>

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

/// Phi-3's PEFT adapters sit on the fused modules (qkv_proj, gate_up_proj): one A shared by the
/// parts and a B whose rows are theirs. Loaded, every part gets the A and its rows of B: the
/// logits equal an independent reference, the base whose fused weights gain (alpha / r) B A
/// by naive loops. Saved as loaded, the folder is the fused one again, bit for bit; once the
/// parts' A's differ (as training makes them), each part is saved under its own name and loads
/// back to the same model.
TEST(LoraPeft, Phi3FusedAdapterSelectsItsPartsAndSavesFusedAgain) {
  const fs::path phi3 = tiny_hf().parent_path() / "tiny_phi3";
  TempDir t("phi3_fused");
  auto ref = models::from_pretrained(phi3);
  const auto& c = ref.config();
  const std::int64_t H = c.hidden_size, q = c.q_size(), kv = c.kv_size(), I = c.intermediate_size, r = 2;
  const float scale = 4.0f / static_cast<float>(r);  // lora_alpha / r
  const fs::path in = t.path / "fused";
  fs::create_directories(in);
  write_json(in / lora::kAdapterConfigFile, {{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", 4},
                                             {"target_modules", {"qkv_proj", "o_proj", "gate_up_proj"}}});
  struct Module {
    std::string name;
    std::int64_t rows, in;
    std::vector<std::pair<std::string, std::int64_t>> parts;  // part, first row
  };
  const std::vector<Module> modules = {{"self_attn.qkv_proj", q + 2 * kv, H, {{"self_attn.q_proj", 0}, {"self_attn.k_proj", q}, {"self_attn.v_proj", q + kv}}},
                                       {"self_attn.o_proj", H, q, {{"self_attn.o_proj", 0}}},
                                       {"mlp.gate_up_proj", 2 * I, H, {{"mlp.gate_proj", 0}, {"mlp.up_proj", I}}}};
  std::map<std::string, float*> w;
  ref.visit_params("", [&](std::string_view n, auto& p) { w[std::string(n)] = p.data(); });
  std::vector<std::vector<float>> store;
  store.reserve(static_cast<std::size_t>(2 * c.num_hidden_layers) * modules.size());  // references stay valid
  io::TensorList list;
  std::uint32_t seed = 7;
  const auto next = [&] { return static_cast<float>((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f; };
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const Module& mod : modules) {
      const std::string at = "model.layers." + std::to_string(l) + ".";
      auto& a = store.emplace_back(static_cast<std::size_t>(r * mod.in));
      auto& b = store.emplace_back(static_cast<std::size_t>(mod.rows * r));
      for (auto& v : a) v = next();
      for (auto& v : b) v = next();
      list.emplace_back(lora::kPeftPrefix + at + mod.name + ".lora_A.weight", io::TensorRef(std::span<const float>(a), {r, mod.in}));
      list.emplace_back(lora::kPeftPrefix + at + mod.name + ".lora_B.weight", io::TensorRef(std::span<const float>(b), {mod.rows, r}));
      // The reference: each part's rows of W gain scale * (B A) rows.
      for (std::size_t p = 0; p < mod.parts.size(); ++p) {
        const std::int64_t row0 = mod.parts[p].second;
        const std::int64_t rows = (p + 1 < mod.parts.size() ? mod.parts[p + 1].second : mod.rows) - row0;
        float* W = w.at(at + mod.parts[p].first + ".weight");
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t j = 0; j < mod.in; ++j) {
            double s = 0;
            for (std::int64_t k = 0; k < r; ++k) s += double(b[(row0 + i) * r + k]) * a[k * mod.in + j];
            W[i * mod.in + j] += static_cast<float>(scale * s);
          }
      }
    }
  io::save_safetensors((in / lora::kAdapterWeightsFile).string(), list, {{"format", "pt"}});

  auto m = models::from_pretrained(phi3);
  const lora::LoraConfig got = lora::load_adapter(in, m);
  EXPECT_EQ(std::set<std::string>(got.target_modules.begin(), got.target_modules.end()),
            (std::set<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"}));
  std::vector<std::int64_t> ids(16);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((5 * i + 3) % 48);
  const auto want = logits(ref, ids);
  EXPECT_LT(max_abs_diff(logits(m, ids), want.data()), 1e-5);

  // Saved as loaded: the fused folder again.
  lora::save_adapter(t.path / "out", m, "tiny_phi3");
  const auto src = io::SafeTensorsFile::open((in / lora::kAdapterWeightsFile).string());
  const auto out = io::SafeTensorsFile::open((t.path / "out" / lora::kAdapterWeightsFile).string());
  EXPECT_EQ(std::set<std::string>(out.names().begin(), out.names().end()),
            std::set<std::string>(src.names().begin(), src.names().end()));
  for (const auto& n : src.names()) EXPECT_EQ(out.read_vector<float>(n), src.read_vector<float>(n)) << n;
  const auto saved = read_json(t.path / "out" / lora::kAdapterConfigFile)["target_modules"].get<std::vector<std::string>>();
  EXPECT_EQ(std::set<std::string>(saved.begin(), saved.end()), (std::set<std::string>{"qkv_proj", "o_proj", "gate_up_proj"}));

  // One part's A moves: saved per part, and loads back to the same model.
  m.visit_linears("", [&](const std::string& path, auto& lin) {
    if (path != "model.layers.0.self_attn.k_proj") return;
    lin.lora->visit_params(path, [&](std::string_view n, auto& p) {
      if (n.ends_with("lora_A.weight")) p.data()[0] += 0.25f;
    });
  });
  lora::save_adapter(t.path / "parts", m, "tiny_phi3");
  const auto parts = io::SafeTensorsFile::open((t.path / "parts" / lora::kAdapterWeightsFile).string());
  EXPECT_TRUE(parts.contains("base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"));
  EXPECT_FALSE(parts.contains("base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight"));
  auto back = models::from_pretrained(phi3);
  lora::load_adapter(t.path / "parts", back);
  EXPECT_EQ(logits(back, ids), logits(m, ids));
  EXPECT_GT(max_abs_diff(logits(m, ids), want.data()), 1e-4);  // the moved A shows

  // A fused B of the wrong height is named.
  const fs::path bad = t.path / "bad";
  fs::create_directories(bad);
  fs::copy_file(in / lora::kAdapterConfigFile, bad / lora::kAdapterConfigFile);
  io::TensorList cut;
  std::vector<std::vector<float>> cut_store;
  cut_store.reserve(src.names().size());
  for (const auto& n : src.names()) {
    auto v = src.read_vector<float>(n);
    auto shape = src.info(n).shape;
    if (n.find("layers.1.self_attn.qkv_proj.lora_B") != std::string::npos) {
      shape[0] += 1;
      v.resize(v.size() + static_cast<std::size_t>(r), 0.0f);
    }
    cut_store.push_back(std::move(v));
    cut.emplace_back(n, io::TensorRef(std::span<const float>(cut_store.back()), shape));
  }
  io::save_safetensors((bad / lora::kAdapterWeightsFile).string(), cut, {{"format", "pt"}});
  auto fresh = models::from_pretrained(phi3);
  const std::string e = error_of([&] { lora::load_adapter(bad, fresh); });
  EXPECT_NE(e.find("layers.1.self_attn.qkv_proj.lora_B.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("33 rows"), std::string::npos) << e;
}
