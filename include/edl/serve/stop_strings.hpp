// edl/serve/stop_strings.hpp
// Stop strings as OpenAI's API defines them: generation ends where one of them appears in the
// output text, matched across token boundaries, and the stop string is not returned.
//
//   StopStrings stop({"\n\n", "User:"});
//   auto d = stop.feed(piece);   // d.text: what may be sent now; d.stopped: a stop string ended it
//   auto rest = stop.flush();    // at the end of generation: the text held back
//
// Text is held back only while its tail could still become a stop string (a proper prefix of
// one), so a streamed reply never shows text that is later cut. Pieces are whole UTF-8
// characters (tokenizer::StreamDecoder's output) and a stop string starts with a whole
// character, so the text sent is cut at character boundaries only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace edl::serve {

class StopStrings {
 public:
  struct Delta {
    std::string text;      // text to send now
    bool stopped = false;  // a stop string matched: text ends right before it; send no more
  };

  StopStrings() = default;
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
    stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  }

  Delta feed(std::string_view piece) {
    Delta d;
    if (stopped_) return d;
    held_ += piece;
    // The earliest match in the held text (text sent before it cannot start a match: any
    // tail of it that could was held back).
    std::size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
      d.text = held_.substr(0, first);
      d.stopped = stopped_ = true;
      held_.clear();
      return d;
    }
    const std::size_t keep = longest_partial_tail();
    d.text = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return d;
  }

  /// The text held back, when generation ended for another reason.
  std::string flush() {
    std::string s;
    s.swap(held_);
    return s;
  }

  bool stopped() const noexcept { return stopped_; }

 private:
  /// Length of the longest tail of held_ that is a proper prefix of a stop string.
  std::size_t longest_partial_tail() const {
    std::size_t best = 0;
    for (const auto& s : stops_) {
      for (std::size_t k = std::min(s.size() - 1, held_.size()); k > best; --k)
        if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
          best = k;
          break;
        }
    }
    return best;
  }

  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace edl::serve
