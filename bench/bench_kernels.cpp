// Kernel benchmarks (Google Benchmark). Every GEMM benchmark reports a "GFLOP/s" counter
// (2*M*N*K per iteration). With OpenBLAS available, cblas_sgemm runs on the same shapes;
// registration interleaves edl and OpenBLAS per shape and thread count so both see the same
// machine load. Filter with e.g. --benchmark_filter='gemm_f32/.*/threads:2'. The matvec_f32
// benchmarks are decode's matrix-vector kernel next to a plain read of the same bytes ("GB/s");
// decode_attention, decode's attention over a KV cache on 4 KiB or on huge pages.
//
//   OPENBLAS_CORETYPE=Haswell ./edl_bench_kernels --benchmark_filter=gemm
#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <edl/core/allocator.hpp>
#include <edl/core/exec.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/kernels/gemm.hpp>

#ifdef EDL_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace {

using i64 = std::int64_t;

struct Shape {
  i64 m, n, k;
};
// Transformer-sized shapes: tokens x hidden projections, MLP up/down, LM head, a square one.
const Shape kShapes[] = {{2048, 768, 768},  {2048, 2048, 768},   {2048, 768, 2048},
                         {2048, 32000, 768}, {1024, 1024, 1024}};
const int kThreads[] = {1, 2};

template <class T>
std::vector<T> random_vec(i64 n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = edl::from_f32<T>(d(gen));
  return v;
}

