// examples/cli/info.hpp: `edl info` prints version, SIMD architecture, threads, compiler and
// peak_f32_gflops, the f32 FMA peak of all kernel threads (kernels::measure_peak, the
// trainer's MFU denominator; measuring it makes `edl info` take about a second).
#pragma once

#include <cmath>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>
#include <xsimd/xsimd.hpp>

#include <edl/edl.hpp>
#include <edl/kernels/peak.hpp>
#include "args.hpp"

namespace edl::cli {

inline int cmd_info(Args& args) {
  args.finish();
  nlohmann::json j;
  j["version"] = EDL_VERSION_STRING;
  j["xsimd_arch"] = xsimd::default_arch::name();
  j["simd_width_f32"] = xsimd::batch<float>::size;
  j["tbb_threads"] = edl::exec::num_threads();
  j["peak_f32_gflops"] = std::round(kernels::measure_peak(edl::exec::num_threads()).f32_gflops * 10.0) / 10.0;
#if defined(__clang__)
  j["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  j["compiler"] = std::string("gcc ") + __VERSION__;
#endif
  std::cout << j.dump() << "\n";
  return 0;
}

inline Command info_command() {
  return {.name = "info",
          .group = "measuring",
          .summary = "version, SIMD architecture, threads, compiler and the f32 FMA peak of this machine (about 1 s)",
          .synopsis = "",
          .examples = {"edl info"},
          .run = cmd_info};
}

}  // namespace edl::cli
