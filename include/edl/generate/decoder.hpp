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
//   n1 = rms_norm(x); q, k, v = n1 W^T (+ b); rope(q, k) at each token's position;
//   k, v -> cache slot = position; ctx = softmax(q k^T / sqrt(D)) v over the sequence's slots
//   0 .. position (causal within a chunk, GQA: query head h reads kv head h / (nh / nkv),
//   sliding window if configured); x += ctx Wo^T (+ b); x += down(silu(gate n2) * up n2).
// Then the final norm and lm_head on the last token of each sequence (or every token).
//
// Left padding: a row b of `mask` must be 0...0 1...1; padding tokens are skipped (never
// computed, never cached), so a padded prompt gives the logits of the same prompt alone.
// Projections of up to 16 rows (decode, also of a batch) use a matrix-vector path (parallel
// over outputs, each weight row read once); more rows use kernels::matmul_nt. Attention of a
// prefill chunk runs on the GEMM per (chunk, head); decode's runs one (token, head) per task
// with exec::parallel_for. A call of one row (decode of one sequence) runs the whole forward
// as one exec::PhasedRegion: one fork/join a token instead of ~5 a layer (run_one_row).
// decode() allocates nothing once the first call sized the scratch.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/phased_region.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/rope_table.hpp>
#include <edl/kernels/activations.hpp>
#include <edl/kernels/detail/simd.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/rms_norm.hpp>
#include <edl/kernels/softmax.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/attention.hpp>
#include <edl/nn/rotary.hpp>

namespace edl::generate {

/// The cache shape a model needs for `batch` sequences of up to `max_length` tokens.
inline KVCacheShape kv_cache_shape(const models::LlamaConfig& c, std::int64_t batch, std::int64_t max_length) {
  return {c.num_hidden_layers, batch, max_length, c.num_key_value_heads, c.head_size()};
}

namespace detail {

/// Up to this many rows, linear_nt reads each weight row once from memory and applies it to
/// the rows 4 at a time from L1. Decode steps of a batch (the continuous batching engine runs
/// one token per request) are memory bound: at 16 rows this is several times faster than the
/// GEMM, which packs the whole weight matrix for a handful of rows.
inline constexpr std::int64_t kMatvecRows = 16;

/// From this many rows up to kMatvecRows, linear_nt applies four weight rows at once
/// (dot_rows4): the step is then bound by the loads feeding the FMAs, not by memory. On a
/// Zen 4 EPYC small served 16 concurrent requests 20-27 % faster and 8 requests 8-16 %; at 4
/// rows the blocked path was 17 % slower (docs/benchmarks.md, "Continuous batching").
inline constexpr std::int64_t kMatvecRowsBlocked = 8;
/// ... for rows of at least this many elements: with all of tiny's products blocked (rows of
/// 288), serving 8 requests measured 0-18 % slower in short runs; limited to rows of 512 or
/// more (tiny's down_proj), within the noise.
inline constexpr std::int64_t kMatvecBlockedMinK = 512;

/// y[m * ldy] = x[m, :] . w (+ *bias) for MB (1-4) rows of x: MB is a compile-time constant so
/// the accumulators stay in registers (unrolled: at -O2 GCC otherwise keeps acc in memory and
/// every FMA waits for a store to forward, 3-4x slower).
template <int MB, class T>
inline void dot_rows(const float* x, const T* w, const T* bias, float* y, std::int64_t ldy, std::int64_t K) {
  using kernels::detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size);
  fbatch acc[MB][2];
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = fbatch(0.f);
  std::int64_t k = 0;
  for (; k + 2 * Wd <= K; k += 2 * Wd) {
    const fbatch w0 = kernels::detail::load(w + k), w1 = kernels::detail::load(w + k + Wd);
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      acc[m][0] = kernels::detail::fmadd(fbatch::load_unaligned(x + m * K + k), w0, acc[m][0]);
      acc[m][1] = kernels::detail::fmadd(fbatch::load_unaligned(x + m * K + k + Wd), w1, acc[m][1]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    float s = xsimd::hadd(acc[m][0] + acc[m][1]);
    for (std::int64_t kk = k; kk < K; ++kk) s = std::fma(x[m * K + kk], to_f32(w[kk]), s);
    y[m * ldy] = bias ? s + to_f32(*bias) : s;
  }
}

/// dot_rows for four weight rows at once: y[m * ldy + c] = x[m, :] . w[c * K + :] (+ bias[c])
/// for c < 4 and MB (1 or 2) rows of x. Each sum: two accumulators over alternate lane
/// batches, added, reduced in hsum8's fixed tree, then the tail; the same for every (m, c),
/// whatever MB. Sixteen accumulators take 12 loads per 16 FMAs where dot_rows<4> takes 10 per
/// 8: a decode step of many sequences (the serving engine's) is bound by those loads.
template <int MB, class T>
inline void dot_rows4(const float* x, const T* w, const T* bias, float* y, std::int64_t ldy, std::int64_t K) {
  using kernels::detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size);
  fbatch acc[MB][4][2];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[m][c][0] = acc[m][c][1] = fbatch(0.f);
  std::int64_t k = 0;
  for (; k + 2 * Wd <= K; k += 2 * Wd) {
    fbatch w0[4], w1[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      w0[c] = kernels::detail::load(w + c * K + k);
      w1[c] = kernels::detail::load(w + c * K + k + Wd);
    }
#pragma GCC unroll 2
    for (int m = 0; m < MB; ++m) {
      const fbatch x0 = fbatch::load_unaligned(x + m * K + k), x1 = fbatch::load_unaligned(x + m * K + k + Wd);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        acc[m][c][0] = kernels::detail::fmadd(x0, w0[c], acc[m][c][0]);
        acc[m][c][1] = kernels::detail::fmadd(x1, w1[c], acc[m][c][1]);
      }
    }
  }
  fbatch t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) t[i] = i < 4 * MB ? acc[i / 4][i % 4][0] + acc[i / 4][i % 4][1] : fbatch(0.f);
  float sums[8];
  kernels::detail::hsum8(t, sums);
  for (int m = 0; m < MB; ++m)
    for (int c = 0; c < 4; ++c) {
      float s = sums[m * 4 + c];
      for (std::int64_t kk = k; kk < K; ++kk) s = std::fma(x[m * K + kk], to_f32(w[c * K + kk]), s);
      y[m * ldy + c] = bias ? s + to_f32(bias[c]) : s;
    }
}

