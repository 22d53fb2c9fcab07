// Real 16-bit storage in the CPU reference: every op instantiated for bf16 and f16 against its float
// instantiation on the same inputs (drawn at random, then rounded to S so that both see identical
// values), and the conversions between storage types.
//
// The contract (kernels/ops.h): load S into fp32, compute in fp32, round once on store. So an S
// output differs from the float output by one rounding, |y_S - y| <= u |y| with u the unit roundoff
// (2^-8 bf16, 2^-11 f16; RNE gives a relative error of at most u), plus, for f16, half the smallest
// subnormal (2^-25) near zero. That is the per-element bound checked below, with slack for fp32
// summation-order differences (1e-6 of the largest value) where an S path runs its fp32 sums over
// differently laid out scratch. fp32 outputs (statistics, parameter gradients, losses) are the same
// fp32 computation on the same values, so they are compared bitwise. Attention differs from float
// by more than the final rounding, because the probabilities are stored in S and O = P V is computed
// from the stored P (as on the GPU); its bounds are derived at the test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/dtype.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

template <class S>
struct Traits;
template <>
struct Traits<bf16> {
  static double u() { return std::ldexp(1.0, -8); }
  static double tiny() { return std::ldexp(1.0, -134); }
};
template <>
struct Traits<f16> {
  static double u() { return std::ldexp(1.0, -11); }
  static double tiny() { return std::ldexp(1.0, -25); }
};

// Attention from given probabilities P (B,NH,T,T), in double: O = P V; dV = P^T dO; dP = dO V^T;
// dS = P (dP - rowsum(P dP)); dQ = s dS K; dK = s dS^T Q (the formulas of kernels/cpu/attention.cpp).
void attention_from_probabilities(std::vector<float>& out, std::vector<float>& dqkv, const std::vector<float>& P,
                                  const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T, int C,
                                  int NH) {
  const int hs = C / NH;
  const double s = 1.0 / std::sqrt(double(hs));
  out.assign(sz(B) * T * C, 0.f);
  dqkv.assign(qkv.size(), 0.f);
  auto q = [&](int b, int t, int c) { return double(qkv[(sz(b) * T + sz(t)) * 3 * C + sz(c)]); };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float* p = P.data() + (sz(b) * NH + sz(h)) * T * T;
      std::vector<double> dS(sz(T) * T, 0.0);
      for (int i = 0; i < T; i++) {
        std::vector<double> dP(sz(T));
        double pdp = 0;
        for (int j = 0; j < T; j++) {
          double acc = 0;
          for (int c = 0; c < hs; c++) acc += double(dout[(sz(b) * T + sz(i)) * C + sz(h * hs + c)]) * q(b, j, 2 * C + h * hs + c);
          dP[sz(j)] = acc;
          pdp += p[sz(i) * T + sz(j)] * acc;
        }
        for (int j = 0; j < T; j++) dS[sz(i) * T + sz(j)] = p[sz(i) * T + sz(j)] * (dP[sz(j)] - pdp);
        for (int c = 0; c < hs; c++) {
          double o = 0, dq = 0;
          for (int j = 0; j < T; j++) {
            o += p[sz(i) * T + sz(j)] * q(b, j, 2 * C + h * hs + c);
            dq += s * dS[sz(i) * T + sz(j)] * q(b, j, C + h * hs + c);
          }
          out[(sz(b) * T + sz(i)) * C + sz(h * hs + c)] = float(o);
          dqkv[(sz(b) * T + sz(i)) * 3 * C + sz(h * hs + c)] = float(dq);
        }
      }
      // dK and dV of key j: sums over the queries i.
      for (int j = 0; j < T; j++)
        for (int c = 0; c < hs; c++) {
          double dk = 0, dv = 0;
          for (int i = 0; i < T; i++) {
            dk += s * dS[sz(i) * T + sz(j)] * q(b, i, h * hs + c);
            dv += p[sz(i) * T + sz(j)] * double(dout[(sz(b) * T + sz(i)) * C + sz(h * hs + c)]);
          }
          dqkv[(sz(b) * T + sz(j)) * 3 * C + sz(C + h * hs + c)] = float(dk);
          dqkv[(sz(b) * T + sz(j)) * 3 * C + sz(2 * C + h * hs + c)] = float(dv);
        }
    }
}

