// edl_fuzz_chat_template: a chat template (Jinja) parsed, then rendered with a conversation
// of each role, tools and a generation prompt.
#include <nlohmann/json.hpp>

#include <edl/chat/chat_template.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi <b>there</b>"},
    {"role": "assistant", "content": "Hello.", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": [{"type": "text", "text": "and?"}]}])");
  static const auto tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}])");
  edl::fuzz::expect_load_or_error([&] {
    const edl::chat::ChatTemplate t(edl::fuzz::text_of(data, size));
    edl::chat::ChatOptions o;
    o.add_generation_prompt = true;
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    o.tools = tools;
    (void)t.apply(messages, o);
  });
  return 0;
}
