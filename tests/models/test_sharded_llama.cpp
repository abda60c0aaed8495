#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <edl/io/safetensors.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded.hpp>

#include "../support/same_params.hpp"
#include "../support/small_llama.hpp"

using namespace edl;
using models::LlamaConfig;
using models::LlamaForCausalLM;

namespace {

using Dims = std::array<std::int64_t, 4>;

LlamaConfig small_gqa_config(bool tied = false, bool bias = false) {
  LlamaConfig c = test_support::small_llama_config();
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.attention_bias = bias;
  c.mlp_bias = bias;
  c.validate();
  return c;
}

std::filesystem::path tiny_hf_dir() {
  const char* env = std::getenv("EDL_TEST_DATA");
  return std::filesystem::path(env ? env : "tests/data") / "tiny_hf";
}

std::vector<std::int64_t> random_tokens(std::int64_t n, std::int64_t vocab, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int64_t> t(static_cast<std::size_t>(n));
  for (auto& v : t) v = static_cast<std::int64_t>(g() % static_cast<unsigned>(vocab));
  return t;
}

std::string dims_str(const Dims& d) {
  return "mesh(dp=" + std::to_string(d[0]) + ",fsdp=" + std::to_string(d[1]) + ",tp=" + std::to_string(d[2]) +
         ",sp=" + std::to_string(d[3]) + ")";
}
std::string dims_str(const MeshDims& d) {
  return "mesh(dp=" + std::to_string(d[0]) + ",fsdp=" + std::to_string(d[1]) + ",ep=" + std::to_string(d[2]) +
         ",tp=" + std::to_string(d[3]) + ",sp=" + std::to_string(d[4]) + ")";
}

double g_worst = 0;  // worst max|a - b| / max|a| seen, printed by the mesh tests

/// max |a - b| <= tol * max |a| (a: the one-device reference).
template <class A, class B>
void expect_close(const A* ref, const B* got, std::size_t n, const std::string& what, double tol = 1e-5) {
  double mx = 0, err = 0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mx = std::max(mx, std::abs(static_cast<double>(ref[i])));
    const double e = std::abs(static_cast<double>(ref[i]) - static_cast<double>(got[i]));
    if (e > err) err = e, worst = i;
  }
  g_worst = std::max(g_worst, err / std::max(mx, 1e-12));
  EXPECT_LE(err, tol * std::max(mx, 1e-12)) << what << ": max error " << err << " at " << worst << " (ref "
                                            << (n ? ref[worst] : 0) << ", got " << (n ? got[worst] : 0) << "), max |ref| "
                                            << mx;
}

struct Reference {
  std::vector<float> logits;  // [B*S*V]
  nn::LossMetrics metrics;
  std::map<std::string, std::vector<float>> grads;
};

template <class Pol>
Reference reference(LlamaForCausalLM<Pol>& m, const std::vector<std::int64_t>& ids, const std::vector<std::int64_t>& labels,
                    std::int64_t B, std::int64_t S, const nn::LossOptions& opt = {}) {
  Reference r;
  nn::TokenLayout lay{B, S};
  r.logits.resize(static_cast<std::size_t>(B * S * m.config().vocab_size));
  m.logits(ids.data(), lay, r.logits.data());
  nn::zero_grad(m);
  r.metrics = m.forward_backward(ids.data(), lay, labels.data(), opt);
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (!p.frozen) r.grads[std::string(path)] = std::vector<float>(p.grad.begin(), p.grad.end());
  });
  return r;
}

template <std::size_t N, class Pol>
void check_mesh(LlamaForCausalLM<Pol>& m, const Reference& ref, const std::vector<std::int64_t>& ids,
                const std::vector<std::int64_t>& labels, std::int64_t B, std::int64_t S,
                const std::array<std::int64_t, N>& dims, const nn::LossOptions& opt = {}, double tol = 1e-5) {
  const std::string where = dims_str(dims);
  SCOPED_TRACE(where);
  auto mesh = create_mesh(dims);
  auto sm = models::shard_model(m, mesh);
  const auto logits = sm.logits(ids.data(), B, S);
  ASSERT_EQ(logits.size(), ref.logits.size());
  expect_close(ref.logits.data(), logits.data(), logits.size(), where + " logits", tol);

  const auto metrics = sm.loss_and_grads(ids.data(), labels.data(), B, S, opt);
  EXPECT_EQ(metrics.tokens, ref.metrics.tokens);
  EXPECT_NEAR(metrics.loss, ref.metrics.loss, tol * std::abs(ref.metrics.loss)) << where;
  EXPECT_NEAR(metrics.z_loss, ref.metrics.z_loss, 1e-5 * std::abs(ref.metrics.z_loss) + 1e-12) << where;
  EXPECT_NEAR(metrics.accuracy, ref.metrics.accuracy, tol > 1e-5 ? 0.1 : 1e-12) << where;
  EXPECT_NEAR(metrics.perplexity, ref.metrics.perplexity, tol * ref.metrics.perplexity) << where;
  EXPECT_NEAR(metrics.aux_loss, ref.metrics.aux_loss, 1e-5 * std::abs(ref.metrics.aux_loss) + 1e-12) << where;
  EXPECT_NEAR(metrics.router_z_loss, ref.metrics.router_z_loss, 1e-5 * std::abs(ref.metrics.router_z_loss) + 1e-12)
      << where;
  ASSERT_EQ(sm.trainable_names().size(), ref.grads.size());
  for (const auto& [name, g] : ref.grads) {
    const auto got = sm.gather_grad(name);
    ASSERT_EQ(got.size(), g.size()) << name;
    expect_close(g.data(), got.data(), g.size(), where + " grad " + name, tol);
  }
  // The loss alone agrees with loss_and_grads.
  EXPECT_NEAR(sm.loss(ids.data(), labels.data(), B, S, opt).loss, metrics.loss, 1e-12) << where;
}

const std::vector<Dims> kMeshes = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}, {1, 1, 1, 2},
                                   {2, 2, 2, 1}, {1, 2, 2, 2}, {2, 1, 2, 2}, {2, 2, 1, 2}, {1, 4, 1, 1},
                                   {1, 1, 1, 4}, {4, 1, 1, 1}};

}  // namespace

