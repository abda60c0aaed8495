// Llama models in GGUF files (models/llama/gguf.hpp): save_gguf -> from_gguf round trips,
// llama.cpp's q/k rope permutation, quantized files, the vocabulary keys, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/io/gguf.hpp>
#include <edl/models/llama/gguf.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/quantize.hpp>
#include <edl/quant/matrix.hpp>

namespace {

namespace fs = std::filesystem;
using namespace edl;
using io::GgmlType;
using io::GgufFile;
using models::LlamaConfig;
using models::LlamaForCausalLM;

/// A fresh folder per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("edl_gguf_llama_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& f) const { return path_ / f; }

 private:
  fs::path path_;
};

LlamaConfig small_config(bool tied = false) {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_id = {2};
  c.validate();
  return c;
}

/// Save options: type, token_embd/output type ("": the default), tokenizer folder, name.
models::GgufSaveOptions options(std::string type, std::string embeddings = "", fs::path tokenizer = {},
                                std::string name = "") {
  models::GgufSaveOptions o;
  o.type = std::move(type);
  o.embeddings = std::move(embeddings);
  o.tokenizer_dir = std::move(tokenizer);
  o.name = std::move(name);
  return o;
}

/// Random weights; std 0.1 so the logits are not all near zero.
LlamaForCausalLM<> make_model(std::uint64_t seed, bool tied = false) {
  LlamaForCausalLM<> m(small_config(tied));
  m.init(Key::from_seed(seed), 0.1f);
  return m;
}

template <class Pol>
std::vector<float> logits_of(const LlamaForCausalLM<Pol>& m) {
  const std::int64_t B = 2, T = 8, V = m.config().vocab_size;
  std::vector<std::int64_t> ids(static_cast<std::size_t>(B * T));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7 + 3) % 40);
  std::vector<float> out(static_cast<std::size_t>(B * T * V));
  m.logits(ids.data(), nn::TokenLayout{B, T}, out.data());
  return out;
}

/// Bitwise equality of two float vectors, reporting the first difference.
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ADD_FAILURE() << "first difference at " << i << ": " << a[i] << " vs " << b[i];
      return;
    }
}

/// The message of the edl::Error that f throws (fails the test if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no edl::Error thrown";
  return {};
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}
void write_text(const fs::path& p, const std::string& s) { write_bytes(p, s); }

/// Replaces the first occurrence of `from` at or after `after` (same length).
void patch(std::string& bytes, std::string_view from, std::string_view to, std::string_view after = {}) {
  ASSERT_EQ(from.size(), to.size());
  const std::size_t start = after.empty() ? 0 : bytes.find(after);
  ASSERT_NE(start, std::string::npos);
  const std::size_t at = bytes.find(from, start);
  ASSERT_NE(at, std::string::npos) << "no '" << from << "' in the file";
  bytes.replace(at, from.size(), to);
}

/// The model with every 2-D weight rounded to f16 (what an f16 file stores).
LlamaForCausalLM<> rounded_to_f16(LlamaForCausalLM<> m) {
  m.visit_params("", [](std::string_view, auto& p) {
    if (p.shape().size() != 2) return;
    for (std::size_t i = 0; i < p.value.size(); ++i) p.data()[i] = f16(p.data()[i]).to_float();
  });
  return m;
}

/// p's values replaced by their q8_0 quantization, dequantized (what a q8_0 token_embd holds).
template <class P>
void round_through_q8_0(P& p) {
  const auto rows = static_cast<std::int64_t>(p.value.shape()[0]), cols = static_cast<std::int64_t>(p.value.shape()[1]);
  quant::Matrix::quantize(quant::Format::q8_0, p.data(), rows, cols, "test").dequantize(p.data());
}

// ------------------------------------------------------------------------------------ permutation

