// HF checkpoint loading / saving (models/llama/pretrained.hpp), the module-protocol
// conveniences, and the library functions behind `edl logits` / `edl loss` / --mesh
// (examples/cli/{logits,loss,mesh_flag}.hpp), checked against the PyTorch oracle fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xnpy.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/policy.hpp>
#include <edl/io/npy.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/generate/generate.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/lora/apply.hpp>
#include <edl/core/rng.hpp>

#include "../../examples/cli/logits.hpp"
#include "../../examples/cli/loss.hpp"
#include "../../examples/cli/mesh_flag.hpp"
#include "../nn/nn_test_util.hpp"
#include "support/huge_pages.hpp"

using namespace edl;
using models::LlamaConfig;
using models::LlamaForCausalLM;
namespace fs = std::filesystem;

namespace {

fs::path fixture() {
  const char* env = std::getenv("EDL_TEST_DATA");
  return fs::path(env ? env : "tests/data") / "tiny_hf";
}

#define NEED_FIXTURE()                                                                               \
  do {                                                                                               \
    if (!fs::exists(fixture() / "oracle" / "grads.safetensors")) FAIL() << "no fixture at " << fixture() << " (EDL_TEST_DATA)"; \
  } while (0)

/// A fresh temp folder per test, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / ("edl_test_pretrained_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// Every value of every parameter, in visit order, as raw bits.
template <class M>
std::vector<std::pair<std::string, std::vector<unsigned char>>> param_bytes(M& m) {
  std::vector<std::pair<std::string, std::vector<unsigned char>>> out;
  m.visit_params("", [&](std::string_view path, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    const auto* b = reinterpret_cast<const unsigned char*>(p.data());
    out.emplace_back(std::string(path), std::vector<unsigned char>(b, b + p.value.size() * sizeof(T)));
  });
  return out;
}

/// The fixture's tensors, owned, so tests can write edited copies.
struct OwnedTensors {
  std::vector<std::string> names;
  std::vector<std::vector<float>> data;
  std::vector<std::vector<std::int64_t>> shapes;
  io::TensorList list() const {
    io::TensorList l;
    for (std::size_t i = 0; i < names.size(); ++i) l.emplace_back(names[i], io::TensorRef(data[i], shapes[i]));
    return l;
  }
  void erase(const std::string& n) {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == n) {
        names.erase(names.begin() + i);
        data.erase(data.begin() + i);
        shapes.erase(shapes.begin() + i);
        return;
      }
  }
  void add(const std::string& n, std::vector<std::int64_t> shape, float v = 0.5f) {
    std::int64_t k = 1;
    for (auto d : shape) k *= d;
    names.push_back(n);
    data.emplace_back(static_cast<std::size_t>(k), v);
    shapes.push_back(std::move(shape));
  }
};

OwnedTensors fixture_tensors() {
  const auto f = io::SafeTensorsFile::open((fixture() / "model.safetensors").string());
  OwnedTensors t;
  for (const auto& n : f.names()) {
    t.names.push_back(n);
    t.data.push_back(f.read_vector<float>(n));
    t.shapes.push_back(f.info(n).shape);
  }
  return t;
}

/// A folder with the fixture's config.json (optionally edited) and the given tensors.
void write_checkpoint(const fs::path& dir, const OwnedTensors& t, bool tied = false) {
  fs::create_directories(dir);
  auto cfg = LlamaConfig::from_file((fixture() / "config.json").string());
  cfg.tie_word_embeddings = tied;
  cfg.save((dir / "config.json").string());
  io::save_safetensors((dir / "model.safetensors").string(), t.list(), {{"format", "pt"}});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------ oracle

// Loading rules (the seeds' ParameterTransformRule): a checkpoint with names of its own and
// its head stored transposed loads through rules into the HF folder's model bit for bit; the
// folder without its rules, a rule without the transpose and two tensors renamed to one name
// are errors naming the tensor.
TEST(Pretrained, TransformRulesLoadOtherNamesAndLayouts) {
  NEED_FIXTURE();
  auto want = models::from_pretrained<>(fixture());
  OwnedTensors t = fixture_tensors();
  for (std::size_t i = 0; i < t.names.size(); ++i) {
    std::string& n = t.names[i];
    if (n.rfind("model.layers.", 0) == 0) n = "blocks." + n.substr(13);
    else if (n == "model.embed_tokens.weight") n = "wte";
    else if (n == "lm_head.weight") {  // stored [hidden, vocab]
      models::TensorValues v{t.data[i], t.shapes[i]};
      models::transpose_2d(v);
      n = "head_t";
      t.data[i] = v.values;
      t.shapes[i] = v.shape;
    }
  }
  TempDir d("rules");
  write_checkpoint(d.path, t);
  const models::TransformRules rules{{R"(^blocks\.)", "model.layers.", {}},
                                     {"^wte$", "model.embed_tokens.weight", {}},
                                     {"^head_t$", "lm_head.weight", models::transpose_2d}};
  models::LoadOptions o;
  o.transform_rules = rules;
  auto got = models::from_pretrained<>(d.path, o);
  EXPECT_EQ(param_bytes(got), param_bytes(want));
  // The view loads into an existing model too, and bf16 parameters take one rounding.
  const auto ckpt = io::ShardedCheckpoint::open(d.path.string());
  LlamaForCausalLM<BF16ParamsPolicy> half(got.config());
  models::load_weights(half, models::TransformedCheckpoint(ckpt, rules));
  auto half_ref = models::from_pretrained<BF16ParamsPolicy>(fixture());
  EXPECT_EQ(param_bytes(half), param_bytes(half_ref));

  EXPECT_NE(error_of([&] { models::from_pretrained<>(d.path); }).find("model.embed_tokens.weight"), std::string::npos);
  o.transform_rules = {rules[0], rules[1], {"^head_t$", "lm_head.weight", {}}};
  const std::string no_transpose = error_of([&] { models::from_pretrained<>(d.path, o); });
  EXPECT_NE(no_transpose.find("lm_head.weight"), std::string::npos) << no_transpose;
  o.transform_rules = {rules[0], {"^wte$", "model.norm.weight", {}}, rules[2]};
  const std::string collision = error_of([&] { models::from_pretrained<>(d.path, o); });
  EXPECT_NE(collision.find("both renamed to \"model.norm.weight\""), std::string::npos) << collision;
  o.transform_rules = {{"(unclosed", "x", {}}};
  EXPECT_NE(error_of([&] { models::from_pretrained<>(d.path, o); }).find("not a valid regex"), std::string::npos);
}

TEST(Pretrained, FromPretrainedLogitsMatchOracle) {
  NEED_FIXTURE();
  auto m = models::from_pretrained(fixture());
  const auto want = io::load_npy<float>((fixture() / "oracle" / "logits.npy").string());
  // The same functions `edl logits` runs.
  const cli::TokenBatch t = cli::load_token_ids((fixture() / "oracle" / "tokens.npy").string());
  EXPECT_EQ(t.batch, 2);
  EXPECT_EQ(t.seq, 8);
  const std::vector<float> got = cli::compute_logits(m, t);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want.data()[i])));
  EXPECT_LT(worst, 1e-4);
}

