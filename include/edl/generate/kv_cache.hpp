// edl/generate/kv_cache.hpp
// Key/value caches for incremental decoding (docs/generation.md).
//
//   StandardKVCache  per layer [batch, kv_heads, max_length, head_dim] f32.
//   Int8KVCache      same layout, int8 values with one f32 absmax scale per (token, kv head);
//                    dequantized on read (q.k = scale * sum q_i k8_i).
//   PagedKVCache     a pool of pages of `page_size` tokens (all layers, k and v) sized from a
//                    byte budget x utilization fraction; each sequence owns a page table;
//                    pages are taken on demand and returned by free(b). A page holds
//                    [layer, kv_heads, page_size, head_dim].
//   PagedInt8KVCache the same pages holding Int8KVCache's int8 values, and per page the
//                    scales [layer, kv_heads, page_size].
//
// Head-major. A kv head's slots are contiguous (head_dim elements apart), not a whole token's
// row apart as in EasyDeL's [batch, max_length, kv_heads, head_dim]: decode attention reads one
// head's keys and values from first slot to last, and a contiguous read runs near the memory's
// bandwidth where a strided one runs at about half of it. The cost is in store(): a token's
// row is written as kv_heads pieces.
//
// On huge pages. The caches' keys and values are on transparent huge pages where the OS allows
// (edl::assign_on_huge_pages): decode attention reads every head's slots in full each step as
// short streams, which on 4 KiB pages cross a page, and miss the TLB, every 4 KiB.
//
// Slots. Sequence b stores its real tokens at slots 0, 1, ..., length(b) - 1, and slot s holds
// the token at position s (positions start at 0 at the first real token; left padding of a
// batched prompt is never stored, so a padded prompt's cache equals the prompt's alone).
//
// Every cache satisfies the KVCache concept, on which the decoder is templated:
//   reserve(b, n)                  make room for n tokens (throws edl::Error when it cannot)
//   store(layer, b, slot, k, v)    k, v: [kv_heads * head_dim] f32 rows (after rope for k)
//   set_length(b, n), length(b)    tokens of sequence b in the cache
//   view(layer, b, g)              a HeadView of kv head g: k_row(slot), v_row(slot) point at the
//                                  slot's head_dim elements (f32 or int8), k_scale(slot),
//                                  v_scale(slot) multiply them (kernels::detail::slot_scores and
//                                  kernels::detail::weighted_values read them for decode attention);
//                                  read(slot, k, v): the slot's key and value as f32
//                                  (dequantized), for prefill's GEMM
//   reorder(src)                   sequence b becomes a copy of sequence src[b] (beam search)
//   reset(b)                       forget sequence b (length 0; pages returned)
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/error.hpp>

namespace edl::generate {

/// Shape of a cache: what the model needs.
struct KVCacheShape {
  std::int64_t num_layers = 0;
  std::int64_t batch = 1;
  std::int64_t max_length = 0;  // tokens per sequence (positions 0 .. max_length - 1)
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;

