// edl/generate/sharded_decoder.hpp
// Incremental decoding of a Llama on a device mesh, with a KV cache sharded over tp (kv heads)
// and sp (positions) (docs/generation.md, "Generation on a mesh").
//
//   auto mesh = create_mesh({1, 1, 2, 2});                       // tp=2 x sp=2: 4 devices
//   generate::ShardedDecoder dec(model, mesh, /*batch=*/1, /*max_length=*/64);
//   dec.prefill(ids, seq, mask, logits);                         // as generate::Decoder
//   dec.decode(next_ids, logits);
//
// What each axis does (every device of a (tp, sp) group handles the same sequences):
//  - dp and fsdp split the batch: the sequences are cut into dp * fsdp contiguous ranges (an
//    uneven cut is allowed; a group with no sequence idles). fsdp does not shard weights here:
//    the parameters are gathered once, when the decoder is built, because every decode step
//    needs every weight and re-gathering them per token would move the whole model per token.
//  - tp splits attention heads (q heads and kv heads: kv heads must be divisible by tp) and the
//    MLP's intermediate size, as ShardedLlama does: q/k/v/gate/up column-parallel, o_proj and
//    down_proj row-parallel followed by a psum over tp (a row-parallel bias is added by tp rank
//    0 only). Each device's cache holds only its kv heads.
//  - sp splits the cache along positions, round-robin: position p lives on sp rank p % sp at
//    local slot p / sp, so memory and attention reads stay balanced as the sequence grows.
//    Norms, projections and the MLP are replicated over sp. Attention is flash-decoding: each
//    sp rank computes, per (token, head), the max m, the sum l of exp(s - m) and the weighted
//    values o over its own slots (a prefill chunk's rows on the GEMM, as in the Decoder); one
//    all_gather over sp exchanges (m, l, o) and every rank
//    combines them in rank order: ctx = sum_r o_r e^(m_r - M) / sum_r l_r e^(m_r - M),
//    M = max_r m_r. That is the softmax over all slots, up to f32 rounding.
//  - the lm_head is split by vocabulary columns over the tp x sp devices of a group: each
//    computes its columns and writes them into the logits; nothing crosses devices for it.
// Per token and layer, what crosses devices: two psums over tp of [H] floats, one all_gather
// over sp of heads/tp x (head_dim + 2) floats. Under MPI the logits are completed across
// processes (each process writes its devices' columns into zeros, then one sum), so every rank
// holds the same logits and samples the same tokens.
//
// The math is generate::Decoder's (same kernels: linear_nt / matmul_nt, rms_norm, rope tables,
// vector exp, the cache views); with sp = 1 the attention is the same code path.
// Errors before any work: kv heads (or heads, intermediate size) not divisible by tp, token ids
// outside the vocabulary, a mask that is not left padding, more tokens than max_length.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/rope_table.hpp>
#include <edl/kernels/activations.hpp>
#include <edl/kernels/detail/simd.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/rms_norm.hpp>
#include <edl/mesh/collectives.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/nn/rotary.hpp>

namespace edl::generate {

/// The tp-local config a mesh decoder runs per device; kv heads not divisible by tp is an
/// error naming the tensor and both sizes (each tp rank must hold whole kv heads).
inline models::LlamaConfig sharded_decoder_local_config(const models::LlamaConfig& c, std::int64_t tp) {
  const char* w = "generate.ShardedDecoder";
  EDL_CHECK(tp >= 1, errc::invalid_argument, w, "tp must be >= 1, found ", tp);
  EDL_CHECK(c.num_key_value_heads % tp == 0, errc::not_divisible, w, "num_key_value_heads = ", c.num_key_value_heads,
            " is not divisible by tp = ", tp, ": the KV cache is sharded by kv heads, so each tp rank needs ",
            "whole kv heads (use a tp that divides ", c.num_key_value_heads, ")");
  EDL_CHECK(c.num_attention_heads % tp == 0, errc::not_divisible, w, "num_attention_heads = ", c.num_attention_heads,
            " is not divisible by tp = ", tp);
  EDL_CHECK(c.intermediate_size % tp == 0, errc::not_divisible, w, "intermediate_size = ", c.intermediate_size,
            " is not divisible by tp = ", tp);
  return models::tp_local_config(c, tp);
}

template <class Pol = DefaultPolicy, KVCache Cache = StandardKVCache>
class ShardedDecoder {
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using T = typename Pol::param_t;
  /// Builds one device's cache of the given (local) shape; empty: Cache(shape).
  using CacheFactory = std::function<std::unique_ptr<Cache>(const KVCacheShape&)>;

