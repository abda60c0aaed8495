// edl/generate/cached_forward.hpp
// The Llama forward over a KV cache, written once for every use in generation: prefill and
// batched decode (many rows), the one-row decode step (one sequence, run as one
// exec::PhasedRegion), the serving engine's steps, and one device of a mesh (its tp shard of
// heads and MLP columns, its sp share of cache positions, its vocabulary columns).
//
//   CachedForward<Pol, Cache> fw(local_model, cache, rope, DeviceShard{...});
//   fw.run(rows, need, collectives, logits_last, logits_all);
//
// A layer is one function, CachedForward::layer(steps, l): norm -> q/k/v -> (Qwen3: per-head
// q/k norms) -> rope and the cache store -> attention -> o_proj (+ residual) -> norm -> gate/up
// -> SwiGLU -> down (+ residual); in a mixture-of-experts layer (Mixtral) the last steps are
// norm -> router -> for each expert chosen by some row: gate/up -> SwiGLU -> down over those
// rows only (+ the weighted sum into the residual), so decode reads only the chosen experts.
// What differs between uses is the `steps` it runs on:
//  - RowSteps: every step over all rows of the call, each a parallel kernel (kernels::linear_nt
//    and friends, GEMM attention for prefill runs), with the collectives a mesh needs after the
//    row-parallel products (a psum over tp) and inside attention (an all_gather over sp);
//  - PhasedSteps: one row on a team of threads, each step one phase of a PhasedRegion (one
//    fork/join a token instead of several a layer), bit for bit the sums RowSteps computes.
// Adding a layer kind means adding its steps to layer() and, if it needs a new kind of step,
// that step to both. docs/architecture.md walks a token through it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <type_traits>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/phased_region.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/rope_table.hpp>
#include <edl/kernels/activations.hpp>
#include <edl/kernels/attention.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/matvec.hpp>
#include <edl/kernels/rms_norm.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>

namespace edl::generate {

/// One token of a forward call: sequence b (the whole batch's index), position pos (its cache
/// slot on one device), token id, and its row in logits_all.
struct CachedRow {
  std::int64_t b, pos, id, out;
  /// The row's input vector in place of the id's row of the embedding table (HF's
  /// inputs_embeds: in the table's space, the embed scale still applies); null: the id's.
  const float* embedding = nullptr;
};

/// What one device of a mesh computes: sequences [b0, b0 + nb), the positions p with
/// p % sp == sp_rank (stored at local slot p / sp), and the lm_head's vocabulary columns
/// [c0, c1). One device: every sequence, position and column.
struct DeviceShard {
  std::int64_t b0 = 0, nb = 0;
  std::int64_t sp = 1, sp_rank = 0;
  std::int64_t c0 = 0, c1 = 0;
  kernels::SlotMap slots() const noexcept { return {sp, sp_rank}; }
};

/// The collectives of one device alone: there is nothing to reduce or gather.
struct NoCollectives {
  static constexpr bool one_device = true;
  void psum_tp(std::span<float>) {}
  void all_gather_sp(std::span<const float>, std::span<float>) {}
};

namespace detail {

/// A run of at least this many rows of one sequence (a prefill chunk) attends through the GEMM.
inline constexpr std::int64_t kGemmAttentionRows = 8;

/// Splits rows [0, n) (sorted by sequence) into runs of at least kGemmAttentionRows rows of one
/// sequence at consecutive positions (a prefill chunk: attention on the GEMM), given as
/// [first, last + 1), and the other rows (decode: attention row by row). Rows have .b (sequence)
/// and .pos (position).
template <class Row>
void split_attention_rows(const std::vector<Row>& rows, std::int64_t n,
                          std::vector<std::pair<std::int64_t, std::int64_t>>& runs, std::vector<std::int64_t>& single) {
  runs.clear();
  single.clear();
  for (std::int64_t r = 0; r < n;) {
    std::int64_t e = r + 1;
    while (e < n && rows[static_cast<std::size_t>(e)].b == rows[static_cast<std::size_t>(r)].b &&
           rows[static_cast<std::size_t>(e)].pos == rows[static_cast<std::size_t>(e - 1)].pos + 1)
      ++e;
    if (e - r >= kGemmAttentionRows) {
      runs.push_back({r, e});
    } else {
      for (std::int64_t i = r; i < e; ++i) single.push_back(i);
    }
    r = e;
  }
}

/// Prefill attention of every run (split_attention_rows) on the GEMM: one task per (run, query
/// head), each running attend_run_gemm. q is [rows, nh * D]; view_of(row, kv_head) gives the
/// cache view of a run's first row (a Row with .b and .pos).
template <class Row, class ViewOf>
void attend_runs_gemm(const std::vector<Row>& rows, const std::vector<std::pair<std::int64_t, std::int64_t>>& runs,
                      std::int64_t nh, std::int64_t nkv, std::int64_t D, std::int64_t window, kernels::SlotMap slots,
                      const float* q, kernels::AttentionOut out, ViewOf&& view_of, float softcap = 0.0f) {
  if (runs.empty()) return;
  const std::int64_t rep = nh / nkv, qw = nh * D;
  exec::parallel_for(0, static_cast<std::int64_t>(runs.size()) * nh, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    std::vector<float> kv, sc;
    for (std::ptrdiff_t t = lo; t < hi; ++t) {
      const auto [r0, r1] = runs[static_cast<std::size_t>(t / nh)];
      const std::int64_t h = t % nh;
      const Row& row = rows[static_cast<std::size_t>(r0)];
      kernels::attend_run_gemm(view_of(row, h / rep), q + r0 * qw + h * D, qw, out.data + r0 * out.row_stride + h * out.head_stride,
                      out.row_stride, out.partial, row.pos, r1 - r0, D, window, slots, kv, sc, softcap);
    }
  });
}

/// Attention of rows `single` (decode rows: split_attention_rows' rest) row by row: one task per
/// (row, query head) running attend_row_head. Rows go block rows at a time, so `scores` holds
/// block * nh score rows of score_len floats.
template <class Row, class ViewOf>
void attend_rows(const std::vector<Row>& rows, const std::vector<std::int64_t>& single, std::int64_t nh, std::int64_t nkv,
                 std::int64_t D, std::int64_t window, kernels::SlotMap slots, const float* q, kernels::AttentionOut out, float* scores,
                 std::int64_t score_len, std::int64_t block, ViewOf&& view_of, float softcap = 0.0f) {
  const std::int64_t rep = nh / nkv, n = static_cast<std::int64_t>(single.size());
  for (std::int64_t i0 = 0; i0 < n; i0 += block) {
    const std::int64_t i1 = std::min(n, i0 + block);
    exec::parallel_for(0, (i1 - i0) * nh, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t t = lo; t < hi; ++t) {
        const std::int64_t r = single[static_cast<std::size_t>(i0 + t / nh)], h = t % nh;
        const Row& row = rows[static_cast<std::size_t>(r)];
        kernels::attend_row_head(view_of(row, h / rep), row.pos, q + r * nh * D + h * D,
                        out.data + r * out.row_stride + h * out.head_stride, out.partial, D, window, slots,
                        scores + t * score_len, softcap);
      }
    });
  }
}
/// The rows of a prefill chunk: ids [batch, seq], mask [batch, seq] of 0/1 (left padding) or
/// null; sequence b's tokens follow its length(b) tokens already cached. Padding is skipped.
template <class LengthOf>
void prompt_rows(const std::int64_t* ids, std::int64_t batch, std::int64_t seq, const std::int64_t* mask,
                 LengthOf&& length_of, std::vector<CachedRow>& rows, const char* where, const float* embeds = nullptr,
                 std::int64_t hidden = 0) {
  EDL_CHECK(seq >= 0, errc::invalid_argument, where, "seq must be >= 0, found ", seq);
  EDL_CHECK(ids != nullptr || embeds != nullptr || seq == 0, errc::invalid_argument, where,
            "needs token ids or inputs_embeds");
  rows.clear();
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t pad = 0;
    if (mask) {
      while (pad < seq && mask[b * seq + pad] == 0) ++pad;
      for (std::int64_t s = pad; s < seq; ++s)
        EDL_CHECK(mask[b * seq + s] != 0, errc::invalid_argument, where, "attention_mask row ", b,
                  " is not left padding (a 0 at ", s, " after a 1)");
    }
    const std::int64_t len = length_of(b);
    for (std::int64_t s = pad; s < seq; ++s) {
      const std::int64_t at = b * seq + s;
      rows.push_back({b, len + s - pad, embeds ? 0 : ids[at], at, embeds ? embeds + at * hidden : nullptr});
    }
  }
}

