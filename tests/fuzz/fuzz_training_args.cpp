// edl_fuzz_training_args: a training JSON (EasyDeL-style arguments) parsed and validated.
#include <edl/train/training_arguments.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  edl::fuzz::expect_load_or_error([&] {
    const auto j = edl::io::JsonConfig::parse(std::string(edl::fuzz::text_of(data, size)), "train.json");
    const auto a = edl::train::TrainingArguments::from_json(j.json(), "train.json");
    a.validate();
  });
  return 0;
}
