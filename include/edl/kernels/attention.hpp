// edl/kernels/attention.hpp
// Attention kernels over cached keys and values (generation): one query row against one
// kv head's cache rows (decode), and a run of consecutive query rows of one sequence on the
// GEMM (a prefill chunk). Each kernel reads a head through a view with k_row(slot),
// v_row(slot) (D elements: f32, or int8 for the int8 cache) and k_scale(slot), v_scale(slot)
// (1 for f32), and read(slot, k, v) widening both rows to f32 (generate/kv_cache.hpp's views).
// A SlotMap says which positions a device's cache holds (all of them on one device; every
// sp-th on a mesh's sp axis); with partial = true a kernel writes flash-decoding's record
// (max m, sum l of exp(s - m), unnormalised context) for the mesh to combine.
//
// Every result is one fixed-order sum whatever the thread count: the kernels are serial and
// their callers run one (row or run, head) per task.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/detail/simd.hpp>
#include <edl/kernels/activations.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/softmax.hpp>

namespace edl::kernels {

/// Query rows per block of the blocked attention (training, and prefill over a cache): the
/// block's scores [rows, keys] and their gradients stay in L2 (64 x 512 floats = 128 KiB).
inline constexpr std::int64_t kAttentionQueryBlock = 64;

/// First key position a query at position i attends to: 0, or the start of a sliding window
/// of `window` keys (window <= 0: no window).
constexpr std::int64_t window_start(std::int64_t i, std::int64_t window) noexcept {
  return window > 0 ? std::max<std::int64_t>(0, i - window + 1) : 0;
}

namespace detail {


/// The kernels prefetch (into L2) the keys of the next group of slots and the values
/// kValuePrefetchSlots slots ahead: a few percent of decode at long contexts.
inline constexpr std::int64_t kValuePrefetchSlots = 8;

/// Prefetches the cache lines of n elements at p (nothing is read: a prefetch never faults).
template <class E>
inline void prefetch_row(const E* p, std::int64_t n) noexcept {
  const char* c = reinterpret_cast<const char*>(p);
  for (std::int64_t b = 0; b < n * static_cast<std::int64_t>(sizeof(E)); b += 64) __builtin_prefetch(c + b, 0, 2);
}

/// The attention kernels over one head's cache rows. A HeadView gives k_row(slot) and
/// v_row(slot), pointers to the slot's D elements (f32, or int8 for Int8KVCache), and
/// k_scale(slot), v_scale(slot) that multiply them (1 for f32 caches).
///
/// sc[j] = scale * q . k[j0 + j] for j in [0, cnt). Wd slots at a time with Wd accumulators and
/// one transposing haddp: Wd independent FMA chains and one horizontal reduction per Wd slots,
/// where a dot per slot waits on its own chain and its own reduction (decode attention spent
/// most of its time there). Each score's order is fixed: lanes over D, the haddp tree, the tail.
template <class View>
inline void slot_scores(const View& view, const float* q, std::int64_t j0, std::int64_t cnt, float scale,
                        float* sc) noexcept {
  using Row = decltype(view.k_row(0));
  const std::int64_t D = view.D, D0 = D / kLanes * kLanes;
  for (std::int64_t j = 0; j < cnt; j += kLanes) {
    const std::int64_t n = std::min(kLanes, cnt - j);
    Row kr[kLanes];  // lanes past cnt re-read the last slot; their sums are dropped
    for (std::int64_t s = 0; s < kLanes; ++s) kr[s] = view.k_row(j0 + j + std::min(s, n - 1));
    for (std::int64_t s = j + kLanes; s < std::min(cnt, j + 2 * kLanes); ++s)  // the next group's keys
      prefetch_row(view.k_row(j0 + s), D);
    fbatch a[kLanes];
    for (std::int64_t s = 0; s < kLanes; ++s) a[s] = fbatch(0.f);
    for (std::int64_t d = 0; d < D0; d += kLanes) {
      const fbatch qv = fbatch::load_unaligned(q + d);
#pragma GCC unroll 16
      for (std::int64_t s = 0; s < kLanes; ++s) a[s] = detail::fmadd(qv, detail::load(kr[s] + d), a[s]);
    }
    alignas(64) float sm[kLanes];
    detail::haddp(a).store_aligned(sm);
    for (std::int64_t s = 0; s < n; ++s) {
      float v = sm[s];
      for (std::int64_t d = D0; d < D; ++d) v = std::fma(q[d], to_f32(kr[s][d]), v);
      sc[j + s] = scale * view.k_scale(j0 + j + s) * v;
    }
  }
}

/// out[c0, c0 + NB * Wd) = sum over j of w p[j] v_scale v[j0 + j] in those columns, the NB
/// accumulators in registers (an axpy per slot into memory waits on the store of the last).
template <int NB, class View>
inline void weighted_values_cols(const View& view, const float* p, std::int64_t j0, std::int64_t cnt, float w,
                                 std::int64_t c0, float* out) noexcept {
  fbatch acc[NB];
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) acc[b] = fbatch(0.f);
  for (std::int64_t j = 0; j < cnt; ++j) {
    const fbatch pb(p[j] * w * view.v_scale(j0 + j));
    const auto* vr = view.v_row(j0 + j) + c0;
    if (j + kValuePrefetchSlots < cnt) prefetch_row(view.v_row(j0 + j + kValuePrefetchSlots) + c0, NB * kLanes);
#pragma GCC unroll 8
    for (int b = 0; b < NB; ++b) acc[b] = detail::fmadd(pb, detail::load(vr + b * kLanes), acc[b]);
  }
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) acc[b].store_unaligned(out + c0 + b * kLanes);
}