TEST(ShardedLlama, TinyHfFixtureMatchesOneDevice) {
  const auto dir = tiny_hf_dir();
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  LlamaForCausalLM<> m(cfg);
  nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, cfg.vocab_size, 3);
  auto labels = ids;
  labels[5] = -100;
  labels[17] = -100;
  const Reference ref = reference(m, ids, labels, B, S);
  for (const auto& d : kMeshes) check_mesh(m, ref, ids, labels, B, S, d);
  std::printf("  worst relative error so far: %.3g\n", g_worst);
}

// bf16 activations on every mesh: the mesh rounds where one device does (the row-parallel
// outputs after their tp sum), so its values are one device's; an f32 sum whose order differs
// (tp's partial sums, sp's blocks) can round the other way where it lands within an f32 ulp of
// a bf16 rounding midpoint, hence a bound of one bf16 ulp (measured on tiny_hf: 4e-7, no such
// flip), below the distance to f32 activations.
TEST(ShardedLlama, Bf16ActivationsMatchOneDevice) {
  const auto dir = tiny_hf_dir();
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  LlamaForCausalLM<BF16ComputePolicy> m(cfg);
  nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, cfg.vocab_size, 3);
  const Reference ref = reference(m, ids, ids, B, S);
  g_worst = 0;
  for (const auto& d : kMeshes) check_mesh(m, ref, ids, ids, B, S, d, {}, 4e-3);  // one bf16 ulp
  std::printf("  bf16 activations: worst relative error %.3g\n", g_worst);
  // The bound is tighter than the distance to f32 activations (the check can fail).
  auto f32 = models::to_dtype<DefaultPolicy>(m);
  const Reference ref32 = reference(f32, ids, ids, B, S);
  double d32 = 0, mx = 0;
  for (std::size_t i = 0; i < ref.logits.size(); ++i) {
    d32 = std::max(d32, double(std::fabs(ref.logits[i] - ref32.logits[i])));
    mx = std::max(mx, double(std::fabs(ref32.logits[i])));
  }
  EXPECT_GT(d32, 4e-3 * mx) << "f32 activations are farther than the bound";
  // Remat on a mesh recomputes with forward's roundings and collectives: bitwise the gradients
  // of a step that kept everything.
  for (const char* policy : {"nothing_saveable", "save_only_these_names(norm1, ctx)"}) {
    SCOPED_TRACE(policy);
    auto sm = models::shard_model(m, create_mesh(Dims{1, 2, 2, 2}));
    const double loss = sm.loss_and_grads(ids.data(), ids.data(), B, S).loss;
    std::map<std::string, std::vector<float>> kept;
    for (const auto& name : sm.trainable_names()) {
      const auto g = sm.gather_grad(name);
      kept[name].assign(g.begin(), g.end());
    }
    sm.zero_grad();
    sm.set_remat(remat::parse(policy, "test"));
    EXPECT_EQ(sm.loss_and_grads(ids.data(), ids.data(), B, S).loss, loss);
    for (const auto& [name, g] : kept) {
      const auto got = sm.gather_grad(name);
      ASSERT_EQ(got.size(), g.size());
      EXPECT_EQ(0, std::memcmp(got.data(), g.data(), g.size() * sizeof(float))) << name;
    }
  }
}

// Qwen3's per-head q/k norms on a mesh: their weights are replicated while tp splits the heads,
// so each tp rank normalises its own heads and the norms' gradients are summed over tp (and the
// data axes); head_dim 8 != hidden 16 / 4 heads, tied embeddings.
namespace {

/// A fixture's model (tests/data/<family>) on every mesh shape against one device.
void expect_fixture_matches_one_device(const char* family, unsigned seed) {
  SCOPED_TRACE(family);
  const auto dir = tiny_hf_dir().parent_path() / family;
  const auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  LlamaForCausalLM<> m(cfg);
  nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, cfg.vocab_size, seed);
  auto labels = ids;
  labels[6] = -100;
  const Reference ref = reference(m, ids, labels, B, S);
  for (const auto& d : kMeshes) check_mesh(m, ref, ids, labels, B, S, d);
  std::printf("  worst relative error so far: %.3g\n", g_worst);
}

}  // namespace

/// Qwen3's per-head q/k norms.
TEST(ShardedLlama, TinyQwen3FixtureMatchesOneDevice) { expect_fixture_matches_one_device("tiny_qwen3", 5); }

/// Gemma 2 and 3 (sandwich and (1 + w) norms, scaled embeddings, sliding and global layers,
/// Gemma 2's soft-capping).
TEST(ShardedLlama, TinyGemmaFixturesMatchOneDevice) {
  expect_fixture_matches_one_device("tiny_gemma2", 7);
  expect_fixture_matches_one_device("tiny_gemma3", 7);
}

TEST(ShardedLlama, SmallGqaMatchesOneDevice) {
  LlamaForCausalLM<> m(small_gqa_config());
  m.init(Key::from_seed(7), 0.2f);
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, 64, 11);
  auto labels = ids;
  labels[0] = labels[9] = labels[30] = -100;
  const Reference ref = reference(m, ids, labels, B, S);
  for (const auto& d : kMeshes) check_mesh(m, ref, ids, labels, B, S, d);
  std::printf("  worst relative error so far: %.3g\n", g_worst);
}

// Dimensions the mesh does not divide (a vocabulary of 67, hidden 40 over fsdp = 3 or
// fsdp x sp = 6, the vocabulary over tp = 2): shorter last blocks, the same logits, loss and
// gradients as one device; gathering gives the model back bit for bit.
TEST(ShardedLlama, UnevenDimensionsMatchOneDevice) {
  for (const bool tied : {false, true}) {
    LlamaConfig c = small_gqa_config(tied, /*bias=*/!tied);
    c.vocab_size = 67;
    c.hidden_size = 40;
    c.validate();
    LlamaForCausalLM<> m(c);
    m.init(Key::from_seed(17), 0.2f);
    const std::int64_t B = 6, S = 8;
    const auto ids = random_tokens(B * S, c.vocab_size, 13);
    auto labels = ids;
    labels[3] = -100;
    const Reference ref = reference(m, ids, labels, B, S);
    for (const Dims& d : std::vector<Dims>{{1, 3, 1, 1}, {1, 1, 2, 1}, {1, 3, 2, 1}, {1, 3, 1, 2}, {2, 3, 1, 1}}) {
      check_mesh(m, ref, ids, labels, B, S, d);
      auto sm = models::shard_model(m, create_mesh(d));
      EXPECT_FALSE(sm.param("model.embed_tokens.weight").layout().even()) << dims_str(d);
      auto back = models::gather_model(sm);
      test_support::expect_same_params(m, back, dims_str(d));
    }
  }
}