TEST(GgufLlama, PermutationMatchesConvertScript) {
  // convert_hf_to_gguf.py: w.reshape(n_head, 2, D / 2, cols).swapaxes(1, 2).reshape(w.shape)
  const std::int64_t n_head = 3, D = 8, rows = n_head * D, cols = 5;
  std::vector<float> w(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  std::vector<float> naive(w.size());
  std::int64_t out_row = 0;
  for (std::int64_t h = 0; h < n_head; ++h)
    for (std::int64_t j = 0; j < D / 2; ++j)  // after swapaxes: index order (h, j, s)
      for (std::int64_t s = 0; s < 2; ++s, ++out_row)
        for (std::int64_t c = 0; c < cols; ++c)
          naive[static_cast<std::size_t>(out_row * cols + c)] = w[static_cast<std::size_t>((h * D + s * (D / 2) + j) * cols + c)];

  std::vector<float> permuted(w.size()), back(w.size());
  models::permute_rope_rows(std::as_bytes(std::span<const float>(w)), std::as_writable_bytes(std::span<float>(permuted)),
                            rows, n_head, /*to_gguf=*/true);
  EXPECT_EQ(permuted, naive);
  models::permute_rope_rows(std::as_bytes(std::span<const float>(permuted)), std::as_writable_bytes(std::span<float>(back)),
                            rows, n_head, /*to_gguf=*/false);
  EXPECT_EQ(back, w);
  for (std::int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(models::hf_rope_row(models::gguf_rope_row(r, D), D), r);
    EXPECT_EQ(naive[static_cast<std::size_t>(models::gguf_rope_row(r, D) * cols)], w[static_cast<std::size_t>(r * cols)]);
  }
}

// ------------------------------------------------------------------------------------ round trips

TEST(GgufLlama, F32RoundTripIsBitIdentical) {
  TempDir dir;
  const auto m = make_model(1);
  const fs::path file = dir / "m.gguf";
  models::save_gguf(file, m, {});

  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("general.name"), "m");
  EXPECT_EQ(f.get_u32("general.file_type"), 0u);
  EXPECT_EQ(f.get_u32("llama.block_count"), 2u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 128u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 4u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(f.get_u32("llama.vocab_size"), 40u);
  EXPECT_EQ(f.get_u32("llama.context_length"), 64u);
  EXPECT_FLOAT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_FALSE(f.has("llama.attention.key_length"));
  EXPECT_EQ(f.tensors().size(), 1u + 2 * 9 + 2);
  const auto& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type, GgmlType::F32);
  EXPECT_EQ(q.dims, (std::vector<std::int64_t>{64, 64}));
  EXPECT_EQ(f.tensor("blk.1.attn_k.weight").dims, (std::vector<std::int64_t>{64, 32}));
  EXPECT_EQ(f.tensor("blk.1.ffn_down.weight").dims, (std::vector<std::int64_t>{128, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").dims, (std::vector<std::int64_t>{64}));
  EXPECT_EQ(f.tensor("output.weight").dims, (std::vector<std::int64_t>{64, 40}));
  // The file holds q and k in llama.cpp's rope order: HF row r at gguf_rope_row(r, 16).
  const float* fq = reinterpret_cast<const float*>(q.data);
  const float* hq = m.model.layers[0].self_attn.q_proj.weight.data();
  const float* fk = reinterpret_cast<const float*>(f.tensor("blk.0.attn_k.weight").data);
  const float* hk = m.model.layers[0].self_attn.k_proj.weight.data();
  for (std::int64_t r = 0; r < 64; ++r)
    ASSERT_EQ(std::memcmp(fq + models::gguf_rope_row(r, 16) * 64, hq + r * 64, 64 * sizeof(float)), 0) << "q row " << r;
  for (std::int64_t r = 0; r < 32; ++r)
    ASSERT_EQ(std::memcmp(fk + models::gguf_rope_row(r, 16) * 64, hk + r * 64, 64 * sizeof(float)), 0) << "k row " << r;
  EXPECT_EQ(std::memcmp(f.tensor("blk.0.attn_v.weight").data, m.model.layers[0].self_attn.v_proj.weight.data(),
                        32 * 64 * sizeof(float)), 0);

  const auto back = models::from_gguf<>(file);
  EXPECT_EQ(back.config().hidden_size, 64);
  EXPECT_EQ(back.config().num_key_value_heads, 2);
  EXPECT_EQ(back.config().head_size(), 16);
  EXPECT_FALSE(back.tied());
  expect_same_bits(logits_of(back), logits_of(m));
  // from_pretrained (every --model of the edl tool) takes the file too.
  expect_same_bits(logits_of(models::from_pretrained<>(file)), logits_of(m));
}

TEST(GgufLlama, TiedEmbeddingsHaveNoOutputTensor) {
  TempDir dir;
  const auto m = make_model(2, /*tied=*/true);
  const fs::path file = dir / "tied.gguf";
  models::save_gguf(file, m, options("f32", "", {}, "tied model"));
  const auto f = GgufFile::open(file.string());
  EXPECT_FALSE(f.has_tensor("output.weight"));
  EXPECT_EQ(f.get_string("general.name"), "tied model");
  const auto back = models::from_gguf<>(file);
  EXPECT_TRUE(back.tied());
  expect_same_bits(logits_of(back), logits_of(m));
}

TEST(GgufLlama, F16FileHoldsWeightsRoundedToF16) {
  TempDir dir;
  const auto m = make_model(3);
  const fs::path file = dir / "m16.gguf";
  models::save_gguf(file, m, options("f16"));
  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.get_u32("general.file_type"), 1u);
  EXPECT_EQ(f.tensor("blk.0.ffn_up.weight").type, GgmlType::F16);
  EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::F16);
  EXPECT_EQ(f.tensor("blk.0.ffn_norm.weight").type, GgmlType::F32);  // norms stay F32

  const auto back = models::from_gguf<>(file);
  const auto got = logits_of(back), want = logits_of(m);
  expect_same_bits(got, logits_of(rounded_to_f16(make_model(3))));  // exactly the f16-rounded model
  float worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  EXPECT_LT(worst, 2e-3f * scale) << "f16 rounding moved a logit by " << worst << " (largest " << scale << ")";
}

/// A q8_0 / q4_0 file with f32 embeddings loads as the in-memory nn::quantize'd model, bit for bit.
void expect_quantized_round_trip(quant::Format fmt, const char* type) {
  TempDir dir;
  const auto m = make_model(4);
  const fs::path file = dir / (std::string(type) + ".gguf");
  models::save_gguf(file, m, options(type, "f32"));
  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.get_u32("general.file_type"), fmt == quant::Format::q8_0 ? 7u : 2u);
  EXPECT_EQ(f.tensor("blk.1.attn_q.weight").type, fmt == quant::Format::q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0);
  EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::F32);

  auto back = models::from_gguf<>(file);
  auto ref = make_model(4);
  EXPECT_EQ(nn::quantize(ref, nn::QuantizationConfig{fmt}), 14);
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> want;
  ref.visit_linears("", [&](const std::string& path, auto& lin) {
    if (lin.is_quantized()) want.emplace_back(path, std::vector<std::uint8_t>(lin.qweight.bytes().begin(), lin.qweight.bytes().end()));
  });
  std::size_t k = 0;
  back.visit_linears("", [&](const std::string& path, auto& lin) {
    if (path == "lm_head") {
      EXPECT_FALSE(lin.is_quantized());
      return;
    }
    ASSERT_TRUE(lin.is_quantized()) << path;
    EXPECT_EQ(lin.qweight.format(), fmt) << path;
    ASSERT_LT(k, want.size());
    EXPECT_EQ(want[k].first, path);
    EXPECT_TRUE(std::equal(want[k].second.begin(), want[k].second.end(), lin.qweight.bytes().begin(),
                           lin.qweight.bytes().end()))
        << path << ": blocks differ";
    ++k;
  });
  EXPECT_EQ(k, 14u);
  expect_same_bits(logits_of(back), logits_of(ref));

  // The loaded model written again copies its blocks: the same tensor bytes.
  const fs::path again = dir / "again.gguf";
  models::save_gguf(again, back, options(type, "f32"));
  const auto g = GgufFile::open(again.string());
  for (const auto& t : f.tensors()) {
    const auto a = t.bytes(), b = g.data_of(t.name);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << t.name;
  }
}

