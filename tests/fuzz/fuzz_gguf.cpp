// edl_fuzz_gguf: a whole GGUF file: header, key-value pairs, tensor infos and the data region's
// bounds, as GgufFile::open checks them.
#include <edl/io/gguf.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  edl::fuzz::expect_load_or_error([&] { (void)edl::io::detail::gguf::parse(edl::fuzz::bytes_of(data, size), "fuzz.gguf"); });
  return 0;
}