TEST(ShardedLlama, InputsEmbedsMatchOneDevice) {
  // inputs_embeds in place of the ids, with a padding mask, on every mesh shape: the logits,
  // the loss, every parameter's gradient and d loss / d inputs_embeds equal one device's; the
  // embedding table gets no gradient.
  LlamaForCausalLM<> m(small_gqa_config(/*tied=*/false));
  m.init(Key::from_seed(12), 0.2f);
  const std::int64_t B = 4, S = 8, H = m.config().hidden_size, V = m.config().vocab_size;
  const auto labels = random_tokens(B * S, V, 3);
  std::vector<float> embeds(static_cast<std::size_t>(B * S * H));
  for (std::size_t i = 0; i < embeds.size(); ++i) embeds[i] = 0.5f * std::sin(0.37f * static_cast<float>(i));
  std::vector<std::int64_t> mask(static_cast<std::size_t>(B * S), 1);
  mask[0] = mask[1] = 0;  // row 0 padded on the left
  nn::TokenLayout lay{B, S};
  lay.attention_mask = mask.data();
  lay.inputs_embeds = embeds.data();
  std::vector<float> want_logits(static_cast<std::size_t>(B * S * V));
  m.logits(nullptr, lay, want_logits.data());
  nn::zero_grad(m);
  std::vector<float> want_dembeds(embeds.size(), 0.0f);
  lay.inputs_embeds_grad = want_dembeds.data();
  const nn::LossMetrics want = m.forward_backward(nullptr, lay, labels.data());
  std::map<std::string, std::vector<float>> want_grads;
  m.visit_params("", [&](std::string_view p, auto& prm) {
    want_grads[std::string(p)].assign(prm.grad.begin(), prm.grad.end());
  });
  for (const auto& d : kMeshes) {
    SCOPED_TRACE(dims_str(d));
    auto sm = models::shard_model(m, create_mesh(d));
    nn::TokenLayout l = lay;
    l.inputs_embeds_grad = nullptr;
    const auto logits = sm.logits(nullptr, l);
    expect_close(want_logits.data(), logits.data(), want_logits.size(), dims_str(d) + " logits");
    std::vector<float> dembeds(embeds.size(), 1.0f);  // accumulated into: starts at 1
    l.inputs_embeds_grad = dembeds.data();
    const nn::LossMetrics got = sm.loss_and_grads(nullptr, l, labels.data());
    EXPECT_NEAR(got.loss, want.loss, 1e-5 * want.loss);
    for (auto& v : dembeds) v -= 1.0f;
    expect_close(want_dembeds.data(), dembeds.data(), dembeds.size(), dims_str(d) + " d inputs_embeds", 2e-5);
    for (const auto& [name, g] : want_grads) {
      const auto got_g = sm.gather_grad(name);
      if (name == "model.embed_tokens.weight") {
        for (float v : got_g) ASSERT_EQ(v, 0.0f);
        continue;
      }
      expect_close(g.data(), got_g.data(), g.size(), dims_str(d) + " grad " + name, 2e-5);
    }
  }
  auto sm = models::shard_model(m, create_mesh({1, 2, 1, 1}));
  nn::TokenLayout neither{B, S};
  EXPECT_THROW(sm.loss(nullptr, neither, labels.data()), Error);  // needs ids or inputs_embeds
  EXPECT_THROW(sm.loss(nullptr, lay), Error);                     // embeddings without ids need labels
}

TEST(ShardedLlama, TiedEmbeddingsAndBiasesMatchOneDevice) {
  LlamaForCausalLM<> m(small_gqa_config(/*tied=*/true, /*bias=*/true));
  m.init(Key::from_seed(8), 0.2f);
  // Non-zero biases, so that a bias added once per tp rank would show.
  m.visit_params("", [](std::string_view path, auto& p) {
    if (std::string(path).ends_with("bias"))
      for (std::size_t i = 0; i < p.value.size(); ++i) p.value.data()[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  });
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, 64, 12);
  const Reference ref = reference(m, ids, ids, B, S);
  for (const auto& d : std::vector<Dims>{{2, 1, 2, 1}, {1, 2, 2, 2}}) check_mesh(m, ref, ids, ids, B, S, d);
}

TEST(ShardedLlama, SlidingWindowAndLossOptionsMatchOneDevice) {
  auto cfg = small_gqa_config();
  cfg.model_type = "mistral";
  cfg.sliding_window = 3;  // windows cross the sp boundaries
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(15), 0.2f);
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, 64, 16);
  auto labels = ids;
  labels[8] = labels[12] = -100;
  nn::LossOptions opt;
  opt.z_loss = 1e-3f;
  opt.label_smoothing = 0.1f;
  opt.chunk_rows = 3;
  const Reference ref = reference(m, ids, labels, B, S, opt);
  for (const auto& d : std::vector<Dims>{{2, 1, 1, 2}, {1, 1, 2, 4}}) check_mesh(m, ref, ids, labels, B, S, d, opt);
}

