// The CUDA kernels of the activation ops (encoder, LayerNorm, softmax + cross-entropy, add, GELU,
// convert), built by the host compiler and run on the warp emulator (kernels/cuda/warp_emulation.h)
// against their CPU twins (kernels/cpu/cpu_ops.h), in float, bf16 and fp16, at small awkward shapes:
// one element, odd and prime sizes, sizes just past a warp or a block, and strided loops.
//
// Each kernel runs with the launch shape its launcher uses (the *_shape functions of its header), and
// in the launcher's order where an op launches several. Outputs an op assigns start as NaN, so an
// element a kernel skips fails; outputs it accumulates into start from the same random values on both
// sides, so `=` in place of `+=` fails too. Tolerances are the GPU's (kernels/cuda/tolerances.h): the
// emulated kernels differ from the CPU twins in summation order and exp/sqrt evaluation, as the
// device does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/encoder_kernels.cuh"
#include "kernels/cuda/layernorm_kernels.cuh"
#include "kernels/cuda/softmax_xent_kernels.cuh"
#include "kernels/cuda/tolerances.h"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using mt::testing::random_ints;
using namespace mt::testing::emu;  // run, to_storage, to_floats, error, part_error, nans (tests/emu_test_util.h)
using mt::bf16;
using mt::f16;
using mt::cuda::dev_ptr;
using mt::cuda::LaunchShape;
namespace tol = mt::cuda::tol;
namespace ek = mt::cuda::elementwise_kernels;
namespace enc = mt::cuda::encoder_kernels;
namespace ln = mt::cuda::layernorm_kernels;
namespace xent = mt::cuda::softmax_xent_kernels;

template <class S>
class EmulatedOps : public EmulatedTest<S> {};
TYPED_TEST_SUITE(EmulatedOps, StorageTypes, StorageNames);

TYPED_TEST(EmulatedOps, EncoderForwardIsExactlyTheCpuGather) {
  using S = TypeParam;
  struct Shape { int B, T, C, V; };
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 13, 11}, Shape{3, 11, 97, 31}}) {
    for (bool explicit_pos : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " pos=" << explicit_pos);
      const int maxT = s.T + 3;
      const auto tokens = random_ints(size_t(s.B) * s.T, 0, s.V - 1, this->rng);
      const auto pos = random_ints(tokens.size(), 0, maxT - 1, this->rng);
      const int32_t* p = explicit_pos ? pos.data() : nullptr;
      const auto wte = this->values(size_t(s.V) * s.C), wpe = this->values(size_t(maxT) * s.C);
      const int64_t total = int64_t(s.B) * s.T * s.C;
      std::vector<S> want(tokens.size() * size_t(s.C)), got = nans<S>(want.size());
      mt::cpu::encoder_fwd<S>(want.data(), tokens.data(), p, wte.data(), wpe.data(), s.B, s.T, s.C);
      run(enc::fwd_shape(total), enc::encoder_fwd_kernel<mt::cuda::dev_t<S>>, dev_ptr(got.data()), tokens.data(), p,
          dev_ptr(wte.data()), dev_ptr(wpe.data()), s.T, s.C, total);
      EXPECT_LE(error(got, want), tol::kExact.of<S>());
    }
  }
}

TYPED_TEST(EmulatedOps, EncoderBackwardAccumulatesLikeTheCpu) {
  using S = TypeParam;
  struct Shape { int B, T, C, V; bool pos; };
  // Small vocabularies repeat tokens (long runs after the sort); C = 257 takes two column blocks.
  for (Shape s : {Shape{1, 1, 1, 1, false}, Shape{2, 7, 13, 3, true}, Shape{2, 150, 9, 5, false},
                  Shape{1, 9, 257, 4, true}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " pos=" << s.pos);
    const int maxT = s.T + 2, rows = s.B * s.T;
    const auto tokens = random_ints(size_t(rows), 0, s.V - 1, this->rng);
    const auto pos = random_ints(size_t(rows), 0, maxT - 1, this->rng);
    const int32_t* p = s.pos ? pos.data() : nullptr;
    const auto dout = this->values(size_t(rows) * s.C);
    auto dwte = this->floats(size_t(s.V) * s.C), dwpe = this->floats(size_t(maxT) * s.C);
    auto got_wte = dwte, got_wpe = dwpe;
    mt::cpu::encoder_bwd<S>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), p, s.B, s.T, s.C);
    emulated_scatter(got_wte.data(), dev_ptr(dout.data()), tokens.data(), rows, s.T, s.C);
    emulated_scatter(got_wpe.data(), dev_ptr(dout.data()), p, rows, s.T, s.C);
    EXPECT_LE(error(got_wte, dwte), tol::kEncoderBwd.of<S>()) << "dwte";
    EXPECT_LE(error(got_wpe, dwpe), tol::kEncoderBwd.of<S>()) << "dwpe";
  }
}

