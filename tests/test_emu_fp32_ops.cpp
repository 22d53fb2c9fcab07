// The CUDA kernels of the fp32 ops (AdamW, sum of squares, finiteness, scale, round_to), built by the
// host compiler and run on the warp emulator (kernels/cuda/warp_emulation.h) against their CPU twins
// (kernels/cpu/cpu_ops.h), each with the launch shape its launcher uses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/reduce_kernels.cuh"
#include "kernels/cuda/tolerances.h"
#include "runtime/dtype.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using namespace mt::testing::emu;  // run, to_storage, to_floats, error, part_error, nans (tests/emu_test_util.h)
using mt::cuda::LaunchShape;
using mt::testing::max_rel_error;
namespace tol = mt::cuda::tol;
namespace ak = mt::cuda::adamw_kernels;
namespace ek = mt::cuda::elementwise_kernels;
namespace rk = mt::cuda::reduce_kernels;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class EmulatedFp32Ops : public ::testing::Test {
 protected:
  std::vector<float> floats(size_t n, float lo = -1.f, float hi = 1.f) {
    return mt::testing::random_floats(n, rng, lo, hi);
  }
  std::mt19937_64 rng{mt::testing::test_seed()};
};

TEST_F(EmulatedFp32Ops, AdamWMatchesTheCpu) {
  const float factor = 0.37f;  // a gradient scale (unscaling, clipping)
  for (int64_t n : {int64_t(1), int64_t(257), int64_t(1000)}) {
    for (int t : {1, 7}) {
      for (const float* scale : {static_cast<const float*>(nullptr), &factor}) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " t=" << t << (scale ? " scaled" : ""));
        auto p = floats(size_t(n)), m = floats(size_t(n), -0.1f, 0.1f), v = floats(size_t(n), 0.f, 0.01f);
        const auto g = floats(size_t(n));
        auto gp = p, gm = m, gv = v;
        const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
        mt::cpu::adamw<float>(p.data(), m.data(), v.data(), g.data(), n, lr, b1, b2, eps, wd, t, scale);
        run(ak::adamw_shape(n), ak::adamw_kernel, gp.data(), gm.data(), gv.data(), g.data(), n,
            ak::make_hyper(lr, b1, b2, eps, wd, t), scale);
        EXPECT_LE(max_rel_error(gp.data(), p.data(), p.size()), tol::kAdamW) << "params";
        EXPECT_LE(max_rel_error(gm.data(), m.data(), m.size()), tol::kAdamW) << "m";
        EXPECT_LE(max_rel_error(gv.data(), v.data(), v.size()), tol::kAdamW) << "v";
      }
    }
  }
}

TEST_F(EmulatedFp32Ops, ClipCoefficientKernelIsTheHostFormula) {
  // (sum of squares, inverse loss scale, max norm): no clipping, clipping, clipping off, fp16 unscaling.
  const double cases[][3] = {{0.25, 1.0, 1.0}, {16.0, 1.0, 1.0}, {16.0, 1.0, 0.0}, {4e8, 1.0 / 65536, 1.0}};
  for (const auto& c : cases) {
    float coef = NAN;
    const double sum_sq = c[0];
    run(mt::cuda::LaunchShape{dim3(1), dim3(32)}, ak::clip_coefficient_kernel, &coef, &sum_sq, c[1], c[2]);
    EXPECT_EQ(coef, mt::ops::clip_coefficient(c[0], c[1], c[2])) << c[0] << " " << c[1] << " " << c[2];
  }
  EXPECT_EQ(mt::ops::clip_coefficient(16.0, 1.0, 1.0), 0.25f);  // norm 4 clipped to 1
  EXPECT_EQ(mt::ops::clip_coefficient(0.25, 1.0, 1.0), 1.0f);   // norm 0.5 left alone
  EXPECT_EQ(mt::ops::clip_coefficient(16.0, 1.0, 0.0), 1.0f);   // clipping off
}

// The launcher's two kernels: kSumBlocks partials over a fixed grid, then one block adds them (to
// *result when accumulating).
double emulated_sum_squares(const std::vector<float>& x, bool accumulate = false, double result = NAN) {
  std::vector<double> partial(rk::kSumBlocks, NAN);
  run(rk::partial_shape(), rk::sum_squares_partial_kernel, partial.data(), x.data(), int64_t(x.size()));
  run(rk::partials_shape(), rk::sum_partials_kernel, &result, static_cast<const double*>(partial.data()), accumulate);
  return result;
}

TEST_F(EmulatedFp32Ops, SumSquaresMatchesTheCpu) {
  // 300000 > kSumBlocks * kSumThreads: some threads take a second element.
  for (size_t n : {size_t(1), size_t(1000), size_t(300000)}) {
    SCOPED_TRACE(::testing::Message() << "N=" << n);
    const auto x = floats(n, -2.f, 2.f);
    const double want = mt::cpu::sum_squares<float>(x.data(), int64_t(n));
    EXPECT_LE(std::fabs(emulated_sum_squares(x) - want), tol::kSumSquares * want);
    EXPECT_EQ(emulated_sum_squares(x, true, 1.5), 1.5 + emulated_sum_squares(x)) << "accumulated";
  }
}