  void validate(const char* where) const {
    EDL_CHECK(num_layers > 0 && batch > 0 && max_length > 0 && kv_heads > 0 && head_dim > 0, errc::invalid_argument,
              where, "num_layers, batch, max_length, kv_heads and head_dim must be positive, found ", num_layers, ", ",
              batch, ", ", max_length, ", ", kv_heads, ", ", head_dim);
  }
  std::int64_t row() const noexcept { return kv_heads * head_dim; }
};

namespace detail {

/// Per-row absmax int8 quantization: x ~= scale * q, q in [-127, 127].
inline float quantize_row(const float* x, std::int8_t* q, std::int64_t n) noexcept {
  float amax = 0.f;
  for (std::int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.f ? amax / 127.0f : 1.0f;
  const float inv = 1.0f / scale;
  for (std::int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] * inv);
    q[i] = static_cast<std::int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  return scale;
}

inline void check_seq(std::int64_t b, std::int64_t batch, const char* where) {
  EDL_CHECK(b >= 0 && b < batch, errc::invalid_argument, where, "sequence index ", b, " outside [0, ", batch, ")");
}

}  // namespace detail

/// What the decoder needs from a cache.
template <class C>
concept KVCache = requires(C& c, const C& cc, std::int64_t i, const float* row, float* acc, const std::int64_t* src) {
  { cc.shape() } -> std::convertible_to<KVCacheShape>;
  { cc.length(i) } -> std::convertible_to<std::int64_t>;
  c.reserve(i, i);
  c.set_length(i, i);
  c.store(i, i, i, row, row);
  cc.view(i, i, i).k_row(i);
  cc.view(i, i, i).v_row(i);
  { cc.view(i, i, i).k_scale(i) } -> std::convertible_to<float>;
  { cc.view(i, i, i).v_scale(i) } -> std::convertible_to<float>;
  { cc.view(i, i, i).D } -> std::convertible_to<std::int64_t>;
  cc.view(i, i, i).read(i, acc, acc);
  c.reorder(src);
  c.reset(i);
  { cc.bytes() } -> std::convertible_to<std::int64_t>;
};

// ================================================================================ standard

class StandardKVCache {
 public:
  StandardKVCache() = default;
  explicit StandardKVCache(const KVCacheShape& s) : s_(s) {
    s_.validate("generate.StandardKVCache");
    const std::size_t n = static_cast<std::size_t>(s.num_layers * s.batch * s.max_length * s.row());
    assign_on_huge_pages(k_, n, 0.0f);
    assign_on_huge_pages(v_, n, 0.0f);
    len_.assign(static_cast<std::size_t>(s.batch), 0);
  }

  struct HeadView {
    const float* k;
    const float* v;
    std::int64_t stride, D;
    const float* k_row(std::int64_t slot) const noexcept { return k + slot * stride; }
    const float* v_row(std::int64_t slot) const noexcept { return v + slot * stride; }
    static constexpr float k_scale(std::int64_t) noexcept { return 1.0f; }
    static constexpr float v_scale(std::int64_t) noexcept { return 1.0f; }
    void read(std::int64_t slot, float* ko, float* vo) const noexcept {
      std::memcpy(ko, k + slot * stride, static_cast<std::size_t>(D) * sizeof(float));
      std::memcpy(vo, v + slot * stride, static_cast<std::size_t>(D) * sizeof(float));
    }
  };

  const KVCacheShape& shape() const noexcept { return s_; }
  std::int64_t length(std::int64_t b) const { return len_[static_cast<std::size_t>(b)]; }
  void reserve(std::int64_t b, std::int64_t n) {
    detail::check_seq(b, s_.batch, "generate.StandardKVCache");
    EDL_CHECK(n <= s_.max_length, errc::invalid_argument, "generate.StandardKVCache",
              "sequence ", b, " needs ", n, " tokens, more than max_length = ", s_.max_length);
  }
  void set_length(std::int64_t b, std::int64_t n) { len_[static_cast<std::size_t>(b)] = n; }
  void store(std::int64_t layer, std::int64_t b, std::int64_t slot, const float* k, const float* v) {
    const std::size_t D = static_cast<std::size_t>(s_.head_dim);
    for (std::int64_t g = 0; g < s_.kv_heads; ++g) {
      const std::size_t o = offset(layer, b, g, slot);
      std::memcpy(k_.data() + o, k + g * s_.head_dim, D * sizeof(float));
      std::memcpy(v_.data() + o, v + g * s_.head_dim, D * sizeof(float));
    }
  }
  HeadView view(std::int64_t layer, std::int64_t b, std::int64_t g) const noexcept {
    const std::size_t o = offset(layer, b, g, 0);
    return {k_.data() + o, v_.data() + o, s_.head_dim, s_.head_dim};
  }
  void reorder(const std::int64_t* src) {
    for (std::int64_t b = 0; b < s_.batch; ++b) detail::check_seq(src[b], s_.batch, "generate.StandardKVCache.reorder");
    std::vector<float> tk, tv;
    const std::vector<std::int64_t> old_len = len_;
    for (std::int64_t l = 0; l < s_.num_layers; ++l) {
      const auto first = static_cast<std::ptrdiff_t>(offset(l, 0, 0, 0));
      tk.assign(k_.begin() + first, k_.begin() + first + static_cast<std::ptrdiff_t>(per_layer()));
      tv.assign(v_.begin() + first, v_.begin() + first + static_cast<std::ptrdiff_t>(per_layer()));
      for (std::int64_t b = 0; b < s_.batch; ++b) {
        const std::int64_t from = src[b];
        if (from == b) continue;
        const std::size_t n = static_cast<std::size_t>(old_len[static_cast<std::size_t>(from)] * s_.head_dim);
        for (std::int64_t g = 0; g < s_.kv_heads; ++g) {
          const std::size_t so = offset(l, from, g, 0) - static_cast<std::size_t>(first);
          std::memcpy(k_.data() + offset(l, b, g, 0), tk.data() + so, n * sizeof(float));
          std::memcpy(v_.data() + offset(l, b, g, 0), tv.data() + so, n * sizeof(float));
        }
      }
    }
    for (std::int64_t b = 0; b < s_.batch; ++b) len_[static_cast<std::size_t>(b)] = old_len[static_cast<std::size_t>(src[b])];
  }
  void reset(std::int64_t b) { len_[static_cast<std::size_t>(b)] = 0; }
  std::int64_t bytes() const noexcept { return static_cast<std::int64_t>((k_.size() + v_.size()) * sizeof(float)); }

