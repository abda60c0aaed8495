// Tests for edl/train/sft_data.hpp: which tokens of each record kind the loss scores (with a
// byte-level tokenizer every boundary is exact, so the scored bytes are the completion's text),
// the masks through collate and truncation, errors naming the line, and SFT through the trainer
// (the targets it counts are the scored tokens).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <edl/tokenizer/bpe_trainer.hpp>
#include <edl/train/sft_data.hpp>
#include <edl/train/trainer.hpp>
#include "../support/temp_dir.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Bytes as tokens, with a ChatML template.
tokenizer::Tokenizer byte_chat_tokenizer() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  ojson config = {{"chat_template", kChatml}};
  return tokenizer::Tokenizer::from_json(tokenizer::detail::byte_level_bpe_json(bytes, {}), config, "byte+chatml");
}

/// The scored tokens of `ex` as text, runs separated by "|".
std::string scored_text(const tokenizer::Tokenizer& tok, const SftExample& ex) {
  std::string out;
  std::vector<std::int64_t> run;
  for (std::size_t i = 0; i <= ex.ids.size(); ++i) {
    if (i < ex.ids.size() && ex.scored[i]) {
      run.push_back(ex.ids[i]);
      continue;
    }
    if (!run.empty()) out += (out.empty() ? "" : "|") + tok.decode(run);
    run.clear();
  }
  return out;
}

SftExample example(const std::string& line, const tokenizer::Tokenizer& tok, SftOptions o = {}) {
  const chat::ChatTemplate tmpl(kChatml);
  return sft_example(ojson::parse(line), tok, &tmpl, o, "record");
}

struct TempDir : test_support::TempDir {
  explicit TempDir(const std::string& name) : test_support::TempDir("sft_" + name) {}
};

}  // namespace

TEST(SftData, PromptCompletionScoresTheCompletionAndEos) {
  const auto tok = byte_chat_tokenizer();
  const SftExample ex = example(R"({"prompt": "Q: 2+2?\nA:", "completion": " 4"})", tok, {true, 300});
  const std::string whole = "Q: 2+2?\nA: 4";
  ASSERT_EQ(ex.ids.size(), whole.size() + 1);
  EXPECT_EQ(ex.ids.back(), 300);
  for (std::size_t i = 0; i < ex.ids.size(); ++i) EXPECT_EQ(ex.scored[i], i >= 10 ? 1 : 0) << i;
  // Every token scored without completion_only_loss.
  const SftExample all = example(R"({"prompt": "Q: 2+2?\nA:", "completion": " 4"})", tok, {false, 300});
  EXPECT_EQ(all.ids, ex.ids);
  EXPECT_EQ(std::count(all.scored.begin(), all.scored.end(), 1), static_cast<std::ptrdiff_t>(all.ids.size()));
  // A text record is language modelling: all of it.
  const SftExample text = example(R"({"text": "abc"})", tok, {true, 300});
  EXPECT_EQ(text.scored, (std::vector<std::uint8_t>{1, 1, 1, 1}));
}

