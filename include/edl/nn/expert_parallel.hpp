// edl/nn/expert_parallel.hpp
// A mixture-of-experts block whose experts are split over a mesh axis ("ep"): expert e of E
// lives on the axis's rank e / (E / ep). Each device routes its own tokens (the router is
// replicated), sends every (token, slot) row to the rank holding its expert, runs the experts
// it holds over the rows it received, and sends the outputs back; backward sends the outputs'
// gradients the same way and brings the inputs' gradients back. This is the ExpertDispatch
// that nn::MoE's one forward and backward take (nn/moe.hpp); everything else -- the routing,
// the weighted sum of the experts' outputs, the router's gradient -- is that code's.
//
//   nn::ExpertParallel<Pol> ep(dev);                      // inside mesh.run, on axis "ep"
//   moe.forward(x, tokens, y, saved, &ep);
//   moe.backward(dy, saved, dx, &ep);
//
// Exchange: two all_to_all over the axis per direction. First the row counts (one per expert),
// then the rows themselves in equal chunks of C rows, C being the largest number of rows any
// device sends to any other, so no row is ever dropped (dropless). The memory this costs is
// bounded: C is at most a device's tokens x top_k, so each of the three exchange buffers holds
// at most ep x tokens x top_k x hidden floats. Rows arrive in source order (rank 0's first) and
// an expert runs once over all of them.
//
// Results equal one device to f32 rounding, not bit for bit: an expert's GEMMs run over another
// set of rows (the ep group's tokens instead of the whole batch's), and its weight gradient sums
// them in another order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/mesh/collectives.hpp>
#include <edl/nn/moe.hpp>

namespace edl::nn {

/// The rank of axis size `ranks` that holds expert e of E (E divisible by ranks).
constexpr std::int64_t expert_owner(std::int64_t e, std::int64_t E, std::int64_t ranks) noexcept {
  return e / (E / ranks);
}

template <class Pol>
class ExpertParallel final : public ExpertDispatch<Pol> {
 public:
  using Saved = typename MoE<Pol>::Saved;

  /// `dev`: the calling device; `axis`: the mesh axis the experts are split over.
  explicit ExpertParallel(Device& dev, std::string axis = "ep")
      : dev_(dev), axis_(std::move(axis)), ranks_(dev.axis_size(axis_)), rank_(dev.axis_index(axis_)) {}

  void forward(const MoE<Pol>& moe, const float* x, Saved& s) override {
    const MoeConfig& c = moe.config();
    const std::int64_t E = c.num_experts, H = c.hidden, K = c.top_k;
    EDL_CHECK(E % ranks_ == 0, errc::not_divisible, "nn::ExpertParallel", E, " experts do not split over ", axis_,
              " = ", ranks_);
    // Row counts: chunk q of `send` counts the rows for q's experts; chunk p of `recv` the rows
    // p sends to this rank's experts.
    std::vector<std::int64_t> send(static_cast<std::size_t>(E)), recv(static_cast<std::size_t>(E));
    for (std::int64_t e = 0; e < E; ++e) send[static_cast<std::size_t>(e)] = static_cast<std::int64_t>(s.rows[static_cast<std::size_t>(e)].size());
    all_to_all(dev_, send, recv, axis_);
    std::int64_t most = 0;
    for (std::int64_t q = 0; q < ranks_; ++q) most = std::max(most, chunk_rows(send, q));
    const std::int64_t C = pmax(dev_, most, axis_);
    s.exchange = recv;
    s.exchange.push_back(C);

    std::vector<float> out = pack(s, C, H, [&](std::int64_t e, std::int64_t r) {
      return x + (s.rows[static_cast<std::size_t>(e)][static_cast<std::size_t>(r)] / K) * H;
    });
    std::vector<float> in(out.size());
    all_to_all(dev_, out, in, axis_);
    std::fill(out.begin(), out.end(), 0.0f);
    run_local(moe, s, in, out, H, [&](std::int64_t e, const std::vector<float>& xe, std::int64_t n, std::vector<float>& ye) {
      s.xs[static_cast<std::size_t>(e)] = xe;
      moe.experts[static_cast<std::size_t>(e)].forward(s.xs[static_cast<std::size_t>(e)].data(), n, ye.data(),
                                                       s.mlp_s[static_cast<std::size_t>(e)]);
    });
    all_to_all(dev_, out, in, axis_);
    unpack(s, in, C, H, s.ys);
  }