 private:
  std::size_t per_layer() const noexcept { return static_cast<std::size_t>(s_.batch * s_.max_length * s_.row()); }
  std::size_t offset(std::int64_t layer, std::int64_t b, std::int64_t g, std::int64_t slot) const noexcept {
    return static_cast<std::size_t>((((layer * s_.batch + b) * s_.kv_heads + g) * s_.max_length + slot) * s_.head_dim);
  }
  KVCacheShape s_;
  huge_page_vector<float> k_, v_;  // on huge pages (assign_on_huge_pages), rows on cache lines
  std::vector<std::int64_t> len_;
};

// ================================================================================ int8

/// int8 values, one f32 scale (absmax / 127) per (layer, sequence, token, kv head). The
/// reconstruction error of an element is at most scale / 2 = absmax / 254 (0.4% of the row's
/// largest magnitude); on the tiny test model the logits move by about 1e-3 (docs/generation.md).
class Int8KVCache {
 public:
  Int8KVCache() = default;
  explicit Int8KVCache(const KVCacheShape& s) : s_(s) {
    s_.validate("generate.Int8KVCache");
    const std::size_t n = static_cast<std::size_t>(s.num_layers * s.batch * s.max_length * s.row());
    const std::size_t ns = static_cast<std::size_t>(s.num_layers * s.batch * s.max_length * s.kv_heads);
    assign_on_huge_pages(k_, n, std::int8_t{0});
    assign_on_huge_pages(v_, n, std::int8_t{0});
    ks_.assign(ns, 0.f);
    vs_.assign(ns, 0.f);
    len_.assign(static_cast<std::size_t>(s.batch), 0);
  }

  struct HeadView {
    const std::int8_t* k;
    const std::int8_t* v;
    const float* ks;
    const float* vs;
    std::int64_t stride, sstride, D;
    const std::int8_t* k_row(std::int64_t slot) const noexcept { return k + slot * stride; }
    const std::int8_t* v_row(std::int64_t slot) const noexcept { return v + slot * stride; }
    float k_scale(std::int64_t slot) const noexcept { return ks[slot * sstride]; }
    float v_scale(std::int64_t slot) const noexcept { return vs[slot * sstride]; }
    void read(std::int64_t slot, float* ko, float* vo) const noexcept {
      const float sk = ks[slot * sstride], sv = vs[slot * sstride];
      for (std::int64_t i = 0; i < D; ++i) {
        ko[i] = sk * static_cast<float>(k[slot * stride + i]);
        vo[i] = sv * static_cast<float>(v[slot * stride + i]);
      }
    }
  };

