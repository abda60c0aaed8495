// edl/core/allocator.hpp
// Process-wide malloc settings for training loops, huge pages for weights and KV caches that
// are read in full every step, and cache-line-aligned storage for what decode streams.
//
// A training step allocates and frees the same large activation buffers every step. glibc
// serves blocks above its mmap threshold (up to 32 MiB) with fresh mappings and returns freed
// heap tops to the kernel, so every step pays page faults and the kernel's page zeroing for
// memory it just gave back.
// keep_freed_memory() makes glibc serve all blocks from the heap and never trim it, so the
// second step reuses the first step's pages. Peak memory is unchanged (the pages are the same);
// the resident size stays at the peak between steps instead of dropping. It also keeps every
// thread on the main arena: blocks a worker thread allocates (inside a parallel kernel) would
// otherwise grow an arena of their own whose pages the main heap cannot reuse. It changes process
// state, so the library never calls it on its own: programs opt in (the edl tool does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace edl {

/// Bytes of a cache line, and of one AVX-512 vector: the alignment of storage that kernels read
/// in full-vector streams (parameters, KV caches). glibc's malloc aligns to 16 bytes, so most
/// tensors would start mid-line and every 64-byte load of them would touch two lines.
inline constexpr std::size_t kCacheLineBytes = 64;

/// A standard allocator whose blocks start on a cache line. Each block comes from the plain
/// operator new, kCacheLineBytes longer, its start moved up to the next line and the distance
/// kept in the byte before it: a program that counts plain operator new (tests/models/
/// test_plan.cpp measures a training step's heap so) sees these blocks as it saw the
/// std::allocator blocks they replace.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() noexcept = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > (std::numeric_limits<std::size_t>::max() - kCacheLineBytes) / sizeof(T)) throw std::bad_array_new_length();
    auto* raw = static_cast<unsigned char*>(::operator new(n * sizeof(T) + kCacheLineBytes));
    const std::size_t shift = kCacheLineBytes - reinterpret_cast<std::uintptr_t>(raw) % kCacheLineBytes;  // 1..64
    unsigned char* p = raw + shift;
    p[-1] = static_cast<unsigned char>(shift);
    return reinterpret_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept {
    auto* q = reinterpret_cast<unsigned char*>(p);
    ::operator delete(q - q[-1]);
  }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

/// A std::vector whose data starts on a cache line (kCacheLineBytes).
template <class T>
using aligned_vector = std::vector<T, CacheLineAllocator<T>>;

/// Bytes of a transparent huge page (x86-64 Linux).
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

/// A standard allocator for storage meant for huge pages (advise_huge_pages, which covers only
/// whole aligned 2 MiB blocks). A block of at least kHugePageBytes starts on a huge-page
/// boundary and is rounded up to whole huge pages, so that all of it can be advised: a block
/// from malloc kept its unaligned head and tail, up to 2 MiB each, on 4 KiB pages. Smaller
/// blocks start on a cache line. The rounding is address space until written; once advised, a
/// write to the last huge page faults in all of it (at most 2 MiB more than asked).
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > (std::numeric_limits<std::size_t>::max() - kHugePageBytes) / sizeof(T)) throw std::bad_array_new_length();
    const Block b = block(n);
    return static_cast<T*>(::operator new(b.bytes, std::align_val_t{b.align}));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const Block b = block(n);
    ::operator delete(static_cast<void*>(p), b.bytes, std::align_val_t{b.align});
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
  /// Bytes of the block allocate(n) returns (whole huge pages from one huge page on).
  static std::size_t block_bytes(std::size_t n) noexcept { return block(n).bytes; }

 private:
  struct Block {
    std::size_t bytes, align;
  };
  static Block block(std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return {bytes, kCacheLineBytes};
    return {(bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes, kHugePageBytes};
  }
};

/// A std::vector whose data starts on a huge page when it is at least one huge page long
/// (HugePageAllocator); see assign_on_huge_pages.
template <class T>
using huge_page_vector = std::vector<T, HugePageAllocator<T>>;

/// Keeps freed memory in the process for reuse (glibc; no-op elsewhere). Returns whether the
/// settings were applied.
inline bool keep_freed_memory() noexcept {
#if defined(__GLIBC__)
  // 1 GiB: above any single activation buffer of the configs we train; larger blocks still
  // get their own mapping, which is then returned to the kernel when freed.
  const bool a = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1;
  const bool b = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;  // trims only a heap top above 1 GiB
  const bool c = mallopt(M_ARENA_MAX, 1) == 1;               // one heap for every thread
  return a && b && c;
#else
  return false;
#endif
}

/// Asks Linux to back the 2 MiB-aligned part of [p, p + bytes) with transparent huge pages
/// (MADV_HUGEPAGE, then MADV_COLLAPSE so that pages already written are merged now rather than
/// whenever khugepaged gets to them). Returns the bytes advised (0 elsewhere, for a range with
/// no aligned 2 MiB block, or when the kernel refuses). Contents are unchanged.
///
/// Why: decode reads every weight once per token in long streams; with 4 KiB pages each
/// stream misses the TLB every 4 KiB. The kernel may decline (THP `never`): then nothing changes.
inline std::size_t advise_huge_pages(const void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t lo = (a + kHuge - 1) & ~(kHuge - 1), hi = (a + bytes) & ~(kHuge - 1);
  if (p == nullptr || hi <= lo) return 0;
  void* start = reinterpret_cast<void*>(lo);
  if (madvise(start, hi - lo, MADV_HUGEPAGE) != 0) return 0;
#if defined(MADV_COLLAPSE)
  constexpr int kCollapse = MADV_COLLAPSE;
#else
  constexpr int kCollapse = 25;  // Linux 6.1's value; older kernels reject it and khugepaged collapses later
#endif
  (void)madvise(start, hi - lo, kCollapse);
  return static_cast<std::size_t>(hi - lo);
#else
  (void)p;
  (void)bytes;
  return 0;
#endif
}

/// v = n copies of `value` on transparent huge pages where the OS allows: the storage (whole
/// huge pages, HugePageAllocator) is advised before it is first written, so it faults in as
/// huge pages rather than being collapsed afterwards. Contents are as v.assign(n, value).
template <class T>
void assign_on_huge_pages(huge_page_vector<T>& v, std::size_t n, const T& value) {
  v.clear();
  v.shrink_to_fit();
  v.reserve(n);
  advise_huge_pages(v.data(), HugePageAllocator<T>::block_bytes(v.capacity()));  // the whole block
  v.assign(n, value);
}

}  // namespace edl
