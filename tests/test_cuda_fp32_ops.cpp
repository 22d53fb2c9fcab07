// The CUDA ops outside the storage-type templates against the CPU reference: conversions between fp32
// and bf16/fp16 (bit-identical for every value, NaN and infinity included), and the fp32 optimizer-side
// ops (AdamW, sum of squares, scale, round_to, all_finite). Each test skips without a CUDA device.
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

class CudaFp32Ops : public CudaTest {};

// Uniform random bit patterns cover every exponent: NaNs, infinities, fp32 subnormals, values that
// round into fp16 subnormals or overflow to inf. The fixed list adds exact ties and boundaries.
std::vector<float> every_kind_of_float(std::mt19937_64& rng) {
  std::vector<float> x = {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, NAN, 65504.f, 65519.f, 65520.f, -65520.f,
                          6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 8.940697e-08f, 1.00390625f, 1.01171875f,
                          1.0009765625f, 3.4e38f};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; i++) x.push_back(mt::f32_from_bits(bits(rng)));
  return x;
}

template <class S>
void expect_conversions_bit_identical(const std::vector<float>& x, const mt::ops::Ctx& gpu) {
  SCOPED_TRACE(mt::dtype_name(mt::dtype_of<S>()));
  std::vector<S> want(x.size());
  mt::cpu::convert<S, float>(want.data(), x.data(), int64_t(x.size()));
  DeviceArray<float> d_x(x);
  DeviceArray<S> d_s(want);
  mt::cuda::device_memset_zero(d_s.get(), x.size() * sizeof(S));
  mt::cuda::convert<S, float>(d_s.get(), d_x.get(), int64_t(x.size()), gpu);
  EXPECT_TRUE(same_bits(d_s.host(), want)) << "fp32 -> 16 bits";

  std::vector<S> all(65536);  // every 16-bit pattern
  for (size_t i = 0; i < all.size(); i++) all[i].bits = uint16_t(i);
  std::vector<float> back(all.size());
  mt::cpu::convert<float, S>(back.data(), all.data(), int64_t(all.size()));
  DeviceArray<S> d_all(all);
  DeviceArray<float> d_back(back);
  mt::cuda::device_memset_zero(d_back.get(), back.size() * sizeof(float));
  mt::cuda::convert<float, S>(d_back.get(), d_all.get(), int64_t(all.size()), gpu);
  EXPECT_TRUE(same_bits(d_back.host(), back)) << "16 bits -> fp32";
}

TEST_F(CudaFp32Ops, ConvertIsBitIdenticalToCpuForEveryKindOfValue) {
  const std::vector<float> x = every_kind_of_float(rng);
  expect_conversions_bit_identical<bf16>(x, gpu);
  expect_conversions_bit_identical<f16>(x, gpu);
  DeviceArray<float> d_x(x), d_copy(random_floats(x.size(), rng));
  mt::cuda::convert<float, float>(d_copy.get(), d_x.get(), int64_t(x.size()), gpu);
  EXPECT_TRUE(same_bits(d_copy.host(), x)) << "fp32 copy";
}