/// The rows of a decode step: one token per sequence b with active[b] != 0 (all when null).
template <class LengthOf>
void decode_rows(const std::int64_t* ids, std::int64_t batch, const std::uint8_t* active, LengthOf&& length_of,
                 std::vector<CachedRow>& rows) {
  rows.clear();
  for (std::int64_t b = 0; b < batch; ++b)
    if (!active || active[b]) rows.push_back({b, length_of(b), ids[b], b});
}

/// Checks every token id against the vocabulary and sets need[b] to the length sequence b will
/// have after the call (-1: no token of b in it), before any work touches a cache.
inline void check_rows(const std::vector<CachedRow>& rows, std::int64_t batch, std::int64_t vocab,
                       std::vector<std::int64_t>& need, const char* where) {
  need.assign(static_cast<std::size_t>(batch), -1);
  for (const CachedRow& r : rows) {
    EDL_CHECK(r.embedding || (r.id >= 0 && r.id < vocab), errc::invalid_argument, where, "token id ", r.id, " (sequence ", r.b,
              ", position ", r.pos, ") is outside the vocabulary [0, ", vocab, ")");
    std::int64_t& n = need[static_cast<std::size_t>(r.b)];
    n = std::max(n, r.pos + 1);
  }
}

}  // namespace detail

/// One device's forward over its cache: its (local) model, cache, and scratch.
template <class Pol, KVCache Cache>
class CachedForward {
  static_assert(std::is_same_v<typename Pol::compute_t, float>,
                "edl::generate: decoding runs with f32 activations; a model trained with a bf16 or f16 compute "
                "dtype (Policy<Param, Compute>) decodes as models::to_dtype<Policy<Param>>(model), the same weights");
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using T = typename Pol::param_t;
  using Part = kernels::MatvecPart<T>;

  /// The phases run_one_row runs per layer, in order: q/k/v, attention, o_proj, gate/up, down
  /// (then one for the lm_head); a mixture-of-experts layer has one more (the router).
  static constexpr std::size_t kPhasesPerLayer = 5;