/// Weight streams matvec_rows reads in lockstep, whatever the vector width: eight. On a Zen 4
/// EPYC with AVX-512 (16 lanes) a stream per lane, sixteen, decoded tiny and small 10-12 %
/// slower on one thread and 12-32 % slower on two; six read about as fast, four or five 5 %
/// slower (docs/benchmarks.md, "Decode on a Zen 4 EPYC"). With AVX2 (8 lanes) it is the
/// stream per lane the Zen 1 EPYC was tuned with.
inline constexpr std::int64_t kStreams = 8;

/// Bytes of consecutive weight rows one stream of matvec_rows reads before the block of
/// kStreams streams moves on. On the Zen 4 EPYC 128 KiB decoded 2-5 % faster on one thread
/// than 32 KiB (the Zen 1 EPYC's best: faster there than 8 KiB, by 5-25 %, and than 64 KiB)
/// and about as fast as 256 KiB; 16 KiB was 4-10 % slower, 512 KiB and one block over the
/// whole matrix 2-7 % slower.
inline constexpr std::int64_t kStreamBytes = 131072;

/// How far ahead of its loads each stream of matvec_rows prefetches (prefetcht1: into L2 on
/// AMD, as prefetcht2). On the Zen 4 EPYC a prefetch decoded tiny 9 % and small 8 % faster on
/// one thread (1 KiB ahead; 512 B: 6-8 %, 2 KiB: 6-11 %) and 2-17 % faster on two (2 KiB);
/// prefetcht1 and prefetcht2 measured the same, prefetcht0 and prefetchnta 15-35 % slower.
inline constexpr std::int64_t kPrefetchBytes = 1024;

/// The sum of `blocks` consecutive blocks of kStreams streams of `len` floats (len a multiple
/// of two lane batches), the streams read in lockstep: matvec_rows' read order without the
/// multiplies, each stream prefetching kPrefetchBytes ahead as the kernel does. It is the read
/// the kernel is measured against (`edl bench decode --bandwidth`'s rows8, rows8_32k,
/// rows8_stream and streams8 patterns, bench_kernels' matvec_f32/read_rows8), kept next to the
/// kernel so that both change together. Four accumulators hide the add latency.
inline float lockstep_read_sum(const float* x, std::size_t blocks, std::size_t len) noexcept {
  using B = xsimd::batch<float>;
  constexpr std::size_t W = B::size, S = static_cast<std::size_t>(kStreams);
  static_assert(S % 2 == 0);
  B a0(0.f), a1(0.f), a2(0.f), a3(0.f);
  for (std::size_t blk = 0; blk < blocks; ++blk, x += S * len)
    for (std::size_t i = 0; i < len; i += 2 * W)
      for (std::size_t st = 0; st < S; st += 2) {
        for (std::size_t u = 0; u < 2; ++u)  // the kernel prefetches once per load of a lane batch
          for (std::size_t v = 0; v < 2 * W; v += W)
            __builtin_prefetch(reinterpret_cast<const char*>(x + (st + u) * len + i + v) + kPrefetchBytes, 0, 2);
        a0 += B::load_unaligned(x + st * len + i);
        a1 += B::load_unaligned(x + st * len + i + W);
        a2 += B::load_unaligned(x + (st + 1) * len + i);
        a3 += B::load_unaligned(x + (st + 1) * len + i + W);
      }
  return xsimd::hadd((a0 + a1) + (a2 + a3));
}

/// y[j] = x . W[j, :] (+ bias[j]) for weight rows j in [lo, hi). The rows go in blocks of
/// kStreams streams of R consecutive rows (R rows about kStreamBytes, fewer in the last blocks
/// when fewer rows remain): at step r stream s computes row lo + s * R + r, so the streams
/// advance together through memory, each prefetching kPrefetchBytes ahead (into its next row at
/// a row's end). The last fewer than kStreams rows go in one group. Every row's sum has the
/// same order whatever block, chunk or stream it falls in (one accumulator over K in steps of
/// Wd, its lanes reduced in hsum8's fixed tree, then the tail), so the result does not depend
/// on how the rows were split between threads.
template <class T>
inline void matvec_rows(const float* x, const T* W, const T* bias, float* y, std::int64_t K, std::int64_t lo,
                        std::int64_t hi) {
  using kernels::detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size), S = kStreams;
  static_assert(S == 8, "kernels::detail::hsum8 reduces the streams' eight accumulators");
  const std::int64_t row_bytes = K * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t R = std::max<std::int64_t>(1, (kStreamBytes + row_bytes / 2) / row_bytes);
  const std::int64_t K0 = K / Wd * Wd;
  // sums[q] = x . row (first + q * stride) over [0, K0) for q < n <= S, one accumulator per row
  // reduced in registers (hsum8; unused accumulators stay zero and their sums are dropped).
  const auto rows_at = [&](std::int64_t first, std::int64_t stride, std::int64_t n, float* sums) {
    fbatch a[S];
    for (std::int64_t q = 0; q < S; ++q) a[q] = fbatch(0.f);
    const T* w0 = W + first * K;
    const std::int64_t ws = stride * K;
    if (n == S) {
      for (std::int64_t k = 0; k < K0; k += Wd) {
        const fbatch xv = fbatch::load_unaligned(x + k);
#pragma GCC unroll 8
        for (std::int64_t q = 0; q < S; ++q) {
          // A prefetch past the matrix's end is harmless: prefetches do not fault.
          __builtin_prefetch(reinterpret_cast<const char*>(w0 + q * ws + k) + kPrefetchBytes, 0, 2);
          a[q] = kernels::detail::fmadd(xv, kernels::detail::load(w0 + q * ws + k), a[q]);
        }
      }
    } else {
      for (std::int64_t k = 0; k < K0; k += Wd) {
        const fbatch xv = fbatch::load_unaligned(x + k);
        for (std::int64_t q = 0; q < n; ++q) a[q] = kernels::detail::fmadd(xv, kernels::detail::load(w0 + q * ws + k), a[q]);
      }
    }
    kernels::detail::hsum8(a, sums);
  };
  // y[j] from row j's sum over [0, K0): the tail, then the bias.
  const auto finish = [&](std::int64_t j, float v) {
    const T* wr = W + j * K;
    for (std::int64_t k = K0; k < K; ++k) v = std::fma(x[k], to_f32(wr[k]), v);
    y[j] = bias ? v + to_f32(bias[j]) : v;
  };
  // A block's sums go to `stage` in the order they are made (eight per step, one vector
  // store), and reach y a chunk of steps at a time, from L1. Eight scalar stores a step, one
  // per stream into eight far-apart lines of y, had cost the kernel 8-10 % of its reads at
  // tiny's K = 288 (docs/benchmarks.md).
  constexpr std::int64_t kChunk = 128;
  alignas(64) float stage[kChunk * S];
  while (hi - lo >= S) {
    const std::int64_t r_len = std::min(R, (hi - lo) / S);
    for (std::int64_t r0 = 0; r0 < r_len; r0 += kChunk) {
      const std::int64_t r1 = std::min(r_len, r0 + kChunk);
      for (std::int64_t r = r0; r < r1; ++r) rows_at(lo + r, r_len, S, stage + (r - r0) * S);
      for (std::int64_t q = 0; q < S; ++q)
        for (std::int64_t r = r0; r < r1; ++r) finish(lo + q * r_len + r, stage[(r - r0) * S + q]);
    }
    lo += S * r_len;
  }
  if (lo < hi) {
    alignas(64) float sums[S];
    rows_at(lo, 1, hi - lo, sums);
    for (std::int64_t q = 0; q < hi - lo; ++q) finish(lo + q, sums[q]);
  }
}