  /// Shards a one-device model: each device takes its tp block of every parameter.
  ShardedDecoder(const Model& model, DefaultMesh mesh, std::int64_t batch, std::int64_t max_length,
                 CacheFactory make_cache = {})
      : mesh_(std::move(mesh)), cfg_(model.config()) {
    init(batch, max_length);
    std::map<std::string, std::pair<const T*, std::vector<std::size_t>>> src;
    auto& m = const_cast<Model&>(model);  // visit_params is non-const; only read here
    m.visit_params("", [&](std::string_view path, auto& p) {
      src.emplace(std::string(path),
                  std::make_pair(static_cast<const T*>(p.value.data()),
                                 std::vector<std::size_t>(p.value.shape().begin(), p.value.shape().end())));
    });
    build(src, std::move(make_cache));
  }

  /// From a ShardedLlama: its parameters are gathered once (fsdp / dp / sp blocks included,
  /// across processes under MPI), then each device keeps its tp block.
  ShardedDecoder(const models::ShardedLlama<Pol>& sm, std::int64_t batch, std::int64_t max_length,
                 CacheFactory make_cache = {})
      : mesh_(sm.mesh()), cfg_(sm.config()) {
    init(batch, max_length);
    std::map<std::string, xt::xarray<T>> full;
    for (const auto& n : sm.names()) full.emplace(n, sm.gather_param(n));
    std::map<std::string, std::pair<const T*, std::vector<std::size_t>>> src;
    for (const auto& [n, a] : full)
      src.emplace(n, std::make_pair(static_cast<const T*>(a.data()),
                                    std::vector<std::size_t>(a.shape().begin(), a.shape().end())));
    build(src, std::move(make_cache));
  }

  const DefaultMesh& mesh() const noexcept { return mesh_; }
  const models::LlamaConfig& config() const noexcept { return cfg_; }
  std::int64_t batch() const noexcept { return B_; }
  std::int64_t max_length() const noexcept { return P_; }
  /// Tokens sequence b holds (all devices together).
  std::int64_t length(std::int64_t b) const {
    detail::check_seq(b, B_, "generate.ShardedDecoder.length");
    return len_[static_cast<std::size_t>(b)];
  }
  /// Forgets every sequence (the caches keep their memory).
  void reset() {
    std::fill(len_.begin(), len_.end(), 0);
    for (auto& s : dev_)
      if (s)
        for (std::int64_t b = 0; b < s->cache->shape().batch; ++b) s->cache->reset(b);
  }
  /// Bytes of the KV cache of device d (0 for a device of another process).
  std::int64_t cache_bytes(std::int64_t d) const {
    const auto& s = dev_.at(static_cast<std::size_t>(d));
    return s ? s->cache->bytes() : 0;
  }
  /// Bytes of the KV caches of this process's devices.
  std::int64_t cache_bytes() const {
    std::int64_t t = 0;
    for (std::int64_t d = 0; d < mesh_.size(); ++d) t += cache_bytes(d);
    return t;
  }
  /// Scratch bytes of this process's devices.
  std::int64_t scratch_bytes() const {
    std::int64_t t = 0;
    for (const auto& s : dev_)
      if (s) t += s->scratch_bytes();
    return t;
  }
  /// The cache of device d (this process's devices only), for inspection.
  const Cache& cache(std::int64_t d) const {
    const auto& s = dev_.at(static_cast<std::size_t>(d));
    EDL_CHECK(s != nullptr, errc::invalid_argument, "generate.ShardedDecoder.cache", "device ", d,
              " runs in another process");
    return *s->cache;
  }

