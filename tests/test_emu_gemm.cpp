// The GEMM-backed CUDA ops (linear layers, materialised attention), built by the host compiler and run
// on the warp emulator (kernels/cuda/warp_emulation.h) against their CPU twins (kernels/cpu/cpu_ops.h),
// in float, bf16 and fp16.
//
// cuBLASLt cannot run here, but gemm() (kernels/cuda/gemm.cu) has a path that needs no library: when
// cuBLASLt offers no algorithm, a SIMT kernel computes the product, and an epilogue kernel applies the
// bias or GELU into D from an fp32 temporary. The tests run the ops' own GEMM descriptors (the
// *_gemm functions of matmul_kernels.cuh and attention_kernels.cuh) through that path, between the
// ops' other kernels in the launchers' order, so they check the descriptors (shapes, transposes,
// leading dimensions, batch strides), the fallback kernels and the non-GEMM kernels (bias gradient,
// masked softmax and its backward, the rounding of dQ and dK) together. Tolerances are the GPU's
// (kernels/cuda/tolerances.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/gemm_kernels.cuh"
#include "kernels/cuda/matmul_kernels.cuh"
#include "kernels/cuda/tolerances.h"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using namespace mt::testing::emu;  // run, to_storage, to_floats, error, part_error, nans (tests/emu_test_util.h)
using mt::bf16;
using mt::DType;
using mt::f16;
using mt::cuda::dev_ptr;
using mt::cuda::Epilogue;
using mt::cuda::Gemm;
using mt::cuda::LaunchShape;
namespace tol = mt::cuda::tol;
namespace ak = mt::cuda::attention_kernels;
namespace gk = mt::cuda::gemm_kernels;
namespace mk = mt::cuda::matmul_kernels;

// ---- gemm() without cuBLASLt, as gemm.cu runs it ----

template <class AB, class D>
void simple_gemm(const Gemm& g, void* d, int ldd, int64_t stride_d, float beta) {
  run(gk::simple_gemm_shape(g.m, g.n, g.batch), gk::simple_gemm_kernel<AB, D>, static_cast<D*>(d), ldd, stride_d,
      beta, static_cast<const AB*>(g.a), g.lda, g.stride_a, g.trans_a, static_cast<const AB*>(g.b), g.ldb,
      g.stride_b, g.trans_b, g.alpha, g.m, g.n, g.k, g.batch);
}

// The SIMT kernel for g's operand type, writing D of type d_type.
void simple_gemm(const Gemm& g, void* d, DType d_type, int ldd, int64_t stride_d, float beta) {
  const bool f32_out = d_type == DType::f32;
  if (g.ab_type == DType::bf16 && f32_out)
    simple_gemm<__nv_bfloat16, float>(g, d, ldd, stride_d, beta);
  else if (g.ab_type == DType::bf16)
    simple_gemm<__nv_bfloat16, __nv_bfloat16>(g, d, ldd, stride_d, beta);
  else if (g.ab_type == DType::f16 && f32_out)
    simple_gemm<__half, float>(g, d, ldd, stride_d, beta);
  else if (g.ab_type == DType::f16)
    simple_gemm<__half, __half>(g, d, ldd, stride_d, beta);
  else
    simple_gemm<float, float>(g, d, ldd, stride_d, beta);
}

template <class D>
void epilogue(const Gemm& g, const float* x) {
  run(gk::epilogue_shape(g.m, g.n), gk::epilogue_kernel<D>, static_cast<D*>(g.d), g.ldd, x,
      static_cast<const D*>(g.bias), static_cast<const D*>(g.c ? g.c : g.d), g.beta, static_cast<D*>(g.aux),
      g.epilogue, g.m, g.n);
}

// gemm(g) when cuBLASLt has no algorithm: the product straight into D, or, with a bias or GELU
// epilogue or a separate C, into an fp32 (m x n) temporary that the epilogue kernel reads.
void emulated_gemm(const Gemm& g) {
  if (g.bias == nullptr && g.epilogue == Epilogue::none && g.c == nullptr) {
    simple_gemm(g, g.d, g.d_type, g.ldd, g.stride_d, g.beta);
    return;
  }
  std::vector<float> x(size_t(g.m) * size_t(g.n));
  simple_gemm(g, x.data(), DType::f32, g.m, 0, 0.f);
  switch (g.d_type) {
    case DType::bf16: epilogue<__nv_bfloat16>(g, x.data()); break;
    case DType::f16: epilogue<__half>(g, x.data()); break;
    default: epilogue<float>(g, x.data()); break;
  }
}