template <class S>
class Storage16 : public ::testing::Test {
 protected:
  std::mt19937_64 rng{mt::testing::test_seed()};
  const double u = Traits<S>::u();

  // Random values rounded to S: `s` holds them in S, the returned float vector the same values.
  std::vector<float> rand(std::vector<S>& s, size_t n, float lo = -1.f, float hi = 1.f) {
    auto f = mt::testing::random_floats(n, rng, lo, hi);
    s.resize(n);
    for (size_t i = 0; i < n; i++) {
      s[i] = store_as<S>(f[i]);
      f[i] = load(s[i]);
    }
    return f;
  }
  std::vector<int32_t> rand_ints(size_t n, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }

  // Every element within one rounding of the float result (plus `slack` times its largest value).
  void expect_rounded(const std::vector<S>& got, const std::vector<float>& want, const char* what,
                      double slack = 0) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double mx = 0;
    for (float w : want) mx = std::max(mx, std::fabs(double(w)));
    int bad = 0;
    for (size_t i = 0; i < got.size() && bad < 5; i++) {
      const double g = load(got[i]), w = want[i];
      const double bound = u * std::fabs(w) + Traits<S>::tiny() + slack * mx;
      if (!(std::fabs(g - w) <= bound)) {
        ADD_FAILURE() << what << "[" << i << "] = " << g << ", float gives " << w << " (bound " << bound << ")";
        bad++;
      }
    }
  }
  // max |got - want| / max |want| below `bound`.
  void expect_rel(const std::vector<S>& got, const std::vector<float>& want, double bound, const char* what) {
    std::vector<float> g(got.size());
    for (size_t i = 0; i < got.size(); i++) g[i] = load(got[i]);
    EXPECT_LT(mt::testing::max_rel_error(g.data(), want.data(), g.size(), 1e-6), bound) << what;
  }
};

using StorageTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(Storage16, StorageTypes);

TYPED_TEST(Storage16, EncoderForwardRoundsOnceAndBackwardAccumulatesInFloat) {
  using S = TypeParam;
  const int B = 2, T = 9, C = 13, V = 5;
  auto tokens = this->rand_ints(sz(B) * T, 0, V - 1);
  std::vector<S> wte_s, wpe_s, dout_s;
  auto wte = this->rand(wte_s, sz(V) * C), wpe = this->rand(wpe_s, sz(T) * C), dout = this->rand(dout_s, sz(B) * T * C);
  std::vector<float> out(dout.size());
  std::vector<S> out_s(dout.size());
  encoder_fwd<float>(out.data(), tokens.data(), nullptr, wte.data(), wpe.data(), B, T, C);
  encoder_fwd<S>(out_s.data(), tokens.data(), nullptr, wte_s.data(), wpe_s.data(), B, T, C);
  this->expect_rounded(out_s, out, "out");
  std::vector<float> dwte(wte.size(), 0.5f), dwpe(wpe.size(), 0.25f), dwte_s = dwte, dwpe_s = dwpe;
  encoder_bwd<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), nullptr, B, T, C);
  encoder_bwd<S>(dwte_s.data(), dwpe_s.data(), dout_s.data(), tokens.data(), nullptr, B, T, C);
  EXPECT_EQ(dwte_s, dwte);
  EXPECT_EQ(dwpe_s, dwpe);
}

TYPED_TEST(Storage16, LayerNormStatisticsAndParameterGradientsAreTheFloatOnes) {
  using S = TypeParam;
  const int N = 37, C = 71;
  std::vector<S> x_s, w_s, b_s, dy_s;
  auto x = this->rand(x_s, sz(N) * C, -2.f, 3.f), w = this->rand(w_s, sz(C), 0.5f, 1.5f), b = this->rand(b_s, sz(C)),
       dy = this->rand(dy_s, sz(N) * C);
  std::vector<float> y(x.size()), mean(sz(N)), rstd(sz(N)), mean_s(sz(N)), rstd_s(sz(N));
  std::vector<S> y_s(x.size());
  layernorm_fwd<float>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_fwd<S>(y_s.data(), mean_s.data(), rstd_s.data(), x_s.data(), w_s.data(), b_s.data(), N, C);
  this->expect_rounded(y_s, y, "out");
  EXPECT_EQ(mean_s, mean);
  EXPECT_EQ(rstd_s, rstd);

  std::vector<float> dx(x.size()), dw(sz(C), 0.5f), db(sz(C), 0.25f), dw_s = dw, db_s = db;
  std::vector<S> dx_s(x.size());
  layernorm_bwd<float>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  layernorm_bwd<S>(dx_s.data(), dw_s.data(), db_s.data(), dy_s.data(), x_s.data(), w_s.data(), mean_s.data(),
                   rstd_s.data(), N, C);
  this->expect_rounded(dx_s, dx, "dinp");
  EXPECT_EQ(dw_s, dw);
  EXPECT_EQ(db_s, db);
}