  /// As Decoder::prefill: ids [batch, seq], mask [batch, seq] left padding (or null),
  /// logits_last [batch, vocab] (rows of sequences without a token in the chunk untouched),
  /// logits_all [batch * seq, vocab] (optional; padding rows 0).
  void prefill(const std::int64_t* ids, std::int64_t seq, const std::int64_t* mask, float* logits_last,
               float* logits_all = nullptr) {
    const char* w = "generate.ShardedDecoder.prefill";
    EDL_CHECK(seq >= 0, errc::invalid_argument, w, "seq must be >= 0, found ", seq);
    rows_.clear();
    for (std::int64_t b = 0; b < B_; ++b) {
      std::int64_t pad = 0;
      if (mask) {
        while (pad < seq && mask[b * seq + pad] == 0) ++pad;
        for (std::int64_t s = pad; s < seq; ++s)
          EDL_CHECK(mask[b * seq + s] != 0, errc::invalid_argument, w, "attention_mask row ", b,
                    " is not left padding (a 0 at ", s, " after a 1)");
      }
      const std::int64_t len = len_[static_cast<std::size_t>(b)];
      for (std::int64_t s = pad; s < seq; ++s) rows_.push_back({b, len + s - pad, ids[b * seq + s], b * seq + s});
    }
    run(logits_last, logits_all, logits_all ? seq : 0);
  }

  /// As Decoder::decode: one token per (active) sequence; logits [batch, vocab].
  void decode(const std::int64_t* ids, float* logits, const std::uint8_t* active = nullptr) {
    rows_.clear();
    for (std::int64_t b = 0; b < B_; ++b)
      if (!active || active[b]) rows_.push_back({b, len_[static_cast<std::size_t>(b)], ids[b], b});
    run(logits, nullptr, 0);
  }

 private:
  struct Row {
    std::int64_t b, pos, id, out;  // global sequence, position, token, row in logits_all
  };

  // What one device holds: its tp-local model, its cache (its sequences, kv heads, positions)
  // and its scratch.
  struct DeviceState {
    std::unique_ptr<Model> model;
    std::unique_ptr<Cache> cache;
    std::int64_t b0 = 0, nb = 0;                    // sequences [b0, b0 + nb)
    std::int64_t tp = 1, tp_rank = 0, sp = 1, sp_rank = 0;
    std::int64_t c0 = 0, c1 = 0;                    // the lm_head columns it computes
    std::int64_t attn_block = 1;
    /// Which positions of a sequence this device's cache holds (round-robin over sp).
    detail::SlotMap slots() const noexcept { return {sp, sp_rank}; }
    std::vector<Row> rows;
    std::vector<std::int64_t> need, last, single;                 // single: rows attending row by row
    std::vector<std::pair<std::int64_t, std::int64_t>> runs;    // prefill runs attending on the GEMM
    std::vector<float> x, n, q, k, v, ctx, g, u, o, hl, lg, scores, stats, gathered;
    std::int64_t scratch_bytes() const noexcept {
      return static_cast<std::int64_t>((x.size() + n.size() + q.size() + k.size() + v.size() + ctx.size() + g.size() +
                                        u.size() + o.size() + hl.size() + lg.size() + scores.size() + stats.size() +
                                        gathered.size()) *
                                       sizeof(float));
    }
  };

  void init(std::int64_t batch, std::int64_t max_length) {
    const char* w = "generate.ShardedDecoder";
    cfg_.validate();
    EDL_CHECK(batch > 0 && max_length > 0, errc::invalid_argument, w, "batch and max_length must be positive, found ",
              batch, " and ", max_length);
    B_ = batch;
    P_ = max_length;
    local_cfg_ = sharded_decoder_local_config(cfg_, mesh_.axis_size("tp"));
    H_ = cfg_.hidden_size;
    V_ = cfg_.vocab_size;
    D_ = cfg_.head_size();
    nh_ = local_cfg_.num_attention_heads;
    nkv_ = local_cfg_.num_key_value_heads;
    I_ = local_cfg_.intermediate_size;
    window_ = cfg_.attention_window().value_or(0);
    len_.assign(static_cast<std::size_t>(B_), 0);
    rope_ = RopeTable(cfg_, P_);
  }

  static bool row_parallel(const std::string& name) {
    return name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight");
  }
  static bool row_bias(const std::string& name) {
    return name.ends_with("o_proj.bias") || name.ends_with("down_proj.bias");
  }

