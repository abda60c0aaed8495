// edl/serve/openai.hpp
// The OpenAI API's request and response bodies (docs/serving.md): a request parsed and checked
// into a CompletionRequest, error objects, and the JSON of answers and stream chunks.
//
//   auto r = parse_completion_request(body, Endpoint::chat, defaults);   // throws ApiError
//
// Request fields: model, messages (chat) / prompt (completions: a string, token ids, or a
// list of one of them), max_tokens and max_completion_tokens, temperature (0: greedy),
// top_p, top_k, min_p, seed, stop, presence_penalty, frequency_penalty, repetition_penalty,
// n, logprobs (+ top_logprobs for chat), stream, stream_options.include_usage, and vLLM's
// return_token_ids and ignore_eos. Fields a request leaves out take `defaults` (the model folder's
// generation_config.json). Unknown fields are ignored, as OpenAI's server does; a known field
// of the wrong type or out of range is a 400 naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/generate/generation_config.hpp>
#include <edl/io/json.hpp>
#include <edl/tokenizer/unicode.hpp>

namespace edl::serve {

using ojson = nlohmann::ordered_json;

/// An error the client gets as {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status_, std::string message, std::string type_ = "invalid_request_error", std::string param_ = {},
           std::string code_ = {})
      : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)),
        code(std::move(code_)) {}

  ojson body() const { return error_body(what(), type, param, code); }

  static ojson error_body(const std::string& message, const std::string& type, const std::string& param = {},
                          const std::string& code = {}) {
    ojson e;
    e["message"] = message;
    e["type"] = type;
    e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
    e["code"] = code.empty() ? ojson(nullptr) : ojson(code);
    return ojson{{"error", e}};
  }
};

enum class Endpoint { chat, completion };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::chat;
  std::optional<std::string> model;
  ojson messages;                     // chat: the messages array (and ojson tools when given)
  ojson chat_extra = ojson::object();  // chat: tools and chat_template_kwargs for the template
  std::optional<std::string> prompt_text;         // completions: text ...
  std::optional<std::vector<std::int64_t>> prompt_ids;  // ... or token ids
  std::optional<std::int64_t> max_tokens;        // unset: up to the context length
  generate::GenerationConfig g;                   // sampling fields; max_new_tokens set later
  bool seed_given = false;
  std::vector<std::string> stop;
  std::int64_t n = 1;
  int logprobs = -1;  // -1: none; else how many alternatives per token (0..20)
  bool stream = false, include_usage = false, return_token_ids = false;
};

namespace openai_detail {

/// Reads the typed fields of a request object, naming the field in every error.
class Fields {
 public:
  explicit Fields(const ojson& j) : j_(j) {}
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const ojson& at(const char* k) const { return j_[k]; }

  static ApiError invalid(const std::string& param, const std::string& why) {
    return ApiError(400, "'" + param + "': " + why, "invalid_request_error", param, "invalid_value");
  }
  double number(const char* k, double lo, double hi) const {
    const ojson& v = j_[k];
    if (!v.is_number()) throw invalid(k, "expected a number, found " + type_of(v));
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi))
      throw invalid(k, "must be in [" + num(lo) + ", " + num(hi) + "], found " + v.dump());
    return x;
  }
  std::int64_t integer(const char* k, std::int64_t lo, std::int64_t hi) const {
    const ojson& v = j_[k];
    if (!v.is_number_integer()) throw invalid(k, "expected an integer, found " + type_of(v));
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
      throw invalid(k, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], found " + v.dump());
    const std::int64_t x = v.get<std::int64_t>();
    if (x < lo || x > hi)
      throw invalid(k, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], found " + v.dump());
    return x;
  }
  bool boolean(const char* k) const {
    if (!j_[k].is_boolean()) throw invalid(k, "expected true or false, found " + type_of(j_[k]));
    return j_[k].get<bool>();
  }
  std::string string(const char* k) const {
    if (!j_[k].is_string()) throw invalid(k, "expected a string, found " + type_of(j_[k]));
    return j_[k].get<std::string>();
  }
  static std::string type_of(const ojson& v) {
    return v.is_number_integer() ? "an integer" : v.is_number() ? "a number" : std::string("a ") + v.type_name();
  }

 private:
  static std::string num(double x) {
    ojson v = x;
    return v.dump();
  }
  const ojson& j_;
};

