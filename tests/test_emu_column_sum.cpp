// The two-pass column sum of the CUDA backend (kernels/cuda/column_sum_kernels.cuh), run on the warp
// emulator: the split covers every row once, the sums match a double-precision reference, they add to
// what the outputs held, a null output is left alone, and the bits depend only on (R, C).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/column_sum_kernels.cuh"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using namespace mt::testing::emu;  // column_sums, run (tests/emu_test_util.h)
namespace csk = mt::cuda::column_sum_kernels;

// Two sums per element: x and x * row weight (the shape of LayerNorm's dbias and dweight terms).
struct TwoTerms {
  const float* x;
  const float* w;
  void operator()(int r, int /*c*/, int64_t i, float (&v)[2]) const {
    v[0] = x[i] * w[r];
    v[1] = x[i];
  }
};

TEST(ColumnSplit, CoversEveryRowOnceWithoutEmptySplits) {
  for (int R : {1, 2, 255, 256, 257, 1000, 32768, 262144, 262145, 1 << 22}) {
    const csk::ColumnSplit s = csk::column_split(R, 7);
    SCOPED_TRACE(::testing::Message() << "R=" << R << " splits=" << s.splits << " rows=" << s.rows_per_split);
    EXPECT_GE(s.splits, 1);
    EXPECT_LE(s.splits, csk::kMaxSplits);
    EXPECT_GE(int64_t(s.splits) * s.rows_per_split, R);           // every row is in a split
    EXPECT_LT(int64_t(s.splits - 1) * s.rows_per_split, R);       // the last split is not empty
    if (int64_t(R) <= int64_t(csk::kMaxSplits) * csk::kRowsPerSplit) {
      EXPECT_LE(s.rows_per_split, csk::kRowsPerSplit);
    }
  }
}

TEST(EmulatedColumnSum, MatchesDoublePrecisionAndAccumulates) {
  std::mt19937_64 rng(mt::testing::test_seed());
  struct Shape { int R, C; };
  // One row; fewer rows than thread rows; exactly one split; one row into the second split; many
  // splits with a ragged last one; columns spanning two 32-column blocks.
  for (Shape sh : {Shape{1, 1}, Shape{5, 3}, Shape{256, 33}, Shape{257, 4}, Shape{1500, 65}}) {
    SCOPED_TRACE(::testing::Message() << "R=" << sh.R << " C=" << sh.C);
    const auto x = mt::testing::random_floats(size_t(sh.R) * sh.C, rng, -1.f, 1.f);
    const auto w = mt::testing::random_floats(size_t(sh.R), rng, -2.f, 2.f);
    auto out_w = mt::testing::random_floats(size_t(sh.C), rng), out_b = mt::testing::random_floats(size_t(sh.C), rng);
    std::vector<double> want_w(out_w.begin(), out_w.end()), want_b(out_b.begin(), out_b.end());
    std::vector<double> abs_w(want_w.size()), abs_b(want_b.size());  // sums of |term|, the error scale
    for (int c = 0; c < sh.C; c++) abs_w[size_t(c)] = std::fabs(want_w[size_t(c)]), abs_b[size_t(c)] = std::fabs(want_b[size_t(c)]);
    for (int r = 0; r < sh.R; r++)
      for (int c = 0; c < sh.C; c++) {
        const double v = x[size_t(r) * sh.C + c];
        want_w[size_t(c)] += v * w[size_t(r)];
        want_b[size_t(c)] += v;
        abs_w[size_t(c)] += std::fabs(v * w[size_t(r)]);
        abs_b[size_t(c)] += std::fabs(v);
      }
    column_sums<2>({{out_w.data(), out_b.data()}}, TwoTerms{x.data(), w.data()}, sh.R, sh.C);
    // Recursive fp32 summation errs by at most (additions in the chain) 2^-24 sum|term|: a thread adds
    // at most 32 rows, then 8 thread partials, the splits, and the output.
    const csk::ColumnSplit split = csk::column_split(sh.R, sh.C);
    const double chain = double((split.rows_per_split + csk::kThreadRows - 1) / csk::kThreadRows + csk::kThreadRows + split.splits + 2);
    for (int c = 0; c < sh.C; c++) {
      EXPECT_NEAR(out_w[size_t(c)], want_w[size_t(c)], chain * 0x1p-24 * abs_w[size_t(c)]) << "c=" << c;
      EXPECT_NEAR(out_b[size_t(c)], want_b[size_t(c)], chain * 0x1p-24 * abs_b[size_t(c)]) << "c=" << c;
    }
  }
}

TEST(EmulatedColumnSum, SkipsANullOutputAndRepeatsItsBits) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int R = 700, C = 40;
  const auto x = mt::testing::random_floats(size_t(R) * C, rng, -1.f, 1.f);
  const auto w = mt::testing::random_floats(size_t(R), rng, -2.f, 2.f);
  std::vector<float> first(size_t(C), 0.f), second(size_t(C), 0.f);
  column_sums<2>({{nullptr, first.data()}}, TwoTerms{x.data(), w.data()}, R, C);
  column_sums<2>({{nullptr, second.data()}}, TwoTerms{x.data(), w.data()}, R, C);
  EXPECT_EQ(first, second);
  double sum0 = 0.0;
  for (int r = 0; r < R; r++) sum0 += x[size_t(r) * C];
  EXPECT_NEAR(first[0], sum0, 1e-4);
}

}  // namespace