  /// `model` is this device's model (tp-local sizes on a mesh), `vocab` the whole vocabulary
  /// (the logits' row length), `rope` the tables of every position.
  CachedForward(const Model& model, Cache& cache, const RopeTable& rope, DeviceShard shard, std::int64_t vocab)
      : m_(&model), cache_(&cache), rope_(&rope), shard_(shard), V_(vocab) {
    const models::LlamaConfig& c = model.config();
    H_ = c.hidden_size;
    I_ = c.intermediate_size;
    nh_ = c.num_attention_heads;
    nkv_ = c.num_key_value_heads;
    D_ = c.head_size();
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      windows_.push_back(c.layer_window(l).value_or(0));
      local_rope_.push_back(c.layer_has_local_rope(l));
    }
    eps_ = static_cast<float>(c.rms_norm_eps);
    embed_scale_ = model.model.embed_scale();
    softcap_ = static_cast<float>(c.attn_softcap());
    final_softcap_ = static_cast<float>(c.final_softcap());
    if (c.query_scale() > 0) q_mult_ = static_cast<float>(c.query_scale() * std::sqrt(static_cast<double>(D_)));
    if (c.is_moe()) {
      E_ = c.num_local_experts;
      K_ = c.num_experts_per_tok;
      Ie_ = c.expert_intermediate_size();
      Is_ = c.shared_expert_size();
    }
  }

  /// Runs `rows` (sorted by sequence; the whole batch's, this device takes its sequences'):
  /// every layer, then the cache lengths need[b] (the batch's, from detail::check_rows), then
  /// this device's vocabulary columns of the logits of each sequence's last row
  /// (last_out [batch, vocab], may be null) and of every row (all_out [*, vocab] at row.out,
  /// may be null). One row without all_out on one device runs as one phased region.
  template <class Collectives>
  void run(const std::vector<CachedRow>& rows, const std::vector<std::int64_t>& need, Collectives& coll,
           float* last_out, float* all_out) {
    rows_.clear();
    for (const CachedRow& r : rows)
      if (r.b >= shard_.b0 && r.b < shard_.b0 + shard_.nb) rows_.push_back(r);
    const std::int64_t n = static_cast<std::int64_t>(rows_.size());
    if (n == 0) return;  // a whole (tp, sp) group has the same sequences: no collective is skipped
    local_need_.assign(static_cast<std::size_t>(shard_.nb), -1);
    for (std::int64_t lb = 0; lb < shard_.nb; ++lb) {
      const std::int64_t nd = need[static_cast<std::size_t>(shard_.b0 + lb)];
      if (nd < 0) continue;
      std::int64_t& local = local_need_[static_cast<std::size_t>(lb)];
      local = shard_.slots().end(nd);
      if (local > 0) cache_->reserve(lb, local);
    }
    ensure_rows(n);
    row_angles(n);
    embed(n);
    if constexpr (Collectives::one_device) {
      if (n == 1 && !all_out && shard_.sp == 1) {
        run_one_row(last_out);
        set_lengths();
        return;
      }
    }
    detail::split_attention_rows(rows_, n, runs_, single_);  // the same rows in every layer
    RowSteps<Collectives> steps{*this, coll, n};
    for (std::size_t l = 0; l < m_->model.layers.size(); ++l) layer(steps, l);
    set_lengths();
    head(last_out, all_out, n);
  }

  /// Times run_one_row's phases into `times` (null: stop).
  void time_phases(exec::PhaseTimes* times) { region_->time_phases(times); }

  /// Bytes of scratch this forward holds.
  std::int64_t scratch_bytes() const noexcept {
    std::size_t f = 0;
    for (const auto* v : {&x_, &normed_, &q_, &k_, &v_, &ctx_, &gate_, &up_, &out_, &last_x_, &head_out_, &scores_,
                          &records_, &gathered_, &thread_normed_, &expert_x_, &router_, &probs_, &shared_gate_, &moe_out_})
      f += v->size();
    return static_cast<std::int64_t>(f * sizeof(float));
  }

 private:
  /// An RMSNorm as the steps apply it: its weight and the offset added to it (Gemma: 1).
  struct Norm {
    const T* w;
    float offset;
  };
  template <class N>
  static Norm norm_of(const N& n) {
    return Norm{n.weight.data(), n.offset()};
  }
  /// A sandwich norm on a product's output, when the layer has them.
  template <class N>
  static std::optional<Norm> post_norm(bool sandwich, const N& n) {
    return sandwich ? std::optional<Norm>(norm_of(n)) : std::nullopt;
  }
  std::int64_t window_of(std::int64_t layer) const { return windows_[static_cast<std::size_t>(layer)]; }
  /// y [rows, cols] = norm(x), the model's eps (y may be x).
  void norm_rows(const Norm& norm, const float* x, float* y, std::int64_t rows, std::int64_t cols) const {
    kernels::rms_norm_forward(x, norm.w, y, static_cast<float*>(nullptr), rows, cols, eps_, norm.offset);
  }

  // ---------------------------------------------------------------- the layer, once
  template <class Steps>
  void layer(Steps& st, std::size_t l) {
    const auto& L = m_->model.layers[l];
    const auto& A = L.self_attn;
    const auto& mlp = L.mlp;
    const std::int64_t layer = static_cast<std::int64_t>(l), qw = nh_ * D_, kw = nkv_ * D_;
    const bool sandwich = L.has_sandwich_norms();  // Gemma: norms on the attention's and the MLP's outputs
    st.norm_products(norm_of(L.input_layernorm),
                     std::array<Part, 3>{part(A.q_proj, q_.data(), qw), part(A.k_proj, k_.data(), kw),
                                         part(A.v_proj, v_.data(), kw)},
                     [&](std::int64_t n) { rope_and_store(layer, n, A); });
    st.attention(layer);
    st.product_add(ctx_.data(), qw, part(A.o_proj, out_.data(), H_), post_norm(sandwich, L.attn_output_norm));
    if (L.is_sparse()) return st.norm_experts(norm_of(L.post_attention_layernorm), L.block_sparse_moe);
    st.norm_gated(norm_of(L.post_attention_layernorm),
                  std::array<Part, 2>{part(mlp.gate_proj, gate_.data(), I_), part(mlp.up_proj, up_.data(), I_)},
                  mlp.activation());
    st.product_add(gate_.data(), I_, part(mlp.down_proj, out_.data(), H_), post_norm(sandwich, L.mlp_output_norm));
  }

  // ---------------------------------------------------------------- steps over many rows
  template <class Collectives>
  struct RowSteps {
    CachedForward& f;
    Collectives& coll;
    std::int64_t n;

    template <std::size_t P, class After>
    void norm_products(const Norm& norm, const std::array<Part, P>& parts, After&& after) {
      f.norm_rows(norm, f.x_.data(), f.normed_.data(), n, f.H_);
      kernels::linear_group<T, P>(f.normed_.data(), n, parts, f.H_);
      after(n);
    }
    void attention(std::int64_t layer) { f.attention_rows(coll, layer, n); }
    // x += in W^T (+ b), the product summed over tp first (a row-parallel product on a mesh),
    // through `post` first when given (a sandwich norm).
    void product_add(const float* in, std::int64_t K, const Part& p, const std::optional<Norm>& post) {
      kernels::linear_part(in, n, p, K);
      const std::size_t nH = static_cast<std::size_t>(n * f.H_);
      coll.psum_tp(std::span<float>(p.y, nH));
      if (post) f.norm_rows(*post, p.y, p.y, n, f.H_);
      kernels::add_inplace(f.x_.data(), static_cast<const float*>(p.y), static_cast<std::ptrdiff_t>(nH));
    }
    void norm_gated(const Norm& norm, const std::array<Part, 2>& gate_up, kernels::GatedActivation act) {
      norm_products(norm, gate_up, [](std::int64_t) {});
      kernels::gated_mul(act, f.gate_.data(), f.up_.data(), f.gate_.data(), static_cast<std::ptrdiff_t>(n * f.I_));
    }
    // Mixture of experts: the rows are grouped by expert and each chosen expert runs its three
    // products once over its own rows (one row: matrix-vector products over that expert alone).
    // On a mesh each tp rank holds a slice of every expert's width (and of a shared expert's):
    // the block's output is summed over tp before it joins the residual, as a row-parallel
    // product's; the router is whole on every rank, so all route alike.
    template <class Moe>
    void norm_experts(const Norm& norm, const Moe& moe) {
      f.norm_rows(norm, f.x_.data(), f.normed_.data(), n, f.H_);
      kernels::linear_part(f.normed_.data(), n, part(moe.gate, f.router_.data(), f.E_), f.H_);
      f.route_rows(n, moe);
      float* acc = f.x_.data();  // one device: straight into the residual
      if constexpr (!Collectives::one_device) {
        f.moe_out_.assign(static_cast<std::size_t>(n * f.H_), 0.0f);
        acc = f.moe_out_.data();
      }
      for (std::int64_t e = 0; e < f.E_; ++e) {
        const auto& rows = f.expert_rows_[static_cast<std::size_t>(e)];
        const auto ne = static_cast<std::int64_t>(rows.size());
        if (ne == 0) continue;
        for (std::int64_t i = 0; i < ne; ++i)
          std::memcpy(f.expert_x_.data() + i * f.H_, f.normed_.data() + rows[static_cast<std::size_t>(i)].first * f.H_,
                      static_cast<std::size_t>(f.H_) * sizeof(float));
        swiglu_rows(f.expert_x_.data(), ne, moe.experts[static_cast<std::size_t>(e)], f.Ie_);
        for (std::int64_t i = 0; i < ne; ++i) {
          const auto [r, w] = rows[static_cast<std::size_t>(i)];
          kernels::axpy(w, f.out_.data() + i * f.H_, acc + r * f.H_, f.H_);
        }
      }
      if (moe.has_shared_expert()) {
        // Qwen2-MoE's shared expert, on every row, gated by sigmoid(x Ws^T).
        kernels::linear_part(f.normed_.data(), n, part(moe.shared_expert_gate, f.shared_gate_.data(), 1), f.H_);
        swiglu_rows(f.normed_.data(), n, moe.shared_expert, f.Is_);
        for (std::int64_t r = 0; r < n; ++r)
          kernels::axpy(sigmoid(f.shared_gate_[static_cast<std::size_t>(r)]), f.out_.data() + r * f.H_,
                        acc + r * f.H_, f.H_);
      }
      if constexpr (!Collectives::one_device) {
        coll.psum_tp(std::span<float>(f.moe_out_));
        kernels::add_inplace(f.x_.data(), f.moe_out_.data(), static_cast<std::ptrdiff_t>(n * f.H_));
      }
    }
    // out_ = down(silu(gate x) * up x) of an MLP of width I over rows x [rows, H].
    template <class Mlp>
    void swiglu_rows(const float* x, std::int64_t rows, const Mlp& mlp, std::int64_t I) {
      kernels::linear_group<T, 2>(x, rows, {part(mlp.gate_proj, f.gate_.data(), I), part(mlp.up_proj, f.up_.data(), I)},
                                  f.H_);
      kernels::silu_mul(f.gate_.data(), f.up_.data(), f.gate_.data(), static_cast<std::ptrdiff_t>(rows * I));
      kernels::linear_part(f.gate_.data(), rows, part(mlp.down_proj, f.out_.data(), f.H_), I);
    }
  };

  // ---------------------------------------------------------------- steps of one row, phased
  // Each step is one phase of the team's region; a product's rows split into matvec_tasks
  // ranges as kernels::matvec_group splits them, so every sum is RowSteps' bit for bit. Parts
  // run serial code only: a part that forks could be handed another team thread's body while
  // it waits, and wait on itself.
  struct PhasedSteps {
    CachedForward& f;
    exec::PhasedRegion::Team& team;
    std::int64_t threads;
    float* nx;  // this thread's normalised x

    template <std::size_t P, class After>
    void norm_products(const Norm& norm, const std::array<Part, P>& parts, After&& after) {
      norm_phase(norm, parts, tasks_of(parts), [](std::int64_t) {}, [&] { after(1); });
    }
    void attention(std::int64_t layer) {
      const CachedRow& row = f.rows_[0];
      const std::int64_t rep = f.nh_ / f.nkv_, score_len = f.cache_->shape().max_length;
      team.phase(f.nh_, [&](std::int64_t h) {
        kernels::attend_row_head(f.cache_->view(layer, row.b - f.shard_.b0, h / rep), row.pos, f.q_.data() + h * f.D_,
                                 f.ctx_.data() + h * f.D_, false, f.D_, f.window_of(layer), f.shard_.slots(),
                                 f.scores_.data() + h * score_len, f.softcap_);
      });
    }
    void product_add(const float* in, std::int64_t K, const Part& p, const std::optional<Norm>& post) {
      const std::int64_t tasks = kernels::matvec_tasks(p.N, K, threads);
      const std::array<Part, 1> one{p};
      if (post) {  // the norm needs the whole row: it and the sum run once the product is done
        team.phase(
            tasks, [&](std::int64_t t) { kernels::matvec_group_task(in, one, K, t, tasks); },
            [&] {
              f.norm_rows(*post, p.y, p.y, 1, f.H_);
              kernels::add_range(f.x_.data(), p.y, 0, f.H_);
            });
        return;
      }
      team.phase(tasks, [&](std::int64_t t) {
        kernels::matvec_group_task(in, one, K, t, tasks);
        kernels::add_range(f.x_.data(), p.y, f.H_ * t / tasks, f.H_ * (t + 1) / tasks);
      });
    }
    void norm_gated(const Norm& norm, const std::array<Part, 2>& gate_up, kernels::GatedActivation act) {
      const std::int64_t tasks = tasks_of(gate_up);
      norm_phase(
          norm, gate_up, tasks,
          [&](std::int64_t t) {  // the activation over the rows of gate and up this part wrote
            kernels::gated_mul_range(act, f.gate_.data(), f.up_.data(), f.I_ * t / tasks, f.I_ * (t + 1) / tasks);
          },
          [] {});
    }
    // One row through a mixture of experts: a serial phase normalises x and routes it, one
    // phase runs the gate/up products of the k chosen experts (and of the shared expert), one
    // their down products and the weighted sum into x (each task its range of rows of every
    // expert, experts in index order and the shared expert last, as RowSteps sums them).
    template <class Moe>
    void norm_experts(const Norm& norm, const Moe& moe) {
      const std::int64_t H = f.H_, K = f.K_;
      const bool shared = moe.has_shared_expert();
      team.phase(1, [&](std::int64_t) {
        f.norm_rows(norm, f.x_.data(), f.normed_.data(), 1, H);
        const std::array<Part, 1> router{part(moe.gate, f.router_.data(), f.E_)};
        kernels::matvec_group_task(f.normed_.data(), router, H, 0, 1);
        f.route_rows(1, moe);
        if (shared) {
          const std::array<Part, 1> g{part(moe.shared_expert_gate, f.shared_gate_.data(), 1)};
          kernels::matvec_group_task(f.normed_.data(), g, H, 0, 1);
          f.chosen_.push_back({-1, sigmoid(f.shared_gate_[0])});
        }
      });
      // Slot k: a chosen expert (width Ie), or the shared expert last (width Is).
      const auto mlp_of = [&](std::size_t k) -> const auto& {
        const std::int64_t e = f.chosen_[k].first;
        return e < 0 ? moe.shared_expert : moe.experts[static_cast<std::size_t>(e)];
      };
      const std::size_t slots = f.chosen_.size();
      const auto width = [&](std::size_t k) { return f.chosen_[k].first < 0 ? f.Is_ : f.Ie_; };
      const std::int64_t up_tasks = kernels::matvec_tasks(2 * (K * f.Ie_ + (shared ? f.Is_ : 0)), H, threads);
      team.phase(up_tasks, [&](std::int64_t t) {
        for (std::size_t k = 0; k < slots; ++k) {
          const std::int64_t I = width(k), off = static_cast<std::int64_t>(k) * f.Ie_;
          const std::array<Part, 2> gate_up{part(mlp_of(k).gate_proj, f.gate_.data() + off, I),
                                            part(mlp_of(k).up_proj, f.up_.data() + off, I)};
          kernels::matvec_group_task(f.normed_.data(), gate_up, H, t, up_tasks);
          kernels::silu_mul_range(f.gate_.data() + off, f.up_.data() + off, I * t / up_tasks, I * (t + 1) / up_tasks);
        }
      });
      const std::int64_t down_tasks = kernels::matvec_tasks(static_cast<std::int64_t>(slots) * H, f.Ie_, threads);
      team.phase(down_tasks, [&](std::int64_t t) {
        const std::int64_t lo = H * t / down_tasks, hi = H * (t + 1) / down_tasks;
        for (std::size_t k = 0; k < slots; ++k) {
          const std::int64_t I = width(k), off = static_cast<std::int64_t>(k) * f.Ie_;
          const std::array<Part, 1> down{part(mlp_of(k).down_proj, f.out_.data() + k * H, H)};
          kernels::matvec_group_task(f.gate_.data() + off, down, I, t, down_tasks);
          kernels::axpy_range(f.chosen_[k].second, f.out_.data() + k * H, f.x_.data(), lo, hi);
        }
      });
    }
    void head(float* logits) {
      const std::array<Part, 1> head{f.head_part(logits, 0, f.V_)};
      const std::int64_t tasks = logits ? tasks_of(head) : 0;
      norm_phase(
          norm_of(f.m_->model.norm), head, tasks,
          [&](std::int64_t t) {  // Gemma 2's final soft-capping over the logits this part wrote
            if (f.final_softcap_ > 0)
              kernels::softcap_row(logits + f.V_ * t / tasks, nullptr, f.V_ * (t + 1) / tasks - f.V_ * t / tasks,
                                   f.final_softcap_);
          },
          [] {});
    }

   private:
    // Tasks a grouped product takes: matvec_group's split of all its rows over the team.
    template <std::size_t P>
    std::int64_t tasks_of(const std::array<Part, P>& parts) const {
      std::int64_t rows = 0;
      for (const Part& p : parts) rows += p.N;
      return kernels::matvec_tasks(rows, f.H_, threads);
    }
    // One phase of `tasks` parts: part t normalises x into this thread's buffer, computes task
    // t of the grouped product, then runs epilogue(t); `after` runs once the parts are done.
    template <std::size_t P, class Epilogue, class After>
    void norm_phase(const Norm& norm, const std::array<Part, P>& parts, std::int64_t tasks, Epilogue&& epilogue,
                    After&& after) {
      team.phase(
          tasks,
          [&](std::int64_t t) {
            f.norm_rows(norm, f.x_.data(), nx, 1, f.H_);
            kernels::matvec_group_task(nx, parts, f.H_, t, tasks);
            epilogue(t);
          },
          std::forward<After>(after));
    }
  };

  /// One row (a decode step of one sequence, serving's common case): the whole forward is one
  /// exec::PhasedRegion, so on T threads a token costs one fork/join instead of ~5 per layer.
  void run_one_row(float* last_out) {
    const std::int64_t threads = std::max(1, exec::num_threads());
    if (static_cast<std::int64_t>(thread_normed_.size()) < threads * H_)
      thread_normed_.resize(static_cast<std::size_t>(threads * H_));
    const std::size_t layers = m_->model.layers.size();
    float* logits = last_out ? last_out + rows_[0].b * V_ : nullptr;
    const std::size_t phases = (kPhasesPerLayer + (E_ > 0 ? 1 : 0)) * layers + 1;
    region_->run(static_cast<int>(threads), phases, [&](exec::PhasedRegion::Team& team) {
      PhasedSteps steps{*this, team, threads, thread_normed_.data() + team.thread() * H_};
      for (std::size_t l = 0; l < layers; ++l) layer(steps, l);
      steps.head(logits);
    });
  }

  // ---------------------------------------------------------------- pieces both steps share
  /// Each row's rope cos and sin (angles_ [n, head_dim]: cos then sin), for the length its
  /// sequence reaches in this call (its last row's position + 1; rows_ is sorted by sequence).
  void row_angles(std::int64_t n) {
    const std::int64_t half = D_ / 2;
    if (static_cast<std::int64_t>(angles_.size()) < n * D_) angles_.resize(static_cast<std::size_t>(n * D_));
    if (rope_->local() && static_cast<std::int64_t>(local_angles_.size()) < n * D_)
      local_angles_.resize(static_cast<std::size_t>(n * D_));
    std::int64_t context = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const CachedRow& row = rows_[static_cast<std::size_t>(r)];
      if (r == 0 || rows_[static_cast<std::size_t>(r - 1)].b != row.b) {
        context = 0;
        for (std::int64_t e = r; e < n && rows_[static_cast<std::size_t>(e)].b == row.b; ++e)
          context = std::max(context, rows_[static_cast<std::size_t>(e)].pos + 1);
      }
      float* cos = angles_.data() + r * D_;
      rope_->angles(row.pos, context, cos, cos + half, rope_scratch_);
      if (rope_->local()) {
        float* lcos = local_angles_.data() + r * D_;
        rope_->local()->angles(row.pos, context, lcos, lcos + half, local_rope_scratch_);
      }
    }
  }

  void ensure_rows(std::int64_t n) {
    const auto grow = [](aligned_vector<float>& v, std::int64_t size) {
      if (static_cast<std::int64_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
    };
    grow(x_, n * H_);
    grow(normed_, n * H_);
    grow(q_, n * nh_ * D_);
    grow(k_, n * nkv_ * D_);
    grow(v_, n * nkv_ * D_);
    grow(ctx_, n * nh_ * D_);
    grow(gate_, n * I_);
    grow(up_, n * I_);
    grow(out_, n * H_);
    grow(last_x_, n * H_);
    if (E_ > 0) {  // the one-row path keeps the k experts' (and the shared expert's) side by side
      const std::int64_t wide = std::max({n * I_, n * Ie_, n * Is_, K_ * Ie_ + Is_});
      grow(gate_, wide);
      grow(up_, wide);
      grow(out_, std::max(n, K_ + 1) * H_);
      grow(expert_x_, n * H_);
      grow(router_, n * E_);
      grow(probs_, n * E_);
      grow(shared_gate_, n);
    }
    if (shard_.sp > 1) {
      grow(records_, n * nh_ * (D_ + 2));
      grow(gathered_, n * nh_ * (D_ + 2) * shard_.sp);
    }
    // Attention scores: a block of rows x heads x max_length at a time.
    const std::int64_t per_row = nh_ * cache_->shape().max_length;
    attn_block_ = std::max<std::int64_t>(1, std::min<std::int64_t>(n, (std::int64_t{4} << 20) / per_row));
    grow(scores_, attn_block_ * per_row);
  }

  void embed(std::int64_t n) {
    const T* emb = m_->model.embed_tokens.weight.data();
    for (std::int64_t r = 0; r < n; ++r) {
      const CachedRow& row = rows_[static_cast<std::size_t>(r)];
      float* xr = x_.data() + r * H_;
      if (row.embedding) {
        for (std::int64_t i = 0; i < H_; ++i) xr[i] = row.embedding[i] * embed_scale_;
        continue;
      }
      const T* e = emb + row.id * H_;
      for (std::int64_t i = 0; i < H_; ++i) xr[i] = to_f32(e[i]) * embed_scale_;
    }
  }

  /// Normalises the rows' q and k heads (qk_norm), rotates them to their positions and stores
  /// k, v of the positions this device's cache holds.
  template <class Attn>
  void rope_and_store(std::int64_t layer, std::int64_t n, const Attn& attn) {
    // The norms are per head, so a tp shard of heads normalises its own. One head per call, so
    // no call forks: the one-row path runs this as a phase's `after`, on one thread while the
    // rest of the team waits.
    if (attn.has_qk_norm())
      for (std::int64_t r = 0; r < n; ++r) {
        for (std::int64_t h = 0; h < nh_; ++h) {
          float* q = q_.data() + (r * nh_ + h) * D_;
          norm_rows(norm_of(attn.q_norm), q, q, 1, D_);
        }
        for (std::int64_t g = 0; g < nkv_; ++g) {
          float* k = k_.data() + (r * nkv_ + g) * D_;
          norm_rows(norm_of(attn.k_norm), k, k, 1, D_);
        }
      }
    const float* angles = (local_rope_[static_cast<std::size_t>(layer)] ? local_angles_ : angles_).data();
    for (std::int64_t r = 0; r < n; ++r) {
      const float* cos = angles + r * D_;
      const float* sin = cos + D_ / 2;
      rope_->rotate(q_.data() + r * nh_ * D_, nh_, cos, sin);
      rope_->rotate(k_.data() + r * nkv_ * D_, nkv_, cos, sin);
    }
    // A scale other than 1 / sqrt(head_dim) (Gemma's query_pre_attn_scalar) goes into q: the
    // attention kernels scale by 1 / sqrt(head_dim).
    if (q_mult_ != 1.0f) kernels::scale(q_.data(), q_mult_, static_cast<std::ptrdiff_t>(n * nh_ * D_));
    for (std::int64_t r = 0; r < n; ++r) {
      const CachedRow& row = rows_[static_cast<std::size_t>(r)];
      if (row.pos % shard_.sp != shard_.sp_rank) continue;  // another sp rank holds this position
      cache_->store(layer, row.b - shard_.b0, row.pos / shard_.sp, k_.data() + r * nkv_ * D_, v_.data() + r * nkv_ * D_);
    }
  }

  /// Attention of the rows' heads over this device's slots: prefill runs on the GEMM, other
  /// rows row by row; with sp > 1 partial records, exchanged over sp and combined.
  template <class Collectives>
  void attention_rows(Collectives& coll, std::int64_t layer, std::int64_t n) {
    const std::int64_t sp = shard_.sp, SW = D_ + 2;  // SW: one (m, l, o[D]) record
    const kernels::AttentionOut out = sp == 1 ? kernels::AttentionOut{ctx_.data(), nh_ * D_, D_}
                                              : kernels::AttentionOut{records_.data(), nh_ * SW, SW, true};
    const auto view_of = [&](const CachedRow& row, std::int64_t g) { return cache_->view(layer, row.b - shard_.b0, g); };
    const std::int64_t window = window_of(layer);
    detail::attend_runs_gemm(rows_, runs_, nh_, nkv_, D_, window, shard_.slots(), q_.data(), out, view_of, softcap_);
    detail::attend_rows(rows_, single_, nh_, nkv_, D_, window, shard_.slots(), q_.data(), out, scores_.data(),
                        cache_->shape().max_length, attn_block_, view_of, softcap_);
    if (sp == 1) return;
    const std::size_t rec = static_cast<std::size_t>(n * nh_ * SW);
    coll.all_gather_sp(std::span<const float>(records_.data(), rec), std::span<float>(gathered_.data(), rec * sp));
    kernels::combine_attention_records(gathered_.data(), sp, static_cast<std::int64_t>(rec), n * nh_, D_, ctx_.data());
  }

  static float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }  // nn::MoE's, bit for bit

  /// Routes rows [0, n) by their router logits (router_): each expert's (row, weight) pairs in
  /// row order, and for one row its k (expert, weight) pairs in expert order.
  template <class Moe>
  void route_rows(std::int64_t n, const Moe& moe) {
    expert_rows_.resize(static_cast<std::size_t>(E_));
    for (auto& r : expert_rows_) r.clear();
    top_.resize(static_cast<std::size_t>(K_));
    weight_.resize(static_cast<std::size_t>(K_));
    for (std::int64_t r = 0; r < n; ++r) {
      Moe::route_token(router_.data() + r * E_, probs_.data() + r * E_, moe.config(), top_.data(), weight_.data());
      for (std::int64_t k = 0; k < K_; ++k)
        expert_rows_[static_cast<std::size_t>(top_[static_cast<std::size_t>(k)])].push_back(
            {r, weight_[static_cast<std::size_t>(k)]});
    }
    chosen_.clear();
    if (n == 1)
      for (std::int64_t e = 0; e < E_; ++e)
        if (!expert_rows_[static_cast<std::size_t>(e)].empty())
          chosen_.push_back({e, expert_rows_[static_cast<std::size_t>(e)][0].second});
  }

  void set_lengths() {
    for (std::int64_t lb = 0; lb < shard_.nb; ++lb) {
      const std::int64_t nd = local_need_[static_cast<std::size_t>(lb)];
      if (nd >= 0) cache_->set_length(lb, nd);
    }
  }

  /// This device's vocabulary columns [c0, c1) of the logits of every row (all_out) and of each
  /// sequence's last row (last_out).
  void head(float* last_out, float* all_out, std::int64_t n) {
    const std::int64_t nc = shard_.c1 - shard_.c0;
    if (nc == 0) return;
    std::vector<float*>& dst = head_dst_;
    if (all_out) {
      std::memcpy(last_x_.data(), x_.data(), static_cast<std::size_t>(n * H_) * sizeof(float));
      dst.clear();
      for (std::int64_t r = 0; r < n; ++r) dst.push_back(all_out + rows_[static_cast<std::size_t>(r)].out * V_);
      head_rows(n);
    }
    if (last_out) {
      dst.clear();
      std::int64_t nl = 0;
      for (std::int64_t r = 0; r < n; ++r) {
        const CachedRow& row = rows_[static_cast<std::size_t>(r)];
        if (r + 1 < n && rows_[static_cast<std::size_t>(r + 1)].b == row.b) continue;
        std::memcpy(last_x_.data() + nl * H_, x_.data() + r * H_, static_cast<std::size_t>(H_) * sizeof(float));
        dst.push_back(last_out + row.b * V_);
        ++nl;
      }
      head_rows(nl);
    }
  }

  /// The head over the first nl rows of last_x_, into head_dst_'s rows (columns c0 ..).
  void head_rows(std::int64_t nl) {
    const std::int64_t c0 = shard_.c0, nc = shard_.c1 - c0;
    norm_rows(norm_of(m_->model.norm), last_x_.data(), normed_.data(), nl, H_);
    bool contiguous = nc == V_;  // whole rows, one after another: the product writes them in place
    for (std::int64_t i = 1; contiguous && i < nl; ++i)
      contiguous = head_dst_[static_cast<std::size_t>(i)] == head_dst_[0] + i * V_;
    const auto softcap = [&](float* y) {  // Gemma 2's final soft-capping
      if (final_softcap_ > 0) kernels::softcap_rows(y, nl, nc, final_softcap_);
    };
    if (contiguous) {
      kernels::linear_part(normed_.data(), nl, head_part(head_dst_[0], c0, nc), H_);
      softcap(head_dst_[0]);
      return;
    }
    if (static_cast<std::int64_t>(head_out_.size()) < nl * nc) head_out_.resize(static_cast<std::size_t>(nl * nc));
    kernels::linear_part(normed_.data(), nl, head_part(head_out_.data(), c0, nc), H_);
    softcap(head_out_.data());
    for (std::int64_t i = 0; i < nl; ++i)
      std::memcpy(head_dst_[static_cast<std::size_t>(i)] + c0, head_out_.data() + i * nc,
                  static_cast<std::size_t>(nc) * sizeof(float));
  }

  /// The lm_head's vocabulary rows [c0, c0 + nc) as a product into y (dense, or quantized rows).
  Part head_part(float* y, std::int64_t c0, std::int64_t nc) const {
    if (!m_->tied() && m_->lm_head.is_quantized()) {
      quant::MatrixView v = m_->lm_head.qweight.view();
      v.data = quant::in_row_groups(v.format) ? v.group(c0 / quant::kGroupRows) : v.row(c0);  // c0: a group's edge
      if (v.absmax) v.absmax = v.row_absmax(c0);
      v.rows = nc;
      return Part{nullptr, nullptr, y, nc, v};
    }
    return Part{m_->head_weight() + c0 * H_, nullptr, y, nc};
  }

  /// A Linear as one part of a product into y (N outputs): its weight, dense or quantized,
  /// and its LoRA adapter, applied unmerged.
  template <class Lin>
  static Part part(const Lin& lin, float* y, std::int64_t N) {
    const T* bias = lin.has_bias() ? lin.bias.data() : nullptr;
    Part p = lin.is_quantized() ? Part{nullptr, bias, y, N, lin.qweight.view()} : Part{lin.weight.data(), bias, y, N};
    if (lin.adapts()) p.lora = {lin.lora->A.data(), lin.lora->B.data(), lin.lora->rank(), lin.lora->scale};
    return p;
  }

  const Model* m_;
  Cache* cache_;
  const RopeTable* rope_;
  DeviceShard shard_;
  std::int64_t V_ = 0, H_ = 0, I_ = 0, nh_ = 0, nkv_ = 0, D_ = 0, attn_block_ = 1;
  std::vector<std::int64_t> windows_;  // each layer's attention window (0: none)
  std::vector<bool> local_rope_;       // each layer rotates with the local table (Gemma's sliding layers)
  float embed_scale_ = 1.0f, q_mult_ = 1.0f;
  float softcap_ = 0.0f, final_softcap_ = 0.0f;  // Gemma 2's soft-capping of scores and logits (0: none)
  float eps_ = 0.0f;
  // Scratch, on cache lines as the weights: the products read x in full vectors beside each
  // weight row. Rows of the call: x (the residual stream), normed (a norm's output), q, k, v,
  // ctx (attention's output), gate and up (the MLP's), out (a row-parallel product's);
  // last_x and head_out feed the lm_head; records and gathered are sp's partial attention.
  aligned_vector<float> x_, normed_, q_, k_, v_, ctx_, gate_, up_, out_, last_x_, head_out_, scores_, records_,
      gathered_;
  aligned_vector<float> thread_normed_;  // run_one_row: each team thread's normalised x
  aligned_vector<float> angles_;         // each row's rope cos and sin
  aligned_vector<float> local_angles_;   // and with the local table (Gemma's sliding layers)
  RopeTable::Scratch rope_scratch_, local_rope_scratch_;  // one per table: each caches its own frequencies
  // Mixture of experts: E_ experts, K_ per row (0, 0: dense); the router's logits and
  // probabilities of the rows, an expert's gathered rows, each expert's (row, weight) pairs
  // and, for one row, its k (expert, weight) pairs in expert order.
  // Ie_, Is_: an expert's and the shared expert's (Qwen2-MoE; 0: none) intermediate sizes.
  std::int64_t E_ = 0, K_ = 0, Ie_ = 0, Is_ = 0;
  aligned_vector<float> expert_x_, router_, probs_, shared_gate_;
  aligned_vector<float> moe_out_;  // on a mesh: a sparse block's tp-partial output, summed before the residual
  std::vector<std::vector<std::pair<std::int64_t, float>>> expert_rows_;
  std::vector<std::pair<std::int64_t, float>> chosen_;
  std::vector<std::int64_t> top_;
  std::vector<float> weight_;
  std::unique_ptr<exec::PhasedRegion> region_ = std::make_unique<exec::PhasedRegion>();  // stays movable
  std::vector<CachedRow> rows_;
  std::vector<std::int64_t> local_need_, single_;
  std::vector<std::pair<std::int64_t, std::int64_t>> runs_;  // [first, last + 1) rows of a prefill run
  std::vector<float*> head_dst_;
};

}  // namespace edl::generate