struct RowShape { int N, C; };
// One row (one warp of a block); 9 and 17 rows spill into a second and third block; C = 1 and 7 leave
// lanes idle, 33 and 97 take a second and fourth pass over the columns.
const RowShape kRowShapes[] = {{1, 1}, {3, 7}, {9, 33}, {17, 97}};

// The forward tests add rows whose width the 16-byte kernels take (a multiple of 16 bytes of values):
// one chunk per lane and some lanes idle (C = 8), two (264 in 16-bit, three in fp32), and the widest
// (2048: eight chunks per lane in 16-bit; fp32 takes only the scalar kernel there).
const RowShape kForwardShapes[] = {{1, 1}, {3, 7}, {9, 33}, {17, 97}, {5, 8}, {9, 264}, {2, 2048}};

// The forward kernels layernorm.cu picks from: 0 the scalar one, 1 the 16-byte one (when it takes C).
template <class D, class Scalar, class Vec>
void run_forward(int path, int N, int C, Scalar scalar, Vec vec) {
  if (path == 0) return scalar(ln::rows_shape(N));
  ln::with_chunks_per_lane<D>(C, [&](auto chunks) { vec(ln::rows_shape(N), chunks); });
}

TYPED_TEST(EmulatedOps, LayerNormForwardMatchesTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (RowShape s : kForwardShapes) {
    for (int path = 0; path < 2; path++) {
      if (path == 1 && !ln::with_chunks_per_lane<D>(s.C, [](auto) {})) continue;
      for (bool bias : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " bias=" << bias << " path=" << path);
        const auto inp = this->values(size_t(s.N) * s.C, 2.f, 5.f);  // a large mean tests the two-pass variance
        const auto w = this->values(size_t(s.C)), b = this->values(size_t(s.C));
        std::vector<S> out(inp.size()), got = nans<S>(inp.size());
        std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N)), got_mean = nans<float>(mean.size()),
                                                                 got_rstd = nans<float>(rstd.size());
        mt::cpu::layernorm_fwd<S>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias ? b.data() : nullptr,
                                  s.N, s.C);
        const D* bp = bias ? dev_ptr(b.data()) : nullptr;
        run_forward<D>(
            path, s.N, s.C,
            [&](LaunchShape l) {
              run(l, ln::layernorm_fwd_kernel<D>, dev_ptr(got.data()), got_mean.data(), got_rstd.data(),
                  dev_ptr(inp.data()), dev_ptr(w.data()), bp, s.N, s.C);
            },
            [&](LaunchShape l, auto chunks) {
              run(l, ln::layernorm_fwd_vec_kernel<D, decltype(chunks)::value>, static_cast<D*>(nullptr),
                  dev_ptr(got.data()), got_mean.data(), got_rstd.data(), dev_ptr(inp.data()),
                  static_cast<const D*>(nullptr), dev_ptr(w.data()), bp, s.N, s.C);
            });
        EXPECT_LE(error(got, out), tol::kLayerNorm.of<S>()) << "out";
        EXPECT_LE(error(got_mean, mean), tol::kLayerNormStats.of<S>()) << "mean";
        EXPECT_LE(error(got_rstd, rstd), tol::kLayerNormStats.of<S>()) << "rstd";
      }
    }
  }
}

