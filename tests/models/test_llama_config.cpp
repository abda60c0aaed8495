#include <edl/models/llama/config.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using edl::errc;
using edl::models::LlamaConfig;
using edl::models::LlamaHead;
using ojson = nlohmann::ordered_json;

std::string data_dir() {
  const char* d = std::getenv("EDL_TEST_DATA");
  return d ? d : "tests/data";
}

template <class F>
void expect_error(F&& f, errc code, const std::string& where_suffix, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    const std::string w = e.where();
    EXPECT_TRUE(w.size() >= where_suffix.size() && w.compare(w.size() - where_suffix.size(), where_suffix.size(),
                                                              where_suffix) == 0)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

LlamaConfig parse(const std::string& s) { return LlamaConfig::from_json(edl::io::parse_json(s, "config.json"), "config.json"); }

TEST(LlamaConfig, ReadsTheTinyFixture) {
  const std::string path = data_dir() + "/tiny_hf/config.json";
  const auto c = LlamaConfig::from_file(path);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 64);
  EXPECT_EQ(c.hidden_size, 16);
  EXPECT_EQ(c.intermediate_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_size(), 4);
  EXPECT_EQ(c.max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.eos_token_id, std::vector<std::int64_t>{2});
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.extra["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(c.parameter_count(), 6736);
}

TEST(LlamaConfig, DefaultsFollowHuggingFace) {
  const auto c = parse(R"({"hidden_size": 64, "num_attention_heads": 8, "intermediate_size": 128,
                           "num_hidden_layers": 1, "vocab_size": 10})");
  EXPECT_EQ(c.num_key_value_heads, 8);  // defaults to the number of heads
  EXPECT_FALSE(c.head_dim.has_value());
  EXPECT_EQ(c.head_size(), 8);  // hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, std::vector<std::int64_t>{2});
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.num_labels, 2);
  // An explicit head_dim need not divide hidden (e.g. Mistral-Nemo style).
  const auto m = parse(R"({"model_type": "mistral", "hidden_size": 60, "num_attention_heads": 4, "head_dim": 16,
                           "num_key_value_heads": 2})");
  EXPECT_EQ(m.head_size(), 16);
  EXPECT_EQ(m.q_size(), 64);
  EXPECT_EQ(m.sliding_window, 4096);  // MistralConfig default when the field is missing
  EXPECT_EQ(m.attention_window(), 4096);
  const auto m2 = parse(R"({"model_type": "mistral", "sliding_window": null})");
  EXPECT_FALSE(m2.sliding_window.has_value());
}

TEST(LlamaConfig, RoundTripKeepsUnknownFieldsAndOrder) {
  const std::string text = R"({
    "architectures": ["LlamaForCausalLM"], "transformers_version": "4.44.0", "vocab_size": 128,
    "hidden_size": 32, "custom": {"a": [1, 2, {"b": null}]}, "num_attention_heads": 4, "intermediate_size": 64,
    "num_hidden_layers": 2, "eos_token_id": [128001, 128008, 128009], "pad_token_id": null,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "extra_key": "kept"},
    "torch_dtype": "bfloat16", "use_cache": true})";
  const auto c = parse(text);
  EXPECT_EQ(c.eos_token_id, (std::vector<std::int64_t>{128001, 128008, 128009}));
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->rope_type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.extra.size(), 4u);  // architectures, transformers_version, custom, use_cache

  const std::string path =
      (fs::temp_directory_path() / ("edl_llama_cfg_" + std::to_string(::getpid()) + ".json")).string();
  c.save(path);
  const auto back = LlamaConfig::from_file(path);
  fs::remove(path);
  const ojson j = back.to_json();
  EXPECT_EQ(j["transformers_version"], "4.44.0");
  EXPECT_EQ(j["custom"], ojson::parse(R"({"a": [1, 2, {"b": null}]})"));
  EXPECT_EQ(j["use_cache"], true);
  EXPECT_EQ(j["eos_token_id"], ojson::parse("[128001, 128008, 128009]"));
  EXPECT_TRUE(j["pad_token_id"].is_null());
  EXPECT_EQ(j["rope_scaling"]["extra_key"], "kept");
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_FALSE(j["rope_scaling"].contains("type"));
  // Fields keep the order of the file read; defaulted fields follow.
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  ASSERT_GE(keys.size(), 4u);
  EXPECT_EQ(keys[0], "architectures");
  EXPECT_EQ(keys[1], "transformers_version");
  EXPECT_EQ(keys[2], "vocab_size");
  EXPECT_EQ(keys[3], "hidden_size");
  EXPECT_EQ(back.to_json(), c.to_json());
  // A scalar eos stays a scalar.
  EXPECT_EQ(parse(R"({"eos_token_id": 7})").to_json()["eos_token_id"], 7);
}