TEST(GgufLlama, Q8_0FileLoadsAsQuantizedLinears) { expect_quantized_round_trip(quant::Format::q8_0, "q8_0"); }
TEST(GgufLlama, Q4_0FileLoadsAsQuantizedLinears) { expect_quantized_round_trip(quant::Format::q4_0, "q4_0"); }

TEST(GgufLlama, QuantizedFilesStoreEmbeddingsAndHeadAsQ8_0) {
  TempDir dir;
  const fs::path file = dir / "q4.gguf";
  models::save_gguf(file, make_model(5), options("q4_0"));
  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(f.tensor("output.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, GgmlType::Q4_0);
  EXPECT_EQ(f.tensor("output_norm.weight").type, GgmlType::F32);

  // Loaded: q4_0 Linears, and embeddings / head dequantized from their q8_0 blocks.
  auto ref = make_model(5);
  round_through_q8_0(ref.model.embed_tokens.weight);
  round_through_q8_0(ref.lm_head.weight);
  nn::quantize(ref, nn::QuantizationConfig{quant::Format::q4_0});
  const auto back = models::from_gguf<>(file);
  expect_same_bits(logits_of(back), logits_of(ref));
}

TEST(GgufLlama, QuantizedModelInAnotherFormatIsRequantized) {
  TempDir dir;
  auto m = make_model(6);
  nn::quantize(m, nn::QuantizationConfig{quant::Format::q4_0});
  // q4_0 Linears into a q8_0 file: dequantized, then quantized to q8_0.
  const fs::path file = dir / "q8.gguf";
  models::save_gguf(file, m, options("q8_0", "f32"));
  auto ref = make_model(6);
  nn::quantize(ref, nn::QuantizationConfig{quant::Format::q4_0});
  ref.visit_linears("", [](const std::string& path, auto& lin) {
    if (!lin.is_quantized()) return;
    std::vector<float> w(static_cast<std::size_t>(lin.out_features() * lin.in_features()));
    lin.qweight.dequantize(w.data());
    lin.set_quantized(quant::Matrix::quantize(quant::Format::q8_0, w.data(), lin.out_features(), lin.in_features(), path), path);
  });
  expect_same_bits(logits_of(models::from_gguf<>(file)), logits_of(ref));
  // And into an f32 file: the dequantized weights.
  const fs::path f32 = dir / "f32.gguf";
  models::save_gguf(f32, m, {});
  const auto back = models::from_gguf<>(f32);
  EXPECT_FALSE(back.model.layers[0].mlp.up_proj.is_quantized());
  std::vector<float> w(128 * 64);
  m.model.layers[0].mlp.up_proj.qweight.dequantize(w.data());
  EXPECT_EQ(std::memcmp(w.data(), back.model.layers[0].mlp.up_proj.weight.data(), w.size() * sizeof(float)), 0);
}

TEST(GgufLlama, LoadsIntoBf16Parameters) {
  TempDir dir;
  const auto m = make_model(7);
  const fs::path file = dir / "m.gguf";
  models::save_gguf(file, m, {});
  const auto b = models::from_gguf<BF16ParamsPolicy>(file);
  EXPECT_EQ(b.config().torch_dtype, "bfloat16");
  const float x = m.model.layers[1].self_attn.k_proj.weight.data()[5 * 64 + 3];
  EXPECT_EQ(b.model.layers[1].self_attn.k_proj.weight.data()[5 * 64 + 3], bf16(x));
}

// Mixtral: llama.cpp's llama graph with experts (llama.expert_count / expert_used_count), the
// router as ffn_gate_inp (F32) and each expert Linear merged into one 3-D ffn_*_exps tensor.
TEST(GgufLlama, MixtralExpertsRoundTrip) {
  TempDir dir;
  LlamaConfig c = small_config();
  c.model_type = "mixtral";
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.validate();
  LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(7), 0.1f);
  const fs::path file = dir / "mixtral.gguf";
  models::save_gguf(file, m, {});
  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.get_u32("llama.expert_count"), 4u);
  EXPECT_EQ(f.get_u32("llama.expert_used_count"), 2u);
  EXPECT_EQ(f.tensors().size(), 1u + 2 * 10 + 2);
  EXPECT_FALSE(f.has_tensor("blk.0.ffn_gate.weight"));
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").dims, (std::vector<std::int64_t>{64, 4}));
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_exps.weight").dims, (std::vector<std::int64_t>{64, 128, 4}));
  EXPECT_EQ(f.tensor("blk.1.ffn_up_exps.weight").dims, (std::vector<std::int64_t>{64, 128, 4}));
  EXPECT_EQ(f.tensor("blk.1.ffn_down_exps.weight").dims, (std::vector<std::int64_t>{128, 64, 4}));
  // Expert 2's w2 (down_proj) is the third [64, 128] matrix of ffn_down_exps.
  const auto& down = m.model.layers[1].block_sparse_moe.experts[2].down_proj.weight;
  EXPECT_EQ(std::memcmp(reinterpret_cast<const float*>(f.tensor("blk.1.ffn_down_exps.weight").data) + 2 * 64 * 128,
                        down.data(), 64 * 128 * sizeof(float)),
            0);
  const auto back = models::from_gguf<>(file);
  EXPECT_EQ(back.config().model_type, "mixtral");
  EXPECT_EQ(back.config().num_local_experts, 4);
  EXPECT_EQ(back.config().num_experts_per_tok, 2);
  expect_same_bits(logits_of(back), logits_of(m));

  // q8_0: the experts (not the router) as blocks; loads as the in-memory quantized model and
  // writes back the same bytes.
  auto ref = m;
  nn::quantize(ref, nn::QuantizationConfig{quant::Format::q8_0});
  const fs::path q8 = dir / "mixtral-q8_0.gguf";
  models::save_gguf(q8, m, options("q8_0", "f32"));
  const auto fq = GgufFile::open(q8.string());
  EXPECT_EQ(fq.tensor("blk.0.ffn_gate_exps.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(fq.tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);
  auto qback = models::from_gguf<>(q8);
  EXPECT_TRUE(qback.model.layers[0].block_sparse_moe.experts[3].up_proj.is_quantized());
  expect_same_bits(logits_of(qback), logits_of(ref));
  const fs::path again = dir / "again.gguf";
  models::save_gguf(again, qback, options("q8_0", "f32"));
  const auto g = GgufFile::open(again.string());
  for (const auto& t : fq.tensors()) {
    const auto a = t.bytes(), b = g.data_of(t.name);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << t.name;
  }

  // Qwen2-MoE has llama.cpp's qwen2moe architecture: refused with a clear error.
  LlamaConfig qc = small_config();
  qc.model_type = "qwen2_moe";
  qc.num_local_experts = 4;
  qc.num_experts_per_tok = 2;
  qc.moe_intermediate_size = 32;
  qc.validate();
  LlamaForCausalLM<> qm(qc);
  EXPECT_NE(error_of([&] { models::save_gguf(dir / "q.gguf", qm, {}); }).find("qwen2moe"), std::string::npos);
}

TEST(GgufLlama, RopeScalingRoundTrips) {
  TempDir dir;
  for (const char* type : {"linear", "llama3"}) {
    LlamaConfig c = small_config();
    models::RopeScaling r;
    r.rope_type = type;
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.original_max_position_embeddings = 16;  // so that the 16-dim heads have scaled frequencies
    c.rope_scaling = r;
    LlamaForCausalLM<> m(c);
    m.init(Key::from_seed(12), 0.1f);
    const fs::path file = dir / (std::string(type) + ".gguf");
    models::save_gguf(file, m, {});
    const auto f = GgufFile::open(file.string());
    EXPECT_EQ(f.has_tensor("rope_freqs.weight"), std::string(type) == "llama3");
    EXPECT_EQ(f.has("llama.rope.scaling.factor"), std::string(type) == "linear");
    const auto back = models::from_gguf<>(file);
    ASSERT_TRUE(back.config().rope_scaling.has_value()) << type;
    EXPECT_EQ(back.config().rope_scaling->rope_type, type);
    EXPECT_EQ(back.config().rope_scaling->factor, 8.0);
    expect_same_bits(logits_of(back), logits_of(m));
  }
  // A llama3 file without edl's keys (as llama.cpp's converter writes it) with Llama 3.1's settings.
  LlamaConfig c = small_config();
  models::RopeScaling r;
  r.rope_type = "llama3";
  r.factor = 8.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position_embeddings = 8192;
  c.rope_scaling = r;
  c.rope_theta = 500000.0;
  LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(13), 0.1f);
  const fs::path file = dir / "llama31.gguf";
  models::save_gguf(file, m, {});
  std::string b = read_bytes(file);
  patch(b, "edl.rope_scaling.factor", "edl.rope_scaling.factoX");
  write_bytes(file, b);
  const auto back = models::from_gguf<>(file);
  ASSERT_TRUE(back.config().rope_scaling.has_value());
  EXPECT_EQ(back.config().rope_scaling->rope_type, "llama3");
  EXPECT_EQ(back.config().rope_scaling->original_max_position_embeddings, 8192);
  expect_same_bits(logits_of(back), logits_of(m));
}

// ------------------------------------------------------------------------------------ vocabulary

TEST(GgufLlama, PlaceholderVocabularyHasUniqueTokens) {
  TempDir dir;
  const fs::path file = dir / "m.gguf";
  models::save_gguf(file, make_model(8), {});
  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_TRUE(f.get_string_array("tokenizer.ggml.merges").empty());
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 40u);
  std::vector<std::string> sorted = tokens;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(tokens[0], "\u0100");  // GPT-2's text of byte 0
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[32], "\u0120");  // the space byte
  EXPECT_EQ(tokens[33], "!");
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type")[1], 3);
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type")[33], 1);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 2u);
  const auto back = models::from_gguf<>(file);
  EXPECT_EQ(back.config().bos_token_id, 1);
  EXPECT_EQ(back.config().eos_token_id, std::vector<std::int64_t>{2});
}

