// edl/nn/moe.hpp
// Sparse mixture-of-experts feed-forward, as HF MixtralSparseMoeBlock (and Qwen2-MoE's routing):
//
//   logits = x Wr^T                         router "gate": [E, hidden], no bias, f32
//   p      = softmax(logits)                over the E experts, f32
//   top    = the k largest p per token      (ties: the lower expert index first)
//   w      = p[top] / sum p[top]            renormalised (Mixtral; Qwen2-MoE: norm_topk_prob)
//   y      = sum_k w_k * expert_{top_k}(x)  each expert a SwiGLU MLP (w1 gate, w3 up, w2 down)
//   y     += sigmoid(x Ws^T) * shared(x)     Qwen2-MoE's shared expert and its gate, when present
//
// Parameter names: Mixtral's (gate, experts.J.w1|w2|w3) or, with MoeConfig::names = qwen,
// Qwen2-MoE's and Qwen3-MoE's (gate, experts.J.gate_proj|up_proj|down_proj, shared_expert.*,
// shared_expert_gate).
//
// Tokens are grouped by expert (dropless: every token reaches its k experts; an expert's batch
// is at most all tokens), so an expert's three GEMMs run once over its own rows. Where the
// experts run is a parameter: here, on the caller's thread, or through an ExpertDispatch on
// the devices that hold them (nn/expert_parallel.hpp: an expert-parallel mesh axis); the
// routing, the weighting of the experts' outputs and the router's backward are this code in
// both cases.
//
// Backward runs through the renormalisation and the softmax; the top-k choice itself is
// piecewise constant (no gradient), as in PyTorch.
//
// Router jitter (Mixtral's router_jitter_noise, training only): with jitter > 0 and a key set,
// the block's input is multiplied element by element by a factor drawn uniformly from
// [1 - jitter, 1 + jitter] before the router and the experts see it, as MixtralSparseMoeBlock
// does in training; backward multiplies the input's gradient by the same factors. Each
// element's factor comes from the key and the element's place in the whole batch
// (DropoutIndex, as LoRA dropout), so a mesh draws what one device draws.
//
// The auxiliary load-balancing loss (transformers' load_balancing_loss_func over one layer's
// tokens) is E * sum_e f_e * P_e with f_e the fraction of (token, slot) routings to expert e
// and P_e the mean router probability of e; only P carries a gradient. aux_loss() gives it and
// aux_loss_backward() adds its gradient (times a coefficient) to the router's logits gradient
// before backward. The router z-loss (mean over tokens of logsumexp(logits)^2) likewise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/softmax.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/low_rank_adapter.hpp>
#include <edl/nn/mlp.hpp>
#include <edl/nn/module.hpp>

namespace edl::nn {

struct MoeConfig {
  std::int64_t hidden = 0, intermediate = 0;
  std::int64_t num_experts = 8;   // num_local_experts
  std::int64_t top_k = 2;         // num_experts_per_tok
  bool norm_topk_prob = true;     // Mixtral always; Qwen2-MoE's flag
  std::int64_t shared_intermediate = 0;  // > 0: Qwen2-MoE's shared expert of this width
  enum class Names { mixtral, qwen } names = Names::mixtral;
  double router_jitter_noise = 0;  // Mixtral's training-time input jitter (see MoE::jitter)
};

template <class Pol>
class MoE;

/// Runs a MoE block's experts elsewhere (on the devices that hold them). Rows are (token,
/// slot) pairs grouped by expert as Saved::rows lists them; forward fills Saved::ys[e] with
/// expert e's outputs for this caller's rows of e, in that order; backward takes the
/// gradients of those outputs (dys[e]) and gives the gradients of their inputs (dxs[e]),
/// accumulating the experts' weight gradients wherever the experts are.
template <class Pol>
class ExpertDispatch {
 public:
  virtual ~ExpertDispatch() = default;
  virtual void forward(const MoE<Pol>& moe, const float* x, typename MoE<Pol>::Saved& s) = 0;
  virtual void backward(MoE<Pol>& moe, typename MoE<Pol>::Saved& s, const std::vector<std::vector<float>>& dys,
                        std::vector<std::vector<float>>& dxs) = 0;
};

template <class Pol>
class MoE {
  EDL_NN_CHECK_POLICY(Pol);