TEST(Pretrained, CliLossAndGradsMatchOracle) {
  NEED_FIXTURE();
  TempDir tmp("loss");
  auto m = models::from_pretrained(fixture());
  const cli::TokenBatch t = cli::load_token_ids((fixture() / "oracle" / "tokens.npy").string());
  nlohmann::json lj;
  std::ifstream((fixture() / "oracle" / "loss.json").string()) >> lj;
  const auto loss_only = cli::compute_loss(m, t, nullptr, false);
  EXPECT_NEAR(loss_only.loss, lj["loss"].get<double>(), 1e-5);
  EXPECT_EQ(loss_only.tokens, lj["n_target_tokens"].get<std::int64_t>());

  // Twice with grads: gradients are zeroed first, so they do not double.
  cli::compute_loss(m, t, nullptr, true);
  const auto with_grads = cli::compute_loss(m, t, &t, true);  // explicit labels = tokens
  EXPECT_NEAR(with_grads.loss, lj["loss"].get<double>(), 1e-5);
  const std::string gpath = (tmp.path / "g.safetensors").string();
  cli::save_grads(gpath, m);
  const auto got = io::SafeTensorsFile::open(gpath);
  const auto want = io::SafeTensorsFile::open((fixture() / "oracle" / "grads.safetensors").string());
  EXPECT_EQ(got.metadata().at("format"), "pt");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& name : want.names()) {
    ASSERT_TRUE(got.contains(name)) << name;
    EXPECT_EQ(got.info(name).dtype, DType::f32);
    const auto g = got.read_vector<float>(name), w = want.read_vector<float>(name);
    ASSERT_EQ(g.size(), w.size());
    const double scale = edl_nn_test::max_abs(w.data(), w.size());
    double err = 0;
    for (std::size_t i = 0; i < g.size(); ++i) err = std::max(err, double(std::fabs(g[i] - w[i])));
    EXPECT_LE(err, 1e-4 * scale + 1e-7) << name;
  }

  // Labels with -100: fewer targets.
  cli::TokenBatch labels = t;
  labels.ids[3] = -100;
  EXPECT_EQ(cli::compute_loss(m, t, &labels, false).tokens, 13);
}

namespace {

/// A model read from a folder of scripts/qwen{2,3}_reference.py against the reference's numbers
/// there: logits, loss and every gradient; greedy decoding with the KV cache (prefill, then
/// one-row steps) gives the argmax of full forwards at each step.
/// Every gradient in `got` (saved by cli::save_grads) equals the reference's within 1e-4 of the
/// tensor's largest value.
void expect_grads_match(const std::string& got, const fs::path& reference) {
  const auto g = io::SafeTensorsFile::open(got);
  const auto w = io::SafeTensorsFile::open(reference.string());
  ASSERT_EQ(g.size(), w.size());
  for (const auto& name : w.names()) {
    ASSERT_TRUE(g.contains(name)) << name;
    const auto a = g.read_vector<float>(name), b = w.read_vector<float>(name);
    const double scale = edl_nn_test::max_abs(b.data(), b.size());
    double err = 0;
    for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, double(std::fabs(a[i] - b[i])));
    EXPECT_LE(err, 1e-4 * scale + 1e-7) << name;
  }
}

/// `greedy`: also check that greedy decoding with the KV cache gives the argmax of a full forward
/// per step (not so for rope scalings that depend on the length, whose cached keys keep the
/// rotation of the step that wrote them).
void expect_matches_reference(LlamaForCausalLM<>& m, const fs::path& dir, bool greedy = true) {
  const cli::TokenBatch t = cli::load_token_ids((dir / "oracle" / "tokens.npy").string());
  const auto want = io::load_npy<float>((dir / "oracle" / "logits.npy").string());
  const std::vector<float> got = cli::compute_logits(m, t);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want.data()[i])));
  EXPECT_LT(worst, 1e-4);

  nlohmann::json lj;
  std::ifstream((dir / "oracle" / "loss.json").string()) >> lj;
  EXPECT_NEAR(cli::compute_loss(m, t, nullptr, true).loss, lj["loss"].get<double>(), 1e-5);
  TempDir tmp(dir.filename().string());
  const std::string gpath = (tmp.path / "g.safetensors").string();
  cli::save_grads(gpath, m);
  expect_grads_match(gpath, dir / "oracle" / "grads.safetensors");

  if (!greedy) return;
  // Greedy decode (prefill + cached one-row steps) == argmax of a full forward per step.
  std::vector<std::int64_t> seq(t.ids.begin(), t.ids.begin() + 4);
  generate::GenerationConfig gc;
  gc.do_sample = false;
  gc.max_new_tokens = 6;
  gc.eos_token_id.clear();
  const auto r = generate::generate(m, {seq}, gc);
  ASSERT_EQ(r.tokens[0].size(), 6u);
  const std::int64_t V = m.config().vocab_size;
  for (std::size_t k = 0; k < 6; ++k) {
    const cli::TokenBatch b{seq, 1, static_cast<std::int64_t>(seq.size())};
    const auto l = cli::compute_logits(m, b);
    const float* last = l.data() + (seq.size() - 1) * static_cast<std::size_t>(V);
    const auto next = std::max_element(last, last + V) - last;
    EXPECT_EQ(r.tokens[0][k], next) << "step " << k;
    seq.push_back(next);
  }
}

/// KV-cache decoding against the reference's logits `file` (in oracle/ of `dir`, [rows, seq, V]):
/// both rows prefilled with `prefill` tokens (every row's logits), then decoded together one
/// token at a time (steps of two rows), and row 0 alone the same way (the phased one-row step).
void expect_decoding_matches(const LlamaForCausalLM<>& m, const fs::path& dir, const char* file, std::int64_t prefill) {
  const LlamaConfig& c = m.config();
  const cli::TokenBatch t = cli::load_token_ids((dir / "oracle" / "tokens.npy").string());
  const auto want = io::load_npy<float>((dir / "oracle" / file).string());
  const std::int64_t B = t.batch, S = t.seq, V = c.vocab_size, P = prefill;
  const auto worst_diff = [&](const float* got, std::int64_t b, std::int64_t s0, std::int64_t n) {
    double w = 0;
    const float* ref = want.data() + (b * S + s0) * V;
    for (std::int64_t i = 0; i < n * V; ++i) w = std::max(w, double(std::fabs(got[i] - ref[i])));
    return w;
  };
  for (const std::int64_t rows : {B, std::int64_t{1}}) {
    SCOPED_TRACE(rows == 1 ? "row 0 alone" : "both rows");
    generate::StandardKVCache cache(generate::kv_cache_shape(c, rows, S));
    generate::Decoder dec(m, cache);
    std::vector<std::int64_t> head(static_cast<std::size_t>(rows * P));
    for (std::int64_t b = 0; b < rows; ++b) std::copy_n(t.ids.begin() + b * S, P, head.begin() + b * P);
    std::vector<float> all(static_cast<std::size_t>(rows * P * V)), last(static_cast<std::size_t>(rows * V));
    dec.prefill(head.data(), P, nullptr, last.data(), all.data());
    for (std::int64_t b = 0; b < rows; ++b) EXPECT_LT(worst_diff(all.data() + b * P * V, b, 0, P), 1e-4) << "prefill";
    for (std::int64_t s = P; s < S; ++s) {
      std::vector<std::int64_t> step(static_cast<std::size_t>(rows));
      for (std::int64_t b = 0; b < rows; ++b) step[static_cast<std::size_t>(b)] = t.ids[static_cast<std::size_t>(b * S + s)];
      dec.decode(step.data(), last.data());
      for (std::int64_t b = 0; b < rows; ++b)
        EXPECT_LT(worst_diff(last.data() + b * V, b, s, 1), 1e-4) << "row " << b << " position " << s;
    }
  }
}

/// m saved to `to` has the config.json of `dir` (the fixture it was read from) and loads back
/// bit for bit.
void expect_resave_round_trips(LlamaForCausalLM<>& m, const fs::path& dir, const fs::path& to) {
  models::save_pretrained(to, m);
  std::ifstream a(dir / "config.json"), b(to / "config.json");
  EXPECT_EQ(nlohmann::json::parse(b), nlohmann::json::parse(a));
  auto back = models::from_pretrained(to);
  EXPECT_EQ(param_bytes(back), param_bytes(m));
}

