// edl/kernels/peak.hpp
// The machine's arithmetic peak, measured: measure_peak(threads) runs, on each of `threads`
// threads, independent chains of fused multiply-adds held in registers, with no memory
// traffic, and reports the rate of the best of several trials:
//   - f32_gflops: xsimd FMAs on the widest float batch of the build (16 lanes with AVX-512,
//     8 with AVX2), 2 flops per lane;
//   - bf16_gflops: AVX-512 BF16 `vdpbf16ps` (32 bf16 products summed pairwise into 16 f32
//     lanes), 2 flops per product; nullopt when the build target lacks AVX512_BF16;
//   - int8_gops: VNNI `vpdpbusd` (u8 x s8 products summed four at a time into int32 lanes,
//     64 products per 512-bit instruction with AVX512_VNNI, 32 per 256-bit one with
//     AVX-VNNI), 2 ops per product; nullopt when the build target has neither.
// This is what a kernel could reach if it did nothing but multiply-add: the denominator of
// "fraction of peak" figures (the trainer's MFU), which a GEMM's own rate is not, since the
// GEMM is one of the things being measured against it.
//
// How: kAccumulators (12) independent chains per thread, more than FMA latency x FMA units on
// current x86 cores (4 x 2), so the FMA units never wait for a result. Each trial's iteration
// count is calibrated to about 50 ms; the best of kTrials trials is kept (a shared machine
// can only make a trial slower). The threads are plain std::threads started together, each
// timed from its own start to its own end, the trial from the first start to the last end.
// The chains' inputs come from volatile loads and their results are summed into a volatile
// sink, so the compiler can neither fold nor drop the loop.
//
// The arithmetic is checkable (tests/kernels/test_peak.cpp): peak_detail::fma_chain(n)
// returns every lane of every accumulator after n steps of acc = acc * kMul + kAdd, which
// converges to 1 and stays a normal float however many steps run; the bf16 and int8 chains
// add a constant each step (closed form: start + n x step).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <edl/core/error.hpp>
#include <edl/kernels/detail/fma.hpp>

#if defined(__AVX512BF16__) || defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#include <immintrin.h>
#endif

