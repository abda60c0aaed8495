// examples/cli/bench_gemm.hpp: `edl bench gemm` times edl::gemm and OpenBLAS's cblas_sgemm
// (when built with EDL_HAVE_OPENBLAS) on one shape and prints one JSON line per implementation:
//   {"op":"gemm","m":2048,"n":768,"k":768,"threads":2,"dtype":"f32","impl":"edl","gflops":140.2,
//    "runs":[139.8,140.2,141.0]}
// --impl edl|openblas runs that library alone in this process: a warm-up (>= 0.3 s), then --repeat
// timed runs; gflops is their median and runs holds it alone.
// --impl both (the default) runs each library in processes of its own, --rounds of them per
// library, alternating (edl, openblas, edl, openblas, ...) so that both see the same machine
// load: each is this program exec'd anew as `bench gemm ... --impl X`, its line read from a
// pipe; runs lists the per-process medians, gflops is their median. Why processes: OpenBLAS's
// worker threads start when the library is loaded and spin (about 0.1 s) after that and after
// every call before they sleep, so in a process shared with edl they take a core from TBB's
// workers. Each edl process therefore gets OPENBLAS_NUM_THREADS=1 (OpenBLAS, linked but never
// called there, starts no worker), each OpenBLAS one OPENBLAS_NUM_THREADS=--threads; and a
// single-impl run warms up for at least 0.3 s, past that spin, before it times anything
// (docs/notes/2026-11-27-gemm-side-by-side.md). Without OpenBLAS in the build, both means edl
// alone.
// For --dtype bf16 or f16, edl multiplies the 16-bit matrices; OpenBLAS has no such sgemm, so
// it runs on f32 copies of the same values and its line carries a "note" saying so.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/gemm.hpp>
#include "args.hpp"

#ifdef EDL_HAVE_OPENBLAS
#include <cblas.h>
#endif

extern "C" char** environ;

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

inline double round2(double x) { return std::round(x * 100.0) / 100.0; }

struct Setup {
  std::int64_t m, n, k, threads, repeat;
  std::string dtype;
};

inline constexpr bool have_openblas =
#ifdef EDL_HAVE_OPENBLAS
    true;
#else
    false;
#endif

/// The JSON line of one implementation: today's fields, gflops the median of runs.
inline nlohmann::ordered_json line(const Setup& s, const std::string& impl, const std::vector<double>& runs) {
  nlohmann::ordered_json j;
  j["op"] = "gemm";
  j["m"] = s.m;
  j["n"] = s.n;
  j["k"] = s.k;
  j["threads"] = s.threads;
  j["dtype"] = s.dtype;
  j["impl"] = impl;
  if (impl == "openblas" && s.dtype != "f32") j["note"] = "cblas_sgemm on f32 copies of the " + s.dtype + " values";
  j["gflops"] = round2(median(runs));
  j["runs"] = runs;
  return j;
}

/// GFLOP/s of `impl` in this process: a warm-up, then the median of s.repeat timed runs.
inline double run_here(const Setup& s, const std::string& impl) {
  const std::int64_t m = s.m, n = s.n, k = s.k;
  // Values in [-1, 1); for bf16 and f16 the f32 copies hold exactly the rounded values.
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const bool bf = s.dtype == "bf16", half = s.dtype == "f16";
  const auto draw = [&] {
    const float x = dist(gen);
    return bf ? to_f32(bf16(x)) : half ? to_f32(f16(x)) : x;
  };
  std::vector<float> A(static_cast<std::size_t>(m * k)), B(static_cast<std::size_t>(k * n));
  for (auto& x : A) x = draw();
  for (auto& x : B) x = draw();
  std::vector<bf16> Ab, Bb;
  std::vector<f16> Ah, Bh;
  if (impl == "edl") {
    for (float x : A) bf ? Ab.push_back(bf16(x)) : half ? Ah.push_back(f16(x)) : void();
    for (float x : B) bf ? Bb.push_back(bf16(x)) : half ? Bh.push_back(f16(x)) : void();
  }
  std::vector<float> C(static_cast<std::size_t>(m * n));

  std::function<void()> run;
  if (impl == "edl") {
    exec::set_num_threads(static_cast<int>(s.threads));
    run = [&] {
      if (bf)
        gemm(Trans::no, Trans::no, m, n, k, 1.f, Ab.data(), k, Bb.data(), n, 0.f, C.data(), n);
      else if (half)
        gemm(Trans::no, Trans::no, m, n, k, 1.f, Ah.data(), k, Bh.data(), n, 0.f, C.data(), n);
      else
        gemm(Trans::no, Trans::no, m, n, k, 1.f, A.data(), k, B.data(), n, 0.f, C.data(), n);
    };
  }
#ifdef EDL_HAVE_OPENBLAS
  if (impl == "openblas") {
    openblas_set_num_threads(static_cast<int>(s.threads));
    run = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), 1.f, A.data(), static_cast<int>(k), B.data(), static_cast<int>(n), 0.f,
                  C.data(), static_cast<int>(n));
    };
  }