TEST(LlamaConfig, RopeScalingForms) {
  const auto lin = parse(R"({"rope_scaling": {"type": "linear", "factor": 2.0}})");
  ASSERT_TRUE(lin.rope_scaling.has_value());
  EXPECT_EQ(lin.rope_scaling->rope_type, "linear");
  EXPECT_DOUBLE_EQ(lin.rope_scaling->factor, 2.0);
  EXPECT_EQ(lin.to_json()["rope_scaling"], ojson::parse(R"({"type": "linear", "factor": 2.0})"));
  EXPECT_FALSE(parse(R"({"rope_scaling": null})").rope_scaling.has_value());
  expect_error([] { (void)parse(R"({"rope_scaling": {"rope_type": "su", "factor": 4.0}})"); }, errc::unsupported,
               "field rope_scaling.rope_type", "expected linear, llama3, yarn, dynamic, longrope or default, found \"su\"");
  // yarn as Qwen2.5's model card writes it: read, and written back as read.
  const auto yarn = parse(R"({"rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}})");
  EXPECT_EQ(yarn.rope_scaling->rope_type, "yarn");
  EXPECT_TRUE(yarn.rope_scaling->has_original_max);
  EXPECT_EQ(yarn.rope_original_max(), 32768);
  EXPECT_EQ(yarn.to_json()["rope_scaling"],
            ojson::parse(R"({"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"})"));
  expect_error([] { (void)parse(R"({"rope_scaling": {"rope_type": "linear"}})"); }, errc::config,
               "field rope_scaling.factor", "missing");
  expect_error([] { (void)parse(R"({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
                                    "high_freq_factor": 1, "original_max_position_embeddings": 8192}})"); },
               errc::config, "field rope_scaling.high_freq_factor", "must exceed low_freq_factor");
  expect_error([] { (void)parse(R"({"rope_scaling": {"factor": 2.0}})"); }, errc::config, "field rope_scaling.rope_type",
               "missing");
  expect_error([] { (void)parse(R"({"rope_scaling": "linear"})"); }, errc::config, "field rope_scaling",
               "expected null or an object");
}