TEST_F(EmulatedFp32Ops, AllFiniteFindsEveryNonFiniteValue) {
  const float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  for (int64_t n : {int64_t(1), int64_t(257), int64_t(1000)}) {
    // -1: all finite; otherwise one NaN or infinity at any index of the first two blocks (every
    // thread's vote), or at the last.
    for (int64_t at = -1; at < n; at = at < 300 ? at + 1 : n - 1) {
      SCOPED_TRACE(::testing::Message() << "N=" << n << " at=" << at);
      auto x = floats(size_t(n), -1e38f, 1e38f);  // large but finite
      if (at >= 0) x[size_t(at)] = at % 3 == 0 ? kNan : at % 3 == 1 ? kInf : -kInf;
      int flag = 0;
      run(rk::all_finite_shape(n), rk::all_finite_kernel, &flag, static_cast<const float*>(x.data()), n);
      EXPECT_EQ(flag == 0, mt::cpu::all_finite(x.data(), n));
      EXPECT_EQ(flag == 0, at < 0);
      if (at == n - 1) break;
    }
  }
}

TEST_F(EmulatedFp32Ops, ScaleIsExactlyTheCpuProduct) {
  for (int64_t n : {int64_t(1), int64_t(257), int64_t(1000)}) {
    SCOPED_TRACE(::testing::Message() << "N=" << n);
    auto x = floats(size_t(n));
    auto got = x;
    mt::cpu::scale<float>(x.data(), 0.37f, n);
    run(ek::elementwise_shape(n), ek::scale_kernel, got.data(), 0.37f, n);
    EXPECT_TRUE(same_bits(got, x));
  }
}

// The launchers' grids cover every element in one pass up to 2^28 elements, and each thread loops
// beyond that; grids of one block and of three (not dividing n) take the loop here.
TEST_F(EmulatedFp32Ops, GridStrideLoopsCoverEveryElement) {
  const int64_t n = 1000;
  for (unsigned blocks : {1u, 3u}) {
    SCOPED_TRACE(::testing::Message() << blocks << " blocks");
    const LaunchShape l{dim3(blocks), dim3(mt::cuda::kBlock)};
    auto x = floats(size_t(n)), got = x;
    mt::cpu::scale<float>(x.data(), 1.5f, n);
    run(l, ek::scale_kernel, got.data(), 1.5f, n);
    EXPECT_TRUE(same_bits(got, x)) << "scale";

    auto p = floats(size_t(n)), m = floats(size_t(n)), v = floats(size_t(n), 0.f, 1.f);
    const auto g = floats(size_t(n));
    auto gp = p, gm = m, gv = v;
    mt::cpu::adamw<float>(p.data(), m.data(), v.data(), g.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.f, 3);
    run(l, ak::adamw_kernel, gp.data(), gm.data(), gv.data(), g.data(), n,
        ak::make_hyper(1e-3f, 0.9f, 0.95f, 1e-8f, 0.f, 3), static_cast<const float*>(nullptr));
    EXPECT_LE(max_rel_error(gp.data(), p.data(), p.size()), tol::kAdamW) << "adamw";

    x[size_t(n - 1)] = std::numeric_limits<float>::infinity();
    int flag = 0;
    run(l, rk::all_finite_kernel, &flag, static_cast<const float*>(x.data()), n);
    EXPECT_EQ(flag, 1) << "all_finite";
  }
}

TEST_F(EmulatedFp32Ops, RoundToGivesTheCpuBits) {
  // Random values over many binades plus the edge cases of both formats: zeros, infinities, NaNs with
  // payloads, the largest floats (fp16 overflow), fp16 subnormals, and ties to even in both (1 + half
  // a unit, rounded down; 1 + 3/2 units, rounded up).
  std::vector<float> x = floats(1000);
  for (size_t i = 0; i < x.size(); i++) x[i] = std::ldexp(x[i], int(i % 60) - 30);
  const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xff812345u,
                               0x7f7fffffu, 0x477ff000u, 0x477fefffu, 0x33800000u, 0x33000000u, 0x3f808000u,
                               0x3f818000u, 0x3f801000u, 0x3f803000u, 0x00000001u, 0x387fc000u};
  for (uint32_t u : specials) {
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  const int64_t n = int64_t(x.size());
  for (mt::DType t : {mt::DType::bf16, mt::DType::f16}) {
    SCOPED_TRACE(mt::dtype_name(t));
    auto want = x, got = x;
    mt::cpu::round_to(want.data(), n, int(t));
    if (t == mt::DType::bf16)
      run(ek::elementwise_shape(n), ek::round_bf16_kernel, got.data(), n);
    else
      run(ek::elementwise_shape(n), ek::round_f16_kernel, got.data(), n);
    EXPECT_TRUE(same_bits(got, want));
  }
}

}  // namespace