void set_flops(benchmark::State& state, i64 m, i64 n, i64 k) {
  state.counters["GFLOP/s"] = benchmark::Counter(2e-9 * static_cast<double>(m) * n * k,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

/// edl gemm, C = A * op(B) with B stored [K,N] (nt = false) or [N,K] (nt = true).
template <class T>
void bm_edl(benchmark::State& state, Shape s, int threads, bool nt) {
  const auto A = random_vec<T>(s.m * s.k, 1), B = random_vec<T>(s.k * s.n, 2);
  std::vector<float> C(static_cast<std::size_t>(s.m * s.n));
  edl::exec::set_num_threads(threads);
  const edl::Trans tb = nt ? edl::Trans::yes : edl::Trans::no;
  for (auto _ : state) {
    edl::gemm(edl::Trans::no, tb, s.m, s.n, s.k, 1.f, A.data(), s.k, B.data(), nt ? s.k : s.n, 0.f, C.data(),
              s.n);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  edl::exec::set_num_threads(0);
  set_flops(state, s.m, s.n, s.k);
}

#ifdef EDL_HAVE_OPENBLAS
void bm_openblas(benchmark::State& state, Shape s, int threads, bool nt) {
  const auto A = random_vec<float>(s.m * s.k, 1), B = random_vec<float>(s.k * s.n, 2);
  std::vector<float> C(static_cast<std::size_t>(s.m * s.n));
  openblas_set_num_threads(threads);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, nt ? CblasTrans : CblasNoTrans, static_cast<int>(s.m),
                static_cast<int>(s.n), static_cast<int>(s.k), 1.f, A.data(), static_cast<int>(s.k), B.data(),
                static_cast<int>(nt ? s.k : s.n), 0.f, C.data(), static_cast<int>(s.n));
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, s.m, s.n, s.k);
}
#endif

/// Decode's matrix-vector product y = W x on a 256 MiB matrix [N, K] (far beyond the caches),
/// through the decoder's own entry (linear_nt with one row: matvec_group), as "GB/s" of weights.
void bm_matvec(benchmark::State& state, i64 K, int threads) {
  const i64 N = (i64{256} << 20) / 4 / K;
  const edl::aligned_vector<float> W(static_cast<std::size_t>(N * K), 0.001f);  // on a line, as a model's
  const std::vector<float> x = random_vec<float>(K, 1);
  edl::advise_huge_pages(W.data(), W.size() * sizeof(float));  // as the edl tool's served weights
  std::vector<float> y(static_cast<std::size_t>(N));
  edl::exec::set_num_threads(threads);
  for (auto _ : state) {
    edl::kernels::linear_nt<float>(x.data(), 1, W.data(), nullptr, y.data(), N, K);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  edl::exec::set_num_threads(0);
  state.counters["GB/s"] = benchmark::Counter(1e-9 * 4.0 * static_cast<double>(N * K), benchmark::Counter::kIsIterationInvariantRate);
}

/// The read the matrix-vector kernel cannot beat: the same 256 MiB summed, each thread's part
/// as kStreams streams of kStreamBytes in lockstep (the kernel's order and prefetches, no multiplies).
void bm_read_rows8(benchmark::State& state, int threads) {
  constexpr std::size_t S = edl::kernels::detail::kStreams, len = edl::kernels::detail::kStreamBytes / sizeof(float);
  const std::size_t n = (std::size_t{256} << 20) / 4, per = n / static_cast<std::size_t>(threads) / (S * len) * (S * len);
  const edl::aligned_vector<float> buf(n, 0.001f);
  edl::advise_huge_pages(buf.data(), buf.size() * sizeof(float));
  std::vector<float> sums(static_cast<std::size_t>(threads));
  edl::exec::set_num_threads(threads);
  for (auto _ : state) {
    edl::exec::parallel_parts(threads, [&](std::ptrdiff_t t) {
      sums[static_cast<std::size_t>(t)] =
          edl::kernels::detail::lockstep_read_sum(buf.data() + static_cast<std::size_t>(t) * per, per / (S * len), len);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  edl::exec::set_num_threads(0);
  state.counters["GB/s"] = benchmark::Counter(1e-9 * 4.0 * static_cast<double>(per * static_cast<std::size_t>(threads)),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

/// A decode step's products (f32, one thread count) over a config's weights laid out four ways:
/// every matrix its own allocation starting on a cache line (as the model holds them,
/// nn::ParamTensor), the same 16 bytes past a line (where glibc's malloc put three in four),
/// each layer's seven matrices back to back in one allocation, or one matrix [total / H, H] of
/// the same bytes. Whether a matrix's alignment, or moving from one matrix or allocation to the
/// next, costs reads ("GB/s").
enum class Layout { separate, separate_off16, per_layer, one_matrix };
void bm_matvec_layers(benchmark::State& state, const char* cfg, Layout layout, int threads) {
  const bool tiny = std::string(cfg) == "tiny";
  const i64 H = tiny ? 288 : 768, I = tiny ? 768 : 2048, L = tiny ? 6 : 12, V = 32000;
  const std::array<std::array<i64, 2>, 7> layer = {{{H, H}, {H, H}, {H, H}, {H, H}, {I, H}, {I, H}, {H, I}}};
  i64 per_layer = 0;
  for (const auto& m : layer) per_layer += m[0] * m[1];
  const i64 total = per_layer * L + V * H;
  // separate: 7 L + 1 blocks; per_layer: L + 1; one_matrix: 1. Each block starts on a cache
  // line; separate_off16's matrices start 4 floats into theirs.
  std::vector<edl::aligned_vector<float>> blocks;
  const i64 skip = layout == Layout::separate_off16 ? 4 : 0;
  const auto block = [&](i64 n) { return blocks.emplace_back(static_cast<std::size_t>(n + skip), 0.001f).data() + skip; };
  struct Product {
    const float* w;
    i64 n, k;
  };
  std::vector<Product> step;  // the products of one decode step, in order, wherever they live
  if (layout == Layout::one_matrix) {
    step.push_back({block(total), total / H, H});
  } else {
    const bool own = layout != Layout::per_layer;
    for (i64 l = 0; l < L; ++l) {
      const float* w = own ? nullptr : block(per_layer);
      for (const auto& m : layer) {
        if (own) w = block(m[0] * m[1]);
        step.push_back({w, m[0], m[1]});
        w += m[0] * m[1];
      }
    }
    step.push_back({block(V * H), V, H});
  }
  for (const auto& blk : blocks) edl::advise_huge_pages(blk.data(), blk.size() * sizeof(float));
  const std::vector<float> x = random_vec<float>(I, 1);
  std::vector<float> y(static_cast<std::size_t>(total / H));
  edl::exec::set_num_threads(threads);
  for (auto _ : state) {
    for (const Product& p : step) edl::kernels::linear_nt<float>(x.data(), 1, p.w, nullptr, y.data(), p.n, p.k);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  edl::exec::set_num_threads(0);
  state.counters["GB/s"] = benchmark::Counter(4e-9 * static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate);
}

/// Decode attention of one query row over a cache of small's shape (12 layers, 12 kv heads of
/// 64), every layer and head (detail::attend_row_head, heads split over the threads per layer
/// as the decoder's attention phase splits them), with the cache's storage on 4 KiB pages or
/// advised onto huge pages before it is written (as the KV caches are, assign_on_huge_pages).
/// Each iteration attends for another of enough sequences that a sequence's keys and values
/// have left the caches when it comes round again, and before each layer's attention reads
/// (untimed) a layer's worth of a 512 MiB "weights" buffer on huge pages, as decode streams a
/// layer's products between two attentions: that evicts the TLB's entries and the page-table
/// lines a 4 KiB page's miss would otherwise find in the caches. "GB/s": keys and values read.
void bm_decode_attention(benchmark::State& state, bool huge, i64 ctx, int threads) {
  constexpr i64 L = 12, G = 12, D = 64;
  const i64 per_seq = L * G * ctx * D;  // floats of k (or v) per sequence
  const i64 seqs = std::max<i64>(2, (i64{256} << 20) / (8 * per_seq));
  edl::huge_page_vector<float> k, v;  // both from one allocator: only the advice differs
  const auto fill = [&](edl::huge_page_vector<float>& b, std::uint32_t seed) {
    if (huge) {
      edl::assign_on_huge_pages(b, static_cast<std::size_t>(seqs * per_seq), 0.0f);
    } else {
      b.assign(static_cast<std::size_t>(seqs * per_seq), 0.0f);
    }
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (auto& x : b) x = d(gen);
  };
  fill(k, 1);
  fill(v, 2);
  const std::vector<float> q = random_vec<float>(G * D, 3);
  std::vector<float> out(static_cast<std::size_t>(G * D)), scores(static_cast<std::size_t>(G * ctx));
  edl::huge_page_vector<float> weights;
  edl::assign_on_huge_pages(weights, (std::size_t{512} << 20) / sizeof(float), 0.001f);
  constexpr std::size_t kLayerFloats = (std::size_t{28} << 20) / sizeof(float);  // small's layer: 28 MiB
  std::size_t w_off = 0;
  float w_sum = 0;
  std::vector<float> sums(static_cast<std::size_t>(threads));
  edl::exec::set_num_threads(threads);
  i64 seq = 0;
  for (auto _ : state) {
    const i64 base = seq * per_seq;
    seq = (seq + 1) % seqs;
    for (i64 l = 0; l < L; ++l) {
      state.PauseTiming();
      if (w_off + kLayerFloats > weights.size()) w_off = 0;
      edl::exec::parallel_parts(threads, [&](std::ptrdiff_t t) {  // on the team's threads, as the products
        float sum = 0;
        const std::size_t lo = w_off + kLayerFloats * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads),
                          hi = w_off + kLayerFloats * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
        for (std::size_t i = lo; i < hi; i += 16) sum += weights[i];  // a line at a time
        sums[static_cast<std::size_t>(t)] = sum;
      });
      w_sum += sums[0];
      w_off += kLayerFloats;
      state.ResumeTiming();
      edl::exec::parallel_for(0, G, 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
        for (std::ptrdiff_t h = lo; h < hi; ++h) {
          const i64 off = base + (l * G + h) * ctx * D;
          const edl::generate::StandardKVCache::HeadView view{k.data() + off, v.data() + off, D, D};
          edl::kernels::attend_row_head(view, ctx - 1, q.data() + h * D, out.data() + h * D, false, D, 0,
                                                 edl::kernels::SlotMap{}, scores.data() + h * ctx);
        }
      });
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::DoNotOptimize(w_sum);
    benchmark::ClobberMemory();
  }
  edl::exec::set_num_threads(0);
  state.counters["GB/s"] = benchmark::Counter(8e-9 * static_cast<double>(per_seq), benchmark::Counter::kIsIterationInvariantRate);
}

std::string shape_name(const Shape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

void register_all() {
  for (const Shape& s : kShapes) {
    for (int t : kThreads) {
      const std::string suffix = "/" + shape_name(s) + "/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(("gemm_f32/edl" + suffix).c_str(), bm_edl<float>, s, t, false)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
#ifdef EDL_HAVE_OPENBLAS
      benchmark::RegisterBenchmark(("gemm_f32/openblas" + suffix).c_str(), bm_openblas, s, t, false)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
#endif
    }
  }
  // The Linear-layer layout (y = x W^T, W stored [N,K]) and bf16 weights and activations.
  for (const Shape& s : {Shape{2048, 768, 768}, Shape{2048, 2048, 768}}) {
    for (int t : kThreads) {
      const std::string suffix = "/" + shape_name(s) + "/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(("gemm_nt_f32/edl" + suffix).c_str(), bm_edl<float>, s, t, true)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
#ifdef EDL_HAVE_OPENBLAS
      benchmark::RegisterBenchmark(("gemm_nt_f32/openblas" + suffix).c_str(), bm_openblas, s, t, true)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
#endif
      benchmark::RegisterBenchmark(("gemm_nt_bf16/edl" + suffix).c_str(), bm_edl<edl::bf16>, s, t, true)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  // Decode-time matrix-vector products (M = 1).
  for (const Shape& s : {Shape{1, 4096, 4096}, Shape{1, 32000, 768}}) {
    for (int t : kThreads) {
      const std::string suffix = "/" + shape_name(s) + "/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(("gemv_nt_f32/edl" + suffix).c_str(), bm_edl<float>, s, t, true)
          ->Unit(benchmark::kMicrosecond)->UseRealTime();
#ifdef EDL_HAVE_OPENBLAS
      benchmark::RegisterBenchmark(("gemv_nt_f32/openblas" + suffix).c_str(), bm_openblas, s, t, true)
          ->Unit(benchmark::kMicrosecond)->UseRealTime();
#endif
    }
  }
}

/// Decode kernels: the read pattern, the kernel at the K of tiny, small and gqa1b (hidden and
/// intermediate), then a step's products in three weight layouts, per thread count.
void register_decode() {
  for (int t : kThreads) {
    const std::string suffix = "/threads:" + std::to_string(t);
    benchmark::RegisterBenchmark(("matvec_f32/read_rows8" + suffix).c_str(), bm_read_rows8, t)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
    for (i64 K : {288, 768, 2048, 5632})
      benchmark::RegisterBenchmark(("matvec_f32/edl/K:" + std::to_string(K) + suffix).c_str(), bm_matvec, K, t)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
    for (i64 ctx : {256, 1024})
      for (const bool huge : {false, true})
        benchmark::RegisterBenchmark(("decode_attention/" + std::string(huge ? "huge_pages" : "4k_pages") +
                                      "/ctx:" + std::to_string(ctx) + suffix).c_str(),
                                     bm_decode_attention, huge, ctx, t)
            ->Unit(benchmark::kMicrosecond)->UseRealTime();
    for (const char* cfg : {"tiny", "small"})
      for (const auto& [name, layout] :
           {std::pair{"separate", Layout::separate}, std::pair{"separate_off16", Layout::separate_off16},
            std::pair{"per_layer", Layout::per_layer}, std::pair{"one_matrix", Layout::one_matrix}})
        benchmark::RegisterBenchmark(("matvec_f32/layers/" + std::string(cfg) + "/" + name + suffix).c_str(),
                                     bm_matvec_layers, cfg, layout, t)
            ->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  register_decode();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
