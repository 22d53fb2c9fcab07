// Every CUDA op against the CPU reference (kernels/cpu) on fresh random inputs, at shapes that include
// 1, odd and prime sizes, sizes just past a warp or a 64-row tile, and unaligned device pointers. Ops
// on activations run as typed tests in each storage type (float, bf16, f16): both backends get the
// same S inputs, the CPU twin is its S instantiation, and the tolerance comes from the per-dtype table
// in kernels/cuda/tolerances.h. Each test skips when there is no CUDA device.
//
// Outputs that an op assigns are pre-filled with garbage on the device, so a kernel that skips an
// element fails; outputs it accumulates into start from the same random values on both backends, so
// `=` in place of `+=` fails too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/test_cuda_util.h"

namespace {

using namespace mt::testing;  // NOLINT: the test helpers (tests/test_util.h, tests/test_cuda_util.h)
using mt::bf16;
using mt::f16;

TYPED_TEST_SUITE(CudaOps, StorageTypes, StorageNames);

TYPED_TEST(CudaOps, EncoderForwardIsExactlyTheCpuGather) {
  using S = TypeParam;
  struct Shape { int B, T, C, V; };
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 13, 11}, Shape{4, 64, 97, 257}}) {
    for (bool explicit_pos : {false, true}) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " pos=" << explicit_pos);
      const int maxT = s.T + 3;
      auto tokens = random_ints(size_t(s.B) * s.T, 0, s.V - 1, this->rng);
      auto pos = random_ints(tokens.size(), 0, maxT - 1, this->rng);
      auto wte = this->values(size_t(s.V) * s.C), wpe = this->values(size_t(maxT) * s.C);
      std::vector<S> want(tokens.size() * size_t(s.C));
      mt::cpu::encoder_fwd<S>(want.data(), tokens.data(), explicit_pos ? pos.data() : nullptr, wte.data(), wpe.data(),
                              s.B, s.T, s.C);
      DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
      DeviceArray<S> d_wte(wte), d_wpe(wpe), d_out(this->values(want.size()));
      mt::cuda::encoder_fwd<S>(d_out.get(), d_tok.get(), explicit_pos ? d_pos.get() : nullptr, d_wte.get(),
                               d_wpe.get(), s.B, s.T, s.C, this->gpu);
      EXPECT_TRUE(close(d_out.host(), want, this->tol_of(tol::kExact)));
    }
  }
}

TYPED_TEST(CudaOps, EncoderBackwardAccumulatesLikeCpuAndIsDeterministic) {
  using S = TypeParam;
  struct Shape { int B, T, C, V; };
  // Small vocabularies force many repeated tokens; C = 300 spans two column tiles.
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 13, 3}, Shape{3, 37, 300, 17}}) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const int maxT = s.T + 2;
    auto tokens = random_ints(size_t(s.B) * s.T, 0, s.V - 1, this->rng);
    auto pos = random_ints(tokens.size(), 0, maxT - 1, this->rng);
    auto dout = this->values(tokens.size() * size_t(s.C));
    auto dwte = random_floats(size_t(s.V) * s.C, this->rng), dwpe = random_floats(size_t(maxT) * s.C, this->rng);
    DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
    DeviceArray<S> d_dout(dout);
    DeviceArray<float> d_dwte(dwte), d_dwpe(dwpe), d_dwte2(dwte), d_dwpe2(dwpe);
    mt::cpu::encoder_bwd<S>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), pos.data(), s.B, s.T, s.C);
    for (float* target : {d_dwte.get(), d_dwte2.get()})
      mt::cuda::encoder_bwd<S>(target, target == d_dwte.get() ? d_dwpe.get() : d_dwpe2.get(), d_dout.get(),
                               d_tok.get(), d_pos.get(), s.B, s.T, s.C, this->gpu);
    auto got_wte = d_dwte.host(), got_wpe = d_dwpe.host();
    EXPECT_TRUE(close(got_wte, dwte, this->tol_of(tol::kEncoderBwd))) << "dwte";
    EXPECT_TRUE(close(got_wpe, dwpe, this->tol_of(tol::kEncoderBwd))) << "dwpe";
    EXPECT_TRUE(same_bits(got_wte, d_dwte2.host())) << "two identical backward calls gave different bits";
    EXPECT_TRUE(same_bits(got_wpe, d_dwpe2.host())) << "two identical backward calls gave different bits";
  }
}

