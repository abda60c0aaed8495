// edl/core/exec.hpp
// Thread pool control for kernels: the only place in core/ that includes oneTBB.
//
// Every kernel parallelises through exec::parallel_for, which
//  - runs on oneTBB's shared pool, so simulated devices (mesh/) and kernels share cores
//    instead of oversubscribing them;
//  - sets flush-to-zero and denormals-are-zero on each worker thread before it computes:
//    denormal floats appear in training (tiny gradients, decayed moments) and make x86
//    arithmetic several times slower.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace edl::exec {

/// Sets FTZ and DAZ on the calling thread (x86 MXCSR bits 15 and 6). A no-op elsewhere.
inline void set_flush_denormals() noexcept {
#if defined(__SSE__) || defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | 0x8040u);
#endif
}

namespace detail {
/// Marks threads that already flush denormals, so the MXCSR write happens once per thread.
inline thread_local bool thread_flushes_denormals = false;

inline void ensure_flush_denormals() noexcept {
  if (!detail::thread_flushes_denormals) {
    set_flush_denormals();
    detail::thread_flushes_denormals = true;
  }
}

struct DenormalObserver : tbb::task_scheduler_observer {
  DenormalObserver() { observe(true); }
  void on_scheduler_entry(bool) override { ensure_flush_denormals(); }
};

struct State {
  std::mutex mu;
  std::unique_ptr<tbb::global_control> limit;
  std::unique_ptr<DenormalObserver> observer;
  int threads = 0;
};
inline State& state() {
  static State s;
  return s;
}
}  // namespace detail

/// Threads the kernels use (the hardware count unless set_num_threads limited it).
inline int num_threads() {
  return static_cast<int>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
}

/// Limits kernel threads to n (n <= 0 restores the default). Process-wide, like
/// torch.set_num_threads.
inline void set_num_threads(int n) {
  auto& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.limit.reset();
  if (n > 0) s.limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(n));
  s.threads = n;
}

/// Installs the denormal observer on TBB's pool; called by every parallel_for, cheap after the first.
inline void init() {
  auto& s = detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.observer) s.observer = std::make_unique<detail::DenormalObserver>();
  detail::ensure_flush_denormals();
}

/// parallel_for over [begin, end) in chunks of at least `grain`; body(lo, hi) handles a chunk.
template <class Body>
void parallel_for(std::ptrdiff_t begin, std::ptrdiff_t end, std::ptrdiff_t grain, Body&& body) {
  if (end <= begin) return;
  static const bool once = (init(), true);
  (void)once;
  detail::ensure_flush_denormals();
  if (end - begin <= grain || num_threads() <= 1) {
    body(begin, end);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::ptrdiff_t>(begin, end, std::max<std::ptrdiff_t>(grain, 1)),
                    [&](const tbb::blocked_range<std::ptrdiff_t>& r) {
                      detail::ensure_flush_denormals();
                      body(r.begin(), r.end());
                    });
}

/// Static partition into exactly `parts` chunks (deterministic work split, e.g. for
/// reductions whose partial sums must combine in a fixed order).
template <class Body>
void parallel_parts(std::ptrdiff_t parts, Body&& body) {
  parallel_for(0, parts, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::ptrdiff_t p = lo; p < hi; ++p) body(p);
  });
}

}  // namespace edl::exec