TYPED_TEST(Storage16, MatmulRoundsTheFp32ProductOnce) {
  using S = TypeParam;
  struct Case {
    int N, IC, OC;
    bool bias;
  };
  // The last case has more rows than one 16-bit scratch chunk (OC > 2^22 / 256 makes it 256 rows).
  for (const Case c : {Case{5, 7, 3, true}, Case{67, 130, 45, false}, Case{70, 33, 129, true},
                       Case{300, 3, 16400, true}}) {
    SCOPED_TRACE(::testing::Message() << "N " << c.N << " IC " << c.IC << " OC " << c.OC);
    const int N = c.N, IC = c.IC, OC = c.OC;
    std::vector<S> x_s, w_s, b_s, d_s;
    auto x = this->rand(x_s, sz(N) * IC), w = this->rand(w_s, sz(OC) * IC), b = this->rand(b_s, sz(OC)),
         d = this->rand(d_s, sz(N) * OC);
    std::vector<float> out(sz(N) * OC);
    std::vector<S> out_s(out.size());
    matmul_fwd<float>(out.data(), x.data(), w.data(), c.bias ? b.data() : nullptr, N, IC, OC);
    matmul_fwd<S>(out_s.data(), x_s.data(), w_s.data(), c.bias ? b_s.data() : nullptr, N, IC, OC);
    this->expect_rounded(out_s, out, "out", 1e-6);

    std::vector<float> dx(x.size()), dw(w.size(), 0.5f), db(b.size(), 0.25f), dw_s = dw, db_s = db;
    std::vector<S> dx_s(x.size());
    matmul_bwd<float>(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), N, IC, OC);
    matmul_bwd<S>(dx_s.data(), dw_s.data(), db_s.data(), d_s.data(), x_s.data(), w_s.data(), N, IC, OC);
    this->expect_rounded(dx_s, dx, "dinp", 1e-6);
    // The same fp32 sums; with several chunks the rows are summed chunk by chunk (fp32 order only).
    EXPECT_LT(mt::testing::max_rel_error(dw_s.data(), dw.data(), dw.size()), 1e-6);
    EXPECT_LT(mt::testing::max_rel_error(db_s.data(), db.data(), db.size()), 1e-6);
  }
}

TYPED_TEST(Storage16, GeluAndAddRoundOnce) {
  using S = TypeParam;
  const int64_t N = 40000;  // above the parallel threshold
  std::vector<S> x_s, d_s;
  auto x = this->rand(x_s, sz(N), -6.f, 6.f), d = this->rand(d_s, sz(N));
  std::vector<float> y(sz(N)), dx(sz(N)), s(sz(N));
  std::vector<S> y_s(sz(N)), dx_s(sz(N)), s_s(sz(N));
  gelu_fwd<float>(y.data(), x.data(), N);
  gelu_fwd<S>(y_s.data(), x_s.data(), N);
  this->expect_rounded(y_s, y, "gelu");
  gelu_bwd<float>(dx.data(), d.data(), x.data(), N);
  gelu_bwd<S>(dx_s.data(), d_s.data(), x_s.data(), N);
  this->expect_rounded(dx_s, dx, "gelu'");
  add<float>(s.data(), x.data(), d.data(), N);
  add<S>(s_s.data(), x_s.data(), d_s.data(), N);
  this->expect_rounded(s_s, s, "add");
  add<S>(x_s.data(), x_s.data(), d_s.data(), N);  // in place
  EXPECT_EQ(std::vector<uint16_t>(reinterpret_cast<uint16_t*>(x_s.data()), reinterpret_cast<uint16_t*>(x_s.data()) + N),
            std::vector<uint16_t>(reinterpret_cast<uint16_t*>(s_s.data()), reinterpret_cast<uint16_t*>(s_s.data()) + N));
}

