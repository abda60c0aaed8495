// examples/cli/bench_gemm.hpp: `edl bench gemm` times edl::gemm (and OpenBLAS's cblas_sgemm
// when built with EDL_HAVE_OPENBLAS) on one shape and prints one JSON line per implementation:
//   {"op":"gemm","m":2048,"n":768,"k":768,"threads":2,"dtype":"f32","impl":"edl","gflops":140.2}
// gflops is the median of --repeat timed runs after one warm-up run. Implementations run
// interleaved (edl, openblas, edl, ...) so both see the same machine load.
// For --dtype bf16, edl multiplies the bf16 matrices; OpenBLAS has no bf16 sgemm, so it runs
// on f32 copies of the same values and its line carries a "note" saying so.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/gemm.hpp>
#include "args.hpp"

#ifdef EDL_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace edl::cli {

namespace bench_gemm_detail {

inline double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace bench_gemm_detail

/// edl bench gemm --m M --n N --k K [--threads T] [--dtype f32|bf16] [--repeat R]
inline int cmd_bench_gemm(Args& args) {
  namespace d = bench_gemm_detail;
  const std::int64_t m = args.integer("--m", 1024), n = args.integer("--n", 1024), k = args.integer("--k", 1024);
  const std::int64_t threads = args.integer("--threads", exec::num_threads());
  const std::string dtype = args.str("--dtype", "f32");
  const std::int64_t repeat = args.integer("--repeat", 5);
  args.finish();
  const std::string where = "edl bench gemm";
  EDL_CHECK(m > 0 && n > 0 && k > 0, errc::invalid_argument, where, "--m, --n and --k must be > 0, found m = ", m,
            ", n = ", n, ", k = ", k);
  EDL_CHECK(threads > 0, errc::invalid_argument, where, "--threads must be > 0, found ", threads);
  EDL_CHECK(repeat > 0, errc::invalid_argument, where, "--repeat must be > 0, found ", repeat);
  EDL_CHECK(dtype == "f32" || dtype == "bf16", errc::invalid_argument, where,
            "--dtype must be f32 or bf16, found \"", dtype, "\"");

  // Values in [-1, 1); for bf16 the f32 copies hold exactly the bf16-rounded values.
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const bool bf = dtype == "bf16";
  std::vector<float> A(static_cast<std::size_t>(m * k)), B(static_cast<std::size_t>(k * n));
  for (auto& x : A) x = bf ? to_f32(bf16(dist(gen))) : dist(gen);
  for (auto& x : B) x = bf ? to_f32(bf16(dist(gen))) : dist(gen);
  std::vector<bf16> Ab, Bb;
  if (bf) {
    Ab.reserve(A.size());
    Bb.reserve(B.size());
    for (float x : A) Ab.push_back(bf16(x));
    for (float x : B) Bb.push_back(bf16(x));
  }
  std::vector<float> C(static_cast<std::size_t>(m * n));

  struct Impl {
    std::string name, note;
    std::function<void()> run;
    std::vector<double> times;
  };
  std::vector<Impl> impls;
  impls.push_back({"edl", "", [&] {
                     if (bf)
                       gemm(Trans::no, Trans::no, m, n, k, 1.f, Ab.data(), k, Bb.data(), n, 0.f, C.data(), n);
                     else
                       gemm(Trans::no, Trans::no, m, n, k, 1.f, A.data(), k, B.data(), n, 0.f, C.data(), n);
                   }, {}});
#ifdef EDL_HAVE_OPENBLAS
  openblas_set_num_threads(static_cast<int>(threads));
  impls.push_back({"openblas", bf ? "cblas_sgemm on f32 copies of the bf16 values" : "", [&] {
                     cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                                 static_cast<int>(n), static_cast<int>(k), 1.f, A.data(), static_cast<int>(k),
                                 B.data(), static_cast<int>(n), 0.f, C.data(), static_cast<int>(n));
                   }, {}});
#endif

  exec::set_num_threads(static_cast<int>(threads));
  for (auto& impl : impls) impl.run();  // warm-up: thread pools, packing buffers, page faults
  for (std::int64_t r = 0; r < repeat; ++r)
    for (auto& impl : impls) impl.times.push_back(d::seconds(impl.run));
  exec::set_num_threads(0);

  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  for (const auto& impl : impls) {
    nlohmann::ordered_json j;
    j["op"] = "gemm";
    j["m"] = m;
    j["n"] = n;
    j["k"] = k;
    j["threads"] = threads;
    j["dtype"] = dtype;
    j["impl"] = impl.name;
    if (!impl.note.empty()) j["note"] = impl.note;
    j["gflops"] = std::round(flop / d::median(impl.times) / 1e9 * 100.0) / 100.0;
    std::cout << j.dump() << "\n";
  }
  return 0;
}

}  // namespace edl::cli