TEST(SftData, ConversationsScoreTheAssistantTurnsOnly) {
  const auto tok = byte_chat_tokenizer();
  const SftExample ex = example(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."},
      {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4"}]})",
                                tok);
  EXPECT_EQ(tok.decode(std::vector<std::int64_t>(ex.ids.begin(), ex.ids.end())),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n");
  EXPECT_EQ(scored_text(tok, ex), "Hello.<|im_end|>\n|4<|im_end|>\n");
  // Conversational prompt and completion: the completion's turn.
  const SftExample pc = example(
      R"({"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Yo"}]})", tok);
  EXPECT_EQ(scored_text(tok, pc), "Yo<|im_end|>\n");
}

TEST(SftData, CollateMasksWhatIsNotScoredAndTruncatesTheMaskWithTheTokens) {
  TokenDataset ds;
  const std::vector<std::int32_t> a{5, 6, 7, 8, 9}, b{1, 2};
  const std::vector<std::uint8_t> ma{0, 0, 1, 1, 0};
  ds.add(std::span<const std::int32_t>(a), std::span<const std::uint8_t>(ma));
  ds.add(std::span<const std::int32_t>(b));  // unmasked: every token
  EXPECT_EQ(ds.num_scored(), 4);
  std::vector<std::span<const std::int32_t>> seqs{ds[0], ds[1]};
  std::vector<std::span<const std::uint8_t>> scored{ds.scored(0), ds.scored(1)};
  const Batch full = collate(seqs, 8, 0, Truncation::keep_end, &scored);
  EXPECT_EQ(full.labels, (std::vector<std::int64_t>{-100, -100, 7, 8, -100, 1, 2, -100, -100, -100}));
  EXPECT_EQ(full.target_tokens(), 3);  // the HF shift never scores position 0
  const Batch end = collate(seqs, 3, 0, Truncation::keep_end, &scored);
  EXPECT_EQ(end.input_ids, (std::vector<std::int64_t>{7, 8, 9, 1, 2, 0}));
  EXPECT_EQ(end.labels, (std::vector<std::int64_t>{7, 8, -100, 1, 2, -100}));
  const Batch start = collate(seqs, 3, 0, Truncation::keep_start, &scored);
  EXPECT_EQ(start.labels, (std::vector<std::int64_t>{-100, -100, 7, 1, 2, -100}));
}

TEST(SftData, BadRecordsNameTheLine) {
  TempDir d("bad");
  const auto tok = byte_chat_tokenizer();
  const auto write = [&](const std::string& body) {
    std::ofstream((d.p / "data.jsonl").string()) << body;
    return (d.p / "data.jsonl").string();
  };
  const auto error_of = [&](const std::string& body, const tokenizer::Tokenizer& t) -> std::string {
    try {
      (void)load_sft_dataset({write(body)}, t, {});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("{\"text\": \"ok\"}\n{\"prompt\": \"no completion\"}\n", tok).find("line 2"), std::string::npos);
  EXPECT_NE(error_of("{\"text\": \"ok\"}\n\n{\"prompt\": \"a\", \"completion\": [1]}\n", tok).find("line 3"),
            std::string::npos);
  EXPECT_NE(error_of("{\"nothing\": 1}\n", tok).find("expected \"text\""), std::string::npos);
  const std::string no_template =
      error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", tokenizer::byte_level_tokenizer());
  EXPECT_NE(no_template.find("chat template"), std::string::npos) << no_template;
  EXPECT_NE(error_of("{\"text\": \"ok\"\n", tok).find("line 1"), std::string::npos);
}

// SFT through the trainer: one epoch's targets are exactly the scored tokens after each
// record's first, and the loss falls on a small memorisation task.
TEST(SftData, TheTrainerCountsOnlyScoredTargets) {
  TempDir d("trainer");
  const auto tok = byte_chat_tokenizer();
  std::vector<std::string> lines;
  for (int i = 0; i < 8; ++i)
    lines.push_back(ojson{{"messages",
                           {{{"role", "user"}, {"content", "count " + std::to_string(i)}},
                            {{"role", "assistant"}, {"content", std::to_string(i) + " " + std::to_string(i + 1)}}}}}
                        .dump());
  {
    std::ofstream out((d.p / "chat.jsonl").string());
    for (const auto& l : lines) out << l << "\n";
  }
  tok.save(d.p.string());  // tokenizer.json and tokenizer_config.json (the template)
  const TokenDataset ds = load_sft_dataset({(d.p / "chat.jsonl").string()}, tok, {});
  std::int64_t want = 0;
  for (std::int64_t i = 0; i < ds.size(); ++i) {
    const auto m = ds.scored(i);
    for (std::size_t t = 1; t < m.size(); ++t) want += m[t];
  }
  ojson args = {{"trainer", "sft"},
                {"model", {{"vocab_size", 259}, {"hidden_size", 32}, {"intermediate_size", 64},
                           {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"max_position_embeddings", 64}}},
                {"tokenizer", d.p.string()},
                {"train_data", (d.p / "chat.jsonl").string()},
                {"save_directory", (d.p / "run").string()},
                {"total_batch_size", 4},
                {"max_sequence_length", 64},
                {"num_train_epochs", 10},
                {"learning_rate", 1e-2},
                {"log_steps", 1},
                {"progress", false},
                {"write_report", false},
                {"peak_gflops", 100},
                {"sharding_axis_dims", {1, 1, 1, 1}}};
  Trainer t(TrainingArguments::from_json(args));
  const auto r = t.train();
  EXPECT_EQ(t.state().tokens_seen, 10 * want);
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);

  // The same run on a 2-device fsdp mesh: the same losses within f32 rounding.
  args["sharding_axis_dims"] = {1, 2, 1, 1};
  args["save_directory"] = (d.p / "run_fsdp2").string();
  Trainer tm(TrainingArguments::from_json(args));
  EXPECT_EQ(tm.mesh_devices(), 2);
  const auto rm = tm.train();
  EXPECT_EQ(tm.state().tokens_seen, 10 * want);
  EXPECT_NEAR(rm.first_loss, r.first_loss, 1e-5 * r.first_loss);
  EXPECT_NEAR(rm.final_loss, r.final_loss, 1e-4 * r.final_loss);
}

namespace {

/// Eight conversations of different lengths, their SFT dataset and a tiny random model.
struct Records {
  TempDir d{"packing"};
  tokenizer::Tokenizer tok = byte_chat_tokenizer();
  TokenDataset ds;
  Records() {
    std::ofstream out((d.p / "chat.jsonl").string());
    for (int i = 0; i < 8; ++i)
      out << ojson{{"messages",
                    {{{"role", "user"}, {"content", "count " + std::string(static_cast<std::size_t>(i), '+')}},
                     {{"role", "assistant"}, {"content", std::to_string(i) + " " + std::to_string(i * 7)}}}}}
                 .dump()
          << "\n";
    out.close();
    ds = load_sft_dataset({(d.p / "chat.jsonl").string()}, tok, {});
  }
};

models::LlamaForCausalLM<> tiny_model() {
  models::LlamaConfig c;
  c.vocab_size = 259;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 512;
  models::LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(5), 0.2f);
  return m;
}

std::vector<float> grads_of(models::LlamaForCausalLM<>& m) {
  std::vector<float> g;
  m.visit_params("", [&](std::string_view, auto& p) { g.insert(g.end(), p.grad_data(), p.grad_data() + p.numel()); });
  return g;
}

}  // namespace

// Packing: each document of a packed row gets exactly the logits it has alone (attention never
// crosses a document, positions restart), so the packed dataset's summed loss is the records'.
TEST(SftData, PackedRowsGiveEachRecordItsOwnLogits) {
  Records r;
  auto m = tiny_model();
  const TokenDataset packed = pack_documents(r.ds, 200);
  ASSERT_LE(packed.size(), r.ds.size() / 2);
  const std::int64_t V = m.config().vocab_size;
  double alone_sum = 0, packed_sum = 0;
  std::int64_t alone_n = 0, packed_n = 0;
  nn::LossOptions lo;
  lo.normalizer = 1.0;  // sums
  for (std::int64_t i = 0; i < r.ds.size(); ++i) {
    const std::int64_t row[] = {i};
    const Batch b = collate_rows(r.ds, row, 512, 0);
    const auto l = guarded_causal_lm_loss(m, b, lo, false);
    alone_sum += l.loss;
    alone_n += l.tokens;
  }
  int documents = 0;
  for (std::int64_t p = 0; p < packed.size(); ++p) {
    const std::int64_t row[] = {p};
    const Batch b = collate_rows(packed, row, 512, 0);
    const auto l = guarded_causal_lm_loss(m, b, lo, false);
    packed_sum += l.loss;
    packed_n += l.tokens;
    std::vector<float> logits(static_cast<std::size_t>(b.seq * V));
    m.logits(b.input_ids.data(), b.layout(), logits.data());
    // Each document against the record it came from, alone.
    const auto starts = packed.document_starts(p);
    for (std::int64_t s0 = 0; s0 < b.seq; ++s0) {
      if (!starts[static_cast<std::size_t>(s0)]) continue;
      std::int64_t s1 = s0 + 1;
      while (s1 < b.seq && !starts[static_cast<std::size_t>(s1)]) ++s1;
      std::vector<std::int64_t> doc(b.input_ids.begin() + s0, b.input_ids.begin() + s1);
      std::vector<float> alone(static_cast<std::size_t>((s1 - s0) * V));
      m.logits(doc.data(), nn::TokenLayout{1, s1 - s0}, alone.data());
      for (std::size_t k = 0; k < alone.size(); ++k)
        ASSERT_NEAR(logits[static_cast<std::size_t>(s0 * V) + k], alone[k], 2e-5) << "row " << p << " doc at " << s0;
      ++documents;
    }
  }
  EXPECT_EQ(documents, r.ds.size());
  EXPECT_EQ(packed_n, alone_n);
  EXPECT_NEAR(packed_sum, alone_sum, 1e-5 * alone_sum);
}

// Padding-free: a micro-batch as one row of its sequences gives the padded batch's loss and
// gradients (within f32 rounding).
TEST(SftData, PaddingFreeBatchesEqualPaddedOnes) {
  Records r;
  auto padded_m = tiny_model(), free_m = tiny_model();
  const std::vector<std::int64_t> rows = {0, 3, 5, 7};
  const Batch padded = collate_rows(r.ds, rows, 512, 0);
  const Batch flat = collate_rows(r.ds, rows, 512, 0, Truncation::keep_end, /*padding_free=*/true);
  EXPECT_EQ(flat.batch, 1);
  EXPECT_LT(flat.seq, padded.batch * padded.seq);
  nn::LossOptions lo;
  lo.normalizer = static_cast<double>(padded.target_tokens());
  nn::zero_grad(padded_m);
  nn::zero_grad(free_m);
  const auto a = guarded_causal_lm_loss(padded_m, padded, lo, true);
  const auto b = guarded_causal_lm_loss(free_m, flat, lo, true);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * a.loss);
  const auto ga = grads_of(padded_m), gb = grads_of(free_m);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    num += (ga[i] - gb[i]) * (ga[i] - gb[i]);
    den += ga[i] * ga[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-4);
}

