// edl/mesh/device_count.hpp
// How many devices this launch has: what a mesh axis of size -1 takes (EasyDeL's
// create_mesh((1, -1, 1, 1)) fills it with jax.device_count()). A process alone runs one
// device, and each rank of an MPI launch one, unless EDL_DEVICES names how many simulated
// devices the whole launch has (spread evenly over the ranks by launch_mesh).
//
//   EDL_DEVICES=4 edl train --config args.json        # sharding_axis_dims [1, -1, 1, 1]: fsdp = 4
//   mpirun -np 2 edl train --config args.json          # fsdp = 2, one device per rank
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <edl/core/error.hpp>

namespace edl {

/// Ranks announced by the launcher's environment (Open MPI, MPICH / PMI, PMIx), 1 when none.
inline int launcher_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}

/// The devices of this launch: EDL_DEVICES if set (a positive integer), else one per rank.
inline std::int64_t device_count() {
  const char* s = std::getenv("EDL_DEVICES");
  if (!s) return launcher_ranks();
  const std::string text(s);
  std::int64_t n = 0;
  bool ok = !text.empty() && text.size() <= 9;
  for (char c : text) {
    ok = ok && c >= '0' && c <= '9';
    if (ok) n = n * 10 + (c - '0');
  }
  EDL_CHECK(ok && n > 0, errc::invalid_argument, "EDL_DEVICES",
            "expected a positive number of devices, found \"", text, "\"");
  return n;
}

}  // namespace edl
