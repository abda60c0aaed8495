// edl_fuzz_npy: a .npy file read as each element type the library reads token and logit
// arrays in (the dataset reader tries several until the dtype matches).
#include <edl/io/npy.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file = edl::fuzz::bytes_of(data, size);
  edl::fuzz::expect_load_or_error([&] { (void)edl::io::parse_npy<std::int64_t>(file, "fuzz.npy"); });
  edl::fuzz::expect_load_or_error([&] { (void)edl::io::parse_npy<std::int32_t>(file, "fuzz.npy"); });
  edl::fuzz::expect_load_or_error([&] { (void)edl::io::parse_npy<std::uint16_t>(file, "fuzz.npy"); });
  edl::fuzz::expect_load_or_error([&] { (void)edl::io::parse_npy<float>(file, "fuzz.npy"); });
  return 0;
}
