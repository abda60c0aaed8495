// edl/mesh/launch.hpp
// How this process was started: alone, or as one rank of an MPI launch. A program written for
// one process runs unchanged under `mpirun -np N`: it starts its launch first, builds its
// meshes with launch_mesh (which spreads the devices over the ranks), and lets rank 0 alone
// print and write files.
//
//   int main(int argc, char** argv) {
//     edl::start_launch(argc, argv);             // MPI_Init when mpirun started several ranks
//     auto mesh = edl::launch_mesh({1, 2, 1, 2, 1});  // 4 devices: all here, or 4 / N per rank
//     ...
//     if (edl::launch().is_primary()) save(...);
//   }
//
// The ranks are read from the launcher's environment (Open MPI, MPICH / PMI, PMIx), so a
// program launched alone never touches MPI. An edl built without MPI refuses a launch of
// several ranks instead of running the same work N times.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <edl/core/error.hpp>
#include <edl/mesh/device_count.hpp>
#include <edl/mesh/mesh.hpp>

#ifdef EDL_WITH_MPI
#include <edl/mesh/backends/mpi.hpp>
#endif

namespace edl {

/// This process's place in its launch: rank `rank` of `ranks` (0 of 1 when launched alone).
struct Launch {
  int rank = 0, ranks = 1;
#ifdef EDL_WITH_MPI
  std::unique_ptr<mpi::Session> session;
#endif
  /// Whether this process prints results and writes output files (rank 0).
  bool is_primary() const noexcept { return rank == 0; }
};

/// The process's launch (one rank until start_launch found more).
inline Launch& launch() {
  static Launch l;
  return l;
}


/// Starts MPI when the launcher started more than one rank; alone, does nothing. Call it once,
/// first thing in main (MPI may take its own arguments out of argv).
inline void start_launch(int& argc, char**& argv) {
  const int n = launcher_ranks();
  if (n <= 1) return;
#ifdef EDL_WITH_MPI
  launch().session = std::make_unique<mpi::Session>(argc, argv);
  launch().rank = launch().session->rank();
  launch().ranks = launch().session->size();
#else
  (void)argc;
  (void)argv;
  throw Error(errc::unsupported, "edl", "launched on " + std::to_string(n) +
                                           " MPI ranks, but this edl was built without MPI (install libopenmpi-dev and rebuild)");
#endif
}

/// The mesh of `dims` (an axis of -1 takes device_count()); under a launch of several ranks
/// its devices are spread over them (checked before any work: the device count must be a
/// multiple of the ranks). `source` names where the sizes came from, for the error.
inline DefaultMesh launch_mesh(const MeshDims& dims, const std::string& source = "mesh") {
  DefaultMesh mesh = create_mesh(dims);
  const int ranks = launch().ranks;
  if (ranks > 1) {
    EDL_CHECK(mesh.size() % ranks == 0, errc::invalid_argument, source, "the mesh ", mesh.shape().axes_str(), " has ",
              mesh.size(), " devices, which the ", ranks, " MPI ranks of this launch cannot share evenly (give a mesh of ",
              ranks, " x devices-per-rank)");
#ifdef EDL_WITH_MPI
    mpi::attach(mesh, *launch().session, static_cast<int>(mesh.size() / ranks));
#endif
  }
  return mesh;
}

/// After this rank failed (its error already printed): ends every rank of the launch with
/// `code`. The others may be waiting in a collective for this one, and MPI_Finalize waits for
/// every rank, so returning from main could hang the job. A rank other than 0 first gives
/// rank 0 a moment to print its own view of the failure. Alone, does nothing.
inline void abort_launch(int code) {
#ifdef EDL_WITH_MPI
  if (launch().ranks <= 1 || !launch().session) return;
  std::fflush(stderr);
  if (!launch().is_primary()) std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Abort(launch().session->comm(), code);
#else
  (void)code;
#endif
}

}  // namespace edl