#endif
  // Warm-up: thread pools, packing buffers, page faults, and at least 0.3 s so that OpenBLAS's
  // worker threads (started when the library loads, spinning ~0.1 s before they sleep) are idle
  // before the first timed run, whatever OPENBLAS_NUM_THREADS says.
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  do run();
  while (std::chrono::steady_clock::now() < warm_until);
  std::vector<double> times;
  for (std::int64_t r = 0; r < s.repeat; ++r) times.push_back(seconds(run));
  if (impl == "edl") exec::set_num_threads(0);
  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  return round2(flop / median(times) / 1e9);
}

/// GFLOP/s of `impl` measured by a child process: this executable exec'd anew (so it inherits
/// no thread pool) as `bench gemm ... --impl impl`, its JSON line read from a pipe.
inline double run_child(const Setup& s, const std::string& impl) {
  const std::string where = "edl bench gemm";
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::vector<std::string> arg_strings = {self.empty() ? std::string("edl") : self,
                                          "bench", "gemm",
                                          "--m", std::to_string(s.m),
                                          "--n", std::to_string(s.n),
                                          "--k", std::to_string(s.k),
                                          "--threads", std::to_string(s.threads),
                                          "--dtype", s.dtype,
                                          "--repeat", std::to_string(s.repeat),
                                          "--impl", impl};
  // The environment, without a launcher's rank count (the child is no MPI rank) and with
  // OpenBLAS's pool sized for the child: none in an edl process, --threads in an OpenBLAS one.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view v(*e);
    bool drop = false;
    for (std::string_view name : {"OMPI_COMM_WORLD_SIZE=", "PMI_SIZE=", "PMIX_SIZE=", "OPENBLAS_NUM_THREADS="})
      drop = drop || v.substr(0, name.size()) == name;
    if (!drop) env_strings.emplace_back(v);
  }
  env_strings.push_back("OPENBLAS_NUM_THREADS=" + (impl == "edl" ? std::string("1") : std::to_string(s.threads)));
  std::vector<char*> argv, envp;
  for (auto& a : arg_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  int fds[2];
  EDL_CHECK(::pipe2(fds, O_CLOEXEC) == 0, errc::io, where, "cannot create a pipe: ", std::strerror(errno));
  std::cout.flush();
  const pid_t pid = ::fork();
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    ::dup2(fds[1], STDOUT_FILENO);
    ::execve("/proc/self/exe", argv.data(), envp.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    EDL_CHECK(false, errc::io, where, "cannot start a process for --impl ", impl, ": ", std::strerror(fork_errno));
  }
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got > 0) out.append(buf, static_cast<std::size_t>(got));
    else if (got == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  EDL_CHECK(!WIFSIGNALED(status), errc::io, where, "the --impl ", impl, " process was killed by signal ",
            WTERMSIG(status));
  EDL_CHECK(WEXITSTATUS(status) != 127, errc::io, where, "the --impl ", impl, " process could not start ",
            self.empty() ? std::string("/proc/self/exe") : self);
  EDL_CHECK(WEXITSTATUS(status) == 0, errc::io, where, "the --impl ", impl, " process failed with exit code ",
            WEXITSTATUS(status), " (its error is above)");
  // Its last non-empty line.
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  const std::string last = out.substr(out.find_last_of('\n') == std::string::npos ? 0 : out.find_last_of('\n') + 1);
  const auto j = nlohmann::json::parse(last, nullptr, false);
  EDL_CHECK(!j.is_discarded() && j.is_object() && j.contains("gflops") && j["gflops"].is_number(), errc::format,
            where, "the --impl ", impl, " process printed no JSON line with \"gflops\": \"", last, "\"");
  return j["gflops"].get<double>();
}

}  // namespace bench_gemm_detail

