// tests/serve/test_openai.cpp: request bodies parse into the generation settings they name, and
// every malformed field is a 400 naming it.
#include <gtest/gtest.h>

#include <string>

#include <edl/serve/openai.hpp>

using namespace edl::serve;
using edl::generate::GenerationConfig;

namespace {

GenerationConfig defaults() {
  GenerationConfig g;
  g.do_sample = true;
  g.top_k = 0;
  g.eos_token_id = {2};
  return g;
}

CompletionRequest chat(const std::string& extra) {
  return parse_completion_request(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])" + extra + "}",
                                  Endpoint::chat, defaults());
}

/// The ApiError a body gives, or a failure.
ApiError error_of(const std::string& body, Endpoint e = Endpoint::chat) {
  try {
    parse_completion_request(body, e, defaults());
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "");
}

}  // namespace

TEST(OpenAiRequest, ChatFieldsBecomeTheGenerationConfig) {
  const auto r = chat(R"(, "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
      "seed": 42, "stop": ["\n", "User:"], "presence_penalty": 0.5, "frequency_penalty": -0.25,
      "repetition_penalty": 1.1, "n": 3, "logprobs": true, "top_logprobs": 4, "stream": true,
      "stream_options": {"include_usage": true}, "user": "ignored")");
  EXPECT_EQ(*r.model, "m");
  EXPECT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_TRUE(r.g.do_sample);
  EXPECT_FLOAT_EQ(r.g.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.g.top_p, 0.9f);
  EXPECT_EQ(r.g.top_k, 20);
  EXPECT_FLOAT_EQ(r.g.min_p, 0.05f);
  EXPECT_EQ(r.g.seed, 42u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "User:"}));
  EXPECT_FLOAT_EQ(r.g.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.g.frequency_penalty, -0.25f);
  EXPECT_FLOAT_EQ(r.g.repetition_penalty, 1.1f);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.logprobs, 4);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.g.eos_token_id, std::vector<std::int64_t>{2});  // from the defaults
}

TEST(OpenAiRequest, TemperatureZeroIsGreedyAndMaxCompletionTokensWins) {
  const auto r = chat(R"(, "temperature": 0, "max_tokens": 3, "max_completion_tokens": 5)");
  EXPECT_FALSE(r.g.do_sample);
  EXPECT_EQ(*r.max_tokens, 5);
  const auto d = chat("");
  EXPECT_TRUE(d.g.do_sample);  // left out: the defaults
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.logprobs, -1);
}

TEST(OpenAiRequest, ContentPartsAreJoinedAndOtherPartsRefused) {
  const auto r = parse_completion_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})",
      Endpoint::chat, defaults());
  EXPECT_EQ(r.messages[0]["content"], "ab");
  const auto e = error_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "messages[0].content[0]");
}

TEST(OpenAiRequest, CompletionPromptsAsTextOrTokenIds) {
  auto r = parse_completion_request(R"({"prompt": "once", "logprobs": 2, "echo": false})", Endpoint::completion, defaults());
  EXPECT_EQ(*r.prompt_text, "once");
  EXPECT_EQ(r.logprobs, 2);
  r = parse_completion_request(R"({"prompt": [1, 5, 9]})", Endpoint::completion, defaults());
  EXPECT_EQ(*r.prompt_ids, (std::vector<std::int64_t>{1, 5, 9}));
  r = parse_completion_request(R"({"prompt": [[1, 5]]})", Endpoint::completion, defaults());
  EXPECT_EQ(*r.prompt_ids, (std::vector<std::int64_t>{1, 5}));
  r = parse_completion_request(R"({"prompt": ["x"]})", Endpoint::completion, defaults());
  EXPECT_EQ(*r.prompt_text, "x");
  EXPECT_EQ(error_of(R"({"prompt": ["a", "b"]})", Endpoint::completion).code, "unsupported");
  EXPECT_EQ(error_of(R"({"prompt": [1, "b"]})", Endpoint::completion).param, "prompt");
  EXPECT_EQ(error_of(R"({"max_tokens": 3})", Endpoint::completion).param, "prompt");
  EXPECT_EQ(error_of(R"({"prompt": "a", "echo": true})", Endpoint::completion).param, "echo");
}

TEST(OpenAiRequest, BadFieldsAre400sNamingTheField) {
  const std::string m = R"("messages": [{"role": "user", "content": "hi"}])";
  const struct {
    std::string field, body;
  } cases[] = {
      {"max_tokens", R"("max_tokens": -1)"},
      {"max_tokens", R"("max_tokens": 0)"},
      {"max_tokens", R"("max_tokens": 1.5)"},
      {"max_tokens", R"("max_tokens": "10")"},
      {"max_tokens", R"("max_tokens": 99999999999999999999)"},
      {"temperature", R"("temperature": 3)"},
      {"temperature", R"("temperature": "hot")"},
      {"top_p", R"("top_p": 0)"},
      {"top_k", R"("top_k": -2)"},
      {"n", R"("n": 0)"},
      {"n", R"("n": 100)"},
      {"stop", R"("stop": [1])"},
      {"stop", R"("stop": {"a": 1})"},
      {"presence_penalty", R"("presence_penalty": 2.5)"},
      {"logprobs", R"("logprobs": 3)"},
      {"top_logprobs", R"("top_logprobs": 3)"},
      {"top_logprobs", R"("logprobs": true, "top_logprobs": 21)"},
      {"stream", R"("stream": "yes")"},
      {"stream_options", R"("stream_options": 1)"},
      {"seed", R"("seed": "s")"},
      {"model", R"("model": 5)"},
  };
  for (const auto& c : cases) {
    const auto e = error_of("{" + m + ", " + c.body + "}");
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.field) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_NE(std::string(e.what()).find(c.field), std::string::npos) << e.what();
  }
  EXPECT_EQ(error_of("{").code, "invalid_json");
  EXPECT_EQ(error_of("[1]").code, "invalid_json");
  EXPECT_EQ(error_of(R"({"messages": []})").param, "messages");
  EXPECT_EQ(error_of(R"({"messages": [{"content": "x"}]})").param, "messages[0]");
  EXPECT_EQ(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}").code, "invalid_json");
}

TEST(OpenAiRequest, ErrorBodyHasOpenAisFields) {
  const ApiError e(429, "busy", "rate_limit_error", {}, "queue_full");
  const auto b = e.body();
  EXPECT_EQ(b["error"]["message"], "busy");
  EXPECT_EQ(b["error"]["type"], "rate_limit_error");
  EXPECT_TRUE(b["error"]["param"].is_null());
  EXPECT_EQ(b["error"]["code"], "queue_full");
}
