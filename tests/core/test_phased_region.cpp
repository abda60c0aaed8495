// tests/core/test_phased_region.cpp: a phased region runs every part once, in phase order,
// on any team size (also larger than the TBB pool), reports what its parts throw, and times
// its phases when asked.
#include <edl/core/phased_region.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace {

using edl::exec::PhasedRegion;

constexpr int kPhases = 40;
constexpr int kMaxParts = 7;

std::int64_t parts_of(int k) { return k % kMaxParts; }  // includes empty phases

/// A chain through the phases: part p of phase k reads every value phase k - 1 wrote and what
/// its `after` wrote, so a part that ran early, twice or never changes the result.
struct Chain {
  std::vector<std::vector<std::int64_t>> vals = std::vector<std::vector<std::int64_t>>(kPhases, std::vector<std::int64_t>(kMaxParts, 0));
  std::vector<std::int64_t> after = std::vector<std::int64_t>(kPhases, 0);
  std::vector<std::atomic<int>> runs = std::vector<std::atomic<int>>(kPhases * kMaxParts);
  std::vector<std::atomic<int>> afters = std::vector<std::atomic<int>>(kPhases);

  std::int64_t input(int k) const {
    if (k == 0) return 1;
    return std::accumulate(vals[k - 1].begin(), vals[k - 1].end(), std::int64_t{0}) * 3 + after[k - 1];
  }
  void part(int k, std::int64_t p) {
    runs[k * kMaxParts + p].fetch_add(1);
    vals[k][p] = (input(k) * (p + 2)) % 1000003;
  }
  void finish(int k) {
    afters[k].fetch_add(1);
    after[k] = (std::accumulate(vals[k].begin(), vals[k].end(), std::int64_t{0}) + k) % 1000003;
  }
};

std::vector<std::int64_t> serial_chain() {
  Chain c;
  for (int k = 0; k < kPhases; ++k) {
    for (std::int64_t p = 0; p < parts_of(k); ++p) c.part(k, p);
    c.finish(k);
  }
  return c.after;
}

TEST(PhasedRegion, EveryPartRunsOnceAfterThePreviousPhaseOnAnyTeamSize) {
  const auto want = serial_chain();
  PhasedRegion region;
  for (const int threads : {1, 2, 3, 8}) {  // 8: more team threads than the pool has cores
    for (int round = 0; round < 3; ++round) {  // the region is reused: its counters reset
      Chain c;
      std::vector<std::atomic<int>> seen(static_cast<std::size_t>(threads));
      region.run(threads, kPhases, [&](PhasedRegion::Team& team) {
        EXPECT_EQ(team.threads(), threads);
        ASSERT_GE(team.thread(), 0);
        ASSERT_LT(team.thread(), threads);
        seen[static_cast<std::size_t>(team.thread())].fetch_add(1);
        for (int k = 0; k < kPhases; ++k)
          team.phase(parts_of(k), [&](std::int64_t p) { c.part(k, p); }, [&] { c.finish(k); });
      });
      EXPECT_EQ(c.after, want) << threads << " threads, round " << round;
      for (int k = 0; k < kPhases; ++k) {
        EXPECT_EQ(c.afters[k].load(), 1) << "phase " << k;
        for (std::int64_t p = 0; p < kMaxParts; ++p)
          EXPECT_EQ(c.runs[k * kMaxParts + p].load(), p < parts_of(k) ? 1 : 0) << "phase " << k << " part " << p;
      }
      for (int t = 0; t < threads; ++t) EXPECT_EQ(seen[static_cast<std::size_t>(t)].load(), 1) << "team thread " << t;
    }
  }
}

TEST(PhasedRegion, APartsExceptionIsRethrownAndTheRegionStillWorks) {
  PhasedRegion region;
  for (const int threads : {1, 2}) {
    std::atomic<int> later{0};
    EXPECT_THROW(region.run(threads, 4,
                            [&](PhasedRegion::Team& team) {
                              team.phase(3, [&](std::int64_t p) {
                                if (p == 1) throw std::runtime_error("part 1");
                              });
                              team.phase(2, [&](std::int64_t) { later.fetch_add(1); });
                            }),
                 std::runtime_error);
    if (threads > 1) EXPECT_EQ(later.load(), 2);  // the team went on to the end of the region
    std::atomic<int> parts{0};
    region.run(threads, 4, [&](PhasedRegion::Team& team) { team.phase(5, [&](std::int64_t) { parts.fetch_add(1); }); });
    EXPECT_EQ(parts.load(), 5);
  }
}

TEST(PhasedRegion, MorePhasesThanReservedIsAnError) {
  PhasedRegion region;
  try {
    region.run(2, 2, [&](PhasedRegion::Team& team) {
      for (int k = 0; k < 3; ++k) team.phase(2, [](std::int64_t) {});
    });
    FAIL() << "expected edl::Error";
  } catch (const edl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 phases"), std::string::npos) << e.what();
  }
}

TEST(PhasedRegion, TimedPhasesAccountForTheirPartsAndStayWithinTheRun) {
  // Phase 0's one part spins for 3 ms, phase 1 has one empty part per thread, phase 2 none:
  // each thread's stamps are disjoint intervals inside the run, so over the team they add up
  // to at most threads x the run's wall time; phase 0's work holds the spin; on one thread
  // nothing waits. Timing adds across runs until cleared, and a run without it adds nothing.
  using Clock = std::chrono::steady_clock;
  const auto spin = [](double s) {
    const auto end = Clock::now() + std::chrono::duration<double>(s);
    while (Clock::now() < end) {
    }
  };
  for (const int threads : {1, 2, 3}) {
    PhasedRegion region;
    edl::exec::PhaseTimes times;
    region.time_phases(&times);
    double wall = 0;
    for (int run = 0; run < 2; ++run) {
      const auto t0 = Clock::now();
      region.run(threads, 4, [&](PhasedRegion::Team& team) {
        team.phase(1, [&](std::int64_t) { spin(3e-3); });
        team.phase(team.threads(), [](std::int64_t) {});
        team.phase(0, [](std::int64_t) {});
      });
      wall += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    ASSERT_EQ(times.work.size(), 4u) << threads << " threads";
    EXPECT_EQ(times.runs, 2);
    EXPECT_EQ(times.thread_runs, 2 * threads);
    EXPECT_GE(times.work[0], 2 * 3e-3) << threads << " threads";
    double total = 0;
    for (std::size_t p = 0; p < 4; ++p) {
      EXPECT_GE(times.work[p], 0.0);
      EXPECT_GE(times.wait[p], 0.0);
      total += times.work[p] + times.wait[p];
      if (threads == 1) {
        EXPECT_EQ(times.wait[p], 0.0) << "phase " << p;
      }
    }
    EXPECT_EQ(times.work[3], 0.0);  // the body ran three phases of the four reserved
    EXPECT_LE(total, threads * wall * 1.001) << threads << " threads";

    const edl::exec::PhaseTimes before = times;
    region.time_phases(nullptr);
    region.run(threads, 4, [&](PhasedRegion::Team& team) { team.phase(1, [&](std::int64_t) { spin(1e-3); }); });
    EXPECT_EQ(times.work, before.work);
    EXPECT_EQ(times.runs, 2);
  }
}

}  // namespace
