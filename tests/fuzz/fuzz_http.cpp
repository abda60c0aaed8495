// edl_fuzz_http: a request body for POST /v1/chat/completions and /v1/completions, as the
// server's handler parses it (without a socket: cpp-httplib parses the HTTP framing). The
// contract here: the body parses or is refused with an ApiError (a 4xx answer).
#include <edl/serve/openai.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  edl::generate::GenerationConfig defaults;
  defaults.eos_token_id = {2};
  const std::string body(edl::fuzz::text_of(data, size));
  for (const auto e : {edl::serve::Endpoint::chat, edl::serve::Endpoint::completion}) {
    try {
      (void)edl::serve::parse_completion_request(body, e, defaults);
    } catch (const edl::serve::ApiError& err) {
      if (err.status < 400 || err.status >= 500) std::abort();
    }
  }
  return 0;
}