// Through the trainer: packing counts the same targets per epoch (every record's scored tokens
// after its first) in fewer rows, and the loss falls; padding_free gives the padded run's
// first loss; packing on a 2-device fsdp mesh gives the one-device losses.
TEST(SftData, TheTrainerPacksRecords) {
  Records r;
  r.tok.save(r.d.p.string());
  ojson args = {{"trainer", "sft"}, {"packing", true},
                {"model", {{"vocab_size", 259}, {"hidden_size", 32}, {"intermediate_size", 64},
                           {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"max_position_embeddings", 256}}},
                {"tokenizer", r.d.p.string()}, {"train_data", (r.d.p / "chat.jsonl").string()},
                {"save_directory", (r.d.p / "packed").string()}, {"total_batch_size", 2},
                {"max_sequence_length", 256}, {"num_train_epochs", 40}, {"learning_rate", 1e-2}, {"log_steps", 1},
                {"progress", false}, {"write_report", false}, {"peak_gflops", 100},
                {"shuffle_train_dataset", false}, {"sharding_axis_dims", {1, 1, 1, 1}}};
  Trainer packed(TrainingArguments::from_json(args));
  const TokenDataset& rows = packed.train_dataset();
  EXPECT_EQ(rows.size(), pack_documents(r.ds, 256).size());
  ASSERT_LE(rows.size(), r.ds.size() / 2);
  // An epoch visits the first 2 * (rows / 2) rows; their targets are the scored tokens that
  // do not start a document.
  std::int64_t want = 0;
  for (std::int64_t i = 0; i < rows.size() / 2 * 2; ++i) {
    const auto m = rows.scored(i), st = rows.document_starts(i);
    for (std::size_t t = 1; t < m.size(); ++t) want += m[t] && !st[t];
  }
  const auto rp = packed.train();
  EXPECT_EQ(packed.state().tokens_seen, 40 * want);
  EXPECT_LT(rp.final_loss, 0.6 * rp.first_loss);

  args["sharding_axis_dims"] = {1, 2, 1, 1};
  args["save_directory"] = (r.d.p / "packed_fsdp2").string();
  Trainer mesh(TrainingArguments::from_json(args));
  const auto rm = mesh.train();
  EXPECT_NEAR(rm.first_loss, rp.first_loss, 1e-5 * rp.first_loss);
  EXPECT_NEAR(rm.final_loss, rp.final_loss, 1e-3 * rp.final_loss);

  args["packing"] = false;
  args["sharding_axis_dims"] = {1, 1, 1, 1};
  args["total_batch_size"] = 4;
  args["max_training_steps"] = 3;
  args["save_directory"] = (r.d.p / "padded").string();
  const auto padded = Trainer(TrainingArguments::from_json(args)).train();
  args["padding_free"] = true;
  args["save_directory"] = (r.d.p / "padding_free").string();
  const auto flat = Trainer(TrainingArguments::from_json(args)).train();
  EXPECT_NEAR(flat.first_loss, padded.first_loss, 1e-5 * padded.first_loss);
  EXPECT_NEAR(flat.final_loss, padded.final_loss, 1e-4 * padded.final_loss);
  args["packing"] = true;  // both: refused
  EXPECT_THROW(TrainingArguments::from_json(args).validate(), Error);
}

}  // namespace edl::train