namespace {

/// A left-padded batch (row b has b + 1 pad tokens: mask 0, label -100, positions from 0 after
/// them) on meshes against one device: logits, loss and every gradient.
template <std::size_t N>
void expect_left_padded_batch_matches(LlamaForCausalLM<>& m, const std::vector<std::array<std::int64_t, N>>& meshes) {
  const std::int64_t B = 4, S = 8, V = m.config().vocab_size;
  const auto ids = random_tokens(B * S, V, 18);
  std::vector<std::int64_t> mask(B * S, 1), pos(B * S), labels = ids;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) {
      const bool pad = s <= b;
      mask[b * S + s] = pad ? 0 : 1;
      pos[b * S + s] = pad ? 0 : s - b - 1;
      if (pad) labels[b * S + s] = -100;
    }
  nn::TokenLayout lay{B, S, pos.data(), mask.data()};
  std::vector<float> ref_logits(static_cast<std::size_t>(B * S * V));
  m.logits(ids.data(), lay, ref_logits.data());
  nn::zero_grad(m);
  const auto ref_m = m.forward_backward(ids.data(), lay, labels.data());
  for (const auto& d : meshes) {
    SCOPED_TRACE(dims_str(d));
    auto sm = models::shard_model(m, create_mesh(d));
    const auto lg = sm.logits(ids.data(), B, S, mask.data(), pos.data());
    expect_close(ref_logits.data(), lg.data(), lg.size(), "masked logits");
    const auto got = sm.loss_and_grads(ids.data(), labels.data(), B, S, {}, mask.data(), pos.data());
    EXPECT_EQ(got.tokens, ref_m.tokens);
    EXPECT_NEAR(got.loss, ref_m.loss, 1e-5 * ref_m.loss);
    m.visit_params("", [&](std::string_view path, auto& p) {
      const auto g = sm.gather_grad(std::string(path));
      expect_close(p.grad.data(), g.data(), g.size(), "masked grad " + std::string(path));
    });
  }
}

}  // namespace

TEST(ShardedLlama, PaddingMaskAndPositionIdsMatchOneDevice) {
  LlamaForCausalLM<> m(small_gqa_config());
  m.init(Key::from_seed(17), 0.2f);
  expect_left_padded_batch_matches(m, std::vector<Dims>{{2, 1, 2, 1}, {1, 2, 1, 2}, {1, 1, 2, 4}});
}

/// Rope scalings that read the forward's length (dynamic, longrope) see the whole batch's on every
/// device: with left padding the rows' largest positions differ (6 in row 0, 3 in row 3), and a
/// threshold of 6 positions puts row 0's batch past it while rows 2 and 3 alone would not be.
TEST(ShardedLlama, LengthDependentRopeScalingsMatchOneDevice) {
  for (const char* kind : {"dynamic", "longrope"}) {
    SCOPED_TRACE(kind);
    LlamaConfig c = small_gqa_config();
    models::RopeScaling r;
    r.rope_type = kind;
    r.factor = 2.0;
    if (std::string(kind) == "dynamic") {
      c.max_position_embeddings = 6;
    } else {
      r.has_original_max = true;
      r.original_max_position_embeddings = 6;
      r.short_factor = {1.0, 1.5, 2.0, 3.0};
      r.long_factor = {1.0, 3.0, 7.0, 11.0};
    }
    c.rope_scaling = r;
    c.validate();
    LlamaForCausalLM<> m(c);
    m.init(Key::from_seed(17), 0.2f);
    expect_left_padded_batch_matches(m, std::vector<Dims>{{2, 1, 1, 1}, {1, 2, 2, 1}, {1, 1, 1, 2}});
  }
}

TEST(ShardedLlama, RepeatedRunsAreBitIdentical) {
  LlamaForCausalLM<> m(small_gqa_config());
  m.init(Key::from_seed(19), 0.2f);
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, 64, 20);
  std::map<std::string, xt::xarray<float>> first;
  double first_loss = 0;
  for (int run = 0; run < 2; ++run) {
    auto sm = models::shard_model(m, create_mesh({2, 1, 2, 2}));
    const double loss = sm.loss_and_grads(ids.data(), nullptr, B, S).loss;
    auto grads = sm.gather_grads();
    if (run == 0) {
      first = std::move(grads);
      first_loss = loss;
      continue;
    }
    EXPECT_EQ(loss, first_loss);
    for (const auto& [name, g] : grads) EXPECT_TRUE(g == first.at(name)) << name;
  }
}

// Remat on meshes, every policy: nothing_saveable runs each layer again (its collectives too)
// before its backward; a finer mask frees what it names and recomputes it (norm1 with its
// gather over sp, attn_out with its sum over tp). The loss and every gradient are bitwise those
// of the step that keeps its activations, on tp, sp, dp and fsdp meshes, with biases and tied
// embeddings, Gemma's sandwich norms and experts on an ep axis.
TEST(ShardedLlama, RematGivesBitIdenticalGradients) {
  struct Case { LlamaConfig cfg; std::vector<MeshDims> meshes; unsigned seed; };
  const auto fixture = [](const char* family) {
    return LlamaConfig::from_file((tiny_hf_dir().parent_path() / family / "config.json").string());
  };
  const std::vector<Case> cases = {
      {small_gqa_config(),
       {mesh_dims_without_ep({1, 2, 1, 1}), mesh_dims_without_ep({2, 1, 2, 2}), mesh_dims_without_ep({1, 2, 2, 1}),
        mesh_dims_without_ep({1, 1, 1, 4})},
       23},
      {small_gqa_config(true, true), {mesh_dims_without_ep({1, 1, 2, 2})}, 5},
      {fixture("tiny_gemma3"), {mesh_dims_without_ep({1, 1, 2, 2})}, 6},
      {fixture("tiny_mixtral"), {MeshDims{1, 1, 2, 1, 2}}, 7}};
  const char* policies[] = {"nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                            "save_only_these_names(ctx, gate)", "save_anything_except_these_names(norm1, attn_out)",
                            "save_only_these_names(norm1, norm2, act)"};
  const std::int64_t B = 4, S = 8;
  for (const auto& c : cases) {
    LlamaForCausalLM<> m(c.cfg);
    m.init(Key::from_seed(c.seed), 0.2f);
    const auto ids = random_tokens(B * S, c.cfg.vocab_size, c.seed + 1);
    for (const auto& d : c.meshes) {
      SCOPED_TRACE(c.cfg.model_type + " on " + dims_str(d));
      auto keep = models::shard_model(m, create_mesh(d));
      EXPECT_FALSE(keep.remat());
      const auto a = keep.loss_and_grads(ids.data(), nullptr, B, S);
      const auto ga = keep.gather_grads();
      for (const char* policy : policies) {
        SCOPED_TRACE(policy);
        auto remat = models::shard_model(m, create_mesh(d));
        remat.set_remat(remat::parse(policy));
        EXPECT_EQ(remat.remat_mask(), remat::parse(policy));
        const auto b = remat.loss_and_grads(ids.data(), nullptr, B, S);
        EXPECT_EQ(a.loss, b.loss);
        const auto gb = remat.gather_grads();
        for (const auto& [name, g] : ga) EXPECT_TRUE(g == gb.at(name)) << name;
      }
    }
  }
}

