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
//
// Timing (time_phases): each thread's time per phase, in its parts and at the phase's barrier,
// summed into a PhaseTimes after the team leaves the region. Off by default; on, it costs three
// clock reads per phase and thread (`edl bench decode --phase-times`, docs/benchmarks.md).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>

#if defined(__SSE2__) || defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace edl::exec {

/// Where the runs of a PhasedRegion spent their time, phase by phase (PhasedRegion::time_phases).
/// For phase p: work[p], the team's threads' seconds from entering the phase until no part was
/// left for them (their parts, and `after` on the thread that ran it); wait[p], their seconds
/// from there until the phase was done (its barrier). Both are summed over the threads and over
/// the runs; thread_runs sums each run's team size, so work[p] / thread_runs is one thread's
/// mean per run.
struct PhaseTimes {
  std::vector<double> work, wait;
  std::int64_t runs = 0, thread_runs = 0;

  void clear() {
    work.clear();
    wait.clear();
    runs = thread_runs = 0;
  }
};

class PhasedRegion {
  using Clock = std::chrono::steady_clock;

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
      const std::size_t index = next_++;
      // This thread's two stamps for the phase (work, wait), when the region is timed.
      double* stamp = region_->times_ && index < region_->timed_phases_ ? region_->stamp(id_, index) : nullptr;
      const Clock::time_point t0 = stamp ? Clock::now() : Clock::time_point{};
      if (threads_ <= 1) {  // alone: no counters, exceptions propagate as they are thrown
        for (std::int64_t p = 0; p < parts; ++p) part(p);
        after();
        if (stamp) stamp[0] += std::chrono::duration<double>(Clock::now() - t0).count();
        return;
      }
      EDL_CHECK(index < region_->capacity_, errc::invalid_argument, "exec::PhasedRegion", "the body ran more than the ",
                region_->capacity_, " phases run() was given");
      Slot& s = region_->slots_[index];
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
      const Clock::time_point t1 = stamp ? Clock::now() : Clock::time_point{};
      while (!s.done.load(std::memory_order_acquire)) pause();
      if (stamp) {
        stamp[0] += std::chrono::duration<double>(t1 - t0).count();
        stamp[1] += std::chrono::duration<double>(Clock::now() - t1).count();
      }
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

  /// Times the phases of the following runs into *times (adding to what it holds), or stops
  /// timing (nullptr). The PhaseTimes must outlive the runs it times.
  void time_phases(PhaseTimes* times) noexcept { times_ = times; }

  /// Runs body(team) on `threads` team threads (TBB tasks; the caller is one of them), with
  /// room for `max_phases` phases. Allocates only when max_phases grows.
  template <class Body>
  void run(int threads, std::size_t max_phases, Body&& body) {
    threads = std::max(threads, 1);
    if (times_) {
      timed_phases_ = max_phases;
      stamps_.assign(2 * static_cast<std::size_t>(threads) * max_phases, 0.0);
    }
    if (threads == 1) {
      exec::detail::ensure_flush_denormals();  // as exec::parallel_for would on this thread
      Team team(this, 0, 1);
      body(team);
      add_times(threads);
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
    add_times(threads);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  // Thread t's two stamps (work, wait) for phase p of the current timed run.
  double* stamp(int t, std::size_t p) noexcept {
    return stamps_.data() + 2 * (static_cast<std::size_t>(t) * timed_phases_ + p);
  }

  // Sums the run's stamps over the threads into *times_.
  void add_times(int threads) {
    if (!times_) return;
    if (times_->work.size() < timed_phases_) {
      times_->work.resize(timed_phases_, 0.0);
      times_->wait.resize(timed_phases_, 0.0);
    }
    for (int t = 0; t < threads; ++t)
      for (std::size_t p = 0; p < timed_phases_; ++p) {
        const double* st = stamp(t, p);
        times_->work[p] += st[0];
        times_->wait[p] += st[1];
      }
    times_->runs += 1;
    times_->thread_runs += threads;
  }

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
  PhaseTimes* times_ = nullptr;  // time_phases
  std::size_t timed_phases_ = 0;
  std::vector<double> stamps_;  // [thread][phase][work, wait] of the current run
};

}  // namespace edl::exec