TYPED_TEST(Storage16, SoftmaxXentLossesAreTheFloatOnesAndGradientsRoundOnce) {
  using S = TypeParam;
  const int N = 9, V = 37, Vp = 40;
  std::vector<S> l_s;
  auto logits = this->rand(l_s, sz(N) * Vp, -4.f, 4.f);
  auto targets = this->rand_ints(sz(N), 0, V - 1);
  targets[2] = -1;
  std::vector<float> losses(sz(N)), dl(logits.size()), losses_s(sz(N)), losses_s2(sz(N));
  std::vector<S> dl_s(logits.size());
  softmax_xent<float>(losses.data(), dl.data(), logits.data(), targets.data(), 0.25f, N, V, Vp);
  softmax_xent<S>(losses_s.data(), dl_s.data(), l_s.data(), targets.data(), 0.25f, N, V, Vp);
  EXPECT_EQ(losses_s, losses);
  this->expect_rounded(dl_s, dl, "dlogits");
  // Loss only, and in place (dlogits aliasing logits): the same losses and gradient.
  softmax_xent<S>(losses_s2.data(), nullptr, l_s.data(), targets.data(), 0.25f, N, V, Vp);
  EXPECT_EQ(losses_s2, losses);
  softmax_xent<S>(losses_s2.data(), l_s.data(), l_s.data(), targets.data(), 0.25f, N, V, Vp);
  EXPECT_EQ(losses_s2, losses);
  for (size_t i = 0; i < dl_s.size(); i++) ASSERT_EQ(l_s[i].bits, dl_s[i].bits) << i;
}

// Attention in S: P is computed in fp32 and stored rounded, so |P_S - P| <= u P (+ fp32 noise).
// O = round(sum_j P_S,ij v_j): |O_S - O| <= u |O| + u sum_j P_ij |v_j| <= 2u max|v|. The first token
// of every sequence has O = v exactly, so max|O| is close to max|v|: bound 3u relative to max|O|
// (measured <= 0.9u). The backward reads the stored P, rounds dQ, dK, dV and adds no other
// rounding: bound 4u relative to the largest gradient (measured <= 0.95u).
TYPED_TEST(Storage16, AttentionStoresRoundedProbabilitiesAndComputesFromThem) {
  using S = TypeParam;
  const int B = 2, T = 70, C = 12, NH = 3;
  std::vector<int32_t> doc(sz(B) * T);
  for (size_t i = 0; i < doc.size(); i++) doc[i] = int32_t(i / 23);
  std::vector<S> qkv_s, dout_s;
  auto qkv = this->rand(qkv_s, sz(B) * T * 3 * C, -2.f, 2.f), dout = this->rand(dout_s, sz(B) * T * C);
  for (const int32_t* d : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(doc.data())}) {
    SCOPED_TRACE(d ? "doc ids" : "causal");
    std::vector<float> out(dout.size()), att(sz(B) * NH * T * T), dqkv(qkv.size()), scratch(att.size());
    attention_fwd<float>(out.data(), att.data(), qkv.data(), d, B, T, C, NH);
    attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), d, B, T, C, NH);
    std::vector<S> out_s(out.size()), att_s(att.size()), dqkv_s(qkv.size());
    std::vector<float> scratch_s(att.size());
    attention_fwd<S>(out_s.data(), att_s.data(), qkv_s.data(), d, B, T, C, NH);
    attention_bwd<S>(dqkv_s.data(), scratch_s.data(), dout_s.data(), qkv_s.data(), att_s.data(), d, B, T, C, NH);
    this->expect_rounded(att_s, att, "att", 1e-6);
    for (size_t i = 0; i < att.size(); i++) {
      if (att[i] == 0.f) {
        ASSERT_EQ(load(att_s[i]), 0.f) << "masked entry " << i;
      }
    }
    this->expect_rel(out_s, out, 3 * this->u, "out");
    this->expect_rel(dqkv_s, dqkv, 4 * this->u, "dqkv");

    // Where the difference comes from: out and dqkv are the exact results (double, below) computed
    // from the probabilities as stored, rounded once (slack: fp32 against double sums).
    std::vector<float> att_l(att.size());
    for (size_t i = 0; i < att.size(); i++) att_l[i] = load(att_s[i]);
    std::vector<float> out_ref, dqkv_ref;
    attention_from_probabilities(out_ref, dqkv_ref, att_l, qkv, dout, B, T, C, NH);
    this->expect_rounded(out_s, out_ref, "out from stored P", 1e-6);
    this->expect_rounded(dqkv_s, dqkv_ref, "dqkv from stored P", 1e-5);
  }
}