TYPED_TEST(EmulatedOps, ResidualLayerNormStoresTheSumAndNormalisesIt) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (RowShape s : kForwardShapes) {
    for (int path = 0; path < 2; path++) {
      if (path == 1 && !ln::with_chunks_per_lane<D>(s.C, [](auto) {})) continue;
      for (bool in_place : {false, true}) {  // in place: res written over a, as the residual stream does
        SCOPED_TRACE(::testing::Message()
                     << "N=" << s.N << " C=" << s.C << " in_place=" << in_place << " path=" << path);
        auto a = this->values(size_t(s.N) * s.C, -2.f, 2.f);
        const auto b = this->values(a.size(), 1.f, 4.f);
        const auto w = this->values(size_t(s.C)), bias = this->values(size_t(s.C));
        std::vector<S> res(a.size()), out(a.size()), got_res = nans<S>(a.size()), got_out = nans<S>(a.size());
        std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N)), got_mean(mean.size()), got_rstd(rstd.size());
        mt::cpu::residual_layernorm_fwd<S>(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(),
                                           w.data(), bias.data(), s.N, s.C);
        D* r = dev_ptr(in_place ? a.data() : got_res.data());
        run_forward<D>(
            path, s.N, s.C,
            [&](LaunchShape l) {
              run(l, ln::residual_layernorm_fwd_kernel<D>, r, dev_ptr(got_out.data()), got_mean.data(), got_rstd.data(),
                  dev_ptr(a.data()), dev_ptr(b.data()), dev_ptr(w.data()), dev_ptr(bias.data()), s.N, s.C);
            },
            [&](LaunchShape l, auto chunks) {
              run(l, ln::layernorm_fwd_vec_kernel<D, decltype(chunks)::value>, r, dev_ptr(got_out.data()),
                  got_mean.data(), got_rstd.data(), dev_ptr(a.data()), dev_ptr(b.data()), dev_ptr(w.data()),
                  dev_ptr(bias.data()), s.N, s.C);
            });
        EXPECT_LE(error(in_place ? a : got_res, res), tol::kExact.of<S>()) << "res";
        EXPECT_LE(error(got_out, out), tol::kLayerNorm.of<S>()) << "out";
        EXPECT_LE(error(got_mean, mean), tol::kLayerNormStats.of<S>()) << "mean";
        EXPECT_LE(error(got_rstd, rstd), tol::kLayerNormStats.of<S>()) << "rstd";
      }
    }
  }
}

// layernorm.cu's backward with dinp and both parameter gradients: the fused kernel and the blocks'
// partials added in order where it takes C, else the column sums, then the dinp kernel.
template <class D>
void emulated_layernorm_bwd(D* dinp, float* dw, float* db, const D* dout, const D* inp, const D* w, const float* mean,
                            const float* rstd, int N, int C, bool accumulate) {
  namespace csk = mt::cuda::column_sum_kernels;
  if (C <= ln::kFusedMaxC) {
    const csk::ColumnSplit split = ln::fused_split(N, C);
    std::vector<float> partial = nans<float>(csk::partial_floats(split, 2));
    ln::with_cols_per_lane(C, [&](auto cols) {
      run(ln::fused_shape(N, C), ln::layernorm_bwd_kernel<D, decltype(cols)::value>, dinp, partial.data(), dout, inp,
          w, mean, rstd, N, C, accumulate);
    });
    run(csk::finish_shape(split), csk::column_finish_kernel<2>, csk::ColumnOutputs<2>{{dw, db}},
        static_cast<const float*>(partial.data()), split);
    return;
  }
  column_sums<2>({{dw, db}}, ln::ParamGradTerms<D>{dout, inp, mean, rstd}, N, C);
  run(ln::rows_shape(N), ln::layernorm_bwd_dinp_kernel<D>, dinp, dout, inp, w, mean, rstd, N, C, accumulate);
}

