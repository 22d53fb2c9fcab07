// Every backward of the CPU reference against central finite differences, in float64.
//
// For an op y = f(x) we draw a fixed random R of y's shape and take L = sum(y * R), so dL/dy = R is
// what the backward receives. The numeric gradient (L(x + h) - L(x - h)) / 2h with h = 1e-5 has
// truncation and round-off errors around 1e-10 here, so the analytic gradient must match it to
// kFdTol = 1e-6 (max abs difference over max abs value). Sizes are small, odd and prime so that no
// edge case hides behind a multiple of a block size; one attention case is longer than a row block.
//
// The same inputs then run through the float instantiation, which must agree with double to
// kFloatTol. Parameter gradients must accumulate (+=) and activation gradients be assigned (=): the
// former start from random values that are subtracted afterwards, the latter start as NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

using mt::testing::max_rel_error;
using mt::testing::random_doubles;
using Vec = std::vector<double>;

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

constexpr double kFdStep = 1e-5;
constexpr double kFdTol = 1e-6;
constexpr double kFloatTol = 1e-5;
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// dL/dx for every element of x by central differences; loss() reads x.
Vec numeric_grad(const std::function<double()>& loss, Vec& x) {
  return mt::testing::central_differences(loss, x, kFdStep);
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); i++) d[i] = a[i] - b[i];
  return d;
}

