// examples/cli/tokenize.hpp: the tokenizer of a model folder (or a tokenizer.json) from the
// command line.
//
//   edl tokenize   --tokenizer DIR|tokenizer.json (--text S | --text-file F) [--add-special-tokens]
//                  -> {"ids": [...]}   (special tokens written in the text are matched either way)
//   edl detokenize --tokenizer DIR|tokenizer.json --ids 1,2,3 [--skip-special-tokens]
//                  -> {"text": "..."}
//   edl bench tokenize --tokenizer DIR --text-file F [--repeat N]
//                  -> {"bytes", "tokens", "seconds", "mb_per_s", "tokens_per_s"} (median of N runs;
//                  invalid UTF-8 in F read as U+FFFD)
#pragma once

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/io/mmap.hpp>
#include <edl/tokenizer/tokenizer.hpp>
#include "args.hpp"
#include "generate.hpp"

namespace edl::cli {

namespace tokenize_detail {

inline std::string text_argument(Args& args, const std::string& command) {
  const bool text = args.has("--text"), file = args.has("--text-file");
  EDL_CLI_USAGE_CHECK(text != file, errc::invalid_argument, command, "give exactly one of --text S and --text-file F");
  return text ? args.str("--text", "") : io::read_text_file(args.str("--text-file", ""));
}

}  // namespace tokenize_detail

inline int cmd_tokenize(Args& args) {
  const std::string path = args.required("--tokenizer");
  const std::string text = tokenize_detail::text_argument(args, "edl tokenize");
  const bool special = args.has("--add-special-tokens");
  args.finish();
  const auto tok = tokenizer::Tokenizer::from_file(path);
  nlohmann::ordered_json j;
  j["ids"] = tok.encode(text, special);
  std::cout << j.dump() << "\n";
  return 0;
}

inline int cmd_detokenize(Args& args) {
  const std::string path = args.required("--tokenizer");
  const auto ids = gen_detail::parse_int_list(args.required("--ids"), "edl detokenize --ids");
  const bool skip = args.has("--skip-special-tokens");
  args.finish();
  const auto tok = tokenizer::Tokenizer::from_file(path);
  nlohmann::ordered_json j;
  j["text"] = tok.decode(ids, skip);
  std::cout << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return 0;
}

inline int cmd_bench_tokenize(Args& args) {
  const std::string path = args.required("--tokenizer");
  // A stray non-UTF-8 byte becomes U+FFFD, as Node's and Python's text readers do.
  const std::string text = tokenizer::utf8_lossy(io::read_text_file(args.required("--text-file")));
  const auto repeat = std::max<std::int64_t>(1, args.integer("--repeat", 3));
  args.finish();
  const auto tok = tokenizer::Tokenizer::from_file(path);
  std::size_t tokens = tok.encode(text).size();  // warm-up (and the word cache, as in real use)
  std::vector<double> seconds;
  for (std::int64_t r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    tokens = tok.encode(text).size();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double s = seconds[seconds.size() / 2];
  nlohmann::ordered_json j;
  j["bytes"] = text.size();
  j["tokens"] = tokens;
  j["seconds"] = s;
  j["mb_per_s"] = static_cast<double>(text.size()) / 1e6 / s;
  j["tokens_per_s"] = static_cast<double>(tokens) / s;
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command tokenize_command() {
  return {.name = "tokenize",
          .group = "tokenizers",
          .summary = "encode text with a tokenizer; prints {\"ids\": [...]}",
          .synopsis = "--tokenizer DIR|tokenizer.json (--text S | --text-file F) [--add-special-tokens]",
          .flags = {text_flag("--tokenizer", "DIR|tokenizer.json", "a model folder or its tokenizer.json").required(),
                    text_flag("--text", "S", "the text (or --text-file)"),
                    text_flag("--text-file", "F", "a file holding the text (or --text)"),
                    switch_flag("--add-special-tokens", "add the tokenizer's BOS/EOS (special tokens in the text match either way)")},
          .examples = {"edl tokenize --tokenizer Qwen3-0.6B --text \"Hello, world\""},
          .run = cmd_tokenize};
}

inline Command detokenize_command() {
  return {.name = "detokenize",
          .group = "tokenizers",
          .summary = "decode token ids with a tokenizer; prints {\"text\": \"...\"}",
          .synopsis = "--tokenizer DIR|tokenizer.json --ids 1,2,3 [--skip-special-tokens]",
          .flags = {text_flag("--tokenizer", "DIR|tokenizer.json", "a model folder or its tokenizer.json").required(),
                    text_flag("--ids", "1,2,3", "the token ids, comma-separated").required(),
                    switch_flag("--skip-special-tokens", "leave special tokens out of the text")},
          .examples = {"edl detokenize --tokenizer Qwen3-0.6B --ids 9707,11,1879"},
          .run = cmd_detokenize};
}

inline Command bench_tokenize_command() {
  return {.name = "bench tokenize",
          .group = "measuring",
          .summary = "time a tokenizer's encode of a file (MB/s, tokens/s; median of N runs)",
          .synopsis = "--tokenizer DIR --text-file F [--repeat N]",
          .flags = {text_flag("--tokenizer", "DIR|tokenizer.json", "a model folder or its tokenizer.json").required(),
                    text_flag("--text-file", "F", "the text encoded (invalid UTF-8 read as U+FFFD)").required(),
                    integer_flag("--repeat", "N", "timed encodes after a warm-up").defaults("3")},
          .examples = {"edl bench tokenize --tokenizer Qwen3-0.6B --text-file /usr/share/games/fortunes/fortunes"},
          .run = cmd_bench_tokenize};
}

}  // namespace edl::cli
