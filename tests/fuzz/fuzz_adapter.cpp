// edl_fuzz_adapter: a PEFT adapter_config.json into a validated LoraConfig.
#include <edl/lora/peft.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  edl::fuzz::expect_load_or_error([&] {
    const auto j = edl::io::parse_json<nlohmann::json>(edl::fuzz::text_of(data, size), "adapter_config.json");
    (void)edl::lora::from_peft_json(j, "adapter_config.json");
  });
  return 0;
}
