// The MPI session of the test executable (main() in test_mpi_collectives.cpp starts it).
#pragma once

#include <edl/mesh/backends/mpi.hpp>

namespace edl::test {
inline mpi::Session* g_session = nullptr;
}  // namespace edl::test
