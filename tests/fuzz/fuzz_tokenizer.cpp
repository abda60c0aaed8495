// edl_fuzz_tokenizer: an input starting with '{' is a tokenizer.json: loaded, then a fixed text
// encoded and decoded. Any other input is text: encoded with a real byte-level BPE tokenizer
// (the seed corpus's), its ids decoded, and the same for the ids read from the input's bytes.
#include <vector>

#include <edl/tokenizer/tokenizer.hpp>

#include "fuzz_target.hpp"

namespace {

const edl::tokenizer::Tokenizer& fixed() {
  static const auto t = edl::tokenizer::Tokenizer::from_file(EDL_FUZZ_TOKENIZER_JSON);
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto text = edl::fuzz::text_of(data, size);
  if (!text.empty() && text.front() == '{') {
    edl::fuzz::expect_load_or_error([&] {
      const auto t = edl::tokenizer::Tokenizer::from_text(std::string(text));
      const auto ids = t.encode("Hello, world! 12345 \xC3\xA9\xE4\xB8\xAD <s> </s>", true);
      (void)t.decode(ids, false);
      (void)t.decode(ids, true);
    });
    return 0;
  }
  const auto& t = fixed();
  edl::fuzz::expect_load_or_error([&] {
    const auto ids = t.encode(text, true);
    (void)t.decode(ids, false);
  });
  edl::fuzz::expect_load_or_error([&] {
    std::vector<std::int64_t> ids;
    for (std::size_t i = 0; i + 1 < size; i += 2) ids.push_back(static_cast<std::int64_t>(data[i]) << 8 | data[i + 1]);
    (void)t.decode(ids, true);
  });
  return 0;
}
