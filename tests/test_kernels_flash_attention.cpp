// The flash attention twin (kernels/cpu/flash_attention.cpp) against the materialised attention
// (attention.cpp), which the gradcheck and document-mask tests already pin down:
//  - float forward, lse and backward agree with the materialised path on sequence lengths that are
//    not multiples of the 64-row tiles (1, 7, 67, 130), several heads, with and without doc ids;
//  - lse is the log-sum-exp of the scaled, masked scores (checked against a double computation);
//  - the backward matches central finite differences in double;
//  - results do not depend on the number of OpenMP threads;
//  - bf16/f16 storage stays within a few unit roundoffs of the float instantiation.
//
// Tolerances. float vs materialised: both compute the same sums in fp32 in different orders (online
// softmax with rescaling, tile-sized GEMMs), so they differ by a few multiples of 2^-24 times the
// number of terms: kFloatTol = 1e-5 relative to the largest magnitude (measured ~1e-7 to 1e-6). The
// finite-difference tolerance follows test_kernels_gradcheck.cpp (step 1e-5, kFdTol = 1e-6).
#include <gtest/gtest.h>
#include <omp.h>

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

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

constexpr double kFloatTol = 1e-5;
constexpr double kFdStep = 1e-5;
constexpr double kFdTol = 1e-6;

struct Shape {
  int B, T, C, NH;
};


template <class T>
double rel(const std::vector<T>& a, const std::vector<T>& b) {
  return mt::testing::max_rel_error(a.data(), b.data(), a.size(), 1e-6);
}

class FlashVsMaterialised : public ::testing::TestWithParam<std::tuple<Shape, bool>> {};

