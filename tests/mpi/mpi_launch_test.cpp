// World, the config-consistency check and the agreement on one failure to report, under mpirun.
#include <gtest/gtest.h>

#include <exception>
#include <string>

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

// What raise_agreed_failure throws on this rank given every rank's failure ("" when nothing).
struct Agreed {
  std::string what;
  int status = 0, reporter = -1;
};
Agreed agree(Comm& c, std::exception_ptr mine) {
  Agreed a;
  try {
    raise_agreed_failure(c, mine);
  } catch (const AgreedError& e) {
    a = {e.what(), e.exit_status(), e.reporter()};
  }
  return a;
}

TEST(MpiLaunch, NoFailureAnywhereIsAgreedSilently) {
  EXPECT_EQ(agree(mpi_world().comm(), nullptr).reporter, -1);
}

// Rank 0 saw the last rank's failure as a follow-on; the last rank's own error is the one every rank
// raises, with its text and exit status.
TEST(MpiLaunch, TheOwnFailureOfOneRankIsRaisedOnEveryRank) {
  Comm& c = mpi_world().comm();
  const int last = c.size() - 1;
  std::exception_ptr mine;
  if (c.rank() == 0) mine = std::make_exception_ptr(FollowOnError("rank " + std::to_string(last) + " failed: disk full"));
  if (c.rank() == last) mine = std::make_exception_ptr(CollectiveError("disk full on the last rank", kExitDiverged));
  const Agreed a = agree(c, mine);
  EXPECT_EQ(a.what, "disk full on the last rank");
  EXPECT_EQ(a.status, kExitDiverged);
  EXPECT_EQ(a.reporter, last);
}

// Every rank but 0 fails on its own: the lowest reports, naming the others; a timed-out wait (rank 0)
// ranks below them. Alone, a timed-out wait is reported as hung (exit status 4).
TEST(MpiLaunch, TheLowestOwnFailureReportsAndNamesTheOthers) {
  Comm& c = mpi_world().comm();
  if (c.size() < 3) GTEST_SKIP() << "needs 3 ranks";
  std::exception_ptr mine = c.rank() == 0 ? std::make_exception_ptr(PeerTimeoutError("hung: waited for rank 1", 2.0))
                                          : std::make_exception_ptr(Error("ENOSPC on rank " + std::to_string(c.rank())));
  Agreed a = agree(c, mine);
  std::string others = "2";
  for (int r = 3; r < c.size(); r++) others += ", " + std::to_string(r);
  EXPECT_EQ(a.what, "ENOSPC on rank 1; also failed on rank" + std::string(c.size() > 3 ? "s " : " ") + others);
  EXPECT_EQ(a.status, 1);
  EXPECT_EQ(a.reporter, 1);

  a = agree(c, c.rank() == 2 ? std::make_exception_ptr(PeerTimeoutError("hung: waited for rank 0", 2.0)) : nullptr);
  EXPECT_EQ(a.what, "hung: waited for rank 0");
  EXPECT_EQ(a.status, kExitHung);
  EXPECT_EQ(a.reporter, 2);
}

}  // namespace
}  // namespace mt::parallel