  /// Builds every local device's model (its tp block of each parameter) and cache.
  void build(const std::map<std::string, std::pair<const T*, std::vector<std::size_t>>>& src, CacheFactory make) {
    const char* w = "generate.ShardedDecoder";
    if (!make) {
      if constexpr (std::is_constructible_v<Cache, const KVCacheShape&>)
        make = [](const KVCacheShape& s) { return std::make_unique<Cache>(s); };
      else
        ::edl::detail::raise(errc::invalid_argument, w, "this cache kind needs a CacheFactory (its options)");
    }
    const std::int64_t groups = mesh_.axis_size("dp") * mesh_.axis_size("fsdp");
    const std::int64_t sp = mesh_.axis_size("sp");
    dev_.resize(static_cast<std::size_t>(mesh_.size()));
    // Validate the parameter list on the host, before any device work.
    for (const auto& [name, shape] : local_cfg_.parameter_shapes()) {
      if (name == "lm_head.weight" && cfg_.tie_word_embeddings) continue;
      EDL_CHECK(src.count(name) > 0, errc::invalid_argument, w, "the model has no parameter \"", name, "\"");
    }
    std::mutex mu;
    mesh_.run([&](Device& dev) {
      auto s = std::make_unique<DeviceState>();
      s->tp = dev.axis_size("tp");
      s->tp_rank = dev.axis_index("tp");
      s->sp = dev.axis_size("sp");
      s->sp_rank = dev.axis_index("sp");
      const std::int64_t g = dev.axis_index("dp") * dev.axis_size("fsdp") + dev.axis_index("fsdp");
      s->b0 = g * B_ / groups;
      s->nb = (g + 1) * B_ / groups - s->b0;
      const std::int64_t gs = s->tp * s->sp, k = s->tp_rank * s->sp + s->sp_rank;
      s->c0 = k * V_ / gs;
      s->c1 = (k + 1) * V_ / gs;
      s->model = std::make_unique<Model>(local_cfg_);
      s->model->visit_params("", [&](std::string_view path, auto& p) {
        const std::string name(path);
        const auto& [data, gshape] = src.at(name);
        T* dst = p.value.data();
        const std::vector<std::size_t> lshape(p.value.shape().begin(), p.value.shape().end());
        EDL_CHECK(lshape.size() == gshape.size(), errc::shape_mismatch, w, name, ": expected ", lshape.size(),
                  " dimensions, found ", gshape.size());
        if (lshape == gshape) {  // replicated (norms, embedding, head, unsplit biases)
          std::memcpy(dst, data, p.value.size() * sizeof(T));
          if (row_bias(name) && s->tp_rank != 0) std::fill(dst, dst + p.value.size(), T{});
        } else if (row_parallel(name)) {  // [H, K]: columns tp_rank * Kl ..
          const std::size_t rows = lshape[0], kl = lshape[1], kg = gshape[1];
          EDL_CHECK(rows == gshape[0] && kl * static_cast<std::size_t>(s->tp) == kg, errc::shape_mismatch, w, name,
                    ": local shape does not split the global one over tp");
          for (std::size_t r = 0; r < rows; ++r)
            std::memcpy(dst + r * kl, data + r * kg + static_cast<std::size_t>(s->tp_rank) * kl, kl * sizeof(T));
        } else {  // column-parallel: rows tp_rank * Nl ..
          EDL_CHECK(lshape[0] * static_cast<std::size_t>(s->tp) == gshape[0], errc::shape_mismatch, w, name,
                    ": local shape does not split the global one over tp");
          std::memcpy(dst, data + static_cast<std::size_t>(s->tp_rank) * p.value.size(), p.value.size() * sizeof(T));
        }
      });
      const KVCacheShape cs{cfg_.num_hidden_layers, std::max<std::int64_t>(1, s->nb), (P_ + sp - 1) / sp, nkv_, D_};
      s->cache = make(cs);
      std::lock_guard<std::mutex> lock(mu);
      dev_[static_cast<std::size_t>(dev.id())] = std::move(s);
    });
  }