/// out[0, D) = sum over j in [0, cnt) of w p[j] v[j0 + j] (dequantized): the attention's
/// weighted values, overwriting out. Columns go 8 lane batches at a time, then the rest.
/// Each output element is one FMA chain over j in order, as an axpy per slot would give.
template <class View>
inline void weighted_values(const View& view, const float* p, std::int64_t j0, std::int64_t cnt, float w,
                            float* out) noexcept {
  const std::int64_t D = view.D;
  std::int64_t c0 = 0;
  for (; c0 + 8 * kLanes <= D; c0 += 8 * kLanes) weighted_values_cols<8>(view, p, j0, cnt, w, c0, out);
  switch ((D - c0) / kLanes) {
    case 7: weighted_values_cols<7>(view, p, j0, cnt, w, c0, out); break;
    case 6: weighted_values_cols<6>(view, p, j0, cnt, w, c0, out); break;
    case 5: weighted_values_cols<5>(view, p, j0, cnt, w, c0, out); break;
    case 4: weighted_values_cols<4>(view, p, j0, cnt, w, c0, out); break;
    case 3: weighted_values_cols<3>(view, p, j0, cnt, w, c0, out); break;
    case 2: weighted_values_cols<2>(view, p, j0, cnt, w, c0, out); break;
    case 1: weighted_values_cols<1>(view, p, j0, cnt, w, c0, out); break;
    default: break;
  }
  for (c0 += (D - c0) / kLanes * kLanes; c0 < D; ++c0) {
    float a = 0.f;
    for (std::int64_t j = 0; j < cnt; ++j) a = std::fma(p[j] * w * view.v_scale(j0 + j), to_f32(view.v_row(j0 + j)[c0]), a);
    out[c0] = a;
  }
}

}  // namespace detail

/// Where a sequence's positions sit in one device's cache: position p in local slot p / sp of
/// sp rank p % sp (round-robin, the mesh decoder's sp axis); sp = 1 is slot = position.
struct SlotMap {
  std::int64_t sp = 1, rank = 0;
  /// The first local slot holding a position >= p.
  constexpr std::int64_t first(std::int64_t p) const { return p <= rank ? 0 : (p - rank + sp - 1) / sp; }
  /// The number of local slots holding positions < p.
  constexpr std::int64_t end(std::int64_t p) const { return p > rank ? (p - rank + sp - 1) / sp : 0; }
};

/// Where GEMM attention writes (row r, head h): at data + r * row_stride + h * head_stride, the
/// normalised context (partial = false), or flash-decoding's partial record (max m, sum l of
/// exp(s - m), unnormalised context o[D]) that the mesh decoder combines over sp (partial = true).
struct AttentionOut {
  float* data;
  std::int64_t row_stride, head_stride;
  bool partial = false;
};