TEST(ShardedLlama, GradientsAccumulateAndZero) {
  LlamaForCausalLM<> m(small_gqa_config());
  m.init(Key::from_seed(9), 0.2f);
  const std::int64_t B = 2, S = 4;
  const auto ids = random_tokens(B * S, 64, 13);
  auto sm = models::shard_model(m, create_mesh({1, 2, 1, 1}));
  sm.loss_and_grads(ids.data(), nullptr, B, S);
  const auto once = sm.gather_grad("model.layers.1.mlp.down_proj.weight");
  sm.loss_and_grads(ids.data(), nullptr, B, S);
  const auto twice = sm.gather_grad("model.layers.1.mlp.down_proj.weight");
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice.data()[i], 2 * once.data()[i]);
  sm.zero_grad();
  const auto zero = sm.gather_grad("model.layers.1.mlp.down_proj.weight");
  EXPECT_TRUE(std::all_of(zero.begin(), zero.end(), [](float v) { return v == 0.0f; }));
}

TEST(ShardedLlama, ShardThenGatherIsBitExact) {
  LlamaForCausalLM<> m(small_gqa_config());
  m.init(Key::from_seed(4));
  auto sm = models::shard_model(m, create_mesh({1, 2, 2, 2}));
  auto back = models::gather_model(sm);
  std::map<std::string, std::vector<float>> orig;
  m.visit_params("", [&](std::string_view path, auto& p) { orig[std::string(path)].assign(p.value.begin(), p.value.end()); });
  std::size_t count = 0;
  back.visit_params("", [&](std::string_view path, auto& p) {
    const auto& o = orig.at(std::string(path));
    ASSERT_EQ(o.size(), p.value.size());
    EXPECT_TRUE(std::equal(o.begin(), o.end(), p.value.begin())) << path;
    ++count;
  });
  EXPECT_EQ(count, orig.size());
}

using test_support::expect_same_params;

TEST(ShardedLlama, InitStraightIntoShardsEqualsTheOneDeviceInit) {
  // The blocks are drawn where they live (no whole model is built), from the counters of the
  // one-device init: tp, fsdp, sp and dp meshes, tied embeddings with biases, experts on ep
  // ranks and bf16 storage all give the one-device model back.
  struct Case { LlamaConfig cfg; MeshDims dims; };
  auto moe = LlamaConfig::from_file((tiny_hf_dir().parent_path() / "tiny_mixtral" / "config.json").string());
  const std::vector<Case> cases = {{small_gqa_config(), {1, 2, 1, 2, 2}},
                                   {small_gqa_config(), {2, 2, 1, 1, 1}},
                                   {small_gqa_config(true, true), {1, 1, 1, 2, 1}},
                                   {moe, {1, 2, 2, 1, 1}}};
  for (const auto& c : cases) {
    const std::string where = dims_str(c.dims) + (c.cfg.is_moe() ? " moe" : "");
    LlamaForCausalLM<> one(c.cfg);
    one.init(Key::from_seed(9));
    models::ShardedLlama<> sm(c.cfg, Key::from_seed(9), create_mesh(c.dims));
    auto back = sm.gather_model();
    expect_same_params(one, back, where);
  }
  LlamaForCausalLM<BF16ParamsPolicy> one(small_gqa_config());
  one.init(Key::from_seed(2));
  models::ShardedLlama<BF16ParamsPolicy> sm(small_gqa_config(), Key::from_seed(2), create_mesh({1, 2, 2, 1}));
  auto back = sm.gather_model();
  expect_same_params(one, back, "bf16");
}

TEST(ShardedLlama, AdaptersAddedToTheBlocksEqualThoseOfTheOneDeviceModel) {
  // add_adapters on a model drawn straight into its blocks gives the adapters lora::apply_lora
  // gives the one-device model (targets, A's draws, B = 0, frozen base), so training them on
  // the mesh starts where one device starts: parameters, trainable names and gradients.
  lora::LoraConfig lc;
  lc.r = 4;
  lc.lora_alpha = 8;
  lc.target_modules = {"q_proj", "v_proj", "down_proj"};
  lc.seed = 13;
  LlamaForCausalLM<> one(small_gqa_config());
  one.init(Key::from_seed(9));
  lora::apply_lora(one, lc);
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, 64, 5);
  for (const MeshDims& d : {MeshDims{1, 2, 1, 2, 1}, MeshDims{2, 1, 1, 2, 1}}) {
    SCOPED_TRACE(dims_str(d));
    models::ShardedLlama<> direct(small_gqa_config(), Key::from_seed(9), create_mesh(d));
    direct.add_adapters(lc);
    auto from_host = models::shard_model(one, create_mesh(d));
    EXPECT_EQ(direct.names(), from_host.names());
    EXPECT_EQ(direct.trainable_names(), from_host.trainable_names());
    auto back = direct.gather_model();
    expect_same_params(one, back, dims_str(d));
    direct.loss_and_grads(ids.data(), nullptr, B, S);
    from_host.loss_and_grads(ids.data(), nullptr, B, S);
    for (const auto& n : direct.trainable_names()) EXPECT_EQ(direct.gather_grad(n), from_host.gather_grad(n)) << n;
    // The adapters alone, gathered: the one-device adapters bit for bit.
    auto adapters = direct.gather_adapters();
    std::vector<float> a, b;
    for (const auto& t : lora::split_lora_params(one)) a.insert(a.end(), t.values.begin(), t.values.end());
    for (const auto& t : lora::split_lora_params(adapters)) b.insert(b.end(), t.values.begin(), t.values.end());
    EXPECT_EQ(a, b);
    EXPECT_THROW(direct.add_adapters(lc), Error);  // once
  }
  models::ShardedLlama<> bare(small_gqa_config(), Key::from_seed(9), create_mesh({1, 2, 1, 1}));
  EXPECT_THROW(bare.gather_adapters(), Error);
  lc.target_modules = {"no_such_proj"};
  EXPECT_THROW(bare.add_adapters(lc), Error);  // apply_lora's own check, naming the module
}

