// The vocabulary-parallel ops against their single-rank twins: P row slices of an embedding table
// look up and scatter exactly what the whole table does (each id in one slice, zeros elsewhere);
// P column slices of the logits, their softmax statistics merged, give softmax_xent's losses and
// gradients (bit for bit with one slice, to rounding with several), padded columns and ignored
// targets included.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "tests/test_util.h"

namespace mt::ops {
namespace {

using mt::testing::random_floats;

TEST(VocabParallel, EmbeddingSlicesAddUpToTheWholeTable) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int V = 24, C = 70, N = 37;
  const std::vector<float> table = random_floats(size_t(V * C), rng);
  std::vector<int32_t> ids(N);
  for (auto& i : ids) i = int32_t(rng() % V);
  const std::vector<float> dout = random_floats(size_t(N * C), rng);
  // The whole table: a plain lookup and scatter.
  std::vector<float> want(size_t(N * C)), want_d(size_t(V * C), 7.f);  // grads accumulate onto 7
  embedding_fwd(want.data(), ids.data(), table.data(), 0, V, N, C, Ctx{});
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      EXPECT_EQ(want[size_t(n * C + c)], table[size_t(ids[size_t(n)] * C + c)]);
      want_d[size_t(ids[size_t(n)] * C + c)] += dout[size_t(n * C + c)];  // rows in order
    }
  for (int P : {2, 3, 4}) {
    const int rows = V / P;
    std::vector<float> sum(size_t(N * C), 0.f), grad(size_t(V * C), 7.f);
    for (int r = 0; r < P; r++) {
      std::vector<float> part(size_t(N * C), NAN);
      embedding_fwd(part.data(), ids.data(), table.data() + r * rows * C, r * rows, rows, N, C, Ctx{});
      for (size_t k = 0; k < sum.size(); k++) sum[k] += part[k];  // exactly one slice is nonzero
      embedding_bwd(grad.data() + r * rows * C, dout.data(), ids.data(), r * rows, rows, N, C, Ctx{});
    }
    EXPECT_EQ(sum, want) << "P=" << P;
    for (size_t k = 0; k < grad.size(); k++) ASSERT_EQ(grad[k], want_d[k]) << "P=" << P << " k=" << k;
  }
}

template <class S>
std::vector<S> to_storage(const std::vector<float>& x) {
  std::vector<S> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = store_as<S>(x[i]);
  return out;
}

// rel: the relative difference a gradient may show with several slices (the fp32 sum differs in its
// last bits; a 16-bit gradient may then round the other way).
template <class S>
void check_sliced_xent(double rel) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int V = 50, Vp = 64, N = 19;
  std::vector<float> lf = random_floats(size_t(N * Vp), rng, -4.f, 4.f);
  for (int i = 0; i < N; i++)
    for (int j = V; j < Vp; j++) lf[size_t(i * Vp + j)] = 1e3f;  // padding must be ignored whatever it holds
  const std::vector<S> logits = to_storage<S>(lf);
  std::vector<int32_t> targets(N);
  for (auto& t : targets) t = int32_t(rng() % V);
  targets[3] = -1;  // ignored
  targets[5] = V - 1;
  const float dloss = 0.37f;
  std::vector<float> want_loss(N);
  std::vector<S> want_d(size_t(N * Vp));
  softmax_xent(want_loss.data(), want_d.data(), logits.data(), targets.data(), dloss, N, V, Vp, Ctx{});
  for (int P : {1, 2, 4, 8}) {  // with 8 slices of 8 the last two hold padding only
    const int Vl = Vp / P;
    std::vector<std::vector<S>> slices(static_cast<size_t>(P));
    std::vector<float> stats(size_t(P * N * 3));
    for (int r = 0; r < P; r++) {
      slices[size_t(r)].resize(size_t(N * Vl));
      for (int i = 0; i < N; i++)
        for (int j = 0; j < Vl; j++) slices[size_t(r)][size_t(i * Vl + j)] = logits[size_t(i * Vp + r * Vl + j)];
      xent_slice_stats(stats.data() + r * N * 3, slices[size_t(r)].data(), targets.data(), r * Vl, N, V, Vl, Ctx{});
    }
    for (int r = 0; r < P; r++) {
      std::vector<float> loss(N, NAN);
      std::vector<S>& d = slices[size_t(r)];  // in place, as the model does it
      xent_slice_finish(loss.data(), d.data(), d.data(), stats.data(), P, targets.data(), dloss, r * Vl, N, V, Vl,
                        Ctx{});
      for (int i = 0; i < N; i++) {
        if (P == 1) {
          EXPECT_EQ(loss[size_t(i)], want_loss[size_t(i)]) << "one slice: bit for bit, row " << i;
        } else {
          EXPECT_NEAR(loss[size_t(i)], want_loss[size_t(i)], 2e-6 * std::max(1.f, want_loss[size_t(i)])) << "P=" << P;
        }
        for (int j = 0; j < Vl; j++) {
          const float got = load(d[size_t(i * Vl + j)]), w = load(want_d[size_t(i * Vp + r * Vl + j)]);
          if (P == 1 || r * Vl + j >= V || targets[size_t(i)] < 0)
            ASSERT_EQ(got, w) << "P=" << P << " row " << i << " col " << r * Vl + j;
          else
            ASSERT_NEAR(got, w, 1e-9 + rel * std::fabs(w)) << "P=" << P << " row " << i << " col " << r * Vl + j;
        }
      }
    }
  }
}

TEST(VocabParallel, SlicedCrossEntropyEqualsTheWholeOneFp32) { check_sliced_xent<float>(1e-5); }
TEST(VocabParallel, SlicedCrossEntropyEqualsTheWholeOneBf16) { check_sliced_xent<bf16>(8e-3); }

}  // namespace
}  // namespace mt::ops