/// The cached forward against the reference's full-forward logits (oracle/logits.npy of `dir`):
/// both rows prefilled at once (a prefill of 8 rows attends on the GEMM), then 5 prefilled and
/// the rest decoded (expect_decoding_matches).
void expect_cached_forward_matches(const LlamaForCausalLM<>& m, const fs::path& dir) {
  static_assert(generate::detail::kGemmAttentionRows <= 8);
  const cli::TokenBatch t = cli::load_token_ids((dir / "oracle" / "tokens.npy").string());
  expect_decoding_matches(m, dir, "logits.npy", t.seq);
  expect_decoding_matches(m, dir, "logits.npy", 5);
}

}  // namespace

/// Qwen2 (biases on q, k and v) against its PyTorch reference (scripts/qwen2_reference.py):
/// logits, loss and every gradient, biases included; greedy decoding with the KV cache gives
/// the argmax of full forwards at each step.
TEST(Pretrained, Qwen2MatchesItsReference) {
  const fs::path dir = fixture().parent_path() / "tiny_qwen2";
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  auto m = models::from_pretrained(dir.string());
  EXPECT_EQ(m.config().model_type, "qwen2");
  EXPECT_TRUE(m.config().qkv_bias());
  expect_matches_reference(m, dir);
}

/// Mistral (a sliding window of 3 keys over 8-token rows: query i sees keys i-2..i) against its
/// PyTorch reference (scripts/mistral_reference.py): logits, loss and every gradient, greedy
/// decoding, and the cached forward (prefill on the GEMM and one-row decode steps, whose
/// windows leave the cache's older positions out).
TEST(Pretrained, MistralSlidingWindowMatchesItsReference) {
  const fs::path dir = fixture().parent_path() / "tiny_mistral";
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  auto m = models::from_pretrained(dir.string());
  EXPECT_EQ(m.config().model_type, "mistral");
  EXPECT_EQ(m.config().attention_window(), std::optional<std::int64_t>(3));
  EXPECT_EQ(m.model.layers[0].self_attn.sliding_window(), 3);
  expect_matches_reference(m, dir);
  expect_cached_forward_matches(m, dir);
}

/// Rope scalings yarn, dynamic and longrope (Phi-3's form: the original context at the top level)
/// against their PyTorch reference (scripts/rope_scaling_reference.py): logits, loss and every
/// gradient of the full forward, and KV-cache decoding, where dynamic and longrope rotate each
/// token by the length of the step that wrote it (they cross their threshold of 6 positions
/// mid-way, so the cached logits differ from the full forward's). Saved, the config keeps its
/// rope_scaling as read.
TEST(Pretrained, RopeScalingsMatchTheirReference) {
  for (const char* kind : {"yarn", "dynamic", "longrope"}) {
    SCOPED_TRACE(kind);
    const fs::path dir = fixture().parent_path() / "tiny_rope" / kind;
    ASSERT_TRUE(fs::exists(dir / "oracle" / "cached_logits.npy")) << "no fixture at " << dir;
    auto m = models::from_pretrained(dir.string());
    ASSERT_TRUE(m.config().rope_scaling.has_value());
    EXPECT_EQ(m.config().rope_scaling->rope_type, kind);
    expect_matches_reference(m, dir, /*greedy=*/std::string(kind) == "yarn");
    expect_decoding_matches(m, dir, "cached_logits.npy", 4);
    if (std::string(kind) == "yarn") expect_cached_forward_matches(m, dir);  // static: cached == full

    TempDir tmp(std::string("rope_") + kind);
    models::save_pretrained(tmp.path, m);
    std::ifstream a(dir / "config.json"), b(tmp.path / "config.json");
    const auto read = nlohmann::json::parse(a), written = nlohmann::json::parse(b);
    EXPECT_EQ(written["rope_scaling"], read["rope_scaling"]);
    EXPECT_EQ(written.value("original_max_position_embeddings", nlohmann::json()),
              read.value("original_max_position_embeddings", nlohmann::json()));
  }
}

/// Gemma 3 (gemma3_text) against its PyTorch reference (scripts/gemma_reference.py): (1 + w)
/// norms, sandwich norms, q/k norms, GeGLU, embeddings scaled by sqrt(hidden), a query scale
/// from query_pre_attn_scalar (12, not head_dim 8), sliding layers (window 3 over 8-token rows)
/// with their own rope base between global layers with linear rope scaling: logits, loss, every
/// gradient, greedy decoding and the cached forward (the GEMM prefill, one-row decode steps and
/// two-row steps); saved, it has HF's names and loads back bit for bit.
TEST(Pretrained, Gemma3MatchesItsReference) {
  const fs::path dir = fixture().parent_path() / "tiny_gemma3";
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  auto m = models::from_pretrained(dir.string());
  const LlamaConfig& c = m.config();
  EXPECT_TRUE(c.is_gemma());
  EXPECT_TRUE(m.tied());
  EXPECT_TRUE(m.model.layers[0].has_sandwich_norms());
  EXPECT_EQ(m.model.layers[0].self_attn.sliding_window(), 3);
  EXPECT_EQ(m.model.layers[1].self_attn.sliding_window(), 0);
  EXPECT_EQ(models::parameter_count(m), c.parameter_count());
  expect_matches_reference(m, dir);
  expect_cached_forward_matches(m, dir);

  TempDir tmp("gemma3_resaved");
  expect_resave_round_trips(m, dir, tmp.path);
  const auto f = io::SafeTensorsFile::open((tmp.path / "model.safetensors").string());
  for (const char* n : {"post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"})
    EXPECT_TRUE(f.contains(std::string("model.layers.3.") + n + ".weight")) << n;

  // A cap that is not a positive number is refused by name.
  std::ifstream in(dir / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["attn_logit_softcapping"] = -1.0;
  try {
    models::LlamaConfig::from_json(j, "config.json");
    ADD_FAILURE() << "a negative cap accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn_logit_softcapping"), std::string::npos) << e.what();
  }
}

/// Gemma 3 as the hub ships its 4B and larger checkpoints: Gemma3ForConditionalGeneration,
/// the text model's config under text_config and its tensors under a prefix beside a vision
/// tower's. The tiny Gemma 3 fixture rewritten that way (both prefix styles transformers has
/// written, a vision tensor and a projector tensor beside) runs the text model with the same
/// weights, so it matches the same reference; saved, it is the text-only model.
TEST(Pretrained, Gemma3MultimodalCheckpointRunsItsTextModel) {
  const fs::path dir = fixture().parent_path() / "tiny_gemma3";
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  nlohmann::json text;
  std::ifstream(dir / "config.json") >> text;
  auto text_model = models::from_pretrained(dir.string());
  const auto f = io::SafeTensorsFile::open((dir / "model.safetensors").string());
  for (const bool new_style : {false, true}) {
    SCOPED_TRACE(new_style ? "model.language_model." : "language_model.model.");
    TempDir tmp(new_style ? "gemma3_mm_new" : "gemma3_mm_old");
    nlohmann::json mm = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                         {"eos_token_id", text["eos_token_id"]}, {"image_token_index", 40},
                         {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 8}}}};
    mm["text_config"] = text;
    mm["text_config"].erase("eos_token_id");  // taken from the top level, as the hub's configs have it
    mm["text_config"].erase("architectures");
    std::ofstream(tmp.path / "config.json") << mm.dump(2);
    OwnedTensors t;
    for (const auto& n : f.names()) {
      t.names.push_back(new_style ? "model.language_model." + n.substr(6) : "language_model." + n);
      t.data.push_back(f.read_vector<float>(n));
      t.shapes.push_back(f.info(n).shape);
    }
    for (const char* extra : {"vision_tower.vision_model.embeddings.patch_embedding.weight",
                              "multi_modal_projector.mm_input_projection_weight"}) {
      t.names.push_back(new_style ? std::string("model.") + extra : extra);
      t.data.emplace_back(16, 0.5f);
      t.shapes.push_back({4, 4});
    }
    io::save_safetensors((tmp.path / "model.safetensors").string(), t.list(), {{"format", "pt"}});

    auto m = models::from_pretrained(tmp.path.string());
    EXPECT_EQ(m.config().multimodal_type, "gemma3");
    EXPECT_EQ(m.config().model_type, "gemma3_text");
    EXPECT_EQ(m.config().eos_token_id, text_model.config().eos_token_id);
    EXPECT_EQ(param_bytes(m), param_bytes(text_model));
    expect_matches_reference(m, dir, /*greedy=*/false);
    // Saved, it is the text model alone, under edl's (Gemma3ForCausalLM's) names.
    TempDir out(new_style ? "gemma3_mm_new_saved" : "gemma3_mm_old_saved");
    models::save_pretrained(out.path, m);
    nlohmann::json saved;
    std::ifstream(out.path / "config.json") >> saved;
    EXPECT_EQ(saved["model_type"], "gemma3_text");
    EXPECT_EQ(saved["architectures"], nlohmann::json({"Gemma3ForCausalLM"}));
    EXPECT_TRUE(io::SafeTensorsFile::open((out.path / "model.safetensors").string()).contains("model.embed_tokens.weight"));
    auto back = models::from_pretrained(out.path);
    EXPECT_TRUE(back.config().multimodal_type.empty());
    EXPECT_EQ(param_bytes(back), param_bytes(m));
  }
}

