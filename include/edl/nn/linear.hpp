// edl/nn/linear.hpp
// Linear layer, HF/PyTorch layout: weight [out, in], y = x W^T + b.
//
//   ColumnLinear<Pol> q(in, out);          // weight spec P<"tp", none>, bias P<"tp">
//   RowLinear<Pol> o(in, out);             // weight spec P<none, "tp">, bias P<none>
//   Linear<Pol, WSpec>::Saved s;  lin.forward(x, rows, y, s);  lin.backward(dy, s, dx);
//
// forward:  y[T, out] = x[T, in] W^T (+ b)                      (kernels::matmul_nt)
// backward: dW += dy^T x (matmul_tn, accumulate), db += sum_t dy, dx = dy W (or dx += dy W)
//
// A Linear may hold its weight quantized instead (quantize(format), quant::Matrix in qweight):
// forward multiplies through kernels::linear_quant, backward computes dx and db but no dW (a
// quantized weight is frozen, as in QLoRA), and visit_params no longer lists the weight;
// visit_linears reaches it.
//
// A Linear may also carry a LoRA adapter (`lora`, low_rank_adapter.hpp; lora::apply_lora adds
// them): every forward adds scale * dropout(x) A^T B^T, backward accumulates dA and dB and
// adds the adapter's share of dx. The base weight is then frozen (Param::frozen) and gets no
// gradient; a quantized base is QLoRA. visit_params lists the adapter as
// "<path>.lora_A.weight" / "<path>.lora_B.weight" after the base.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include <type_traits>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/rng.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/quant_matvec.hpp>
#include <edl/nn/low_rank_adapter.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/param.hpp>
#include <edl/quant/matrix.hpp>
#include <edl/tensor/partition_spec.hpp>

namespace edl::kernels {}
namespace edl::nn {

/// GEMM entry points, found whether gemm.hpp declares them in edl:: or edl::kernels::.
namespace gemm_ops {
using namespace ::edl::kernels;
using namespace ::edl;
template <class TA, class TB>
void mm(const TA* A, const TB* B, float* C, std::int64_t M, std::int64_t N, std::int64_t K, bool acc = false) {
  matmul(A, B, C, M, N, K, acc);
}
template <class TA, class TB>
void mm_nt(const TA* A, const TB* B, float* C, std::int64_t M, std::int64_t N, std::int64_t K, bool acc = false) {
  matmul_nt(A, B, C, M, N, K, acc);
}
template <class TA, class TB>
void mm_tn(const TA* A, const TB* B, float* C, std::int64_t M, std::int64_t N, std::int64_t K, bool acc = false) {
  matmul_tn(A, B, C, M, N, K, acc);
}
}  // namespace gemm_ops

using ColumnParallel = P<"tp", none>;  // output features split over tp
using RowParallel = P<none, "tp">;     // input features split over tp

namespace detail {
template <class WSpec> struct bias_spec { using type = P<none>; };
template <> struct bias_spec<ColumnParallel> { using type = P<"tp">; };
}  // namespace detail

template <class Pol, PartitionSpecType WSpec = ColumnParallel>
class Linear {
  EDL_NN_CHECK_POLICY(Pol);
  static_assert(WSpec::rank == 2, "edl::nn::Linear: the weight spec must have rank 2 ([out, in])");

 public:
  using T = typename Pol::param_t;
  using WeightParam = Param<T, WSpec>;
  using BiasParam = Param<T, typename detail::bias_spec<WSpec>::type>;

  using Adapter = LowRankAdapter<T, WSpec>;

  struct Saved {
    const float* x = nullptr;  // input [rows, in], owned by the caller
    std::int64_t rows = 0;
    std::vector<float> adapter_u;  // scale * dropout(x) A^T [rows, r], with an adapter

    /// Re-points at an input with forward's values (rematerialization), keeping adapter_u.
    void point_at(const float* input, std::int64_t n) noexcept {
      x = input;
      rows = n;
    }
  };

  Linear() = default;
  Linear(std::int64_t in, std::int64_t out, bool bias = false) : in_(in), out_(out), has_bias_(bias) {
    EDL_CHECK(in > 0 && out > 0, errc::invalid_argument, "nn.Linear", "in and out must be positive, found in = ", in,
              ", out = ", out);
    weight = WeightParam({static_cast<std::size_t>(out), static_cast<std::size_t>(in)}, Init::normal);
    if (bias) this->bias = BiasParam({static_cast<std::size_t>(out)}, Init::zeros);
  }

