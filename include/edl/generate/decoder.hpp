// edl/generate/decoder.hpp
// Incremental forward of a models::LlamaForCausalLM over a KV cache (docs/generation.md).
//
//   generate::StandardKVCache cache({L, batch, max_len, kv_heads, head_dim});   // or kv_cache_shape(cfg, ...)
//   generate::Decoder dec(model, cache);
//   dec.prefill(ids, seq, mask, logits);          // ids [batch, seq], mask: left padding (or null)
//   dec.decode(next_ids, logits);                 // one token per sequence: logits [batch, vocab]
//
// Compute is f32 whatever the parameter dtype (bf16 weights are widened as they are read).
// Per layer, for the rows (tokens) of a call:
//   n1 = rms_norm(x); q, k, v = n1 W^T (+ b); q, k per head rms_norm-ed (Qwen3's q_norm,
//   k_norm); rope(q, k) at each token's position;
//   k, v -> cache slot = position; ctx = softmax(q k^T / sqrt(D)) v over the sequence's slots
//   0 .. position (causal within a chunk, GQA: query head h reads kv head h / (nh / nkv),
//   sliding window if configured); x += ctx Wo^T (+ b); x += down(silu(gate n2) * up n2).
// Then the final norm and lm_head on the last token of each sequence (or every token).
//
// Left padding: a row b of `mask` must be 0...0 1...1; padding tokens are skipped (never
// computed, never cached), so a padded prompt gives the logits of the same prompt alone.
// The forward itself is generate::CachedForward (cached_forward.hpp), shared with the mesh
// decoder and the serving engine. decode() allocates nothing once the first call sized the
// scratch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/phased_region.hpp>
#include <edl/generate/cached_forward.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/rope_table.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>

namespace edl::generate {

/// The cache shape a model needs for `batch` sequences of up to `max_length` tokens.
inline KVCacheShape kv_cache_shape(const models::LlamaConfig& c, std::int64_t batch, std::int64_t max_length) {
  return {c.num_hidden_layers, batch, max_length, c.num_key_value_heads, c.head_size()};
}

template <class Pol, KVCache Cache>
class Decoder {
  static_assert(std::is_same_v<typename Pol::compute_t, float>,
                "edl::generate: decoding runs with f32 activations; a model trained with a bf16 or f16 compute "
                "dtype (Policy<Param, Compute>) decodes as models::to_dtype<Policy<Param>>(model), the same weights");
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using T = typename Pol::param_t;

  Decoder(const Model& m, Cache& cache)
      : m_(m),
        cache_(cache),
        rope_(std::make_unique<RopeTable>(m.config(), cache.shape().max_length)),
        fw_(m, cache, *rope_, DeviceShard{0, cache.shape().batch, 1, 0, 0, m.config().vocab_size}, m.config().vocab_size) {
    const char* w = "generate.Decoder";
    const models::LlamaConfig& c = m.config();
    const KVCacheShape& s = cache.shape();
    EDL_CHECK(s.num_layers == c.num_hidden_layers && s.kv_heads == c.num_key_value_heads && s.head_dim == c.head_size(),
              errc::shape_mismatch, w, "cache shape (layers ", s.num_layers, ", kv_heads ", s.kv_heads, ", head_dim ",
              s.head_dim, ") does not match the model (", c.num_hidden_layers, ", ", c.num_key_value_heads, ", ",
              c.head_size(), ")");
    EDL_CHECK(static_cast<std::int64_t>(m.model.layers.size()) == c.num_hidden_layers, errc::shape_mismatch, w,
              "model has ", m.model.layers.size(), " layers, config says ", c.num_hidden_layers);
  }

  const Cache& cache() const noexcept { return cache_; }
  Cache& cache() noexcept { return cache_; }
  std::int64_t batch() const noexcept { return cache_.shape().batch; }

