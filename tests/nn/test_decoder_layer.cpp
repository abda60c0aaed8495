#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include <edl/models/llama/llama.hpp>
#include <edl/nn/decoder_layer.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

TEST(NnDecoderLayer, BackwardMatchesFiniteDifferences) {
  nn::DecoderLayerConfig cfg;
  cfg.attention = {.hidden = 16, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .qkv_bias = false, .o_bias = false, .sliding_window = {}, .rope = {}};
  cfg.intermediate = 24;
  cfg.rms_norm_eps = 1e-5;
  nn::DecoderLayer<DefaultPolicy> layer(cfg);
  layer.init(Key::from_seed(4), 0.3f);
  fill_randn(layer.input_layernorm.weight.data(), 16, 8, 1.0f);
  const std::int64_t B = 2, S = 5, T = B * S, H = 16;
  nn::TokenLayout lay{B, S};
  auto x = randn(T * H, 1);
  auto c = randn(T * H, 2);
  std::vector<float> y(T * H), dx(T * H);
  nn::DecoderLayer<DefaultPolicy>::Saved s;
  layer.forward(x.data(), lay, y.data(), s);
  layer.backward(c.data(), s, dx.data());
  auto loss = [&] {
    std::vector<float> yy(T * H);
    layer.apply(x.data(), lay, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd("dx", x.data(), x.size(), dx.data(), loss, 40);
  std::vector<std::string> names;
  layer.visit_params("model.layers.3", [&](std::string_view path, auto& p) {
    names.emplace_back(path);
    expect_fd(std::string(path), p.data(), p.value.size(), p.grad.data(), loss, 12);
  });
  EXPECT_EQ(names.front(), "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(names[1], "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(names.back(), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(names.size(), 9u);
}

// ---- Gradient checkpointing (remat policies): same values, fewer activations kept ----

namespace {

nn::DecoderLayerConfig remat_layer_config(bool qk_norm = false) {
  nn::DecoderLayerConfig cfg;
  cfg.attention = {.hidden = 16, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .qkv_bias = true, .o_bias = false, .sliding_window = {}, .rope = {}};
  cfg.attention.qk_norm = qk_norm;
  cfg.attention.qk_norm_eps = 1e-5;
  cfg.intermediate = 24;
  cfg.rms_norm_eps = 1e-5;
  return cfg;
}

struct LayerRun {
  std::vector<float> y, dx, dx_again;
  std::vector<std::vector<float>> grads;
};

// Forward and backward of one GQA layer with a padding mask under policy R (the compile-time
// slot), then a second backward on the same Saved: it must be left as forward left it.
template <class R>
LayerRun run_layer(std::vector<std::uint32_t>* dropped = nullptr, bool qk_norm = false) {
  using Pol = with_remat<DefaultPolicy, R>;
  nn::DecoderLayer<Pol> layer(remat_layer_config(qk_norm));
  layer.init(Key::from_seed(4), 0.3f);
  if (qk_norm) {
    fill_randn(layer.self_attn.q_norm.weight.data(), 4, 5, 0.3f);
    fill_randn(layer.self_attn.k_norm.weight.data(), 4, 6, 0.3f);
  }
  const std::int64_t B = 2, S = 6, T = B * S, H = 16;
  const std::vector<std::int64_t> mask = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};  // left and right padding
  nn::TokenLayout lay{B, S, nullptr, mask.data()};
  const auto x = randn(T * H, 1);
  const auto c = randn(T * H, 2);
  LayerRun r;
  r.y.resize(T * H);
  r.dx.resize(T * H);
  r.dx_again.resize(T * H);
  typename nn::DecoderLayer<Pol>::Saved s;
  layer.forward(x.data(), lay, r.y.data(), s);
  if (dropped) dropped->push_back(s.dropped);
  layer.backward(c.data(), s, r.dx.data());
  layer.visit_params("", [&](std::string_view, auto& p) { r.grads.emplace_back(p.grad.begin(), p.grad.end()); });
  layer.backward(c.data(), s, r.dx_again.data());
  return r;
}

}  // namespace

TEST(NnDecoderLayer, RematPoliciesKeepWhatTheyName) {
  using L = nn::DecoderLayer<DefaultPolicy>;
  EXPECT_EQ(L::dropped_by<remat::everything_saveable>(), 0u);
  EXPECT_EQ(L::dropped_by<remat::nothing_saveable>(), 0x3ffu);
  // dots: q, k, v, ctx, attn_out, gate, up kept; norm1, norm2, act dropped.
  EXPECT_EQ(L::dropped_by<remat::dots_saveable>(), (1u << 0) | (1u << 6) | (1u << 9));
  // no batch dims: ctx (p.v, batched over heads) dropped too.
  EXPECT_EQ(L::dropped_by<remat::dots_with_no_batch_dims_saveable>(), (1u << 0) | (1u << 4) | (1u << 6) | (1u << 9));
  EXPECT_EQ((L::dropped_by<remat::save_only_these_names<"attn_out", "gate", "up">>()), 0x3ffu & ~((1u << 5) | (1u << 7) | (1u << 8)));
  // The union keeps what either keeps: dropped only what both drop.
  using both = remat::save_from_both_policies<remat::dots_with_no_batch_dims_saveable,
                                              remat::save_only_these_names<"norm1", "act">>;
  using names = remat::save_only_these_names<"norm1", "act">;
  EXPECT_EQ(L::dropped_by<both>(), L::dropped_by<remat::dots_with_no_batch_dims_saveable>() & L::dropped_by<names>());
  EXPECT_EQ(L::dropped_by<both>(), (1u << 4) | (1u << 6));  // ctx and norm2: neither keeps them

  // After forward the dropped activations are really freed.
  nn::DecoderLayer<with_remat<DefaultPolicy, remat::dots_with_no_batch_dims_saveable>> layer(remat_layer_config());
  layer.init(Key::from_seed(4), 0.3f);
  const nn::TokenLayout lay{1, 5};
  const auto x = randn(5 * 16, 1);
  std::vector<float> y(x.size());
  decltype(layer)::Saved s;
  layer.forward(x.data(), lay, y.data(), s);
  EXPECT_TRUE(s.n1.empty() && s.n2.empty() && s.attn_s.ctx.empty() && s.attn_s.lse.empty() && s.mlp_s.a.empty());
  EXPECT_FALSE(s.attn_s.q.empty() || s.attn_s.k.empty() || s.attn_s.v.empty() || s.h.empty() || s.mlp_s.g.empty() ||
               s.mlp_s.u.empty());
  std::vector<float> dx(x.size());
  layer.backward(y.data(), s, dx.data());
  EXPECT_TRUE(s.n1.empty() && s.attn_s.ctx.empty() && s.mlp_s.a.empty()) << "backward frees what it recomputed";
  EXPECT_FALSE(s.attn_s.q.empty());
}

TEST(NnDecoderLayer, RematPoliciesGiveBitwiseEqualGradients) {
  const LayerRun ref = run_layer<remat::everything_saveable>();
  const auto same = [&](const LayerRun& r, const char* what) {
    EXPECT_EQ(r.y, ref.y) << what;
    EXPECT_EQ(r.dx, ref.dx) << what;
    EXPECT_EQ(r.dx_again, ref.dx) << what << ": second backward";
    ASSERT_EQ(r.grads.size(), ref.grads.size()) << what;
    for (std::size_t i = 0; i < ref.grads.size(); ++i) EXPECT_EQ(r.grads[i], ref.grads[i]) << what << " parameter " << i;
  };
  std::vector<std::uint32_t> dropped;
  same(run_layer<remat::nothing_saveable>(&dropped), "nothing_saveable");
  same(run_layer<remat::dots_saveable>(&dropped), "dots_saveable");
  same(run_layer<remat::dots_with_no_batch_dims_saveable>(&dropped), "dots_with_no_batch_dims_saveable");
  same(run_layer<remat::save_only_these_names<"attn_out", "gate", "up">>(&dropped), "save_only attn_out gate up");
  same(run_layer<remat::save_only_these_names<"q", "ctx", "act">>(&dropped), "save_only q ctx act");
  same(run_layer<remat::save_only_these_names<"norm1", "k", "norm2">>(&dropped), "save_only norm1 k norm2");
  same(run_layer<remat::save_anything_except_these_names<"gate", "up">>(&dropped), "save all but gate up");
  same(run_layer<remat::save_any_names_but_these<"norm1", "ctx">>(&dropped), "save all but norm1 ctx");
  same(run_layer<remat::save_from_both_policies<remat::save_only_these_names<"q", "k">,
                                                remat::save_only_these_names<"gate", "act">>>(&dropped),
       "both: q k and gate act");
  EXPECT_EQ(dropped, (std::vector<std::uint32_t>{0x3ffu, 0x241u, 0x251u, 0x25fu, 0x1edu, 0x3bau, 0x180u, 0x11u, 0x179u}));
}

// Qwen3's q/k head norms: a dropped q or k is recomputed with its norm (the norm's input and
// 1/rms with it), bit for bit; the norms' gradients too.
TEST(NnDecoderLayer, RematPoliciesGiveBitwiseEqualGradientsWithQkNorm) {
  const LayerRun ref = run_layer<remat::everything_saveable>(nullptr, true);
  ASSERT_EQ(ref.grads.size(), 14u);  // the 9 of a Llama layer, the q/k/v biases, q_norm, k_norm
  const auto same = [&](const LayerRun& r, const char* what) {
    EXPECT_EQ(r.y, ref.y) << what;
    EXPECT_EQ(r.dx, ref.dx) << what;
    EXPECT_EQ(r.dx_again, ref.dx) << what << ": second backward";
    ASSERT_EQ(r.grads.size(), ref.grads.size()) << what;
    for (std::size_t i = 0; i < ref.grads.size(); ++i) EXPECT_EQ(r.grads[i], ref.grads[i]) << what << " parameter " << i;
  };
  same(run_layer<remat::nothing_saveable>(nullptr, true), "nothing_saveable");
  same(run_layer<remat::save_only_these_names<"q", "ctx", "act">>(nullptr, true), "save_only q ctx act");
  same(run_layer<remat::save_only_these_names<"norm1", "k", "norm2">>(nullptr, true), "save_only norm1 k norm2");
}

TEST(NnDecoderLayer, RematPoliciesGiveBitwiseEqualLlamaLossAndGradients) {
  models::LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // GQA
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.validate();
  const std::int64_t B = 2, S = 7;
  std::vector<std::int64_t> ids(B * S), labels(B * S);
  for (std::int64_t i = 0; i < B * S; ++i) ids[i] = (i * 7 + 3) % c.vocab_size;
  const std::vector<std::int64_t> mask = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (std::int64_t i = 0; i < B * S; ++i) labels[i] = mask[i] ? ids[i] : -100;
  const nn::TokenLayout lay{B, S, nullptr, mask.data()};

  struct Run {
    double loss = 0;
    std::vector<std::vector<float>> grads;
  };
  const auto run = [&]<class R>(bool via_override) {
    Run r;
    models::LlamaForCausalLM<with_remat<DefaultPolicy, R>> m(c);
    m.init(Key::from_seed(11));
    nn::LossMetrics lm;
    if (via_override) {  // a default-policy model told to use R for this call, as the trainer does
      models::LlamaForCausalLM<> d(c);
      d.init(Key::from_seed(11));
      lm = d.template forward_backward<R>(ids.data(), lay, labels.data());
      d.visit_params("", [&](std::string_view, auto& p) { r.grads.emplace_back(p.grad.begin(), p.grad.end()); });
    } else {
      lm = m.forward_backward(ids.data(), lay, labels.data());
      m.visit_params("", [&](std::string_view, auto& p) { r.grads.emplace_back(p.grad.begin(), p.grad.end()); });
    }
    r.loss = lm.loss;
    return r;
  };
  const Run ref = run.template operator()<remat::everything_saveable>(false);
  ASSERT_TRUE(std::isfinite(ref.loss));
  ASSERT_GE(ref.grads.size(), 3u * 9u + 2u);  // layers, embedding, final norm (, lm_head)
  const auto same = [&](const Run& r, const char* what) {
    EXPECT_EQ(r.loss, ref.loss) << what;
    ASSERT_EQ(r.grads.size(), ref.grads.size()) << what;
    for (std::size_t i = 0; i < ref.grads.size(); ++i) EXPECT_EQ(r.grads[i], ref.grads[i]) << what << " parameter " << i;
  };
  for (bool via_override : {false, true}) {
    same(run.template operator()<remat::nothing_saveable>(via_override), "nothing_saveable");
    same(run.template operator()<remat::dots_saveable>(via_override), "dots_saveable");
    same(run.template operator()<remat::dots_with_no_batch_dims_saveable>(via_override), "dots_with_no_batch_dims");
    same(run.template operator()<remat::save_only_these_names<"attn_out", "ctx">>(via_override), "save_only attn_out ctx");
  }
}