TEST(LlamaConfig, ValidationNamesTheField) {
  expect_error([] { (void)parse(R"({"hidden_size": 30, "num_attention_heads": 4})"); }, errc::config,
               "config.json field num_attention_heads", "hidden_size (30) must be divisible by num_attention_heads (4)");
  expect_error([] { (void)parse(R"({"num_attention_heads": 32, "num_key_value_heads": 5})"); }, errc::config,
               "config.json field num_key_value_heads", "(32) must be divisible by num_key_value_heads (5)");
  expect_error([] { (void)parse(R"({"vocab_size": 0})"); }, errc::config, "config.json field vocab_size",
               "must be positive, found 0");
  expect_error([] { (void)parse(R"({"num_hidden_layers": -1})"); }, errc::config, "config.json field num_hidden_layers",
               "must be positive, found -1");
  expect_error([] { (void)parse(R"({"hidden_act": "gelu"})"); }, errc::unsupported, "config.json field hidden_act",
               "only \"silu\" is supported, found \"gelu\"");
  expect_error([] { (void)parse(R"({"model_type": "gpt2"})"); }, errc::unsupported, "config.json field model_type",
               "expected llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, mixtral, qwen2_moe or qwen3_moe, found \"gpt2\"");
  expect_error([] { (void)parse(R"({"model_type": "phi3", "partial_rotary_factor": 0.75})"); }, errc::unsupported,
               "config.json field partial_rotary_factor", "rotary embeddings over part of each head");
  expect_error([] { (void)parse(R"({"hidden_size": "4096"})"); }, errc::config, "config.json field hidden_size",
               "expected an integer, found \"4096\"");
  expect_error([] { (void)parse(R"({"rms_norm_eps": -1e-6})"); }, errc::config, "config.json field rms_norm_eps",
               "must be positive");
  expect_error([] { (void)parse(R"({"hidden_size": 24, "num_attention_heads": 8})"); }, errc::config,
               "config.json field head_dim", "even head_dim, found 3");
  // Sizes beyond any model (so that products cannot overflow and nothing allocates exabytes).
  expect_error([] { (void)parse(R"({"vocab_size": 99999999999})"); }, errc::config, "config.json field vocab_size",
               "above the largest edl accepts (16777216)");
  expect_error([] { (void)parse(R"({"num_hidden_layers": 100000})"); }, errc::config,
               "config.json field num_hidden_layers", "above the largest");
  expect_error([] { (void)parse(R"({"hidden_size": 4096, "num_attention_heads": 32, "head_dim": 1000000})"); },
               errc::config, "config.json field head_dim", "above the largest");
  // Duplicate keys hid a mistake (the last one won).
  expect_error([] { (void)parse(R"({"hidden_size": 64, "hidden_size": 4096})"); }, errc::format, "config.json",
               "duplicate key \"hidden_size\"");
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_key_value_heads = 4;
  expect_error([&] { c.validate(); }, errc::config, "field num_key_value_heads", "(6) must be divisible");
}

// A Qwen3 config.json as HF writes it: explicit head_dim (not hidden / heads), per-head q/k
// norms, sliding window fields that apply only with use_sliding_window; it reads, validates and
// writes back equal, and the Qwen3-only fields stay.
TEST(LlamaConfig, Qwen3ParsesAndRoundTrips) {
  const std::string text = R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})";
  const auto c = parse(text);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_size(), 128);
  EXPECT_NE(c.head_size() * c.num_attention_heads, c.hidden_size);
  EXPECT_EQ(c.q_size(), 2048);
  EXPECT_TRUE(c.qk_norm());
  EXPECT_FALSE(c.qkv_bias());
  EXPECT_FALSE(c.o_bias());
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_window().has_value());
  // Qwen3-0.6B: the tied embedding 151936 x 1024, 28 layers of 15,730,944 (256 of them the q/k
  // norms), the final norm.
  EXPECT_EQ(c.parameter_count(), 596049920);

  const std::string path =
      (fs::temp_directory_path() / ("edl_qwen3_cfg_" + std::to_string(::getpid()) + ".json")).string();
  c.save(path);
  const auto back = LlamaConfig::from_file(path);
  fs::remove(path);
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.model_type, "qwen3");
  EXPECT_EQ(back.head_size(), 128);
  EXPECT_TRUE(back.qk_norm());
  const ojson j = back.to_json();
  EXPECT_EQ(j["architectures"], ojson::parse(R"(["Qwen3ForCausalLM"])"));
  EXPECT_EQ(j["max_window_layers"], 28);
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_EQ(j["head_dim"], 128);

  // The window applies only with use_sliding_window, as for qwen2.
  const auto w = parse(R"({"model_type": "qwen3", "sliding_window": 16, "use_sliding_window": true})");
  EXPECT_EQ(w.attention_window(), 16);
  EXPECT_FALSE(parse(R"({"model_type": "qwen3", "sliding_window": 16})").attention_window().has_value());
  // Other model types have no q/k norms.
  EXPECT_FALSE(parse(R"({"model_type": "qwen2"})").qk_norm());
  EXPECT_FALSE(parse(R"({})").qk_norm());
}

