// The sampler: permutations, epochs, data-parallel slicing and mixtures, as pure functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "data/sampler.h"
#include "runtime/check.h"
#include "tests/test_util.h"

using namespace mt::data;

namespace {

// The window global position p of a single-dataset sampler maps to.
SampleRef at(const Sampler& s, uint64_t p) { return s.sample(0, p); }

}  // namespace

TEST(Permutation, IsABijectionForSmallOddAndPrimeSizes) {
  std::mt19937_64 rng(mt::testing::test_seed());
  for (uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 16ull, 17ull, 97ull, 1000ull, 4099ull, 65537ull}) {
    Permutation p(n, rng());
    std::vector<char> hit(n, 0);
    for (uint64_t i = 0; i < n; i++) {
      uint64_t v = p(i);
      ASSERT_LT(v, n);
      ASSERT_FALSE(hit[v]) << "n=" << n << " value " << v << " twice";
      hit[v] = 1;
    }
  }
}

TEST(Permutation, LooksShuffledAndDependsOnTheKey) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const uint64_t n = 10000;
  Permutation a(n, rng()), b(n, rng());
  uint64_t fixed = 0, same = 0, ascending = 0;
  for (uint64_t i = 0; i < n; i++) {
    fixed += a(i) == i;
    same += a(i) == b(i);
    if (i) ascending += a(i) > a(i - 1);
  }
  // A random permutation has ~1 fixed point, ~1 agreement with another, ~n/2 ascents (sd ~ sqrt(n/12)).
  EXPECT_LT(fixed, 10u);
  EXPECT_LT(same, 10u);
  EXPECT_NEAR(double(ascending), n / 2.0, 6 * std::sqrt(n / 12.0));
}

TEST(Sampler, EachEpochVisitsEveryWindowOnceAndReshuffles) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const uint64_t W = 257 + rng() % 500;
  Sampler s({W}, {1.0}, SampleMode::shuffled, rng());
  std::vector<std::vector<uint64_t>> epochs(3);
  for (uint64_t p = 0; p < 3 * W; p++) {
    SampleRef r = at(s, p);
    ASSERT_EQ(r.epoch, p / W);
    epochs[r.epoch].push_back(r.window);
  }
  for (auto& e : epochs) {
    std::vector<uint64_t> sorted = e;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < W; i++) ASSERT_EQ(sorted[i], i) << "an epoch must cover every window exactly once";
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

TEST(Sampler, IsAPureFunctionOfSeedAndPosition) {
  std::mt19937_64 rng(mt::testing::test_seed());
  uint64_t seed = rng();
  Sampler a({1000}, {1.0}, SampleMode::shuffled, seed), b({1000}, {1.0}, SampleMode::shuffled, seed);
  Sampler c({1000}, {1.0}, SampleMode::shuffled, seed + 1);
  int differ = 0;
  for (uint64_t p : {0ull, 5ull, 999ull, 1000ull, 123456ull}) {
    EXPECT_EQ(at(a, p).window, at(b, p).window);
    differ += at(a, p).window != at(c, p).window;
  }
  EXPECT_GT(differ, 2) << "another seed must give another order";
}

TEST(Sampler, SequentialModeWalksTheStreamInOrderAndWraps) {
  Sampler s({10}, {1.0}, SampleMode::sequential, 42);
  for (uint64_t p = 0; p < 35; p++) {
    EXPECT_EQ(at(s, p).window, p % 10);
    EXPECT_EQ(at(s, p).epoch, p / 10);
  }
  // Batch i of B global rows covers windows i*B .. i*B+B-1; dp rank r of D takes rows [r*B/D, ...).
  const int D = 2, B = 3;
  EXPECT_EQ(at(s, global_position(1, 0, D, B, 0)).window, 6u);
  EXPECT_EQ(at(s, global_position(1, 1, D, B, 2)).window, 1u);  // position 11 wraps to window 1
}

TEST(Sampler, DataParallelRanksReadDisjointSlicesThatTileTheGlobalBatch) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const uint64_t W = 500;
  Sampler s({W}, {1.0}, SampleMode::shuffled, rng());
  for (int D : {1, 2, 3, 8}) {
    const int B = 1 + int(rng() % 5);
    std::set<uint64_t> seen;
    const uint64_t steps = W / uint64_t(D * B);  // stay within epoch 0
    for (uint64_t step = 0; step < steps; step++)
      for (int r = 0; r < D; r++)
        for (int row = 0; row < B; row++) {
          uint64_t p = global_position(step, r, D, B, row);
          ASSERT_EQ(p, step * uint64_t(D * B) + uint64_t(r * B + row));
          ASSERT_TRUE(seen.insert(at(s, p).window).second) << "window read twice in one epoch, D=" << D;
        }
    EXPECT_EQ(seen.size(), steps * uint64_t(D * B));
  }
}

TEST(Sampler, MixtureDrawsInProportionToTheWeightsDeterministically) {
  std::mt19937_64 rng(mt::testing::test_seed());
  uint64_t seed = rng();
  std::vector<double> w = {0.7, 0.2, 0.1};
  Sampler s({100, 50, 30}, w, SampleMode::shuffled, seed), again({100, 50, 30}, w, SampleMode::shuffled, seed);
  const uint64_t n = 20000;
  std::vector<uint64_t> count(3, 0);
  for (uint64_t p = 0; p < n; p++) {
    uint32_t k = s.dataset_at(p);
    ASSERT_EQ(k, again.dataset_at(p));
    count[k]++;
  }
  for (size_t k = 0; k < 3; k++) {
    double sd = std::sqrt(n * w[k] * (1 - w[k]));
    EXPECT_NEAR(double(count[k]), n * w[k], 5 * sd) << "dataset " << k;  // 5 sigma
  }
  // Each dataset's own stream keeps the per-epoch guarantee.
  std::set<uint64_t> first_epoch;
  for (uint64_t i = 0; i < 50; i++) first_epoch.insert(s.sample(1, i).window);
  EXPECT_EQ(first_epoch.size(), 50u);
}

TEST(Sampler, RejectsBadWeightsAndModes) {
  EXPECT_THROW(Sampler({10, 10}, {1.0, 0.0}, SampleMode::shuffled, 1), mt::Error);
  EXPECT_THROW(Sampler({10, 10}, {1.0, -2.0}, SampleMode::shuffled, 1), mt::Error);
  EXPECT_THROW(sample_mode_from_name("random"), mt::Error);
  EXPECT_EQ(sample_mode_from_name("sequential"), SampleMode::sequential);
}
