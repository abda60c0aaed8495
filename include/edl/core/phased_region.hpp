// edl/core/phased_region.hpp
// A sequence of phases run by a team of threads inside one parallel region.
//
//   exec::PhasedRegion region;
//   region.run(threads, max_phases, [&](exec::PhasedRegion::Team& team) {
//     team.phase(parts, [&](std::int64_t p) { ... part p ... }, [&] { ... once, after every part ... });
//     team.phase(...);                       // starts when the previous phase and its `after` are done
//   });
//
// Every thread of the team runs the same body, so every thread meets the same phases in the
// same order. A phase's parts are claimed from a shared counter: each part runs exactly once,
// on whichever thread claims it, and a thread that finds no part left waits (spinning) until
// the last part and the phase's `after` have finished. Work outside team.phase() runs on every
// thread and must touch only that thread's own data (team.thread() indexes it).
//
// Why: a decode step of a small model is ~30 matrix-vector products of a few microseconds to a
// few hundred each, with serial bits between them. A fork/join per product (exec::parallel_for)
// wakes and joins TBB workers ~30 times a token; here the workers enter once and pass between
// phases through a spin barrier (a few hundred nanoseconds on two cores).
//
// Claiming keeps the region deadlock-free whatever TBB does: if a team thread starts late (its
// worker busy elsewhere) or never runs concurrently, the threads that are there claim its
// parts, and nobody waits for a thread that has not claimed anything. With threads <= 1 the
// body runs once on the caller and each phase is a plain loop.
//
// Parts must not fork: a part waiting in a TBB parallel_for that spawned may be handed another
// team thread's body (a task of the same TBB pool), which then waits for that very part. The
// rms_norm of one row and lane-wise maps over a range (kernels::detail::map_range) are serial.
//
// An exception thrown by a part or an `after` is kept (the first one), the phase still counts
// as done so no thread waits forever, and run() rethrows it once the team has left the region.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>

#if defined(__SSE2__) || defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace edl::exec {

class PhasedRegion {
  struct alignas(64) Slot {
    std::atomic<std::int64_t> claimed{0};
    std::atomic<std::int64_t> finished{0};
    std::atomic<bool> done{false};
  };

 public:
  /// One thread's handle on the region: its index in the team and its place in the phase sequence.
  class Team {
   public:
    int thread() const noexcept { return id_; }
    int threads() const noexcept { return threads_; }

    /// Runs part(p) for p in [0, parts) across the team, then after() once; returns on every
    /// thread when both are done. parts <= 0 runs only after().
    template <class Part, class After>
    void phase(std::int64_t parts, Part&& part, After&& after) {
      if (threads_ <= 1) {  // alone: no counters, exceptions propagate as they are thrown
        for (std::int64_t p = 0; p < parts; ++p) part(p);
        after();
        return;
      }
      EDL_CHECK(next_ < region_->capacity_, errc::invalid_argument, "exec::PhasedRegion", "the body ran more than the ",
                region_->capacity_, " phases run() was given");
      Slot& s = region_->slots_[next_++];
      const std::int64_t n = std::max<std::int64_t>(parts, 1);  // an empty phase is one part that does nothing
      for (;;) {
        const std::int64_t p = s.claimed.fetch_add(1, std::memory_order_relaxed);
        if (p >= n) break;
        if (p < parts) region_->guarded([&] { part(p); });
        if (s.finished.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
          region_->guarded([&] { after(); });
          s.done.store(true, std::memory_order_release);
        }
      }
      while (!s.done.load(std::memory_order_acquire)) pause();
    }

    template <class Part>
    void phase(std::int64_t parts, Part&& part) {
      phase(parts, std::forward<Part>(part), [] {});
    }

   private:
    friend class PhasedRegion;
    Team(PhasedRegion* r, int id, int threads) : region_(r), id_(id), threads_(threads) {}

    static void pause() noexcept {
#if defined(__SSE2__) || defined(__x86_64__)
      _mm_pause();
#endif
    }

    PhasedRegion* region_;
    int id_, threads_;
    std::size_t next_ = 0;
  };

  /// Runs body(team) on `threads` team threads (TBB tasks; the caller is one of them), with
  /// room for `max_phases` phases. Allocates only when max_phases grows.
  template <class Body>
  void run(int threads, std::size_t max_phases, Body&& body) {
    threads = std::max(threads, 1);
    if (threads == 1) {
      exec::detail::ensure_flush_denormals();  // as exec::parallel_for would on this thread
      Team team(this, 0, 1);
      body(team);
      return;
    }
    if (max_phases > capacity_) {
      slots_ = std::unique_ptr<Slot[]>(new Slot[max_phases]);
      capacity_ = max_phases;
    } else {
      for (std::size_t i = 0; i < capacity_; ++i) {  // ~100 cache lines: far below a step's time
        slots_[i].claimed.store(0, std::memory_order_relaxed);
        slots_[i].finished.store(0, std::memory_order_relaxed);
        slots_[i].done.store(false, std::memory_order_relaxed);
      }
    }
    error_ = nullptr;
    // The task launch orders the resets above before every team thread's first claim.
    exec::parallel_parts(threads, [&](std::ptrdiff_t id) {
      Team team(this, static_cast<int>(id), threads);
      body(team);
    });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  template <class F>
  void guarded(F&& f) noexcept {
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t capacity_ = 0;
  std::mutex error_mu_;
  std::exception_ptr error_;
};

}  // namespace edl::exec