TEST_F(CudaFp32Ops, AdamWMatchesCpu) {
  std::uniform_int_distribution<int> step(1, 1000);
  for (int64_t n : {int64_t(1), int64_t(1001), int64_t(65537)}) {
    const int t = step(rng);
    SCOPED_TRACE(testing::Message() << "N=" << n << " t=" << t);
    auto p = random_floats(size_t(n), rng), g = random_floats(size_t(n), rng);
    auto m = random_floats(size_t(n), rng, -0.1f, 0.1f), v = random_floats(size_t(n), rng, 0.f, 0.01f);
    DeviceArray<float> d_p(p), d_m(m), d_v(v), d_g(g);
    mt::cpu::adamw<float>(p.data(), m.data(), v.data(), g.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    mt::cuda::adamw(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, gpu, nullptr);
    EXPECT_TRUE(close(d_p.host(), p, tol::kAdamW)) << "params";
    EXPECT_TRUE(close(d_m.host(), m, tol::kAdamW)) << "m";
    EXPECT_TRUE(close(d_v.host(), v, tol::kAdamW)) << "v";
  }
}

TEST_F(CudaFp32Ops, SumSquaresMatchesCpuAndIsBitwiseReproducible) {
  for (int64_t n : {int64_t(1), int64_t(4095), int64_t(4097), int64_t(1000003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto x = random_floats(size_t(n), rng, -3.f, 3.f);
    const double want = mt::cpu::sum_squares<float>(x.data(), n);
    DeviceArray<float> d_x(x);
    const double got = mt::cuda::sum_squares(d_x.get(), n, gpu);
    EXPECT_LE(std::fabs(got - want), tol::kSumSquares * want) << got << " vs " << want;
    const double again = mt::cuda::sum_squares(d_x.get(), n, gpu);
    EXPECT_EQ(std::memcmp(&got, &again, sizeof got), 0) << "two calls on the same data gave different bits";
  }
}

TEST_F(CudaFp32Ops, ScaleIsExact) {
  for (int64_t n : {int64_t(1), int64_t(31), int64_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto x = random_floats(size_t(n), rng);
    const float s = std::uniform_real_distribution<float>(-4.f, 4.f)(rng);
    DeviceArray<float> d_x(x);
    mt::cpu::scale<float>(x.data(), s, n);
    mt::cuda::scale(d_x.get(), s, n, gpu);
    EXPECT_TRUE(same_bits(d_x.host(), x));
  }
}

TEST_F(CudaFp32Ops, RoundToIsBitIdenticalToCpuForEveryKindOfValue) {
  const std::vector<float> x = every_kind_of_float(rng);
  for (mt::DType t : {mt::DType::f32, mt::DType::bf16, mt::DType::f16}) {
    SCOPED_TRACE(mt::dtype_name(t));
    auto want = x;
    mt::cpu::round_to(want.data(), int64_t(want.size()), int(t));
    DeviceArray<float> d_x(x);
    mt::cuda::round_to(d_x.get(), int64_t(x.size()), t, gpu);
    auto got = d_x.host();
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < x.size(); i++)
      if (mt::f32_bits(got[i]) != mt::f32_bits(want[i]) && mismatches++ == 0) first = i;
    EXPECT_EQ(mismatches, 0u) << "first at input bits 0x" << std::hex << mt::f32_bits(x[first]) << ": cuda 0x"
                              << mt::f32_bits(got[first]) << ", cpu 0x" << mt::f32_bits(want[first]);
  }
  DeviceArray<float> d_x(x);
  EXPECT_THROW(mt::cuda::round_to(d_x.get(), 1, mt::DType::i32, gpu), mt::Error);
}

TEST_F(CudaFp32Ops, AllFiniteFindsASingleInfOrNaNAnywhere) {
  for (int64_t n : {int64_t(1), int64_t(257), int64_t(1000003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto x = random_floats(size_t(n), rng, -1e30f, 1e30f);
    {
      DeviceArray<float> d_x(x);
      EXPECT_TRUE(mt::cuda::all_finite(d_x.get(), n, gpu));
    }
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      auto y = x;
      y[std::uniform_int_distribution<size_t>(0, y.size() - 1)(rng)] = bad;
      DeviceArray<float> d_y(y);
      EXPECT_FALSE(mt::cuda::all_finite(d_y.get(), n, gpu)) << "missed " << bad;
    }
  }
}

TEST_F(CudaFp32Ops, OpsDispatchRoutesACudaContextToTheGpuForEveryStorageType) {
  auto a = random_floats(1000, rng), b = random_floats(1000, rng);
  std::vector<float> want(a.size());
  mt::ops::add(want.data(), a.data(), b.data(), int64_t(a.size()), mt::ops::Ctx{});
  DeviceArray<float> d_a(a), d_b(b), d_out(random_floats(a.size(), rng));
  mt::ops::add(d_out.get(), d_a.get(), d_b.get(), int64_t(a.size()), gpu);
  EXPECT_TRUE(same_bits(d_out.host(), want));

  std::vector<bf16> a16(a.size()), b16(a.size()), want16(a.size());
  mt::ops::convert(a16.data(), a.data(), int64_t(a.size()), mt::ops::Ctx{});
  mt::ops::convert(b16.data(), b.data(), int64_t(b.size()), mt::ops::Ctx{});
  mt::ops::add(want16.data(), a16.data(), b16.data(), int64_t(a.size()), mt::ops::Ctx{});
  DeviceArray<bf16> d_a16(a16), d_b16(b16), d_out16(b16);
  mt::ops::add(d_out16.get(), d_a16.get(), d_b16.get(), int64_t(a.size()), gpu);
  EXPECT_TRUE(same_bits(d_out16.host(), want16));
}

}  // namespace
