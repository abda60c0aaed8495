// Tests for edl/train/evaluation.hpp: evaluate_dataset on a checkpoint read back from disk
// (what `edl eval` does) gives the trainer's own evaluation exactly, the batch size changes
// the loss only by rounding, and the unigram baseline equals a naive computation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include <edl/models/llama/pretrained.hpp>
#include <edl/train/all.hpp>

namespace edl::train {
namespace {

namespace fs = std::filesystem;

TokenDataset random_data(std::int64_t n, std::int64_t len, std::int64_t vocab, std::uint64_t seed) {
  TokenDataset d;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t l = len - (i % 3) * 2;  // ragged: padding in every batch
    std::vector<std::int32_t> s(static_cast<std::size_t>(l));
    for (std::int64_t j = 0; j < l; ++j)  // skewed towards small ids, so the unigram model learns something
      s[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(
          (random_bits_at(fold_in(Key::from_seed(seed), static_cast<std::uint32_t>(i)), static_cast<std::uint64_t>(j)) %
           static_cast<std::uint32_t>(vocab * vocab)) % static_cast<std::uint32_t>(1 + j % vocab));
    d.add(std::span<const std::int32_t>(s));
  }
  return d;
}

models::LlamaConfig tiny() {
  models::LlamaConfig c;
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  return c;
}

TEST(Evaluation, CheckpointLossEqualsTheTrainersEvaluation) {
  const fs::path dir = fs::temp_directory_path() / ("edl_eval_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainingArguments a;
  a.save_directory = dir.string();
  a.total_batch_size = 6;
  a.gradient_accumulation_steps = 2;  // evaluation batches of 3
  a.max_training_steps = 3;
  a.max_sequence_length = 12;         // sequences of 16 are truncated (keep_end)
  a.learning_rate = 3e-3;
  a.progress = false;
  a.peak_gflops = 10;
  a.write_report = false;
  models::LlamaForCausalLM<> m(tiny());
  m.init(Key::from_seed(1));
  const TokenDataset eval = random_data(11, 16, 48, 9);
  Trainer t(a, std::move(m), std::nullopt, random_data(12, 16, 48, 8), eval);
  const TrainResult r = t.train();
  ASSERT_TRUE(r.eval_loss.has_value());

  // What `edl eval` does: the checkpoint from disk, the run's sequence length and batching.
  auto loaded = models::from_pretrained<>(r.checkpoint);
  const EvalMetrics e = evaluate_dataset(loaded, eval, t.eval_options());
  EXPECT_EQ(e.loss, *r.eval_loss);  // exact: same weights, same batches, same order of sums
  const EvalMetrics again = t.evaluate();
  EXPECT_EQ(e.loss, again.loss);
  EXPECT_EQ(e.accuracy, again.accuracy);
  EXPECT_EQ(e.tokens, again.tokens);
  EXPECT_EQ(e.tokens, 11 * 11 - 0);  // every sequence truncated to 12 tokens: 11 targets each

  // Another batch size: the same mean up to float rounding.
  EvalOptions o = t.eval_options();
  o.batch_size = 5;
  const EvalMetrics e5 = evaluate_dataset(loaded, eval, o);
  EXPECT_EQ(e5.tokens, e.tokens);
  EXPECT_NEAR(e5.loss, e.loss, 1e-5 * e.loss);
  EXPECT_NEAR(e5.perplexity, std::exp(e5.loss), 1e-12 * e5.perplexity);

  // max_batches limits the sequences scored.
  o.batch_size = 3;
  o.max_batches = 2;
  EXPECT_EQ(evaluate_dataset(loaded, eval, o).tokens, 6 * 11);
  fs::remove_all(dir);
}

TEST(Evaluation, UnigramBaselineEqualsNaiveComputation) {
  const std::int64_t V = 20;
  const TokenDataset train = random_data(30, 10, 12, 3);  // ids 12..19 never occur in training
  TokenDataset held = random_data(7, 9, 12, 4);
  held.add(std::vector<std::int32_t>{0, 19, 19, 5});      // unseen tokens cost log(N + V)
  EvalOptions o;
  o.max_sequence_length = 6;  // truncation applies to the held-out side as in evaluate_dataset
  o.batch_size = 3;
  const UnigramBaseline u = unigram_baseline(train, held, V, o);

  std::map<std::int32_t, long double> count;
  long double n = 0;
  for (std::int64_t i = 0; i < train.size(); ++i)
    for (auto t : train[i]) { count[t] += 1; n += 1; }
  long double sum = 0, tokens = 0;
  for (std::int64_t i = 0; i < held.size(); ++i) {
    auto s = held[i];
    if (static_cast<std::int64_t>(s.size()) > o.max_sequence_length) s = s.last(static_cast<std::size_t>(o.max_sequence_length));
    for (std::size_t j = 1; j < s.size(); ++j) {  // the first token of a sequence is never a target
      sum += -std::log((count[s[j]] + 1) / (n + V));
      tokens += 1;
    }
  }
  long double h = 0;
  for (std::int32_t t = 0; t < V; ++t) {
    const long double p = (count[t] + 1) / (n + V);
    h -= p * std::log(p);
  }
  EXPECT_EQ(u.tokens, static_cast<std::int64_t>(tokens));
  EXPECT_EQ(u.train_tokens, static_cast<std::int64_t>(n));
  EXPECT_NEAR(u.loss, static_cast<double>(sum / tokens), 1e-12);
  EXPECT_NEAR(u.entropy, static_cast<double>(h), 1e-12);
  EXPECT_NEAR(u.perplexity, std::exp(u.loss), 1e-9);
  // Skewed data: the unigram model beats the uniform one on its own training data.
  const UnigramBaseline self = unigram_baseline(train, train, V, EvalOptions{});
  EXPECT_LT(self.loss, std::log(static_cast<double>(V)));

  TokenDataset bad;
  bad.add(std::vector<std::int32_t>{1, 25});
  EXPECT_THROW(unigram_baseline(train, bad, V, o), Error);
}

}  // namespace
}  // namespace edl::train