  static void grow(std::vector<float>& v, std::int64_t size) {
    if (static_cast<std::int64_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
  }

  void ensure_rows(DeviceState& s, std::int64_t n) const {
    grow(s.x, n * H_);
    grow(s.n, n * H_);
    grow(s.q, n * nh_ * D_);
    grow(s.k, n * nkv_ * D_);
    grow(s.v, n * nkv_ * D_);
    grow(s.ctx, n * nh_ * D_);
    grow(s.g, n * I_);
    grow(s.u, n * I_);
    grow(s.o, n * H_);
    grow(s.hl, n * H_);
    grow(s.lg, n * (s.c1 - s.c0));
    if (s.sp > 1) {
      grow(s.stats, n * nh_ * (D_ + 2));
      grow(s.gathered, n * nh_ * (D_ + 2) * s.sp);
    }
    const std::int64_t per_row = nh_ * s.cache->shape().max_length;
    s.attn_block = std::max<std::int64_t>(1, std::min<std::int64_t>(n, (std::int64_t{4} << 20) / per_row));
    grow(s.scores, s.attn_block * per_row);
  }

  void run(float* logits_last, float* logits_all, std::int64_t seq) {
    const char* w = "generate.ShardedDecoder";
    // Validate everything on the host before any device work.
    need_.assign(static_cast<std::size_t>(B_), -1);
    for (const Row& r : rows_) {
      EDL_CHECK(r.id >= 0 && r.id < V_, errc::invalid_argument, w, "token id ", r.id, " (sequence ", r.b, ", position ",
                r.pos, ") is outside the vocabulary [0, ", V_, ")");
      need_[static_cast<std::size_t>(r.b)] = std::max(need_[static_cast<std::size_t>(r.b)], r.pos + 1);
    }
    for (std::int64_t b = 0; b < B_; ++b)
      EDL_CHECK(need_[static_cast<std::size_t>(b)] <= P_, errc::invalid_argument, w, "sequence ", b, " needs ",
                need_[static_cast<std::size_t>(b)], " tokens, more than max_length = ", P_);
    if (logits_all) std::fill(logits_all, logits_all + B_ * seq * V_, 0.0f);
    if (rows_.empty()) return;
    // Devices write their vocabulary columns into zeroed buffers; under MPI one sum over the
    // processes completes them (every element has exactly one writer, so the sum is exact).
    last_out_.assign(logits_last ? static_cast<std::size_t>(B_ * V_) : 0, 0.0f);
    mesh_.run([&](Device& dev) {
      device_step(dev, logits_last ? last_out_.data() : nullptr, logits_all);
    });
    CollectiveBackend& be = mesh_.backend();
    if (be.processes() > 1) {
      if (logits_last) be.sum_over_processes(last_out_.data(), last_out_.size(), DType::f32);
      if (logits_all) be.sum_over_processes(logits_all, static_cast<std::size_t>(B_ * seq * V_), DType::f32);
    }
    for (std::int64_t b = 0; b < B_; ++b) {
      const std::int64_t nd = need_[static_cast<std::size_t>(b)];
      if (nd < 0) continue;
      len_[static_cast<std::size_t>(b)] = nd;
      if (logits_last)
        std::memcpy(logits_last + b * V_, last_out_.data() + b * V_, static_cast<std::size_t>(V_) * sizeof(float));
    }
  }

  void device_step(Device& dev, float* last_out, float* all_out) {
    DeviceState& s = *dev_[static_cast<std::size_t>(dev.id())];
    s.rows.clear();
    for (const Row& r : rows_)
      if (r.b >= s.b0 && r.b < s.b0 + s.nb) s.rows.push_back(r);
    const std::int64_t n = static_cast<std::int64_t>(s.rows.size());
    if (n == 0) return;  // the whole (tp, sp) group has the same sequences: no collective skipped
    Cache& cache = *s.cache;
    s.need.assign(static_cast<std::size_t>(s.nb), 0);
    for (std::int64_t lb = 0; lb < s.nb; ++lb) {
      const std::int64_t nd = need_[static_cast<std::size_t>(s.b0 + lb)];
      s.need[static_cast<std::size_t>(lb)] = nd < 0 ? -1 : s.slots().end(nd);
      if (nd >= 0 && s.need[static_cast<std::size_t>(lb)] > 0) cache.reserve(lb, s.need[static_cast<std::size_t>(lb)]);
    }
    ensure_rows(s, n);
    detail::split_attention_rows(s.rows, n, s.runs, s.single);  // the same rows in every layer
    const Model& m = *s.model;
    const T* emb = m.model.embed_tokens.weight.data();
    for (std::int64_t r = 0; r < n; ++r) {
      const T* e = emb + s.rows[static_cast<std::size_t>(r)].id * H_;
      float* xr = s.x.data() + r * H_;
      for (std::int64_t i = 0; i < H_; ++i) xr[i] = to_f32(e[i]);
    }
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const std::size_t nH = static_cast<std::size_t>(n * H_);
    for (std::size_t l = 0; l < m.model.layers.size(); ++l) {
      const auto& L = m.model.layers[l];
      const auto& A = L.self_attn;
      kernels::rms_norm_forward(s.x.data(), L.input_layernorm.weight.data(), s.n.data(), static_cast<float*>(nullptr), n,
                                H_, eps);
      detail::linear_group<T, 3>(s.n.data(), n,
                                 {detail::MatvecPart<T>{A.q_proj.weight.data(), bias_of(A.q_proj), s.q.data(), nh_ * D_},
                                  {A.k_proj.weight.data(), bias_of(A.k_proj), s.k.data(), nkv_ * D_},
                                  {A.v_proj.weight.data(), bias_of(A.v_proj), s.v.data(), nkv_ * D_}},
                                 H_);
      rope(s, s.q.data(), n, nh_);
      rope(s, s.k.data(), n, nkv_);
      for (std::int64_t r = 0; r < n; ++r) {
        const Row& row = s.rows[static_cast<std::size_t>(r)];
        if (row.pos % s.sp != s.sp_rank) continue;  // another sp rank owns this position
        cache.store(static_cast<std::int64_t>(l), row.b - s.b0, row.pos / s.sp, s.k.data() + r * nkv_ * D_,
                    s.v.data() + r * nkv_ * D_);
      }
      attention(dev, s, static_cast<std::int64_t>(l), n);
      detail::linear_nt(s.ctx.data(), n, A.o_proj.weight.data(), bias_of(A.o_proj), s.o.data(), H_, nh_ * D_);
      if (s.tp > 1) psum(dev, std::span<float>(s.o.data(), nH), "tp");
      kernels::add_inplace(s.x.data(), s.o.data(), static_cast<std::ptrdiff_t>(nH));
      kernels::rms_norm_forward(s.x.data(), L.post_attention_layernorm.weight.data(), s.n.data(),
                                static_cast<float*>(nullptr), n, H_, eps);
      detail::linear_group<T, 2>(s.n.data(), n,
                                 {detail::MatvecPart<T>{L.mlp.gate_proj.weight.data(), bias_of(L.mlp.gate_proj), s.g.data(), I_},
                                  {L.mlp.up_proj.weight.data(), bias_of(L.mlp.up_proj), s.u.data(), I_}},
                                 H_);
      kernels::silu_mul(s.g.data(), s.u.data(), s.g.data(), static_cast<std::ptrdiff_t>(n * I_));
      detail::linear_nt(s.g.data(), n, L.mlp.down_proj.weight.data(), bias_of(L.mlp.down_proj), s.o.data(), H_, I_);
      if (s.tp > 1) psum(dev, std::span<float>(s.o.data(), nH), "tp");
      kernels::add_inplace(s.x.data(), s.o.data(), static_cast<std::ptrdiff_t>(nH));
    }
    for (std::int64_t lb = 0; lb < s.nb; ++lb)
      if (s.need[static_cast<std::size_t>(lb)] >= 0) cache.set_length(lb, s.need[static_cast<std::size_t>(lb)]);

    // The head: this device's vocabulary columns [c0, c1) for the rows that need logits.
    const std::int64_t nc = s.c1 - s.c0;
    if (nc == 0) return;
    const T* head = m.head_weight() + s.c0 * H_;
    const T* norm_w = m.model.norm.weight.data();
    const auto head_rows = [&](std::int64_t nl, float* const* dst) {
      kernels::rms_norm_forward(s.hl.data(), norm_w, s.n.data(), static_cast<float*>(nullptr), nl, H_, eps);
      detail::linear_nt(s.n.data(), nl, head, static_cast<const T*>(nullptr), s.lg.data(), nc, H_);
      for (std::int64_t i = 0; i < nl; ++i)
        std::memcpy(dst[i] + s.c0, s.lg.data() + i * nc, static_cast<std::size_t>(nc) * sizeof(float));
    };
    std::vector<float*> dst;
    if (all_out) {
      std::memcpy(s.hl.data(), s.x.data(), nH * sizeof(float));
      for (std::int64_t r = 0; r < n; ++r) dst.push_back(all_out + s.rows[static_cast<std::size_t>(r)].out * V_);
      head_rows(n, dst.data());
    }
    if (last_out) {
      dst.clear();
      std::int64_t nl = 0;
      for (std::int64_t r = 0; r < n; ++r) {
        const Row& row = s.rows[static_cast<std::size_t>(r)];
        if (r + 1 < n && s.rows[static_cast<std::size_t>(r + 1)].b == row.b) continue;
        std::memcpy(s.hl.data() + nl * H_, s.x.data() + r * H_, static_cast<std::size_t>(H_) * sizeof(float));
        dst.push_back(last_out + row.b * V_);
        ++nl;
      }
      head_rows(nl, dst.data());
    }
  }

  template <class Lin>
  static const T* bias_of(const Lin& lin) {
    return lin.has_bias() ? lin.bias.data() : nullptr;
  }

  void rope(const DeviceState& s, float* x, std::int64_t n, std::int64_t heads) const {
    for (std::int64_t r = 0; r < n; ++r) rope_.rotate(x + r * heads * D_, s.rows[static_cast<std::size_t>(r)].pos, heads);
  }

  /// Attention of the rows' local heads over this device's slots; with sp > 1 the partial
  /// softmax statistics are exchanged over sp and combined (see the header comment).
  void attention(Device& dev, DeviceState& s, std::int64_t layer, std::int64_t n) {
    const std::int64_t sp = s.sp;
    const std::int64_t SW = D_ + 2;  // one (m, l, o[D]) record
    const Cache& cache = *s.cache;
    // s.runs (prefill runs) attend on the GEMM as in the Decoder, s.single rows row by row; with
    // sp > 1 both write partial softmax statistics for the combine below.
    const detail::AttentionOut out = sp == 1 ? detail::AttentionOut{s.ctx.data(), nh_ * D_, D_}
                                             : detail::AttentionOut{s.stats.data(), nh_ * SW, SW, true};
    const auto view_of = [&](const Row& row, std::int64_t g) { return cache.view(layer, row.b - s.b0, g); };
    detail::attend_runs_gemm(s.rows, s.runs, nh_, nkv_, D_, window_, s.slots(), s.q.data(), out, view_of);
    detail::attend_rows(s.rows, s.single, nh_, nkv_, D_, window_, s.slots(), s.q.data(), out, s.scores.data(),
                        cache.shape().max_length, s.attn_block, view_of);
    if (sp == 1) return;
    const std::size_t rec = static_cast<std::size_t>(n * nh_ * SW);
    all_gather(dev, std::span<const float>(s.stats.data(), rec), std::span<float>(s.gathered.data(), rec * sp), "sp");
    // Every sp rank combines the same records in rank order: identical contexts on each.
    exec::parallel_for(0, n * nh_, 16, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t t = lo; t < hi; ++t) {
        float M = -std::numeric_limits<float>::infinity();
        for (std::int64_t k = 0; k < sp; ++k) M = std::max(M, s.gathered[k * rec + t * SW]);
        float* out = s.ctx.data() + t * D_;  // t = r * nh + h, ctx row-major [n, nh, D]
        std::fill(out, out + D_, 0.0f);
        float lsum = 0.0f;
        for (std::int64_t k = 0; k < sp; ++k) {
          const float* st = s.gathered.data() + k * rec + t * SW;
          if (st[1] == 0.0f) continue;  // no slot of this rank in range
          const float f = std::exp(st[0] - M);
          lsum += f * st[1];
          for (std::int64_t i = 0; i < D_; ++i) out[i] = std::fma(f, st[2 + i], out[i]);
        }
        const float inv = 1.0f / lsum;
        for (std::int64_t i = 0; i < D_; ++i) out[i] *= inv;
      }
    });
  }

  DefaultMesh mesh_;
  models::LlamaConfig cfg_, local_cfg_;
  std::int64_t B_ = 0, P_ = 0, H_ = 0, V_ = 0, D_ = 0, nh_ = 0, nkv_ = 0, I_ = 0, window_ = 0;
  RopeTable rope_;
  std::vector<float> last_out_;
  std::vector<std::int64_t> len_, need_;
  std::vector<Row> rows_;
  std::vector<std::unique_ptr<DeviceState>> dev_;
};

}  // namespace edl::generate