/// A hub multimodal config lists in text_config only what differs from Gemma3TextConfig's
/// defaults (gemma-3-4b-it's, abridged): the rest takes them, token ids come from the top level.
TEST(Pretrained, Gemma3MultimodalConfigTakesGemma3TextDefaults) {
  const auto j = nlohmann::json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "eos_token_id": [1, 106],
    "image_token_index": 262144, "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"model_type": "siglip_vision_model"}})");
  const auto c = LlamaConfig::from_json(j, "config.json");
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_size(), 256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, (std::vector<std::int64_t>{1, 106}));
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_TRUE(c.layer_is_sliding(0));
  EXPECT_FALSE(c.layer_is_sliding(5));  // every sixth layer is global
  // Without a text_config: refused, naming it.
  auto bad = j;
  bad.erase("text_config");
  EXPECT_NE(error_of([&] { LlamaConfig::from_json(bad, "config.json"); }).find("text_config"), std::string::npos);
}

/// Gemma 2 against the same reference (scripts/gemma_reference.py --family gemma2): Gemma 3's
/// layer without q/k norms, one rope for all layers, sliding even layers, and soft-capping of
/// the attention scores (2) and of the final logits (3), small enough to bend most values, in
/// the training attention and loss (forward and backward) and in the cached forward.
TEST(Pretrained, Gemma2MatchesItsReference) {
  const fs::path dir = fixture().parent_path() / "tiny_gemma2";
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  auto m = models::from_pretrained(dir.string());
  const LlamaConfig& c = m.config();
  EXPECT_EQ(c.model_type, "gemma2");
  EXPECT_FALSE(c.qk_norm());
  EXPECT_EQ(c.attn_softcap(), 2.0);
  EXPECT_EQ(c.final_softcap(), 3.0);
  EXPECT_EQ(m.model.layers[0].self_attn.sliding_window(), 3);
  EXPECT_EQ(m.model.layers[1].self_attn.sliding_window(), 0);
  expect_matches_reference(m, dir);
  expect_cached_forward_matches(m, dir);
  TempDir tmp("gemma2_resaved");
  expect_resave_round_trips(m, dir, tmp.path);
}

/// A rope_scaling edl cannot honour is refused naming the field.
TEST(Pretrained, BadRopeScalingIsRefusedByName) {
  const fs::path dir = fixture().parent_path() / "tiny_rope" / "longrope";
  std::ifstream in(dir / "config.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  const auto refused = [&](nlohmann::json cfg, const std::string& field) {
    try {
      models::LlamaConfig::from_json(cfg, "config.json");
      ADD_FAILURE() << "accepted " << cfg["rope_scaling"].dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  nlohmann::json c = good;
  c["rope_scaling"]["short_factor"] = {1.0, 2.0};
  refused(c, "rope_scaling.short_factor");
  c = good;
  c["rope_scaling"]["long_factor"][1] = -1.0;
  refused(c, "rope_scaling.long_factor");
  c = good;
  c["rope_scaling"] = {{"rope_type", "yarn"}};
  refused(c, "rope_scaling.factor");
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1.0}, {"beta_slow", 2.0}};
  refused(c, "rope_scaling.beta_fast");
  c["rope_scaling"] = {{"rope_type", "su"}, {"factor", 4.0}};
  refused(c, "rope_scaling.rope_type");
}

/// Qwen3 (an RMSNorm over head_dim on each query and key head before rope; head_dim 8 while
/// hidden / heads is 4; tied embeddings) against its PyTorch reference
/// (scripts/qwen3_reference.py): logits, loss and every gradient, q_norm and k_norm included,
/// and greedy decoding as for Qwen2; the cached forward (a prefill of 8 rows attends on the
/// GEMM, decode steps one row at a time) gives the reference's logits; saved, it has HF's
/// names and loads back bit for bit.
TEST(Pretrained, Qwen3MatchesItsReference) {
  const fs::path dir = fixture().parent_path() / "tiny_qwen3";
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  auto m = models::from_pretrained(dir.string());
  const LlamaConfig& c = m.config();
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_TRUE(c.qk_norm());
  EXPECT_FALSE(c.qkv_bias());
  EXPECT_TRUE(m.tied());
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_NE(c.head_size() * c.num_attention_heads, c.hidden_size);
  EXPECT_TRUE(m.model.layers[1].self_attn.has_qk_norm());
  EXPECT_EQ(models::parameter_count(m), c.parameter_count());
  expect_matches_reference(m, dir);

  expect_cached_forward_matches(m, dir);

  TempDir tmp("qwen3_resaved");
  models::save_pretrained(tmp.path, m);
  const auto f = io::SafeTensorsFile::open((tmp.path / "model.safetensors").string());
  EXPECT_TRUE(f.contains("model.layers.1.self_attn.q_norm.weight"));
  EXPECT_TRUE(f.contains("model.layers.1.self_attn.k_norm.weight"));
  EXPECT_FALSE(f.contains("lm_head.weight"));
  auto back = models::from_pretrained(tmp.path);
  EXPECT_EQ(back.config().model_type, "qwen3");
  EXPECT_EQ(param_bytes(back), param_bytes(m));
}

/// Phi-3 (q, k, v fused into self_attn.qkv_proj and gate, up into mlp.gate_up_proj in the
/// checkpoint; Llama's math otherwise) against its PyTorch reference (scripts/phi3_reference.py):
/// logits, loss and every gradient (written fused, as HF names them), greedy decoding and the
/// cached forward; saved, the folder holds the fused tensors again, loads back bit for bit, and
/// resumes on a mesh (each rank reads its blocks out of the fused tensors).
TEST(Pretrained, Phi3MatchesItsReference) {
  const fs::path dir = fixture().parent_path() / "tiny_phi3";
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  auto m = models::from_pretrained(dir.string());
  EXPECT_EQ(m.config().model_type, "phi3");
  EXPECT_TRUE(m.config().fused_projections());
  EXPECT_EQ(m.config().attention_window(), std::optional<std::int64_t>(2047));
  expect_matches_reference(m, dir);
  expect_cached_forward_matches(m, dir);

  TempDir tmp("phi3_resaved");
  models::save_pretrained(tmp.path, m);
  const auto f = io::SafeTensorsFile::open((tmp.path / "model.safetensors").string());
  const auto src = io::SafeTensorsFile::open((dir / "model.safetensors").string());
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(f.names()), sorted(src.names()));  // HF's names: qkv_proj, gate_up_proj
  EXPECT_EQ(f.info("model.layers.1.self_attn.qkv_proj.weight").shape, (std::vector<std::int64_t>{32, 16}));
  EXPECT_FALSE(f.contains("model.layers.0.self_attn.q_proj.weight"));
  for (const auto& name : src.names()) EXPECT_EQ(f.read_vector<float>(name), src.read_vector<float>(name)) << name;
  auto back = models::from_pretrained(tmp.path);
  std::vector<float> a, b;
  m.visit_params("", [&](std::string_view, auto& p) { a.insert(a.end(), p.data(), p.data() + p.numel()); });
  back.visit_params("", [&](std::string_view, auto& p) { b.insert(b.end(), p.data(), p.data() + p.numel()); });
  EXPECT_EQ(a, b);

  // A fused tensor of the wrong height is named.
  LlamaConfig wrong = m.config();
  wrong.intermediate_size = 20;
  LlamaForCausalLM<> small(wrong);
  try {
    models::load_weights(small, io::ShardedCheckpoint::open(dir.string()));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate_up_proj"), std::string::npos) << e.what();
  }
}

