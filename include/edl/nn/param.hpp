// edl/nn/param.hpp
// A trainable parameter: its value in the policy's storage dtype, its f32 gradient and the
// PartitionSpec type that says how it shards by default (HF layout, Megatron-style tensor
// parallelism: column-parallel Linear P<"tp", none>, row-parallel P<none, "tp">, norms
// P<none>, embeddings P<"tp", none>).
//
//   Param<float, P<"tp", none>> w({out, in}, Init::normal);
//   w.value(3, 5) = 1.f;  w.grad_data()[0] += 0.5f;   // gradients are always f32
//
// The gradient is allocated (zeroed) on first use, so a model used only for inference does
// not pay for it. Backward passes ACCUMULATE into grad (gradient accumulation); zero_grad()
// clears it. A frozen parameter (the base of a LoRA model) gets no gradient: backward skips
// it (trainable_grad() is null) and optimizers pass over it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <xtensor/xtensor.hpp>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/tensor/partition_spec.hpp>

namespace edl::nn {

/// A parameter's value storage: a row-major xtensor whose data starts on a cache line
/// (edl::kCacheLineBytes). Decode streams every weight from memory once per token in
/// full-vector loads, which split over two lines when a tensor starts mid-line.
template <class T, std::size_t N>
using ParamTensor = xt::xtensor<T, N, xt::layout_type::row_major, CacheLineAllocator<T>>;

/// How init() fills a parameter: normal(0, initializer_range), ones (norm weights) or zeros (biases).
enum class Init { normal, ones, zeros };

template <FloatStorage T, PartitionSpecType Spec>
struct Param {
  using value_type = T;
  using spec = Spec;
  static constexpr std::size_t rank = Spec::rank;
  using shape_type = std::array<std::size_t, rank>;

  ParamTensor<T, rank> value;
  xt::xtensor<float, rank> grad;  // empty until the first backward (or grad_data())
  Init init = Init::normal;
  bool frozen = false;

  Param() = default;
  explicit Param(const shape_type& shape, Init how = Init::normal)
      : value(ParamTensor<T, rank>::from_shape(shape)), init(how) {}

  std::int64_t numel() const noexcept { return static_cast<std::int64_t>(value.size()); }
  std::vector<std::int64_t> shape() const {
    return std::vector<std::int64_t>(value.shape().begin(), value.shape().end());
  }
  T* data() noexcept { return value.data(); }
  const T* data() const noexcept { return value.data(); }

  bool has_grad() const noexcept { return !frozen && grad.size() == value.size() && value.size() > 0; }
  /// The gradient buffer, allocated and zeroed on first use.
  float* grad_data() {
    if (grad.shape() != value.shape()) {
      grad = xt::xtensor<float, rank>::from_shape(value.shape());
      std::fill(grad.begin(), grad.end(), 0.0f);
    }
    return grad.data();
  }
  /// grad_data(), or null when the parameter is frozen.
  float* trainable_grad() { return frozen ? nullptr : grad_data(); }
  void zero_grad() {
    if (grad.shape() == value.shape()) std::fill(grad.begin(), grad.end(), 0.0f);
  }
};

/// The value of a parameter as f32 (a copy only when T is not float): kernels that need f32
/// weights (RMSNorm backward) call this.
template <FloatStorage T, class Spec>
const float* as_f32(const Param<T, Spec>& p, std::vector<float>& scratch) {
  if constexpr (std::is_same_v<T, float>) {
    return p.data();
  } else {
    scratch.resize(p.value.size());
    for (std::size_t i = 0; i < scratch.size(); ++i) scratch[i] = to_f32(p.value.data()[i]);
    return scratch.data();
  }
}

}  // namespace edl::nn