TEST_P(FlashVsMaterialised, ForwardLseAndBackwardAgreeInFloat) {
  const auto [s, with_doc] = GetParam();
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, hs = C / NH;
  std::mt19937_64 rng(mt::testing::test_seed());
  auto docs = testing::random_doc_ids(B, T, rng);
  const int32_t* doc = with_doc ? docs.data() : nullptr;
  auto qkv = mt::testing::random_floats(sz(B) * T * 3 * C, rng, -2.f, 2.f);
  auto dout = mt::testing::random_floats(sz(B) * T * C, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  std::vector<float> out_m(dout.size()), att(sz(B) * NH * T * T), dqkv_m(qkv.size(), nan), scr_m(att.size());
  attention_fwd<float>(out_m.data(), att.data(), qkv.data(), doc, B, T, C, NH);
  attention_bwd<float>(dqkv_m.data(), scr_m.data(), dout.data(), qkv.data(), att.data(), doc, B, T, C, NH);

  std::vector<float> out_f(dout.size(), nan), lse(sz(B) * NH * T, nan), dqkv_f(qkv.size(), nan), scr_f(lse.size());
  flash_attention_fwd<float>(out_f.data(), lse.data(), qkv.data(), doc, B, T, C, NH);
  flash_attention_bwd<float>(dqkv_f.data(), scr_f.data(), dout.data(), qkv.data(), out_f.data(), lse.data(), doc, B,
                             T, C, NH);
  EXPECT_LT(rel(out_f, out_m), kFloatTol);
  EXPECT_LT(rel(dqkv_f, dqkv_m), kFloatTol);

  // lse from the definition, in double.
  std::vector<double> lse_ref(lse.size());
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        std::vector<double> sc;
        for (int j = 0; j <= i; j++) {
          if (doc && doc[sz(b) * T + sz(j)] != doc[sz(b) * T + sz(i)]) continue;
          double dot = 0;
          for (int c = 0; c < hs; c++)
            dot += double(qkv[(sz(b) * T + sz(i)) * 3 * C + sz(h * hs + c)]) *
                   double(qkv[(sz(b) * T + sz(j)) * 3 * C + sz(C + h * hs + c)]);
          sc.push_back(dot / std::sqrt(double(hs)));
        }
        double m = -INFINITY, z = 0;
        for (double v : sc) m = std::max(m, v);
        for (double v : sc) z += std::exp(v - m);
        lse_ref[(sz(b) * NH + sz(h)) * T + sz(i)] = m + std::log(z);
      }
  std::vector<double> lse_d(lse.begin(), lse.end());
  EXPECT_LT(mt::testing::max_rel_error(lse_d.data(), lse_ref.data(), lse_d.size(), 1.0), kFloatTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashVsMaterialised,
                         ::testing::Combine(::testing::Values(Shape{1, 1, 8, 2}, Shape{2, 7, 12, 3},
                                                              Shape{1, 67, 16, 2}, Shape{2, 130, 24, 4}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           const Shape& s = std::get<0>(info.param);
                           char name[64];
                           std::snprintf(name, sizeof name, "B%d_T%d_C%d_NH%d_%s", s.B, s.T, s.C, s.NH,
                                         std::get<1>(info.param) ? "doc" : "causal");
                           return std::string(name);
                         });

// L = sum(out * R) in double; the flash backward must give dL/dqkv.
TEST(FlashAttention, BackwardMatchesFiniteDifferencesInDouble) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  // T = 67 crosses a 64-row tile in both directions; the doc case packs several documents.
  for (const Shape s : {Shape{2, 5, 6, 2}, Shape{1, 67, 4, 2}}) {
    for (bool with_doc : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T = " << s.T << (with_doc ? ", doc ids" : ", causal"));
      const int B = s.B, T = s.T, C = s.C, NH = s.NH;
      auto docs = testing::random_doc_ids(B, T, rng);
      const int32_t* doc = with_doc ? docs.data() : nullptr;
      auto qkv = mt::testing::random_doubles(sz(B) * T * 3 * C, rng, -2, 2);
      auto R = mt::testing::random_doubles(sz(B) * T * C, rng);
      std::vector<double> out(R.size()), lse(sz(B) * NH * T);
      auto loss = [&] {
        flash_attention_fwd<double>(out.data(), lse.data(), qkv.data(), doc, B, T, C, NH);
        double l = 0;
        for (size_t i = 0; i < out.size(); i++) l += out[i] * R[i];
        return l;
      };
      loss();
      std::vector<double> dqkv(qkv.size(), std::numeric_limits<double>::quiet_NaN()), scratch(lse.size());
      flash_attention_bwd<double>(dqkv.data(), scratch.data(), R.data(), qkv.data(), out.data(), lse.data(), doc, B,
                                  T, C, NH);
      const std::vector<double> numeric = mt::testing::central_differences(loss, qkv, kFdStep);
      EXPECT_LT(mt::testing::max_rel_error(dqkv.data(), numeric.data(), dqkv.size(), 1e-8), kFdTol);
    }
  }
}

TEST(FlashAttention, ResultsAreIndependentOfThreadCount) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  const int B = 2, T = 100, C = 32, NH = 4;
  auto qkv = mt::testing::random_floats(sz(B) * T * 3 * C, rng, -2.f, 2.f);
  auto dout = mt::testing::random_floats(sz(B) * T * C, rng);
  auto docs = testing::random_doc_ids(B, T, rng);
  auto run = [&] {
    std::vector<float> out(dout.size()), lse(sz(B) * NH * T), dqkv(qkv.size()), scratch(lse.size());
    flash_attention_fwd<float>(out.data(), lse.data(), qkv.data(), docs.data(), B, T, C, NH);
    flash_attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                               docs.data(), B, T, C, NH);
    return std::vector<std::vector<float>>{out, lse, dqkv};
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto ref = run();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(run(), ref) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

// bf16/f16 storage: the same inputs (representable in S) through the S and the float instantiation.
// The S forward differs from float by the rounding of out (u |out|) plus nothing else: scores,
// softmax and P V all run in fp32, so |out_S - out| <= u/2 |out|; bound 2u (measured ~0.5u). The backward also reads
// the rounded out (in D), rounded dO and writes rounded dQ, dK, dV: a few roundings along the chain,
// bound 4u relative to the largest gradient (measured below 1u).
template <class S>
void expect_close_to_float(double u, std::mt19937_64& rng) {
  const int B = 2, T = 70, C = 16, NH = 2;
  auto docs = testing::random_doc_ids(B, T, rng);
  auto qkv = mt::testing::random_floats(sz(B) * T * 3 * C, rng, -2.f, 2.f);
  auto dout = mt::testing::random_floats(sz(B) * T * C, rng);
  std::vector<S> qkv_s(qkv.size()), dout_s(dout.size());
  for (size_t i = 0; i < qkv.size(); i++) qkv_s[i] = store_as<S>(qkv[i]), qkv[i] = load(qkv_s[i]);
  for (size_t i = 0; i < dout.size(); i++) dout_s[i] = store_as<S>(dout[i]), dout[i] = load(dout_s[i]);
  for (const int32_t* doc : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(docs.data())}) {
    SCOPED_TRACE(doc ? "doc ids" : "causal");
    std::vector<float> out(dout.size()), lse(sz(B) * NH * T), dqkv(qkv.size()), scratch(lse.size());
    flash_attention_fwd<float>(out.data(), lse.data(), qkv.data(), doc, B, T, C, NH);
    flash_attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(), lse.data(), doc, B,
                               T, C, NH);
    std::vector<S> out_s(out.size()), dqkv_s(dqkv.size());
    std::vector<float> lse_s(lse.size()), scratch_s(lse.size());
    flash_attention_fwd<S>(out_s.data(), lse_s.data(), qkv_s.data(), doc, B, T, C, NH);
    flash_attention_bwd<S>(dqkv_s.data(), scratch_s.data(), dout_s.data(), qkv_s.data(), out_s.data(), lse_s.data(),
                           doc, B, T, C, NH);
    std::vector<float> out_l(out.size()), dqkv_l(dqkv.size());
    for (size_t i = 0; i < out.size(); i++) out_l[i] = load(out_s[i]);
    for (size_t i = 0; i < dqkv.size(); i++) dqkv_l[i] = load(dqkv_s[i]);
    EXPECT_EQ(lse_s, lse);  // fp32 throughout, from the same representable inputs
    EXPECT_LT(rel(out_l, out), 2 * u);
    EXPECT_LT(rel(dqkv_l, dqkv), 4 * u);
  }
}

TEST(FlashAttention, Bf16AndF16StorageStayWithinAFewRoundoffsOfFloat) {
  std::mt19937_64 rng(mt::testing::test_seed() + 3);
  {
    SCOPED_TRACE("bf16");
    expect_close_to_float<bf16>(std::ldexp(1.0, -8), rng);
  }
  {
    SCOPED_TRACE("f16");
    expect_close_to_float<f16>(std::ldexp(1.0, -11), rng);
  }
}

}  // namespace
}  // namespace mt::cpu