/// edl bench gemm --m M --n N --k K [--threads T] [--dtype f32|bf16|f16] [--repeat R]
///                [--impl edl|openblas|both] [--rounds N]
inline int cmd_bench_gemm(Args& args) {
  namespace d = bench_gemm_detail;
  const std::int64_t m = args.integer("--m", 1024), n = args.integer("--n", 1024), k = args.integer("--k", 1024);
  const std::int64_t threads = args.integer("--threads", exec::num_threads());
  const std::string dtype = args.str("--dtype", "f32");
  const std::int64_t repeat = args.integer("--repeat", 5);
  const std::string impl = args.str("--impl", "both");
  const bool rounds_given = args.has("--rounds");
  const std::int64_t rounds = args.integer("--rounds", 3);
  args.finish();
  const std::string where = "edl bench gemm";
  EDL_CLI_USAGE_CHECK(m > 0 && n > 0 && k > 0, errc::invalid_argument, where, "--m, --n and --k must be > 0, found m = ", m,
                      ", n = ", n, ", k = ", k);
  EDL_CLI_USAGE_CHECK(threads > 0, errc::invalid_argument, where, "--threads must be > 0, found ", threads);
  EDL_CLI_USAGE_CHECK(repeat > 0, errc::invalid_argument, where, "--repeat must be > 0, found ", repeat);
  EDL_CLI_USAGE_CHECK(dtype == "f32" || dtype == "bf16" || dtype == "f16", errc::invalid_argument, where,
                      "--dtype must be f32, bf16 or f16, found \"", dtype, "\"");
  EDL_CLI_USAGE_CHECK(impl == "edl" || impl == "openblas" || impl == "both", errc::invalid_argument, where,
                      "--impl must be edl, openblas or both, found \"", impl, "\"");
  EDL_CHECK(impl != "openblas" || d::have_openblas, errc::unsupported, where,
            "--impl openblas: this edl was built without OpenBLAS (libopenblas-dev was not found at build time); "
            "use --impl edl");
  EDL_CLI_USAGE_CHECK(rounds > 0, errc::invalid_argument, where, "--rounds must be > 0, found ", rounds);
  EDL_CLI_USAGE_CHECK(impl == "both" || !rounds_given, errc::invalid_argument, where,
                      "--rounds counts the processes of --impl both; --impl ", impl, " runs in this process, once");
  const d::Setup s{m, n, k, threads, repeat, dtype};

  if (impl != "both") {
    std::cout << d::line(s, impl, {d::run_here(s, impl)}).dump() << "\n";
    return 0;
  }
  std::vector<std::string> impls = {"edl"};
  if (d::have_openblas) impls.push_back("openblas");
  std::vector<std::vector<double>> runs(impls.size());
  for (std::int64_t r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < impls.size(); ++i) runs[i].push_back(d::run_child(s, impls[i]));
  for (std::size_t i = 0; i < impls.size(); ++i) std::cout << d::line(s, impls[i], runs[i]).dump() << "\n";
  return 0;
}

inline Command bench_gemm_command() {
  return {.name = "bench gemm",
          .group = "measuring",
          .summary = "time edl::gemm (and OpenBLAS's sgemm beside it when built with it) on one shape: GFLOP/s",
          .synopsis = "[--m M] [--n N] [--k K] [--threads T] [--dtype f32|bf16|f16] [--impl edl|openblas|both] [flags]",
          .flags = {integer_flag("--m", "M", "rows of A and C").defaults("1024"),
                    integer_flag("--n", "N", "columns of B and C").defaults("1024"),
                    integer_flag("--k", "K", "columns of A, rows of B").defaults("1024"),
                    integer_flag("--threads", "T", "threads of the product").defaults("all cores"),
                    text_flag("--dtype", "", "element type of A and B").one_of({"f32", "bf16", "f16"}).defaults("f32"),
                    integer_flag("--repeat", "R", "timed runs after the warm-up, in each process").defaults("5"),
                    text_flag("--impl", "", "the library timed; both: each in processes of its own, alternating")
                        .one_of({"edl", "openblas", "both"})
                        .defaults("both"),
                    integer_flag("--rounds", "N", "processes per library of --impl both").defaults("3")},
          .examples = {"edl bench gemm --m 2048 --n 768 --k 768 --threads 2",
                       "edl bench gemm --m 1024 --n 1024 --k 1024 --dtype bf16 --impl edl"},
          .run = cmd_bench_gemm};
}

}  // namespace edl::cli