/// Rows of weight matrix j a parallel chunk of a matrix-vector product takes: enough for the
/// fork/join to pay (16 K floats), at least 8.
inline std::int64_t matvec_grain(std::int64_t K) { return std::max<std::int64_t>(8, 16384 / std::max<std::int64_t>(1, K)); }

/// One matrix of a grouped matrix-vector product: y = W x (+ bias), W [N, K].
template <class T>
struct MatvecPart {
  const T* W;
  const T* bias;
  float* y;
  std::int64_t N;
};

/// Tasks a grouped matrix-vector product of `rows` rows in all takes on `threads` threads: one
/// per thread, fewer when a task would get less than matvec_grain(K) rows.
inline std::int64_t matvec_tasks(std::int64_t rows, std::int64_t K, std::int64_t threads) {
  return std::max<std::int64_t>(1, std::min<std::int64_t>(threads, rows / matvec_grain(K)));
}

/// Task t of `tasks` of a grouped product: the t-th of `tasks` equal ranges of each matrix's rows.
template <class T, std::size_t P>
void matvec_group_task(const float* x, const std::array<MatvecPart<T>, P>& parts, std::int64_t K, std::int64_t t,
                       std::int64_t tasks) {
  for (const MatvecPart<T>& p : parts)
    matvec_rows(x, p.W, p.bias, p.y, K, p.N * t / tasks, p.N * (t + 1) / tasks);
}

/// Several matrix-vector products of one x (q, k and v; gate and up) in one parallel region:
/// one fork/join instead of one per matrix, which at decode's few microseconds per matrix is
/// a visible share of a token. With T threads each matrix is cut into T equal ranges of rows,
/// one per task, each read in kStreamBytes streams as on one thread (on the Zen 4 EPYC that
/// decoded small and gqa1b 2-15 % faster on two threads than eight streams spread over each
/// thread's range, the Zen 1 EPYC's best). Each y[j] is the sum matvec_rows computes alone,
/// bit for bit.
template <class T, std::size_t P>
void matvec_group(const float* x, const std::array<MatvecPart<T>, P>& parts, std::int64_t K) {
  std::int64_t total = 0;
  for (const MatvecPart<T>& p : parts) total += p.N;
  const std::int64_t tasks = matvec_tasks(total, K, exec::num_threads());
  if (tasks <= 1) {
    exec::detail::ensure_flush_denormals();  // as exec::parallel_for would on this thread
    return matvec_group_task(x, parts, K, 0, 1);
  }
  exec::parallel_parts(tasks, [&](std::ptrdiff_t t) { matvec_group_task(x, parts, K, t, tasks); });
}

/// y[m, j] = x[m, :] . W[j, :] (+ bias[j]) for M rows; small M goes row-of-W-major so each
/// weight row is read from memory once per call.
template <class T>
void linear_nt(const float* x, std::int64_t M, const T* W, const T* bias, float* y, std::int64_t N, std::int64_t K) {
  if (M == 1) return matvec_group<T, 1>(x, {MatvecPart<T>{W, bias, y, N}}, K);
  // Weight row j applied to the M rows of x, 4 at a time (the accumulators fit the registers;
  // the weight row is in L1 after the first block). Every row's sum has the same order whatever M.
  const auto one_weight_row = [&](std::int64_t j) {
    const T* w = W + j * K;
    const T* bj = bias ? bias + j : nullptr;
    for (std::int64_t m0 = 0; m0 < M; m0 += 4) {
      const float* xb = x + m0 * K;
      float* yb = y + m0 * N + j;
      switch (std::min<std::int64_t>(4, M - m0)) {
        case 4: dot_rows<4>(xb, w, bj, yb, N, K); break;
        case 3: dot_rows<3>(xb, w, bj, yb, N, K); break;
        case 2: dot_rows<2>(xb, w, bj, yb, N, K); break;
        default: dot_rows<1>(xb, w, bj, yb, N, K); break;
      }
    }
  };
  if (M >= kMatvecRowsBlocked && M <= kMatvecRows && K >= kMatvecBlockedMinK) {
    // Blocks of four weight rows (the x rows two at a time); the last N % 4 rows alone. Every
    // row falls in the same kind of block whatever the thread count.
    exec::parallel_for(0, N / 4, std::max<std::int64_t>(1, matvec_grain(K) / 4), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t j = 4 * lo; j < 4 * hi; j += 4) {
        const T* w = W + j * K;
        const T* bj = bias ? bias + j : nullptr;
        std::int64_t m0 = 0;
        for (; m0 + 2 <= M; m0 += 2) dot_rows4<2>(x + m0 * K, w, bj, y + m0 * N + j, N, K);
        if (m0 < M) dot_rows4<1>(x + m0 * K, w, bj, y + m0 * N + j, N, K);
      }
    });
    for (std::int64_t j = N / 4 * 4; j < N; ++j) one_weight_row(j);
    return;
  }
  if (M <= kMatvecRows) {
    exec::parallel_for(0, N, matvec_grain(K), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t j = lo; j < hi; ++j) one_weight_row(j);
    });
    return;
  }
  kernels::matmul_nt(x, W, y, M, N, K);
  if (bias) {
    exec::parallel_for(0, M, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t m = lo; m < hi; ++m)
        for (std::int64_t j = 0; j < N; ++j) y[m * N + j] += to_f32(bias[j]);
    });
  }
}