TEST(ShardedLlama, FsdpHoldsAQuarterOfTheParametersPerDevice) {
  const auto cfg = small_gqa_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(5));
  auto mesh = create_mesh({1, 4, 1, 1});
  std::vector<std::int64_t> before(4);
  for (std::int64_t d = 0; d < 4; ++d) before[static_cast<std::size_t>(d)] = mesh.memory().live(d);
  const std::int64_t total = m.param_count() * static_cast<std::int64_t>(sizeof(float));
  std::int64_t norms = 0;
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (p.value.dimension() == 1) norms += p.numel() * static_cast<std::int64_t>(sizeof(float));
  });
  {
    auto sm = models::shard_model(m, mesh);
    for (std::int64_t d = 0; d < 4; ++d) {
      const std::int64_t held = mesh.memory().live(d) - before[static_cast<std::size_t>(d)];
      EXPECT_EQ(held, sm.param_bytes(d));
      EXPECT_EQ(held, (total - norms) / 4 + norms) << "device " << d;  // matrices split 4 ways, norms replicated
      EXPECT_LT(static_cast<double>(held), 0.27 * static_cast<double>(total));
    }
    // A training step adds the gradient blocks (same layout); transient gathers are released.
    const std::int64_t B = 4, S = 4;
    const auto ids = random_tokens(B * S, cfg.vocab_size, 1);
    sm.loss_and_grads(ids.data(), nullptr, B, S);
    for (std::int64_t d = 0; d < 4; ++d)
      EXPECT_EQ(mesh.memory().live(d) - before[static_cast<std::size_t>(d)], 2 * sm.param_bytes(d));
  }
  for (std::int64_t d = 0; d < 4; ++d) EXPECT_EQ(mesh.memory().live(d), before[static_cast<std::size_t>(d)]);
}

TEST(ShardedLlama, ClearErrors) {
  LlamaForCausalLM<> m(small_gqa_config());
  m.init(Key::from_seed(6));
  auto sm = models::shard_model(m, create_mesh({2, 1, 1, 1}));
  const auto ids = random_tokens(3 * 4, 64, 2);
  try {
    sm.loss_and_grads(ids.data(), nullptr, 3, 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::not_divisible);
    EXPECT_NE(std::string(e.what()).find("batch 3 is not divisible by dp * fsdp"), std::string::npos) << e.what();
  }
  auto sp = models::shard_model(m, create_mesh({1, 1, 1, 2}));
  EXPECT_THROW(sp.logits(ids.data(), 4, 3), Error);  // seq 3 over sp = 2
  // tp larger than the kv heads: named in the error.
  try {
    models::shard_model(m, create_mesh({1, 1, 4, 1}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
  }
}

/// The gradients run_on_mesh left in the model's Param::grad, by name.
static std::map<std::string, std::vector<float>> model_grads(LlamaForCausalLM<>& m) {
  std::map<std::string, std::vector<float>> g;
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (p.has_grad()) g[std::string(path)].assign(p.grad.begin(), p.grad.end());
  });
  return g;
}

TEST(ShardedLlama, RunOnMeshMatchesOneDevice) {
  LlamaForCausalLM<> m(small_gqa_config());
  m.init(Key::from_seed(10), 0.2f);
  const std::int64_t B = 2, S = 4, V = m.config().vocab_size;
  const auto ids = random_tokens(B * S, 64, 14);
  models::MeshRun r;
  r.ids = ids.data();
  r.layout = nn::TokenLayout{B, S};

  // One device is the model itself, bit for bit.
  r.op = models::MeshOp::logits;
  std::vector<float> direct(static_cast<std::size_t>(B * S * V)), one(direct.size()), two(direct.size());
  m.logits(ids.data(), r.layout, direct.data());
  r.logits_out = one.data();
  models::run_on_mesh(m, create_mesh({1, 1, 1, 1}), r);
  EXPECT_EQ(direct, one);
  r.logits_out = two.data();
  models::run_on_mesh(m, create_mesh({2, 1, 1, 1}), r);
  expect_close(one.data(), two.data(), one.size(), "logits");

  // Loss and gradients land in the model's Param::grad on every mesh; remat changes nothing.
  r.op = models::MeshOp::loss_and_grads;
  const auto l1 = models::run_on_mesh(m, create_mesh({1, 1, 1, 1}), r);
  const auto g1 = model_grads(m);
  EXPECT_EQ(models::run_on_mesh(m, create_mesh({1, 1, 1, 1}), r).loss, l1.loss);  // zeroed, not accumulated
  EXPECT_EQ(model_grads(m), g1);
  for (const char* remat : {"", "nothing_saveable", "dots_saveable"}) {
    r.remat = remat;
    const auto l2 = models::run_on_mesh(m, create_mesh({1, 1, 2, 1}), r);
    EXPECT_NEAR(l1.loss, l2.loss, 1e-5 * l1.loss) << remat;
    const auto g2 = model_grads(m);
    ASSERT_EQ(g1.size(), g2.size());
    for (const auto& [name, g] : g1) expect_close(g.data(), g2.at(name).data(), g.size(), name);
  }
  r.op = models::MeshOp::loss;
  EXPECT_NEAR(models::run_on_mesh(m, create_mesh({1, 2, 1, 1}), r).loss, l1.loss, 1e-5 * l1.loss);

  // A policy that does not parse is refused by name.
  r.op = models::MeshOp::loss_and_grads;
  r.remat = "dots";
  EXPECT_THROW(models::run_on_mesh(m, create_mesh({1, 1, 2, 1}), r), Error);
  r.remat = {};
  r.op = models::MeshOp::loss;
  // A padding mask goes to the mesh with the batch: the loss one device gives with it.
  std::vector<std::int64_t> mask(ids.size(), 1);
  mask[0] = mask[1] = 0;
  r.layout.attention_mask = mask.data();
  const double masked = models::run_on_mesh(m, create_mesh({1, 1, 1, 1}), r).loss;
  EXPECT_NEAR(models::run_on_mesh(m, create_mesh({1, 1, 2, 1}), r).loss, masked, 1e-5 * masked);
  r.layout.attention_mask = nullptr;
  r.op = models::MeshOp::logits;
  r.logits_out = nullptr;
  EXPECT_THROW(models::run_on_mesh(m, create_mesh({1, 1, 1, 1}), r), Error);
}