TEST(LlamaConfig, PresetsMatchTheAnchors) {
  const auto tiny = LlamaConfig::preset("tiny");
  EXPECT_EQ(tiny.hidden_size, 288);
  EXPECT_EQ(tiny.intermediate_size, 768);
  EXPECT_EQ(tiny.num_hidden_layers, 6);
  EXPECT_EQ(tiny.num_attention_heads, 6);
  EXPECT_EQ(tiny.num_key_value_heads, 6);
  EXPECT_EQ(tiny.vocab_size, 32000);
  EXPECT_EQ(tiny.max_position_embeddings, 256);
  EXPECT_DOUBLE_EQ(tiny.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(tiny.rope_theta, 10000.0);
  EXPECT_FALSE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.parameter_count(), 24407712);  // "24.4M"
  const auto small = LlamaConfig::preset("small");
  EXPECT_EQ(small.hidden_size, 768);
  EXPECT_EQ(small.max_position_embeddings, 1024);
  EXPECT_EQ(small.parameter_count(), 134105856);  // "134M"
  const auto g = LlamaConfig::preset("gqa1b");
  EXPECT_EQ(g.hidden_size, 2048);
  EXPECT_EQ(g.intermediate_size, 5632);
  EXPECT_EQ(g.num_hidden_layers, 22);
  EXPECT_EQ(g.num_attention_heads, 32);
  EXPECT_EQ(g.num_key_value_heads, 4);
  EXPECT_EQ(g.head_size(), 64);
  EXPECT_EQ(g.max_position_embeddings, 2048);
  EXPECT_EQ(g.parameter_count(), 1100048384);  // "1.1B"
  expect_error([] { (void)LlamaConfig::preset("huge"); }, errc::invalid_argument, "LlamaConfig::preset",
               "unknown preset \"huge\", expected one of tiny, small, gqa1b, small_moe, small_wide");
  // A preset written out reads back equal.
  const auto back = LlamaConfig::from_json(tiny.to_json());
  EXPECT_EQ(back.to_json(), tiny.to_json());
}

