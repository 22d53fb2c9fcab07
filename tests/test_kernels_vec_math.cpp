// The vectorised exp behind softmax, attention and GELU: accuracy against the C library's exp in
// long double (kMaxUlp = 4 units in the last place over the whole clamped range), the SIMD body and
// the scalar tail agreeing bit for bit, NaN propagating, and the saturation of the ops that use it
// at extreme inputs; the softmax's row passes (maximum, sum of exps, scaling) bitwise their portable
// loops at every length around the SIMD widths; GELU on each vector path bitwise its portable loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr double kMaxUlp = 4;

double ulp_error(float got, double x) {
  const long double want = std::exp((long double)x);
  const double ulp = std::ldexp(1.0, std::ilogb(float(want)) - 23);
  return double(std::fabs((long double)got - want)) / ulp;
}

TEST(VecMath, ExpIsAccurateToAFewUlpOverTheClampedRange) {
  std::mt19937_64 rng(mt::testing::test_seed());
  std::uniform_real_distribution<float> d(-87.f, 88.f);
  std::vector<float> x(200003);
  for (auto& v : x) v = d(rng);
  x[0] = 0.f;
  x[1] = -87.f;
  x[2] = 88.f;
  x[3] = 1e-8f;
  std::vector<float> y(x.size());
  exp_shifted(y.data(), x.data(), 0.f, int(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); i++) worst = std::max(worst, ulp_error(y[i], x[i]));
  EXPECT_LE(worst, kMaxUlp);
  // The shift is applied before the exp: exp(x - s).
  std::vector<float> z(x.size());
  exp_shifted(z.data(), x.data(), 3.5f, int(x.size()));
  for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(z[i], exp_fast(x[i] - 3.5f));
}

TEST(VecMath, SimdBodyAndScalarTailAgreeBitwise) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  std::vector<float> x = mt::testing::random_floats(1027, rng, -100.f, 100.f), y(x.size());
  exp_shifted(y.data(), x.data(), 0.f, int(x.size()));
  for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(y[i], exp_fast(x[i])) << "element " << i << " x=" << x[i];
  // In place, as attention uses it.
  std::vector<float> w = x;
  exp_shifted(w.data(), w.data(), 0.f, int(w.size()));
  EXPECT_EQ(w, y);
}

// The AVX2 body, which this CPU may not take by itself (AVX-512 comes first): the same bits as
// exp_fast, element by element, NaN and the clamps included.
TEST(VecMath, Avx2BodyHasTheBitsOfExpFast) {
  std::mt19937_64 rng(mt::testing::test_seed() + 5);
  std::vector<float> x = mt::testing::random_floats(1031, rng, -100.f, 100.f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[6] = -std::numeric_limits<float>::infinity();
  x[7] = std::numeric_limits<float>::infinity();
  std::vector<float> y(x.size(), -1.f);
  const int done = exp_shifted_avx2_part(y.data(), x.data(), 1.25f, int(x.size()));
  if (done == 0) GTEST_SKIP() << "this CPU has no AVX2 and FMA";
  ASSERT_EQ(done, int(x.size()) / 8 * 8);
  for (int i = 0; i < done; i++) {
    const float want = exp_fast(x[size_t(i)] - 1.25f);
    if (std::isnan(want))
      ASSERT_TRUE(std::isnan(y[size_t(i)])) << i;
    else
      ASSERT_EQ(y[size_t(i)], want) << "element " << i << " x=" << x[size_t(i)];
  }
  for (size_t i = size_t(done); i < y.size(); i++) ASSERT_EQ(y[i], -1.f) << "past the body: " << i;
}

TEST(VecMath, ExpClampsAndKeepsNan) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {-inf, -1000.f, 1000.f, inf, nan, 0.f, nan, -inf}, y(x.size());
  exp_shifted(y.data(), x.data(), 0.f, int(x.size()));
  for (size_t i = 0; i < x.size(); i++) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i])) << i;
    } else {
      EXPECT_TRUE(std::isfinite(y[i])) << i;
      EXPECT_GE(y[i], 0.f) << i;
      EXPECT_EQ(std::fpclassify(y[i]), FP_NORMAL) << i;
    }
  }
  EXPECT_LT(y[0], 1e-37f);
  EXPECT_GT(y[2], 1e38f);
}

TEST(VecMath, GeluSaturatesToZeroAndIdentityAndPropagatesNan) {
  std::vector<float> x = {-1000.f, -40.f, -12.f, 12.f, 40.f, 1000.f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.f);
  gelu_fwd<float>(y.data(), x.data(), int64_t(x.size()));
  gelu_bwd<float>(dx.data(), ones.data(), x.data(), int64_t(x.size()));
  for (size_t i = 0; i + 1 < x.size(); i++) {
    if (x[i] < 0) {
      EXPECT_LE(std::fabs(y[i]), 1e-25f) << x[i];
      EXPECT_LE(std::fabs(dx[i]), 1e-25f) << x[i];
    } else {
      EXPECT_EQ(y[i], x[i]);
      EXPECT_EQ(dx[i], 1.f) << x[i];
    }
  }
  EXPECT_TRUE(std::isnan(y.back()));
  EXPECT_TRUE(std::isnan(dx.back()));
}