inline void check_utf8(const std::string& s, const std::string& param) {
  if (const auto at = tokenizer::invalid_utf8_at(s))
    throw Fields::invalid(param, "not valid UTF-8 (byte " + std::to_string(*at) + ")");
}

/// Every string inside a message must be valid UTF-8 (the template copies them into the prompt).
inline void check_utf8_json(const ojson& v, const std::string& param) {
  if (v.is_string()) check_utf8(v.get_ref<const std::string&>(), param);
  else if (v.is_array())
    for (std::size_t i = 0; i < v.size(); ++i) check_utf8_json(v[i], param + "[" + std::to_string(i) + "]");
  else if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it) {
      check_utf8(it.key(), param);
      check_utf8_json(it.value(), param + "." + it.key());
    }
}

/// OpenAI's content parts [{"type": "text", "text": ...}] joined into one string, as
/// text-only servers do; other part types are refused.
inline ojson flatten_content(const ojson& content, const std::string& param) {
  if (content.is_string() || content.is_null()) return content;
  if (!content.is_array()) throw Fields::invalid(param, "expected a string or an array of content parts");
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const auto& p = content[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || p["type"] != "text" || !p.contains("text") || !p["text"].is_string())
      throw Fields::invalid(pp, "only {\"type\": \"text\", \"text\": ...} parts are supported");
    text += p["text"].get<std::string>();
  }
  return text;
}

}  // namespace openai_detail

