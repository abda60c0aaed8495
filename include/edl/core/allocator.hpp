// edl/core/allocator.hpp
// Process-wide malloc settings for training loops.
//
// A training step allocates and frees the same large activation buffers every step. glibc
// serves blocks above its mmap threshold (up to 32 MiB) with fresh mappings and returns freed
// heap tops to the kernel, so every step pays page faults and the kernel's page zeroing for
// memory it just gave back: measured at 7-8% of a small-config step (docs/benchmarks.md).
// keep_freed_memory() makes glibc serve all blocks from the heap and never trim it, so the
// second step reuses the first step's pages. Peak memory is unchanged (the pages are the same);
// the resident size stays at the peak between steps instead of dropping. It changes process
// state, so the library never calls it on its own: programs opt in (the edl tool does).
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace edl {

/// Keeps freed memory in the process for reuse (glibc; no-op elsewhere). Returns whether the
/// settings were applied.
inline bool keep_freed_memory() noexcept {
#if defined(__GLIBC__)
  // 1 GiB: above any single activation buffer of the configs we train; larger blocks still
  // get their own mapping, which is then returned to the kernel when freed.
  const bool a = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1;
  const bool b = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;  // trims only a heap top above 1 GiB
  return a && b;
#else
  return false;
#endif
}

}  // namespace edl