TYPED_TEST(CudaOps, LayerNormForwardMatchesCpu) {
  using S = TypeParam;
  struct Shape { int N, C; };
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{17, 31}, Shape{33, 768}, Shape{5, 1031}}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " bias=" << with_bias);
      auto inp = this->values(size_t(s.N) * s.C, 2.f, 5.f);  // a large mean tests the two-pass variance
      auto w = this->values(size_t(s.C)), b = this->values(size_t(s.C));
      std::vector<S> out(inp.size());
      std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N));
      mt::cpu::layernorm_fwd<S>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                with_bias ? b.data() : nullptr, s.N, s.C);
      DeviceArray<S> d_inp(inp), d_w(w), d_b(b), d_out(this->values(out.size()));
      DeviceArray<float> d_mean(random_floats(mean.size(), this->rng)), d_rstd(random_floats(rstd.size(), this->rng));
      mt::cuda::layernorm_fwd<S>(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(),
                                 with_bias ? d_b.get() : nullptr, s.N, s.C, this->gpu);
      EXPECT_TRUE(close(d_out.host(), out, this->tol_of(tol::kLayerNorm))) << "out";
      EXPECT_TRUE(close(d_mean.host(), mean, this->tol_of(tol::kLayerNormStats))) << "mean";
      EXPECT_TRUE(close(d_rstd.host(), rstd, this->tol_of(tol::kLayerNormStats))) << "rstd";
    }
  }
}

TYPED_TEST(CudaOps, ResidualLayerNormIsBitwiseAddThenLayerNormAndMatchesCpu) {
  using S = TypeParam;
  for (int C : {1, 7, 768, 1031}) {
    const int N = 13;
    SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
    auto a = this->values(size_t(N) * C, -2.f, 2.f), b = this->values(a.size(), 1.f, 4.f);
    auto w = this->values(size_t(C)), bias = this->values(size_t(C));
    std::vector<S> res(a.size()), out(a.size());
    std::vector<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    mt::cpu::residual_layernorm_fwd<S>(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                                       bias.data(), N, C);
    DeviceArray<S> d_a(a), d_b(b), d_w(w), d_bias(bias), d_out(this->values(a.size())), d_out2(this->values(a.size())),
        d_res2(this->values(a.size()));
    DeviceArray<float> d_mean(mean), d_rstd(rstd), d_mean2(mean), d_rstd2(rstd);
    // The unfused pair first (it reads a), then the fused op in place over a.
    mt::cuda::add<S>(d_res2.get(), d_a.get(), d_b.get(), int64_t(a.size()), this->gpu);
    mt::cuda::layernorm_fwd<S>(d_out2.get(), d_mean2.get(), d_rstd2.get(), d_res2.get(), d_w.get(), d_bias.get(), N, C,
                               this->gpu);
    mt::cuda::residual_layernorm_fwd<S>(d_a.get(), d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(), d_b.get(),
                                        d_w.get(), d_bias.get(), N, C, this->gpu);
    const auto got_res = d_a.host(), got_out = d_out.host();
    EXPECT_TRUE(same_bits(got_res, d_res2.host())) << "res differs from add";
    EXPECT_TRUE(same_bits(got_out, d_out2.host())) << "out differs from add then layernorm_fwd";
    EXPECT_TRUE(same_bits(d_mean.host(), d_mean2.host()) && same_bits(d_rstd.host(), d_rstd2.host())) << "stats";
    EXPECT_TRUE(close(got_res, res, this->tol_of(tol::kExact))) << "res vs cpu";
    EXPECT_TRUE(close(got_out, out, this->tol_of(tol::kLayerNorm))) << "out vs cpu";
  }
}

TYPED_TEST(CudaOps, LayerNormBackwardAssignsOrAccumulatesDinpAndAccumulatesParameterGrads) {
  using S = TypeParam;
  struct Shape { int N, C; };
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{37, 31}, Shape{130, 768}, Shape{5, 1031}}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " accumulate=" << accumulate);
      auto inp = this->values(size_t(s.N) * s.C, -2.f, 3.f), dout = this->values(inp.size());
      auto w = this->values(size_t(s.C)), b = this->values(size_t(s.C));
      std::vector<S> out(inp.size());
      std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N));
      mt::cpu::layernorm_fwd<S>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), s.N, s.C);
      auto dw = random_floats(size_t(s.C), this->rng), db = random_floats(size_t(s.C), this->rng);
      auto dinp = this->values(inp.size());
      DeviceArray<S> d_inp(inp), d_w(w), d_dout(dout), d_dinp(dinp);
      DeviceArray<float> d_mean(mean), d_rstd(rstd), d_dw(dw), d_db(db);
      mt::cpu::layernorm_bwd<S>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                rstd.data(), s.N, s.C, accumulate);
      mt::cuda::layernorm_bwd<S>(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(),
                                 d_mean.get(), d_rstd.get(), s.N, s.C, accumulate, this->gpu);
      EXPECT_TRUE(close(d_dinp.host(), dinp, this->tol_of(tol::kLayerNorm))) << "dinp";
      EXPECT_TRUE(close(d_dw.host(), dw, this->tol_of(tol::kLayerNormParamGrads))) << "dweight";
      EXPECT_TRUE(close(d_db.host(), db, this->tol_of(tol::kLayerNormParamGrads))) << "dbias";
    }
  }
}