/// Several products of one x, y_i = x W_i^T (+ b_i), for M rows: one parallel region for
/// all of them when M is 1 (decode; matvec_group), else linear_nt for each.
template <class T, std::size_t P>
void linear_group(const float* x, std::int64_t M, const std::array<MatvecPart<T>, P>& parts, std::int64_t K) {
  if (M == 1) return matvec_group<T, P>(x, parts, K);
  for (const MatvecPart<T>& p : parts) linear_nt(x, M, p.W, p.bias, p.y, p.N, K);
}

/// A run of at least this many rows of one sequence (a prefill chunk) attends through the GEMM.
inline constexpr std::int64_t kGemmAttentionRows = 8;
/// Query rows per GEMM block of prefill attention: the training attention's block.
inline constexpr std::int64_t kGemmAttentionBlock = nn::detail::kAttentionQueryBlock;

/// Splits rows [0, n) (sorted by sequence) into runs of at least kGemmAttentionRows rows of one
/// sequence at consecutive positions (a prefill chunk: attention on the GEMM), given as
/// [first, last + 1), and the other rows (decode: attention row by row). Both decoders' rows
/// have .b (sequence) and .pos (position).
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
/// (kv), then per block of kGemmAttentionBlock query rows the scores are one GEMM (q k^T), the
/// causal and window mask and the softmax are row-wise, and the context is a second GEMM (p v),
/// as in the training attention (nn/attention.hpp). Row i's output goes to out + i * out_ld
/// (the layout of AttentionOut; a row with no slot here gets the record {-inf, 0, 0...} or a
/// zero context). Serial: the caller runs one (run, head) per task, so the result does not
/// depend on the thread count.
template <class View>
void attend_run_gemm(const View& view, const float* q, std::int64_t ld, float* out, std::int64_t out_ld, bool partial,
                     std::int64_t p0, std::int64_t m_all, std::int64_t D, std::int64_t window, SlotMap slots,
                     std::vector<float>& kv, std::vector<float>& sc) {
  using kernels::Trans;
  // Local slots [first_slot(pos), end_slot(pos)) are the keys position pos attends to.
  const auto first_slot = [&](std::int64_t pos) { return slots.first(nn::detail::window_start(pos, window)); };
  const auto end_slot = [&](std::int64_t pos) { return slots.end(pos + 1); };
  const std::int64_t QB = kGemmAttentionBlock, off = partial ? 2 : 0;  // o's offset in a record
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
      kernels::gemm_serial(Trans::no, Trans::yes, m, nk, D, scale, q + i0 * ld, ld, K + j0 * D, D, 0.0f, sc.data(), nk);
    for (std::int64_t i = 0; i < m; ++i) {
      float* row = sc.data() + i * nk;
      float* rec = out + (i0 + i) * out_ld;
      const std::int64_t pos = p0 + i0 + i;
      const std::int64_t a = first_slot(pos) - s0 - j0, b = std::max(a, end_slot(pos) - s0 - j0);  // allowed keys [a, b)
      float mx = -std::numeric_limits<float>::infinity(), total = 0.0f;
      if (b > a) {
        mx = kernels::detail::row_max(row + a, b - a);
        total = kernels::detail::row_exp_sum(row + a, row + a, b - a, mx);
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
      kernels::gemm_serial(Trans::no, Trans::no, m, D, nk, 1.0f, sc.data(), nk, V + j0 * D, D, 0.0f,
                           out + i0 * out_ld + off, out_ld);
  }
}

/// Prefill attention of every run (split_attention_rows) on the GEMM: one task per (run, query
/// head), each running attend_run_gemm. q is [rows, nh * D]; view_of(row, kv_head) gives the
/// cache view of a run's first row (a Row with .b and .pos).
template <class Row, class ViewOf>
void attend_runs_gemm(const std::vector<Row>& rows, const std::vector<std::pair<std::int64_t, std::int64_t>>& runs,
                      std::int64_t nh, std::int64_t nkv, std::int64_t D, std::int64_t window, SlotMap slots,
                      const float* q, AttentionOut out, ViewOf&& view_of) {
  if (runs.empty()) return;
  const std::int64_t rep = nh / nkv, qw = nh * D;
  exec::parallel_for(0, static_cast<std::int64_t>(runs.size()) * nh, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
    std::vector<float> kv, sc;
    for (std::ptrdiff_t t = lo; t < hi; ++t) {
      const auto [r0, r1] = runs[static_cast<std::size_t>(t / nh)];
      const std::int64_t h = t % nh;
      const Row& row = rows[static_cast<std::size_t>(r0)];
      attend_run_gemm(view_of(row, h / rep), q + r0 * qw + h * D, qw, out.data + r0 * out.row_stride + h * out.head_stride,
                      out.row_stride, out.partial, row.pos, r1 - r0, D, window, slots, kv, sc);
    }
  });
}