 public:
  struct Saved {
    std::int64_t tokens = 0;
    typename ColumnLinear<Pol>::Saved router_s;
    std::vector<float> logits, probs;        // [T, E]
    std::vector<std::int64_t> top;           // [T, k] expert of each slot
    std::vector<float> weight;               // [T, k] renormalised routing weight
    // Per expert: its rows (token index, slot), the gathered inputs, outputs and MLP state.
    std::vector<std::vector<std::int64_t>> rows;
    std::vector<std::vector<float>> xs, ys;
    std::vector<typename MLP<Pol>::Saved> mlp_s;
    std::vector<float> dlogits_extra;        // [T, E] added by the auxiliary losses' backward
    std::vector<std::int64_t> exchange;      // an ExpertDispatch's bookkeeping (rows it received)
    std::vector<float> jittered, factors;    // router jitter: the block's input x factors, and the factors [T, hidden]
    // The shared expert: its output [T, hidden] before the gate, its gate sigmoid(x Ws^T) [T].
    typename MLP<Pol>::Saved shared_s;
    typename ColumnLinear<Pol>::Saved shared_gate_s;
    std::vector<float> shared_y, shared_g;
  };

  MoE() = default;
  explicit MoE(const MoeConfig& c)
      : gate(c.hidden, c.num_experts, false), jitter(static_cast<float>(c.router_jitter_noise)), c_(c) {
    EDL_CHECK(c.hidden > 0 && c.intermediate > 0 && c.num_experts > 0, errc::invalid_argument, "nn::MoE",
              "hidden, intermediate and num_experts must be positive, found ", c.hidden, ", ", c.intermediate, ", ",
              c.num_experts);
    EDL_CHECK(c.top_k > 0 && c.top_k <= c.num_experts, errc::invalid_argument, "nn::MoE top_k",
              "must be in [1, num_experts = ", c.num_experts, "], found ", c.top_k);
    experts.reserve(static_cast<std::size_t>(c.num_experts));
    for (std::int64_t e = 0; e < c.num_experts; ++e) experts.emplace_back(c.hidden, c.intermediate);
    if (c.shared_intermediate > 0) {
      shared_expert = MLP<Pol>(c.hidden, c.shared_intermediate);
      shared_expert_gate = ColumnLinear<Pol>(c.hidden, 1, false);
    }
  }

  ColumnLinear<Pol> gate;          // the router (HF: block_sparse_moe.gate)
  std::vector<MLP<Pol>> experts;   // HF: block_sparse_moe.experts.J.{w1,w2,w3}
  MLP<Pol> shared_expert;          // Qwen2-MoE (empty without one)
  ColumnLinear<Pol> shared_expert_gate;  // [1, hidden]

  bool has_shared_expert() const noexcept { return c_.shared_intermediate > 0; }

  float jitter = 0.0f;             // router_jitter_noise
  std::optional<Key> jitter_key;   // set while training; none: no jitter
  DropoutIndex index;              // the rows' places in the whole batch (a mesh device sets its block)
  bool jitters() const noexcept { return jitter > 0.0f && jitter_key.has_value(); }
  /// The jitter factor of input element (row, col) under the current key (jitters() must hold).
  float jitter_factor(std::int64_t row, std::int64_t col) const noexcept {
    const std::uint64_t counter =
        static_cast<std::uint64_t>(index.row(row)) * static_cast<std::uint64_t>(c_.hidden) + static_cast<std::uint64_t>(col);
    return 1.0f - jitter + 2.0f * jitter * bits_to_unit_float(random_bits_at(*jitter_key, counter));
  }

  const MoeConfig& config() const noexcept { return c_; }

