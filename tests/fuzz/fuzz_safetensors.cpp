// edl_fuzz_safetensors: a whole safetensors file (8-byte length, JSON header, data): the header
// is validated, then every tensor's bytes are converted to f32 as a load would.
#include <vector>

#include <edl/io/safetensors.hpp>

#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  edl::fuzz::expect_load_or_error([&] {
    const auto file = edl::fuzz::bytes_of(data, size);
    const auto h = edl::io::detail::parse_header(file, "fuzz.safetensors");
    const std::byte* base = file.data() + 8 + h.header_bytes;
    std::vector<float> out;
    for (const auto& name : h.names) {
      const auto& info = h.infos.at(name);
      const std::size_t n = static_cast<std::size_t>((info.end - info.begin) / edl::dtype_size(info.dtype));
      out.resize(n);
      edl::io::detail::convert_elements(info.dtype, base + info.begin, n, out.data(), name);
    }
  });
  return 0;
}
