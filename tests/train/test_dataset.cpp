// Tests for edl/train/dataset.hpp: every source format, packing with eos, the per-epoch order
// (deterministic, a permutation, different per epoch) and collate (padding, mask, labels,
// truncation modes).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <edl/io/npy.hpp>
#include <edl/tokenizer/bpe_trainer.hpp>
#include <edl/train/dataset.hpp>
#include "../support/temp_dir.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;

struct TempDir : test_support::TempDir {
  explicit TempDir(const std::string& name) : test_support::TempDir("ds_" + name) {}
};

std::vector<std::int32_t> seq(const TokenDataset& d, std::int64_t i) {
  auto s = d[i];
  return {s.begin(), s.end()};
}

TEST(Dataset, FortuneFilesArePackedWithEos) {
  TempDir t("fortune");
  const auto f = t.file("fortunes", "ab\n%\ncd\r\n%\n%\nxyz\n");
  auto docs = read_text_documents(f);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "ab\n");
  EXPECT_EQ(docs[1], "cd\r\n");
  EXPECT_EQ(docs[2], "xyz\n");
  const auto tok = tokenizer::byte_level_tokenizer();
  auto d = load_dataset({f}, &tok, {4, 257, 259});
  // stream: a b \n 257 c d \r \n 257 x y z \n 257  (14 tokens) -> pieces of 4, 4, 4, 2
  ASSERT_EQ(d.size(), 4);
  EXPECT_EQ(seq(d, 0), (std::vector<std::int32_t>{'a', 'b', '\n', 257}));
  EXPECT_EQ(seq(d, 1), (std::vector<std::int32_t>{'c', 'd', '\r', '\n'}));
  EXPECT_EQ(seq(d, 3), (std::vector<std::int32_t>{'\n', 257}));
  // A file without "%" lines is one document.
  const auto g = t.file("plain.txt", "one\ntwo\n");
  EXPECT_EQ(read_text_documents(g).size(), 1u);
}