/// Attention of one query head for m_all query rows at positions p0 .. p0 + m_all - 1 of one
/// sequence (q: row i at q + i * ld) over the local cache slots (slots) holding positions
/// window_start(p0, window) .. p0 + m_all - 1. The kv head's keys and values are read into f32
/// (kv), then per block of kAttentionQueryBlock query rows the scores are one GEMM (q k^T), the
/// causal and window mask and the softmax are row-wise, and the context is a second GEMM (p v),
/// as in the training attention (nn/attention.hpp). Row i's output goes to out + i * out_ld
/// (the layout of AttentionOut; a row with no slot here gets the record {-inf, 0, 0...} or a
/// zero context). Serial: the caller runs one (run, head) per task, so the result does not
/// depend on the thread count.
template <class View>
void attend_run_gemm(const View& view, const float* q, std::int64_t ld, float* out, std::int64_t out_ld, bool partial,
                     std::int64_t p0, std::int64_t m_all, std::int64_t D, std::int64_t window, SlotMap slots,
                     std::vector<float>& kv, std::vector<float>& sc, float softcap = 0.0f) {
    // Local slots [first_slot(pos), end_slot(pos)) are the keys position pos attends to.
  const auto first_slot = [&](std::int64_t pos) { return slots.first(window_start(pos, window)); };
  const auto end_slot = [&](std::int64_t pos) { return slots.end(pos + 1); };
  const std::int64_t QB = kAttentionQueryBlock, off = partial ? 2 : 0;  // o's offset in a record
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::int64_t s0 = first_slot(p0), ns = std::max<std::int64_t>(0, end_slot(p0 + m_all - 1) - s0);
  kv.resize(static_cast<std::size_t>(2 * ns * D));
  float* K = kv.data();
  float* V = K + ns * D;
  for (std::int64_t j = 0; j < ns; ++j) view.read(s0 + j, K + j * D, V + j * D);
  sc.resize(static_cast<std::size_t>(std::min(QB, m_all) * std::max<std::int64_t>(1, ns)));
  for (std::int64_t i0 = 0; i0 < m_all; i0 += QB) {
    const std::int64_t m = std::min(QB, m_all - i0);
    // keys [j0, j0 + nk) of the block, relative to s0
    const std::int64_t j0 = first_slot(p0 + i0) - s0, nk = std::max<std::int64_t>(0, end_slot(p0 + i0 + m - 1) - s0 - j0);
    if (nk > 0)
      gemm_serial(Trans::no, Trans::yes, m, nk, D, scale, q + i0 * ld, ld, K + j0 * D, D, 0.0f, sc.data(), nk);
    for (std::int64_t i = 0; i < m; ++i) {
      float* row = sc.data() + i * nk;
      float* rec = out + (i0 + i) * out_ld;
      const std::int64_t pos = p0 + i0 + i;
      const std::int64_t a = first_slot(pos) - s0 - j0, b = std::max(a, end_slot(pos) - s0 - j0);  // allowed keys [a, b)
      float mx = -std::numeric_limits<float>::infinity(), total = 0.0f;
      if (b > a) {
        if (softcap > 0) softcap_row(row + a, nullptr, b - a, softcap);
        mx = detail::row_max(row + a, b - a);
        total = detail::row_exp_sum(row + a, row + a, b - a, mx);
        if (!partial)
          for (std::int64_t j = a; j < b; ++j) row[j] *= 1.0f / total;
      }
      std::fill(row, row + a, 0.0f);
      std::fill(row + b, row + nk, 0.0f);
      if (partial) {
        rec[0] = mx;
        rec[1] = total;
      }
      if (nk == 0) std::fill(rec + off, rec + off + D, 0.0f);
    }
    if (nk > 0)
      gemm_serial(Trans::no, Trans::no, m, D, nk, 1.0f, sc.data(), nk, V + j0 * D, D, 0.0f,
                           out + i0 * out_ld + off, out_ld);
  }
}