/// Softmax numerators of one query over cache slots j0 .. j0+cnt-1: sc[j] = exp(scale q.k -
/// max), in place, vectorized. Returns {max, sum of sc} ({-inf, 0} for cnt == 0). Both
/// decoders' attention starts here; they differ in how the sum is combined.
template <class View>
inline std::pair<float, float> softmax_numerators(const View& view, const float* q, std::int64_t j0, std::int64_t cnt,
                                                  float scale, float* sc) {
  using kernels::detail::fbatch;
  constexpr std::int64_t Wd = static_cast<std::int64_t>(fbatch::size);
  if (cnt <= 0) return {-std::numeric_limits<float>::infinity(), 0.0f};
  slot_scores(view, q, j0, cnt, scale, sc);
  fbatch mxv(-std::numeric_limits<float>::infinity());
  std::int64_t i = 0;
  for (; i + Wd <= cnt; i += Wd) mxv = xsimd::max(mxv, fbatch::load_unaligned(sc + i));
  float mx = kernels::detail::hmax(mxv);
  for (; i < cnt; ++i) mx = std::max(mx, sc[i]);
  const fbatch mb(mx);
  fbatch sum(0.f);
  std::int64_t j = 0;
  for (; j + Wd <= cnt; j += Wd) {
    const fbatch e = kernels::detail::exp(fbatch::load_unaligned(sc + j) - mb);
    e.store_unaligned(sc + j);
    sum += e;
  }
  if (j < cnt) {
    const fbatch e = kernels::detail::exp(kernels::detail::load_partial(sc + j, cnt - j, -INFINITY) - mb);
    kernels::detail::store_partial(sc + j, e, cnt - j);
    sum += e;
  }
  return {mx, kernels::detail::hsum(sum)};
}

/// Attention of query head h of one decode row (row r of q and of out, at position row.pos):
/// softmax_numerators over the local slots the position attends to, then the weighted values,
/// written as AttentionOut says (normalised context, or the partial (m, l, o) record). sc holds
/// the head's scores (the slots up to the position).
template <class View>
void attend_row_head(const View& view, std::int64_t pos, const float* q, float* rec, bool partial, std::int64_t D,
                     std::int64_t window, SlotMap slots, float* sc) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Positions [window_start, pos] this row attends to, as local slots [jlo, jlo + cnt).
  const std::int64_t jlo = slots.first(nn::detail::window_start(pos, window));
  const std::int64_t cnt = std::max<std::int64_t>(0, slots.end(pos + 1) - jlo);
  const auto [mx, total] = softmax_numerators(view, q, jlo, cnt, scale, sc);
  const float w = partial ? 1.0f : 1.0f / total;  // partial records normalise after the combine
  if (partial) {
    rec[0] = mx;
    rec[1] = total;
  }
  weighted_values(view, sc, jlo, cnt, w, rec + (partial ? 2 : 0));
}

/// Attention of rows `single` (decode rows: split_attention_rows' rest) row by row: one task per
/// (row, query head) running attend_row_head. Rows go block rows at a time, so `scores` holds
/// block * nh score rows of score_len floats.
template <class Row, class ViewOf>
void attend_rows(const std::vector<Row>& rows, const std::vector<std::int64_t>& single, std::int64_t nh, std::int64_t nkv,
                 std::int64_t D, std::int64_t window, SlotMap slots, const float* q, AttentionOut out, float* scores,
                 std::int64_t score_len, std::int64_t block, ViewOf&& view_of) {
  const std::int64_t rep = nh / nkv, n = static_cast<std::int64_t>(single.size());
  for (std::int64_t i0 = 0; i0 < n; i0 += block) {
    const std::int64_t i1 = std::min(n, i0 + block);
    exec::parallel_for(0, (i1 - i0) * nh, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::ptrdiff_t t = lo; t < hi; ++t) {
        const std::int64_t r = single[static_cast<std::size_t>(i0 + t / nh)], h = t % nh;
        const Row& row = rows[static_cast<std::size_t>(r)];
        attend_row_head(view_of(row, h / rep), row.pos, q + r * nh * D + h * D,
                        out.data + r * out.row_stride + h * out.head_stride, out.partial, D, window, slots,
                        scores + t * score_len);
      }
    });
  }
}

}  // namespace detail

template <class Pol, KVCache Cache>
class Decoder {
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using T = typename Pol::param_t;

  Decoder(const Model& m, Cache& cache) : m_(m), cache_(cache), cfg_(m.config()) {
    const char* w = "generate.Decoder";
    const KVCacheShape& s = cache.shape();
    EDL_CHECK(s.num_layers == cfg_.num_hidden_layers && s.kv_heads == cfg_.num_key_value_heads &&
                  s.head_dim == cfg_.head_size(),
              errc::shape_mismatch, w, "cache shape (layers ", s.num_layers, ", kv_heads ", s.kv_heads, ", head_dim ",
              s.head_dim, ") does not match the model (", cfg_.num_hidden_layers, ", ", cfg_.num_key_value_heads, ", ",
              cfg_.head_size(), ")");
    EDL_CHECK(static_cast<std::int64_t>(m.model.layers.size()) == cfg_.num_hidden_layers, errc::shape_mismatch, w,
              "model has ", m.model.layers.size(), " layers, config says ", cfg_.num_hidden_layers);
    H_ = cfg_.hidden_size;
    I_ = cfg_.intermediate_size;
    V_ = cfg_.vocab_size;
    nh_ = cfg_.num_attention_heads;
    nkv_ = cfg_.num_key_value_heads;
    D_ = cfg_.head_size();
    window_ = cfg_.attention_window().value_or(0);
    rope_ = RopeTable(cfg_, s.max_length);
    ensure_rows(s.batch);
  }

  const Cache& cache() const noexcept { return cache_; }
  Cache& cache() noexcept { return cache_; }
  std::int64_t batch() const noexcept { return cache_.shape().batch; }

  /// Prefills a chunk: ids [batch, seq] (mask [batch, seq] of 0/1, left padding, or null).
  /// Tokens are appended after what each sequence already holds (chunked prefill).
  /// logits_last [batch, vocab]: the logits of each sequence's last real token of the chunk
  /// (rows of sequences with no token in the chunk are left as they are; may be null);
  /// logits_all [batch * seq, vocab] (optional): every token, padding rows set to 0.
  void prefill(const std::int64_t* ids, std::int64_t seq, const std::int64_t* mask, float* logits_last,
               float* logits_all = nullptr) {
    const char* w = "generate.Decoder.prefill";
    const std::int64_t B = batch();
    EDL_CHECK(seq >= 0, errc::invalid_argument, w, "seq must be >= 0, found ", seq);
    rows_.clear();
    for (std::int64_t b = 0; b < B; ++b) {
      std::int64_t pad = 0;
      if (mask) {
        while (pad < seq && mask[b * seq + pad] == 0) ++pad;
        for (std::int64_t s = pad; s < seq; ++s)
          EDL_CHECK(mask[b * seq + s] != 0, errc::invalid_argument, w, "attention_mask row ", b,
                    " is not left padding (a 0 at ", s, " after a 1)");
      }
      const std::int64_t len = cache_.length(b);
      for (std::int64_t s = pad; s < seq; ++s) rows_.push_back({b, len + s - pad, ids[b * seq + s], b * seq + s});
    }
    run(logits_last, logits_all, logits_all ? seq : 0);
  }

