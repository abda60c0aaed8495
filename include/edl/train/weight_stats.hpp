// edl/train/weight_stats.hpp
// Per-tensor statistics of a model's parameters, for watching the weight distribution drift
// during training (TrainingArguments::weight_distribution_log_steps; docs/training.md):
//
//   auto stats = train::weight_stats(model);   // one entry per parameter tensor, HF names
//   writer.write(train::weight_stats_json(step, stats));
//
// One line of <save_directory>/weights.jsonl:
//   {"step": 100, "tensors": {"model.embed_tokens.weight": {"numel": .., "mean": .., "std": ..,
//     "min": .., "max": .., "abs_max": .., "grad_norm": ..}, ...}}
// std is the population standard deviation. grad_norm (the L2 norm of the tensor's gradient
// of that step, after global clipping) is present only when the tensor holds a gradient.
// Sums run in double so that the figures do not depend on the tensor's size more than the
// float inputs themselves do.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/dtype.hpp>

namespace edl::train {

struct TensorStats {
  std::string name;
  std::int64_t numel = 0;
  double mean = 0, std = 0, min = 0, max = 0, abs_max = 0;
  std::optional<double> grad_norm;
};

/// Statistics of `n` values (as double); numel 0 gives zeros.
template <class T>
TensorStats tensor_stats(const T* v, std::int64_t n) {
  TensorStats s;
  s.numel = n;
  if (n <= 0) return s;
  double sum = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(to_f32(v[i]));
    sum += x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  s.mean = sum / static_cast<double>(n);
  double sq = 0;  // two passes: the one-pass formula loses precision when |mean| >> std
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(to_f32(v[i])) - s.mean;
    sq += d * d;
  }
  s.std = std::sqrt(sq / static_cast<double>(n));
  s.min = lo;
  s.max = hi;
  s.abs_max = std::max(std::abs(lo), std::abs(hi));
  return s;
}

/// One TensorStats per parameter of `model`, in visit_params order (HF names).
template <class Model>
std::vector<TensorStats> weight_stats(Model& model) {
  std::vector<TensorStats> out;
  model.visit_params("", [&](std::string_view name, auto& p) {
    TensorStats s = tensor_stats(p.value.data(), static_cast<std::int64_t>(p.value.size()));
    s.name = std::string(name);
    if (p.has_grad()) {
      double g = 0;
      for (std::size_t i = 0; i < p.grad.size(); ++i) g += static_cast<double>(p.grad.data()[i]) * p.grad.data()[i];
      s.grad_norm = std::sqrt(g);
    }
    out.push_back(std::move(s));
  });
  return out;
}

/// The weights.jsonl record of one step.
inline nlohmann::ordered_json weight_stats_json(std::int64_t step, const std::vector<TensorStats>& stats) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["step"] = step;
  nlohmann::ordered_json t = nlohmann::ordered_json::object();
  for (const auto& s : stats) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["numel"] = s.numel;
    e["mean"] = s.mean;
    e["std"] = s.std;
    e["min"] = s.min;
    e["max"] = s.max;
    e["abs_max"] = s.abs_max;
    if (s.grad_norm) e["grad_norm"] = *s.grad_norm;
    t[s.name] = std::move(e);
  }
  j["tensors"] = std::move(t);
  return j;
}

}  // namespace edl::train
