// The fused ops against the unfused sequences they replace:
//  - residual_layernorm_fwd == add, then layernorm_fwd (bitwise, every storage type, res in place);
//  - layernorm_bwd(accumulate) == layernorm_bwd into a temporary, then add onto dinp;
//  - matmul_fwd with pre_gelu == matmul_fwd, then gelu_fwd;
//  - matmul_fwd with a residual == matmul_fwd, then add;
//  - matmul_bwd with pre_gelu == matmul_bwd, then gelu_bwd.
// For float the fused and unfused results are the same arithmetic in the same order, so they must
// agree bitwise. For bf16/f16 the fusion removes one intermediate rounding, so they agree "within
// one rounding" (bounds at each test, u = 2^-8 bf16, 2^-11 f16), and each fused 16-bit result must
// be exactly the fp32 computation on the same values rounded once: the float instantiation's fused
// arithmetic on the loaded inputs, stored as S. (Shapes keep N below the matmul's 16-bit chunk of
// 256 rows, so that the fp32 GEMM calls are the same as the float instantiation's.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

template <class S>
double unit_roundoff() {
  if constexpr (std::is_same_v<S, bf16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<S, f16>) return std::ldexp(1.0, -11);
  return 0.0;
}
// Half the smallest f16 subnormal: the absolute rounding error near zero.
constexpr double kF16Tiny = 2.98023223876953125e-08;  // 2^-25

template <class S>
uint64_t bits(S x) {
  if constexpr (std::is_same_v<S, float>) return f32_bits(x);
  else if constexpr (std::is_same_v<S, double>) {
    uint64_t u;
    std::memcpy(&u, &x, 8);
    return u;
  } else {
    return x.bits;
  }
}

template <class S>
void expect_bitwise(const std::vector<S>& a, const std::vector<S>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); i++) ASSERT_EQ(bits(a[i]), bits(b[i])) << what << "[" << i << "]";
}

template <class S>
class Fused : public ::testing::Test {
 protected:
  using A = acc_t<S>;
  std::mt19937_64 rng{mt::testing::test_seed()};
  // Random values representable in S: `s` in S, the returned vector the same values in A.
  std::vector<A> rand(std::vector<S>& s, size_t n, double lo = -1, double hi = 1) {
    auto d = mt::testing::random_doubles(n, rng, lo, hi);
    s.resize(n);
    std::vector<A> a(n);
    for (size_t i = 0; i < n; i++) {
      s[i] = store_as<S>(A(d[i]));
      a[i] = load(s[i]);
    }
    return a;
  }
  static std::vector<S> stored(const std::vector<A>& a) {
    std::vector<S> s(a.size());
    for (size_t i = 0; i < a.size(); i++) s[i] = store_as<S>(a[i]);
    return s;
  }
  static constexpr bool kNarrow = !std::is_same_v<S, A>;
  // |fused - unfused| <= bound[i] element by element.
  static void expect_within(const std::vector<S>& fused, const std::vector<S>& unfused, const std::vector<double>& bound,
                            const char* what) {
    int bad = 0;
    for (size_t i = 0; i < fused.size() && bad < 5; i++) {
      const double d = std::fabs(double(load(fused[i])) - double(load(unfused[i])));
      if (!(d <= bound[i])) {
        ADD_FAILURE() << what << "[" << i << "]: fused " << load(fused[i]) << ", unfused " << load(unfused[i])
                      << ", bound " << bound[i];
        bad++;
      }
    }
  }
};

using AllTypes = ::testing::Types<float, double, bf16, f16>;
TYPED_TEST_SUITE(Fused, AllTypes);

TYPED_TEST(Fused, ResidualLayerNormIsAddThenLayerNormBitwise) {
  using S = TypeParam;
  using A = acc_t<S>;
  const int N = 67, C = 129;  // above the parallel threshold
  std::vector<S> a, b, w, bias;
  this->rand(a, sz(N) * C, -2, 2);
  this->rand(b, sz(N) * C);
  this->rand(w, sz(C), 0.5, 1.5);
  this->rand(bias, sz(C));
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    const S* bp = with_bias ? bias.data() : nullptr;
    std::vector<S> res(a.size()), out(a.size()), res_u(a.size()), out_u(a.size());
    std::vector<A> mean(sz(N)), rstd(sz(N)), mean_u(sz(N)), rstd_u(sz(N));
    residual_layernorm_fwd<S>(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(), bp, N,
                              C);
    add<S>(res_u.data(), a.data(), b.data(), int64_t(a.size()));
    layernorm_fwd<S>(out_u.data(), mean_u.data(), rstd_u.data(), res_u.data(), w.data(), bp, N, C);
    expect_bitwise(res, res_u, "res");
    expect_bitwise(out, out_u, "out");
    EXPECT_EQ(mean, mean_u);
    EXPECT_EQ(rstd, rstd_u);
    // In place: res aliasing the residual stream a, as the model uses it.
    std::vector<S> stream = a, out2(a.size());
    residual_layernorm_fwd<S>(stream.data(), out2.data(), mean.data(), rstd.data(), stream.data(), b.data(), w.data(),
                              bp, N, C);
    expect_bitwise(stream, res_u, "res in place");
    expect_bitwise(out2, out_u, "out in place");
  }
}