TYPED_TEST(CudaOps, MatmulForwardMatchesCpuWithBiasGeluAndResidualEpilogues) {
  using S = TypeParam;
  struct Shape { int N, IC, OC; };
  // OC = 40 and 384 are multiples of 8 (cuBLASLt can fuse the GELU epilogue), 1, 5 and 53 are not.
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{37, 101, 53}, Shape{19, 64, 40}, Shape{128, 257, 384}}) {
    // offset 1 leaves every device pointer only element-aligned.
    for (int offset : {0, 1}) {
      // 0: no bias, 1: bias, 2: bias + GELU, 3: bias + residual (the GEMM's C), 4: residual
      for (int variant = 0; variant < 5; variant++) {
        const bool bias = variant >= 1 && variant <= 3, gelu = variant == 2, residual = variant >= 3;
        SCOPED_TRACE(testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC << " offset=" << offset
                                        << " bias=" << bias << " gelu=" << gelu << " residual=" << residual);
        const size_t nout = size_t(s.N) * s.OC;
        auto inp = this->values(size_t(s.N) * s.IC + 1), w = this->values(size_t(s.OC) * s.IC + 1);
        auto b = this->values(size_t(s.OC) + 1), res = this->values(nout + 1);
        std::vector<S> want(nout), want_pre(nout);
        mt::cpu::matmul_fwd<S>(want.data(), inp.data() + offset, w.data() + offset, bias ? b.data() + offset : nullptr,
                               s.N, s.IC, s.OC, gelu ? want_pre.data() : nullptr,
                               residual ? res.data() + offset : nullptr);
        DeviceArray<S> d_inp(inp), d_w(w), d_b(b), d_res(res), d_out(this->values(nout + 1)),
            d_pre(this->values(nout + 1));
        mt::cuda::matmul_fwd<S>(d_out.get() + offset, d_inp.get() + offset, d_w.get() + offset,
                                bias ? d_b.get() + offset : nullptr, s.N, s.IC, s.OC, this->gpu,
                                gelu ? d_pre.get() + offset : nullptr, residual ? d_res.get() + offset : nullptr);
        auto window = [&](const std::vector<S>& v) {
          return std::vector<S>(v.begin() + offset, v.begin() + offset + long(nout));
        };
        EXPECT_TRUE(close(window(d_out.host()), want, this->tol_of(gelu ? tol::kMatmulGelu : tol::kMatmul))) << "out";
        if (gelu) {
          EXPECT_TRUE(close(window(d_pre.host()), want_pre, this->tol_of(tol::kMatmul))) << "pre_gelu";
        }
      }
    }
  }
}

TYPED_TEST(CudaOps, MatmulBackwardAssignsDinpAndAccumulatesDweightDbias) {
  using S = TypeParam;
  struct Shape { int N, IC, OC; };
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{37, 101, 53}, Shape{19, 40, 24}, Shape{64, 257, 383}}) {
    // 0: dweight only, 1: all three, 2: dinp through GELU, 3: dweight only, assigned over its old contents
    for (int variant = 0; variant < 4; variant++) {
      const bool full = variant == 1 || variant == 2, gelu = variant == 2, assign = variant == 3;
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC << " full=" << full
                                      << " gelu=" << gelu << " assign=" << assign);
      auto inp = this->values(size_t(s.N) * s.IC), w = this->values(size_t(s.OC) * s.IC);
      auto dout = this->values(size_t(s.N) * s.OC), pre = this->values(inp.size(), -3.f, 3.f);
      auto dw = random_floats(w.size(), this->rng), db = random_floats(size_t(s.OC), this->rng);
      std::vector<S> dinp(inp.size());
      DeviceArray<S> d_inp(inp), d_w(w), d_dout(dout), d_pre(pre), d_dinp(this->values(dinp.size()));
      DeviceArray<float> d_dw(dw), d_db(db);
      mt::cpu::matmul_bwd<S>(full ? dinp.data() : nullptr, dw.data(), full ? db.data() : nullptr, dout.data(),
                             inp.data(), w.data(), s.N, s.IC, s.OC, gelu ? pre.data() : nullptr, assign);
      mt::cuda::matmul_bwd<S>(full ? d_dinp.get() : nullptr, d_dw.get(), full ? d_db.get() : nullptr, d_dout.get(),
                              d_inp.get(), d_w.get(), s.N, s.IC, s.OC, this->gpu, gelu ? d_pre.get() : nullptr, assign);
      EXPECT_TRUE(close(d_dw.host(), dw, this->tol_of(tol::kMatmulParamGrads))) << "dweight";
      EXPECT_TRUE(close(d_db.host(), db, this->tol_of(tol::kMatmulParamGrads))) << "dbias";  // unchanged when skipped
      if (full) {
        EXPECT_TRUE(close(d_dinp.host(), dinp, this->tol_of(gelu ? tol::kMatmulGelu : tol::kMatmul))) << "dinp";
      }
    }
  }
}