/// Softmax numerators of one query over cache slots j0 .. j0+cnt-1: sc[j] = exp(scale q.k -
/// max), in place, vectorized (the scores soft-capped first when softcap > 0). Returns {max,
/// sum of sc} ({-inf, 0} for cnt == 0). Both decoders' attention starts here; they differ in
/// how the sum is combined.
template <class View>
inline std::pair<float, float> softmax_numerators(const View& view, const float* q, std::int64_t j0, std::int64_t cnt,
                                                  float scale, float* sc, float softcap = 0.0f) {
  using detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size);
  if (cnt <= 0) return {-std::numeric_limits<float>::infinity(), 0.0f};
  detail::slot_scores(view, q, j0, cnt, scale, sc);
  if (softcap > 0) softcap_row(sc, nullptr, cnt, softcap);
  fbatch mxv(-std::numeric_limits<float>::infinity());
  std::int64_t i = 0;
  for (; i + Wd <= cnt; i += Wd) mxv = xsimd::max(mxv, fbatch::load_unaligned(sc + i));
  float mx = detail::hmax(mxv);
  for (; i < cnt; ++i) mx = std::max(mx, sc[i]);
  const fbatch mb(mx);
  fbatch sum(0.f);
  std::int64_t j = 0;
  for (; j + Wd <= cnt; j += Wd) {
    const fbatch e = detail::exp(fbatch::load_unaligned(sc + j) - mb);
    e.store_unaligned(sc + j);
    sum += e;
  }
  if (j < cnt) {
    const fbatch e = detail::exp(detail::load_partial(sc + j, cnt - j, -INFINITY) - mb);
    detail::store_partial(sc + j, e, cnt - j);
    sum += e;
  }
  return {mx, detail::hsum(sum)};
}

/// Attention of query head h of one decode row (row r of q and of out, at position row.pos):
/// softmax_numerators over the local slots the position attends to, then the weighted values,
/// written as AttentionOut says (normalised context, or the partial (m, l, o) record). sc holds
/// the head's scores (the slots up to the position).
template <class View>
void attend_row_head(const View& view, std::int64_t pos, const float* q, float* rec, bool partial, std::int64_t D,
                     std::int64_t window, SlotMap slots, float* sc, float softcap = 0.0f) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Positions [window_start, pos] this row attends to, as local slots [jlo, jlo + cnt).
  const std::int64_t jlo = slots.first(window_start(pos, window));
  const std::int64_t cnt = std::max<std::int64_t>(0, slots.end(pos + 1) - jlo);
  const auto [mx, total] = softmax_numerators(view, q, jlo, cnt, scale, sc, softcap);
  const float w = partial ? 1.0f : 1.0f / total;  // partial records normalise after the combine
  if (partial) {
    rec[0] = mx;
    rec[1] = total;
  }
  detail::weighted_values(view, sc, jlo, cnt, w, rec + (partial ? 2 : 0));
}


/// Flash-decoding's combine over a mesh's sp ranks. For each of `count` (row, head) pairs t,
/// rank k's record sits at records + k * stride + t * (D + 2): the max m_k, the sum l_k of
/// exp(s - m_k) and the unnormalised context o_k[D]. Writes ctx[t * D, (t + 1) * D) =
/// sum_k o_k e^(m_k - M) / sum_k l_k e^(m_k - M), M = max_k m_k, combining in rank order so
/// that every rank computes the same bits.
inline void combine_attention_records(const float* records, std::int64_t ranks, std::int64_t stride,
                                      std::int64_t count, std::int64_t D, float* ctx) {
  const std::int64_t SW = D + 2;
  exec::parallel_for(0, count, 16, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    for (std::ptrdiff_t t = lo; t < hi; ++t) {
      float M = -std::numeric_limits<float>::infinity();
      for (std::int64_t k = 0; k < ranks; ++k) M = std::max(M, records[k * stride + t * SW]);
      float* out = ctx + t * D;
      std::fill(out, out + D, 0.0f);
      float lsum = 0.0f;
      for (std::int64_t k = 0; k < ranks; ++k) {
        const float* st = records + k * stride + t * SW;
        if (st[1] == 0.0f) continue;  // no slot of this rank in range
        const float f = std::exp(st[0] - M);
        lsum += f * st[1];
        for (std::int64_t i = 0; i < D; ++i) out[i] = std::fma(f, st[2 + i], out[i]);
      }
      const float inv = 1.0f / lsum;
      for (std::int64_t i = 0; i < D; ++i) out[i] *= inv;
    }
  });
}

}  // namespace edl::kernels
