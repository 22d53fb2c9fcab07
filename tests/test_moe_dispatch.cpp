// Dispatch and combine: permute then unpermute restores the input exactly, experts' blocks hold their
// tokens in a stable order, capacity keeps the first assignments and drops (and counts) the rest, a
// dropped token's output is its residual alone, and the backward of combine and permute matches finite
// differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "moe/dispatch.h"
#include "tests/test_util.h"

namespace mt::moe {
namespace {

std::vector<int32_t> random_experts(int N, int K, int E, std::mt19937_64& rng) {
  // K distinct experts per token.
  std::vector<int32_t> ex;
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int t = 0; t < N; t++) {
    for (int e = 0; e < E; e++) all[size_t(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    ex.insert(ex.end(), all.begin(), all.begin() + K);
  }
  return ex;
}

TEST(Dispatch, PermuteThenUnpermuteRestoresTheInputExactly) {
  std::mt19937_64 rng(testing::test_seed());
  const int N = 37, C = 13, E = 5;
  for (int K : {1, 2, 3}) {
    const std::vector<int32_t> ex = random_experts(N, K, E, rng);
    const DispatchPlan p = plan_dispatch(ex.data(), N, K, E, -1);
    ASSERT_EQ(p.rows(), int64_t(N) * K);
    const std::vector<float> x = testing::random_floats(size_t(N) * C, rng);
    std::vector<float> rows(size_t(p.rows()) * C), back(size_t(N) * K * C);
    permute(rows.data(), x.data(), p, C);
    unpermute(back.data(), rows.data(), p, C);
    for (int t = 0; t < N; t++)
      for (int j = 0; j < K; j++)
        for (int c = 0; c < C; c++)
          ASSERT_EQ(back[(size_t(t) * K + j) * C + c], x[size_t(t) * C + c]) << "K " << K << " token " << t;
  }
}

TEST(Dispatch, ExpertBlocksAreContiguousAndStable) {
  std::mt19937_64 rng(testing::test_seed());
  const int N = 50, K = 2, E = 4;
  const std::vector<int32_t> ex = random_experts(N, K, E, rng);
  const DispatchPlan p = plan_dispatch(ex.data(), N, K, E, -1);
  for (int e = 0; e < E; e++) {
    int prev = -1;
    for (int64_t r = p.offset[size_t(e)]; r < p.offset[size_t(e) + 1]; r++) {
      const int a = p.assignment_of[size_t(r)];
      EXPECT_EQ(ex[size_t(a)], e);
      EXPECT_GT(a, prev);  // increasing assignment order inside an expert
      EXPECT_EQ(p.row_of[size_t(a)], r);
      prev = a;
    }
  }
}

TEST(Dispatch, CapacityKeepsTheFirstAssignmentsAndDropsTheRest) {
  std::mt19937_64 rng(testing::test_seed());
  const int N = 40, K = 2, E = 4, C = 3;
  EXPECT_EQ(expert_capacity(0.0, N, K, E), -1);
  EXPECT_EQ(expert_capacity(1.0, N, K, E), 20);
  EXPECT_EQ(expert_capacity(0.5, 7, 1, 4), 1);  // ceil(0.875)
  // Skewed: expert 0 is everyone's first choice.
  std::vector<int32_t> ex;
  for (int t = 0; t < N; t++) ex.insert(ex.end(), {0, 1 + t % 3});
  const int64_t cap = expert_capacity(0.5, N, K, E);  // 10
  const DispatchPlan p = plan_dispatch(ex.data(), N, K, E, cap);
  std::vector<int64_t> load(size_t(E), 0);
  for (int32_t e : ex) load[size_t(e)]++;
  int64_t want_dropped = 0;
  for (int64_t l : load) want_dropped += std::max<int64_t>(0, l - cap);
  EXPECT_EQ(p.dropped, want_dropped);
  for (int e = 0; e < E; e++) EXPECT_EQ(p.rows_of(e), std::min(load[size_t(e)], cap));
  for (int t = 0; t < N; t++) EXPECT_EQ(p.row_of[size_t(t) * K] >= 0, t < cap) << "token " << t;  // first come
  // A token whose every assignment was dropped leaves the combine with its base (the residual) alone;
  // a kept one adds its gate-weighted rows.
  std::vector<int32_t> ex1(size_t(N), 0);  // K = 1, all to expert 0
  const DispatchPlan p1 = plan_dispatch(ex1.data(), N, 1, E, 4);
  const std::vector<float> rows = testing::random_floats(size_t(p1.rows()) * C, rng);
  const std::vector<float> base = testing::random_floats(size_t(N) * C, rng);
  const std::vector<float> gate(size_t(N), 0.5f);
  std::vector<float> y(size_t(N) * C);
  combine(y.data(), rows.data(), gate.data(), base.data(), p1, C);
  for (int t = 0; t < N; t++)
    for (int c = 0; c < C; c++) {
      const float want = t < 4 ? base[size_t(t) * C + c] + 0.5f * rows[size_t(t) * C + c] : base[size_t(t) * C + c];
      EXPECT_EQ(y[size_t(t) * C + c], want) << "token " << t;
    }
}

// J = <w, combine(rows, gate, base)> + <v, permute(x)>, all in double: the backward of both against
// central differences.
TEST(Dispatch, CombineAndPermuteBackwardMatchFiniteDifferences) {
  std::mt19937_64 rng(testing::test_seed());
  const int N = 9, K = 2, E = 3, C = 4;
  const std::vector<int32_t> ex = random_experts(N, K, E, rng);
  const DispatchPlan p = plan_dispatch(ex.data(), N, K, E, expert_capacity(0.8, N, K, E));
  ASSERT_GT(p.dropped, 0);
  const int64_t M = p.rows();
  std::vector<double> rows = testing::random_doubles(size_t(M) * C, rng), x = testing::random_doubles(size_t(N) * C, rng);
  const std::vector<double> w = testing::random_doubles(size_t(N) * C, rng), v = testing::random_doubles(size_t(M) * C, rng);
  std::vector<float> gate = testing::random_floats(size_t(N) * K, rng, 0.1f, 1.f);
  auto J = [&] {
    std::vector<double> y(size_t(N) * C), px(size_t(M) * C);
    combine(y.data(), rows.data(), gate.data(), static_cast<const double*>(nullptr), p, C);
    permute(px.data(), x.data(), p, C);
    double j = 0;
    for (size_t i = 0; i < y.size(); i++) j += w[i] * y[i];
    for (size_t i = 0; i < px.size(); i++) j += v[i] * px[i];
    return j;
  };
  std::vector<double> drows(size_t(M) * C), dx(size_t(N) * C);
  std::vector<float> dgate(size_t(N) * K);
  combine_backward(drows.data(), dgate.data(), w.data(), rows.data(), gate.data(), p, C);
  permute_backward(dx.data(), v.data(), nullptr, p, C);
  const double eps = 1e-4;
  for (std::vector<double>* t : {&rows, &x}) {
    const std::vector<double>& g = t == &rows ? drows : dx;
    for (size_t i = 0; i < t->size(); i++) {
      const double keep = (*t)[i];
      (*t)[i] = keep + eps;
      const double jp = J();
      (*t)[i] = keep - eps;
      const double jm = J();
      (*t)[i] = keep;
      EXPECT_NEAR(g[i], (jp - jm) / (2 * eps), 1e-8) << (t == &rows ? "rows " : "x ") << i;
    }
  }
  for (size_t a = 0; a < gate.size(); a++) {
    const float keep = gate[a];
    const float gp = keep + 1.f / 1024, gm = keep - 1.f / 1024;  // the steps as stored
    gate[a] = gp;
    const double jp = J();
    gate[a] = gm;
    const double jm = J();
    gate[a] = keep;
    EXPECT_NEAR(dgate[a], (jp - jm) / (double(gp) - double(gm)), 1e-5) << "gate " << a;
    if (p.row_of[a] < 0) {
      EXPECT_EQ(dgate[a], 0.f);
    }
  }
}

}  // namespace
}  // namespace mt::moe
