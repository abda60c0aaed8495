// Tests for edl/mesh/device_count.hpp: the launcher's rank count, the launch's device count
// (EDL_DEVICES, else one per rank), and the mesh axis of -1 that takes it (create_mesh,
// infer_mesh_dims in mesh.hpp).
#include <gtest/gtest.h>

#include <string>

#include <edl/mesh/device_count.hpp>
#include <edl/mesh/mesh.hpp>

#include "../support/scoped_env.hpp"

using edl::test_support::ScopedEnv;

namespace {

edl::errc code_of(auto&& f) {
  try {
    f();
  } catch (const edl::Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "expected an edl::Error";
  return edl::errc::unsupported;
}

}  // namespace

TEST(Launch, LauncherRanksComeFromTheLaunchersEnvironment) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), c("PMIX_SIZE", nullptr);
  EXPECT_EQ(edl::launcher_ranks(), 1);
  {
    ScopedEnv s("PMI_SIZE", "3");
    EXPECT_EQ(edl::launcher_ranks(), 3);
  }
  {
    ScopedEnv s("OMPI_COMM_WORLD_SIZE", "4");
    EXPECT_EQ(edl::launcher_ranks(), 4);
  }
  ScopedEnv s("PMIX_SIZE", "0");  // nonsense counts as one rank
  EXPECT_EQ(edl::launcher_ranks(), 1);
}

TEST(DeviceCount, IsEdlDevicesElseOnePerRank) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), c("PMIX_SIZE", nullptr);
  ScopedEnv none("EDL_DEVICES", nullptr);
  EXPECT_EQ(edl::device_count(), 1);
  {
    ScopedEnv ranks("OMPI_COMM_WORLD_SIZE", "4");
    EXPECT_EQ(edl::device_count(), 4);
    ScopedEnv devices("EDL_DEVICES", "8");  // two simulated devices per rank
    EXPECT_EQ(edl::device_count(), 8);
  }
  for (const char* bad : {"", "0", "-2", "four", "3x", "9999999999"}) {
    ScopedEnv devices("EDL_DEVICES", bad);
    try {
      (void)edl::device_count();
      ADD_FAILURE() << "accepted EDL_DEVICES=\"" << bad << "\"";
    } catch (const edl::Error& e) {
      EXPECT_EQ(e.code(), edl::errc::invalid_argument);
      EXPECT_EQ(e.where(), "EDL_DEVICES");
    }
  }
}

// EasyDeL's create_mesh((1, -1, 1, 1)): the -1 axis takes the devices left over.
TEST(DeviceCount, MinusOneAxisTakesTheDevicesLeftOver) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), c("PMIX_SIZE", nullptr);
  {
    ScopedEnv devices("EDL_DEVICES", "6");
    EXPECT_EQ(edl::create_mesh({1, -1, 1, 1}).axis_size("fsdp"), 6);
    const auto m = edl::create_mesh({2, -1, 1, 1});
    EXPECT_EQ(m.size(), 6);
    EXPECT_EQ(m.axis_size("fsdp"), 3);
    EXPECT_EQ(edl::infer_mesh_dims({1, 1, 1, 3, -1}), (edl::MeshDims{1, 1, 1, 3, 2}));
    EXPECT_EQ(edl::infer_mesh_dims({1, 2, 1, 1, 1}), (edl::MeshDims{1, 2, 1, 1, 1}));  // nothing to infer
    EXPECT_EQ(code_of([] { (void)edl::create_mesh({4, -1, 1, 1}); }), edl::errc::not_divisible);
    EXPECT_EQ(edl::create_mesh({1, -1, 1, 1}, 4).axis_size("fsdp"), 4);  // a count given wins
  }
  ScopedEnv none("EDL_DEVICES", nullptr);
  EXPECT_EQ(edl::create_mesh({1, -1, 1, 1}).size(), 1);  // a process alone runs one device
}