TEST(Dataset, ChatRecordsRenderWithTheTemplate) {
  TempDir t("chat");
  const auto j = t.file("c.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                                   "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n{\"text\": \"ok\"}\n");
  nlohmann::ordered_json config = {
      {"bos_token", "<s>"}, {"eos_token", "</s>"},
      {"chat_template", "{% for m in messages %}{{ bos_token + m['role'][0] + ':' + m['content'] + eos_token }}{% endfor %}"}};
  const auto base = tokenizer::byte_level_tokenizer();
  const auto tok = tokenizer::Tokenizer::from_text(base.to_text(), config);
  auto d = load_dataset({j}, &tok, {100, 257, 0});
  ASSERT_EQ(d.size(), 1);
  // "<s>u:hi</s><s>a:yo</s>" with <s> = 256 and </s> = 257 as single ids, then eos; then "ok", eos.
  EXPECT_EQ(seq(d, 0), (std::vector<std::int32_t>{256, 'u', ':', 'h', 'i', 257, 256, 'a', ':', 'y', 'o', 257, 257, 'o', 'k', 257}));
  // Without a template, a "messages" record is an error naming the line.
  try {
    load_dataset({j}, &base, {100, 257, 0});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.jsonl line 1"), std::string::npos) << e.what();
  }
}

TEST(Dataset, JsonLinesBinAndNpy) {
  TempDir t("formats");
  const auto j = t.file("d.jsonl", "{\"text\": \"hi\"}\n\n{\"text\": \"yo\", \"id\": 3}\n");
  const auto tok = tokenizer::byte_level_tokenizer();
  auto d = load_dataset({j}, &tok, {100, 257, 0});
  ASSERT_EQ(d.size(), 1);
  EXPECT_EQ(seq(d, 0), (std::vector<std::int32_t>{'h', 'i', 257, 'y', 'o', 257}));
  const auto bad = t.file("bad.jsonl", "{\"txt\": 1}\n");
  EXPECT_THROW(load_dataset({bad}, &tok, {100, 257, 0}), Error);

  // .bin: little-endian int32, cut into pieces.
  std::vector<std::int32_t> v = {1, 2, 3, 4, 5, 6, 7};
  std::ofstream(t.p / "s.bin", std::ios::binary).write(reinterpret_cast<const char*>(v.data()), 28);
  auto b = load_dataset({(t.p / "s.bin").string()}, nullptr, {3, -1, 0});
  ASSERT_EQ(b.size(), 3);
  EXPECT_EQ(seq(b, 2), (std::vector<std::int32_t>{7}));

  // .npy 2-D: rows as they are; 1-D: a stream.
  xt::xarray<std::int64_t> rows = {{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}};
  io::save_npy((t.p / "rows.npy").string(), rows);
  xt::xarray<std::int32_t> stream = {11, 12, 13, 14, 15};
  io::save_npy((t.p / "stream.npy").string(), stream);
  auto n = load_dataset({(t.p / "rows.npy").string(), (t.p / "stream.npy").string()}, nullptr, {2, -1, 100});
  ASSERT_EQ(n.size(), 5);
  EXPECT_EQ(seq(n, 0), (std::vector<std::int32_t>{1, 2, 3, 4, 5}));  // rows are not cut (collate truncates)
  EXPECT_EQ(seq(n, 2), (std::vector<std::int32_t>{11, 12}));
  EXPECT_EQ(seq(n, 4), (std::vector<std::int32_t>{15}));
  // Tokens beyond the vocabulary are an error.
  try {
    load_dataset({(t.p / "rows.npy").string()}, nullptr, {2, -1, 8});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
  EXPECT_THROW(load_dataset({(t.p / "missing.txt").string()}, &tok, {2, -1, 0}), Error);
}

TEST(Dataset, EpochOrderIsADeterministicPermutation) {
  const Key k = Key::from_seed(3);
  const auto a = epoch_order(100, k, 0, true);
  EXPECT_EQ(a, epoch_order(100, k, 0, true));
  EXPECT_NE(a, epoch_order(100, k, 1, true));
  EXPECT_NE(a, epoch_order(100, Key::from_seed(4), 0, true));
  EXPECT_EQ(std::set<std::int64_t>(a.begin(), a.end()).size(), 100u);
  EXPECT_EQ(*std::max_element(a.begin(), a.end()), 99);
  const auto id = epoch_order(5, k, 2, false);
  EXPECT_EQ(id, (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  // Fixed values: the order depends only on (key, epoch), on every machine.
  const auto small = epoch_order(6, Key::from_seed(0), 0, true);
  EXPECT_EQ(small, epoch_order(6, Key::from_seed(0), 0, true));
}

TEST(Dataset, CollatePadsAndTruncates) {
  std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6}, b = {7, 8};
  std::vector<std::span<const std::int32_t>> seqs = {a, b};
  auto end = collate(seqs, 4, 0, Truncation::keep_end);
  EXPECT_EQ(end.batch, 2);
  EXPECT_EQ(end.seq, 4);
  EXPECT_EQ(end.input_ids, (std::vector<std::int64_t>{3, 4, 5, 6, 7, 8, 0, 0}));
  EXPECT_EQ(end.attention_mask, (std::vector<std::int64_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(end.labels, (std::vector<std::int64_t>{3, 4, 5, 6, 7, 8, -100, -100}));
  EXPECT_EQ(end.target_tokens(), 3 + 1);
  auto start = collate(seqs, 4, 9, Truncation::keep_start);
  EXPECT_EQ(start.input_ids, (std::vector<std::int64_t>{1, 2, 3, 4, 7, 8, 9, 9}));
  // Pads to the longest sequence, not to max_length.
  std::vector<std::span<const std::int32_t>> short_seqs = {b, b};
  EXPECT_EQ(collate(short_seqs, 100, 0).seq, 2);
}

// Best-fit decreasing: longest first, each into the fullest row it fits; every document once,
// rows within max_length, documents marked.
TEST(Dataset, PackDocumentsBestFitDecreasing) {
  TokenDataset ds;
  const std::vector<std::int64_t> lengths = {5, 3, 4, 2, 6};
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    std::vector<std::int32_t> seq(static_cast<std::size_t>(lengths[i]), static_cast<std::int32_t>(10 * (i + 1)));
    ds.add(seq);
  }
  const TokenDataset p = pack_documents(ds, 8);
  ASSERT_EQ(p.size(), 3);
  // 6 -> new row 0; 5 -> new row 1; 4 fits neither (2, 3 left) -> row 2; 3 -> row 1; 2 -> row 0.
  const auto row = [&](std::int64_t r) { return std::vector<std::int32_t>(p[r].begin(), p[r].end()); };
  EXPECT_EQ(row(0), (std::vector<std::int32_t>{50, 50, 50, 50, 50, 50, 40, 40}));
  EXPECT_EQ(row(1), (std::vector<std::int32_t>{10, 10, 10, 10, 10, 20, 20, 20}));
  EXPECT_EQ(row(2), (std::vector<std::int32_t>{30, 30, 30, 30}));
  const auto st = p.document_starts(1);
  EXPECT_EQ(std::vector<std::uint8_t>(st.begin(), st.end()), (std::vector<std::uint8_t>{1, 0, 0, 0, 0, 1, 0, 0}));
  EXPECT_EQ(p.num_tokens(), ds.num_tokens());
  // A document longer than a row keeps its first max_length tokens.
  EXPECT_EQ(pack_documents(ds, 4).num_tokens(), 4 + 3 + 4 + 2 + 4);
}

// Packed rows collate to segment ids, positions restarting at each document, and no target
// at a document's first token; padding-free puts a batch's sequences side by side the same way.
TEST(Dataset, CollateKeepsDocumentsApart) {
  std::vector<std::int32_t> a = {1, 2, 3, 4, 5}, b = {6, 7};
  std::vector<std::uint8_t> a_starts = {1, 0, 1, 0, 0};
  const std::vector<std::span<const std::int32_t>> seqs = {a, b};
  const std::vector<std::span<const std::uint8_t>> starts = {a_starts, {}};
  const Batch x = collate(seqs, 8, 0, Truncation::keep_end, nullptr, &starts);
  EXPECT_EQ(x.segment_ids, (std::vector<std::int64_t>{1, 1, 2, 2, 2, 1, 1, 0, 0, 0}));
  EXPECT_EQ(x.position_ids, (std::vector<std::int64_t>{0, 1, 0, 1, 2, 0, 1, 0, 0, 0}));
  EXPECT_EQ(x.labels, (std::vector<std::int64_t>{1, 2, -100, 4, 5, 6, 7, -100, -100, -100}));
  EXPECT_EQ(x.layout().segment_ids, x.segment_ids.data());
  // Without starts: no segments, HF's layout.
  EXPECT_TRUE(collate(seqs, 8, 0).segment_ids.empty());
  EXPECT_EQ(collate(seqs, 8, 0).layout().position_ids, nullptr);

  const Batch f = collate_padding_free(seqs, 4, 0, Truncation::keep_start);
  EXPECT_EQ(f.batch, 1);
  EXPECT_EQ(f.input_ids, (std::vector<std::int64_t>{1, 2, 3, 4, 6, 7}));
  EXPECT_EQ(f.segment_ids, (std::vector<std::int64_t>{1, 1, 1, 1, 2, 2}));
  EXPECT_EQ(f.position_ids, (std::vector<std::int64_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(f.labels, (std::vector<std::int64_t>{1, 2, 3, 4, -100, 7}));
  EXPECT_EQ(f.target_tokens(), collate(seqs, 4, 0, Truncation::keep_start).target_tokens());
}

// A stream's documents end at eos: with boundaries each piece marks where the next one starts.
TEST(Dataset, StreamDocumentsStartAfterEos) {
  TokenDataset ds;
  ds.add_stream({5, 6, 0, 7, 0, 8, 9, 1}, 4, /*eos=*/0);
  ASSERT_EQ(ds.size(), 2);
  const auto s0 = ds.document_starts(0), s1 = ds.document_starts(1);
  EXPECT_EQ(std::vector<std::uint8_t>(s0.begin(), s0.end()), (std::vector<std::uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(std::vector<std::uint8_t>(s1.begin(), s1.end()), (std::vector<std::uint8_t>{1, 1, 0, 0}));
  TokenDataset plain;
  plain.add_stream({5, 6, 0, 7}, 4);
  EXPECT_TRUE(plain.document_starts(0).empty());
}

}  // namespace
}  // namespace edl::train
