// edl_fuzz_config: config.json text into a LlamaConfig (parsed, defaults applied, validated),
// then what a loader computes from it before allocating: the parameter count and bytes.
#include <edl/models/llama/config.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  edl::fuzz::expect_load_or_error([&] {
    const auto j = edl::io::JsonConfig::parse(std::string(edl::fuzz::text_of(data, size)), "config.json");
    const auto c = edl::models::LlamaConfig::from_json(j.json(), "config.json");
    (void)c.parameter_count();
  });
  return 0;
}
