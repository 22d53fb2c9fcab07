// Where tensor parallelism does the single rank's arithmetic, it gets the single rank's bits: a
// column-parallel GEMM's output columns, its weight-gradient rows and bias-gradient entries, and
// attention over a subset of heads are bitwise the corresponding parts of the whole computation
// (every output element is summed over the same inputs in the same order, whatever the other
// columns or heads). This is what makes a tp run's first layer bitwise the single rank's up to the
// first row-parallel sum, and why the layouts differ only by the reductions' order afterwards.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ops.h"
#include "tests/test_util.h"

namespace mt::ops {
namespace {

using mt::testing::random_floats;

TEST(TensorParallelSlices, ColumnParallelGemmIsBitwiseTheWholeOnesColumns) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int N = 45, IC = 64, OC = 96, P = 4, OCl = OC / P;
  const std::vector<float> x = random_floats(size_t(N * IC), rng), w = random_floats(size_t(OC * IC), rng),
                           b = random_floats(size_t(OC), rng), dout = random_floats(size_t(N * OC), rng);
  std::vector<float> y(size_t(N * OC)), dw(size_t(OC * IC), 0.f), db(size_t(OC), 0.f), dx(size_t(N * IC));
  matmul_fwd(y.data(), x.data(), w.data(), b.data(), N, IC, OC, Ctx{});
  matmul_bwd(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, IC, OC, Ctx{});
  for (int r = 0; r < P; r++) {
    const float* wr = w.data() + r * OCl * IC;  // rows of W: a contiguous block
    std::vector<float> yr(size_t(N * OCl)), dwr(size_t(OCl * IC), 0.f), dbr(size_t(OCl), 0.f), doutr;
    for (int i = 0; i < N; i++)
      for (int j = 0; j < OCl; j++) doutr.push_back(dout[size_t(i * OC + r * OCl + j)]);
    matmul_fwd(yr.data(), x.data(), wr, b.data() + r * OCl, N, IC, OCl, Ctx{});
    // The weight gradient alone, as tensor parallelism's backward calls it.
    matmul_bwd(static_cast<float*>(nullptr), dwr.data(), dbr.data(), doutr.data(), x.data(), wr, N, IC, OCl, Ctx{});
    for (int i = 0; i < N; i++)
      for (int j = 0; j < OCl; j++) ASSERT_EQ(yr[size_t(i * OCl + j)], y[size_t(i * OC + r * OCl + j)]) << r;
    for (int k = 0; k < OCl * IC; k++) ASSERT_EQ(dwr[size_t(k)], dw[size_t(r * OCl * IC + k)]) << r;
    for (int j = 0; j < OCl; j++) ASSERT_EQ(dbr[size_t(j)], db[size_t(r * OCl + j)]) << r;
  }
}

TEST(TensorParallelSlices, MatmulBackwardInTwoHalvesIsTheOneCall) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int N = 33, IC = 40, OC = 24;
  const std::vector<float> x = random_floats(size_t(N * IC), rng), w = random_floats(size_t(OC * IC), rng),
                           dout = random_floats(size_t(N * OC), rng), init = random_floats(size_t(OC * IC), rng);
  std::vector<float> dx1(size_t(N * IC)), dw1 = init, db1(size_t(OC), 1.f);
  std::vector<float> dx2(size_t(N * IC)), dw2 = init, db2(size_t(OC), 1.f);
  matmul_bwd(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(), N, IC, OC, Ctx{});
  matmul_bwd(dx2.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr), dout.data(),
             static_cast<const float*>(nullptr), w.data(), N, IC, OC, Ctx{});
  matmul_bwd(static_cast<float*>(nullptr), dw2.data(), db2.data(), dout.data(), x.data(), w.data(), N, IC, OC, Ctx{});
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(db1, db2);
}

TEST(TensorParallelSlices, AttentionOverASubsetOfHeadsIsBitwiseTheWholeOnes) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int B = 2, T = 19, NH = 4, hs = 8, C = NH * hs, P = 2, NHl = NH / P, Cl = C / P;
  const std::vector<float> qkv = random_floats(size_t(B * T * 3 * C), rng);
  std::vector<float> out(size_t(B * T * C)), att(size_t(B * NH * T * T));
  attention_fwd(out.data(), att.data(), qkv.data(), nullptr, B, T, C, NH, Ctx{});
  for (int r = 0; r < P; r++) {
    // This rank's heads: the same columns of q, k and v (what a column-parallel c_attn produces).
    std::vector<float> q;
    for (int n = 0; n < B * T; n++)
      for (int part = 0; part < 3; part++)
        for (int j = 0; j < Cl; j++) q.push_back(qkv[size_t(n * 3 * C + part * C + r * Cl + j)]);
    std::vector<float> o(size_t(B * T * Cl)), a(size_t(B * NHl * T * T));
    attention_fwd(o.data(), a.data(), q.data(), nullptr, B, T, Cl, NHl, Ctx{});
    for (int n = 0; n < B * T; n++)
      for (int j = 0; j < Cl; j++) ASSERT_EQ(o[size_t(n * Cl + j)], out[size_t(n * C + r * Cl + j)]) << r;
  }
}

}  // namespace
}  // namespace mt::ops