TEST(VecMath, SoftmaxRowPassesHaveThePortableLoopsBits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  auto same_bits = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  for (int n : {1, 7, 8, 15, 16, 17, 31, 32, 33, 48, 100, 257}) {
    SCOPED_TRACE(n);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    EXPECT_TRUE(same_bits(max_row(x.data(), n), max_lanes(x.data(), n)));
    const float m = max_lanes(x.data(), n);
    std::vector<float> e(x.size()), want(x.size());
    const float sum = exp_shifted_sum(e.data(), x.data(), m, n);
    exp_shifted(want.data(), x.data(), m, n);
    EXPECT_TRUE(same_bits(sum, sum_lanes(want.data(), n)));
    EXPECT_EQ(std::memcmp(e.data(), want.data(), sizeof(float) * size_t(n)), 0);
    const float s = 1.f / sum;
    scale_row(e.data(), s, n);
    for (int i = 0; i < n; i++) EXPECT_TRUE(same_bits(e[size_t(i)], want[size_t(i)] * s)) << i;
    // A row's last step is masked: nothing past element n - 1 is written.
    std::vector<float> guarded(x.size() + 16, -7.f);
    exp_shifted_sum(guarded.data(), x.data(), m, n);
    exp_shifted(guarded.data(), x.data(), m, n);
    scale_row(guarded.data(), s, n);
    for (size_t i = x.size(); i < guarded.size(); i++) EXPECT_EQ(guarded[i], -7.f) << i;
    // The backward's passes: dot_lanes' bits, then the in-place gradient with zeros from n up to
    // n + 5 (and nothing written beyond).
    std::vector<float> g(x.size());
    for (float& v : g) v = normal(rng);
    const float pg = dot_row(e.data(), g.data(), n);
    EXPECT_TRUE(same_bits(pg, dot_lanes(e.data(), g.data(), n)));
    std::vector<float> got(x.size() + 16, -7.f), want_g(got);
    std::copy(g.begin(), g.end(), got.begin());
    std::copy(g.begin(), g.end(), want_g.begin());
    softmax_grad_row(got.data(), e.data(), pg, n, n + 5);
    softmax_grad_row_portable(want_g.data(), e.data(), pg, n, n + 5);
    EXPECT_EQ(std::memcmp(got.data(), want_g.data(), sizeof(float) * got.size()), 0);
    for (size_t i = x.size() + 5; i < got.size(); i++) EXPECT_EQ(got[i], -7.f) << i;
  }
}

// GELU's vector paths widen the same IEEE operations: every path this CPU runs gives the portable
// loops' bits, forward and backward, for each storage type and double, at ragged lengths around the 256-value
// blocks and on values from 2^-20 to 2^7 with the saturated, infinite and NaN ones among them.
template <class S>
void expect_gelu_paths_match_portable() {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto bits = [](const std::vector<S>& v) {
    std::vector<unsigned char> b(v.size() * sizeof(S));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(255), int64_t(256), int64_t(257), int64_t(4099)}) {
    SCOPED_TRACE(n);
    std::vector<S> x(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); i++) {
      x[i] = store_as<S>(std::ldexp(normal(rng), int(rng() % 28) - 20));
      g[i] = store_as<S>(normal(rng));
    }
    const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(), -12.f, 12.f, -0.f, 0.f};
    for (size_t i = 0; i < std::size(special) && i < x.size(); i++) x[x.size() - 1 - i] = store_as<S>(special[i]);
    std::vector<S> y0(x.size()), d0(x.size());
    gelu_fwd_via<S>(SimdPath::portable, y0.data(), x.data(), n);
    gelu_bwd_via<S>(SimdPath::portable, d0.data(), g.data(), x.data(), n);
    for (SimdPath p : {SimdPath::avx2, SimdPath::avx512}) {
      if (!cpu_can_run(p)) continue;
      std::vector<S> y(x.size()), d(x.size());
      gelu_fwd_via<S>(p, y.data(), x.data(), n);
      gelu_bwd_via<S>(p, d.data(), g.data(), x.data(), n);
      EXPECT_EQ(bits(y), bits(y0)) << "forward, path " << int(p);
      EXPECT_EQ(bits(d), bits(d0)) << "backward, path " << int(p);
    }
  }
}

TEST(VecMath, GeluPathsHaveThePortableLoopsBits) {
  expect_gelu_paths_match_portable<float>();
  expect_gelu_paths_match_portable<bf16>();
  expect_gelu_paths_match_portable<f16>();
  expect_gelu_paths_match_portable<double>();  // the finite-difference tests' type
}

}  // namespace
}  // namespace mt::cpu
