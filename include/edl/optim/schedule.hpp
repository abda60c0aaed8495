// edl/optim/schedule.hpp
// Learning-rate schedules (optax / EasyDeL names): constant; linear warm-up then linear or
// cosine decay from `lr` to `lr_end` over the remaining steps; warm-up + stable + decay (WSD).
// lr_at(step) is a pure function of the step, so a resumed run sees the same rates.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include <edl/core/error.hpp>

namespace edl::optim {

enum class ScheduleKind { constant, linear, cosine, warmup_stable_decay };

inline ScheduleKind schedule_from_name(std::string_view name) {
  if (name == "none" || name == "constant") return ScheduleKind::constant;
  if (name == "linear") return ScheduleKind::linear;
  if (name == "cosine") return ScheduleKind::cosine;
  if (name == "warmup_stable_decay" || name == "wsd") return ScheduleKind::warmup_stable_decay;
  detail::raise(errc::config, "scheduler",
                detail::concat("expected one of none, linear, cosine, warmup_stable_decay; found \"", name, "\""));
}

struct Schedule {
  ScheduleKind kind = ScheduleKind::constant;
  double lr = 1e-3;          // peak rate (after warm-up)
  double lr_end = 0.0;       // rate at total_steps (linear, cosine, WSD)
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  double decay_fraction = 0.1;  // WSD: the last fraction of the steps decays (linearly)

  /// Rate for optimizer step `step` (0-based: the first update uses lr_at(0)).
  double lr_at(std::int64_t step) const {
    if (warmup_steps > 0 && step < warmup_steps)  // optax linear warm-up from 0, reaching lr at warmup_steps
      return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
    if (kind == ScheduleKind::constant) return lr;
    const std::int64_t decay_total = std::max<std::int64_t>(1, total_steps - warmup_steps);
    const double t = std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_total), 0.0, 1.0);
    switch (kind) {
      case ScheduleKind::linear: return lr + (lr_end - lr) * t;
      case ScheduleKind::cosine: return lr_end + (lr - lr_end) * 0.5 * (1.0 + std::cos(M_PI * t));
      case ScheduleKind::warmup_stable_decay: {
        const double start = 1.0 - decay_fraction;
        if (t <= start) return lr;
        return lr + (lr_end - lr) * (t - start) / std::max(decay_fraction, 1e-12);
      }
      default: return lr;
    }
  }
};

}  // namespace edl::optim