TEST(LlamaConfig, ParameterShapesInHfOrder) {
  auto c = parse(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2})");
  auto p = c.parameter_shapes();
  ASSERT_EQ(p.size(), 1u + 2u * 9u + 2u);
  EXPECT_EQ(p[0], (std::pair<std::string, std::vector<std::int64_t>>{"model.embed_tokens.weight", {10, 8}}));
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> layer0 = {
      {"model.layers.0.input_layernorm.weight", {8}},
      {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
      {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
      {"model.layers.0.self_attn.o_proj.weight", {8, 8}},
      {"model.layers.0.post_attention_layernorm.weight", {8}},
      {"model.layers.0.mlp.gate_proj.weight", {12, 8}},
      {"model.layers.0.mlp.up_proj.weight", {12, 8}},
      {"model.layers.0.mlp.down_proj.weight", {8, 12}}};
  for (std::size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(p[1 + i], layer0[i]) << i;
  EXPECT_EQ(p[10].first, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(p[19].first, "model.norm.weight");
  EXPECT_EQ(p[20], (std::pair<std::string, std::vector<std::int64_t>>{"lm_head.weight", {10, 8}}));
  const std::int64_t base = c.parameter_count();
  EXPECT_EQ(base, 80 + 2 * (8 + 64 + 32 + 32 + 64 + 8 + 96 * 3) + 8 + 80);

  c.tie_word_embeddings = true;
  EXPECT_EQ(c.parameter_shapes().back().first, "model.norm.weight");
  EXPECT_EQ(c.parameter_count(), base - 80);
  c.tie_word_embeddings = false;

  c.attention_bias = true;
  c.mlp_bias = true;
  p = c.parameter_shapes();
  EXPECT_EQ(p[2].first, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(p[3], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.self_attn.q_proj.bias", {8}}));
  EXPECT_EQ(p[5].first, "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(p[9], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.self_attn.o_proj.bias", {8}}));
  EXPECT_EQ(p[12], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.mlp.gate_proj.bias", {12}}));
  EXPECT_EQ(p[16], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.mlp.down_proj.bias", {8}}));
  EXPECT_EQ(c.parameter_count(), base + 2 * (8 + 4 + 4 + 8 + 12 + 12 + 8));

  // qwen2: biases on q, k, v only.
  const auto q = parse(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 12,
                           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "sliding_window": 32, "use_sliding_window": false})");
  int biases = 0;
  for (const auto& [name, shape] : q.parameter_shapes()) biases += name.ends_with(".bias");
  EXPECT_EQ(biases, 3);
  EXPECT_FALSE(q.attention_window().has_value());
  EXPECT_EQ(q.sliding_window, 32);

  // qwen3: q_norm and k_norm of head_dim after o_proj, no biases unless attention_bias.
  auto q3 = parse(R"({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 12,
                      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6})");
  p = q3.parameter_shapes();
  ASSERT_EQ(p.size(), 1u + 11u + 2u);
  EXPECT_EQ(p[4], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.self_attn.v_proj.weight", {12, 8}}));
  EXPECT_EQ(p[5], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.self_attn.o_proj.weight", {8, 24}}));
  EXPECT_EQ(p[6], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.self_attn.q_norm.weight", {6}}));
  EXPECT_EQ(p[7], (std::pair<std::string, std::vector<std::int64_t>>{"model.layers.0.self_attn.k_norm.weight", {6}}));
  EXPECT_EQ(p[8].first, "model.layers.0.post_attention_layernorm.weight");
  q3.attention_bias = true;  // then on q, k, v and o, as Qwen3Attention
  biases = 0;
  for (const auto& [name, shape] : q3.parameter_shapes()) biases += name.ends_with(".bias");
  EXPECT_EQ(biases, 4);

  // Sequence classification: score.weight [num_labels, hidden] instead of lm_head.
  const auto s = parse(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1,
                           "num_attention_heads": 4, "id2label": {"0": "neg", "1": "neu", "2": "pos"},
                           "problem_type": "single_label_classification"})");
  EXPECT_EQ(s.num_labels, 3);
  EXPECT_EQ(s.problem_type, "single_label_classification");
  const auto sp = s.parameter_shapes(LlamaHead::sequence_classification);
  EXPECT_EQ(sp.back(), (std::pair<std::string, std::vector<std::int64_t>>{"score.weight", {3, 8}}));
  EXPECT_EQ(s.to_json()["id2label"]["2"], "pos");
}

}  // namespace

// EasyDeL's static_hash: the same fields hash alike whatever the document's key order; any
// changed field (a known one or an unknown one kept in `extra`) changes the hash.
TEST(LlamaConfig, StaticHashFollowsTheFieldsNotTheirOrder) {
  using ojson = nlohmann::ordered_json;
  const ojson a = ojson::parse(R"({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "custom": 1})");
  const ojson b = ojson::parse(R"({"custom": 1, "vocab_size": 100, "num_attention_heads": 4, "hidden_size": 64})");
  const auto ca = LlamaConfig::from_json(a), cb = LlamaConfig::from_json(b);
  EXPECT_NE(ca.to_json().dump(), cb.to_json().dump());  // the documents' orders are kept...
  EXPECT_EQ(ca.static_hash(), cb.static_hash());        // ...and do not change the hash
  EXPECT_EQ(ca.static_hash(), LlamaConfig::from_json(ca.to_json()).static_hash());
  LlamaConfig changed = ca;
  changed.rms_norm_eps = 1e-5;
  EXPECT_NE(changed.static_hash(), ca.static_hash());
  ojson c = a;
  c["custom"] = 2;
  EXPECT_NE(LlamaConfig::from_json(c).static_hash(), ca.static_hash());
}