std::vector<float> to_f(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

double err(const Vec& analytic, const Vec& numeric) {
  return max_rel_error(analytic.data(), numeric.data(), analytic.size(), 1e-8);
}

double err_f(const std::vector<float>& f, const Vec& d) {
  Vec fd(f.begin(), f.end());
  return max_rel_error(fd.data(), d.data(), d.size(), 1e-6);
}

class KernelGradcheck : public ::testing::Test {
 protected:
  std::mt19937_64 rng{mt::testing::test_seed()};
  Vec rand(size_t n, double lo = -1, double hi = 1) { return random_doubles(n, rng, lo, hi); }
  std::vector<int32_t> rand_ints(size_t n, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
  // Contiguous document ids 0, 0, 1, 1, 1, 2, ... with random lengths, per batch row. The first
  // document has at least two tokens so that some token attends to more than itself.
  std::vector<int32_t> rand_docs(int B, int T) { return testing::random_doc_ids(B, T, rng); }
};

TEST_F(KernelGradcheck, EncoderScattersIntoTokenAndPositionRowsWithExplicitPositions) {
  const int B = 2, T = 5, C = 7, V = 4, maxT = 6;  // 10 tokens over 4 ids: rows repeat
  for (bool explicit_pos : {true, false}) {
    SCOPED_TRACE(explicit_pos ? "explicit positions" : "positions 0..T-1");
    auto tokens = rand_ints(sz(B) * T, 0, V - 1);
    auto pos = rand_ints(sz(B) * T, 0, maxT - 1);
    const int32_t* p = explicit_pos ? pos.data() : nullptr;
    Vec wte = rand(sz(V) * C), wpe = rand(sz(maxT) * C), R = rand(sz(B) * T * C), out(R.size());
    auto loss = [&] {
      encoder_fwd<double>(out.data(), tokens.data(), p, wte.data(), wpe.data(), B, T, C);
      return dot(out, R);
    };
    loss();
    for (int n = 0; n < B * T; n++)
      for (int c = 0; c < C; c++) {
        const int t = explicit_pos ? pos[sz(n)] : n % T;
        ASSERT_EQ(out[sz(n) * C + sz(c)], wte[sz(tokens[sz(n)]) * C + sz(c)] + wpe[sz(t) * C + sz(c)]);
      }
    Vec dwte0 = rand(wte.size()), dwpe0 = rand(wpe.size()), dwte = dwte0, dwpe = dwpe0;
    encoder_bwd<double>(dwte.data(), dwpe.data(), R.data(), tokens.data(), p, B, T, C);
    EXPECT_LT(err(minus(dwte, dwte0), numeric_grad(loss, wte)), kFdTol);
    EXPECT_LT(err(minus(dwpe, dwpe0), numeric_grad(loss, wpe)), kFdTol);

    std::vector<float> outf(out.size()), wtef = to_f(wte), wpef = to_f(wpe), Rf = to_f(R);
    std::vector<float> dwtef(wte.size(), 0.f), dwpef(wpe.size(), 0.f);
    encoder_fwd<float>(outf.data(), tokens.data(), p, wtef.data(), wpef.data(), B, T, C);
    encoder_bwd<float>(dwtef.data(), dwpef.data(), Rf.data(), tokens.data(), p, B, T, C);
    loss();
    EXPECT_LT(err_f(outf, out), kFloatTol);
    EXPECT_LT(err_f(dwtef, minus(dwte, dwte0)), kFloatTol);
    EXPECT_LT(err_f(dwpef, minus(dwpe, dwpe0)), kFloatTol);
  }
}

TEST_F(KernelGradcheck, LayerNormBackwardMatchesFiniteDifferences) {
  const int N = 5, C = 7;
  Vec inp = rand(sz(N) * C, -2, 3), w = rand(sz(C), 0.5, 1.5), b = rand(sz(C)), R = rand(inp.size());
  Vec out(inp.size()), mean(sz(N)), rstd(sz(N));
  auto loss = [&] {
    layernorm_fwd<double>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();
  // Forward against the textbook formula.
  for (int i = 0; i < N; i++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += inp[sz(i * C + c)] / C;
    for (int c = 0; c < C; c++) v += (inp[sz(i * C + c)] - m) * (inp[sz(i * C + c)] - m) / C;
    for (int c = 0; c < C; c++)
      EXPECT_NEAR(out[sz(i * C + c)], (inp[sz(i * C + c)] - m) / std::sqrt(v + 1e-5) * w[sz(c)] + b[sz(c)], 1e-12);
  }
  Vec dinp(inp.size(), kNaN), dw0 = rand(w.size()), db0 = rand(b.size()), dw = dw0, db = db0;
  layernorm_bwd<double>(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(), rstd.data(), N,
                        C);
  EXPECT_LT(err(dinp, numeric_grad(loss, inp)), kFdTol);
  EXPECT_LT(err(minus(dw, dw0), numeric_grad(loss, w)), kFdTol);
  EXPECT_LT(err(minus(db, db0), numeric_grad(loss, b)), kFdTol);

  loss();
  auto inpf = to_f(inp), wf = to_f(w), bf = to_f(b), Rf = to_f(R);
  std::vector<float> outf(out.size()), meanf(sz(N)), rstdf(sz(N)), dinpf(inp.size()), dwf(w.size(), 0.f),
      dbf(b.size(), 0.f);
  layernorm_fwd<float>(outf.data(), meanf.data(), rstdf.data(), inpf.data(), wf.data(), bf.data(), N, C);
  layernorm_bwd<float>(dinpf.data(), dwf.data(), dbf.data(), Rf.data(), inpf.data(), wf.data(), meanf.data(),
                       rstdf.data(), N, C);
  EXPECT_LT(err_f(outf, out), kFloatTol);
  EXPECT_LT(err_f(dinpf, dinp), kFloatTol);
  EXPECT_LT(err_f(dwf, minus(dw, dw0)), kFloatTol);
  EXPECT_LT(err_f(dbf, minus(db, db0)), kFloatTol);
}

TEST_F(KernelGradcheck, MatmulBackwardMatchesFiniteDifferencesWithAndWithoutBias) {
  const int N = 5, IC = 7, OC = 3;
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with bias" : "no bias");
    Vec inp = rand(sz(N) * IC), w = rand(sz(OC) * IC), b = rand(sz(OC)), R = rand(sz(N) * OC), out(R.size());
    const double* bias = with_bias ? b.data() : nullptr;
    auto loss = [&] {
      matmul_fwd<double>(out.data(), inp.data(), w.data(), bias, N, IC, OC);
      return dot(out, R);
    };
    loss();
    for (int i = 0; i < N; i++)
      for (int o = 0; o < OC; o++) {
        double s = with_bias ? b[sz(o)] : 0.0;
        for (int k = 0; k < IC; k++) s += inp[sz(i * IC + k)] * w[sz(o * IC + k)];
        EXPECT_NEAR(out[sz(i * OC + o)], s, 1e-13);
      }
    Vec dinp(inp.size(), kNaN), dw0 = rand(w.size()), db0 = rand(b.size()), dw = dw0, db = db0;
    matmul_bwd<double>(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(), inp.data(), w.data(), N, IC,
                       OC);
    EXPECT_LT(err(dinp, numeric_grad(loss, inp)), kFdTol);
    EXPECT_LT(err(minus(dw, dw0), numeric_grad(loss, w)), kFdTol);
    if (with_bias) {
      EXPECT_LT(err(minus(db, db0), numeric_grad(loss, b)), kFdTol);
    } else {
      EXPECT_EQ(db, db0);
    }

    // dinp == nullptr skips the input gradient but still accumulates dweight.
    Vec dw2 = dw0;
    matmul_bwd<double>(nullptr, dw2.data(), nullptr, R.data(), inp.data(), w.data(), N, IC, OC);
    EXPECT_LT(err(dw2, dw), 1e-14);

    loss();
    auto inpf = to_f(inp), wf = to_f(w), bf = to_f(b), Rf = to_f(R);
    std::vector<float> outf(out.size()), dinpf(inp.size()), dwf(w.size(), 0.f), dbf(b.size(), 0.f);
    matmul_fwd<float>(outf.data(), inpf.data(), wf.data(), with_bias ? bf.data() : nullptr, N, IC, OC);
    matmul_bwd<float>(dinpf.data(), dwf.data(), dbf.data(), Rf.data(), inpf.data(), wf.data(), N, IC, OC);
    EXPECT_LT(err_f(outf, out), kFloatTol);
    EXPECT_LT(err_f(dinpf, dinp), kFloatTol);
    EXPECT_LT(err_f(dwf, minus(dw, dw0)), kFloatTol);
  }
}

TEST_F(KernelGradcheck, GeluIsTheTanhApproximationAndItsDerivative) {
  const int64_t N = 13;
  Vec x = rand(sz(N), -5, 5), R = rand(sz(N)), out(sz(N));
  auto loss = [&] {
    gelu_fwd<double>(out.data(), x.data(), N);
    return dot(out, R);
  };
  loss();
  for (int64_t i = 0; i < N; i++) {
    const double v = x[sz(i)];
    const double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out[sz(i)], ref, 1e-14);
  }
  Vec dx(x.size(), kNaN);
  gelu_bwd<double>(dx.data(), R.data(), x.data(), N);
  EXPECT_LT(err(dx, numeric_grad(loss, x)), kFdTol);

  auto xf = to_f(x), Rf = to_f(R);
  std::vector<float> outf(out.size()), dxf(x.size());
  gelu_fwd<float>(outf.data(), xf.data(), N);
  gelu_bwd<float>(dxf.data(), Rf.data(), xf.data(), N);
  loss();
  EXPECT_LT(err_f(outf, out), kFloatTol);
  EXPECT_LT(err_f(dxf, dx), kFloatTol);
}

struct AttnShape {
  int B, T, C, NH;
};

class AttentionGradcheck : public KernelGradcheck, public ::testing::WithParamInterface<std::tuple<AttnShape, bool>> {};

TEST_P(AttentionGradcheck, BackwardMatchesFiniteDifferencesAndProbabilitiesAreMasked) {
  const auto [s, with_doc] = GetParam();
  const int B = s.B, T = s.T, C = s.C, NH = s.NH;
  auto docs = rand_docs(B, T);
  const int32_t* doc = with_doc ? docs.data() : nullptr;
  Vec qkv = rand(sz(B) * T * 3 * C, -2, 2), R = rand(sz(B) * T * C), out(R.size());
  Vec att(sz(B) * NH * T * T, kNaN);
  auto loss = [&] {
    attention_fwd<double>(out.data(), att.data(), qkv.data(), doc, B, T, C, NH);
    return dot(out, R);
  };
  loss();
  for (int bh = 0; bh < B * NH; bh++)
    for (int i = 0; i < T; i++) {
      double rowsum = 0;
      for (int j = 0; j < T; j++) {
        const double p = att[(sz(bh) * T + sz(i)) * T + sz(j)];
        const int b = bh / NH;
        const bool allowed = j <= i && (!doc || doc[sz(b * T + i)] == doc[sz(b * T + j)]);
        if (!allowed) {
          ASSERT_EQ(p, 0.0) << "masked entry (" << i << ", " << j << ") of pair " << bh;
        }
        rowsum += p;
      }
      ASSERT_NEAR(rowsum, 1.0, 1e-12);
    }
  Vec dqkv(qkv.size(), kNaN), scratch(att.size(), kNaN);
  attention_bwd<double>(dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), doc, B, T, C, NH);
  EXPECT_LT(err(dqkv, numeric_grad(loss, qkv)), kFdTol);

  loss();
  auto qkvf = to_f(qkv), Rf = to_f(R);
  std::vector<float> outf(out.size()), attf(att.size()), dqkvf(qkv.size()), scratchf(att.size());
  attention_fwd<float>(outf.data(), attf.data(), qkvf.data(), doc, B, T, C, NH);
  attention_bwd<float>(dqkvf.data(), scratchf.data(), Rf.data(), qkvf.data(), attf.data(), doc, B, T, C, NH);
  EXPECT_LT(err_f(outf, out), kFloatTol);
  EXPECT_LT(err_f(attf, att), kFloatTol);
  EXPECT_LT(err_f(dqkvf, dqkv), kFloatTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGradcheck,
                         ::testing::Combine(::testing::Values(AttnShape{2, 5, 9, 3}, AttnShape{1, 7, 5, 1},
                                                              AttnShape{1, 67, 4, 2}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           const AttnShape& s = std::get<0>(info.param);
                           char name[64];
                           std::snprintf(name, sizeof name, "B%d_T%d_C%d_NH%d_%s", s.B, s.T, s.C, s.NH,
                                         std::get<1>(info.param) ? "doc" : "causal");
                           return std::string(name);
                         });

TEST_F(KernelGradcheck, SoftmaxXentLossesAndGradientsIgnoreRowsAndPadding) {
  const int N = 6, V = 7, Vp = 10;
  const double dloss = 0.37;
  Vec logits = rand(sz(N) * Vp, -3, 3);
  auto targets = rand_ints(sz(N), 0, V - 1);
  targets[2] = -1;     // ignored row
  targets[4] = V - 1;  // the last real column
  for (int i = 0; i < N; i++)
    for (int j = V; j < Vp; j++) logits[sz(i * Vp + j)] = kNaN;  // padding must never be read
  Vec losses(sz(N));
  auto loss = [&] {
    softmax_xent<double>(losses.data(), nullptr, logits.data(), targets.data(), dloss, N, V, Vp);
    double s = 0;
    for (double l : losses) s += dloss * l;
    return s;
  };
  loss();
  for (int i = 0; i < N; i++) {
    double z = 0;
    for (int j = 0; j < V; j++) z += std::exp(logits[sz(i * Vp + j)]);
    const double ref = targets[sz(i)] < 0 ? 0.0 : std::log(z) - logits[sz(i * Vp + targets[sz(i)])];
    EXPECT_NEAR(losses[sz(i)], ref, 1e-13) << "row " << i;
  }
  const Vec losses_only = losses;
  Vec dlogits(logits.size(), kNaN), losses2(sz(N));
  softmax_xent<double>(losses2.data(), dlogits.data(), logits.data(), targets.data(), dloss, N, V, Vp);
  EXPECT_LT(err(losses2, losses_only), 1e-15);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < Vp; j++)
      if (j >= V || targets[sz(i)] < 0) {
        ASSERT_EQ(dlogits[sz(i * Vp + j)], 0.0) << i << "," << j;
      }

  // Finite differences over the real columns only (the padding is NaN).
  Vec numeric = numeric_grad(loss, logits), analytic_real, numeric_real;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < V; j++) {
      analytic_real.push_back(dlogits[sz(i * Vp + j)]);
      numeric_real.push_back(numeric[sz(i * Vp + j)]);
    }
  EXPECT_LT(err(analytic_real, numeric_real), kFdTol);

  // In place: dlogits aliasing logits gives the same losses and gradient.
  Vec inplace = logits, losses3(sz(N));
  softmax_xent<double>(losses3.data(), inplace.data(), inplace.data(), targets.data(), dloss, N, V, Vp);
  EXPECT_EQ(losses3, losses2);
  EXPECT_EQ(inplace, dlogits);

  auto logitsf = to_f(logits);
  std::vector<float> lossesf(sz(N)), dlogitsf(logits.size());
  softmax_xent<float>(lossesf.data(), dlogitsf.data(), logitsf.data(), targets.data(), float(dloss), N, V, Vp);
  EXPECT_LT(err_f(lossesf, losses2), kFloatTol);
  EXPECT_LT(err_f(dlogitsf, dlogits), kFloatTol);
  std::vector<float> inplacef = logitsf, lossesf2(sz(N));
  softmax_xent<float>(lossesf2.data(), inplacef.data(), inplacef.data(), targets.data(), float(dloss), N, V, Vp);
  EXPECT_EQ(lossesf2, lossesf);
  EXPECT_EQ(inplacef, dlogitsf);
}