// ---- fixture ----

template <class S>
class EmulatedGemmOps : public EmulatedTest<S> {};
TYPED_TEST_SUITE(EmulatedGemmOps, StorageTypes, StorageNames);

struct LinearShape { int N, IC, OC; };
// N = 37: the bias gradient's 8 thread rows take several rows each; OC = 53 spans two 32-column
// blocks; N = 300: the column sum takes two splits of rows.
const LinearShape kLinearShapes[] = {{1, 1, 1}, {7, 13, 5}, {37, 19, 53}, {300, 9, 40}};

TYPED_TEST(EmulatedGemmOps, MatmulForwardMatchesTheCpu) {
  using S = TypeParam;
  for (LinearShape s : kLinearShapes) {
    // 0: plain, 1: bias, 2: bias + GELU, 3: GELU, 4: bias + residual, 5: residual
    for (int variant = 0; variant < 6; variant++) {
      const bool bias = variant == 1 || variant == 2 || variant == 4, gelu = variant == 2 || variant == 3;
      const bool residual = variant >= 4;
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC << " bias=" << bias
                                        << " gelu=" << gelu << " residual=" << residual);
      const auto inp = this->values(size_t(s.N) * s.IC), w = this->values(size_t(s.OC) * s.IC);
      const auto b = this->values(size_t(s.OC));
      const size_t nout = size_t(s.N) * s.OC;
      const auto res = this->values(nout);
      std::vector<S> out(nout), pre(nout), got = nans<S>(nout), got_pre = nans<S>(nout);
      mt::cpu::matmul_fwd<S>(out.data(), inp.data(), w.data(), bias ? b.data() : nullptr, s.N, s.IC, s.OC,
                             gelu ? pre.data() : nullptr, residual ? res.data() : nullptr);
      emulated_gemm(mk::fwd_gemm<S>(got.data(), inp.data(), w.data(), bias ? b.data() : nullptr, s.N, s.IC, s.OC,
                                    gelu ? got_pre.data() : nullptr, residual ? res.data() : nullptr));
      // Errors relative to the largest output, or to the largest bias or residual term added when
      // that is larger: with one output (N = IC = OC = 1) x w + b + r can cancel to near zero, and
      // the rounding of its terms is then all that is left to compare against.
      double terms = 0;
      for (const float v : to_floats(b)) terms = bias ? std::max(terms, double(std::fabs(v))) : terms;
      for (const float v : to_floats(res)) terms = residual ? std::max(terms, double(std::fabs(v))) : terms;
      const auto rel = [&](const std::vector<S>& g, const std::vector<S>& w) {
        return mt::testing::max_rel_error(to_floats(g).data(), to_floats(w).data(), nout, std::max(terms, 1e-12));
      };
      EXPECT_LE(rel(got, out), (gelu ? tol::kMatmulGelu : tol::kMatmul).of<S>()) << "out";
      if (gelu) {
        EXPECT_LE(rel(got_pre, pre), tol::kMatmul.of<S>()) << "pre_gelu";
      }
    }
  }
}

