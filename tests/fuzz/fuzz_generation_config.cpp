// edl_fuzz_generation_config: generation_config.json text into a validated GenerationConfig.
#include <edl/generate/generation_config.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  edl::fuzz::expect_load_or_error([&] {
    const auto j = edl::io::JsonConfig::parse(std::string(edl::fuzz::text_of(data, size)), "generation_config.json");
    (void)edl::generate::GenerationConfig::from_json(j.json(), "generation_config.json");
  });
  return 0;
}