namespace edl::kernels {

/// The measured peaks, summed over the threads. bf16 / int8 are nullopt when the build target
/// has no instruction for them.
struct PeakResult {
  double f32_gflops = 0.0;
  std::optional<double> bf16_gflops, int8_gops;
};

namespace peak_detail {

using fbatch = xsimd::batch<float>;
inline constexpr std::size_t kLanes = fbatch::size;
/// Independent accumulators per thread (registers; 12 + 2 constants fit AVX2's 16).
inline constexpr std::size_t kAccumulators = 12;
/// acc = acc * kMul + kAdd: fixed point kAdd / (1 - kMul) = 1, reached from any start in (0, 2).
inline constexpr float kMul = 1.0f - 1.0f / 1024.0f;
inline constexpr float kAdd = 1.0f / 1024.0f;
inline constexpr int kTrials = 5;
inline constexpr double kTrialSeconds = 0.05;

/// The start value of accumulator `acc`, lane `lane` of the f32 chain: distinct per lane, in (0.5, 1).
inline float chain_start(std::size_t acc, std::size_t lane) noexcept {
  return 0.5f + static_cast<float>(acc * kLanes + lane + 1) / 1024.0f;
}

/// A value the compiler cannot see through (so it cannot fold the chains).
template <class T>
inline T opaque(T x) noexcept {
  volatile T v = x;
  return v;
}

template <std::size_t... J>
inline void fma_steps(std::int64_t iterations, fbatch* acc, std::index_sequence<J...>) noexcept {
  const fbatch a(opaque(kMul)), b(opaque(kAdd));
  fbatch r[] = {acc[J]...};  // constant indices only: the compiler keeps r in registers
  for (std::int64_t i = 0; i < iterations; ++i) ((r[J] = detail::fmadd(r[J], a, b)), ...);
  ((acc[J] = r[J]), ...);
}

/// Every lane of every accumulator (accumulator-major) after `iterations` steps of
/// acc = fma(acc, kMul, kAdd), rounded once per step, exactly as measure_peak computes them.
inline std::vector<float> fma_chain(std::int64_t iterations) {
  alignas(64) float start[kAccumulators][kLanes];
  for (std::size_t j = 0; j < kAccumulators; ++j)
    for (std::size_t l = 0; l < kLanes; ++l) start[j][l] = chain_start(j, l);
  fbatch acc[kAccumulators];
  for (std::size_t j = 0; j < kAccumulators; ++j) acc[j] = fbatch::load_aligned(start[j]);
  fma_steps(iterations, acc, std::make_index_sequence<kAccumulators>{});
  std::vector<float> out(kAccumulators * kLanes);
  for (std::size_t j = 0; j < kAccumulators; ++j) acc[j].store_unaligned(out.data() + j * kLanes);
  return out;
}
/// Flops of fma_chain(iterations): 2 per lane per FMA.
inline double fma_chain_flops(std::int64_t iterations) noexcept {
  return 2.0 * static_cast<double>(kLanes * kAccumulators) * static_cast<double>(iterations);
}

#if defined(__AVX512BF16__)
inline constexpr bool kHaveBf16 = true;
/// The bf16 chain: each step adds 0.5 x 0.5 + 0.5 x 0.5 = 0.5 to every f32 lane. Returns the
/// 16 lanes of each accumulator (accumulator-major), all starting at j (the accumulator's
/// index): j + n / 2, exact while that stays below 2^23.
template <std::size_t... J>
inline std::vector<float> bf16_chain_impl(std::int64_t iterations, std::index_sequence<J...>) {
  const __m512 half = _mm512_set1_ps(opaque(0.5f));
  const __m512bh a = _mm512_cvtne2ps_pbh(half, half), b = _mm512_cvtne2ps_pbh(half, half);
  __m512 r[] = {_mm512_set1_ps(static_cast<float>(J))...};
  for (std::int64_t i = 0; i < iterations; ++i) ((r[J] = _mm512_dpbf16_ps(r[J], a, b)), ...);
  std::vector<float> out(kAccumulators * 16);
  ((_mm512_storeu_ps(out.data() + J * 16, r[J])), ...);
  return out;
}
inline std::vector<float> bf16_chain(std::int64_t iterations) {
  return bf16_chain_impl(iterations, std::make_index_sequence<kAccumulators>{});
}
inline double bf16_chain_flops(std::int64_t iterations) noexcept {
  return 2.0 * 32.0 * static_cast<double>(kAccumulators) * static_cast<double>(iterations);
}
#else
inline constexpr bool kHaveBf16 = false;
#endif

#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
inline constexpr bool kHaveInt8 = true;
/// int8 products per instruction: 64 with 512-bit VNNI, 32 with AVX-VNNI's 256-bit one.
#if defined(__AVX512VNNI__)
inline constexpr std::size_t kInt8Products = 64;
#else
inline constexpr std::size_t kInt8Products = 32;
#endif
inline constexpr std::size_t kInt32Lanes = kInt8Products / 4;
/// The int8 chain: u8 bytes 1 times s8 bytes 1, four per int32 lane, so each step adds 4 to every
/// lane. Returns the kInt32Lanes lanes of each accumulator (accumulator-major), all starting at j
/// (the accumulator's index): j + 4 n.
template <std::size_t... J>
inline std::vector<std::int32_t> int8_chain_impl(std::int64_t iterations, std::index_sequence<J...>) {
  std::vector<std::int32_t> out(kAccumulators * kInt32Lanes);
  const int ones = opaque(0x01010101);
#if defined(__AVX512VNNI__)
  const __m512i a = _mm512_set1_epi32(ones), b = _mm512_set1_epi32(ones);
  __m512i r[] = {_mm512_set1_epi32(static_cast<int>(J))...};
  for (std::int64_t i = 0; i < iterations; ++i) ((r[J] = _mm512_dpbusd_epi32(r[J], a, b)), ...);
  ((_mm512_storeu_si512(out.data() + J * kInt32Lanes, r[J])), ...);
#else
  const __m256i a = _mm256_set1_epi32(ones), b = _mm256_set1_epi32(ones);
  __m256i r[] = {_mm256_set1_epi32(static_cast<int>(J))...};
  for (std::int64_t i = 0; i < iterations; ++i) ((r[J] = _mm256_dpbusd_avx_epi32(r[J], a, b)), ...);
  ((_mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data() + J * kInt32Lanes), r[J])), ...);
#endif
  return out;
}
inline std::vector<std::int32_t> int8_chain(std::int64_t iterations) {
  return int8_chain_impl(iterations, std::make_index_sequence<kAccumulators>{});
}
inline double int8_chain_ops(std::int64_t iterations) noexcept {
  return 2.0 * static_cast<double>(kInt8Products * kAccumulators) * static_cast<double>(iterations);
}
#else
inline constexpr bool kHaveInt8 = false;
#endif