TYPED_TEST(EmulatedGemmOps, MatmulBackwardAssignsDinpAndAccumulatesDweightDbias) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (LinearShape s : kLinearShapes) {
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC << " gelu=" << gelu);
      const auto inp = this->values(size_t(s.N) * s.IC), w = this->values(size_t(s.OC) * s.IC);
      const auto dout = this->values(size_t(s.N) * s.OC), pre = this->values(inp.size(), -3.f, 3.f);
      auto dw = this->floats(w.size()), db = this->floats(size_t(s.OC));
      auto got_dw = dw, got_db = db;
      std::vector<S> dinp(inp.size()), got_dinp = nans<S>(inp.size());
      const S* p = gelu ? pre.data() : nullptr;
      mt::cpu::matmul_bwd<S>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.N, s.IC, s.OC, p);
      // matmul_bwd's order: the bias gradient, dweight, dinp.
      column_sums<1>({{got_db.data()}}, mk::BiasGradTerm<D>{dev_ptr(dout.data())}, s.N, s.OC);
      emulated_gemm(mk::dweight_gemm<S>(got_dw.data(), dout.data(), inp.data(), s.N, s.IC, s.OC));
      emulated_gemm(mk::dinp_gemm<S>(got_dinp.data(), dout.data(), w.data(), s.N, s.IC, s.OC, p));
      EXPECT_LE(error(got_dw, dw), tol::kMatmulParamGrads.of<S>()) << "dweight";
      EXPECT_LE(error(got_db, db), tol::kMatmulParamGrads.of<S>()) << "dbias";
      EXPECT_LE(error(got_dinp, dinp), (gelu ? tol::kMatmulGelu : tol::kMatmul).of<S>()) << "dinp";
    }
  }
}

struct AttentionShape {
  int B, T, C, NH;
  bool docs;
};
// T = 1; head sizes 4, 10 and 12; T = 33 and 40 put rows past a warp; packed documents.
const AttentionShape kAttentionShapes[] = {
    {1, 1, 8, 1, false}, {2, 7, 12, 3, false}, {1, 33, 20, 2, true}, {2, 40, 24, 2, true}};

std::string label(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " NH=" + std::to_string(s.NH) + (s.docs ? " docs" : "");
}

TYPED_TEST(EmulatedGemmOps, AttentionForwardMatchesTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (const AttentionShape& s : kAttentionShapes) {
    SCOPED_TRACE(label(s));
    const ak::Dims dims{s.B, s.T, s.C, s.NH, s.C / s.NH};
    const size_t nqkv = size_t(s.B) * s.T * 3 * s.C, nout = size_t(s.B) * s.T * s.C;
    const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
    const auto qkv = this->values(nqkv, -2.f, 2.f);
    const auto doc = mt::testing::random_doc_ids(s.B, s.T, this->rng);
    const int32_t* d = s.docs ? doc.data() : nullptr;
    std::vector<S> out(nout), att(natt), got_out = nans<S>(nout), got_att = nans<S>(natt);
    mt::cpu::attention_fwd<S>(out.data(), att.data(), qkv.data(), d, s.B, s.T, s.C, s.NH);

    // attention_fwd's sequence: fp32 scores (in att itself for float storage), the masked softmax
    // into att, then out from att as stored.
    std::vector<float> temp(std::is_same_v<S, float> ? 0 : natt, NAN);
    float* scores = std::is_same_v<S, float> ? reinterpret_cast<float*>(got_att.data()) : temp.data();
    for (int b = 0; b < s.B; b++) emulated_gemm(ak::scores_gemm(dims, scores, qkv.data(), b));
    const int64_t rows = int64_t(s.B) * s.NH * s.T;
    run(ak::rows_shape(rows), ak::masked_softmax_kernel<D>, dev_ptr(got_att.data()), static_cast<const float*>(scores),
        d, s.B, s.NH, s.T);
    for (int b = 0; b < s.B; b++) emulated_gemm(ak::out_gemm(dims, got_out.data(), qkv.data(), got_att.data(), b));

    EXPECT_LE(error(got_att, att), tol::kAttentionFwd.of<S>()) << "att";
    EXPECT_LE(error(got_out, out), tol::kAttentionFwd.of<S>()) << "out";
  }
}