TEST(GgufLlama, ByteLevelTokenizerBecomesGpt2Vocabulary) {
  TempDir dir;
  const fs::path tok = dir / "tok";
  fs::create_directories(tok);
  write_text(tok / "tokenizer.json", R"({
    "version": "1.0", "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "added_tokens": [
      {"id": 38, "content": "<s>", "special": true, "normalized": false},
      {"id": 39, "content": "</s>", "special": true, "normalized": false}],
    "model": {"type": "BPE", "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4, "<s>": 38, "</s>": 39},
              "merges": ["a b", ["\u0120", "ab"]]}})");
  write_text(tok / "tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": {"content": "</s>"},
    "add_bos_token": true, "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})");
  const fs::path file = dir / "m.gguf";
  models::save_gguf(file, make_model(9), options("f32", "", tok));
  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gpt-2");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 40u);
  EXPECT_EQ(tokens[2], "ab");
  EXPECT_EQ(tokens[5], "[PAD5]");
  EXPECT_EQ(tokens[38], "<s>");
  const auto types = f.get_i32_array("tokenizer.ggml.token_type");
  EXPECT_EQ(types[2], 1);   // normal
  EXPECT_EQ(types[5], 5);   // unused
  EXPECT_EQ(types[39], 3);  // control
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges"), (std::vector<std::string>{"a b", "\u0120 ab"}));
  EXPECT_FALSE(f.has("tokenizer.ggml.scores"));
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 38u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 39u);
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), "{% for m in messages %}{{ m.content }}{% endfor %}");
  const auto back = models::from_gguf<>(file);
  EXPECT_EQ(back.config().bos_token_id, 38);
  EXPECT_EQ(back.config().eos_token_id, std::vector<std::int64_t>{39});
}