  const KVCacheShape& shape() const noexcept { return s_; }
  std::int64_t length(std::int64_t b) const { return len_[static_cast<std::size_t>(b)]; }
  void reserve(std::int64_t b, std::int64_t n) {
    detail::check_seq(b, s_.batch, "generate.Int8KVCache");
    EDL_CHECK(n <= s_.max_length, errc::invalid_argument, "generate.Int8KVCache", "sequence ", b, " needs ", n,
              " tokens, more than max_length = ", s_.max_length);
  }
  void set_length(std::int64_t b, std::int64_t n) { len_[static_cast<std::size_t>(b)] = n; }
  void store(std::int64_t layer, std::int64_t b, std::int64_t slot, const float* k, const float* v) {
    for (std::int64_t g = 0; g < s_.kv_heads; ++g) {
      const std::size_t so = soffset(layer, b, g, slot), o = so * static_cast<std::size_t>(s_.head_dim);
      ks_[so] = detail::quantize_row(k + g * s_.head_dim, k_.data() + o, s_.head_dim);
      vs_[so] = detail::quantize_row(v + g * s_.head_dim, v_.data() + o, s_.head_dim);
    }
  }
  HeadView view(std::int64_t layer, std::int64_t b, std::int64_t g) const noexcept {
    const std::size_t so = soffset(layer, b, g, 0), o = so * static_cast<std::size_t>(s_.head_dim);
    return {k_.data() + o, v_.data() + o, ks_.data() + so, vs_.data() + so, s_.head_dim, 1, s_.head_dim};
  }
  void reorder(const std::int64_t* src) {
    for (std::int64_t b = 0; b < s_.batch; ++b) detail::check_seq(src[b], s_.batch, "generate.Int8KVCache.reorder");
    const auto tk = k_, tv = v_;
    const std::vector<float> tks = ks_, tvs = vs_;
    const std::vector<std::int64_t> old_len = len_;
    const std::size_t D = static_cast<std::size_t>(s_.head_dim);
    for (std::int64_t l = 0; l < s_.num_layers; ++l)
      for (std::int64_t b = 0; b < s_.batch; ++b) {
        const std::int64_t from = src[b];
        if (from == b) continue;
        const std::size_t n = static_cast<std::size_t>(old_len[static_cast<std::size_t>(from)]);
        for (std::int64_t g = 0; g < s_.kv_heads; ++g) {
          const std::size_t to = soffset(l, b, g, 0), fo = soffset(l, from, g, 0);
          std::memcpy(k_.data() + to * D, tk.data() + fo * D, n * D);
          std::memcpy(v_.data() + to * D, tv.data() + fo * D, n * D);
          std::memcpy(ks_.data() + to, tks.data() + fo, n * sizeof(float));
          std::memcpy(vs_.data() + to, tvs.data() + fo, n * sizeof(float));
        }
      }
    for (std::int64_t b = 0; b < s_.batch; ++b) len_[static_cast<std::size_t>(b)] = old_len[static_cast<std::size_t>(src[b])];
  }
  void reset(std::int64_t b) { len_[static_cast<std::size_t>(b)] = 0; }
  std::int64_t bytes() const noexcept {
    return static_cast<std::int64_t>(k_.size() + v_.size() + (ks_.size() + vs_.size()) * sizeof(float));
  }

 private:
  /// The scale index of (layer, b, g, slot); its values start head_dim times further.
  std::size_t soffset(std::int64_t layer, std::int64_t b, std::int64_t g, std::int64_t slot) const noexcept {
    return static_cast<std::size_t>(((layer * s_.batch + b) * s_.kv_heads + g) * s_.max_length + slot);
  }
  KVCacheShape s_;
  huge_page_vector<std::int8_t> k_, v_;  // on huge pages, as the f32 caches
  std::vector<float> ks_, vs_;
  std::vector<std::int64_t> len_;
};

// ================================================================================ paged

struct PagedKVCacheOptions {
  std::int64_t page_size = 16;           // tokens per page
  std::int64_t budget_bytes = 256 << 20;  // memory the pool may use ...
  double utilization = 0.9;               // ... times this fraction
  std::int64_t max_model_length = 0;      // longest sequence (0: shape.max_length)
};

/// A pool of pages; a page holds page_size tokens of k and v for every layer, as Elem: f32
/// (PagedKVCache), or int8 with one f32 absmax scale per (token, kv head) as Int8KVCache
/// (PagedInt8KVCache: the same values and scales, so the same attention, in about a quarter of
/// the bytes). Pages: floor(budget_bytes * utilization / page_bytes). A sequence takes pages as
/// it grows (reserve) and returns them on reset(b). Running out of pages or exceeding
/// max_model_length throws edl::Error (errc::invalid_argument) naming the sequence and the
/// numbers involved.
template <class Elem>
class BasicPagedKVCache {
  static_assert(std::is_same_v<Elem, float> || std::is_same_v<Elem, std::int8_t>,
                "edl::generate: a paged cache holds f32 or int8 values");
  static constexpr bool kInt8 = std::is_same_v<Elem, std::int8_t>;
  static constexpr const char* kWhere = kInt8 ? "generate.PagedInt8KVCache" : "generate.PagedKVCache";