/// Parses and checks a request body for `endpoint`; fields left out take `defaults`.
inline CompletionRequest parse_completion_request(const std::string& body, Endpoint endpoint,
                                                  const generate::GenerationConfig& defaults) {
  using openai_detail::Fields;
  ojson j;
  try {
    j = io::parse_json(body, "the body");
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "invalid_request_error", {}, "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object", "invalid_request_error", {}, "invalid_json");
  const Fields f(j);
  CompletionRequest r;
  r.endpoint = endpoint;
  r.g = defaults;
  if (f.has("model")) r.model = f.string("model");

  if (endpoint == Endpoint::chat) {
    if (!f.has("messages") || !j["messages"].is_array() || j["messages"].empty())
      throw Fields::invalid("messages", "expected a non-empty array of messages");
    r.messages = ojson::array();
    for (std::size_t i = 0; i < j["messages"].size(); ++i) {
      const std::string p = "messages[" + std::to_string(i) + "]";
      ojson m = j["messages"][i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw Fields::invalid(p, "a message is an object with a string \"role\"");
      if (m.contains("content")) m["content"] = openai_detail::flatten_content(m["content"], p + ".content");
      openai_detail::check_utf8_json(m, p);
      r.messages.push_back(std::move(m));
    }
    if (f.has("tools")) {
      if (!j["tools"].is_array()) throw Fields::invalid("tools", "expected an array");
      openai_detail::check_utf8_json(j["tools"], "tools");
      r.chat_extra["tools"] = j["tools"];
    }
    if (f.has("chat_template_kwargs")) {  // vLLM's: extra template variables (enable_thinking, ...)
      if (!j["chat_template_kwargs"].is_object()) throw Fields::invalid("chat_template_kwargs", "expected an object");
      openai_detail::check_utf8_json(j["chat_template_kwargs"], "chat_template_kwargs");
      for (auto it = j["chat_template_kwargs"].begin(); it != j["chat_template_kwargs"].end(); ++it)
        r.chat_extra[it.key()] = it.value();
    }
  } else {
    if (!f.has("prompt")) throw Fields::invalid("prompt", "is required");
    ojson p = j["prompt"];
    // A list of one prompt is that prompt (batches of several prompts are not supported).
    if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
    if (p.is_string()) {
      openai_detail::check_utf8(p.get_ref<const std::string&>(), "prompt");
      r.prompt_text = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      std::vector<std::int64_t> ids;
      for (const auto& x : p) {
        if (!x.is_number_integer()) throw Fields::invalid("prompt", "a token prompt is a list of integers");
        ids.push_back(x.get<std::int64_t>());
      }
      r.prompt_ids = std::move(ids);
    } else if (p.is_array() && p.size() > 1) {
      throw ApiError(400, "'prompt': a list of several prompts is not supported; send one request per prompt",
                     "invalid_request_error", "prompt", "unsupported");
    } else {
      throw Fields::invalid("prompt", "expected a string, a list of token ids, or a list of one of them");
    }
    if (f.has("echo") && f.boolean("echo"))
      throw ApiError(400, "'echo': returning the prompt is not supported", "invalid_request_error", "echo", "unsupported");
    if (f.has("suffix")) throw ApiError(400, "'suffix' is not supported", "invalid_request_error", "suffix", "unsupported");
  }

  constexpr std::int64_t kBig = std::int64_t{1} << 40;
  if (f.has("max_completion_tokens")) r.max_tokens = f.integer("max_completion_tokens", 1, kBig);
  else if (f.has("max_tokens")) r.max_tokens = f.integer("max_tokens", 1, kBig);
  if (f.has("temperature")) {
    const double t = f.number("temperature", 0, 2);
    r.g.do_sample = t > 0;
    if (t > 0) r.g.temperature = static_cast<float>(t);
  }
  if (f.has("top_p")) {
    const double p = f.number("top_p", 0, 1);
    if (p <= 0) throw Fields::invalid("top_p", "must be in (0, 1], found 0");
    r.g.top_p = static_cast<float>(p);
  }
  if (f.has("top_k")) r.g.top_k = std::max<std::int64_t>(0, f.integer("top_k", -1, kBig));  // -1 or 0: off
  if (f.has("min_p")) r.g.min_p = static_cast<float>(f.number("min_p", 0, 1));
  if (f.has("presence_penalty")) r.g.presence_penalty = static_cast<float>(f.number("presence_penalty", -2, 2));
  if (f.has("frequency_penalty")) r.g.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2, 2));
  if (f.has("repetition_penalty")) {
    const double p = f.number("repetition_penalty", 0, 100);
    if (p <= 0) throw Fields::invalid("repetition_penalty", "must be positive, found 0");
    r.g.repetition_penalty = static_cast<float>(p);
  }
  if (f.has("seed")) {
    const ojson& s = j["seed"];
    if (!s.is_number_integer()) throw Fields::invalid("seed", "expected an integer, found " + Fields::type_of(s));
    r.g.seed = s.is_number_unsigned() ? s.get<std::uint64_t>() : static_cast<std::uint64_t>(s.get<std::int64_t>());
    r.seed_given = true;
  }
  if (f.has("stop")) {
    const ojson& s = j["stop"];
    if (s.is_string()) r.stop.push_back(s.get<std::string>());
    else if (s.is_array() && s.size() <= 16) {
      for (const auto& x : s) {
        if (!x.is_string()) throw Fields::invalid("stop", "expected a string or a list of up to 16 strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw Fields::invalid("stop", "expected a string or a list of up to 16 strings");
    }
    for (const auto& x : r.stop) openai_detail::check_utf8(x, "stop");
  }
  if (f.has("n")) r.n = f.integer("n", 1, 16);
  if (endpoint == Endpoint::chat) {
    if (f.has("logprobs") && f.boolean("logprobs"))
      r.logprobs = f.has("top_logprobs") ? static_cast<int>(f.integer("top_logprobs", 0, 20)) : 0;
    else if (f.has("top_logprobs"))
      throw Fields::invalid("top_logprobs", "needs \"logprobs\": true");
  } else if (f.has("logprobs")) {
    r.logprobs = static_cast<int>(f.integer("logprobs", 0, 20));
  }
  if (f.has("stream")) r.stream = f.boolean("stream");
  if (f.has("stream_options")) {
    const ojson& so = j["stream_options"];
    if (!so.is_object()) throw Fields::invalid("stream_options", "expected an object");
    const Fields sf(so);
    if (sf.has("include_usage")) r.include_usage = sf.boolean("include_usage");
  }
  if (f.has("return_token_ids")) r.return_token_ids = f.boolean("return_token_ids");
  if (f.has("ignore_eos") && f.boolean("ignore_eos")) {  // vLLM's: run to max_tokens (benchmarks)
    r.g.eos_token_id.clear();
    r.g.stop_token_ids.clear();
  }
  if (f.has("best_of") && f.integer("best_of", 1, 16) != r.n)
    throw ApiError(400, "'best_of' other than n is not supported", "invalid_request_error", "best_of", "unsupported");
  return r;
}

}  // namespace edl::serve