TEST(GgufLlama, ByteFallbackTokenizerBecomesLlamaVocabulary) {
  TempDir dir;
  write_text(dir / "tokenizer.json", R"({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true},
                     {"id": 2, "content": "</s>", "special": true}],
    "decoder": {"type": "Sequence", "decoders": []},
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "\u2581a": 4, "b": 5}, "merges": ["\u2581 a"]}})");
  const fs::path file = dir / "m.gguf";
  models::save_gguf(file, make_model(10), options("f32", "", dir / ""));
  const auto f = GgufFile::open(file.string());
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  const auto types = f.get_i32_array("tokenizer.ggml.token_type");
  EXPECT_EQ(types[0], 2);  // unknown
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(types[3], 6);  // byte
  EXPECT_EQ(types[4], 1);
  const auto scores = f.get_f32_array("tokenizer.ggml.scores");
  EXPECT_GT(scores[4], scores[5]);  // earlier pieces merge first
  EXPECT_EQ(f.get_u32("tokenizer.ggml.unknown_token_id"), 0u);
  EXPECT_FALSE(f.has("tokenizer.ggml.merges"));
}

// ------------------------------------------------------------------------------------ errors

TEST(GgufLlama, ErrorsNameTheFileAndTheTensorOrKey) {
  TempDir dir;
  const fs::path good = dir / "good.gguf";
  models::save_gguf(good, make_model(11), {});
  const std::string bytes = read_bytes(good);

  {  // another architecture
    std::string b = bytes;
    patch(b, "llama", "gemma", "general.architecture");
    const fs::path p = dir / "arch.gguf";
    write_bytes(p, b);
    const std::string msg = error_of([&] { (void)models::from_gguf<>(p); });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("general.architecture"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gemma"), std::string::npos) << msg;
  }
  {  // a missing tensor (renamed in the tensor infos)
    std::string b = bytes;
    patch(b, "blk.1.ffn_up.weight", "blk.1.ffn_uq.weight");
    const fs::path p = dir / "missing.gguf";
    write_bytes(p, b);
    const std::string msg = error_of([&] { (void)models::from_gguf<>(p); });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.1.ffn_up.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  }
  {  // a wrong shape: attn_q's dims {64, 64} written as {32, 128} (the same bytes)
    std::string b = bytes;
    std::string from = "blk.0.attn_q.weight", to = from;
    const auto dims = [](std::uint64_t a, std::uint64_t c) {
      std::string s(20, '\0');
      const std::uint32_t n = 2;
      std::memcpy(s.data(), &n, 4);
      std::memcpy(s.data() + 4, &a, 8);
      std::memcpy(s.data() + 12, &c, 8);
      return s;
    };
    patch(b, from + dims(64, 64), to + dims(32, 128));
    const fs::path p = dir / "shape.gguf";
    write_bytes(p, b);
    const std::string msg = error_of([&] { (void)models::from_gguf<>(p); });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.0.attn_q.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(32, 128)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(64, 64)"), std::string::npos) << msg;
  }
  {  // an unsupported ggml type: F32 bytes declared I32
    std::string b = bytes;
    const std::string name = "blk.0.attn_v.weight";
    std::string info(name + std::string(20, '\0') + std::string(4, '\0'));
    const std::uint32_t n = 2, f32 = 0, i32 = 26;
    const std::uint64_t d0 = 64, d1 = 32;
    std::memcpy(info.data() + name.size(), &n, 4);
    std::memcpy(info.data() + name.size() + 4, &d0, 8);
    std::memcpy(info.data() + name.size() + 12, &d1, 8);
    std::string to = info;
    std::memcpy(info.data() + name.size() + 20, &f32, 4);
    std::memcpy(to.data() + name.size() + 20, &i32, 4);
    patch(b, info, to);
    const fs::path p = dir / "type.gguf";
    write_bytes(p, b);
    const std::string msg = error_of([&] { (void)models::from_gguf<>(p); });
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("'blk.0.attn_v.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
  }
  {  // an unknown type name when saving
    const std::string msg = error_of([&] { models::save_gguf(dir / "x.gguf", make_model(11), options("q5_k")); });
    EXPECT_NE(msg.find("q5_k"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(dir / "x.gguf"));
  }
  {  // a qwen3 model: its per-head q/k norms have no place in a llama file
    LlamaConfig c = small_config();
    c.model_type = "qwen3";
    LlamaForCausalLM<> q3(c);
    q3.init(Key::from_seed(12));
    try {
      models::save_gguf(dir / "qwen3.gguf", q3, {});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), errc::unsupported) << msg;
      EXPECT_NE(msg.find("q_norm"), std::string::npos) << msg;
      EXPECT_NE(msg.find("\"qwen3\""), std::string::npos) << msg;
    }
    EXPECT_FALSE(fs::exists(dir / "qwen3.gguf"));
  }
}

}  // namespace