 public:
  BasicPagedKVCache() = default;
  BasicPagedKVCache(const KVCacheShape& s, const PagedKVCacheOptions& o) : s_(s), o_(o) {
    if (o_.max_model_length <= 0) o_.max_model_length = s.max_length;
    s_.max_length = o_.max_model_length;
    s_.validate(kWhere);
    EDL_CHECK(o.page_size > 0, errc::invalid_argument, kWhere, "page_size must be positive, found ", o.page_size);
    EDL_CHECK(o.utilization > 0 && o.utilization <= 1, errc::invalid_argument, kWhere,
              "utilization must be in (0, 1], found ", o.utilization);
    page_elems_ = s_.num_layers * o.page_size * s_.row();                        // k or v
    page_scales_ = kInt8 ? s_.num_layers * o.page_size * s_.kv_heads : 0;  // k or v
    const double usable = static_cast<double>(o.budget_bytes) * o.utilization;
    num_pages_ = static_cast<std::int64_t>(usable / static_cast<double>(page_bytes()));
    EDL_CHECK(num_pages_ > 0, errc::invalid_argument, kWhere, "a byte budget of ", o.budget_bytes, " x utilization ",
              o.utilization, " holds no page of ", page_bytes(), " bytes");
    assign_on_huge_pages(k_, static_cast<std::size_t>(num_pages_ * page_elems_), Elem{0});
    assign_on_huge_pages(v_, k_.size(), Elem{0});
    ks_.assign(static_cast<std::size_t>(num_pages_ * page_scales_), 0.0f);
    vs_.assign(ks_.size(), 0.0f);
    free_.reserve(static_cast<std::size_t>(num_pages_));
    for (std::int64_t p = num_pages_; p-- > 0;) free_.push_back(static_cast<std::int32_t>(p));
    tables_.assign(static_cast<std::size_t>(s.batch), {});
    len_.assign(static_cast<std::size_t>(s.batch), 0);
  }

  struct HeadView {
    const Elem* k;  // pool base + layer/head offset
    const Elem* v;
    const float* ks;  // int8: the scales' pool base + layer/head offset
    const float* vs;
    const std::int32_t* table;
    std::int64_t page_size, page_elems, page_scales, stride, D;
    const Elem* at(const Elem* base, std::int64_t slot) const noexcept {
      const std::int64_t p = table[slot / page_size];
      return base + p * page_elems + (slot % page_size) * stride;
    }
    float scale_at(const float* base, std::int64_t slot) const noexcept {
      if constexpr (kInt8) return base[table[slot / page_size] * page_scales + slot % page_size];
      else return 1.0f;
    }
    const Elem* k_row(std::int64_t slot) const noexcept { return at(k, slot); }
    const Elem* v_row(std::int64_t slot) const noexcept { return at(v, slot); }
    float k_scale(std::int64_t slot) const noexcept { return scale_at(ks, slot); }
    float v_scale(std::int64_t slot) const noexcept { return scale_at(vs, slot); }
    void read(std::int64_t slot, float* ko, float* vo) const noexcept {
      const Elem* kr = at(k, slot);
      const Elem* vr = at(v, slot);
      if constexpr (kInt8) {
        const float sk = k_scale(slot), sv = v_scale(slot);
        for (std::int64_t i = 0; i < D; ++i) {
          ko[i] = sk * static_cast<float>(kr[i]);
          vo[i] = sv * static_cast<float>(vr[i]);
        }
      } else {
        std::memcpy(ko, kr, static_cast<std::size_t>(D) * sizeof(float));
        std::memcpy(vo, vr, static_cast<std::size_t>(D) * sizeof(float));
      }
    }
  };