namespace {

/// A mixture-of-experts model from its HF folder `name` against its PyTorch reference
/// (scripts/moe_model_reference.py): logits; on a right-padded batch the loss the HF model
/// computes with output_router_logits (cross-entropy + router_aux_loss_coef x the
/// load-balancing loss over the sparse layers, padding excluded) and every gradient, routers,
/// experts and shared experts included; gradient checkpointing gives the same gradients bit for
/// bit; the cached forward (a batch prefill grouped by expert, one-row decode steps reading only
/// the chosen experts, two-row decode steps) gives the reference's logits; LoRA on the experts
/// decodes as it scores; saved, it has the HF file's names and loads back bit for bit.
void expect_moe_matches_reference(const std::string& name, const std::vector<std::string>& lora_targets) {
  const fs::path dir = fixture().parent_path() / name;
  ASSERT_TRUE(fs::exists(dir / "oracle" / "grads.safetensors")) << "no fixture at " << dir;
  auto m = models::from_pretrained(dir.string());
  const LlamaConfig& c = m.config();
  ASSERT_TRUE(c.is_moe());
  EXPECT_EQ(c.num_local_experts, 4);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_TRUE(c.output_router_logits);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    EXPECT_EQ(m.model.layers[static_cast<std::size_t>(l)].is_sparse(), c.layer_is_sparse(l)) << "layer " << l;
  EXPECT_EQ(models::parameter_count(m), c.parameter_count());

  const cli::TokenBatch t = cli::load_token_ids((dir / "oracle" / "tokens.npy").string());
  const auto want = io::load_npy<float>((dir / "oracle" / "logits.npy").string());
  const std::int64_t B = t.batch, S = t.seq, V = c.vocab_size;
  {
    const std::vector<float> got = cli::compute_logits(m, t);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want.data()[i])));
    EXPECT_LT(worst, 1e-4);
  }

  const auto mask = io::load_npy<std::int64_t>((dir / "oracle" / "attention_mask.npy").string());
  const auto labels = io::load_npy<std::int64_t>((dir / "oracle" / "labels.npy").string());
  nlohmann::json lj;
  std::ifstream((dir / "oracle" / "loss.json").string()) >> lj;
  const nn::TokenLayout lay{B, S, nullptr, mask.data()};
  const nn::LossMetrics lm = m.forward_backward(t.ids.data(), lay, labels.data());
  EXPECT_NEAR(lm.loss, lj["loss"].get<double>(), 1e-5);
  EXPECT_NEAR(lm.aux_loss, lj["aux_loss"].get<double>(), 1e-5);
  EXPECT_EQ(lm.tokens, lj["n_target_tokens"].get<std::int64_t>());
  EXPECT_NEAR(m.loss(t.ids.data(), lay, labels.data()).loss, lm.loss, 1e-12);
  TempDir tmp(name);
  const std::string gpath = (tmp.path / "g.safetensors").string();
  cli::save_grads(gpath, m);
  expect_grads_match(gpath, dir / "oracle" / "grads.safetensors");
  {  // remat: the layers recompute what they dropped, the experts keep theirs: same gradients
    nn::zero_grad(m);
    m.forward_backward<remat::nothing_saveable>(t.ids.data(), lay, labels.data());
    const std::string rpath = (tmp.path / "r.safetensors").string();
    cli::save_grads(rpath, m);
    const auto a = io::SafeTensorsFile::open(gpath), b = io::SafeTensorsFile::open(rpath);
    for (const auto& name : a.names()) EXPECT_EQ(a.read_vector<float>(name), b.read_vector<float>(name)) << name;
  }
  {  // without output_router_logits the loss is the cross-entropy alone, as in transformers
    LlamaConfig plain = c;
    plain.output_router_logits = false;
    fs::create_directories(tmp.path / "plain");
    plain.save((tmp.path / "plain" / "config.json").string());
    fs::copy_file(dir / "model.safetensors", tmp.path / "plain" / "model.safetensors");
    auto p = models::from_pretrained(tmp.path / "plain");
    const nn::LossMetrics pm = p.loss(t.ids.data(), lay, labels.data());
    EXPECT_NEAR(pm.loss, lj["ce"].get<double>(), 1e-5);
    EXPECT_EQ(pm.aux_loss, 0.0);
  }

  expect_cached_forward_matches(m, dir);  // prefills grouped by expert, decode reading only the chosen

  {  // LoRA on the experts: a fresh adapter changes nothing; a trained one decodes as it scores
    auto adapted = models::from_pretrained(dir.string());
    lora::LoraConfig lc;
    lc.r = 2;
    lc.target_modules = lora_targets;
    EXPECT_GT(lora::apply_lora(adapted, lc), 2 * c.num_local_experts);
    EXPECT_EQ(cli::compute_logits(adapted, t), cli::compute_logits(m, t));
    std::uint32_t i = 0;
    adapted.visit_linears("", [&](const std::string&, auto& lin) {
      if (lin.lora)
        fill_normal(fold_in(Key::from_seed(5), i++), 0, std::span<float>(lin.lora->B.data(), lin.lora->B.value.size()),
                    0.0f, 0.2f);
    });
    const std::vector<float> full = cli::compute_logits(adapted, t);
    generate::StandardKVCache cache(generate::kv_cache_shape(c, 1, S));
    generate::Decoder dec(adapted, cache);
    std::vector<float> last(static_cast<std::size_t>(V));
    dec.prefill(t.ids.data(), 5, nullptr, last.data());
    double worst = 0, moved = 0;
    for (std::int64_t s = 5; s < S; ++s) {
      dec.decode(t.ids.data() + s, last.data());
      for (std::int64_t v = 0; v < V; ++v) {
        worst = std::max(worst, double(std::fabs(last[v] - full[s * V + v])));
        moved = std::max(moved, double(std::fabs(last[v] - want.data()[s * V + v])));
      }
    }
    EXPECT_LT(worst, 1e-4);
    EXPECT_GT(moved, 1e-2);  // the adapters do change the logits
  }

  models::save_pretrained(tmp.path / "resaved", m);
  const auto f = io::SafeTensorsFile::open((tmp.path / "resaved" / "model.safetensors").string());
  const auto hf = io::SafeTensorsFile::open((dir / "model.safetensors").string());
  auto names = f.names(), hf_names = hf.names();
  std::sort(names.begin(), names.end());
  std::sort(hf_names.begin(), hf_names.end());
  EXPECT_EQ(names, hf_names);
  auto back = models::from_pretrained(tmp.path / "resaved");
  EXPECT_EQ(back.config().num_local_experts, c.num_local_experts);
  EXPECT_EQ(back.config().to_json(), c.to_json());
  EXPECT_EQ(param_bytes(back), param_bytes(m));
}

}  // namespace

/// Mixtral: block_sparse_moe (w1/w2/w3 experts) in every layer, renormalised top-2 weights.
TEST(Pretrained, MixtralMatchesItsReference) {
  expect_moe_matches_reference("tiny_mixtral", {"w1", "w2", "q_proj"});
}

