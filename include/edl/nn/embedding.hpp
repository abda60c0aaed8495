// edl/nn/embedding.hpp
// Token embedding, HF layout weight [vocab, hidden], spec P<"tp", none> (vocab-parallel).
//
// forward:  y[t, :] = W[ids[t], :]                     (gather; ids checked against vocab)
// backward: dW[ids[t], :] += dy[t, :] for t in order   (scatter-add; hidden columns are split
//           across threads, tokens always summed in order: deterministic for any thread count)
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/rng.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/param.hpp>

namespace edl::nn {

template <class Pol>
class Embedding {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  using T = typename Pol::param_t;
  using WeightParam = Param<T, P<"tp", none>>;

  struct Saved {
    std::vector<std::int64_t> ids;
  };

  Embedding() = default;
  Embedding(std::int64_t vocab, std::int64_t hidden) : vocab_(vocab), hidden_(hidden) {
    EDL_CHECK(vocab > 0 && hidden > 0, errc::invalid_argument, "nn.Embedding",
              "vocab and hidden must be positive, found ", vocab, ", ", hidden);
    weight = WeightParam({static_cast<std::size_t>(vocab), static_cast<std::size_t>(hidden)}, Init::normal);
  }

  WeightParam weight;
  std::int64_t vocab_size() const noexcept { return vocab_; }
  std::int64_t hidden_size() const noexcept { return hidden_; }

  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    f(join_path(prefix, "weight"), weight);
  }
  std::int64_t param_count() const noexcept { return vocab_ * hidden_; }
  double flops_forward(std::int64_t) const noexcept { return 0.0; }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  /// Inference gather. Throws errc::invalid_argument for an id outside [0, vocab).
  void apply(const std::int64_t* ids, std::int64_t tokens, float* y) const {
    for (std::int64_t t = 0; t < tokens; ++t)
      EDL_CHECK(ids[t] >= 0 && ids[t] < vocab_, errc::invalid_argument, "nn.Embedding", "token id ids[", t,
                "] = ", ids[t], ", expected in [0, ", vocab_, ")");
    const std::int64_t H = hidden_;
    const T* w = weight.data();
    exec::parallel_for(0, tokens, std::max<std::int64_t>(1, 16384 / H), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t t = lo; t < hi; ++t) {
        const T* src = w + ids[t] * H;
        float* dst = y + t * H;
        for (std::int64_t j = 0; j < H; ++j) dst[j] = to_f32(src[j]);
      }
    });
  }
  void forward(const std::int64_t* ids, std::int64_t tokens, float* y, Saved& s) const {
    apply(ids, tokens, y);
    s.ids.assign(ids, ids + tokens);
  }

  /// dW[ids[t]] += dy[t] (accumulates).
  void backward(const float* dy, const Saved& s) {
    if (weight.frozen) return;
    float* g = weight.grad_data();
    const std::int64_t H = hidden_, tokens = static_cast<std::int64_t>(s.ids.size());
    exec::parallel_for(0, H, 64, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t t = 0; t < tokens; ++t) {
        float* dst = g + s.ids[static_cast<std::size_t>(t)] * H;
        const float* src = dy + t * H;
        for (std::ptrdiff_t j = lo; j < hi; ++j) dst[j] += src[j];
      }
    });
  }

 private:
  std::int64_t vocab_ = 0, hidden_ = 0;
};

}  // namespace edl::nn
