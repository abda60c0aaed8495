// edl/core/process_memory.hpp
// The process's resident memory, as Linux reports it in /proc/self/status:
//
//   edl::resident_bytes()        VmRSS: resident now
//   edl::peak_resident_bytes()   VmHWM: the peak since the start, or since reset_peak_resident()
//   edl::reset_peak_resident()   returns freed heap pages to the system, then starts a new peak
//                                window (writing "5" to /proc/self/clear_refs); false where the
//                                kernel does not allow it
//
// Both are 0 where /proc is unavailable. The trainer's track_memory and `edl bench` report them.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace edl {

namespace detail {
/// A "Key:   123456 kB" line of /proc/self/status in bytes, 0 when absent or unreadable.
inline std::int64_t proc_status_bytes(std::string_view key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 && line[key.size()] == ':') {
      try {
        return std::stoll(line.substr(key.size() + 1)) * 1024;
      } catch (...) {
        return 0;
      }
    }
  return 0;
}
}  // namespace detail

inline std::int64_t resident_bytes() { return detail::proc_status_bytes("VmRSS"); }
inline std::int64_t peak_resident_bytes() { return detail::proc_status_bytes("VmHWM"); }

inline bool reset_peak_resident() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  return static_cast<bool>(out.flush());
}

}  // namespace edl
