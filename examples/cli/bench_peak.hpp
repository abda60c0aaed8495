// examples/cli/bench_peak.hpp: `edl bench peak` measures the machine's arithmetic peak on
// --threads threads (kernels::measure_peak: register-only chains of fused multiply-adds, no
// memory traffic, best of several trials) and prints one JSON line:
//   {"threads":2,"f32_gflops":519.6,"bf16_gflops":960.9,"int8_gops":2097.6}
// bf16_gflops (AVX-512 BF16) and int8_gops (AVX-512 VNNI or AVX-VNNI) are null when the
// binary was built for a CPU without those instructions. It is the ceiling that the other
// benchmarks' GFLOP/s (bench gemm, the trainer's MFU) are read against: what these cores can
// issue, not what a datasheet promises.
#pragma once

#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/kernels/peak.hpp>
#include "args.hpp"

namespace edl::cli {

/// edl bench peak [--threads T]
inline int cmd_bench_peak(Args& args) {
  const std::int64_t threads = args.integer("--threads", exec::num_threads());
  args.finish();
  EDL_CLI_USAGE_CHECK(threads > 0 && threads <= 4096, errc::invalid_argument, "edl bench peak",
                      "--threads must be between 1 and 4096, found ", threads);
  const kernels::PeakResult r = kernels::measure_peak(static_cast<int>(threads));
  auto rounded = [](double x) { return std::round(x * 10.0) / 10.0; };
  auto optional = [&](const std::optional<double>& x) { return x ? nlohmann::json(rounded(*x)) : nlohmann::json(nullptr); };
  nlohmann::ordered_json j;
  j["threads"] = threads;
  j["f32_gflops"] = rounded(r.f32_gflops);
  j["bf16_gflops"] = optional(r.bf16_gflops);
  j["int8_gops"] = optional(r.int8_gops);
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command bench_peak_command() {
  return {.name = "bench peak",
          .group = "measuring",
          .summary = "the machine's f32, bf16 and int8 fused multiply-add peak (the ceiling of the other figures)",
          .synopsis = "[--threads T]",
          .flags = {integer_flag("--threads", "T", "threads measured together").defaults("all cores")},
          .examples = {"edl bench peak", "edl bench peak --threads 1"},
          .run = cmd_bench_peak};
}

}  // namespace edl::cli