TEST_F(KernelGradcheck, SoftmaxXentIsStableForLargeLogits) {
  // exp(1000) overflows; with max subtraction the loss is that of the shifted logits.
  const int N = 3, V = 5;
  Vec logits = rand(sz(N) * V, -3, 3), shifted = logits;
  for (auto& x : shifted) x += 1000;
  std::vector<int32_t> targets = {0, 3, 4};
  Vec l1(sz(N)), l2(sz(N)), g1(logits.size()), g2(logits.size());
  softmax_xent<double>(l1.data(), g1.data(), logits.data(), targets.data(), 1.0, N, V, V);
  softmax_xent<double>(l2.data(), g2.data(), shifted.data(), targets.data(), 1.0, N, V, V);
  EXPECT_LT(err(l2, l1), 1e-12);
  EXPECT_LT(err(g2, g1), 1e-12);
  auto shiftedf = to_f(shifted);
  std::vector<float> lf(sz(N)), gf(logits.size());
  softmax_xent<float>(lf.data(), gf.data(), shiftedf.data(), targets.data(), 1.f, N, V, V);
  for (float x : lf) EXPECT_TRUE(std::isfinite(x));
  EXPECT_LT(err_f(gf, g1), 1e-4);  // the shifted float logits lost ~1e-4 absolute precision
}

}  // namespace
}  // namespace mt::cpu
