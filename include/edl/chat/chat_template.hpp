// edl/chat/chat_template.hpp
// A model's chat template (tokenizer_config.json "chat_template") applied to a conversation,
// producing the same prompt text as transformers' tokenizer.apply_chat_template(...,
// tokenize=False).
//
// The variables match what transformers passes: `messages`, `tools` (None when absent, so
// `tools is defined` holds as in Python), `documents` (None), `add_generation_prompt`, the
// special tokens that are set, then any extra keys (enable_thinking, date_string, ...), which
// override earlier ones. The globals `raise_exception(msg)` (an edl::Error carrying msg) and
// `strftime_now(fmt)` (local time, like datetime.now().strftime) are provided as transformers
// does.
//
//   edl::chat::ChatTemplate tmpl(config["chat_template"].get<std::string>());
//   edl::chat::ChatOptions opts;
//   opts.add_generation_prompt = true;
//   opts.bos_token = "<|begin_of_text|>";
//   std::string prompt = tmpl.apply(messages, opts);
#pragma once

#include <edl/chat/jinja.hpp>
#include <edl/core/error.hpp>

#include <nlohmann/json.hpp>

#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace edl::chat {

struct ChatOptions {
  bool add_generation_prompt = false;
  /// JSON tool schemas (an array); unset passes `tools = None` as transformers does.
  std::optional<nlohmann::ordered_json> tools;
  /// Unset tokens are left undefined, as transformers leaves out special tokens a tokenizer
  /// does not have (Qwen3 has no bos_token, and its template may test `bos_token is defined`).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  /// Further variables (a JSON object): enable_thinking, date_string, builtin_tools, ...
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  /// Parses the template once; a template that does not parse is an edl::Error here.
  explicit ChatTemplate(std::string_view source) : source_(source), tmpl_(source) {}

  const std::string& source() const { return source_; }

  /// Renders the conversation `messages` (a JSON array of message objects).
  std::string apply(const nlohmann::ordered_json& messages, const ChatOptions& opts = {}) const {
    EDL_CHECK(messages.is_array(), errc::invalid_argument, "chat.apply", "messages must be a JSON array, got ",
              messages.type_name());
    EDL_CHECK(opts.extra.is_object() || opts.extra.is_null(), errc::invalid_argument, "chat.apply",
              "ChatOptions::extra must be a JSON object, got ", opts.extra.type_name());
    using jinja::Value;
    jinja::Context vars;
    vars.emplace_back("messages", jinja::from_json(messages));
    vars.emplace_back("tools", opts.tools ? jinja::from_json(*opts.tools) : Value(nullptr));
    vars.emplace_back("documents", Value(nullptr));
    vars.emplace_back("add_generation_prompt", Value(opts.add_generation_prompt));
    if (opts.bos_token) vars.emplace_back("bos_token", Value(*opts.bos_token));
    if (opts.eos_token) vars.emplace_back("eos_token", Value(*opts.eos_token));
    if (opts.extra.is_object())
      for (auto it = opts.extra.begin(); it != opts.extra.end(); ++it)
        vars.emplace_back(it.key(), jinja::from_json(it.value()));
    return tmpl_.render(vars, globals());
  }

 private:
  std::string source_;
  jinja::Template tmpl_;

  static jinja::Context globals() {
    using jinja::Args;
    using jinja::Value;
    jinja::Context g;
    g.emplace_back("raise_exception", jinja::make_function("raise_exception", [](Args& a) -> Value {
      std::string msg = a.pos.empty() ? (a.kw.empty() ? "" : jinja::to_str(a.kw[0].second)) : jinja::to_str(a.pos[0]);
      jinja::detail::fail(jinja::detail::RenderFailure::raised, msg);
    }));
    g.emplace_back("strftime_now", jinja::make_function("strftime_now", [](Args& a) -> Value {
      Value fmt = a.get(0, "format");
      a.check("strftime_now", 1);
      if (!fmt.is_string()) jinja::detail::type_error("strftime_now() argument must be str");
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      if (fmt.str().empty()) return Value("");
      for (std::size_t cap = 256; cap <= 65536; cap *= 4) {
        std::string buf(cap, '\0');
        std::size_t n = std::strftime(buf.data(), cap, fmt.str().c_str(), &tm);
        if (n > 0) return Value(buf.substr(0, n));
      }
      return Value("");
    }));
    return g;
  }
};

}  // namespace edl::chat