/// Qwen2-MoE: q/k/v biases, a dense middle layer (mlp_only_layers), a shared expert gated by a
/// sigmoid, top-2 weights not renormalised (norm_topk_prob false).
TEST(Pretrained, Qwen2MoeMatchesItsReference) {
  expect_moe_matches_reference("tiny_qwen2_moe", {"gate_proj", "down_proj", "q_proj"});
  const auto c = LlamaConfig::from_file((fixture().parent_path() / "tiny_qwen2_moe" / "config.json").string());
  EXPECT_TRUE(c.qkv_bias());
  EXPECT_FALSE(c.layer_is_sparse(1));
  EXPECT_EQ(c.shared_expert_size(), 24);
  EXPECT_FALSE(c.norm_topk_prob);
}

/// Qwen3-MoE: per-head q/k norms, head_dim 8 (not hidden / heads), renormalised top-2 weights.
TEST(Pretrained, Qwen3MoeMatchesItsReference) {
  expect_moe_matches_reference("tiny_qwen3_moe", {"up_proj", "o_proj"});
  const auto c = LlamaConfig::from_file((fixture().parent_path() / "tiny_qwen3_moe" / "config.json").string());
  EXPECT_TRUE(c.qk_norm());
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_size(), 0);
}

TEST(Pretrained, CliChecksTokenIds) {
  NEED_FIXTURE();
  TempDir tmp("ids");
  auto m = models::from_pretrained(fixture());
  // int32, 1-D tokens: batch 1.
  xt::xarray<std::int32_t> a = {3, 7, 64, 1};
  const std::string p = (tmp.path / "t32.npy").string();
  xt::dump_npy(p, a);
  const auto t = cli::load_token_ids(p);
  EXPECT_EQ(t.batch, 1);
  EXPECT_EQ(t.seq, 4);
  EXPECT_EQ(t.ids[2], 64);
  const std::string e = error_of([&] { cli::compute_logits(m, t); });
  EXPECT_NE(e.find("--tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("id 64 at position (0, 2)"), std::string::npos) << e;
  // float tokens are refused, naming the file.
  xt::xarray<float> f = {1.f, 2.f};
  const std::string pf = (tmp.path / "f.npy").string();
  xt::dump_npy(pf, f);
  const std::string ef = error_of([&] { cli::load_token_ids(pf); });
  EXPECT_NE(ef.find("f.npy"), std::string::npos) << ef;
  EXPECT_NE(ef.find("int32 or int64"), std::string::npos) << ef;
  // Labels: -100 allowed, other negatives not.
  cli::TokenBatch l = cli::load_token_ids((fixture() / "oracle" / "tokens.npy").string());
  const cli::TokenBatch toks = l;
  l.ids[9] = -5;
  const std::string el = error_of([&] { cli::compute_loss(m, toks, &l, false); });
  EXPECT_NE(el.find("--labels"), std::string::npos) << el;
  EXPECT_NE(el.find("position (1, 1)"), std::string::npos) << el;
}

TEST(Pretrained, MeshFlag) {
  EXPECT_EQ(cli::parse_mesh("dp=1,fsdp=2,tp=2,sp=1"), (cli::MeshDims{1, 2, 1, 2, 1}));
  EXPECT_EQ(cli::parse_mesh("tp=4"), (cli::MeshDims{1, 1, 1, 4, 1}));
  EXPECT_EQ(cli::parse_mesh("sp=2,dp=3"), (cli::MeshDims{3, 1, 1, 1, 2}));
  EXPECT_EQ(cli::parse_mesh("ep=2,fsdp=2"), (cli::MeshDims{1, 2, 2, 1, 1}));
  EXPECT_EQ(cli::mesh_str({1, 2, 2, 1, 1}), "dp=1,fsdp=2,ep=2,tp=1,sp=1");
  for (const char* bad : {"", "tp", "tp=", "tp=0", "tp=-2", "tp=1.5", "tp=x", "pp=2", "tp=2,tp=2", "tp=2,", ",tp=2",
                          "tp=99999999999999999999"}) {
    try {
      cli::parse_mesh(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "--mesh") << bad;
      EXPECT_EQ(e.code(), errc::invalid_argument) << bad;
    }
  }
  EXPECT_EQ(cli::mesh_str({1, 2, 1, 2, 1}), "dp=1,fsdp=2,tp=2,sp=1");
  // A mesh of one device runs; a larger one is refused until sharded execution is wired.
  LlamaConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 8;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(0));
  std::vector<std::int64_t> ids = {1, 2, 3, 4};
  const auto r = cli::run_on_mesh({1, 1, 1, 1, 1}, m, models::MeshOp::loss, ids.data(), nn::TokenLayout{1, 4});
  EXPECT_EQ(r.tokens, 3);
  // A tensor-parallel mesh gives the one-device loss and gradients (to f32 rounding).
  const auto one = cli::run_on_mesh({1, 1, 1, 1, 1}, m, models::MeshOp::loss_and_grads, ids.data(), nn::TokenLayout{1, 4});
  std::map<std::string, std::vector<float>> g1;
  m.visit_params("", [&](std::string_view path, auto& p) { g1[std::string(path)].assign(p.grad.begin(), p.grad.end()); });
  const auto two = cli::run_on_mesh({1, 1, 1, 2, 1}, m, models::MeshOp::loss_and_grads, ids.data(), nn::TokenLayout{1, 4});
  EXPECT_NEAR(two.loss, one.loss, 1e-6);
  EXPECT_EQ(two.tokens, one.tokens);
  m.visit_params("", [&](std::string_view path, auto& p) {
    const auto& want = g1.at(std::string(path));
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(p.grad.data()[i], want[i], 1e-5) << path;
  });
  // A mesh whose sizes do not divide the heads is refused with an error naming the problem.
  EXPECT_THROW(cli::run_on_mesh({1, 1, 1, 4, 1}, m, models::MeshOp::loss, ids.data(), nn::TokenLayout{1, 4}), Error);
}

// ------------------------------------------------------------------------------ save / load

TEST(Pretrained, HugePagesOptionAdvisesTheWeightsBeforeWritingThem) {
  TempDir tmp("huge_pages");
  LlamaConfig c;
  c.vocab_size = 8192;  // an 8 MiB embedding: whole huge pages inside it
  c.hidden_size = 256;
  c.intermediate_size = 256;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(3));
  models::save_pretrained(tmp.path, m);
  auto plain = models::from_pretrained(tmp.path);
  models::LoadOptions o;
  o.huge_pages = true;
  auto huge = models::from_pretrained(tmp.path, o);
  EXPECT_EQ(param_bytes(huge), param_bytes(m));
  EXPECT_EQ(param_bytes(plain), param_bytes(m));
  if (!test_support::thp_available()) GTEST_SKIP() << "transparent huge pages are off on this machine";
  const auto middle = [](auto& model) {
    const void* mid = nullptr;
    model.visit_params("", [&](std::string_view path, auto& p) {
      if (path == "model.embed_tokens.weight") mid = p.data() + p.value.size() / 2;
    });
    return mid;
  };
  EXPECT_TRUE(test_support::mapping_advised_huge(middle(huge)));
  EXPECT_FALSE(test_support::mapping_advised_huge(middle(plain)));
}