  /// HF names: gate.weight, experts.J.w1.weight (gate_proj), w2 (down_proj), w3 (up_proj) for
  /// Mixtral; experts.J.gate_proj.weight, ..., shared_expert.*, shared_expert_gate.weight for Qwen.
  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    visit_parts(prefix, [&](const std::string& path, auto& m) { m.visit_params(path, f); });
  }
  /// The router and every expert's projections, as Linears (quantization, LoRA targets).
  template <class F>
  void visit_linears(std::string_view prefix, F&& f) {
    visit_parts(prefix, [&](const std::string& path, auto& m) { m.visit_linears(path, f); });
  }
  std::int64_t param_count() const noexcept {
    std::int64_t n = gate.param_count();
    for (const auto& e : experts) n += e.param_count();
    if (has_shared_expert()) n += shared_expert.param_count() + shared_expert_gate.param_count();
    return n;
  }
  /// Forward flops per token: the router and k experts (what runs, not what is stored).
  double flops_forward(std::int64_t tokens) const noexcept {
    double f = gate.flops_forward(tokens) + static_cast<double>(c_.top_k) * experts.front().flops_forward(tokens);
    if (has_shared_expert()) f += shared_expert.flops_forward(tokens) + shared_expert_gate.flops_forward(tokens);
    return f;
  }
  void init(Key key, float std = 0.02f) { init_params(*this, key, std); }

