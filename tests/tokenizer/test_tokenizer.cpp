// Tests for edl/tokenizer/tokenizer.hpp: the byte tokenizer, GPT-2 pre-tokenization, BPE training
// (determinism, exact round trips on arbitrary bytes and UTF-8), tokenizer.json save/load, and
// a tiny hand-written HF tokenizer.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <edl/core/rng.hpp>
#include <edl/tokenizer/tokenizer.hpp>

namespace edl::tokenizer {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::vector<std::string> corpus() {
  return {"the cat sat on the mat.\n", "The cat's hat is that hat!\n", "  indented   text\twith tabs\n",
          "héllo wörld, ça va? 日本語のテキスト\n", "numbers 12345 and 678 and 12345\n",
          "the the the cat cat mat mat hat\n"};
}

std::string random_bytes(std::uint32_t seed, std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(random_bits_at(Key::from_seed(seed), i) & 0xff);
  return s;
}

TEST(ByteTokenizer, IdsAreBytesThenSpecials) {
  ByteTokenizer t;
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.bos_id(), 256);
  EXPECT_EQ(t.eos_id(), 257);
  EXPECT_EQ(t.pad_id(), 258);
  const std::string text("A\xff\x00z", 4);
  EXPECT_EQ(t.encode(text), (std::vector<std::int64_t>{65, 255, 0, 122}));
  const std::string r = random_bytes(1, 1000);
  EXPECT_EQ(t.decode(t.encode(r)), r);
  EXPECT_EQ(t.decode(std::vector<std::int64_t>{104, 105, 257}), "hi");
  EXPECT_EQ(t.decode(std::vector<std::int64_t>{104, 257}, true), "h</s>");
}

TEST(Pretokenize, FollowsGpt2Pattern) {
  std::vector<std::string> p;
  detail::pretokenize("Hello world's  end 42x\n\nok", [&](std::string_view s) { p.emplace_back(s); });
  EXPECT_EQ(p, (std::vector<std::string>{"Hello", " world", "'s", " ", " end", " 42", "x", "\n", "\n", "ok"}));
  p.clear();
  // A whitespace run before a word leaves its last character to the word (\s+(?!\S)).
  detail::pretokenize("a!! b  ", [&](std::string_view s) { p.emplace_back(s); });
  EXPECT_EQ(p, (std::vector<std::string>{"a", "!!", " b", "  "}));
}

TEST(ByteLevelBPE, TrainIsDeterministicAndRoundTrips) {
  auto a = ByteLevelBPE::train(corpus(), 300);
  auto b = ByteLevelBPE::train(corpus(), 300);
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(a.vocab_size(), 300);
  EXPECT_EQ(a.num_merges(), 41u);
  // The most frequent pair of this corpus comes first: merges compress.
  for (const auto& doc : corpus()) {
    const auto ids = a.encode(doc);
    EXPECT_LT(ids.size(), doc.size());
    EXPECT_EQ(a.decode(ids), doc);
  }
  for (std::uint32_t seed = 0; seed < 5; ++seed) {
    const std::string r = random_bytes(seed, 2000);
    EXPECT_EQ(a.decode(a.encode(r)), r);
  }
  const std::string utf8 = "naïve café — 日本語 🙂";
  EXPECT_EQ(a.decode(a.encode(utf8)), utf8);
  // Specials keep their ids.
  EXPECT_EQ(a.eos_id(), 257);
}

TEST(ByteLevelBPE, SaveAndLoadGiveTheSameTokenizer) {
  auto a = ByteLevelBPE::train(corpus(), 320);
  const fs::path p = fs::temp_directory_path() / ("edl_tok_" + std::to_string(::getpid()) + ".json");
  a.save(p.string());
  auto b = ByteLevelBPE::from_file(p.string());
  EXPECT_EQ(b.to_json(), a.to_json());
  for (const auto& doc : corpus()) EXPECT_EQ(b.encode(doc), a.encode(doc));
  EXPECT_EQ(b.eos_id(), a.eos_id());
  // HF layout.
  const ojson j = a.to_json();
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["model"]["vocab"]["\xC4\xA0"], 32);  // "Ġ" is the space byte
  EXPECT_TRUE(j["model"]["merges"][0].is_string());
  fs::remove(p);
  // The byte tokenizer saves and loads too (as a BPE without merges).
  ByteTokenizer bt;
  auto c = ByteLevelBPE::from_json(bt.to_json());
  EXPECT_EQ(c.vocab_size(), 259);
  EXPECT_EQ(c.encode("xyz"), bt.encode("xyz"));
}

TEST(ByteLevelBPE, LoadsHandWrittenTokenizerJson) {
  const std::string text = R"({
    "version": "1.0",
    "added_tokens": [{"id": 9, "content": "<|endoftext|>", "special": true}],
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "add_prefix_space": false}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE",
              "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "he": 5, "ll": 6, "llo": 7, "hello": 8, "<|endoftext|>": 9},
              "merges": ["h e", ["l", "l"], "ll o", "he llo"]}})";
  auto t = ByteLevelBPE::from_json(ojson::parse(text), "hand.json");
  EXPECT_EQ(t.vocab_size(), 10);
  EXPECT_EQ(t.eos_id(), 9);
  EXPECT_EQ(t.encode("hello hello"), (std::vector<std::int64_t>{8, 4, 8}));
  EXPECT_EQ(t.encode("hole"), (std::vector<std::int64_t>{0, 3, 2, 1}));
  EXPECT_EQ(t.decode(std::vector<std::int64_t>{8, 4, 8, 9}), "hello hello");
  try {
    t.encode("x");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
  // Errors name the field.
  auto bad = ojson::parse(text);
  bad["model"]["type"] = "WordPiece";
  try {
    ByteLevelBPE::from_json(bad, "hand.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "hand.json field model.type");
  }
  bad = ojson::parse(text);
  bad["model"]["merges"].push_back("o q");
  try {
    ByteLevelBPE::from_json(bad, "hand.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "hand.json field model.merges");
  }
}

}  // namespace
}  // namespace edl::tokenizer
