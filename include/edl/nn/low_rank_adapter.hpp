// edl/nn/low_rank_adapter.hpp
// A LoRA adapter on a Linear (Hu et al. 2021, PEFT's LoraLayer): the layer computes
//
//   y = x W^T + b + scale * dropout(x) A^T B^T      A [r, in], B [out, r], scale = alpha / r
//                                                   (rsLoRA: alpha / sqrt(r))
//
// A starts Kaiming-uniform (PEFT's kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)))
// and B at zero, so a fresh adapter adds exact zeros. The adapter's parameters have the model's
// storage dtype (with bf16 the optimizer keeps their f32 master copies, as for every bf16
// parameter); over a quantized base they are the policy's float dtype.
//
// Dropout (lora_dropout) is a pure function of (dropout key, row, column): the trainer gives
// each micro-batch a key (lora::set_dropout), so a rematerialized forward and the backward
// see the mask the forward saw, and the same seed drops the same elements on every run.
// Without a key (inference, evaluation) nothing is dropped. On a mesh a device holds a block of
// the rows and, under a row-parallel base, of the input columns: its DropoutIndex places them
// in the whole batch, so every device draws the mask one device would.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/rng.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/param.hpp>
#include <edl/tensor/partition_spec.hpp>

namespace edl::nn {

namespace detail {
// How A and B shard with their base (Megatron): a column-parallel base splits B's rows, a
// row-parallel base splits A's columns; the r dimension is never split.
template <class WSpec> struct adapter_specs {
  using a = P<none, none>;
  using b = P<"tp", none>;
};
template <> struct adapter_specs<P<none, "tp">> {
  using a = P<none, "tp">;
  using b = P<none, none>;
};
}  // namespace detail

/// Where the rows and input columns a Linear sees sit in the whole batch, for dropout's
/// (row, column) counter. The default is the whole batch: row r of the call is row r of
/// [batch * seq], column c is column c of the input.
struct DropoutIndex {
  std::int64_t row_block = 0;  // rows per batch row in a call (0: the rows are the batch's)
  std::int64_t seq = 0;        // the batch's sequence length
  std::int64_t first_row = 0;  // the batch row of the call's first row block
  std::int64_t first_pos = 0;  // the sequence position of each row block's first row
  std::int64_t first_col = 0;  // the input column of the call's first column
  std::int64_t cols = 0;       // the batch's input columns (0: the adapter's in())

  std::int64_t row(std::int64_t r) const noexcept {
    return row_block ? (first_row + r / row_block) * seq + first_pos + r % row_block : r;
  }
};

template <FloatStorage T, PartitionSpecType WSpec>
struct LowRankAdapter {
  Param<T, typename detail::adapter_specs<WSpec>::a> A;  // lora_A.weight [r, in]
  Param<T, typename detail::adapter_specs<WSpec>::b> B;  // lora_B.weight [out, r]
  double alpha = 1.0;               // lora_alpha
  bool rslora = false;              // scale = alpha / sqrt(r) instead of alpha / r
  float scale = 1.0f;
  float dropout = 0.0f;             // probability of dropping an input element in training
  std::optional<Key> dropout_key;   // set while training (lora::set_dropout); none: no dropout
  bool active = true;               // false: the Linear computes its base alone (lora::AdaptersOff)
  DropoutIndex index;               // the whole batch, unless a mesh device sets its block

  LowRankAdapter() = default;
  LowRankAdapter(std::int64_t in, std::int64_t out, std::int64_t r, double alpha_, bool rslora_, float dropout_)
      : A({static_cast<std::size_t>(r), static_cast<std::size_t>(in)}, Init::zeros),
        B({static_cast<std::size_t>(out), static_cast<std::size_t>(r)}, Init::zeros),
        alpha(alpha_),
        rslora(rslora_),
        scale(static_cast<float>(rslora_ ? alpha_ / std::sqrt(static_cast<double>(r)) : alpha_ / static_cast<double>(r))),
        dropout(dropout_) {}

  std::int64_t rank() const noexcept { return static_cast<std::int64_t>(A.value.shape()[0]); }
  std::int64_t in() const noexcept { return static_cast<std::int64_t>(A.value.shape()[1]); }
  std::int64_t out() const noexcept { return static_cast<std::int64_t>(B.value.shape()[0]); }
  bool drops() const noexcept { return dropout > 0.0f && dropout_key.has_value(); }

  /// PEFT's initialization: A ~ U(-1/sqrt(in), 1/sqrt(in)) from `key`, B = 0.
  void reset(Key key) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in()));
    std::vector<float> a(A.value.size());
    fill_uniform(key, 0, std::span<float>(a), -bound, bound);
    for (std::size_t i = 0; i < a.size(); ++i) A.data()[i] = from_f32<T>(a[i]);
    std::fill(B.value.begin(), B.value.end(), from_f32<T>(0.0f));
  }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    f(join_path(prefix, "lora_A.weight"), A);
    f(join_path(prefix, "lora_B.weight"), B);
  }

  /// Whether input element (row, col) is kept under the current key (drops() must hold).
  bool keeps(std::int64_t row, std::int64_t col) const noexcept {
    const std::uint64_t counter = static_cast<std::uint64_t>(index.row(row)) *
                                      static_cast<std::uint64_t>(index.cols ? index.cols : in()) +
                                  static_cast<std::uint64_t>(index.first_col + col);
    return bits_to_unit_float(random_bits_at(*dropout_key, counter)) >= dropout;
  }
  /// h = dropout(x) [rows, in]: kept elements scaled by 1 / (1 - p), dropped ones zero (h may
  /// be x: the backward passes its gradient through the same mask in place).
  void drop(const float* x, std::int64_t rows, float* h) const {
    const std::int64_t K = in();
    const float keep_scale = 1.0f / (1.0f - dropout);
    exec::parallel_for(0, rows, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t t = lo; t < hi; ++t)
        for (std::int64_t j = 0; j < K; ++j) h[t * K + j] = keeps(t, j) ? x[t * K + j] * keep_scale : 0.0f;
    });
  }
};

}  // namespace edl::nn