TYPED_TEST(Storage16, ConversionsRoundTripEveryValueAndKeepNanAndInf) {
  using S = TypeParam;
  // Every 16-bit pattern widens exactly and narrows back to itself; NaNs stay NaN.
  const int64_t n = 65536;
  std::vector<S> all(sz(n)), back(sz(n));
  for (int64_t i = 0; i < n; i++) all[sz(i)].bits = uint16_t(i);
  std::vector<float> wide(sz(n));
  convert<float, S>(wide.data(), all.data(), n);
  convert<S, float>(back.data(), wide.data(), n);
  for (int64_t i = 0; i < n; i++) {
    if (std::isnan(wide[sz(i)])) {
      ASSERT_TRUE(std::isnan(load(back[sz(i)]))) << std::hex << i;
    } else {
      ASSERT_EQ(back[sz(i)].bits, uint16_t(i)) << std::hex << i;
    }
  }
  // Specials from float.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> sp = {inf, -inf, nan, 0.f, -0.f};
  std::vector<S> sp_s(sp.size());
  convert<S, float>(sp_s.data(), sp.data(), int64_t(sp.size()));
  EXPECT_EQ(load(sp_s[0]), inf);
  EXPECT_EQ(load(sp_s[1]), -inf);
  EXPECT_TRUE(std::isnan(load(sp_s[2])));
  EXPECT_EQ(sp_s[3].bits, 0u);
  EXPECT_EQ(sp_s[4].bits, 0x8000u);
}

TEST(Storage16Convert, NarrowingRoundsToNearestWithTiesToEven) {
  // bf16 keeps the top 16 bits of a float: 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7.
  const std::vector<float> x = {f32_from_bits(0x3f808000u), f32_from_bits(0x3f818000u), f32_from_bits(0x3f808001u),
                                f32_from_bits(0xbf808000u)};
  std::vector<bf16> b(x.size());
  convert<bf16, float>(b.data(), x.data(), int64_t(x.size()));
  EXPECT_EQ(b[0].bits, 0x3f80u);  // tie, to even (down)
  EXPECT_EQ(b[1].bits, 0x3f82u);  // tie, to even (up)
  EXPECT_EQ(b[2].bits, 0x3f81u);  // just above the tie
  EXPECT_EQ(b[3].bits, 0xbf80u);  // negative tie

  // f16: ulp(1) = 2^-10; 65504 is the largest finite value, 65520 the tie with 2^16 (rounds to inf);
  // 2^-25 is half the smallest subnormal (ties to 0), 3 * 2^-25 ties up to 2 * 2^-24.
  const std::vector<float> y = {1.f + std::ldexp(1.f, -11), 1.f + 3 * std::ldexp(1.f, -11), 65519.f, 65520.f,
                                std::ldexp(1.f, -25), 3 * std::ldexp(1.f, -25), -65520.f};
  std::vector<f16> h(y.size());
  convert<f16, float>(h.data(), y.data(), int64_t(y.size()));
  EXPECT_EQ(h[0].bits, 0x3c00u);
  EXPECT_EQ(h[1].bits, 0x3c02u);
  EXPECT_EQ(h[2].bits, 0x7bffu);
  EXPECT_EQ(h[3].bits, 0x7c00u);
  EXPECT_EQ(h[4].bits, 0x0000u);
  EXPECT_EQ(h[5].bits, 0x0002u);
  EXPECT_EQ(h[6].bits, 0xfc00u);

  // float -> float is a bitwise copy, NaN payloads included.
  const std::vector<float> z = {f32_from_bits(0x7fc12345u), -0.f, 1.5f};
  std::vector<float> c(z.size());
  convert<float, float>(c.data(), z.data(), int64_t(z.size()));
  for (size_t i = 0; i < z.size(); i++) EXPECT_EQ(f32_bits(c[i]), f32_bits(z[i]));
}

}  // namespace
}  // namespace mt::cpu
