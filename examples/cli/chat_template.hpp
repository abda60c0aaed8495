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

}  // namespace edl::cli