TYPED_TEST(Fused, LayerNormBackwardAccumulatesOntoDinp) {
  using S = TypeParam;
  using A = acc_t<S>;
  const int N = 70, C = 97;
  std::vector<S> x, w, dy, dinp0;
  auto xa = this->rand(x, sz(N) * C, -2, 3);
  auto wa = this->rand(w, sz(C), 0.5, 1.5);
  auto dya = this->rand(dy, sz(N) * C);
  auto d0 = this->rand(dinp0, sz(N) * C);
  std::vector<S> y(x.size());
  std::vector<A> mean(sz(N)), rstd(sz(N));
  layernorm_fwd<S>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C);

  // Fused: dinp = round(dinp + dLN); dweight and dbias accumulate as always.
  std::vector<S> fused = dinp0;
  std::vector<A> dw(sz(C), A(0.5)), db(sz(C), A(0.25)), dw_u = dw, db_u = db;
  layernorm_bwd<S>(fused.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C,
                   true);
  // Unfused: the backward into a temporary (which must be fully overwritten), then add.
  std::vector<S> tmp(x.size(), store_as<S>(A(NAN))), unfused(x.size());
  layernorm_bwd<S>(tmp.data(), dw_u.data(), db_u.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                   C, false);
  add<S>(unfused.data(), dinp0.data(), tmp.data(), int64_t(x.size()));
  EXPECT_EQ(dw, dw_u);
  EXPECT_EQ(db, db_u);
  if constexpr (!TestFixture::kNarrow) {
    expect_bitwise(fused, unfused, "dinp");
  } else {
    // Exactly: round(dinp0 + v) with v = dLN from the float instantiation on the same values.
    std::vector<float> v(x.size()), dwf(sz(C), 0.f), dbf(sz(C), 0.f);
    layernorm_bwd<float>(v.data(), dwf.data(), dbf.data(), dya.data(), xa.data(), wa.data(), mean.data(), rstd.data(),
                         N, C, false);
    std::vector<float> r(x.size());
    for (size_t i = 0; i < r.size(); i++) r[i] = d0[i] + v[i];
    expect_bitwise(fused, TestFixture::stored(r), "dinp = round(dinp + dLN)");
    // Against the unfused sequence round(dinp0 + round(v)): |round(v) - v| <= u|v| moves the sum by
    // at most u|v|, and each side's final rounding adds at most u|r| (plus 2^-25 near zero for f16).
    const double u = unit_roundoff<S>();
    std::vector<double> bound(r.size());
    for (size_t i = 0; i < r.size(); i++)
      bound[i] = u * (2.01 * std::fabs(double(r[i])) + 1.01 * std::fabs(double(v[i]))) + 2 * kF16Tiny;
    this->expect_within(fused, unfused, bound, "dinp vs unfused");
  }
}

TYPED_TEST(Fused, MatmulForwardGeluEpilogue) {
  using S = TypeParam;
  const int N = 67, IC = 45, OC = 131;
  std::vector<S> x, w, bias;
  auto xa = this->rand(x, sz(N) * IC, -2, 2);
  auto wa = this->rand(w, sz(OC) * IC, -0.5, 0.5);
  auto ba = this->rand(bias, sz(OC));
  std::vector<S> out(sz(N) * OC), pre(sz(N) * OC), out_u(sz(N) * OC), pre_u(sz(N) * OC);
  matmul_fwd<S>(out.data(), x.data(), w.data(), bias.data(), N, IC, OC, pre.data());
  matmul_fwd<S>(pre_u.data(), x.data(), w.data(), bias.data(), N, IC, OC);
  gelu_fwd<S>(out_u.data(), pre_u.data(), int64_t(out.size()));
  expect_bitwise(pre, pre_u, "pre_gelu");
  if constexpr (!TestFixture::kNarrow) {
    expect_bitwise(out, out_u, "out");
  } else {
    // Exactly: out = round(gelu(acc)) with acc the unrounded fp32 GEMM + bias.
    std::vector<float> acc(out.size()), g(out.size());
    matmul_fwd<float>(acc.data(), xa.data(), wa.data(), ba.data(), N, IC, OC);
    gelu_fwd<float>(g.data(), acc.data(), int64_t(acc.size()));
    expect_bitwise(pre, TestFixture::stored(acc), "pre_gelu = round(acc)");
    expect_bitwise(out, TestFixture::stored(g), "out = round(gelu(acc))");
    // Unfused: round(gelu(round(acc))). |gelu'| <= 1.13, so rounding acc moves gelu by at most
    // 1.13 u |acc|; the two final roundings add u |gelu| each (gelu(x) ~ 0 where |acc| is large
    // and negative, so the bound is taken on |acc| and |out|).
    const double u = unit_roundoff<S>();
    std::vector<double> bound(out.size());
    for (size_t i = 0; i < out.size(); i++)
      bound[i] = u * (1.2 * std::fabs(double(acc[i])) + 2.01 * std::fabs(double(g[i]))) + 2 * kF16Tiny;
    this->expect_within(out, out_u, bound, "out vs unfused");
  }
}