  /// Prefills a chunk: ids [batch, seq] (mask [batch, seq] of 0/1, left padding, or null).
  /// Tokens are appended after what each sequence already holds (chunked prefill).
  /// logits_last [batch, vocab]: the logits of each sequence's last real token of the chunk
  /// (rows of sequences with no token in the chunk are left as they are; may be null);
  /// logits_all [batch * seq, vocab] (optional): every token, padding rows set to 0.
  /// embeds [batch * seq, hidden] (optional, HF's inputs_embeds): the tokens' vectors in place
  /// of the ids' embeddings (in the embedding table's space; the embed scale still applies);
  /// ids may then be null.
  void prefill(const std::int64_t* ids, std::int64_t seq, const std::int64_t* mask, float* logits_last,
               float* logits_all = nullptr, const float* embeds = nullptr) {
    detail::prompt_rows(ids, batch(), seq, mask, [&](std::int64_t b) { return cache_.length(b); }, rows_,
                        "generate.Decoder.prefill", embeds, m_.config().hidden_size);
    run(logits_last, logits_all, logits_all ? seq : 0);
  }

  /// One token per sequence: ids [batch]; logits [batch, vocab]. active [batch] (optional):
  /// sequences with active[b] == 0 are skipped (no token appended, logits row untouched).
  void decode(const std::int64_t* ids, float* logits, const std::uint8_t* active = nullptr) {
    detail::decode_rows(ids, batch(), active, [&](std::int64_t b) { return cache_.length(b); }, rows_);
    run(logits, nullptr, 0);
  }

  /// Sequence b becomes a copy of sequence src[b] (beam search's reorder of the beams).
  void reorder(const std::int64_t* src) { cache_.reorder(src); }

  /// Where one-row decode steps (one sequence, no logits of every position) spend their time,
  /// per step and per team thread, in seconds: the products and attention of all layers by
  /// kind, the lm_head, and the barrier waits of all phases.
  struct PhaseSeconds {
    double qkv = 0, attention = 0, o_proj = 0, gate_up = 0, down = 0, lm_head = 0, barrier_wait = 0;
    std::int64_t steps = 0;  // the one-row steps timed
  };

  /// Times the one-row steps that follow (true) or stops timing them (false); the times add up
  /// until reset_phase_times(). Off by default: on, a phase costs three clock reads per thread.
  void time_phases(bool on) { fw_.time_phases(on ? phase_times_.get() : nullptr); }
  void reset_phase_times() { phase_times_->clear(); }

  /// The timed steps' phase times, each a mean per step and per thread.
  PhaseSeconds phase_seconds() const {
    constexpr std::size_t kPerLayer = CachedForward<Pol, Cache>::kPhasesPerLayer;
    PhaseSeconds r;
    const exec::PhaseTimes& t = *phase_times_;
    r.steps = t.runs;
    if (t.thread_runs == 0) return r;
    const std::size_t layers = m_.model.layers.size();
    double* kind[kPerLayer] = {&r.qkv, &r.attention, &r.o_proj, &r.gate_up, &r.down};
    for (std::size_t p = 0; p < t.work.size(); ++p) {
      *(p < kPerLayer * layers ? kind[p % kPerLayer] : &r.lm_head) += t.work[p];
      r.barrier_wait += t.wait[p];
    }
    const double n = static_cast<double>(t.thread_runs);
    for (double* v : {&r.qkv, &r.attention, &r.o_proj, &r.gate_up, &r.down, &r.lm_head, &r.barrier_wait}) *v /= n;
    return r;
  }

  /// Largest scratch (bytes) the decoder holds.
  std::int64_t scratch_bytes() const noexcept { return fw_.scratch_bytes(); }

 private:
  void run(float* logits_last, float* logits_all, std::int64_t seq) {
    const std::int64_t B = batch(), V = m_.config().vocab_size;
    detail::check_rows(rows_, B, V, need_, "generate.Decoder");  // before touching the cache
    if (logits_all) std::fill(logits_all, logits_all + B * seq * V, 0.0f);
    NoCollectives one_device;
    fw_.run(rows_, need_, one_device, logits_last, logits_all);
  }

  const Model& m_;
  Cache& cache_;
  std::unique_ptr<RopeTable> rope_;  // on the heap: fw_ points at it and a Decoder stays movable
  CachedForward<Pol, Cache> fw_;
  std::unique_ptr<exec::PhaseTimes> phase_times_ = std::make_unique<exec::PhaseTimes>();
  std::vector<CachedRow> rows_;
  std::vector<std::int64_t> need_;
};

}  // namespace edl::generate