  void backward(MoE<Pol>& moe, Saved& s, const std::vector<std::vector<float>>& dys,
                std::vector<std::vector<float>>& dxs) override {
    const std::int64_t H = moe.config().hidden;
    EDL_CHECK(!s.exchange.empty(), errc::invalid_argument, "nn::ExpertParallel::backward",
              "the block's forward did not run through this dispatch");
    const std::int64_t C = s.exchange.back();
    std::vector<float> out = pack(s, C, H, [&](std::int64_t e, std::int64_t r) {
      return dys[static_cast<std::size_t>(e)].data() + r * H;
    });
    std::vector<float> in(out.size());
    all_to_all(dev_, out, in, axis_);
    std::fill(out.begin(), out.end(), 0.0f);
    run_local(moe, s, in, out, H, [&](std::int64_t e, const std::vector<float>& dye, std::int64_t, std::vector<float>& dxe) {
      moe.experts[static_cast<std::size_t>(e)].backward(dye.data(), s.mlp_s[static_cast<std::size_t>(e)], dxe.data());
    });
    all_to_all(dev_, out, in, axis_);
    unpack(s, in, C, H, dxs);
  }

 private:
  /// Rows chunk q of a per-expert count vector holds.
  std::int64_t chunk_rows(const std::vector<std::int64_t>& counts, std::int64_t q) const {
    const std::int64_t El = static_cast<std::int64_t>(counts.size()) / ranks_;
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < El; ++j) n += counts[static_cast<std::size_t>(q * El + j)];
    return n;
  }

  /// [ranks, C, H]: chunk q holds, expert by expert, the rows for q's experts (row(e, r) points
  /// at row r of expert e's H values); the rest is zeros.
  template <class Row>
  std::vector<float> pack(const Saved& s, std::int64_t C, std::int64_t H, Row&& row) const {
    const std::int64_t E = static_cast<std::int64_t>(s.rows.size()), El = E / ranks_;
    std::vector<float> buf(static_cast<std::size_t>(ranks_ * C * H), 0.0f);
    for (std::int64_t q = 0; q < ranks_; ++q) {
      std::int64_t off = 0;
      for (std::int64_t e = q * El; e < (q + 1) * El; ++e)
        for (std::int64_t r = 0; r < static_cast<std::int64_t>(s.rows[static_cast<std::size_t>(e)].size()); ++r, ++off) {
          const float* src = row(e, r);
          std::copy(src, src + H, buf.begin() + (q * C + off) * H);
        }
    }
    return buf;
  }

  /// The inverse of pack: chunk q's rows back into per-expert buffers (rows of e in order).
  void unpack(const Saved& s, const std::vector<float>& buf, std::int64_t C, std::int64_t H,
              std::vector<std::vector<float>>& per_expert) const {
    const std::int64_t E = static_cast<std::int64_t>(s.rows.size()), El = E / ranks_;
    per_expert.assign(static_cast<std::size_t>(E), {});
    for (std::int64_t q = 0; q < ranks_; ++q) {
      std::int64_t off = 0;
      for (std::int64_t e = q * El; e < (q + 1) * El; ++e) {
        const auto n = static_cast<std::int64_t>(s.rows[static_cast<std::size_t>(e)].size());
        if (n == 0) continue;
        auto& v = per_expert[static_cast<std::size_t>(e)];
        v.assign(buf.begin() + (q * C + off) * H, buf.begin() + (q * C + off + n) * H);
        off += n;
      }
    }
  }

  /// For each expert this rank holds: its rows from every source (in source order) gathered out
  /// of `in`, f(e, rows, n, result) run once over them, and the result's rows written to `out`
  /// where they came from in `in`.
  template <class F>
  void run_local(const MoE<Pol>& moe, const Saved& s, const std::vector<float>& in, std::vector<float>& out,
                 std::int64_t H, F&& f) const {
    const std::int64_t E = moe.config().num_experts, El = E / ranks_, C = s.exchange.back();
    const auto count = [&](std::int64_t p, std::int64_t j) { return s.exchange[static_cast<std::size_t>(p * El + j)]; };
    std::vector<float> rows, result;
    for (std::int64_t j = 0; j < El; ++j) {
      std::int64_t n = 0;
      for (std::int64_t p = 0; p < ranks_; ++p) n += count(p, j);
      if (n == 0) continue;
      rows.resize(static_cast<std::size_t>(n * H));
      result.assign(static_cast<std::size_t>(n * H), 0.0f);
      const auto each_source = [&](auto&& copy) {
        std::int64_t at = 0;
        for (std::int64_t p = 0; p < ranks_; ++p) {
          std::int64_t off = 0;  // rows p sent to this rank's experts before j's
          for (std::int64_t i = 0; i < j; ++i) off += count(p, i);
          copy((p * C + off) * H, at * H, count(p, j) * H);
          at += count(p, j);
        }
      };
      each_source([&](std::int64_t src, std::int64_t dst, std::int64_t len) {
        std::copy(in.begin() + src, in.begin() + src + len, rows.begin() + dst);
      });
      f(rank_ * El + j, rows, n, result);
      each_source([&](std::int64_t back, std::int64_t from, std::int64_t len) {
        std::copy(result.begin() + from, result.begin() + from + len, out.begin() + back);
      });
    }
  }

  Device& dev_;
  std::string axis_;
  std::int64_t ranks_ = 1, rank_ = 0;
};

}  // namespace edl::nn
