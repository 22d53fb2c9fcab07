// The tensor-core fragment probe (kernels/cuda/fragment_probe_kernels.cuh) on the warp emulator, in bf16
// and fp16: the emulator's ldmatrix, mma and cp.async give the PTX ISA's answers (fragment_probe.h), bit
// for bit. `minitrain selftest` runs the same kernel against the same answers on a GPU, so the two
// together say whether the emulator the flash-kernel tests rely on agrees with the hardware.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/device_array.h"
#include "kernels/cuda/fragment_probe.h"
#include "kernels/cuda/fragment_probe_kernels.cuh"
#include "kernels/cuda/storage.cuh"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"

namespace {

namespace fp = mt::cuda::fragment_probe;
using mt::cuda::dev_ptr;
using mt::cuda::dev_t;
using mt::testing::emu::run;

template <class S>
fp::Result probe_on_emulator() {
  const std::vector<S> a = mt::cuda::to_storage<S>(fp::input_a()), b = mt::cuda::to_storage<S>(fp::input_b());
  fp::Result r = fp::expectations(fp::bit_patterns(a), fp::bit_patterns(b));
  r.c_nmajor.assign(r.c_want.size(), -1.f);
  r.c_kmajor.assign(r.c_want.size(), -1.f);
  r.regs.assign(r.regs_want.size(), 0xdeadbeefu);
  r.copied.assign(r.copied_want.size(), 0xdeadbeefu);
  run(mt::cuda::LaunchShape{dim3(1), dim3(fp::kLanes), fp::kSmemBytes}, fp::probe_kernel<dev_t<S>>,
      dev_ptr(a.data()), dev_ptr(b.data()), r.c_nmajor.data(), r.c_kmajor.data(), r.regs.data(), r.copied.data());
  return r;
}

template <class S>
class FragmentProbe : public ::testing::Test {};
using SixteenBit = ::testing::Types<mt::bf16, mt::f16>;
TYPED_TEST_SUITE(FragmentProbe, SixteenBit);

TYPED_TEST(FragmentProbe, EmulatorGivesThePtxIsaFragmentsBitForBit) {
  const fp::Result r = probe_on_emulator<TypeParam>();
  EXPECT_EQ(r.regs, r.regs_want) << "B fragments from ldmatrix.x4 (plain, then transposed)";
  EXPECT_EQ(r.c_nmajor, r.c_want) << "mma with B n-major";
  EXPECT_EQ(r.c_kmajor, r.c_want) << "mma with B k-major";
  EXPECT_EQ(r.copied, r.copied_want) << "cp.async with zero fill on odd lanes";
}

TEST(FragmentProbe, ExpectationsAreThePtxTablesNotTheLoaders) {
  // Spot checks written out by hand from the PTX ISA's B-fragment table, independent of the loop in
  // expectations(): lane 5 is (g, t) = (1, 1), so b0 = (B[2][1], B[3][1]) and b3 = (B[10][9], B[11][9]).
  std::vector<uint16_t> a(256), b(256);
  for (int i = 0; i < 256; i++) a[size_t(i)] = uint16_t(i), b[size_t(i)] = uint16_t(1000 + i);
  const fp::Result r = fp::expectations(a, b);
  auto B = [](int k, int n) { return uint32_t(1000 + 16 * k + n); };
  EXPECT_EQ(r.regs_want[5 * 8 + 0], B(2, 1) | B(3, 1) << 16);
  EXPECT_EQ(r.regs_want[5 * 8 + 3], B(10, 9) | B(11, 9) << 16);
  EXPECT_EQ(r.regs_want[5 * 8 + 7], r.regs_want[5 * 8 + 3]);
  // cp.async: lane 2 brings A's elements 16 .. 23, lane 3 zeros.
  EXPECT_EQ(r.copied_want[2 * 4 + 0], uint32_t(16) | uint32_t(17) << 16);
  EXPECT_EQ(r.copied_want[3 * 4 + 0], 0u);
}

}  // namespace
