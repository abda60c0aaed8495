// edl/models/llama/sharded_sequence_classification.hpp
// LlamaForSequenceClassification on a mesh: the decoder (model.*) sharded as ShardedLlama
// shards a causal LM, the score head ([num_labels, hidden], small) whole on every device.
//
//   auto sc = models::shard_model(classifier, mesh);       // ShardedLlamaForSequenceClassification
//   auto r = sc.loss_and_grads(ids, {B, S}, class_ids);    // as forward_backward; gradients sharded
//   sc.logits(ids, {B, S}, out);                           // [B, num_labels]
//   auto one = sc.gather_model();                          // the one-device classifier, bit-exact
//
// Sequence b is pooled (pooled_positions) where its pooled position lives: on the devices of
// its batch rows whose sp block holds that position (each tp rank of them alike). A device
// scores its pooled rows; the loss terms and d score.weight are summed over the data axes, and
// the decoder's backward (ShardedLlama::run_with_head) starts from a d hidden that is non-zero
// at those rows only. Results equal the one-device classifier to f32 rounding (the sums run in
// another order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sequence_classification.hpp>
#include <edl/models/llama/sharded.hpp>

namespace edl::models {

template <class Pol = DefaultPolicy>
class ShardedLlamaForSequenceClassification {
 public:
  using T = typename Pol::param_t;
  using ScoreLinear = typename LlamaForSequenceClassification<Pol>::ScoreLinear;
  static constexpr const char* where = "ShardedLlamaForSequenceClassification";

  /// Shards `m`'s decoder over `mesh` by `rules` and copies its score head.
  ShardedLlamaForSequenceClassification(const LlamaForSequenceClassification<Pol>& m, DefaultMesh mesh,
                                        PartitionRules rules = llama_partition_rules())
      : score(m.score), cfg_(m.config()), decoder_(decoder_of(m), std::move(mesh), std::move(rules)) {
    score.weight.grad = {};  // gradients start afresh, as the decoder's blocks do
  }

  /// The score head, replicated: every process holds it whole, its gradient summed over the mesh.
  ScoreLinear score;

  const LlamaConfig& config() const noexcept { return cfg_; }
  std::int64_t num_labels() const noexcept { return cfg_.num_labels; }
  ProblemType problem_type(bool integer_labels) const { return problem_type_of(cfg_, integer_labels); }
  /// The sharded decoder (parameters "model.*"; the mesh, remat and the gradients' blocks).
  ShardedLlama<Pol>& decoder() noexcept { return decoder_; }
  const ShardedLlama<Pol>& decoder() const noexcept { return decoder_; }

  /// Pooled logits [batch, num_labels], on every process.
  void logits(const std::int64_t* ids, const nn::TokenLayout& layout, float* out) {
    step(ids, layout, ProblemType::single_label_classification, nullptr, nullptr, false, out);
  }
  /// Loss only: integer labels [batch] (single-label; -100 ignored) or float [batch, num_labels].
  ClassificationMetrics loss(const std::int64_t* ids, const nn::TokenLayout& layout, const std::int64_t* labels) {
    return step(ids, layout, problem_type(true), labels, nullptr, false, nullptr);
  }
  ClassificationMetrics loss(const std::int64_t* ids, const nn::TokenLayout& layout, const float* labels) {
    return step(ids, layout, problem_type(false), nullptr, labels, false, nullptr);
  }
  /// Forward, loss and backward; ACCUMULATES the decoder's sharded gradients and score's.
  ClassificationMetrics loss_and_grads(const std::int64_t* ids, const nn::TokenLayout& layout,
                                       const std::int64_t* labels) {
    return step(ids, layout, problem_type(true), labels, nullptr, true, nullptr);
  }
  ClassificationMetrics loss_and_grads(const std::int64_t* ids, const nn::TokenLayout& layout, const float* labels) {
    return step(ids, layout, problem_type(false), nullptr, labels, true, nullptr);
  }

  void zero_grad() {
    decoder_.zero_grad();
    score.weight.zero_grad();
  }
  /// The full gradient of parameter `name` (HF names: "model.*" or "score.weight").
  xt::xarray<float> gather_grad(const std::string& name) const {
    if (name == "score.weight") return xt::xarray<float>(score.weight.grad);
    return decoder_.gather_grad(name);
  }

  /// The one-device classifier with the gathered parameters (bit-exact).
  LlamaForSequenceClassification<Pol> gather_model() const {
    LlamaForSequenceClassification<Pol> m(cfg_);
    m.score = score;
    m.model.visit_params("model", [&](std::string_view path, auto& p) {
      const xt::xarray<T> full = decoder_.gather_param(std::string(path));
      std::memcpy(p.data(), full.data(), full.size() * sizeof(T));
    });
    return m;
  }

 private:
  using Decoder = ShardedLlama<Pol>;

  /// A causal LM holding `m`'s decoder, tied so that it has no lm_head of its own (the head
  /// is replaced by run_with_head's).
  static LlamaForCausalLM<Pol> decoder_of(const LlamaForSequenceClassification<Pol>& m) {
    auto& src = const_cast<LlamaForSequenceClassification<Pol>&>(m);  // visit is non-const; only read
    src.visit_linears("", [&](const std::string& path, auto& lin) {
      EDL_CHECK(!lin.lora, errc::unsupported, path,
                "carries LoRA adapters: a classifier on a mesh trains its full weights (merge the adapters first)");
    });
    LlamaConfig c = m.config();
    c.tie_word_embeddings = true;
    LlamaForCausalLM<Pol> lm(c);
    std::map<std::string, const T*> values;
    src.model.visit_params("model", [&](std::string_view path, auto& p) { values[std::string(path)] = p.data(); });
    lm.visit_params("", [&](std::string_view path, auto& p) {
      std::memcpy(p.data(), values.at(std::string(path)), static_cast<std::size_t>(p.numel()) * sizeof(T));
    });
    return lm;
  }

