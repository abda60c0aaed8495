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

/// The line of /proc/self/smaps that starts with `field` in the entry of the mapping holding
/// address p, or "" when no mapping holds it (or its entry has no such line).
inline std::string smaps_field(const void* p, const std::string& field) {
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
    if (in && line.rfind(field, 0) == 0) return line;
  }
  return "";
}

/// kB of huge pages backing the mapping that holds address p (smaps' AnonHugePages), -1 when no
/// mapping holds it.
inline long huge_kb_of_mapping(const void* p) {
  const std::string line = smaps_field(p, "AnonHugePages:");
  return line.empty() ? -1 : std::stol(line.substr(14));
}

/// Whether the mapping that holds address p is advised for huge pages (smaps' VmFlags "hg"),
/// whether or not the kernel has backed it with them yet.
inline bool mapping_advised_huge(const void* p) {
  return (smaps_field(p, "VmFlags:") + " ").find(" hg ") != std::string::npos;
}

}  // namespace edl::test_support
