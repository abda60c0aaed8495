// examples/cli/chat.hpp: `edl chat`, a conversation with a model in the terminal.
//
//   edl chat --model DIR [--system TEXT] [--max-new-tokens N] [--greedy | --temperature T ...]
//            [--threads T] [--adapter DIR]
//
// Each line you type is a user turn; the conversation is rendered with the model's chat
// template (tokenizer_config.json) and the reply streams as it is generated, character by
// character as the tokens complete them. /reset starts over, /exit (or Ctrl-D) leaves, and
// Ctrl-C stops the reply being written, not the program. Line editing and history come from
// libedit when the build found it (plain lines otherwise). Reading from a pipe works too: one
// turn per line, replies printed as they stream. The KV cache is kept between turns
// (generate::PrefixCachedGenerator): a turn prefills only what follows the conversation so far.
#pragma once

#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <edl/chat/conversation.hpp>
#include <edl/generate/prefix_cached_generator.hpp>
#include <edl/tokenizer/tokenizer.hpp>
#include "generate.hpp"

#ifdef EDL_CLI_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

namespace edl::cli {

namespace chat_detail {

inline std::atomic<bool> interrupted{false};

/// A reply stopped by Ctrl-C unwinds out of generation through this.
struct Interrupted {};

inline bool read_line(const char* prompt, bool interactive, std::string& line) {
#ifdef EDL_CLI_HAVE_LIBEDIT
  if (interactive) {
    char* s = readline(prompt);
    if (!s) return false;
    line = s;
    if (*s) add_history(s);
    std::free(s);
    return true;
  }
#endif
  if (interactive) std::fputs(prompt, stdout), std::fflush(stdout);
  return static_cast<bool>(std::getline(std::cin, line));
}

}  // namespace chat_detail

inline int cmd_chat(Args& args) {
  const AdapterFlags af = adapter_flags(args, args.required("--model"), "chat");
  const std::string dir = af.model, system = args.str("--system", "");
  const std::int64_t threads = args.integer("--threads", 0);
  const std::filesystem::path d(dir);
  EDL_CHECK(std::filesystem::is_directory(d), errc::io, "--model " + dir, "not a directory");
  const auto cfg = models::LlamaConfig::from_file((d / "config.json").string());
  generate::GenerationConfig g = generate::GenerationConfig::from_folder(d, cfg);
  gen_detail::sampling_flags(args, g, "edl chat");
  args.finish();
  g.validate("edl chat");
  if (threads > 0) exec::set_num_threads(static_cast<int>(threads));
  const auto tok = tokenizer::Tokenizer::from_file(dir);
  const chat::ChatTemplate chat_template = chat::chat_template_of(tok, "edl chat --model " + dir);
  gen_detail::stop_at_tokenizer_eos(g, tok);
  auto model = gen_detail::load_model(dir);
  apply_adapter(model, af);
  generate::PrefixCachedGenerator<> conversation(model);

  const bool interactive = ::isatty(STDIN_FILENO) != 0;
  std::signal(SIGINT, [](int) { chat_detail::interrupted = true; });
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  auto reset = [&] {
    messages = nlohmann::ordered_json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  };
  reset();
  if (interactive) std::fprintf(stderr, "edl chat: %s (/reset starts over, /exit or Ctrl-D leaves, Ctrl-C stops a reply)\n", dir.c_str());
  std::string line;
  while (chat_detail::read_line("> ", interactive, line)) {
    chat_detail::interrupted = false;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      continue;
    }
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const auto prompt = tok.encode(chat::render_conversation(chat_template, tok, messages, {.add_generation_prompt = true}));
    tokenizer::StreamDecoder stream(tok, /*skip_special_tokens=*/true);
    std::string reply;
    generate::GenerateOptions o;
    o.on_token = [&](std::int64_t, std::int64_t id) {
      if (chat_detail::interrupted) throw chat_detail::Interrupted{};
      const std::string piece = stream.step(id);
      reply += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    };
    try {
      conversation.generate(prompt, g, o);
    } catch (const chat_detail::Interrupted&) {
      std::fputs(" [stopped]", stdout);
    }
    std::fputs("\n", stdout);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

inline Command chat_command() {
  return {.name = "chat",
          .group = "models",
          .summary = "talk with a model in the terminal (its chat template; replies stream; not JSON)",
          .synopsis = "--model DIR [--system TEXT] [--max-new-tokens N] [--greedy | --temperature T ...] [flags]",
          .flags = flags({{text_flag("--model", "DIR", "an HF folder with tokenizer.json and a chat template").required(),
                           text_flag("--system", "TEXT", "a system message opening the conversation"),
                           integer_flag("--threads", "T", "threads of the kernels").defaults("all cores")},
                          gen_detail::declare_sampling_flags(),
                          declare_adapter_flags()}),
          .examples = {"edl chat --model Qwen3-0.6B --system \"Answer briefly.\"",
                       "printf 'hello\\n' | edl chat --model ckpt --greedy --max-new-tokens 16"},
          .run = cmd_chat};
}

}  // namespace edl::cli
