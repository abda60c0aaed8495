#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <edl/nn/attention.hpp>

#include "nn_test_util.hpp"

using namespace edl;
using namespace edl_nn_test;

namespace {

using Attn = nn::Attention<DefaultPolicy>;

/// HF eager attention in double: projections, q/k head norms (Qwen3), rope, repeat_kv, masks,
/// softmax, o_proj.
std::vector<double> naive_attention(Attn& a, const std::vector<float>& x, const nn::TokenLayout& lay,
                                    std::int64_t hidden, std::int64_t window, double theta) {
  const std::int64_t B = lay.batch, S = lay.seq, T = B * S, nh = a.num_heads(), nkv = a.num_kv_heads(),
                     D = a.head_dim(), rep = nh / nkv;
  auto proj = [&](auto& lin, std::int64_t out) {
    std::vector<double> y(T * out);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t o = 0; o < out; ++o) {
        double s = lin.has_bias() ? lin.bias.value(o) : 0.0;
        for (std::int64_t i = 0; i < hidden; ++i) s += double(x[t * hidden + i]) * lin.weight.value(o, i);
        y[t * out + o] = s;
      }
    return y;
  };
  auto q = proj(a.q_proj, nh * D), k = proj(a.k_proj, nkv * D), v = proj(a.v_proj, nkv * D);
  auto head_norm = [&](std::vector<double>& z, std::int64_t heads, auto& norm) {  // Qwen3RMSNorm per head
    for (std::int64_t r = 0; r < T * heads; ++r) {
      double ms = 0;
      for (std::int64_t d = 0; d < D; ++d) ms += z[r * D + d] * z[r * D + d];
      const double inv = 1.0 / std::sqrt(ms / double(D) + norm.eps());
      for (std::int64_t d = 0; d < D; ++d) z[r * D + d] *= inv * norm.weight.value(d);
    }
  };
  if (a.has_qk_norm()) {
    head_norm(q, nh, a.q_norm);
    head_norm(k, nkv, a.k_norm);
  }
  auto rope = [&](std::vector<double>& z, std::int64_t heads) {
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < D / 2; ++i) {
          const double ang = double(lay.position(t)) * std::pow(theta, -2.0 * i / D);
          double& p = z[(t * heads + h) * D + i];
          double& r = z[(t * heads + h) * D + i + D / 2];
          const double p0 = p, r0 = r;
          p = p0 * std::cos(ang) - r0 * std::sin(ang);
          r = r0 * std::cos(ang) + p0 * std::sin(ang);
        }
  };
  rope(q, nh);
  rope(k, nkv);
  std::vector<double> ctx(T * nh * D, 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        std::vector<double> sc(S, -INFINITY);
        double m = -INFINITY;
        for (std::int64_t j = 0; j < S; ++j) {
          const bool same_doc = !lay.segment_ids || lay.segment_ids[b * S + j] == lay.segment_ids[b * S + i];
          const bool ok = j <= i && (window == 0 || i - j < window) && lay.attends(b * S + j) && same_doc;
          if (!ok) continue;
          double s = 0;
          for (std::int64_t d = 0; d < D; ++d)
            s += q[((b * S + i) * nh + h) * D + d] * k[((b * S + j) * nkv + h / rep) * D + d];
          sc[j] = s / std::sqrt(double(D));
          m = std::max(m, sc[j]);
        }
        if (m == -INFINITY) continue;
        double z = 0;
        for (std::int64_t j = 0; j < S; ++j) z += sc[j] == -INFINITY ? 0 : std::exp(sc[j] - m);
        for (std::int64_t j = 0; j < S; ++j) {
          if (sc[j] == -INFINITY) continue;
          const double p = std::exp(sc[j] - m) / z;
          for (std::int64_t d = 0; d < D; ++d)
            ctx[((b * S + i) * nh + h) * D + d] += p * v[((b * S + j) * nkv + h / rep) * D + d];
        }
      }
  std::vector<double> y(T * hidden);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t o = 0; o < hidden; ++o) {
      double s = a.o_proj.has_bias() ? a.o_proj.bias.value(o) : 0.0;
      for (std::int64_t i = 0; i < nh * D; ++i) s += ctx[t * nh * D + i] * a.o_proj.weight.value(o, i);
      y[t * hidden + o] = s;
    }
  return y;
}

