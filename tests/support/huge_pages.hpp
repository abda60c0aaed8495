// tests/support/huge_pages.hpp: whether Linux gives this process transparent huge pages, and
// how much of a mapping they back (/proc/self/smaps), for the tests of huge-page storage.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace edl::test_support {

/// Whether Linux gives transparent huge pages to advised memory (THP `always` or `madvise`).
inline bool thp_available() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s.find("[always]") != std::string::npos || s.find("[madvise]") != std::string::npos;
}

/// kB of huge pages backing the mapping that holds address p (smaps' AnonHugePages), -1 when no
/// mapping holds it.
inline long huge_kb_of_mapping(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      in = lo <= a && a < hi;  // a mapping's first line: "lo-hi perms offset dev inode path"
      continue;
    }
    if (in && line.rfind("AnonHugePages:", 0) == 0) return std::stol(line.substr(14));
  }
  return -1;
}

/// Whether the mapping that holds address p is advised for huge pages (smaps' VmFlags "hg"),
/// whether or not the kernel has backed it with them yet.
inline bool mapping_advised_huge(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      in = lo <= a && a < hi;
      continue;
    }
    if (in && line.rfind("VmFlags:", 0) == 0) return (line + " ").find(" hg ") != std::string::npos;
  }
  return false;
}

}  // namespace edl::test_support
