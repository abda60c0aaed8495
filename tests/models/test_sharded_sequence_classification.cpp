// ShardedLlamaForSequenceClassification (models/llama/sharded_sequence_classification.hpp): the
// classifier on every mesh shape against the one-device LlamaForSequenceClassification (pooled
// logits, each problem type's loss, every gradient, AdamW steps), gathering, remat, bad labels.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <edl/core/policy.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/auto_model.hpp>
#include <edl/models/llama/sharded_sequence_classification.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/sharded_optimizer.hpp>

#include "../support/folder_bytes.hpp"
#include "../support/same_params.hpp"
#include "../support/small_llama.hpp"

using namespace edl;
using models::LlamaConfig;
using models::LlamaForSequenceClassification;
using models::ProblemType;

namespace {

using Dims = std::array<std::int64_t, 4>;  // dp, fsdp, tp, sp

const std::vector<Dims> kMeshes = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}, {1, 1, 1, 2},
                                   {2, 2, 2, 1}, {1, 2, 2, 2}, {2, 1, 2, 2}, {1, 4, 1, 1}, {1, 1, 1, 4}};

std::string dims_str(const Dims& d) {
  return "mesh(dp=" + std::to_string(d[0]) + ",fsdp=" + std::to_string(d[1]) + ",tp=" + std::to_string(d[2]) +
         ",sp=" + std::to_string(d[3]) + ")";
}

LlamaConfig classifier_config(std::int64_t num_labels) {
  LlamaConfig c = test_support::small_llama_config(48);
  c.rms_norm_eps = 1e-5;
  c.num_labels = num_labels;
  c.pad_token_id = 0;
  c.validate();
  return c;
}

/// Tokens [B, S] in [1, vocab) with padding (id 0) so that the pooled positions fall in every
/// sp block: sequence b keeps its first len[b] tokens.
std::vector<std::int64_t> padded_tokens(std::int64_t B, std::int64_t S, std::int64_t vocab, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int64_t> t(static_cast<std::size_t>(B * S));
  for (auto& v : t) v = 1 + static_cast<std::int64_t>(g() % static_cast<unsigned>(vocab - 1));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = 1 + (b * 5 + 2) % S;  // 3, 8, 5, 2 for S = 8
    for (std::int64_t s = len; s < S; ++s) t[static_cast<std::size_t>(b * S + s)] = 0;
  }
  return t;
}

/// max |a - b| <= tol * max |a| (a: the one-device reference).
template <class A, class B>
void expect_close(const A* ref, const B* got, std::size_t n, const std::string& what, double tol = 1e-5) {
  double mx = 0, err = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mx = std::max(mx, std::abs(static_cast<double>(ref[i])));
    err = std::max(err, std::abs(static_cast<double>(ref[i]) - static_cast<double>(got[i])));
  }
  EXPECT_LE(err, tol * std::max(mx, 1e-12)) << what << ": max error " << err << ", max |ref| " << mx;
}

