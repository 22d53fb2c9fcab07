// Optimizer-side ops: AdamW against a scalar reference written straight from the formula in
// kernels/ops.h, the sum of squares behind the gradient norm (accuracy and thread-count
// independence), scaling, rounding to the compute precision, and the finiteness check.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/check.h"
#include "runtime/dtype.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

// One AdamW step on one element, in double, exactly as documented:
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p).
void adamw_reference(double& p, double& m, double& v, double g, double lr, double b1, double b2, double eps, double wd,
                     int t) {
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
  p -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p);
}

TEST(Optimizer, AdamwFollowsTheDocumentedUpdateOverSeveralSteps) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int64_t N = 10007;  // prime, more than one thread's share
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<float> p = mt::testing::random_floats(sz(N), rng), m(sz(N), 0.f), v(sz(N), 0.f);
  std::vector<double> pd(p.begin(), p.end()), md(sz(N), 0.0), vd(sz(N), 0.0);
  std::vector<double> p64(pd), m64(md), v64(vd);
  for (int t = 1; t <= 6; t++) {
    // Gradients of mixed scale, some exactly zero (sqrt(v) + eps must then not divide by zero).
    std::vector<float> g = mt::testing::random_floats(sz(N), rng, -2.f, 2.f);
    for (int64_t i = 0; i < N; i += 97) g[sz(i)] = 0.f;
    for (int64_t i = 1; i < N; i += 101) g[sz(i)] *= 1e-6f;
    std::vector<double> gd(g.begin(), g.end());
    adamw<float>(p.data(), m.data(), v.data(), g.data(), N, float(lr), float(b1), float(b2), float(eps), float(wd), t);
    adamw<double>(p64.data(), m64.data(), v64.data(), gd.data(), N, lr, b1, b2, eps, wd, t);
    for (int64_t i = 0; i < N; i++) adamw_reference(pd[sz(i)], md[sz(i)], vd[sz(i)], gd[sz(i)], lr, b1, b2, eps, wd, t);
    // float: a few ulp of the update per step; double: exact formula up to rounding.
    EXPECT_LT(mt::testing::max_rel_error(p64.data(), pd.data(), sz(N)), 1e-14) << "step " << t;
    EXPECT_LT(mt::testing::max_rel_error(m64.data(), md.data(), sz(N)), 1e-14) << "step " << t;
    EXPECT_LT(mt::testing::max_rel_error(v64.data(), vd.data(), sz(N)), 1e-14) << "step " << t;
    std::vector<double> pf(p.begin(), p.end()), mf(m.begin(), m.end()), vf(v.begin(), v.end());
    EXPECT_LT(mt::testing::max_rel_error(pf.data(), pd.data(), sz(N)), 1e-6) << "step " << t;
    EXPECT_LT(mt::testing::max_rel_error(mf.data(), md.data(), sz(N)), 1e-6) << "step " << t;
    EXPECT_LT(mt::testing::max_rel_error(vf.data(), vd.data(), sz(N)), 1e-6) << "step " << t;
  }
}