TYPED_TEST(EmulatedOps, LayerNormBackwardMatchesTheCpu) {
  using S = TypeParam;
  // 40 and 300 rows: several blocks of the fused kernel, warps taking several rows; C = 2100: wider
  // than the fused kernel takes (the column sums, two splits at 300 rows, and the dinp kernel).
  for (RowShape s : {RowShape{1, 1}, RowShape{3, 7}, RowShape{17, 97}, RowShape{40, 45}, RowShape{300, 35},
                     RowShape{300, 2100}}) {
    // 0: assigned dinp; 1: dinp added to the residual gradient already there; 2: dinp written over
    // dout (aliased), as the model's backward does.
    for (int mode = 0; mode < 3; mode++) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " mode=" << mode);
      const bool accumulate = mode == 1, aliased = mode == 2;
      const auto inp = this->values(size_t(s.N) * s.C, -2.f, 3.f), w = this->values(size_t(s.C));
      auto dout = this->values(inp.size());
      std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N));
      std::vector<S> scratch(inp.size());
      mt::cpu::layernorm_fwd<S>(scratch.data(), mean.data(), rstd.data(), inp.data(), w.data(), nullptr, s.N, s.C);
      auto dinp = accumulate ? this->values(inp.size()) : nans<S>(inp.size());
      auto dw = this->floats(size_t(s.C)), db = this->floats(size_t(s.C));
      auto got_dinp = dinp, got_dout = dout;
      auto got_dw = dw, got_db = db;
      mt::cpu::layernorm_bwd<S>(aliased ? dout.data() : dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                w.data(), mean.data(), rstd.data(), s.N, s.C, accumulate);
      emulated_layernorm_bwd(dev_ptr(aliased ? got_dout.data() : got_dinp.data()), got_dw.data(), got_db.data(),
                             dev_ptr(got_dout.data()), dev_ptr(inp.data()), dev_ptr(w.data()), mean.data(),
                             rstd.data(), s.N, s.C, accumulate);
      EXPECT_LE(error(aliased ? got_dout : got_dinp, aliased ? dout : dinp), tol::kLayerNorm.of<S>()) << "dinp";
      EXPECT_LE(error(got_dw, dw), tol::kLayerNormParamGrads.of<S>()) << "dweight";
      EXPECT_LE(error(got_db, db), tol::kLayerNormParamGrads.of<S>()) << "dbias";
    }
  }
}

TYPED_TEST(EmulatedOps, SoftmaxCrossEntropyMatchesTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  struct Shape { int N, V, Vp; };
  // V = 1: a certain prediction; V = 1031 > 512 threads: two passes per thread; padded columns.
  for (Shape s : {Shape{1, 1, 1}, Shape{3, 7, 8}, Shape{4, 100, 128}, Shape{3, 1031, 1040}}) {
    for (int mode = 0; mode < 3; mode++) {  // 0: losses only, 1: dlogits, 2: dlogits over logits
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " mode=" << mode);
      auto targets = random_ints(size_t(s.N), 0, s.V - 1, this->rng);
      if (s.N > 1) targets[1] = -1;  // an ignored position
      auto logits = this->values(size_t(s.N) * s.Vp, -4.f, 4.f);
      const float dloss = 1.f / float(s.N);
      std::vector<float> losses(size_t(s.N)), got_losses = nans<float>(size_t(s.N));
      std::vector<S> dlogits(logits.size()), got_dlogits = nans<S>(logits.size());
      auto got_logits = logits;
      mt::cpu::softmax_xent<S>(losses.data(), mode ? dlogits.data() : nullptr, logits.data(), targets.data(), dloss,
                               s.N, s.V, s.Vp);
      D* g = mode == 0 ? nullptr : dev_ptr(mode == 1 ? got_dlogits.data() : got_logits.data());
      run(xent::xent_shape(s.N), xent::softmax_xent_kernel<D>, got_losses.data(), g, dev_ptr(got_logits.data()),
          targets.data(), dloss, s.V, s.Vp);
      EXPECT_LE(error(got_losses, losses), tol::kSoftmaxXentLoss.of<S>()) << "losses";
      if (mode > 0) {
        EXPECT_LE(error(mode == 1 ? got_dlogits : got_logits, dlogits), tol::kSoftmaxXentGrad.of<S>()) << "dlogits";
      }
    }
  }
}

// A target outside the real vocabulary is a data error the kernel makes visible as NaN, loss and
// gradient both (the CPU twin refuses the call instead), without touching the other rows.
TYPED_TEST(EmulatedOps, SoftmaxCrossEntropyGivesNaNForATargetPastTheVocabulary) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  const int N = 3, V = 7, Vp = 8;
  std::vector<int32_t> targets = {2, V, 0};
  const auto logits = this->values(size_t(N) * Vp);
  std::vector<float> losses(N), got = nans<float>(N);
  std::vector<S> dlogits(logits.size()), got_d = nans<S>(logits.size());
  std::vector<int32_t> valid = {2, 0, 0};
  mt::cpu::softmax_xent<S>(losses.data(), dlogits.data(), logits.data(), valid.data(), 1.f, N, V, Vp);
  run(xent::xent_shape(N), xent::softmax_xent_kernel<D>, got.data(), dev_ptr(got_d.data()), dev_ptr(logits.data()),
      static_cast<const int32_t*>(targets.data()), 1.f, V, Vp);
  EXPECT_TRUE(std::isnan(got[1]));
  for (int j = 0; j < Vp; j++) EXPECT_TRUE(std::isnan(mt::load(got_d[size_t(Vp + j)]))) << j;
  for (int i : {0, 2}) {
    EXPECT_NEAR(got[size_t(i)], losses[size_t(i)], tol::kSoftmaxXentLoss.of<S>() * std::fabs(losses[size_t(i)]));
    for (int j = 0; j < Vp; j++) {
      const size_t at = size_t(i * Vp + j);
      EXPECT_NEAR(mt::load(got_d[at]), mt::load(dlogits[at]), tol::kSoftmaxXentGrad.of<S>()) << i << " " << j;
    }
  }
}