  const KVCacheShape& shape() const noexcept { return s_; }
  std::int64_t page_size() const noexcept { return o_.page_size; }
  std::int64_t num_pages() const noexcept { return num_pages_; }
  std::int64_t free_pages() const noexcept { return static_cast<std::int64_t>(free_.size()); }
  /// k and v of one page: values, and for int8 their scales.
  std::int64_t page_bytes() const noexcept {
    return 2 * (page_elems_ * static_cast<std::int64_t>(sizeof(Elem)) + page_scales_ * static_cast<std::int64_t>(sizeof(float)));
  }
  std::int64_t max_model_length() const noexcept { return o_.max_model_length; }
  const std::vector<std::int32_t>& page_table(std::int64_t b) const { return tables_[static_cast<std::size_t>(b)]; }

  std::int64_t length(std::int64_t b) const { return len_[static_cast<std::size_t>(b)]; }
  void reserve(std::int64_t b, std::int64_t n) {
    detail::check_seq(b, s_.batch, kWhere);
    EDL_CHECK(n <= o_.max_model_length, errc::invalid_argument, kWhere, "sequence ", b, " needs ", n,
              " tokens, more than max_model_length = ", o_.max_model_length);
    auto& t = tables_[static_cast<std::size_t>(b)];
    const std::int64_t need = (n + o_.page_size - 1) / o_.page_size;
    const std::int64_t more = need - static_cast<std::int64_t>(t.size());
    EDL_CHECK(more <= static_cast<std::int64_t>(free_.size()), errc::invalid_argument, kWhere, "out of pages: sequence ", b,
              " needs ", more, " more page(s) of ", o_.page_size, " tokens for ", n, " tokens, but only ", free_.size(),
              " of ", num_pages_, " pages are free (pool = budget ", o_.budget_bytes, " bytes x utilization ",
              o_.utilization, ", ", page_bytes(), " bytes per page); raise the budget or shorten the requests");
    while (static_cast<std::int64_t>(t.size()) < need) {
      t.push_back(free_.back());
      free_.pop_back();
    }
  }
  void set_length(std::int64_t b, std::int64_t n) { len_[static_cast<std::size_t>(b)] = n; }
  void store(std::int64_t layer, std::int64_t b, std::int64_t slot, const float* k, const float* v) {
    const auto& t = tables_[static_cast<std::size_t>(b)];
    const std::int64_t p = t[static_cast<std::size_t>(slot / o_.page_size)], in = slot % o_.page_size;
    const std::int64_t D = s_.head_dim;
    for (std::int64_t g = 0; g < s_.kv_heads; ++g) {
      const std::size_t o = static_cast<std::size_t>(p * page_elems_ + head_offset(layer, g) + in * D);
      if constexpr (kInt8) {
        const std::size_t so = static_cast<std::size_t>(p * page_scales_ + scale_offset(layer, g) + in);
        ks_[so] = detail::quantize_row(k + g * D, k_.data() + o, D);
        vs_[so] = detail::quantize_row(v + g * D, v_.data() + o, D);
      } else {
        std::memcpy(k_.data() + o, k + g * D, static_cast<std::size_t>(D) * sizeof(float));
        std::memcpy(v_.data() + o, v + g * D, static_cast<std::size_t>(D) * sizeof(float));
      }
    }
  }
  HeadView view(std::int64_t layer, std::int64_t b, std::int64_t g) const noexcept {
    const std::int64_t off = head_offset(layer, g), soff = kInt8 ? scale_offset(layer, g) : 0;
    return {k_.data() + off,   v_.data() + off,  ks_.data() + soff, vs_.data() + soff,
            tables_[static_cast<std::size_t>(b)].data(), o_.page_size, page_elems_, page_scales_,
            s_.head_dim,       s_.head_dim};
  }
  /// Sequence b becomes a copy of src[b]: pages are copied (no sharing yet).
  void reorder(const std::int64_t* src) {
    const std::int64_t B = s_.batch;
    std::vector<std::int64_t> old_len = len_;
    // Snapshot the source pages' contents first.
    struct Pages {
      std::vector<Elem> k, v;
      std::vector<float> ks, vs;
    };
    std::vector<Pages> copy(static_cast<std::size_t>(B));
    std::vector<bool> needed(static_cast<std::size_t>(B), false);
    for (std::int64_t b = 0; b < B; ++b) {
      detail::check_seq(src[b], B, kWhere);
      if (src[b] != b) needed[static_cast<std::size_t>(src[b])] = true;
    }
    const auto append = [](auto& to, const auto& pool, std::int64_t p, std::int64_t n) {
      to.insert(to.end(), pool.begin() + p * n, pool.begin() + (p + 1) * n);
    };
    for (std::int64_t b = 0; b < B; ++b) {
      if (!needed[static_cast<std::size_t>(b)]) continue;
      Pages& c = copy[static_cast<std::size_t>(b)];
      for (auto p : tables_[static_cast<std::size_t>(b)]) {
        append(c.k, k_, p, page_elems_);
        append(c.v, v_, p, page_elems_);
        append(c.ks, ks_, p, page_scales_);
        append(c.vs, vs_, p, page_scales_);
      }
    }
    const auto put = [](auto& pool, const auto& from, std::int64_t p, std::size_t i, std::int64_t n) {
      std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(i) * n, n, pool.begin() + p * n);
    };
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t from = src[b];
      if (from == b) continue;
      reset(b);
      reserve(b, old_len[static_cast<std::size_t>(from)]);
      const auto& t = tables_[static_cast<std::size_t>(b)];
      const Pages& c = copy[static_cast<std::size_t>(from)];
      for (std::size_t i = 0; i < t.size(); ++i) {
        put(k_, c.k, t[i], i, page_elems_);
        put(v_, c.v, t[i], i, page_elems_);
        put(ks_, c.ks, t[i], i, page_scales_);
        put(vs_, c.vs, t[i], i, page_scales_);
      }
      len_[static_cast<std::size_t>(b)] = old_len[static_cast<std::size_t>(from)];
    }
  }
  /// Returns sequence b's pages to the pool.
  void reset(std::int64_t b) {
    auto& t = tables_[static_cast<std::size_t>(b)];
    for (auto it = t.rbegin(); it != t.rend(); ++it) free_.push_back(*it);
    t.clear();
    len_[static_cast<std::size_t>(b)] = 0;
  }
  void free(std::int64_t b) { reset(b); }
  std::int64_t bytes() const noexcept {
    return static_cast<std::int64_t>((k_.size() + v_.size()) * sizeof(Elem) + (ks_.size() + vs_.size()) * sizeof(float));
  }

 private:
  /// Where (layer, kv head g)'s page_size rows start in a page.
  std::int64_t head_offset(std::int64_t layer, std::int64_t g) const noexcept {
    return (layer * s_.kv_heads + g) * o_.page_size * s_.head_dim;
  }
  /// Where (layer, kv head g)'s page_size scales start in a page's scales (int8).
  std::int64_t scale_offset(std::int64_t layer, std::int64_t g) const noexcept {
    return (layer * s_.kv_heads + g) * o_.page_size;
  }
  KVCacheShape s_;
  PagedKVCacheOptions o_;
  std::int64_t page_elems_ = 0, page_scales_ = 0, num_pages_ = 0;
  huge_page_vector<Elem> k_, v_;  // on huge pages (assign_on_huge_pages), rows on cache lines
  std::vector<float> ks_, vs_;    // int8: a page's scales, [layer, kv_heads, page_size] per page
  std::vector<std::int32_t> free_;
  std::vector<std::vector<std::int32_t>> tables_;
  std::vector<std::int64_t> len_;
};

using PagedKVCache = BasicPagedKVCache<float>;
using PagedInt8KVCache = BasicPagedKVCache<std::int8_t>;

static_assert(KVCache<StandardKVCache>);
static_assert(KVCache<Int8KVCache>);
static_assert(KVCache<PagedKVCache>);
static_assert(KVCache<PagedInt8KVCache>);

}  // namespace edl::generate
