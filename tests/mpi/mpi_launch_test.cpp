// World and the config-consistency check under mpirun.
#include <gtest/gtest.h>

#include "tests/mpi/mpi_test_util.h"

namespace mt::parallel {
namespace {

using testing::mpi_world;

TEST(MpiLaunch, OneNodeWorldHasLocalRankEqualToRank) {
  EXPECT_EQ(mpi_world().local_rank(), mpi_world().rank());
  EXPECT_EQ(mpi_world().local_size(), mpi_world().size());
}

TEST(MpiLaunch, IdenticalConfigsPassTheCheck) {
  EXPECT_NO_THROW(check_same_across_ranks(mpi_world().comm(), R"({"model": {"n_layer": 2}})", "the resolved config"));
}

// The last rank runs with another learning rate: every rank fails, rank 0 names the key.
TEST(MpiLaunch, ADifferingConfigFailsOnEveryRankAndRank0NamesTheKey) {
  Comm& c = mpi_world().comm();
  const int last = c.size() - 1;
  std::string cfg = c.rank() == last ? R"({"train": {"lr": 0.002, "steps": 10}})" : R"({"train": {"lr": 0.001, "steps": 10}})";
  std::string msg;
  try {
    check_same_across_ranks(c, cfg, "the resolved config");
  } catch (const CollectiveError& e) {
    msg = e.what();
  }
  if (c.rank() == 0) {
    EXPECT_EQ(msg, "the resolved config differs across ranks: rank " + std::to_string(last) +
                       " disagrees with rank 0; /train/lr: 0.001 on rank 0, 0.002 on rank " + std::to_string(last));
  } else {
    EXPECT_EQ(msg, "the resolved config differs across ranks (rank 0 reports the difference)");
  }
}

TEST(MpiLaunch, SeveralDifferingRanksAreCounted) {
  Comm& c = mpi_world().comm();
  if (c.size() < 3) GTEST_SKIP() << "needs 3 ranks";
  std::string cfg = c.rank() == 0 ? "a" : "b";
  std::string msg;
  try {
    check_same_across_ranks(c, cfg, "the data manifest");
  } catch (const CollectiveError& e) {
    msg = e.what();
  }
  if (c.rank() == 0) {
    std::string others = std::to_string(c.size() - 2);
    EXPECT_EQ(msg, "the data manifest differs across ranks: rank 1 (and " + others + " other" +
                       (c.size() - 2 > 1 ? "s" : "") + ") disagree with rank 0; first difference at byte 0: \"a\" on rank 0, "
                       "\"b\" on rank 1");
  } else {
    EXPECT_FALSE(msg.empty());
  }
}

}  // namespace
}  // namespace mt::parallel
