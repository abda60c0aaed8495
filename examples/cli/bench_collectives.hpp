// examples/cli/bench_collectives.hpp: `edl bench collectives` times each collective of the
// mesh's backend (the simulated one: devices are threads of this process) on a 1-D mesh of
// --devices devices and prints one JSON line per op:
//   {"op":"all_reduce","devices":8,"bytes":1048576,"gbps":2.1,"algbw_gbps":1.2,"us":870.3,...}
// Sizes and bandwidths follow nccl-tests (docs/mesh.md): `bytes` is the buffer size S of the
// op (all_reduce, broadcast, ppermute, all_to_all: each device's buffer; all_gather: the
// gathered output; reduce_scatter: the input), us the mean time of one call, algbw = S / us
// and gbps the bus bandwidth algbw * factor, factor = 2(n-1)/n for all_reduce, (n-1)/n for
// all_gather, reduce_scatter and all_to_all, 1 for broadcast and ppermute (a ring shift),
// GB = 1e9 bytes. Each op runs inside one mesh.run(): one warm-up call, a barrier, --repeat
// timed calls, a barrier; device 0 reads the clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/mesh/all.hpp>
#include "args.hpp"

namespace edl::cli {

namespace bench_collectives_detail {

/// "1048576", "1K", "64M", "1G", "64MiB" -> bytes (K, M, G are powers of 1024).
inline std::int64_t parse_bytes(const std::string& s, const std::string& where) {
  std::size_t pos = 0;
  long long v = 0;
  try { v = std::stoll(s, &pos); } catch (...) { pos = 0; }
  EDL_CLI_USAGE_CHECK(pos > 0, errc::invalid_argument, where, "--bytes expects a size like 1024, 1K, 1M or 64MiB, found \"",
                      s, "\"");
  std::string unit = s.substr(pos);
  if (unit.size() == 3 && unit.substr(1) == "iB") unit = unit.substr(0, 1);
  std::int64_t mul = 1;
  if (unit == "K" || unit == "k") mul = 1024;
  else if (unit == "M" || unit == "m") mul = 1024 * 1024;
  else if (unit == "G" || unit == "g") mul = 1024 * 1024 * 1024;
  else EDL_CLI_USAGE_CHECK(unit.empty() || unit == "B", errc::invalid_argument, where, "--bytes: unknown unit \"", unit,
                           "\" in \"", s, "\", expected K, M or G");
  return v * mul;
}

/// x rounded to 4 significant digits, so the JSON stays readable.
inline double sig4(double x) {
  if (!(x > 0)) return x;
  const double p = std::pow(10.0, 3 - std::floor(std::log10(x)));
  return std::round(x * p) / p;
}

template <class T>
std::vector<nlohmann::ordered_json> run_all(std::int64_t devices, std::int64_t bytes, std::int64_t repeat, const std::string& dtype) {
  auto mesh = create_mesh({1, devices, 1, 1});
  const auto n = static_cast<std::size_t>(devices);
  const std::size_t es = sizeof(T);
  // Element count of the op's buffer S, rounded down to a multiple of the device count.
  const std::size_t count = static_cast<std::size_t>(bytes) / es / n * n;
  EDL_CLI_USAGE_CHECK(count > 0, errc::invalid_argument, "edl bench collectives", "--bytes ", bytes, " is less than one ", dtype,
                      " element per device (", n * es, " bytes)");
  const std::size_t chunk = count / n;
  const auto ring = shift_pairs(devices, 1);

  struct Op {
    const char* name;
    double factor;  // bus bandwidth / algorithm bandwidth
    std::size_t in, out;  // elements per device
    std::function<void(Device&, std::span<T>, std::span<T>)> call;
  };
  const double k = static_cast<double>(n - 1) / static_cast<double>(n);
  const std::vector<Op> ops = {
      {"all_reduce", 2 * k, count, count, [](Device& d, std::span<T> in, std::span<T>) { psum(d, in, "fsdp"); }},
      {"all_gather", k, chunk, count, [](Device& d, std::span<T> in, std::span<T> out) { all_gather(d, in, out, "fsdp"); }},
      {"reduce_scatter", k, count, chunk,
       [](Device& d, std::span<T> in, std::span<T> out) { reduce_scatter(d, in, out, "fsdp"); }},
      {"all_to_all", k, count, count, [](Device& d, std::span<T> in, std::span<T> out) { all_to_all(d, in, out, "fsdp"); }},
      {"ppermute", 1.0, count, count,
       [&ring](Device& d, std::span<T> in, std::span<T> out) { ppermute(d, in, out, "fsdp", ring); }},
      {"broadcast", 1.0, count, count, [](Device& d, std::span<T> in, std::span<T>) { broadcast(d, in, 0, "fsdp"); }},
  };

  std::vector<nlohmann::ordered_json> lines;
  for (const Op& op : ops) {
    double seconds = 0;
    mesh.run([&](Device& dev) {
      std::vector<T> in(op.in, from_f32<T>(1.0f / static_cast<float>(dev.id() + 1))), out(op.out);
      op.call(dev, in, out);  // warm-up: first touch of the buffers, scratch allocation
      barrier(dev);
      const auto t0 = std::chrono::steady_clock::now();
      for (std::int64_t r = 0; r < repeat; ++r) op.call(dev, in, out);
      barrier(dev);
      if (dev.id() == 0) seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    const double t = seconds / static_cast<double>(repeat);
    const double S = static_cast<double>(count * es);
    nlohmann::ordered_json j;
    j["op"] = op.name;
    j["devices"] = devices;
    j["bytes"] = static_cast<std::int64_t>(count * es);
    j["gbps"] = sig4(S / t * op.factor / 1e9);
    j["algbw_gbps"] = sig4(S / t / 1e9);
    j["us"] = sig4(t * 1e6);
    j["repeat"] = repeat;
    j["dtype"] = dtype;
    j["backend"] = std::string(mesh.backend().name());
    lines.push_back(std::move(j));
  }
  return lines;
}

}  // namespace bench_collectives_detail

/// edl bench collectives --devices D --bytes B [--repeat R] [--dtype f32|bf16]
inline int cmd_bench_collectives(Args& args) {
  namespace d = bench_collectives_detail;
  const std::string where = "edl bench collectives";
  const std::int64_t devices = args.integer("--devices", 8);
  const std::int64_t bytes = d::parse_bytes(args.str("--bytes", "1M"), where);
  const std::int64_t repeat_flag = args.integer("--repeat", 0);
  const std::string dtype = args.str("--dtype", "f32");
  args.finish();
  EDL_CLI_USAGE_CHECK(devices > 0 && devices <= 256, errc::invalid_argument, where, "--devices must be in 1..256, found ", devices);
  EDL_CLI_USAGE_CHECK(bytes > 0, errc::invalid_argument, where, "--bytes must be > 0, found ", bytes);
  EDL_CLI_USAGE_CHECK(repeat_flag >= 0, errc::invalid_argument, where, "--repeat must be > 0, found ", repeat_flag);
  EDL_CLI_USAGE_CHECK(dtype == "f32" || dtype == "bf16", errc::invalid_argument, where, "--dtype must be f32 or bf16, found \"",
                      dtype, "\"");
  // Default: about 256 MiB moved per op, between 5 and 1000 calls.
  const std::int64_t repeat = repeat_flag > 0 ? repeat_flag : std::clamp<std::int64_t>((std::int64_t{1} << 28) / bytes, 5, 1000);
  const auto lines = dtype == "f32" ? d::run_all<float>(devices, bytes, repeat, dtype)
                                    : d::run_all<bf16>(devices, bytes, repeat, dtype);
  for (const auto& j : lines) std::cout << j.dump() << std::endl;
  return 0;
}

inline Command bench_collectives_command() {
  return {.name = "bench collectives",
          .group = "measuring",
          .summary = "time each collective of the simulated mesh backend: bus bandwidth as nccl-tests reports it",
          .synopsis = "[--devices D] [--bytes B] [--repeat R] [--dtype f32|bf16]",
          .flags = {integer_flag("--devices", "D", "devices of the 1-D mesh (threads of this process), 1..256").defaults("8"),
                    text_flag("--bytes", "B", "the buffer size of each op: 1024, 64K, 1M, 1G or 64MiB").defaults("1M"),
                    integer_flag("--repeat", "R", "timed calls per op").defaults("about 256 MiB moved, 5..1000 calls"),
                    text_flag("--dtype", "", "element type").one_of({"f32", "bf16"}).defaults("f32")},
          .examples = {"edl bench collectives --devices 8 --bytes 1M", "edl bench collectives --devices 4 --bytes 64M --repeat 20"},
          .run = cmd_bench_collectives};
}

}  // namespace edl::cli