TEST(Pretrained, SaveThenLoadIsBitExactSingleAndSharded) {
  NEED_FIXTURE();
  TempDir tmp("roundtrip");
  auto m = models::from_pretrained(fixture());
  const auto want = param_bytes(m);

  const fs::path single = tmp.path / "single";
  const auto files = models::save_pretrained(single, m);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(fs::exists(single / "model.safetensors"));
  EXPECT_FALSE(fs::exists(single / "model.safetensors.index.json"));
  {
    const auto f = io::SafeTensorsFile::open((single / "model.safetensors").string());
    EXPECT_EQ(f.metadata().at("format"), "pt");
    const auto names = f.names();
    const auto shapes = m.config().parameter_shapes();
    ASSERT_EQ(names.size(), shapes.size());
    for (std::size_t i = 0; i < names.size(); ++i) EXPECT_EQ(names[i], shapes[i].first);  // HF order
  }
  // config.json keeps unknown fields and the fixture's values.
  const auto cj = io::JsonConfig::from_file((single / "config.json").string());
  EXPECT_EQ(cj.json()["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cj.json()["torch_dtype"], "float32");
  EXPECT_EQ(cj.json()["num_key_value_heads"], 2);
  auto back = models::from_pretrained(single);
  EXPECT_EQ(param_bytes(back), want);

  const fs::path sharded = tmp.path / "sharded";
  const auto sfiles = models::save_pretrained(sharded, m, 4096);
  EXPECT_GT(sfiles.size(), 3u);
  EXPECT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
  const auto ck = io::ShardedCheckpoint::open(sharded.string());
  EXPECT_GT(ck.files().size(), 2u);
  EXPECT_EQ(ck.index_metadata()["total_size"].get<std::uint64_t>(), models::parameter_bytes(m));
  auto back2 = models::from_pretrained(sharded);
  EXPECT_EQ(param_bytes(back2), want);

  // Re-saving the sharded folder as one file removes the shards and the index.
  models::save_pretrained(sharded, m);
  EXPECT_FALSE(fs::exists(sharded / "model.safetensors.index.json"));
  auto back3 = models::from_pretrained(sharded);
  EXPECT_EQ(param_bytes(back3), want);
}

TEST(Pretrained, Bf16SaveThenLoadEqualsRounding) {
  NEED_FIXTURE();
  TempDir tmp("bf16");
  auto m = models::from_pretrained(fixture());
  models::save_pretrained(tmp.path, m, {.dtype = DType::bf16});
  const auto f = io::SafeTensorsFile::open((tmp.path / "model.safetensors").string());
  for (const auto& n : f.names()) EXPECT_EQ(f.info(n).dtype, DType::bf16) << n;
  EXPECT_EQ(io::JsonConfig::from_file((tmp.path / "config.json").string()).json()["torch_dtype"], "bfloat16");

  auto back = models::from_pretrained(tmp.path);                          // f32 params
  auto backb = models::from_pretrained<BF16ParamsPolicy>(tmp.path);       // bf16 params
  auto mb = models::to_dtype<BF16ParamsPolicy>(m);
  std::vector<float> src;
  m.visit_params("", [&](std::string_view, auto& p) { src.insert(src.end(), p.data(), p.data() + p.value.size()); });
  std::vector<float> got;
  back.visit_params("", [&](std::string_view, auto& p) { got.insert(got.end(), p.data(), p.data() + p.value.size()); });
  std::vector<std::uint16_t> gotb, tob;
  backb.visit_params("", [&](std::string_view, auto& p) {
    for (std::size_t i = 0; i < p.value.size(); ++i) gotb.push_back(p.data()[i].bits);
  });
  mb.visit_params("", [&](std::string_view, auto& p) {
    for (std::size_t i = 0; i < p.value.size(); ++i) tob.push_back(p.data()[i].bits);
  });
  ASSERT_EQ(src.size(), got.size());
  ASSERT_EQ(src.size(), gotb.size());
  ASSERT_EQ(src.size(), tob.size());
  std::size_t changed = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    const bf16 r(src[i]);
    EXPECT_EQ(got[i], r.to_float()) << i;
    EXPECT_EQ(gotb[i], r.bits) << i;
    EXPECT_EQ(tob[i], r.bits) << i;
    changed += got[i] != src[i];
  }
  EXPECT_GT(changed, src.size() / 2);  // the values really were rounded

  // bf16 model saved in its own dtype, and back to f32: exact.
  TempDir tmp2("bf16b");
  models::save_pretrained(tmp2.path, mb);
  auto backbb = models::from_pretrained<BF16ParamsPolicy>(tmp2.path);
  EXPECT_EQ(param_bytes(backbb), param_bytes(mb));
  auto widened = models::to_dtype<DefaultPolicy>(mb);
  EXPECT_EQ(param_bytes(widened), param_bytes(back));
}

// half(): a model with f16 parameters saves as F16 tensors with torch_dtype "float16", and
// from_pretrained<F16ParamsPolicy> of the f32 checkpoint rounds each value to nearest even.
TEST(Pretrained, F16SaveThenLoadEqualsRounding) {
  NEED_FIXTURE();
  auto m = models::from_pretrained(fixture());
  auto mh = models::to_dtype<F16ParamsPolicy>(m);
  auto loaded = models::from_pretrained<F16ParamsPolicy>(fixture());
  std::vector<float> src;
  m.visit_params("", [&](std::string_view, auto& p) { src.insert(src.end(), p.data(), p.data() + p.value.size()); });
  std::vector<std::uint16_t> tob, gotb;
  mh.visit_params("", [&](std::string_view, auto& p) {
    for (std::size_t i = 0; i < p.value.size(); ++i) tob.push_back(p.data()[i].bits);
  });
  loaded.visit_params("", [&](std::string_view, auto& p) {
    for (std::size_t i = 0; i < p.value.size(); ++i) gotb.push_back(p.data()[i].bits);
  });
  ASSERT_EQ(src.size(), tob.size());
  ASSERT_EQ(src.size(), gotb.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(tob[i], f16(src[i]).bits) << i;
    ASSERT_EQ(gotb[i], tob[i]) << i;
  }
  TempDir tmp("f16");
  models::save_pretrained(tmp.path, mh);
  const auto f = io::SafeTensorsFile::open((tmp.path / "model.safetensors").string());
  for (const auto& n : f.names()) EXPECT_EQ(f.info(n).dtype, DType::f16) << n;
  EXPECT_EQ(io::JsonConfig::from_file((tmp.path / "config.json").string()).json()["torch_dtype"], "float16");
  auto back = models::from_pretrained<F16ParamsPolicy>(tmp.path);
  EXPECT_EQ(param_bytes(back), param_bytes(mh));
  EXPECT_EQ(models::parameter_bytes(mh) * 2, models::parameter_bytes(m));
}

TEST(Pretrained, ToDtypeCopiesGradientsAndKeepsConfig) {
  NEED_FIXTURE();
  auto m = models::from_pretrained(fixture());
  std::vector<std::int64_t> ids = {1, 2, 3, 4, 5, 6};
  m.forward_backward(ids.data(), nn::TokenLayout{1, 6});
  auto mb = models::to_dtype<BF16ParamsPolicy>(m);
  EXPECT_EQ(mb.config().to_json(), m.config().to_json());
  EXPECT_EQ(mb.model.norm.weight.grad, m.model.norm.weight.grad);
  EXPECT_EQ(models::parameter_count(mb), models::parameter_count(m));
  EXPECT_EQ(models::parameter_bytes(mb) * 2, models::parameter_bytes(m));
}

// ------------------------------------------------------------------------------ errors

TEST(Pretrained, MissingUnexpectedAndWrongShapeTensorsAreNamed) {
  NEED_FIXTURE();
  TempDir tmp("errors");
  {
    auto t = fixture_tensors();
    t.erase("model.layers.1.mlp.up_proj.weight");
    write_checkpoint(tmp.path / "missing", t);
    const std::string e = error_of([&] { models::from_pretrained(tmp.path / "missing"); });
    EXPECT_NE(e.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find((tmp.path / "missing" / "model.safetensors").string()), std::string::npos) << e;
    EXPECT_NE(e.find("does not hold"), std::string::npos) << e;
  }
  {
    auto t = fixture_tensors();
    t.add("model.layers.0.self_attn.q_norm.weight", {4});
    write_checkpoint(tmp.path / "unexpected", t);
    const std::string e = error_of([&] { models::from_pretrained(tmp.path / "unexpected"); });
    EXPECT_NE(e.find("model.layers.0.self_attn.q_norm.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("unexpected"), std::string::npos) << e;
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
    // allow_unexpected lists it instead.
    LlamaForCausalLM<> m(LlamaConfig::from_file((fixture() / "config.json").string()));
    const auto rep = models::load_weights(m, io::ShardedCheckpoint::open((tmp.path / "unexpected").string()),
                                          {.allow_unexpected = true, .transform_rules = {}});
    ASSERT_EQ(rep.unexpected.size(), 1u);
    EXPECT_EQ(rep.loaded.size(), 21u);
  }
  {
    auto t = fixture_tensors();
    t.erase("model.norm.weight");
    t.add("model.norm.weight", {17});
    write_checkpoint(tmp.path / "shape", t);
    try {
      models::from_pretrained(tmp.path / "shape");
      ADD_FAILURE() << "wrong shape loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), errc::shape_mismatch);
      const std::string w = e.what();
      EXPECT_NE(w.find("model.norm.weight"), std::string::npos) << w;
      EXPECT_NE(w.find("(17)"), std::string::npos) << w;
      EXPECT_NE(w.find("(16)"), std::string::npos) << w;
      EXPECT_NE(w.find("model.safetensors"), std::string::npos) << w;
    }
  }
  {
    // Sharded: the error names the shard that holds the tensor.
    auto t = fixture_tensors();
    t.erase("model.norm.weight");
    t.add("model.norm.weight", {3, 16});
    fs::create_directories(tmp.path / "sharded");
    LlamaConfig::from_file((fixture() / "config.json").string()).save((tmp.path / "sharded" / "config.json").string());
    io::save_sharded((tmp.path / "sharded").string(), t.list(), 2048, {{"format", "pt"}});
    const std::string e = error_of([&] { models::from_pretrained(tmp.path / "sharded"); });
    EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("-of-"), std::string::npos) << e;
  }
  {
    // A config.json that claims sizes far beyond the weights beside it (found by fuzzing and by
    // hand: once a std::bad_alloc while the model was built) is refused before allocating,
    // naming the tensor; sizes beyond any model are refused by the config itself.
    auto cfg = LlamaConfig::from_file((fixture() / "config.json").string());
    cfg.vocab_size = 1 << 23;
    cfg.intermediate_size = 1 << 21;
    fs::create_directories(tmp.path / "huge");
    cfg.save((tmp.path / "huge" / "config.json").string());
    io::save_safetensors((tmp.path / "huge" / "model.safetensors").string(), fixture_tensors().list());
    try {
      models::from_pretrained(tmp.path / "huge");
      ADD_FAILURE() << "a 2^23-token vocabulary over the fixture's weights loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), errc::shape_mismatch) << e.what();
      EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos) << e.what();
    }
    cfg.hidden_size = std::int64_t{1} << 40;
    cfg.save((tmp.path / "huge" / "config.json").string());
    const std::string e = error_of([&] { models::from_pretrained(tmp.path / "huge"); });
    EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
    EXPECT_NE(e.find("above the largest"), std::string::npos) << e;
  }
  {
    // HF's rotary buffers are ignored.
    auto t = fixture_tensors();
    t.add("model.layers.0.self_attn.rotary_emb.inv_freq", {2});
    write_checkpoint(tmp.path / "buffers", t);
    auto m = models::from_pretrained(tmp.path / "buffers");
    EXPECT_EQ(models::parameter_count(m), 6736);
  }
  // No weights at all: an io error naming the folder.
  fs::create_directories(tmp.path / "empty");
  LlamaConfig::from_file((fixture() / "config.json").string()).save((tmp.path / "empty" / "config.json").string());
  const std::string e = error_of([&] { models::from_pretrained(tmp.path / "empty"); });
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
}

TEST(Pretrained, TiedEmbeddingsLoadWithoutLmHead) {
  NEED_FIXTURE();
  TempDir tmp("tied");
  auto t = fixture_tensors();
  auto with_head = t;
  t.erase("lm_head.weight");
  write_checkpoint(tmp.path / "tied", t, /*tied=*/true);
  auto m = models::from_pretrained(tmp.path / "tied");
  EXPECT_TRUE(m.tied());
  EXPECT_EQ(models::parameter_count(m), 6736 - 64 * 16);
  // The head reads the embedding.
  std::vector<std::int64_t> ids = {5, 9, 1};
  std::vector<float> logits(3 * 64), hidden(3 * 16);
  m.logits(ids.data(), nn::TokenLayout{1, 3}, logits.data());
  typename LlamaForCausalLM<>::Saved s;
  m.forward(ids.data(), nn::TokenLayout{1, 3}, s);
  double dot = 0;
  for (int j = 0; j < 16; ++j) dot += double(s.hidden[16 * 2 + j]) * m.model.embed_tokens.weight.data()[7 * 16 + j];
  EXPECT_NEAR(logits[2 * 64 + 7], dot, 1e-4);
  // A tied checkpoint that still carries lm_head.weight loads too (ignored, as HF).
  write_checkpoint(tmp.path / "tied_with_head", with_head, true);
  LlamaForCausalLM<> m2(LlamaConfig::from_file((tmp.path / "tied_with_head" / "config.json").string()));
  const auto rep = models::load_weights(m2, io::ShardedCheckpoint::open((tmp.path / "tied_with_head").string()));
  ASSERT_EQ(rep.ignored.size(), 1u);
  EXPECT_EQ(rep.ignored[0], "lm_head.weight");
  // Saved tied: no lm_head.weight, and it loads back.
  models::save_pretrained(tmp.path / "resaved", m);
  const auto f = io::SafeTensorsFile::open((tmp.path / "resaved" / "model.safetensors").string());
  EXPECT_FALSE(f.contains("lm_head.weight"));
  auto m3 = models::from_pretrained(tmp.path / "resaved");
  EXPECT_EQ(param_bytes(m3), param_bytes(m));
}

// ------------------------------------------------------------------------------ protocol

TEST(Pretrained, LazyInitMatchesTheModelWithoutAllocating) {
  LlamaConfig c = LlamaConfig::preset("tiny");
  const auto specs = models::lazy_init<>(c);
  LlamaForCausalLM<> m(c);
  const auto shapes = nn::named_shapes(m);
  ASSERT_EQ(specs.size(), shapes.size());
  std::int64_t n = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].name, shapes[i].first);
    EXPECT_EQ(specs[i].shape, shapes[i].second);
    EXPECT_EQ(specs[i].dtype, DType::f32);
    EXPECT_EQ(specs[i].bytes, static_cast<std::uint64_t>(specs[i].numel()) * 4);
    n += specs[i].numel();
  }
  EXPECT_EQ(n, models::parameter_count(m));
  EXPECT_EQ(models::total_bytes(specs), models::parameter_bytes(m));
  // 1.1B parameters in bf16, sized from the config alone.
  const auto big = models::lazy_init<BF16ParamsPolicy>(LlamaConfig::preset("gqa1b"));
  std::int64_t nb = 0;
  for (const auto& p : big) nb += p.numel();
  EXPECT_EQ(nb, LlamaConfig::preset("gqa1b").parameter_count());
  EXPECT_EQ(models::total_bytes(big), static_cast<std::uint64_t>(nb) * 2);
  EXPECT_EQ(big.front().dtype, DType::bf16);

  // init(model, key) = the model's own init (initializer_range), deterministic.
  LlamaConfig sc;
  sc.vocab_size = 32;
  sc.hidden_size = 16;
  sc.intermediate_size = 24;
  sc.num_hidden_layers = 2;
  sc.num_attention_heads = 4;
  sc.num_key_value_heads = 2;
  LlamaForCausalLM<> a(sc), b(sc);
  models::init(a, Key::from_seed(3));
  b.init(Key::from_seed(3));
  EXPECT_EQ(param_bytes(a), param_bytes(b));
}
