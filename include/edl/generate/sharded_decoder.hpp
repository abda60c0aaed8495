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
//  - dp, fsdp and ep split the batch: the sequences are cut into dp * fsdp * ep contiguous ranges (an
//    uneven cut is allowed; a group with no sequence idles). fsdp does not shard weights here:
//    the parameters are gathered once, when the decoder is built, because every decode step
//    needs every weight and re-gathering them per token would move the whole model per token.
//  - tp splits attention heads (q heads and kv heads: kv heads must be divisible by tp) and the
//    MLP's intermediate size, as ShardedLlama does: q/k/v/gate/up column-parallel, o_proj and
//    down_proj row-parallel followed by a psum over tp (a row-parallel bias is added by tp rank
//    0 only). Each device's cache holds only its kv heads. A mixture-of-experts layer keeps its
//    router whole and splits every expert's width (and a shared expert's) the same way; the
//    block's output is psummed over tp once. ep, like fsdp, splits the sequences here: every
//    device holds whole experts (decode reads only the chosen ones).
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
// Each device runs generate::CachedForward, the one-device Decoder's forward, on its shard
// with the collectives above (MeshCollectives).
// Errors before any work: kv heads (or heads, intermediate size) not divisible by tp, token ids
// outside the vocabulary, a mask that is not left padding, more tokens than max_length.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>

#include <edl/core/error.hpp>
#include <edl/generate/cached_forward.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/rope_table.hpp>
#include <edl/mesh/collectives.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>

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
  models::LlamaConfig l = models::tp_local_config(c, tp);
  if (c.is_moe() && tp > 1) {  // every expert (and a shared expert) splits its width over tp, like the MLP
    EDL_CHECK(c.expert_intermediate_size() % tp == 0, errc::not_divisible, w, "the experts' intermediate size ",
              c.expert_intermediate_size(), " is not divisible by tp = ", tp);
    EDL_CHECK(c.shared_expert_size() % tp == 0, errc::not_divisible, w, "shared_expert_intermediate_size = ",
              c.shared_expert_size(), " is not divisible by tp = ", tp);
    l.moe_intermediate_size = c.moe_intermediate_size / tp;
    l.shared_expert_intermediate_size = c.shared_expert_intermediate_size / tp;
  }
  return l;
}

template <class Pol = DefaultPolicy, KVCache Cache = StandardKVCache>
class ShardedDecoder {
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using T = typename Pol::param_t;
  /// Builds one device's cache of the given (local) shape; empty: Cache(shape).
  using CacheFactory = std::function<std::unique_ptr<Cache>(const KVCacheShape&)>;

  /// Shards a one-device model: each device takes its tp block of every parameter.
  /// keep_together n: sequences [k n, (k + 1) n) stay on one group of devices (beam search's
  /// beams of a prompt, so that reorder() moves nothing across devices); n divides batch.
  ShardedDecoder(const Model& model, DefaultMesh mesh, std::int64_t batch, std::int64_t max_length,
                 CacheFactory make_cache = {}, std::int64_t keep_together = 1)
      : mesh_(std::move(mesh)), cfg_(model.config()) {
    init(batch, max_length, keep_together);
    std::map<std::string, std::pair<const T*, std::vector<std::size_t>>> src;
    auto& m = const_cast<Model&>(model);  // visit_params is non-const; only read here
    m.visit_params("", [&](std::string_view path, auto& p) {
      src.emplace(std::string(path),
                  std::make_pair(static_cast<const T*>(p.value.data()),
                                 std::vector<std::size_t>(p.value.shape().begin(), p.value.shape().end())));
    });
    std::map<std::string, const quant::Matrix*> quantized;
    m.visit_linears("", [&](const std::string& path, auto& lin) {
      EDL_CHECK(!lin.lora, errc::unsupported, path,
                "has a LoRA adapter: merge it first (lora::merge_lora, edl --merge-adapter) to decode on a mesh");
      if (lin.is_quantized()) quantized.emplace(path + ".weight", &lin.qweight);
    });
    build(src, std::move(make_cache), quantized);
  }