/// Sums a chain's results into a volatile sink (one per call, so threads share nothing), so
/// that no chain is dead code.
template <class T>
inline void consume(const std::vector<T>& v) noexcept {
  double s = 0.0;
  for (const T& x : v) s += static_cast<double>(x);
  volatile double sink = s;
  (void)sink;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Iterations of chain(n) that take about kTrialSeconds on one thread.
template <class Chain>
inline std::int64_t calibrate(Chain&& chain) {
  std::int64_t n = 1 << 12;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    consume(chain(n));
    const double s = seconds_since(t0);
    if (s >= 0.005 || n >= (std::int64_t{1} << 40)) {
      const double per_iteration = s / static_cast<double>(n);
      return std::max<std::int64_t>(1, static_cast<std::int64_t>(kTrialSeconds / std::max(per_iteration, 1e-12)));
    }
    n *= 4;
  }
}

/// Best rate (units per second) of kTrials trials, each running chain(iterations) on `threads`
/// threads at once; `units` is the work of one chain(iterations).
template <class Chain>
inline double best_rate(int threads, Chain&& chain, double (*units)(std::int64_t)) {
  using clock = std::chrono::steady_clock;
  const std::int64_t iterations = calibrate(chain);
  double best = 0.0;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::atomic<bool> go{false};
    std::vector<clock::time_point> start(static_cast<std::size_t>(threads)), end(start.size());
    std::vector<std::thread> pool;
    pool.reserve(start.size());
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        start[static_cast<std::size_t>(t)] = clock::now();
        consume(chain(iterations));
        end[static_cast<std::size_t>(t)] = clock::now();
      });
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double s =
        std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) -
                                      *std::min_element(start.begin(), start.end()))
            .count();
    if (s > 0) best = std::max(best, static_cast<double>(threads) * units(iterations) / s);
  }
  return best;
}

}  // namespace peak_detail

/// The FMA peak of `threads` threads (see the top of this file); takes about 0.3 s per kind
/// the build has (f32, bf16, int8).
inline PeakResult measure_peak(int threads) {
  EDL_CHECK(threads >= 1, errc::invalid_argument, "kernels.measure_peak", "threads = ", threads, ", expected >= 1");
  namespace p = peak_detail;
  PeakResult r;
  r.f32_gflops = p::best_rate(threads, p::fma_chain, p::fma_chain_flops) / 1e9;
#if defined(__AVX512BF16__)
  r.bf16_gflops = p::best_rate(threads, p::bf16_chain, p::bf16_chain_flops) / 1e9;
#endif
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
  r.int8_gops = p::best_rate(threads, p::int8_chain, p::int8_chain_ops) / 1e9;
#endif
  return r;
}

}  // namespace edl::kernels