TEST(Optimizer, AdamwWithAGradScaleIsScaleThenAdamwBitForBit) {
  // The trainer hands AdamW the unscale-and-clip factor instead of scaling the gradients first.
  std::mt19937_64 rng(mt::testing::test_seed());
  const int64_t n = 5000;
  const auto g = mt::testing::random_floats(size_t(n), rng, -3.f, 3.f);
  const auto p0 = mt::testing::random_floats(size_t(n), rng);
  for (float factor : {1.f, 0.3f, 1.f / 1024}) {
    std::vector<float> p1 = p0, m1(size_t(n), 0.f), v1(size_t(n), 0.f), g1 = g;
    std::vector<float> p2 = p0, m2(size_t(n), 0.f), v2(size_t(n), 0.f);
    scale<float>(g1.data(), factor, n);
    for (int t = 1; t <= 3; t++) {
      adamw<float>(p1.data(), m1.data(), v1.data(), g1.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
      adamw<float>(p2.data(), m2.data(), v2.data(), g.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, &factor);
    }
    EXPECT_EQ(p1, p2) << factor;
    EXPECT_EQ(m1, m2) << factor;
    EXPECT_EQ(v1, v2) << factor;
  }
}

TEST(Optimizer, AdamwRejectsStepZero) {
  float p = 1, m = 0, v = 0, g = 1;
  EXPECT_THROW(adamw<float>(&p, &m, &v, &g, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, 0), mt::Error);
}

// The documented order, one value at a time: blocks of 4096, each summed in eight lanes (element i
// into lane i % 8) then lanes 0..7, and the blocks added in order.
double sum_squares_in_documented_order(const std::vector<float>& x) {
  constexpr size_t kBlock = 4096;
  double total = 0.0;
  for (size_t b0 = 0; b0 < x.size(); b0 += kBlock) {
    double lane[8] = {};
    for (size_t i = b0; i < std::min(x.size(), b0 + kBlock); i++) lane[(i - b0) % 8] += double(x[i]) * double(x[i]);
    double block = 0.0;
    for (double l : lane) block += l;
    total += block;
  }
  return total;
}

TEST(Optimizer, SumSquaresKeepsTheBlockOrderBitForBit) {
  // Whole groups of blocks read side by side, a ragged group, a short last block.
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  for (int64_t N : {int64_t(7), int64_t(4096), int64_t(4 * 4096), int64_t(4 * 4096 + 1), int64_t(9 * 4096 + 5),
                    int64_t(300007)}) {
    // Magnitudes from 2^-12 to 2^26, so that the sum's last bits depend on which lane takes which value.
    std::vector<float> x = mt::testing::random_floats(sz(N), rng, -1.f, 1.f);
    for (float& v : x) v = std::ldexp(v, int(rng() % 39) - 12);
    const double want = sum_squares_in_documented_order(x);
    EXPECT_EQ(sum_squares<float>(x.data(), N), want) << "N=" << N;
    // Every vector path this CPU can run (an AVX-512 CPU also runs the AVX2 one) has the same bits.
    for (SimdPath p : {SimdPath::portable, SimdPath::avx2, SimdPath::avx512})
      if (cpu_can_run(p)) {
        EXPECT_EQ(sum_squares_via(p, x.data(), N), want) << "N=" << N << " path " << int(p);
      }
  }
  EXPECT_TRUE(cpu_can_run(SimdPath::portable));
  // A short block's tail goes lane by lane too: 1.25^2 joins lane 1's 1 (together they round 2^54 up
  // by an ulp, 4), not lane 0's 2^54 (where each alone would vanish).
  std::vector<float> x(13, 0.f);
  x[0] = std::ldexp(1.f, 27), x[1] = 1.f, x[9] = 1.25f;
  EXPECT_EQ(sum_squares<float>(x.data(), 13), std::ldexp(1.0, 54) + 4.0);
}

TEST(Optimizer, SumSquaresIsAccurateAndIndependentOfThreadCount) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  const int saved = omp_get_max_threads();
  for (int64_t N : {int64_t(1), int64_t(4095), int64_t(4097), int64_t(300007)}) {
    std::vector<float> x = mt::testing::random_floats(sz(N), rng, -3.f, 3.f);
    long double ref = 0;
    for (float e : x) ref += (long double)e * (long double)e;
    omp_set_num_threads(1);
    const double s1 = sum_squares<float>(x.data(), N);
    omp_set_num_threads(2);
    const double s2 = sum_squares<float>(x.data(), N);
    omp_set_num_threads(3);
    const double s3 = sum_squares<float>(x.data(), N);
    EXPECT_EQ(s1, s2) << "N=" << N;
    EXPECT_EQ(s2, s3) << "N=" << N;
    // Double accumulation of float squares: relative error ~ N * 2^-53 at worst.
    EXPECT_NEAR(s2, double(ref), 1e-13 * double(ref)) << "N=" << N;
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(sum_squares<float>(nullptr, 0), 0.0);
}

TEST(Optimizer, ScaleMultipliesEveryElement) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  std::vector<float> x = mt::testing::random_floats(70001, rng), y = x;
  scale<float>(y.data(), 0.37f, int64_t(y.size()));
  for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(y[i], x[i] * 0.37f);
}

TEST(Optimizer, RoundToMatchesTheScalarRoundings) {
  std::mt19937_64 rng(mt::testing::test_seed() + 3);
  std::vector<float> x = mt::testing::random_floats(50001, rng, -70000.f, 70000.f);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = std::numeric_limits<float>::infinity();
  x[2] = 1e-9f;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<float> y = x;
    round_to(y.data(), int64_t(y.size()), int(t));
    for (size_t i = 0; i < x.size(); i++) {
      const float want = t == DType::bf16 ? round_bf16(x[i]) : t == DType::f16 ? round_f16(x[i]) : x[i];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(y[i]));
      } else {
        ASSERT_EQ(y[i], want) << dtype_name(t) << " element " << i;
      }
    }
  }
  float z = 1;
  EXPECT_THROW(round_to(&z, 1, int(DType::i32)), mt::Error);
}

TEST(Optimizer, AllFiniteDetectsAnyInfOrNan) {
  std::mt19937_64 rng(mt::testing::test_seed() + 4);
  const size_t N = 100003;
  std::vector<float> x = mt::testing::random_floats(N, rng, -1e30f, 1e30f);
  x[7] = std::numeric_limits<float>::max();
  x[8] = -std::numeric_limits<float>::max();
  x[9] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(all_finite(x.data(), int64_t(N)));
  std::uniform_int_distribution<size_t> pos(0, N - 1);
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::signaling_NaN()}) {
    std::vector<float> y = x;
    y[pos(rng)] = bad;
    EXPECT_FALSE(all_finite(y.data(), int64_t(N))) << bad;
    std::vector<float> z = x;
    z[N - 1] = bad;  // the very last element too
    EXPECT_FALSE(all_finite(z.data(), int64_t(N))) << bad;
  }
}

}  // namespace
}  // namespace mt::cpu