/// The sharded classifier of `m` on every mesh against `m` itself, for one kind of labels.
template <class Label>
void expect_meshes_match(LlamaForSequenceClassification<>& m, const std::vector<std::int64_t>& ids,
                         const std::vector<Label>& labels, std::int64_t B, std::int64_t S, ProblemType expect) {
  const nn::TokenLayout lay{B, S};
  const std::int64_t L = m.num_labels();
  std::vector<float> want_logits(static_cast<std::size_t>(B * L));
  m.logits(ids.data(), lay, want_logits.data());
  nn::zero_grad(m);
  const auto want = m.forward_backward(ids.data(), lay, labels.data());
  ASSERT_EQ(want.problem_type, expect);
  for (const Dims& d : kMeshes) {
    const std::string where = dims_str(d) + " " + std::string(models::problem_type_name(expect));
    SCOPED_TRACE(where);
    auto sc = models::shard_model(m, create_mesh(d));
    std::vector<float> logits(want_logits.size(), -1.0f);
    sc.logits(ids.data(), lay, logits.data());
    expect_close(want_logits.data(), logits.data(), logits.size(), "logits");

    const auto got = sc.loss_and_grads(ids.data(), lay, labels.data());
    EXPECT_EQ(got.problem_type, want.problem_type);
    EXPECT_EQ(got.examples, want.examples);
    EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::abs(want.loss));
    EXPECT_DOUBLE_EQ(got.accuracy, want.accuracy);
    std::size_t compared = 0;
    m.visit_params("", [&](std::string_view path, auto& p) {
      const auto g = sc.gather_grad(std::string(path));
      ASSERT_EQ(g.size(), p.grad.size()) << path;
      expect_close(p.grad.data(), g.data(), g.size(), "grad " + std::string(path));
      ++compared;
    });
    EXPECT_EQ(compared, sc.decoder().names().size() + 1);  // and score.weight
    // The loss alone agrees with loss_and_grads, and gradients accumulate.
    EXPECT_NEAR(sc.loss(ids.data(), lay, labels.data()).loss, got.loss, 1e-12);
    const auto g1 = sc.gather_grad("score.weight");
    const auto e1 = sc.gather_grad("model.embed_tokens.weight");
    sc.loss_and_grads(ids.data(), lay, labels.data());
    expect_close(xt::xarray<float>(2.0f * g1).data(), sc.gather_grad("score.weight").data(), g1.size(),
                 "score.weight accumulated");
    expect_close(xt::xarray<float>(2.0f * e1).data(), sc.gather_grad("model.embed_tokens.weight").data(), e1.size(),
                 "embed_tokens accumulated");
  }
}

}  // namespace

TEST(ShardedSequenceClassification, SingleLabelMatchesOneDeviceOnEveryMesh) {
  // A released causal LM's checkpoint read as a classifier (a new score head), as a user
  // fine-tuning it to classify would start.
  auto m = models::sequence_classification_from_pretrained(test_support::fixture("tiny_hf"), {}, Key::from_seed(3));
  const std::int64_t B = 4, S = 8;
  auto c = m.config();
  ASSERT_GT(c.num_labels, 1);
  const auto ids = padded_tokens(B, S, c.vocab_size, 11);
  std::vector<std::int64_t> labels(B);
  for (std::int64_t b = 0; b < B; ++b) labels[static_cast<std::size_t>(b)] = b % c.num_labels;
  labels[1] = -100;  // ignored: the mean runs over three sequences
  // The tiny checkpoint has no pad token: pooling reads each sequence's last position.
  expect_meshes_match(m, ids, labels, B, S, ProblemType::single_label_classification);
  // With a pad token the pooled positions spread over the sp blocks.
  c.pad_token_id = 0;
  LlamaForSequenceClassification<> padded(c);
  nn::merge_params(padded, nn::split_params(m));
  expect_meshes_match(padded, ids, labels, B, S, ProblemType::single_label_classification);
}

TEST(ShardedSequenceClassification, RegressionAndMultiLabelMatchOneDeviceOnEveryMesh) {
  const std::int64_t B = 4, S = 8;
  {
    LlamaForSequenceClassification<> m(classifier_config(1));
    m.init(Key::from_seed(5), 0.2f);
    const auto ids = padded_tokens(B, S, m.config().vocab_size, 12);
    const std::vector<float> y = {0.5f, -1.0f, 2.0f, 0.25f};
    expect_meshes_match(m, ids, y, B, S, ProblemType::regression);
  }
  {
    LlamaForSequenceClassification<> m(classifier_config(3));
    m.init(Key::from_seed(6), 0.2f);
    const auto ids = padded_tokens(B, S, m.config().vocab_size, 13);
    const std::vector<float> y = {1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0};
    expect_meshes_match(m, ids, y, B, S, ProblemType::multi_label_classification);
  }
}

TEST(ShardedSequenceClassification, GatherModelIsBitExact) {
  LlamaForSequenceClassification<BF16ParamsPolicy> m(classifier_config(3));
  m.init(Key::from_seed(8), 0.2f);
  for (const Dims& d : {Dims{1, 2, 2, 1}, Dims{2, 1, 1, 2}}) {
    SCOPED_TRACE(dims_str(d));
    auto sc = models::shard_model(m, create_mesh(d));
    auto back = sc.gather_model();
    test_support::expect_same_params(m, back, dims_str(d));
  }
}

