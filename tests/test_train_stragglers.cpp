// The straggler check (train/stragglers.h): the verdict on one step's busy times and the run's ranking.
#include <gtest/gtest.h>

#include "train/run_summary.h"
#include "train/stragglers.h"

namespace mt::train {
namespace {

TEST(Stragglers, ARankAboveTheThresholdTimesTheMedianIsNamed) {
  const StragglerVerdict v = judge_stragglers({0.10, 0.11, 0.35, 0.09}, 1.5);
  EXPECT_EQ(v.rank, 2);
  EXPECT_DOUBLE_EQ(v.median_s, 0.10);  // the lower median of 0.09, 0.10, 0.11, 0.35
  EXPECT_DOUBLE_EQ(v.ratio, 3.5);
  EXPECT_DOUBLE_EQ(v.max_s, 0.35);
  EXPECT_TRUE(v.straggler);
  EXPECT_FALSE(judge_stragglers({0.10, 0.11, 0.14, 0.09}, 1.5).straggler);  // x1.4
  EXPECT_FALSE(judge_stragglers({0.10, 0.11, 0.35, 0.09}, 0).straggler);   // off
  // 30x the median but 29 ms more: the operating system's noise on a toy step, not a straggler.
  const StragglerVerdict noise = judge_stragglers({0.001, 0.030}, 1.5);
  EXPECT_DOUBLE_EQ(noise.ratio, 30.0);
  EXPECT_FALSE(noise.straggler);
}

TEST(Stragglers, WithTwoRanksTheSlowOneIsComparedWithTheFastOne) {
  const StragglerVerdict v = judge_stragglers({0.12, 0.04}, 1.5);
  EXPECT_EQ(v.rank, 0);
  EXPECT_DOUBLE_EQ(v.ratio, 3.0);
  EXPECT_TRUE(v.straggler);
  EXPECT_EQ(judge_stragglers({0.5}, 1.5).rank, -1);  // one rank: nothing to compare
}

TEST(Stragglers, TheSummaryListsTheSlowestRanksFirst) {
  StragglerTally t;
  EXPECT_EQ(t.slowest(3), "");
  for (int step = 0; step < 4; step++) {
    const std::vector<double> busy = {0.1, step < 3 ? 0.3 : 0.1, 0.1, 0.12};
    t.add(busy, judge_stragglers(busy, 1.5));
  }
  // Rank 1: 3, 3, 3, 1 -> x2.50, named 3 times; rank 3: x1.20 (the median is 0.1 in every step).
  EXPECT_EQ(t.slowest(2), "rank 1 x2.50 (named in 3 of 4 steps), rank 3 x1.20");
  RunTotals totals;
  totals.set_slowest_ranks(t.slowest(3));
  EXPECT_NE(totals.format(1.0, {}).find("  slowest ranks      rank 1 x2.50 (named in 3 of 4 steps), rank 3 x1.20, "
                                        "rank 0 x1.00 (busy time / median)\n"),
            std::string::npos)
      << totals.format(1.0, {});
}

}  // namespace
}  // namespace mt::train