TYPED_TEST(Fused, MatmulForwardResidual) {
  using S = TypeParam;
  const int N = 67, IC = 45, OC = 131;
  std::vector<S> x, w, bias, res;
  auto xa = this->rand(x, sz(N) * IC, -2, 2);
  auto wa = this->rand(w, sz(OC) * IC, -0.5, 0.5);
  auto ba = this->rand(bias, sz(OC));
  auto ra = this->rand(res, sz(N) * OC, -4, 4);
  std::vector<S> out(sz(N) * OC), prod(sz(N) * OC), out_u(sz(N) * OC);
  matmul_fwd<S>(out.data(), x.data(), w.data(), bias.data(), N, IC, OC, nullptr, res.data());
  matmul_fwd<S>(prod.data(), x.data(), w.data(), bias.data(), N, IC, OC);
  add<S>(out_u.data(), res.data(), prod.data(), int64_t(out.size()));
  if constexpr (!TestFixture::kNarrow) {
    expect_bitwise(out, out_u, "out");
  } else {
    // Exactly: out = round((acc + bias) + res) with the GEMM + bias unrounded in fp32.
    std::vector<float> acc(out.size());
    matmul_fwd<float>(acc.data(), xa.data(), wa.data(), ba.data(), N, IC, OC, nullptr, ra.data());
    expect_bitwise(out, TestFixture::stored(acc), "out = round(acc + res)");
    // Unfused: round(res + round(p)) with p = acc - res: the inner rounding moves the sum by u |p|,
    // the two final roundings add u |acc| each.
    const double u = unit_roundoff<S>();
    std::vector<double> bound(out.size());
    for (size_t i = 0; i < out.size(); i++) {
      const double p = double(acc[i]) - double(ra[i]);
      bound[i] = u * (1.01 * std::fabs(p) + 2.01 * std::fabs(double(acc[i]))) + 2 * kF16Tiny;
    }
    this->expect_within(out, out_u, bound, "out vs unfused");
  }
}

TYPED_TEST(Fused, MatmulBackwardGeluEpilogue) {
  using S = TypeParam;
  using A = acc_t<S>;
  const int N = 67, IC = 131, OC = 45;  // the layer after the GELU: IC is the GELU's width
  std::vector<S> dout, inp, w, pre;
  auto da = this->rand(dout, sz(N) * OC);
  auto ia = this->rand(inp, sz(N) * IC);
  auto wa = this->rand(w, sz(OC) * IC, -0.5, 0.5);
  auto pa = this->rand(pre, sz(N) * IC, -4, 4);
  std::vector<S> dinp(inp.size(), store_as<S>(A(NAN))), tmp(inp.size()), dinp_u(inp.size());
  std::vector<A> dw(w.size(), A(0.5)), db(sz(OC), A(0.25)), dw_u = dw, db_u = db;
  matmul_bwd<S>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC, OC, pre.data());
  matmul_bwd<S>(tmp.data(), dw_u.data(), db_u.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
  gelu_bwd<S>(dinp_u.data(), tmp.data(), pre.data(), int64_t(inp.size()));
  EXPECT_EQ(dw, dw_u);
  EXPECT_EQ(db, db_u);
  if constexpr (!TestFixture::kNarrow) {
    expect_bitwise(dinp, dinp_u, "dinp");
  } else {
    // Exactly: dinp = round(gelu'(pre) * (dout @ W)) with the product in fp32.
    std::vector<float> prod(inp.size()), r(inp.size()), dwf(w.size(), 0.f);
    matmul_bwd<float>(prod.data(), dwf.data(), nullptr, da.data(), ia.data(), wa.data(), N, IC, OC);
    gelu_bwd<float>(r.data(), prod.data(), pa.data(), int64_t(r.size()));
    expect_bitwise(dinp, TestFixture::stored(r), "dinp = round(gelu'(pre) * (dout @ W))");
    // Unfused: round(gelu'(pre) * round(prod)): the inner rounding moves the product by u |r|, the
    // two final roundings add u |r| each (with r the exact fused value, up to 1 + u).
    const double u = unit_roundoff<S>();
    std::vector<double> bound(r.size());
    for (size_t i = 0; i < r.size(); i++) bound[i] = 3.05 * u * std::fabs(double(r[i])) + 2 * kF16Tiny;
    this->expect_within(dinp, dinp_u, bound, "dinp vs unfused");
  }
}

}  // namespace
}  // namespace mt::cpu