// The forward traffic of docs/parallelism.md's tables, as the simulated backend counts it
// (ring costs: all_gather (n-1)/n of the output, psum 2(n-1)/n of the buffer).
TEST(ShardedLlama, ForwardTrafficMatchesTheDocumentedTable) {
  const auto cfg = small_gqa_config();
  LlamaForCausalLM<> m(cfg);
  m.init(Key::from_seed(21));
  const std::int64_t B = 2, S = 4, H = cfg.hidden_size, V = cfg.vocab_size, F = cfg.intermediate_size;
  const std::int64_t D = cfg.head_size(), nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const std::int64_t L = cfg.num_hidden_layers, f4 = 4;
  const auto ids = random_tokens(B * S, V, 22);
  auto traffic = [&](const Dims& d) {
    auto mesh = create_mesh(d);
    auto sm = models::shard_model(m, mesh);
    auto& be = dynamic_cast<SimulatedBackend&>(mesh.backend());
    be.reset_traffic();
    (void)sm.logits(ids.data(), B, S);
    return be.traffic();
  };
  {  // tp = 2: embedding and lm_head gathered over tp, two psums of [Tl, H] per layer.
    const auto t = traffic({1, 1, 2, 1});
    const std::int64_t Tl = B * S, W = 2 * V * H * f4 / 2 + L * 2 * (Tl * H * f4);
    ASSERT_EQ(t.count("tp"), 1u);
    for (auto v : t.at("tp")) EXPECT_EQ(v, W);
    EXPECT_EQ(t.size(), 1u);
  }
  {  // fsdp = 2: every matrix gathered once per layer; embedding and lm_head once.
    const auto t = traffic({1, 2, 1, 1});
    const std::int64_t W = (2 * nh * D * H + 2 * nkv * D * H + 3 * H * F) * f4;
    ASSERT_EQ(t.count("fsdp"), 1u);
    for (auto v : t.at("fsdp")) EXPECT_EQ(v, L * W / 2 + 2 * V * H * f4 / 2);
    EXPECT_EQ(t.size(), 1u);
  }
}

// LoRA on a mesh: lora_A / lora_B shard with their base (B with a column-parallel base's output
// rows, A with a row-parallel base's input columns), only they get gradients (summed over tp
// where a rank holds a share), and dropout draws each element's mask from its place in the
// whole batch, so logits, loss and the adapters' gradients equal one device's on every mesh.
TEST(ShardedLlama, LoraAdaptersWithDropoutMatchOneDevice) {
  LlamaForCausalLM<> m(small_gqa_config(/*tied=*/false, /*bias=*/true));
  m.init(Key::from_seed(31), 0.2f);
  lora::LoraConfig lc;
  lc.r = 4;
  lc.lora_alpha = 8;
  lc.lora_dropout = 0.25f;
  lc.target_modules = {"all-linear"};
  ASSERT_EQ(lora::apply_lora(m, lc), 14);
  std::uint64_t k = 0;  // non-zero B, so every adapter term and gradient shows
  m.visit_params("", [&](std::string_view name, auto& p) {
    if (name.ends_with("lora_B.weight"))
      for (std::int64_t i = 0; i < p.numel(); ++i) p.data()[i] = 0.02f * static_cast<float>((k++ * 37) % 11) - 0.1f;
  });
  const Key drop = Key::from_seed(77);
  lora::set_dropout(m, drop);
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, 64, 32);
  auto labels = ids;
  labels[3] = labels[20] = -100;
  const Reference ref = reference(m, ids, labels, B, S);
  ASSERT_EQ(ref.grads.size(), 28u);  // the adapters alone
  {  // dropout changes the logits, so a mask drawn at the wrong (row, column) would show
    lora::set_dropout(m, std::nullopt);
    std::vector<float> undropped(ref.logits.size());
    m.logits(ids.data(), nn::TokenLayout{B, S}, undropped.data());
    EXPECT_NE(undropped, ref.logits);
    lora::set_dropout(m, drop);
  }
  for (const auto& d : kMeshes) {
    SCOPED_TRACE(dims_str(d));
    auto mesh = create_mesh(d);
    auto sm = models::shard_model(m, mesh);
    ASSERT_TRUE(sm.has_adapters());
    sm.set_adapter_dropout(drop);
    const auto logits = sm.logits(ids.data(), B, S);
    expect_close(ref.logits.data(), logits.data(), logits.size(), dims_str(d) + " logits");
    const auto metrics = sm.loss_and_grads(ids.data(), labels.data(), B, S);
    EXPECT_NEAR(metrics.loss, ref.metrics.loss, 1e-5 * ref.metrics.loss);
    ASSERT_EQ(sm.trainable_names().size(), ref.grads.size());
    for (const auto& [name, g] : ref.grads) {
      const auto got = sm.gather_grad(name);
      ASSERT_EQ(got.size(), g.size()) << name;
      expect_close(g.data(), got.data(), g.size(), dims_str(d) + " grad " + name, 2e-5);
    }
    EXPECT_THROW(sm.grad("model.layers.0.mlp.up_proj.weight"), Error);  // the base is frozen
    // Gathered back: the same adapters and base, bit for bit.
    auto back = sm.gather_model();
    ASSERT_TRUE(lora::lora_is_enabled(back));
    std::vector<float> a, b;
    const auto bits = [](auto& model, std::vector<float>& out) {
      model.visit_params("", [&](std::string_view, auto& p) { out.insert(out.end(), p.data(), p.data() + p.numel()); });
    };
    bits(m, a);
    bits(back, b);
    EXPECT_EQ(a, b);
  }
  // Switched off, the adapters leave the base's logits.
  auto sm = models::shard_model(m, create_mesh({1, 1, 2, 1}));
  sm.set_adapters_active(false);
  auto base = m;
  lora::unwrap_lora(base);
  std::vector<float> want(static_cast<std::size_t>(B * S * 64));
  base.logits(ids.data(), nn::TokenLayout{B, S}, want.data());
  const auto got = sm.logits(ids.data(), B, S);
  expect_close(want.data(), got.data(), want.size(), "adapters off");
}