struct Case {
  const char* name;
  std::int64_t nh, nkv, window;
  bool mask, bias;
  std::int64_t seq = 6;  // > 64 crosses the query blocks of the blocked kernel
  bool qk_norm = false;  // Qwen3's per-head q/k RMSNorm
  bool packed = false;   // rows of several documents (segment_ids, positions restarting)
};

}  // namespace

class NnAttention : public ::testing::TestWithParam<Case> {};

TEST_P(NnAttention, ForwardMatchesNaiveAndBackwardMatchesFiniteDifferences) {
  const Case cs = GetParam();
  const std::int64_t hidden = 16, D = 4, B = 2, S = cs.seq, T = B * S;
  nn::AttentionConfig cfg{.hidden = hidden, .num_heads = cs.nh, .num_kv_heads = cs.nkv, .head_dim = D,
                          .qkv_bias = cs.bias, .o_bias = cs.bias, .sliding_window = {}, .rope = {}};
  if (cs.window) cfg.sliding_window = cs.window;
  cfg.rope.theta = 10000.0;
  cfg.qk_norm = cs.qk_norm;
  cfg.qk_norm_eps = 1e-5;
  Attn a(cfg);
  a.init(Key::from_seed(11), 0.4f);
  if (cs.qk_norm) {  // weights near 1, different per position within the head
    fill_randn(a.q_norm.weight.data(), D, 23, 0.3f);
    fill_randn(a.k_norm.weight.data(), D, 24, 0.3f);
    for (std::int64_t d = 0; d < D; ++d) a.q_norm.weight.data()[d] += 1.0f, a.k_norm.weight.data()[d] += 1.0f;
  }
  if (cs.bias) {
    fill_randn(a.q_proj.bias.data(), a.q_proj.out_features(), 21, 0.3f);
    fill_randn(a.k_proj.bias.data(), a.k_proj.out_features(), 22, 0.3f);
  }
  // Row 1 is left-padded by two tokens (mask 0, position 0), as HF's tokenizer pads.
  std::vector<std::int64_t> mask(static_cast<std::size_t>(T), 1), pos(static_cast<std::size_t>(T));
  for (std::int64_t j = 0; j < S; ++j) {
    pos[static_cast<std::size_t>(j)] = j;
    mask[static_cast<std::size_t>(S + j)] = j >= 2;
    pos[static_cast<std::size_t>(S + j)] = std::max<std::int64_t>(0, j - 2);
  }
  nn::TokenLayout lay{B, S};
  if (cs.mask) {
    lay.attention_mask = mask.data();
    lay.position_ids = pos.data();
  }
  // Packed rows: row 0 holds documents of S/3 and S - S/3 tokens, row 1 of 1, S/2 - 1 and
  // S - S/2 tokens (a one-token document too); positions restart at each.
  std::vector<std::int64_t> seg(static_cast<std::size_t>(T));
  if (cs.packed) {
    for (std::int64_t b = 0; b < B; ++b) {
      const std::vector<std::int64_t> starts = b == 0 ? std::vector<std::int64_t>{0, S / 3} : std::vector<std::int64_t>{0, 1, S / 2};
      std::int64_t id = 10 * b, p = 0;
      for (std::int64_t j = 0; j < S; ++j) {
        if (std::find(starts.begin(), starts.end(), j) != starts.end()) ++id, p = 0;
        seg[static_cast<std::size_t>(b * S + j)] = id;
        pos[static_cast<std::size_t>(b * S + j)] = p++;
      }
    }
    lay.segment_ids = seg.data();
    lay.position_ids = pos.data();
  }
  auto x = randn(T * hidden, 1);
  std::vector<float> y(T * hidden);
  Attn::Saved s;
  a.forward(x.data(), lay, y.data(), s);
  const auto ref = naive_attention(a, x, lay, hidden, cs.window, 10000.0);
  for (std::int64_t i = 0; i < T * hidden; ++i) EXPECT_NEAR(y[i], ref[i], 2e-5) << cs.name << " " << i;

  auto c = randn(T * hidden, 2);
  std::vector<float> dx(T * hidden);
  a.backward(c.data(), s, dx.data());
  auto loss = [&] {
    std::vector<float> yy(T * hidden);
    a.apply(x.data(), lay, yy.data());
    return functional(yy.data(), c);
  };
  expect_fd(std::string(cs.name) + " dx", x.data(), x.size(), dx.data(), loss, 40);
  a.visit_params("", [&](std::string_view path, auto& p) {
    expect_fd(std::string(cs.name) + " d" + std::string(path), p.data(), p.value.size(), p.grad.data(), loss, 16);
  });
}

