// tests/serve/test_stop_strings.cpp: stop strings end the text where they first appear, across
// piece boundaries, and nothing sent is ever cut afterwards.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <edl/serve/stop_strings.hpp>

using edl::serve::StopStrings;

namespace {

/// Feeds the pieces; returns what was sent and whether a stop string ended it.
std::pair<std::string, bool> run(std::vector<std::string> stops, const std::vector<std::string>& pieces) {
  StopStrings s(std::move(stops));
  std::string out;
  for (const auto& p : pieces) {
    const auto d = s.feed(p);
    out += d.text;
    if (d.stopped) return {out, true};
  }
  return {out + s.flush(), false};
}

/// The reference: the whole text cut before the earliest occurrence of any stop string.
std::pair<std::string, bool> cut(const std::vector<std::string>& stops, const std::string& text) {
  std::size_t first = std::string::npos;
  for (const auto& s : stops)
    if (!s.empty()) first = std::min(first, text.find(s));
  return first == std::string::npos ? std::make_pair(text, false) : std::make_pair(text.substr(0, first), true);
}

}  // namespace

TEST(StopStrings, MatchAcrossPiecesAndAreNotReturned) {
  EXPECT_EQ(run({"\n\n"}, {"Hello", "\n", "\nWorld"}), std::make_pair(std::string("Hello"), true));
  EXPECT_EQ(run({"User:"}, {"ok. Us", "e", "r: hi"}), std::make_pair(std::string("ok. "), true));
  EXPECT_EQ(run({"abc"}, {"ab", "ab", "c"}), std::make_pair(std::string("ab"), true));
  EXPECT_EQ(run({"xyz"}, {"ab", "xy"}), std::make_pair(std::string("abxy"), false));  // flushed at the end
  EXPECT_EQ(run({}, {"a", "b"}), std::make_pair(std::string("ab"), false));
  EXPECT_EQ(run({""}, {"a"}), std::make_pair(std::string("a"), false));  // an empty stop string never matches
}

TEST(StopStrings, HeldTextIsOnlyWhatCouldStillMatch) {
  StopStrings s({"END", "\n\n"});
  EXPECT_EQ(s.feed("done E").text, "done ");  // "E" may start END
  EXPECT_EQ(s.feed("x").text, "Ex");
  EXPECT_EQ(s.feed("\n").text, "");
  const auto d = s.feed("\nmore");
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(s.feed("after").text, "");  // nothing after a stop
}

TEST(StopStrings, EveryWayOfSplittingGivesTheCutOfTheWholeText) {
  const std::vector<std::string> stops = {"aab", "ba", "\xC3\xA9t"};  // "ét": multi-byte
  const std::vector<std::string> texts = {"xaaabyy", "abba", "caf\xC3\xA9t\xC3\xA9", "aaaaa", "b", "zzz"};
  for (const auto& text : texts) {
    // Every split into pieces at byte positions given by a bit mask.
    const std::size_t n = text.size();
    for (unsigned mask = 0; mask < (1u << (n - 1)); ++mask) {
      std::vector<std::string> pieces;
      std::string cur;
      for (std::size_t i = 0; i < n; ++i) {
        cur += text[i];
        if (i + 1 < n && (mask >> i & 1u)) pieces.push_back(std::move(cur)), cur.clear();
      }
      pieces.push_back(cur);
      EXPECT_EQ(run(stops, pieces), cut(stops, text)) << text << " mask " << mask;
    }
  }
}