  /// One token per sequence: ids [batch]; logits [batch, vocab]. active [batch] (optional):
  /// sequences with active[b] == 0 are skipped (no token appended, logits row untouched).
  void decode(const std::int64_t* ids, float* logits, const std::uint8_t* active = nullptr) {
    rows_.clear();
    for (std::int64_t b = 0; b < batch(); ++b)
      if (!active || active[b]) rows_.push_back({b, cache_.length(b), ids[b], b});
    run(logits, nullptr, 0);
  }

  /// Where one-row decode steps (run_one_row: one sequence, no logits of every position) spend
  /// their time, per step and per team thread, in seconds: the products and attention of all
  /// layers by kind, the lm_head, and the barrier waits of all phases (docs/benchmarks.md,
  /// "Where tiny's two-thread step goes").
  struct PhaseSeconds {
    double qkv = 0, attention = 0, o_proj = 0, gate_up = 0, down = 0, lm_head = 0, barrier_wait = 0;
    std::int64_t steps = 0;  // the one-row steps timed
  };

  /// Times the one-row steps that follow (true) or stops timing them (false); the times add up
  /// until reset_phase_times(). Off by default: on, a phase costs three clock reads per thread.
  void time_phases(bool on) { region_->time_phases(on ? phase_times_.get() : nullptr); }
  void reset_phase_times() { phase_times_->clear(); }

  /// The timed steps' phase times, each a mean per step and per thread.
  PhaseSeconds phase_seconds() const {
    PhaseSeconds r;
    const exec::PhaseTimes& t = *phase_times_;
    r.steps = t.runs;
    if (t.thread_runs == 0) return r;
    const std::size_t layers = m_.model.layers.size();
    double* kind[kPhasesPerLayer] = {&r.qkv, &r.attention, &r.o_proj, &r.gate_up, &r.down};
    for (std::size_t p = 0; p < t.work.size(); ++p) {
      *(p < kPhasesPerLayer * layers ? kind[p % kPhasesPerLayer] : &r.lm_head) += t.work[p];
      r.barrier_wait += t.wait[p];
    }
    const double n = static_cast<double>(t.thread_runs);
    for (double* v : {&r.qkv, &r.attention, &r.o_proj, &r.gate_up, &r.down, &r.lm_head, &r.barrier_wait}) *v /= n;
    return r;
  }

  /// Largest scratch (bytes) the decoder holds.
  std::int64_t scratch_bytes() const noexcept {
    return static_cast<std::int64_t>((x_.size() + n_.size() + q_.size() + k_.size() + v_.size() + ctx_.size() +
                                      g_.size() + u_.size() + scores_.size() + hl_.size() + nt_.size()) *
                                     sizeof(float));
  }

 private:
  struct Row {
    std::int64_t b, pos, id, out;  // sequence, position (= cache slot), token, row in logits_all
  };