  ClassificationMetrics step(const std::int64_t* ids, const nn::TokenLayout& lay, ProblemType pt,
                             const std::int64_t* ilabels, const float* flabels, bool train, float* logits_out) {
    EDL_CHECK(ids != nullptr, errc::invalid_argument, where, "needs token ids (the pooling reads them)");
    const std::int64_t B = lay.batch, S = lay.seq, H = cfg_.hidden_size, L = num_labels();
    // Labels are checked here, before any device runs (a device that threw would leave the
    // others waiting in a collective).
    const double normalizer = logits_out ? 0.0 : classification_normalizer(pt, ilabels, flabels, B, L);
    const std::vector<std::int64_t> pos = pooled_positions(ids, B, S, cfg_.pad_token_id);
    if (logits_out) std::fill_n(logits_out, B * L, 0.0f);

    std::mutex mu;
    std::int64_t from = -1;  // this process's lowest device: its sums are the result
    double sums[2] = {0.0, 0.0};  // loss terms, hits
    std::vector<float> dscore;
    const typename Decoder::Head head = [&](const typename Decoder::HeadRows& r, float* dhidden) {
      // The device's pooled rows: their batch rows and their local rows.
      std::vector<std::int64_t> batch_row, local_row;
      for (std::int64_t b = r.batch_first; b < r.batch_first + r.batch_rows; ++b) {
        const std::int64_t p = pos[static_cast<std::size_t>(b)];
        if (p < r.seq_first || p >= r.seq_first + r.seq_rows) continue;
        batch_row.push_back(b);
        local_row.push_back((b - r.batch_first) * r.seq_rows + p - r.seq_first);
      }
      const std::int64_t R = static_cast<std::int64_t>(batch_row.size());
      std::vector<float> pooled(static_cast<std::size_t>(R * H)), x(static_cast<std::size_t>(R * L));
      for (std::int64_t i = 0; i < R; ++i)
        std::copy_n(r.hidden + local_row[static_cast<std::size_t>(i)] * H, H, pooled.data() + i * H);
      ScoreLinear dev_score = score;  // the device's copy: its gradient is the device's share
      dev_score.weight.grad = {};
      dev_score.apply(pooled.data(), R, x.data());
      nn::round_activations<Pol>(x);  // the head's output, as a causal LM's logits
      if (logits_out) {
        if (r.tp_leader)  // the ranks of a tp group hold the same rows
          for (std::int64_t i = 0; i < R; ++i)
            std::copy_n(x.data() + i * L, L, logits_out + batch_row[static_cast<std::size_t>(i)] * L);
        return nn::LossMetrics{};
      }
      std::vector<std::int64_t> il(ilabels ? R : 0);
      std::vector<float> fl(flabels ? R * L : 0);
      for (std::int64_t i = 0; i < R; ++i) {
        const std::int64_t b = batch_row[static_cast<std::size_t>(i)];
        if (ilabels) il[static_cast<std::size_t>(i)] = ilabels[b];
        if (flabels) std::copy_n(flabels + b * L, L, fl.data() + i * L);
      }
      std::vector<float> dx(train ? R * L : 0);
      const ClassificationSums s = classification_loss_rows(pt, x.data(), R, L, il.data(), fl.data(), normalizer,
                                                            train ? dx.data() : nullptr);
      double v[2] = {s.loss, static_cast<double>(s.hits)};
      r.sum_over_data(std::span<double>(v, 2));
      std::span<float> g;
      if (train) {
        typename ScoreLinear::Saved ss;
        ss.x = pooled.data();
        ss.rows = R;
        std::vector<float> dpooled(static_cast<std::size_t>(R * H));
        dev_score.backward(dx.data(), ss, dpooled.data());
        for (std::int64_t i = 0; i < R; ++i)
          std::copy_n(dpooled.data() + i * H, H, dhidden + local_row[static_cast<std::size_t>(i)] * H);
        g = std::span<float>(dev_score.weight.grad_data(), static_cast<std::size_t>(L * H));
        r.sum_over_data(g);
      }
      std::lock_guard<std::mutex> lock(mu);
      if (from < 0 || r.dev.id() < from) {
        from = r.dev.id();
        sums[0] = v[0];
        sums[1] = v[1];
        dscore.assign(g.begin(), g.end());
      }
      return nn::LossMetrics{};
    };
    decoder_.run_with_head(ids, lay, head, train);

    if (logits_out) {
      CollectiveBackend& be = decoder_.mesh().backend();
      if (be.processes() > 1) be.sum_over_processes(logits_out, static_cast<std::size_t>(B * L), DType::f32);
      return {};
    }
    if (train) {
      float* g = score.weight.grad_data();
      for (std::size_t i = 0; i < dscore.size(); ++i) g[i] += dscore[i];
    }
    ClassificationMetrics m;
    m.problem_type = pt;
    m.examples = classification_examples(pt, normalizer, B);
    if (m.examples == 0) return m;
    m.loss = sums[0] / normalizer;
    if (pt != ProblemType::regression) m.accuracy = sums[1] / normalizer;
    return m;
  }

  LlamaConfig cfg_;
  Decoder decoder_;
};

/// Shards a one-device classifier over `mesh` (EasyDeL's default Llama rules unless given).
template <class Pol>
ShardedLlamaForSequenceClassification<Pol> shard_model(const LlamaForSequenceClassification<Pol>& model,
                                                       const DefaultMesh& mesh,
                                                       PartitionRules rules = llama_partition_rules()) {
  return ShardedLlamaForSequenceClassification<Pol>(model, mesh, std::move(rules));
}

}  // namespace edl::models
