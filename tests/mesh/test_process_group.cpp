// Tests for edl/mesh/process_group.hpp on one process: node_ranks (EasyDeL's
// get_ranks_and_size) against its formula by hand, and a one-process group. The agreements
// between processes and the node groups under mpirun are tested in tests/mpi.
#include <gtest/gtest.h>

#include <edl/mesh/process_group.hpp>

namespace edl {
namespace {

TEST(ProcessGroup, NodeRanksFollowEasyDeLsFormula) {
  // 8 processes of one device each, tp x sp = 4: nodes of 4 processes, 2 of them.
  EXPECT_EQ(node_ranks(4, 1, 8, 5), (NodeRanks{4, 2, 1, 1}));
  EXPECT_EQ(node_ranks(4, 1, 8, 3), (NodeRanks{4, 2, 3, 0}));
  // Two devices per process: a tp = 4 group spans 2 processes.
  EXPECT_EQ(node_ranks(4, 2, 4, 3), (NodeRanks{2, 2, 1, 1}));
  // A process holds whole model-parallel groups: every process is a node of its own.
  EXPECT_EQ(node_ranks(2, 4, 2, 1), (NodeRanks{1, 2, 0, 1}));
  EXPECT_EQ(node_ranks(1, 1, 1, 0), NodeRanks{});
  EXPECT_THROW(node_ranks(4, 1, 8, 8), Error);   // rank outside the launch
  EXPECT_THROW(node_ranks(0, 1, 8, 0), Error);   // no model-parallel devices
  EXPECT_THROW(node_ranks(4, 1, 6, 0), Error);   // 6 processes do not make nodes of 4
}

TEST(ProcessGroup, OneProcessIsItsOwnNode) {
  EXPECT_EQ(ProcessGroup().node_ranks(), NodeRanks{});
  const ProcessGroup pg(create_mesh({1, 1, 2, 2}));  // a simulated mesh: every device here
  EXPECT_EQ(pg.size(), 1);
  EXPECT_EQ(pg.node_ranks(), NodeRanks{});
  EXPECT_EQ(pg.each(7), (std::vector<std::int64_t>{7}));
}

}  // namespace
}  // namespace edl