// The attention backward's dS (B, NH, T, T) from the stored P, in double: dP = dO V^T and
// dS = P * (dP - rowsum(P * dP)). The CPU op keeps dS one row block at a time and does not hand it
// back, so the GPU sequence's intermediate is held to this reference.
template <class S>
std::vector<float> reference_ds(const std::vector<S>& att, const std::vector<S>& dout, const std::vector<S>& qkv,
                                int B, int T, int C, int NH) {
  const std::vector<float> p = to_floats(att), dO = to_floats(dout), x = to_floats(qkv);
  const int hs = C / NH;
  std::vector<float> ds(p.size());
  std::vector<double> dp(static_cast<size_t>(T));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const float* pi = p.data() + ((size_t(b) * NH + h) * T + i) * T;
        double pdp = 0;
        for (int j = 0; j < T; j++) {
          double acc = 0;
          for (int e = 0; e < hs; e++)
            acc += double(dO[(size_t(b) * T + i) * C + h * hs + e]) * x[(size_t(b) * T + j) * 3 * C + 2 * C + h * hs + e];
          dp[size_t(j)] = acc;
          pdp += double(pi[j]) * acc;
        }
        float* di = ds.data() + ((size_t(b) * NH + h) * T + i) * T;
        for (int j = 0; j < T; j++) di[j] = float(double(pi[j]) * (dp[size_t(j)] - pdp));
      }
  return ds;
}

TYPED_TEST(EmulatedGemmOps, AttentionBackwardMatchesTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  constexpr bool kF32 = std::is_same_v<S, float>;
  for (const AttentionShape& s : kAttentionShapes) {
    SCOPED_TRACE(label(s));
    const ak::Dims dims{s.B, s.T, s.C, s.NH, s.C / s.NH};
    const size_t nqkv = size_t(s.B) * s.T * 3 * s.C, nout = size_t(s.B) * s.T * s.C;
    const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
    const auto qkv = this->values(nqkv, -2.f, 2.f), dout = this->values(nout);
    const auto doc = mt::testing::random_doc_ids(s.B, s.T, this->rng);
    const int32_t* d = s.docs ? doc.data() : nullptr;
    // Both sides start from the CPU forward's P, as the GPU tests do.
    std::vector<S> out(nout), att(natt), dqkv(nqkv), got_dqkv = nans<S>(nqkv);
    std::vector<float> scratch(natt), got_ds = nans<float>(natt);
    mt::cpu::attention_fwd<S>(out.data(), att.data(), qkv.data(), d, s.B, s.T, s.C, s.NH);
    mt::cpu::attention_bwd<S>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), d, s.B, s.T, s.C,
                              s.NH);
    const std::vector<float> ds = reference_ds(att, dout, qkv, s.B, s.T, s.C, s.NH);

    // attention_bwd's sequence: dP into the scratch, dS in place, then dQ and dK in fp32 (into dqkv
    // itself for float storage, else a temporary rounded into dqkv at the end) and dV into dqkv. The
    // fp32 copy of qkv is made by the convert op (checked in test_emu_ops.cpp); here on the host.
    const std::vector<float> qkv32 = to_floats(qkv);
    std::vector<float> dqk_temp(kF32 ? 0 : nqkv, NAN);
    float* dqk32 = kF32 ? reinterpret_cast<float*>(got_dqkv.data()) : dqk_temp.data();
    for (int b = 0; b < s.B; b++) emulated_gemm(ak::dp_gemm(dims, got_ds.data(), dout.data(), qkv.data(), b));
    const int64_t rows = int64_t(s.B) * s.NH * s.T;
    run(ak::rows_shape(rows), ak::softmax_bwd_kernel<D>, got_ds.data(), dev_ptr(att.data()), rows, s.T);
    for (int b = 0; b < s.B; b++) {
      emulated_gemm(ak::dq_gemm(dims, dqk32, qkv32.data(), got_ds.data(), b));
      emulated_gemm(ak::dk_gemm(dims, dqk32, qkv32.data(), got_ds.data(), b));
      emulated_gemm(ak::dv_gemm(dims, got_dqkv.data(), dout.data(), att.data(), b));
    }
    if (!kF32) {
      run(ak::store_qk_shape(int64_t(s.B) * s.T, s.C), ak::store_qk_kernel<D>, dev_ptr(got_dqkv.data()),
          static_cast<const float*>(dqk32), int64_t(s.B) * s.T, s.C);
    }

    EXPECT_LE(error(got_ds, ds), tol::kAttentionBwd.f32) << "dS (fp32 scratch)";
    EXPECT_LE(error(got_dqkv, dqkv), tol::kAttentionBwd.of<S>()) << "dqkv";
  }
}

}  // namespace