TYPED_TEST(CudaOps, GeluForwardAndBackwardMatchCpu) {
  using S = TypeParam;
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto inp = this->values(size_t(n), -6.f, 6.f), dout = this->values(size_t(n));
    std::vector<S> out(inp.size()), dinp(inp.size());
    mt::cpu::gelu_fwd<S>(out.data(), inp.data(), n);
    mt::cpu::gelu_bwd<S>(dinp.data(), dout.data(), inp.data(), n);
    DeviceArray<S> d_inp(inp), d_dout(dout), d_out(this->values(out.size())), d_dinp(this->values(dinp.size()));
    mt::cuda::gelu_fwd<S>(d_out.get(), d_inp.get(), n, this->gpu);
    mt::cuda::gelu_bwd<S>(d_dinp.get(), d_dout.get(), d_inp.get(), n, this->gpu);
    EXPECT_TRUE(close(d_out.host(), out, this->tol_of(tol::kGelu))) << "out";
    EXPECT_TRUE(close(d_dinp.host(), dinp, this->tol_of(tol::kGelu))) << "dinp";
  }
}

TYPED_TEST(CudaOps, AddIsExactIncludingInPlace) {
  using S = TypeParam;
  for (int64_t n : {int64_t(1), int64_t(31), int64_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto a = this->values(size_t(n)), b = this->values(size_t(n));
    std::vector<S> sum(a.size());
    mt::cpu::add<S>(sum.data(), a.data(), b.data(), n);
    DeviceArray<S> d_a(a), d_b(b), d_out(this->values(a.size()));
    mt::cuda::add<S>(d_out.get(), d_a.get(), d_b.get(), n, this->gpu);
    EXPECT_TRUE(same_bits(d_out.host(), sum)) << "add";
    mt::cuda::add<S>(d_a.get(), d_a.get(), d_b.get(), n, this->gpu);  // out aliases a
    EXPECT_TRUE(same_bits(d_a.host(), sum)) << "add in place";
  }
}

TYPED_TEST(CudaOps, SoftmaxCrossEntropyMatchesCpuWithIgnoredRowsAndPadding) {
  using S = TypeParam;
  struct Shape { int N, V, Vp; };
  for (Shape s : {Shape{1, 1, 1}, Shape{5, 7, 8}, Shape{13, 101, 128}, Shape{9, 1009, 1024}, Shape{3, 50257, 50304}}) {
    for (int mode = 0; mode < 3; mode++) {  // 0: separate dlogits, 1: in place (dlogits == logits), 2: loss only
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " mode=" << mode);
      auto logits = this->values(size_t(s.N) * s.Vp, -8.f, 8.f);
      auto targets = random_ints(size_t(s.N), 0, s.V - 1, this->rng);
      for (size_t i = 1; i < targets.size(); i += 3) targets[i] = -1;  // ignored rows
      const float dloss = 1.f / float(s.N);
      std::vector<float> losses(size_t(s.N));
      std::vector<S> dlogits(logits.size());
      mt::cpu::softmax_xent<S>(losses.data(), mode == 2 ? nullptr : dlogits.data(), logits.data(), targets.data(),
                               dloss, s.N, s.V, s.Vp);
      DeviceArray<S> d_logits(logits), d_dlogits(this->values(dlogits.size()));
      DeviceArray<float> d_losses(random_floats(losses.size(), this->rng));
      DeviceArray<int32_t> d_targets(targets);
      S* d_grad = mode == 0 ? d_dlogits.get() : mode == 1 ? d_logits.get() : nullptr;
      mt::cuda::softmax_xent<S>(d_losses.get(), d_grad, d_logits.get(), d_targets.get(), dloss, s.N, s.V, s.Vp,
                                this->gpu);
      EXPECT_TRUE(close(d_losses.host(), losses, this->tol_of(tol::kSoftmaxXentLoss))) << "losses";
      if (mode != 2) {
        EXPECT_TRUE(close(mode == 0 ? d_dlogits.host() : d_logits.host(), dlogits,
                          this->tol_of(tol::kSoftmaxXentGrad)))
            << "dlogits";
      }
    }
  }
}

}  // namespace
