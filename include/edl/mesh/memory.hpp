// edl/mesh/memory.hpp
// Per-device memory accounting: bytes live on each simulated device and the peak since the
// last reset. Sharded tensors report their shards here, so "fsdp=4 holds a quarter of the
// parameters on each device" is a measured fact rather than a claim.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <edl/core/error.hpp>

namespace edl {

class MemoryTracker {
 public:
  explicit MemoryTracker(std::int64_t devices = 1)
      : n_(devices), live_(new std::atomic<std::int64_t>[static_cast<std::size_t>(devices)]),
        peak_(new std::atomic<std::int64_t>[static_cast<std::size_t>(devices)]) {
    for (std::int64_t d = 0; d < n_; ++d) live_[d] = 0, peak_[d] = 0;
  }

  std::int64_t devices() const noexcept { return n_; }

  void allocate(std::int64_t device, std::int64_t bytes) noexcept {
    const std::int64_t now = live_[device].fetch_add(bytes) + bytes;
    std::int64_t p = peak_[device].load();
    while (now > p && !peak_[device].compare_exchange_weak(p, now)) {
    }
  }
  void release(std::int64_t device, std::int64_t bytes) noexcept { live_[device].fetch_sub(bytes); }

  std::int64_t live(std::int64_t device) const noexcept { return live_[device].load(); }
  std::int64_t peak(std::int64_t device) const noexcept { return peak_[device].load(); }
  std::int64_t total_live() const noexcept {
    std::int64_t s = 0;
    for (std::int64_t d = 0; d < n_; ++d) s += live_[d].load();
    return s;
  }
  std::int64_t max_peak() const noexcept {
    std::int64_t m = 0;
    for (std::int64_t d = 0; d < n_; ++d) m = std::max(m, peak_[d].load());
    return m;
  }
  /// Starts a new peak window at the current live bytes (e.g. before one training step).
  void reset_peak() noexcept {
    for (std::int64_t d = 0; d < n_; ++d) peak_[d] = live_[d].load();
  }

 private:
  std::int64_t n_;
  std::unique_ptr<std::atomic<std::int64_t>[]> live_, peak_;
};

}  // namespace edl