// Mixture-of-experts models on meshes: experts placed on their ep rank, token rows exchanged by
// all_to_all, the router losses over the whole batch. Mixtral; Qwen2-MoE (a shared expert, a
// dense layer among sparse ones, weights not renormalised); Qwen3-MoE. Logits, loss with the
// load-balancing and z losses, and every gradient equal one device to f32 rounding.
TEST(ShardedLlama, MixtureOfExpertsOnExpertParallelMeshesMatchesOneDevice) {
  const std::vector<MeshDims> meshes = {{1, 1, 2, 1, 1}, {1, 1, 4, 1, 1}, {2, 1, 2, 1, 1}, {1, 2, 2, 1, 1},
                                        {1, 1, 2, 1, 2}, {1, 2, 1, 1, 1}, {2, 1, 1, 1, 2}};
  for (const char* family : {"tiny_mixtral", "tiny_qwen2_moe", "tiny_qwen3_moe"}) {
    SCOPED_TRACE(family);
    const auto dir = tiny_hf_dir().parent_path() / family;
    auto cfg = LlamaConfig::from_file((dir / "config.json").string());
    cfg.router_z_loss_coef = 0.001;  // the z-loss too
    LlamaForCausalLM<> m(cfg);
    nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
    const std::int64_t B = 8, S = 8;
    const auto ids = random_tokens(B * S, cfg.vocab_size, 21);
    auto labels = ids;
    labels[9] = -100;
    const Reference ref = reference(m, ids, labels, B, S);
    ASSERT_GT(ref.metrics.aux_loss, 0.0);
    for (const auto& d : meshes) check_mesh(m, ref, ids, labels, B, S, d);

    // Each ep rank holds its experts only; gathering gives the model back bit for bit.
    auto sm = models::shard_model(m, create_mesh({1, 1, 2, 1, 1}));
    const std::string e0 = std::string("model.layers.0.") +
                           (cfg.model_type == "mixtral" ? "block_sparse_moe.experts.0.w1.weight" : "mlp.experts.0.gate_proj.weight");
    const std::string e3 = std::string(e0).replace(e0.find("experts.0"), 9, "experts.3");
    EXPECT_GT(sm.param(e0).local(0).size(), 0u);
    EXPECT_EQ(sm.param(e0).local(1).size(), 0u);
    EXPECT_EQ(sm.param(e3).local(0).size(), 0u);
    EXPECT_GT(sm.param(e3).local(1).size(), 0u);
    EXPECT_LT(sm.param_bytes(0), m.param_count() * static_cast<std::int64_t>(sizeof(float)));
    EXPECT_EQ(sm.param_bytes(0), sm.param_bytes(1));
    auto back = sm.gather_model();
    m.visit_params("", [&](std::string_view path, auto& p) {
      bool same = true;
      back.visit_params("", [&](std::string_view q, auto& b) {
        if (q == path) same = std::equal(p.value.begin(), p.value.end(), b.value.begin());
      });
      EXPECT_TRUE(same) << path;
    });
  }
  std::printf("  worst relative error so far: %.3g\n", g_worst);
}

TEST(ShardedLlama, MixtureOfExpertsPaddingMaskMatchesOneDevice) {
  const auto dir = tiny_hf_dir().parent_path() / "tiny_mixtral";
  LlamaForCausalLM<> m(LlamaConfig::from_file((dir / "config.json").string()));
  nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
  // The padding mask excludes tokens from the load-balancing loss on every device.
  expect_left_padded_batch_matches(m, std::vector<MeshDims>{{1, 1, 2, 1, 1}, {1, 2, 2, 1, 1}, {1, 1, 2, 1, 2}});
}

TEST(ShardedLlama, MixtureOfExpertsMeshErrorsAreClear) {
  const auto dir = tiny_hf_dir().parent_path() / "tiny_mixtral";
  LlamaForCausalLM<> m(LlamaConfig::from_file((dir / "config.json").string()));
  try {
    models::shard_model(m, create_mesh({1, 1, 1, 2, 1}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("not over tp"), std::string::npos) << e.what();
  }
  try {
    models::shard_model(m, create_mesh({1, 1, 8, 1, 1}));  // 4 experts
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::not_divisible);
    EXPECT_NE(std::string(e.what()).find("num_local_experts (4) is not divisible by ep = 8"), std::string::npos)
        << e.what();
  }
}

// Router jitter on meshes: each device draws its tokens' factors from their places in the whole
// batch, so the jittered loss and gradients equal one device's (f32 rounding); the jitter is
// really applied (the loss moves when it is on).
TEST(ShardedLlama, MixtureOfExpertsRouterJitterMatchesOneDevice) {
  const auto dir = tiny_hf_dir().parent_path() / "tiny_mixtral";
  auto cfg = LlamaConfig::from_file((dir / "config.json").string());
  cfg.router_jitter_noise = 0.2;
  LlamaForCausalLM<> m(cfg);
  nn::load_params(m, io::SafeTensorsFile::open((dir / "model.safetensors").string()));
  const std::int64_t B = 4, S = 8;
  const auto ids = random_tokens(B * S, cfg.vocab_size, 23);
  const Reference plain = reference(m, ids, ids, B, S);
  const Key key = Key::from_seed(17);
  m.set_router_jitter(key);
  const Reference ref = reference(m, ids, ids, B, S);
  EXPECT_GT(std::abs(ref.metrics.loss - plain.metrics.loss), 1e-6);
  for (const MeshDims& d : {MeshDims{1, 1, 2, 1, 1}, MeshDims{1, 2, 2, 1, 1}, MeshDims{2, 1, 1, 1, 2}, MeshDims{1, 1, 4, 1, 1}}) {
    SCOPED_TRACE(dims_str(d));
    auto sm = models::shard_model(m, create_mesh(d));
    sm.set_router_jitter(key);
    const auto got = sm.loss_and_grads(ids.data(), ids.data(), B, S);
    EXPECT_NEAR(got.loss, ref.metrics.loss, 1e-5 * std::abs(ref.metrics.loss));
    for (const auto& [name, g] : ref.grads) {
      const auto mine = sm.gather_grad(name);
      expect_close(g.data(), mine.data(), g.size(), "jittered grad " + name);
    }
  }
}