// 1 element, 257 (one past a block), 1000 (four blocks, the last partial).
const int64_t kLengths[] = {1, 257, 1000};

TYPED_TEST(EmulatedOps, AddIsExactlyTheCpuSum) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (int64_t n : kLengths) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "N=" << n << " in_place=" << in_place);
      auto a = this->values(size_t(n), -3.f, 3.f);
      const auto b = this->values(size_t(n), -3.f, 3.f);
      std::vector<S> want(a.size()), got = nans<S>(a.size());
      mt::cpu::add<S>(want.data(), a.data(), b.data(), n);
      S* out = in_place ? a.data() : got.data();
      run(ek::elementwise_shape(n), ek::add_kernel<D>, dev_ptr(out), dev_ptr(a.data()), dev_ptr(b.data()), n);
      EXPECT_LE(error(in_place ? a : got, want), tol::kExact.of<S>());
    }
  }
}

TYPED_TEST(EmulatedOps, GeluForwardAndBackwardMatchTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (int64_t n : kLengths) {
    SCOPED_TRACE(::testing::Message() << "N=" << n);
    // Beyond +-10 the exponent clamp and the saturated tails are reached.
    auto inp = this->values(size_t(n), -12.f, 12.f);
    const auto dout = this->values(size_t(n));
    std::vector<S> out(inp.size()), dinp(inp.size()), got_out = nans<S>(inp.size()), got_dinp = nans<S>(inp.size());
    mt::cpu::gelu_fwd<S>(out.data(), inp.data(), n);
    mt::cpu::gelu_bwd<S>(dinp.data(), dout.data(), inp.data(), n);
    const LaunchShape l = ek::elementwise_shape(n);
    run(l, ek::gelu_fwd_kernel<D>, dev_ptr(got_out.data()), dev_ptr(inp.data()), n);
    run(l, ek::gelu_bwd_kernel<D>, dev_ptr(got_dinp.data()), dev_ptr(dout.data()), dev_ptr(inp.data()), n);
    EXPECT_LE(error(got_out, out), tol::kGelu.of<S>()) << "out";
    EXPECT_LE(error(got_dinp, dinp), tol::kGelu.of<S>()) << "dinp";
  }
}

TYPED_TEST(EmulatedOps, ConvertRoundsLikeTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (int64_t n : kLengths) {
    SCOPED_TRACE(::testing::Message() << "N=" << n);
    // Values spread over many binades, with ties and fp16 overflow (|x| > 65504) among them.
    std::vector<float> x = mt::testing::random_floats(size_t(n), this->rng, -1.f, 1.f);
    for (size_t i = 0; i < x.size(); i++) x[i] = std::ldexp(x[i], int(i % 40) - 20);
    std::vector<S> want(x.size()), got = nans<S>(x.size());
    mt::cpu::convert<S, float>(want.data(), x.data(), n);
    run(ek::elementwise_shape(n), ek::convert_kernel<D, float>, dev_ptr(got.data()), x.data(), n);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(S))) << "fp32 -> storage";
    std::vector<float> back(x.size()), got_back = nans<float>(x.size());
    mt::cpu::convert<float, S>(back.data(), want.data(), n);
    run(ek::elementwise_shape(n), ek::convert_kernel<float, D>, got_back.data(), dev_ptr(want.data()), n);
    EXPECT_EQ(0, std::memcmp(got_back.data(), back.data(), back.size() * sizeof(float))) << "storage -> fp32";
  }
}

}  // namespace
