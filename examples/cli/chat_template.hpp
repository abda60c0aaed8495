// examples/cli/chat_template.hpp: `edl chat-template` prints a conversation rendered with a
// tokenizer's chat template, exactly (no JSON around it: the prompt is the output).
//
//   edl chat-template --tokenizer DIR --messages M.json [--add-generation-prompt]
//
// M.json: a JSON array of messages, or {"messages": [...], "tools": [...], other variables}
// (chat/conversation.hpp).
#pragma once

#include <iostream>
#include <string>

#include <edl/chat/conversation.hpp>
#include <edl/tokenizer/tokenizer.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_chat_template(Args& args) {
  const std::string path = args.required("--tokenizer"), messages = args.required("--messages");
  const bool gen = args.has("--add-generation-prompt");
  args.finish();
  const auto tok = tokenizer::Tokenizer::from_file(path);
  const auto conversation = chat::read_conversation(messages);
  std::cout << chat::render_conversation(tok, conversation, {.add_generation_prompt = gen}, "--messages " + messages);
  return 0;
}

inline Command chat_template_command() {
  return {.name = "chat-template",
          .group = "tokenizers",
          .summary = "print a conversation rendered with a tokenizer's chat template, exactly",
          .synopsis = "--tokenizer DIR --messages M.json [--add-generation-prompt]",
          .flags = {text_flag("--tokenizer", "DIR", "a folder with tokenizer.json and tokenizer_config.json").required(),
                    text_flag("--messages", "M.json", "an array of messages, or {\"messages\", \"tools\", ...}").required(),
                    switch_flag("--add-generation-prompt", "end with the template's prompt for the assistant's turn")},
          .examples = {"edl chat-template --tokenizer Qwen3-0.6B --messages chat.json --add-generation-prompt"},
          .run = cmd_chat_template};
}

}  // namespace edl::cli