  WeightParam weight;     // empty when quantized
  BiasParam bias;         // empty unless has_bias()
  quant::Matrix qweight;  // the weight [out, in] quantized, or empty
  std::optional<Adapter> lora;  // a LoRA adapter, or none

  bool is_quantized() const noexcept { return !qweight.empty(); }
  /// Whether the adapter takes part in the forward (one exists and is not switched off).
  bool adapts() const noexcept { return lora.has_value() && lora->active; }

  /// Replaces the weight by its quantization to `f` (`path` names it in errors).
  void quantize(quant::Format f, const std::string& path) {
    EDL_CHECK(!is_quantized(), errc::invalid_argument, path, "is already quantized (", quant::format_name(qweight.format()), ")");
    std::vector<float> scratch;
    qweight = quant::Matrix::quantize(f, as_f32(weight, scratch), out_, in_, path);
    weight = WeightParam();
  }
  /// Replaces a quantized weight by its dequantization, rounded once to T (nothing to do when
  /// the weight is not quantized).
  void dequantize() {
    if (!is_quantized()) return;
    std::vector<float> w(static_cast<std::size_t>(out_ * in_));
    qweight.dequantize(w.data());
    weight = WeightParam({static_cast<std::size_t>(out_), static_cast<std::size_t>(in_)});
    for (std::size_t i = 0; i < w.size(); ++i) weight.data()[i] = from_f32<T>(w[i]);
    qweight = quant::Matrix();
  }
  /// Takes an already quantized weight (a file's), checking its shape against the layer's.
  void set_quantized(quant::Matrix m, const std::string& path) {
    EDL_CHECK(m.rows() == out_ && m.cols() == in_, errc::shape_mismatch, path, "quantized weight is [", m.rows(), ", ",
              m.cols(), "], expected [", out_, ", ", in_, "]");
    qweight = std::move(m);
    weight = WeightParam();
  }

  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }
  bool has_bias() const noexcept { return has_bias_; }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    if (!is_quantized()) f(join_path(prefix, "weight"), weight);
    if (has_bias_) f(join_path(prefix, "bias"), bias);
    if (lora) lora->visit_params(prefix, f);
  }
  /// f(path, Linear&) for this layer (composite modules list theirs the same way).
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    f(std::string(prefix), *this);
  }
  std::int64_t param_count() const noexcept { return in_ * out_ + (has_bias_ ? out_ : 0); }
  double flops_forward(std::int64_t rows) const noexcept {
    return 2.0 * static_cast<double>(rows) * static_cast<double>(in_) * static_cast<double>(out_);
  }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  /// y[rows, out] = x[rows, in] W^T + b (+ the adapter's term). Saves a pointer to x.
  void forward(const float* x, std::int64_t rows, float* y, Saved& s) const {
    apply_base(x, rows, y);
    if (adapts()) add_adapter(x, rows, y, s.adapter_u);
    else s.adapter_u.clear();
    s.point_at(x, rows);
  }
  /// Inference: y = x W^T + b (+ the adapter's term), nothing saved.
  void apply(const float* x, std::int64_t rows, float* y) const {
    apply_base(x, rows, y);
    if (adapts()) {
      std::vector<float> u;
      add_adapter(x, rows, y, u);
    }
  }

  /// Accumulates dW (and db); writes dx = dy W, or adds it when accumulate_dx (dx may be null
  /// to skip the input gradient).
  void backward(const float* dy, const Saved& s, float* dx, bool accumulate_dx = false) {
    EDL_CHECK(s.x != nullptr || s.rows == 0, errc::invalid_argument, "nn.Linear.backward",
              "Saved holds no input: call forward first");
    if (!is_quantized() && !weight.frozen)
      nn::gemm_ops::mm_tn(dy, s.x, weight.grad_data(), out_, in_, s.rows, /*accumulate=*/true);
    if (has_bias_ && !bias.frozen) {
      float* db = bias.grad_data();
      const std::int64_t rows = s.rows, out = out_;
      // Columns in parallel, rows summed in order: the same sums for any thread count.
      exec::parallel_for(0, out, 256, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
        for (std::int64_t t = 0; t < rows; ++t)
          for (std::ptrdiff_t j = lo; j < hi; ++j) db[j] += dy[t * out + j];
      });
    }
    if (dx && is_quantized()) kernels::matmul_dequantized(dy, s.rows, qweight.view(), dx, accumulate_dx);
    else if (dx) nn::gemm_ops::mm(dy, weight.data(), dx, s.rows, in_, out_, accumulate_dx);
    if (adapts()) adapter_backward(dy, s, dx);
  }

 private:
  void apply_base(const float* x, std::int64_t rows, float* y) const {
    if (is_quantized()) return kernels::linear_quant(x, rows, qweight.view(), has_bias_ ? bias.data() : nullptr, y);
    nn::gemm_ops::mm_nt(x, weight.data(), y, rows, out_, in_);
    if (has_bias_) add_bias(y, rows);
  }

  // The adapter's input: x, or dropout(x) in `h` while a dropout key is set (forward and
  // backward draw the same mask from it).
  const float* adapter_input(const float* x, std::int64_t rows, std::vector<float>& h) const {
    if (!lora->drops()) return x;
    h.resize(static_cast<std::size_t>(rows * in_));
    lora->drop(x, rows, h.data());
    return h.data();
  }

  // y += u B^T with u = scale * dropout(x) A^T [rows, r] (kept for backward).
  void add_adapter(const float* x, std::int64_t rows, float* y, std::vector<float>& u) const {
    const Adapter& a = *lora;
    const std::int64_t r = a.rank();
    u.resize(static_cast<std::size_t>(rows * r));
    std::vector<float> h;
    nn::gemm_ops::mm_nt(adapter_input(x, rows, h), a.A.data(), u.data(), rows, r, in_);
    for (float& v : u) v *= a.scale;
    nn::gemm_ops::mm_nt(u.data(), a.B.data(), y, rows, out_, r, /*accumulate=*/true);
  }

  // dB += dy^T u;  du = scale * dy B;  dA += du^T dropout(x);  dx += dropout'(du A).
  void adapter_backward(const float* dy, const Saved& s, float* dx) {
    Adapter& a = *lora;
    const std::int64_t r = a.rank(), rows = s.rows;
    EDL_CHECK(static_cast<std::int64_t>(s.adapter_u.size()) == rows * r, errc::invalid_argument, "nn.Linear.backward",
              "Saved holds no adapter activations: the forward ran without the adapter");
    if (float* gB = a.B.trainable_grad()) nn::gemm_ops::mm_tn(dy, s.adapter_u.data(), gB, out_, r, rows, true);
    std::vector<float> du(static_cast<std::size_t>(rows * r));
    nn::gemm_ops::mm(dy, a.B.data(), du.data(), rows, r, out_);
    for (float& v : du) v *= a.scale;
    std::vector<float> h;
    if (float* gA = a.A.trainable_grad())
      nn::gemm_ops::mm_tn(du.data(), adapter_input(s.x, rows, h), gA, r, in_, rows, true);
    if (!dx) return;
    if (!a.drops()) return nn::gemm_ops::mm(du.data(), a.A.data(), dx, rows, in_, r, /*accumulate=*/true);
    // d(dropout(x)) = du A, then through the same mask as forward's: dropout is linear in its input.
    h.resize(static_cast<std::size_t>(rows * in_));
    nn::gemm_ops::mm(du.data(), a.A.data(), h.data(), rows, in_, r);
    a.drop(h.data(), rows, h.data());
    kernels::add_inplace(dx, static_cast<const float*>(h.data()), static_cast<std::ptrdiff_t>(rows * in_));
  }

  void add_bias(float* y, std::int64_t rows) const {
    const T* b = bias.data();
    const std::int64_t out = out_;
    exec::parallel_for(0, rows, std::max<std::int64_t>(1, 16384 / out), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t t = lo; t < hi; ++t)
        for (std::int64_t j = 0; j < out; ++j) y[t * out + j] += to_f32(b[j]);
    });
  }

  std::int64_t in_ = 0, out_ = 0;
  bool has_bias_ = false;
};

template <class Pol>
using ColumnLinear = Linear<Pol, ColumnParallel>;
template <class Pol>
using RowLinear = Linear<Pol, RowParallel>;

}  // namespace edl::nn
