// Tests for edl/mesh/launch.hpp: what a process launched alone (or, in an edl built without
// MPI, by mpirun) gets.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <edl/mesh/launch.hpp>

#include "../support/scoped_env.hpp"

using edl::test_support::ScopedEnv;

TEST(Launch, AloneIsRankZeroOfOneAndItsMeshesAreLocal) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), c("PMIX_SIZE", nullptr);
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  edl::start_launch(argc, argv);
  EXPECT_EQ(argc, 1);
  EXPECT_EQ(edl::launch().rank, 0);
  EXPECT_EQ(edl::launch().ranks, 1);
  EXPECT_TRUE(edl::launch().is_primary());
  const edl::DefaultMesh mesh = edl::launch_mesh({1, 2, 1, 2, 1});
  EXPECT_EQ(mesh.size(), 4);
  EXPECT_EQ(mesh.backend().processes(), 1);
  EXPECT_EQ(mesh.axis_size("fsdp"), 2);
  EXPECT_EQ(mesh.axis_size("tp"), 2);
  edl::abort_launch(1);  // alone: nothing to end
}

#ifndef EDL_WITH_MPI
TEST(Launch, ABuildWithoutMpiRefusesSeveralRanks) {
  ScopedEnv s("OMPI_COMM_WORLD_SIZE", "2");
  int argc = 1;
  char name[] = "test";
  char* args[] = {name, nullptr};
  char** argv = args;
  try {
    edl::start_launch(argc, argv);
    FAIL() << "expected an error";
  } catch (const edl::Error& e) {
    EXPECT_EQ(e.code(), edl::errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("2 MPI ranks"), std::string::npos) << e.what();
  }
  EXPECT_EQ(edl::launch().ranks, 1);
}
#endif