  /// y [T, hidden]. `dispatch`: where the experts run (null: here, every expert held).
  void forward(const float* x, std::int64_t tokens, float* y, Saved& s, ExpertDispatch<Pol>* dispatch = nullptr) const {
    const std::int64_t H = c_.hidden, E = c_.num_experts, K = c_.top_k;
    s.tokens = tokens;
    s.jittered.clear();
    s.factors.clear();
    if (jitters()) {  // the router and the experts see x times the factors; Saved keeps them
      s.factors.resize(static_cast<std::size_t>(tokens * H));
      s.jittered.resize(s.factors.size());
      for (std::int64_t t = 0; t < tokens; ++t)
        for (std::int64_t j = 0; j < H; ++j) {
          const std::size_t i = static_cast<std::size_t>(t * H + j);
          s.factors[i] = jitter_factor(t, j);
          s.jittered[i] = x[i] * s.factors[i];
        }
      x = s.jittered.data();
    }
    s.logits.assign(static_cast<std::size_t>(tokens * E), 0.f);
    gate.forward(x, tokens, s.logits.data(), s.router_s);
    route(s);
    // Group (token, slot) pairs by expert, gather, run each expert once over its rows.
    s.rows.assign(static_cast<std::size_t>(E), {});
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t k = 0; k < K; ++k) s.rows[static_cast<std::size_t>(s.top[t * K + k])].push_back(t * K + k);
    s.xs.assign(static_cast<std::size_t>(E), {});
    s.ys.assign(static_cast<std::size_t>(E), {});
    s.mlp_s.assign(static_cast<std::size_t>(E), {});
    if (dispatch) {
      dispatch->forward(*this, x, s);
    } else {
      for (std::int64_t e = 0; e < E; ++e) {
        const auto& rows = s.rows[static_cast<std::size_t>(e)];
        const auto n = static_cast<std::int64_t>(rows.size());
        if (n == 0) continue;
        auto& xe = s.xs[static_cast<std::size_t>(e)];
        auto& ye = s.ys[static_cast<std::size_t>(e)];
        xe.resize(static_cast<std::size_t>(n * H));
        ye.resize(static_cast<std::size_t>(n * H));
        for (std::int64_t r = 0; r < n; ++r) {
          const std::int64_t t = rows[static_cast<std::size_t>(r)] / K;
          std::copy(x + t * H, x + (t + 1) * H, xe.begin() + r * H);
        }
        experts[static_cast<std::size_t>(e)].forward(xe.data(), n, ye.data(), s.mlp_s[static_cast<std::size_t>(e)]);
      }
    }
    // y = sum over the token's experts, in expert order, of weight x output.
    std::fill(y, y + tokens * H, 0.f);
    for (std::int64_t e = 0; e < E; ++e) {
      const auto& rows = s.rows[static_cast<std::size_t>(e)];
      const auto& ye = s.ys[static_cast<std::size_t>(e)];
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const std::int64_t slot = rows[r], t = slot / K;
        const float w = s.weight[static_cast<std::size_t>(slot)];
        for (std::int64_t j = 0; j < H; ++j) y[t * H + j] += w * ye[r * static_cast<std::size_t>(H) + static_cast<std::size_t>(j)];
      }
    }
    if (has_shared_expert()) {  // y += sigmoid(x Ws^T) * shared(x)
      s.shared_y.resize(static_cast<std::size_t>(tokens * H));
      s.shared_g.resize(static_cast<std::size_t>(tokens));
      shared_expert.forward(x, tokens, s.shared_y.data(), s.shared_s);
      shared_expert_gate.forward(x, tokens, s.shared_g.data(), s.shared_gate_s);
      for (std::int64_t t = 0; t < tokens; ++t) {
        float& g = s.shared_g[static_cast<std::size_t>(t)];
        g = 1.0f / (1.0f + std::exp(-g));
        for (std::int64_t j = 0; j < H; ++j) y[t * H + j] += g * s.shared_y[static_cast<std::size_t>(t * H + j)];
      }
    }
    s.dlogits_extra.clear();
  }

  void apply(const float* x, std::int64_t tokens, float* y) const {
    Saved s;
    forward(x, tokens, y, s);
  }

  /// Re-points what reads the block's input at x, a recomputed copy with forward's values
  /// (rematerialization); the experts keep their own gathered rows.
  static void point_at(Saved& s, const float* x) noexcept {
    if (!s.jittered.empty()) return;  // the router read the block's own jittered copy, still in Saved
    s.router_s.point_at(x, s.tokens);
    s.shared_gate_s.point_at(x, s.tokens);
    s.shared_s.gate_s.point_at(x, s.tokens);
    s.shared_s.up_s.point_at(x, s.tokens);
  }

  /// Load-balancing loss of this forward's routing (transformers' load_balancing_loss_func with
  /// one layer and no padding mask): E * sum_e f_e * P_e.
  double aux_loss(Saved& s) const {
    Saved* one[] = {&s};
    return load_balancing_loss(one, c_, nullptr, 0.0f);
  }
  /// Adds coef * d aux_loss / d logits to what backward adds to the router's gradient.
  void aux_loss_backward(Saved& s, float coef) const {
    Saved* one[] = {&s};
    load_balancing_loss(one, c_, nullptr, coef);
  }
  /// Router z-loss: mean over tokens of logsumexp(logits)^2 (ST-MoE; Qwen2-MoE's and
  /// DeepSeek's routers use it).
  double z_loss(Saved& s) const {
    Saved* one[] = {&s};
    return router_z_loss(one, c_, nullptr, 0.0f);
  }
  /// Adds coef * d z_loss / d logits (= coef * 2 z_t p_{t,e} / T).
  void z_loss_backward(Saved& s, float coef) const {
    Saved* one[] = {&s};
    router_z_loss(one, c_, nullptr, coef);
  }

  /// transformers' load_balancing_loss_func over the routing of several layers (their tokens
  /// concatenated, as MixtralForCausalLM passes every layer's router logits), counting only
  /// tokens with mask[t] != 0 (the attention mask; null: all):
  ///   f_e = (routings of valid tokens to e, over all layers and slots) / (layers x valid)
  ///   P_e = (sum of p_e over valid tokens and layers) / (layers x valid)
  ///   aux = E * sum_e f_e P_e
  /// With coef != 0, adds coef * d aux / d logits to each layer's router gradient (only P
  /// carries one: d aux / d p_{t,e} = E f_e / (layers x valid) for a valid token).
  ///
  /// On a mesh each device passes its own tokens and `sum_devices`, which sums a buffer over
  /// the devices that hold the batch's other tokens: f, P and the count are then the whole
  /// batch's, as on one device.
  static double load_balancing_loss(std::span<Saved* const> layers, const MoeConfig& c, const std::int64_t* mask,
                                    float coef, const std::function<void(std::span<double>)>& sum_devices = {}) {
    const std::int64_t E = c.num_experts, K = c.top_k;
    std::vector<double> f(static_cast<std::size_t>(E), 0.0), P(static_cast<std::size_t>(E), 0.0);
    double n = 0;
    for (const Saved* s : layers)
      for (std::int64_t t = 0; t < s->tokens; ++t) {
        if (mask && mask[t] == 0) continue;
        n += 1;
        for (std::int64_t k = 0; k < K; ++k) f[static_cast<std::size_t>(s->top[static_cast<std::size_t>(t * K + k)])] += 1.0;
        for (std::int64_t e = 0; e < E; ++e) P[static_cast<std::size_t>(e)] += s->probs[static_cast<std::size_t>(t * E + e)];
      }
    if (sum_devices) {
      std::vector<double> all(f);
      all.insert(all.end(), P.begin(), P.end());
      all.push_back(n);
      sum_devices(all);
      std::copy(all.begin(), all.begin() + E, f.begin());
      std::copy(all.begin() + E, all.begin() + 2 * E, P.begin());
      n = all.back();
    }
    if (n == 0) return 0.0;
    double aux = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      f[static_cast<std::size_t>(e)] /= n;
      P[static_cast<std::size_t>(e)] /= n;
      aux += f[static_cast<std::size_t>(e)] * P[static_cast<std::size_t>(e)];
    }
    if (coef != 0.0f) {
      std::vector<float> dp(static_cast<std::size_t>(E));
      for (std::int64_t e = 0; e < E; ++e)
        dp[static_cast<std::size_t>(e)] = static_cast<float>(coef * static_cast<double>(E) * f[static_cast<std::size_t>(e)] / n);
      for (Saved* s : layers) {
        extra(*s, E);
        for (std::int64_t t = 0; t < s->tokens; ++t)
          if (!mask || mask[t] != 0)
            softmax_backward_add(s->probs.data() + t * E, dp.data(), s->dlogits_extra.data() + t * E, E);
      }
    }
    return aux * static_cast<double>(E);
  }

  /// The router z-loss over several layers' valid tokens: the mean of logsumexp(logits)^2;
  /// with coef != 0 adds coef * its gradient (coef * 2 z p_e / count) to each layer's router.
  static double router_z_loss(std::span<Saved* const> layers, const MoeConfig& c, const std::int64_t* mask, float coef,
                              const std::function<void(std::span<double>)>& sum_devices = {}) {
    const std::int64_t E = c.num_experts;
    double sum = 0, n = 0;
    for (const Saved* s : layers)
      for (std::int64_t t = 0; t < s->tokens; ++t)
        if (!mask || mask[t] != 0) {
          const double z = logsumexp(s->logits.data() + t * E, E);
          sum += z * z;
          n += 1;
        }
    if (sum_devices) {
      double both[2] = {sum, n};
      sum_devices(both);
      sum = both[0];
      n = both[1];
    }
    if (n == 0) return 0.0;
    if (coef != 0.0f)
      for (Saved* s : layers) {
        extra(*s, E);
        for (std::int64_t t = 0; t < s->tokens; ++t) {
          if (mask && mask[t] == 0) continue;
          const double z = logsumexp(s->logits.data() + t * E, E);
          for (std::int64_t e = 0; e < E; ++e)
            s->dlogits_extra[static_cast<std::size_t>(t * E + e)] +=
                static_cast<float>(coef * 2.0 * z * s->probs[static_cast<std::size_t>(t * E + e)] / n);
        }
      }
    return sum / n;
  }

  /// One token's routing, on the calling thread (training and the cached forward share it):
  /// probs [E] = softmax(logits [E]) in f32; top [k]: the experts of the k largest, largest
  /// first (ties: the lower index first, as a stable sort); weight [k]: their probabilities,
  /// divided by their sum when norm_topk_prob.
  static void route_token(const float* logits, float* probs, const MoeConfig& c, std::int64_t* top, float* weight) {
    const std::int64_t E = c.num_experts, K = c.top_k;
    kernels::softmax_row(logits, probs, E);
    double S = 0;
    for (std::int64_t k = 0; k < K; ++k) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        if (std::find(top, top + k, e) != top + k) continue;
        if (best < 0 || probs[e] > probs[best]) best = e;
      }
      top[k] = best;
      S += probs[best];
    }
    for (std::int64_t k = 0; k < K; ++k)
      weight[k] = c.norm_topk_prob ? static_cast<float>(probs[top[k]] / S) : probs[top[k]];
  }

  /// Accumulates every weight gradient (experts and router); writes dx [T, hidden].
  /// `dispatch`: where the experts run, as in forward.
  void backward(const float* dy, Saved& s, float* dx, ExpertDispatch<Pol>* dispatch = nullptr) {
    const std::int64_t T = s.tokens, H = c_.hidden, E = c_.num_experts, K = c_.top_k;
    std::vector<float> dw(static_cast<std::size_t>(T * K), 0.f);
    std::fill(dx, dx + T * H, 0.f);
    // Per expert: the gradient of its outputs (w dy) and of each slot's weight (dy . output).
    std::vector<std::vector<float>> dys(static_cast<std::size_t>(E)), dxs(static_cast<std::size_t>(E));
    for (std::int64_t e = 0; e < E; ++e) {
      const auto& rows = s.rows[static_cast<std::size_t>(e)];
      const auto n = static_cast<std::int64_t>(rows.size());
      if (n == 0) continue;
      const auto& ye = s.ys[static_cast<std::size_t>(e)];
      auto& dye = dys[static_cast<std::size_t>(e)];
      dye.resize(static_cast<std::size_t>(n * H));
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t slot = rows[static_cast<std::size_t>(r)], t = slot / K;
        const float w = s.weight[static_cast<std::size_t>(slot)];
        double d = 0;  // d loss / d w_slot = dy_t . expert output
        for (std::int64_t j = 0; j < H; ++j) {
          const float g = dy[t * H + j];
          dye[static_cast<std::size_t>(r * H + j)] = w * g;
          d += static_cast<double>(g) * ye[static_cast<std::size_t>(r * H + j)];
        }
        dw[static_cast<std::size_t>(slot)] = static_cast<float>(d);
      }
    }
    if (dispatch) {
      dispatch->backward(*this, s, dys, dxs);
    } else {
      for (std::int64_t e = 0; e < E; ++e) {
        const auto& dye = dys[static_cast<std::size_t>(e)];
        if (dye.empty()) continue;
        auto& dxe = dxs[static_cast<std::size_t>(e)];
        dxe.resize(dye.size());
        experts[static_cast<std::size_t>(e)].backward(dye.data(), s.mlp_s[static_cast<std::size_t>(e)], dxe.data());
      }
    }
    for (std::int64_t e = 0; e < E; ++e) {
      const auto& rows = s.rows[static_cast<std::size_t>(e)];
      const auto& dxe = dxs[static_cast<std::size_t>(e)];
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const std::int64_t t = rows[r] / K;
        for (std::int64_t j = 0; j < H; ++j) dx[t * H + j] += dxe[r * static_cast<std::size_t>(H) + static_cast<std::size_t>(j)];
      }
    }
    // Through the renormalisation and the softmax to the router's logits.
    std::vector<float> dlogits(static_cast<std::size_t>(T * E), 0.f), dp(static_cast<std::size_t>(E));
    for (std::int64_t t = 0; t < T; ++t) {
      std::fill(dp.begin(), dp.end(), 0.f);
      const float* p = s.probs.data() + t * E;
      const std::int64_t* top = s.top.data() + t * K;
      const float* w = s.weight.data() + t * K;
      const float* g = dw.data() + t * K;
      if (c_.norm_topk_prob) {
        // w_k = p_k / S: dp_k = (g_k - sum_j g_j w_j) / S for the chosen k.
        double S = 0, gw = 0;
        for (std::int64_t k = 0; k < K; ++k) S += p[top[k]], gw += static_cast<double>(g[k]) * w[k];
        for (std::int64_t k = 0; k < K; ++k) dp[static_cast<std::size_t>(top[k])] = static_cast<float>((g[k] - gw) / S);
      } else {
        for (std::int64_t k = 0; k < K; ++k) dp[static_cast<std::size_t>(top[k])] = g[k];
      }
      softmax_backward_add(p, dp.data(), dlogits.data() + t * E, E);
    }
    if (!s.dlogits_extra.empty())
      for (std::size_t i = 0; i < dlogits.size(); ++i) dlogits[i] += s.dlogits_extra[i];
    gate.backward(dlogits.data(), s.router_s, dx, true);
    if (has_shared_expert()) {
      // d shared = g dy; d g = dy . shared; through the sigmoid: d logit = d g * g (1 - g).
      std::vector<float> dys(static_cast<std::size_t>(T * H)), dlogit(static_cast<std::size_t>(T)), dxs(dys.size());
      for (std::int64_t t = 0; t < T; ++t) {
        const float g = s.shared_g[static_cast<std::size_t>(t)];
        double dg = 0;
        for (std::int64_t j = 0; j < H; ++j) {
          dys[static_cast<std::size_t>(t * H + j)] = g * dy[t * H + j];
          dg += static_cast<double>(dy[t * H + j]) * s.shared_y[static_cast<std::size_t>(t * H + j)];
        }
        dlogit[static_cast<std::size_t>(t)] = static_cast<float>(dg * g * (1.0f - g));
      }
      shared_expert.backward(dys.data(), s.shared_s, dxs.data());
      kernels::add_inplace(dx, dxs.data(), static_cast<std::ptrdiff_t>(T * H));
      shared_expert_gate.backward(dlogit.data(), s.shared_gate_s, dx, true);
    }
    if (!s.factors.empty())  // through the jitter: d x = d (x factors) x factors
      for (std::size_t i = 0; i < s.factors.size(); ++i) dx[i] *= s.factors[i];
  }

 private:
  /// probs = softmax(logits), the top k and their weights, token by token.
  void route(Saved& s) const {
    const std::int64_t T = s.tokens, E = c_.num_experts, K = c_.top_k;
    s.probs.resize(static_cast<std::size_t>(T * E));
    s.top.resize(static_cast<std::size_t>(T * K));
    s.weight.resize(static_cast<std::size_t>(T * K));
    for (std::int64_t t = 0; t < T; ++t)
      route_token(s.logits.data() + t * E, s.probs.data() + t * E, c_, s.top.data() + t * K, s.weight.data() + t * K);
  }

  /// f(path, module) for the router, each expert's projections and the shared expert, by the
  /// config's names.
  template <class F>
  void visit_parts(std::string_view prefix, F&& f) {
    const bool qwen = c_.names == MoeConfig::Names::qwen;
    f(join_path(prefix, "gate"), gate);
    for (std::size_t e = 0; e < experts.size(); ++e) {
      const std::string p = join_path(prefix, "experts." + std::to_string(e));
      f(join_path(p, qwen ? "gate_proj" : "w1"), experts[e].gate_proj);
      if (qwen) f(join_path(p, "up_proj"), experts[e].up_proj);
      f(join_path(p, qwen ? "down_proj" : "w2"), experts[e].down_proj);
      if (!qwen) f(join_path(p, "w3"), experts[e].up_proj);
    }
    if (has_shared_expert()) {
      f(join_path(prefix, "shared_expert"), shared_expert);
      f(join_path(prefix, "shared_expert_gate"), shared_expert_gate);
    }
  }

  static void extra(Saved& s, std::int64_t E) {
    if (s.dlogits_extra.empty()) s.dlogits_extra.assign(static_cast<std::size_t>(s.tokens * E), 0.f);
  }

  static double logsumexp(const float* l, std::int64_t E) {
    const float m = *std::max_element(l, l + E);
    double sum = 0;
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e] - m));
    return m + std::log(sum);
  }

  /// dl += p * (dp - sum_i dp_i p_i): the softmax's Jacobian-vector product.
  static void softmax_backward_add(const float* p, const float* dp, float* dl, std::int64_t E) {
    double dot = 0;
    for (std::int64_t e = 0; e < E; ++e) dot += static_cast<double>(dp[e]) * p[e];
    for (std::int64_t e = 0; e < E; ++e) dl[e] += static_cast<float>(p[e] * (dp[e] - dot));
  }

  MoeConfig c_;
};

}  // namespace edl::nn
