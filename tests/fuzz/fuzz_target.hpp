// tests/fuzz/fuzz_target.hpp: what every fuzz target shares. The contract of a reader under
// fuzzing: any input either loads or throws edl::Error. Any other exception escapes
// LLVMFuzzerTestOneInput and aborts (a finding), as do crashes, leaks and sanitizer reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>

#include <edl/core/error.hpp>

namespace edl::fuzz {

inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}
inline std::span<const std::byte> bytes_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

/// Runs f; an edl::Error is the reader refusing the input, which is fine.
template <class F>
void expect_load_or_error(F&& f) {
  try {
    f();
  } catch (const edl::Error&) {
  }
}

/// A folder of this process's own under TMPDIR (or /tmp), for readers that take paths.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* t = std::getenv("TMPDIR");
    auto d = std::filesystem::path(t && *t ? t : "/tmp") / ("edl-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace edl::fuzz
