// Tests for edl/tokenizer/bpe_trainer.hpp: the byte tokenizer, BPE training (determinism,
// exact round trips on UTF-8 text, the GPT-2 pre-tokenization it counts words with), and the
// tokenizer.json it writes read back through Tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <edl/core/rng.hpp>
#include <edl/tokenizer/bpe_trainer.hpp>

namespace edl::tokenizer {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> corpus() {
  return {"the cat sat on the mat.\n", "The cat's hat is that hat!\n", "  indented   text\twith tabs\n",
          "héllo wörld, ça va? 日本語のテキスト\n", "numbers 12345 and 678 and 12345\n",
          "the the the cat cat mat mat hat\n"};
}

/// Random valid UTF-8: code points from every plane but surrogates.
std::string random_text(std::uint32_t seed, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const auto bits = random_bits_at(Key::from_seed(seed), i);
    std::uint32_t cp = (bits & 3) == 0 ? bits % 0x80 : (bits & 3) == 1 ? bits % 0x800 : bits % 0x110000;
    if (cp >= 0xD800 && cp < 0xE000) cp = ' ';
    append_utf8(s, cp);
  }
  return s;
}

TEST(ByteTokenizer, IdsAreBytesThenSpecials) {
  const auto t = byte_level_tokenizer();
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.bos_id(), 256);
  EXPECT_EQ(t.eos_id(), 257);
  EXPECT_EQ(t.pad_id(), 258);
  const std::string text("A\xc3\xbf\x00z", 5);
  EXPECT_EQ(t.encode(text), (std::vector<std::int64_t>{65, 0xc3, 0xbf, 0, 122}));
  const std::string r = random_text(1, 1000);
  EXPECT_EQ(t.decode(t.encode(r)), r);
  EXPECT_EQ(t.decode(std::vector<std::int64_t>{104, 105, 257}, /*skip_special_tokens=*/true), "hi");
  EXPECT_EQ(t.decode(std::vector<std::int64_t>{104, 257}), "h</s>");
  // Special tokens written in the text are their ids.
  EXPECT_EQ(t.encode("a</s>"), (std::vector<std::int64_t>{97, 257}));
}

TEST(BpeTrainer, CountsWordsWithGpt2Pattern) {
  auto words = [](std::string_view text) {
    std::vector<std::string> p;
    for (auto [b, e] : PreTokenizer::gpt2_pattern("test")->find_all(text)) p.emplace_back(text.substr(b, e - b));
    return p;
  };
  EXPECT_EQ(words("Hello world's  end 42x\n\nok"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " end", " 42", "x", "\n", "\n", "ok"}));
  // A whitespace run before a word leaves its last character to the word (\s+(?!\S)).
  EXPECT_EQ(words("a!! b  "), (std::vector<std::string>{"a", "!!", " b", "  "}));
  // Unicode letters are letters (\p{L}), digits of other scripts numbers (\p{N}).
  EXPECT_EQ(words("naïve ΑΒΓ ٣٤"), (std::vector<std::string>{"naïve", " ΑΒΓ", " ٣٤"}));
}

TEST(BpeTrainer, TrainIsDeterministicAndRoundTrips) {
  auto a = train_byte_level_bpe(corpus(), 300);
  auto b = train_byte_level_bpe(corpus(), 300);
  EXPECT_EQ(a.to_text(), b.to_text());
  EXPECT_EQ(a.vocab_size(), 300);
  // The most frequent pair of this corpus comes first: merges compress.
  for (const auto& doc : corpus()) {
    const auto ids = a.encode(doc);
    EXPECT_LT(ids.size(), doc.size());
    EXPECT_EQ(a.decode(ids), doc);
  }
  for (std::uint32_t seed = 0; seed < 5; ++seed) {
    const std::string r = random_text(seed, 2000);
    EXPECT_EQ(a.decode(a.encode(r)), r);
  }
  EXPECT_EQ(a.eos_id(), 257);
}

TEST(BpeTrainer, SaveAndLoadGiveTheSameTokenizer) {
  auto a = train_byte_level_bpe(corpus(), 320);
  const fs::path dir = fs::temp_directory_path() / ("edl_tok_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  a.save(dir.string());
  auto b = Tokenizer::from_file(dir.string());
  EXPECT_EQ(b.to_text(), a.to_text());
  for (const auto& doc : corpus()) EXPECT_EQ(b.encode(doc), a.encode(doc));
  EXPECT_EQ(b.eos_id(), a.eos_id());
  // HF layout.
  const auto j = nlohmann::json::parse(a.to_text());
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["model"]["vocab"]["\xC4\xA0"], 32);  // "Ġ" is the space byte
  EXPECT_TRUE(j["model"]["merges"][0].is_string());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace edl::tokenizer