  void ensure_rows(std::int64_t n) {
    const auto grow = [](aligned_vector<float>& v, std::int64_t size) {
      if (static_cast<std::int64_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
    };
    grow(x_, n * H_);
    grow(n_, n * H_);
    grow(q_, n * nh_ * D_);
    grow(k_, n * nkv_ * D_);
    grow(v_, n * nkv_ * D_);
    grow(ctx_, n * nh_ * D_);
    grow(g_, n * I_);
    grow(u_, n * I_);
    grow(hl_, n * H_);
    grow(o_, n * H_);
    // Attention scores: a block of rows x heads x max_length at a time.
    const std::int64_t per_row = nh_ * cache_.shape().max_length;
    attn_block_ = std::max<std::int64_t>(1, std::min<std::int64_t>(n, (std::int64_t{4} << 20) / per_row));
    grow(scores_, attn_block_ * per_row);
  }

  void run(float* logits_last, float* logits_all, std::int64_t seq) {
    const char* w = "generate.Decoder";
    const std::int64_t n = static_cast<std::int64_t>(rows_.size());
    const std::int64_t B = batch();
    // Validate everything before touching the cache.
    for (const Row& r : rows_)
      EDL_CHECK(r.id >= 0 && r.id < V_, errc::invalid_argument, w, "token id ", r.id, " (sequence ", r.b,
                ", position ", r.pos, ") is outside the vocabulary [0, ", V_, ")");
    std::vector<std::int64_t>& need = need_;
    need.assign(static_cast<std::size_t>(B), -1);
    for (const Row& r : rows_) need[static_cast<std::size_t>(r.b)] = std::max(need[static_cast<std::size_t>(r.b)], r.pos + 1);
    for (std::int64_t b = 0; b < B; ++b)
      if (need[static_cast<std::size_t>(b)] >= 0) cache_.reserve(b, need[static_cast<std::size_t>(b)]);
    if (logits_all) std::fill(logits_all, logits_all + B * seq * V_, 0.0f);
    if (n == 0) return;
    ensure_rows(n);
    detail::split_attention_rows(rows_, n, runs_, single_);  // the same rows in every layer

    // Embedding.
    const T* emb = m_.model.embed_tokens.weight.data();
    for (std::int64_t r = 0; r < n; ++r) {
      const T* e = emb + rows_[static_cast<std::size_t>(r)].id * H_;
      float* xr = x_.data() + r * H_;
      for (std::int64_t i = 0; i < H_; ++i) xr[i] = to_f32(e[i]);
    }
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    if (n == 1 && !logits_all) {
      run_one_row(logits_last);
      cache_.set_length(rows_[0].b, rows_[0].pos + 1);
      return;
    }
    for (std::size_t l = 0; l < m_.model.layers.size(); ++l) {
      const auto& L = m_.model.layers[l];
      const auto& A = L.self_attn;
      kernels::rms_norm_forward(x_.data(), L.input_layernorm.weight.data(), n_.data(), static_cast<float*>(nullptr), n, H_, eps);
      detail::linear_group<T, 3>(n_.data(), n,
                                 {detail::MatvecPart<T>{A.q_proj.weight.data(), bias_of(A.q_proj), q_.data(), nh_ * D_},
                                  {A.k_proj.weight.data(), bias_of(A.k_proj), k_.data(), nkv_ * D_},
                                  {A.v_proj.weight.data(), bias_of(A.v_proj), v_.data(), nkv_ * D_}},
                                 H_);
      rope(q_.data(), n, nh_);
      rope(k_.data(), n, nkv_);
      for (std::int64_t r = 0; r < n; ++r) {
        const Row& row = rows_[static_cast<std::size_t>(r)];
        cache_.store(static_cast<std::int64_t>(l), row.b, row.pos, k_.data() + r * nkv_ * D_, v_.data() + r * nkv_ * D_);
      }
      attention(static_cast<std::int64_t>(l));
      detail::linear_nt(ctx_.data(), n, A.o_proj.weight.data(), bias_of(A.o_proj), o_.data(), H_, nh_ * D_);
      kernels::add_inplace(x_.data(), o_.data(), static_cast<std::ptrdiff_t>(n * H_));
      kernels::rms_norm_forward(x_.data(), L.post_attention_layernorm.weight.data(), n_.data(),
                                static_cast<float*>(nullptr), n, H_, eps);
      detail::linear_group<T, 2>(n_.data(), n,
                                 {detail::MatvecPart<T>{L.mlp.gate_proj.weight.data(), bias_of(L.mlp.gate_proj), g_.data(), I_},
                                  {L.mlp.up_proj.weight.data(), bias_of(L.mlp.up_proj), u_.data(), I_}},
                                 H_);
      kernels::silu_mul(g_.data(), u_.data(), g_.data(), static_cast<std::ptrdiff_t>(n * I_));
      detail::linear_nt(g_.data(), n, L.mlp.down_proj.weight.data(), bias_of(L.mlp.down_proj), o_.data(), H_, I_);
      kernels::add_inplace(x_.data(), o_.data(), static_cast<std::ptrdiff_t>(n * H_));
    }
    for (std::int64_t b = 0; b < B; ++b)
      if (need[static_cast<std::size_t>(b)] >= 0) cache_.set_length(b, need[static_cast<std::size_t>(b)]);

    const T* head = m_.head_weight();
    const T* norm_w = m_.model.norm.weight.data();
    if (logits_all) {
      kernels::rms_norm_forward(x_.data(), norm_w, n_.data(), static_cast<float*>(nullptr), n, H_, eps);
      std::vector<float> all(static_cast<std::size_t>(n * V_));
      detail::linear_nt(n_.data(), n, head, static_cast<const T*>(nullptr), all.data(), V_, H_);
      for (std::int64_t r = 0; r < n; ++r)
        std::memcpy(logits_all + rows_[static_cast<std::size_t>(r)].out * V_, all.data() + r * V_,
                    static_cast<std::size_t>(V_) * sizeof(float));
    }
    if (logits_last) {
      // The last row of each sequence, in sequence order.
      last_.clear();
      for (std::int64_t r = 0; r < n; ++r)
        if (r + 1 == n || rows_[static_cast<std::size_t>(r + 1)].b != rows_[static_cast<std::size_t>(r)].b) last_.push_back(r);
      const std::int64_t nl = static_cast<std::int64_t>(last_.size());
      for (std::int64_t i = 0; i < nl; ++i)
        std::memcpy(hl_.data() + i * H_, x_.data() + last_[static_cast<std::size_t>(i)] * H_,
                    static_cast<std::size_t>(H_) * sizeof(float));
      kernels::rms_norm_forward(hl_.data(), norm_w, n_.data(), static_cast<float*>(nullptr), nl, H_, eps);
      if (nl == B) {  // every sequence present: write straight into logits_last
        detail::linear_nt(n_.data(), nl, head, static_cast<const T*>(nullptr), logits_last, V_, H_);
      } else {
        for (std::int64_t i = 0; i < nl; ++i)
          detail::linear_nt(n_.data() + i * H_, 1, head, static_cast<const T*>(nullptr),
                            logits_last + rows_[static_cast<std::size_t>(last_[static_cast<std::size_t>(i)])].b * V_, V_, H_);
      }
    }
  }

  /// One row (a decode step of one sequence, serving's common case): the whole forward is one
  /// exec::PhasedRegion, so on T threads a token costs one fork/join instead of ~5 per layer.
  /// Per layer: q/k/v (then rope and the cache store, once, after the phase), attention one
  /// query head per part, o_proj (+ residual), gate/up (+ SwiGLU), down (+ residual); then the
  /// lm_head. The products split into matvec_tasks ranges as matvec_group splits them, and each
  /// part normalises x into its thread's own buffer first. Every output is the sum the general
  /// path computes, bit for bit, whatever the thread count.
  void run_one_row(float* logits_last) {
    using detail::MatvecPart;
    const Row& row = rows_[0];
    const std::int64_t threads = std::max(1, exec::num_threads());
    if (static_cast<std::int64_t>(nt_.size()) < threads * H_) nt_.resize(static_cast<std::size_t>(threads * H_));
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    const std::int64_t qw = nh_ * D_, kw = nkv_ * D_, rep = nh_ / nkv_, score_len = cache_.shape().max_length;
    const std::int64_t qkv_tasks = detail::matvec_tasks(qw + 2 * kw, H_, threads),
                       o_tasks = detail::matvec_tasks(H_, qw, threads),
                       gu_tasks = detail::matvec_tasks(2 * I_, H_, threads),
                       down_tasks = detail::matvec_tasks(H_, I_, threads),
                       head_tasks = logits_last ? detail::matvec_tasks(V_, H_, threads) : 0;
    const std::size_t layers = m_.model.layers.size();
    // Parts run serial code only: a part that forks (a TBB parallel_for that spawns) could
    // be handed another team thread's body while it waits, and wait on itself.
    // x[lo, hi) += o[lo, hi) for task t's range of H outputs: the residual add of a product's rows.
    const auto add_range = [&](std::int64_t t, std::int64_t tasks) {
      kernels::detail::map_range(H_ * t / tasks, H_ * (t + 1) / tasks,
                                 [](const kernels::detail::fbatch& a, const kernels::detail::fbatch& b) { return a + b; },
                                 x_.data(), static_cast<const float*>(x_.data()), static_cast<const float*>(o_.data()));
    };
    region_->run(static_cast<int>(threads), kPhasesPerLayer * layers + 1, [&](exec::PhasedRegion::Team& team) {
      float* nx = nt_.data() + team.thread() * H_;  // this thread's normalised x
      for (std::size_t l = 0; l < layers; ++l) {
        const auto& L = m_.model.layers[l];
        const auto& A = L.self_attn;
        const std::int64_t layer = static_cast<std::int64_t>(l);
        const std::array<MatvecPart<T>, 3> qkv{MatvecPart<T>{A.q_proj.weight.data(), bias_of(A.q_proj), q_.data(), qw},
                                               {A.k_proj.weight.data(), bias_of(A.k_proj), k_.data(), kw},
                                               {A.v_proj.weight.data(), bias_of(A.v_proj), v_.data(), kw}};
        team.phase(
            qkv_tasks,
            [&](std::int64_t t) {
              kernels::rms_norm_forward(x_.data(), L.input_layernorm.weight.data(), nx, static_cast<float*>(nullptr), 1,
                                        H_, eps);
              detail::matvec_group_task(nx, qkv, H_, t, qkv_tasks);
            },
            [&] {
              rope(q_.data(), 1, nh_);
              rope(k_.data(), 1, nkv_);
              cache_.store(layer, row.b, row.pos, k_.data(), v_.data());
            });
        team.phase(nh_, [&](std::int64_t h) {
          detail::attend_row_head(cache_.view(layer, row.b, h / rep), row.pos, q_.data() + h * D_, ctx_.data() + h * D_,
                                  false, D_, window_, detail::SlotMap{}, scores_.data() + h * score_len);
        });
        const std::array<MatvecPart<T>, 1> o{MatvecPart<T>{A.o_proj.weight.data(), bias_of(A.o_proj), o_.data(), H_}};
        team.phase(o_tasks, [&](std::int64_t t) {
          detail::matvec_group_task(ctx_.data(), o, qw, t, o_tasks);
          add_range(t, o_tasks);
        });
        const std::array<MatvecPart<T>, 2> gu{
            MatvecPart<T>{L.mlp.gate_proj.weight.data(), bias_of(L.mlp.gate_proj), g_.data(), I_},
            {L.mlp.up_proj.weight.data(), bias_of(L.mlp.up_proj), u_.data(), I_}};
        team.phase(gu_tasks, [&](std::int64_t t) {
          kernels::rms_norm_forward(x_.data(), L.post_attention_layernorm.weight.data(), nx,
                                    static_cast<float*>(nullptr), 1, H_, eps);
          detail::matvec_group_task(nx, gu, H_, t, gu_tasks);
          // SwiGLU over the rows of g and u this part wrote.
          kernels::detail::map_range(I_ * t / gu_tasks, I_ * (t + 1) / gu_tasks, kernels::detail::SiluMulOp{}, g_.data(),
                                     static_cast<const float*>(g_.data()), static_cast<const float*>(u_.data()));
        });
        const std::array<MatvecPart<T>, 1> down{
            MatvecPart<T>{L.mlp.down_proj.weight.data(), bias_of(L.mlp.down_proj), o_.data(), H_}};
        team.phase(down_tasks, [&](std::int64_t t) {
          detail::matvec_group_task(g_.data(), down, I_, t, down_tasks);
          add_range(t, down_tasks);
        });
      }
      const std::array<MatvecPart<T>, 1> head{
          MatvecPart<T>{m_.head_weight(), static_cast<const T*>(nullptr), logits_last ? logits_last + row.b * V_ : nullptr, V_}};
      team.phase(head_tasks, [&](std::int64_t t) {
        kernels::rms_norm_forward(x_.data(), m_.model.norm.weight.data(), nx, static_cast<float*>(nullptr), 1, H_, eps);
        detail::matvec_group_task(nx, head, H_, t, head_tasks);
      });
    });
  }

  template <class Lin>
  static const T* bias_of(const Lin& lin) {
    return lin.has_bias() ? lin.bias.data() : nullptr;
  }

  void rope(float* x, std::int64_t n, std::int64_t heads) const {
    for (std::int64_t r = 0; r < n; ++r) rope_.rotate(x + r * heads * D_, rows_[static_cast<std::size_t>(r)].pos, heads);
  }

  // Runs of rows of one sequence at consecutive positions (a prefill chunk; runs_, split once
  // per call in run()) attend on the GEMM; the other rows (decode) row by row.
  void attention(std::int64_t layer) {
    const detail::AttentionOut out{ctx_.data(), nh_ * D_, D_};
    const auto view_of = [&](const Row& row, std::int64_t g) { return cache_.view(layer, row.b, g); };
    detail::attend_runs_gemm(rows_, runs_, nh_, nkv_, D_, window_, detail::SlotMap{}, q_.data(), out, view_of);
    detail::attend_rows(rows_, single_, nh_, nkv_, D_, window_, detail::SlotMap{}, q_.data(), out, scores_.data(),
                        cache_.shape().max_length, attn_block_, view_of);
  }

  const Model& m_;
  Cache& cache_;
  models::LlamaConfig cfg_;
  std::int64_t H_ = 0, I_ = 0, V_ = 0, nh_ = 0, nkv_ = 0, D_ = 0, window_ = 0, attn_block_ = 1;
  RopeTable rope_;
  // On cache lines (as the weights): the products read x in full vectors beside each weight row.
  aligned_vector<float> x_, n_, q_, k_, v_, ctx_, g_, u_, o_, hl_, scores_;
  aligned_vector<float> nt_;  // run_one_row: each thread's normalised x
  // run_one_row's phases per layer, in order: q/k/v, attention, o_proj, gate/up, down (then one
  // for the lm_head after the last layer); phase_seconds() names them by this order.
  static constexpr std::size_t kPhasesPerLayer = 5;
  std::unique_ptr<exec::PhasedRegion> region_ = std::make_unique<exec::PhasedRegion>();  // a Decoder stays movable
  std::unique_ptr<exec::PhaseTimes> phase_times_ = std::make_unique<exec::PhaseTimes>();  // region_ points here
  std::vector<Row> rows_;
  std::vector<std::int64_t> last_, need_, single_;
  std::vector<std::pair<std::int64_t, std::int64_t>> runs_;  // [first, last + 1) rows of a prefill run
};

}  // namespace edl::generate