TEST(ShardedSequenceClassification, RematGivesBitIdenticalGradients) {
  LlamaForSequenceClassification<> m(classifier_config(3));
  m.init(Key::from_seed(9), 0.2f);
  const std::int64_t B = 4, S = 8;
  const auto ids = padded_tokens(B, S, m.config().vocab_size, 14);
  const std::vector<std::int64_t> labels = {0, 2, 1, 1};
  const nn::TokenLayout lay{B, S};
  for (const Dims& d : {Dims{1, 2, 1, 2}, Dims{1, 1, 2, 2}}) {
    auto keep = models::shard_model(m, create_mesh(d));
    const auto a = keep.loss_and_grads(ids.data(), lay, labels.data());
    for (const char* policy : {"nothing_saveable", "dots_saveable", "save_only_these_names(ctx, gate)"}) {
      SCOPED_TRACE(dims_str(d) + " " + policy);
      auto remat = models::shard_model(m, create_mesh(d));
      remat.decoder().set_remat(remat::parse(policy));
      const auto b = remat.loss_and_grads(ids.data(), lay, labels.data());
      EXPECT_EQ(a.loss, b.loss);
      m.visit_params("", [&](std::string_view path, auto&) {
        EXPECT_TRUE(keep.gather_grad(std::string(path)) == remat.gather_grad(std::string(path))) << path;
      });
    }
  }
}

TEST(ShardedSequenceClassification, AdamWStepsFollowOneDevice) {
  // The decoder's blocks update with the ZeRO optimizer, the replicated head with the
  // one-device optimizer: three steps stay within f32 rounding of one device's.
  LlamaForSequenceClassification<> one(classifier_config(3));
  one.init(Key::from_seed(10), 0.2f);
  const std::int64_t B = 4, S = 8;
  const auto ids = padded_tokens(B, S, one.config().vocab_size, 15);
  const std::vector<std::int64_t> labels = {0, 2, 1, 1};
  const nn::TokenLayout lay{B, S};
  const optim::OptimizerOptions o{.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1};
  auto sc = models::shard_model(one, create_mesh(Dims{2, 1, 2, 2}));
  optim::Optimizer opt_one(o), opt_head(o);
  optim::ShardedOptimizer opt_decoder(o, sc.decoder());
  for (int step = 0; step < 3; ++step) {
    nn::zero_grad(one);
    const auto want = one.forward_backward(ids.data(), lay, labels.data());
    opt_one.step(one, 1e-2);
    sc.zero_grad();
    const auto got = sc.loss_and_grads(ids.data(), lay, labels.data());
    EXPECT_NEAR(got.loss, want.loss, 1e-4 * std::abs(want.loss)) << "step " << step;
    opt_decoder.step(sc.decoder(), 1e-2);
    opt_head.step(sc.score, 1e-2);
  }
  auto back = sc.gather_model();
  one.visit_params("", [&](std::string_view path, auto& p) {
    std::vector<float> got;
    back.visit_params("", [&](std::string_view q, auto& r) {
      if (q == path) got.assign(r.data(), r.data() + r.numel());
    });
    ASSERT_EQ(got.size(), static_cast<std::size_t>(p.numel())) << path;
    expect_close(p.data(), got.data(), got.size(), "after 3 steps: " + std::string(path), 1e-4);
  });
}

TEST(ShardedSequenceClassification, BadLabelsAreNamedBeforeAnyDeviceRuns) {
  LlamaForSequenceClassification<> m(classifier_config(3));
  m.init(Key::from_seed(11), 0.2f);
  const std::int64_t B = 4, S = 8;
  const auto ids = padded_tokens(B, S, m.config().vocab_size, 16);
  const nn::TokenLayout lay{B, S};
  auto sc = models::shard_model(m, create_mesh(Dims{2, 1, 1, 2}));
  const std::vector<std::int64_t> bad = {0, 1, 3, 0};
  try {
    sc.loss_and_grads(ids.data(), lay, bad.data());
    ADD_FAILURE() << "label 3 of 3 classes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sc.loss(nullptr, lay, bad.data()), Error);  // pooling needs the ids
  // The mesh still runs (no device was left waiting in a collective).
  const std::vector<std::int64_t> good = {0, 1, 2, 0};
  EXPECT_TRUE(std::isfinite(sc.loss(ids.data(), lay, good.data()).loss));
}