INSTANTIATE_TEST_SUITE_P(Cases, NnAttention,
                         ::testing::Values(Case{"mha", 4, 4, 0, false, false}, Case{"gqa", 4, 2, 0, false, true},
                                           Case{"mqa_mask", 4, 1, 0, true, false},
                                           Case{"gqa_window_mask", 4, 2, 3, true, false},
                                           Case{"mha_blocks", 4, 4, 0, false, true, 150},
                                           Case{"gqa_window_mask_blocks", 4, 2, 70, true, false, 140},
                                           Case{"gqa_qk_norm_mask", 4, 2, 0, true, true, 6, true},
                                           Case{"mqa_qk_norm_blocks", 4, 1, 0, false, false, 80, true},
                                           Case{"gqa_packed", 4, 2, 0, false, true, 7, false, true},
                                           Case{"gqa_window_packed_blocks", 4, 2, 40, false, false, 150, false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(NnAttentionMisc, FlopsAndNames) {
  Attn a({.hidden = 16, .num_heads = 4, .num_kv_heads = 2, .head_dim = 4, .qkv_bias = false, .o_bias = false, .sliding_window = {}, .rope = {}});
  EXPECT_EQ(a.param_count(), 16 * 16 + 2 * 8 * 16 + 16 * 16);
  // projections 2*T*16*(16+8+8+16), scores and p.v: 4 * B * nh * (1+2+3) * D
  EXPECT_DOUBLE_EQ(a.flops_forward(1, 3), 2.0 * 3 * 16 * 48 + 4.0 * 4 * 6 * 4);
  std::vector<std::string> names;
  a.visit_params("self_attn", [&](std::string_view p, auto&) { names.emplace_back(p); });
  EXPECT_EQ(names, (std::vector<std::string>{"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                             "self_attn.v_proj.weight", "self_attn.o_proj.weight"}));
  // Qwen3: q_norm and k_norm of head_dim values after o_proj, HF's order.
  nn::AttentionConfig q3{.hidden = 16, .num_heads = 4, .num_kv_heads = 2, .head_dim = 6, .qkv_bias = false,
                         .o_bias = false, .sliding_window = {}, .rope = {}, .qk_norm = true, .qk_norm_eps = 1e-6};
  Attn b(q3);
  EXPECT_TRUE(b.has_qk_norm());
  EXPECT_FALSE(a.has_qk_norm());
  EXPECT_EQ(b.param_count(), 24 * 16 + 2 * 12 * 16 + 16 * 24 + 2 * 6);
  names.clear();
  b.visit_params("self_attn", [&](std::string_view p, auto&) { names.emplace_back(p); });
  EXPECT_EQ(names, (std::vector<std::string>{"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                             "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                             "self_attn.q_norm.weight", "self_attn.k_norm.weight"}));
  EXPECT_THROW(Attn({.hidden = 16, .num_heads = 4, .num_kv_heads = 3, .head_dim = 4, .qkv_bias = false, .o_bias = false, .sliding_window = {}, .rope = {}}), Error);
}

// output_attentions: the probabilities recomputed from q, k and the log-sum-exp give the
// forward's context (p v = ctx), and each row sums to one over the keys it may see (causal,
// window, its document, not padding) and is zero elsewhere; GQA and soft-capping on.
TEST(NnAttentionMisc, ProbabilitiesGiveTheContextAndRespectTheMask) {
  const std::int64_t hidden = 16, D = 4, nh = 4, nkv = 2, B = 2, S = 70, T = B * S, W = 9, rep = nh / nkv;
  nn::AttentionConfig cfg{.hidden = hidden, .num_heads = nh, .num_kv_heads = nkv, .head_dim = D, .qkv_bias = false,
                          .o_bias = false, .sliding_window = W, .rope = {}};
  cfg.rope.theta = 10000.0;
  cfg.softcap = 3.0;
  Attn a(cfg);
  a.init(Key::from_seed(5), 0.5f);
  // Row 0: two documents (the second from position 30); row 1: left padding of three tokens.
  std::vector<std::int64_t> mask(static_cast<std::size_t>(T), 1), pos(static_cast<std::size_t>(T)),
      seg(static_cast<std::size_t>(T), 1);
  for (std::int64_t j = 0; j < S; ++j) {
    seg[static_cast<std::size_t>(j)] = j < 30 ? 1 : 2;
    pos[static_cast<std::size_t>(j)] = j < 30 ? j : j - 30;
    mask[static_cast<std::size_t>(S + j)] = j >= 3;
    pos[static_cast<std::size_t>(S + j)] = std::max<std::int64_t>(0, j - 3);
  }
  nn::TokenLayout lay{B, S};
  lay.attention_mask = mask.data();
  lay.position_ids = pos.data();
  lay.segment_ids = seg.data();
  const auto x = randn(static_cast<std::size_t>(T * hidden), 3);
  std::vector<float> y(x.size());
  Attn::Saved s;
  a.forward(x.data(), lay, y.data(), s);
  const std::vector<float> p = a.probabilities(s);
  ASSERT_EQ(p.size(), static_cast<std::size_t>(B * nh * S * S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        const float* row = p.data() + ((b * nh + h) * S + i) * S;
        double sum = 0;
        bool any = false;
        for (std::int64_t j = 0; j < S; ++j) {
          const std::size_t ij = static_cast<std::size_t>(b * S + j), ii = static_cast<std::size_t>(b * S + i);
          const bool allowed = j <= i && j > i - W && seg[ij] == seg[ii] && mask[ij] == 1;
          if (!allowed) {
            ASSERT_EQ(row[j], 0.0f) << b << " " << h << " " << i << " " << j;
          }
          any = any || allowed;
          sum += row[j];
        }
        if (any) {
          ASSERT_NEAR(sum, 1.0, 1e-5) << b << " " << h << " " << i;
        }
        const std::int64_t g = h / rep;
        for (std::int64_t c = 0; c < D; ++c) {
          double ctx = 0;
          for (std::int64_t j = 0; j <= i; ++j)
            ctx += static_cast<double>(row[j]) * s.v[static_cast<std::size_t>((b * S + j) * nkv * D + g * D + c)];
          ASSERT_NEAR(ctx, s.ctx[static_cast<std::size_t>((b * S + i) * nh * D + h * D + c)], 1e-5)
              << b << " " << h << " " << i << " " << c;
        }
      }
  // A forward that dropped q and k cannot give them.
  Attn::Saved dropped = s;
  dropped.q.clear();
  EXPECT_THROW(a.probabilities(dropped), Error);
}