  /// From a ShardedLlama: its parameters are gathered once (fsdp / dp / sp blocks included,
  /// across processes under MPI), then each device keeps its tp block.
  ShardedDecoder(const models::ShardedLlama<Pol>& sm, std::int64_t batch, std::int64_t max_length,
                 CacheFactory make_cache = {}, std::int64_t keep_together = 1)
      : mesh_(sm.mesh()), cfg_(sm.config()) {
    EDL_CHECK(!sm.has_adapters(), errc::unsupported, "ShardedDecoder",
              "the sharded model has LoRA adapters: gather and merge them first (gather_model, lora::merge_lora) "
              "to decode on a mesh");
    init(batch, max_length, keep_together);
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
  /// The dp x fsdp x ep groups the sequences are cut over (the devices of one group hold the
  /// same sequences), and the group holding sequence b. The cut is in units of keep_together
  /// sequences (U = batch / keep_together of them): unit u = b / keep_together lies in group g
  /// when u is in [g U / G, (g + 1) U / G).
  std::int64_t sequence_groups() const noexcept {
    return mesh_.axis_size("dp") * mesh_.axis_size("fsdp") * mesh_.axis_size("ep");
  }
  std::int64_t sequence_group(std::int64_t b) const noexcept {
    std::int64_t g = 0;  // a group left empty by an uneven cut is stepped over
    while (first_sequence(g + 1) <= b) ++g;
    return g;
  }
  /// The first sequence of group g (g = sequence_groups(): the batch's end); group g holds
  /// [first_sequence(g), first_sequence(g + 1)).
  std::int64_t first_sequence(std::int64_t g) const noexcept { return g * (B_ / unit_) / sequence_groups() * unit_; }
  /// Sequence b becomes a copy of sequence src[b] on every device holding it (beam search's
  /// reorder of the beams). src[b] must lie in b's unit of keep_together sequences, so each
  /// group's devices reorder their own caches and nothing crosses devices or processes.
  void reorder(const std::int64_t* src) {
    const char* w = "generate.ShardedDecoder.reorder";
    std::vector<std::int64_t> len(len_.size());
    for (std::int64_t b = 0; b < B_; ++b) {
      detail::check_seq(src[b], B_, w);
      EDL_CHECK(src[b] / unit_ == b / unit_, errc::invalid_argument, w, "sequence ", b, " would copy sequence ", src[b],
                ", outside its unit of ", unit_, " sequences kept together on one group of devices");
      len[static_cast<std::size_t>(b)] = len_[static_cast<std::size_t>(src[b])];
    }
    std::vector<std::int64_t> local;
    for (auto& s : dev_) {
      if (!s || s->nb == 0) continue;
      local.resize(static_cast<std::size_t>(s->nb));
      for (std::int64_t i = 0; i < s->nb; ++i) local[static_cast<std::size_t>(i)] = src[s->b0 + i] - s->b0;
      s->cache->reorder(local.data());
    }
    len_.swap(len);
  }
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
  /// Forgets sequence b: its devices' cache slots are reset (a paged cache returns its pages).
  void reset(std::int64_t b) {
    detail::check_seq(b, B_, "generate.ShardedDecoder.reset");
    len_[static_cast<std::size_t>(b)] = 0;
    for (auto& s : dev_)
      if (s && b >= s->b0 && b < s->b0 + s->nb) s->cache->reset(b - s->b0);
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
      if (s) t += s->forward->scratch_bytes();
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
  /// logits_all [batch * seq, vocab] (optional; padding rows 0), embeds [batch * seq, hidden]
  /// (optional: inputs_embeds in place of the ids' embeddings; every process passes them).
  void prefill(const std::int64_t* ids, std::int64_t seq, const std::int64_t* mask, float* logits_last,
               float* logits_all = nullptr, const float* embeds = nullptr) {
    detail::prompt_rows(ids, B_, seq, mask, [&](std::int64_t b) { return len_[static_cast<std::size_t>(b)]; }, rows_,
                        "generate.ShardedDecoder.prefill", embeds, H_);
    run(logits_last, logits_all, logits_all ? seq : 0);
  }

  /// As Decoder::decode: one token per (active) sequence; logits [batch, vocab].
  void decode(const std::int64_t* ids, float* logits, const std::uint8_t* active = nullptr) {
    detail::decode_rows(ids, B_, active, [&](std::int64_t b) { return len_[static_cast<std::size_t>(b)]; }, rows_);
    run(logits, nullptr, 0);
  }

 private:
  // What one device holds: its tp-local model, its cache (its sequences, kv heads, positions)
  // and the forward over them.
  struct DeviceState {
    std::unique_ptr<Model> model;
    std::unique_ptr<Cache> cache;
    std::unique_ptr<CachedForward<Pol, Cache>> forward;
    std::int64_t tp = 1, tp_rank = 0;
    std::int64_t b0 = 0, nb = 0;  // its sequences
  };

  // The collectives of a device's forward: a psum over tp after the row-parallel products, an
  // all_gather over sp of attention's partial records.
  struct MeshCollectives {
    static constexpr bool one_device = false;
    Device& dev;
    bool tp;
    void psum_tp(std::span<float> x) {
      if (tp) psum(dev, x, "tp");
    }
    void all_gather_sp(std::span<const float> in, std::span<float> out) { all_gather(dev, in, out, "sp"); }
  };

  void init(std::int64_t batch, std::int64_t max_length, std::int64_t keep_together) {
    const char* w = "generate.ShardedDecoder";
    cfg_.validate();
    EDL_CHECK(batch > 0 && max_length > 0, errc::invalid_argument, w, "batch and max_length must be positive, found ",
              batch, " and ", max_length);
    EDL_CHECK(keep_together > 0 && batch % keep_together == 0, errc::invalid_argument, w, "keep_together = ",
              keep_together, " must be positive and divide the batch (", batch, ")");
    unit_ = keep_together;
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
    rope_ = std::make_unique<RopeTable>(cfg_, P_);
  }

  static bool row_parallel(const std::string& name) {  // an expert's w2 is Mixtral's down_proj
    return name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") || name.ends_with(".w2.weight");
  }
  static bool row_bias(const std::string& name) {
    return name.ends_with("o_proj.bias") || name.ends_with("down_proj.bias");
  }

  /// Builds every local device's model (its tp block of each parameter) and cache.
  /// `quantized`: the model's quantized weights by name; each device takes its tp block of
  /// whole blocks (rows of a column-parallel weight, block columns of a row-parallel one).
  void build(const std::map<std::string, std::pair<const T*, std::vector<std::size_t>>>& src, CacheFactory make,
             const std::map<std::string, const quant::Matrix*>& quantized = {}) {
    const char* w = "generate.ShardedDecoder";
    if (!make) {
      if constexpr (std::is_constructible_v<Cache, const KVCacheShape&>)
        make = [](const KVCacheShape& s) { return std::make_unique<Cache>(s); };
      else
        ::edl::detail::raise(errc::invalid_argument, w, "this cache kind needs a CacheFactory (its options)");
    }
    // dp, fsdp and ep split the batch (a dense model has no experts to place on ep).
    const std::int64_t sp = mesh_.axis_size("sp");
    dev_.resize(static_cast<std::size_t>(mesh_.size()));
    // Validate the parameter list on the host, before any device work.
    for (const auto& [name, shape] : local_cfg_.parameter_shapes()) {
      if (name == "lm_head.weight" && cfg_.tie_word_embeddings) continue;
      if (quantized.count(name)) continue;
      EDL_CHECK(src.count(name) > 0, errc::invalid_argument, w, "the model has no parameter \"", name, "\"");
    }
    std::mutex mu;
    mesh_.run([&](Device& dev) {
      auto s = std::make_unique<DeviceState>();
      s->tp = dev.axis_size("tp");
      s->tp_rank = dev.axis_index("tp");
      DeviceShard shard;
      shard.sp = dev.axis_size("sp");
      shard.sp_rank = dev.axis_index("sp");
      const std::int64_t g =
          (dev.axis_index("dp") * dev.axis_size("fsdp") + dev.axis_index("fsdp")) * dev.axis_size("ep") + dev.axis_index("ep");
      shard.b0 = first_sequence(g);
      shard.nb = first_sequence(g + 1) - shard.b0;
      s->b0 = shard.b0;
      s->nb = shard.nb;
      const std::int64_t gs = s->tp * shard.sp, k = s->tp_rank * shard.sp + shard.sp_rank;
      // A quantized lm_head in row groups is cut between groups (each logit is its own dot,
      // so the cut moves no result).
      const auto it_head = quantized.find("lm_head.weight");
      const std::int64_t align =
          it_head != quantized.end() && quant::in_row_groups(it_head->second->format()) ? quant::kGroupRows : 1;
      const auto edge = [&](std::int64_t j) { return j == gs ? V_ : j * V_ / gs / align * align; };
      shard.c0 = edge(k);
      shard.c1 = edge(k + 1);
      s->model = std::make_unique<Model>(local_cfg_);
      s->model->visit_linears("", [&](const std::string& path, auto& lin) {  // before visit_params, which then skips them
        const std::string name = path + ".weight";
        const auto it = quantized.find(name);
        if (it == quantized.end()) return;
        const quant::Matrix& q = *it->second;
        const std::int64_t n = lin.out_features(), k = lin.in_features(), r = s->tp_rank;
        if (n == q.rows() && k == q.cols()) lin.set_quantized(q, name);  // replicated (lm_head)
        else if (row_parallel(name)) lin.set_quantized(q.slice_cols(r * k, (r + 1) * k, name), name);
        else lin.set_quantized(q.slice_rows(r * n, (r + 1) * n), name);
      });
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
      const KVCacheShape cs{cfg_.num_hidden_layers, std::max<std::int64_t>(1, shard.nb), (P_ + sp - 1) / sp, nkv_, D_};
      s->cache = make(cs);
      s->forward = std::make_unique<CachedForward<Pol, Cache>>(*s->model, *s->cache, *rope_, shard, V_);
      std::lock_guard<std::mutex> lock(mu);
      dev_[static_cast<std::size_t>(dev.id())] = std::move(s);
    });
  }

  void run(float* logits_last, float* logits_all, std::int64_t seq) {
    const char* w = "generate.ShardedDecoder";
    // Validate everything on the host before any device work.
    detail::check_rows(rows_, B_, V_, need_, w);
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
    MeshCollectives coll{dev, s.tp > 1};
    s.forward->run(rows_, need_, coll, last_out, all_out);
  }

  DefaultMesh mesh_;
  models::LlamaConfig cfg_, local_cfg_;
  std::int64_t unit_ = 1;  // keep_together: sequences cut over the groups in units of this many
  std::int64_t B_ = 0, P_ = 0, H_ = 0, V_ = 0, D_ = 0, nh_ = 0, nkv_ = 0, I_ = 0, window_ = 0;
  std::unique_ptr<RopeTable> rope_;  // shared by the devices' forwards
  std::vector<float> last_out_;
  std::vector<std::int64_t> len_, need_;
  std::vector<CachedRow> rows_;
  std::vector<std::unique_ptr<DeviceState>> dev_;
};

}  // namespace edl::generate
