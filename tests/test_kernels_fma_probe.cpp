// The FMA probe (kernels/cpu/fma_probe.h): what it measures is timing, which no unit test judges; here
// only that it runs on one thread and several, names the vector unit this CPU's GEMM uses, and
// returns a finite, positive rate.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/cpu/fma_probe.h"
#include "kernels/cpu/gemm_kernels.h"

namespace {

TEST(FmaProbe, NamesTheGemmsVectorUnitAndReturnsAPositiveRate) {
  const std::string gemm = mt::cpu::float_micro_kernel().name;  // "avx512", "avx2" or "portable"
  const std::string want = gemm == "avx512" ? "AVX-512" : gemm == "avx2" ? "AVX2" : "portable";
  for (int threads : {1, 2}) {
    const mt::cpu::FmaPeak p = mt::cpu::measure_fma_peak(threads, 0.0);
    EXPECT_EQ(std::string(p.unit), want) << threads << " threads";
    EXPECT_TRUE(std::isfinite(p.flops) && p.flops > 0) << p.flops;
  }
  EXPECT_GT(mt::cpu::measure_fma_peak(0, 0.0).flops, 0) << "0 threads reads as one";
}

}  // namespace
