// edl/chat/conversation.hpp
// A conversation rendered with a tokenizer's own chat template, as transformers'
// tokenizer.apply_chat_template(conversation, tokenize=False) does:
//
//   auto tok = tokenizer::Tokenizer::from_file("Qwen3-0.6B");
//   std::string prompt = chat::render_conversation(tok, messages, {.add_generation_prompt = true});
//   auto ids = tok.encode(prompt);   // no add_special_tokens: the template wrote BOS if the model wants one
//
// `conversation` is a JSON array of messages, or an object {"messages": [...], "tools": [...],
// other keys...}: the other keys become template variables (enable_thinking, date_string, ...).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include <edl/chat/chat_template.hpp>
#include <edl/core/error.hpp>
#include <edl/io/json.hpp>
#include <edl/io/mmap.hpp>
#include <edl/tokenizer/tokenizer.hpp>

namespace edl::chat {

struct ConversationOptions {
  bool add_generation_prompt = false;
};

/// Messages, tools and extra variables of a conversation document (array or object).
inline ChatOptions options_of(const nlohmann::ordered_json& conversation, nlohmann::ordered_json& messages,
                              const std::string& where) {
  ChatOptions o;
  if (conversation.is_array()) {
    messages = conversation;
    return o;
  }
  EDL_CHECK(conversation.is_object() && conversation.contains("messages") && conversation["messages"].is_array(),
            errc::invalid_argument, where, "expected a JSON array of messages or an object with a \"messages\" array; found ",
            conversation.dump().substr(0, 120));
  for (auto it = conversation.begin(); it != conversation.end(); ++it) {
    if (it.key() == "messages") messages = it.value();
    else if (it.key() == "tools" && !it.value().is_null()) o.tools = it.value();
    else o.extra[it.key()] = it.value();
  }
  return o;
}

/// A conversation file: a JSON array of messages or an object with "messages".
inline nlohmann::ordered_json read_conversation(const std::string& path) {
  const nlohmann::ordered_json j = io::parse_json(io::read_text_file(path), path);
  EDL_CHECK(j.is_array() || (j.is_object() && j.contains("messages")), errc::invalid_argument, path,
            "expected a JSON array of messages or an object with a \"messages\" array");
  return j;
}

/// tok's chat_template (tokenizer_config.json), parsed; an error when the tokenizer has none.
inline ChatTemplate chat_template_of(const tokenizer::Tokenizer& tok, const std::string& where = "chat template") {
  EDL_CHECK(tok.chat_template().has_value(), errc::invalid_argument, where,
            "the tokenizer has no chat_template (tokenizer_config.json has no \"chat_template\")");
  return ChatTemplate(*tok.chat_template());
}

/// Renders `conversation` with `tmpl` (parsed once by the caller that renders many) and tok's
/// bos/eos tokens.
inline std::string render_conversation(const ChatTemplate& tmpl, const tokenizer::Tokenizer& tok,
                                       const nlohmann::ordered_json& conversation, ConversationOptions opts = {},
                                       const std::string& where = "chat template") {
  nlohmann::ordered_json messages;
  ChatOptions o = options_of(conversation, messages, where);
  for (std::size_t i = 0; i < messages.size(); ++i)
    EDL_CHECK(messages[i].is_object() && messages[i].contains("role"), errc::invalid_argument,
              where + " messages[" + std::to_string(i) + "]", "a message is an object with a \"role\"; found ",
              messages[i].dump().substr(0, 120));
  o.add_generation_prompt = opts.add_generation_prompt;
  o.bos_token = tok.bos_token();
  o.eos_token = tok.eos_token();
  return tmpl.apply(messages, o);
}

/// Renders `conversation` with tok's chat_template.
inline std::string render_conversation(const tokenizer::Tokenizer& tok, const nlohmann::ordered_json& conversation,
                                       ConversationOptions opts = {}, const std::string& where = "chat template") {
  return render_conversation(chat_template_of(tok, where), tok, conversation, opts, where);
}

}  // namespace edl::chat
