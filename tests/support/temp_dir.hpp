// tests/support/temp_dir.hpp: a folder of a test's own under the system's temp directory,
// named after the test's label and the process (test executables run side by side), emptied
// when made and removed with its contents at the end.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <unistd.h>

namespace edl::test_support {

struct TempDir {
  /// Whether the folder exists from the start, or only its name is reserved (for code that must
  /// create it itself, as the trainer its save_directory).
  enum class Make { folder, name_only };

  std::filesystem::path p;

  explicit TempDir(const std::string& label, Make make = Make::folder)
      : p(std::filesystem::temp_directory_path() / ("edl_" + label + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(p);
    if (make == Make::folder) std::filesystem::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return p.string(); }
  /// Writes `contents` to file `name` in the folder; returns its path.
  std::string file(const std::string& name, const std::string& contents) const {
    std::ofstream(p / name, std::ios::binary) << contents;
    return (p / name).string();
  }
};

}  // namespace edl::test_support
