// Kernel launches on the simulated device (MT_LAUNCH, kernels/cuda/launch.cuh): a launcher's kernel runs
// on the warp emulator when its stream is waited for, and a launch the hardware or the memory checks
// refuse fails at the launch, naming the kernel, as MT_CUDA_CHECK_LAUNCH reads it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/elementwise_kernels.cuh"
#include "sim/sim.h"
#include "tests/sim_test_util.h"

namespace {

using namespace mt::testing::sim;
using mt::cuda::elementwise_kernels::add_kernel;

class SimLaunch : public Sim {
 protected:
  float* device_floats(const std::vector<float>& v) {
    float* d = reinterpret_cast<float*>(device(v.size() * sizeof(float)));
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  std::vector<float> random_values(size_t n) { return mt::testing::random_floats(n, rng_); }
};

TEST_F(SimLaunch, KernelRunsWhenItsStreamIsWaitedFor) {
  const int64_t n = int64_t(random_size());
  const std::vector<float> a = random_values(size_t(n)), b = random_values(size_t(n));
  float* da = device_floats(a);
  float* db = device_floats(b);
  float* dout = device_floats(std::vector<float>(size_t(n), 0.f));
  float* h = reinterpret_cast<float*>(pinned(size_t(n) * sizeof(float), 0));
  cudaStream_t s = stream();
  const mt::cuda::LaunchShape l = mt::cuda::elementwise_kernels::elementwise_shape(n);
  MT_LAUNCH(l, s, add_kernel<float>)(dout, da, db, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << mt::sim::last_message();
  ASSERT_EQ(cudaMemcpyAsync(h, dout, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(h[i], 0.f) << "nothing waited: the pinned buffer is stale at " << i;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess) << mt::sim::last_message();
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(h[i], a[size_t(i)] + b[size_t(i)]) << "at " << i;
}

TEST_F(SimLaunch, HostPointerArgumentFailsNamingTheKernelAndTheArgument) {
  std::vector<float> host(64);
  float* d = device_floats(std::vector<float>(64, 1.f));
  const mt::cuda::LaunchShape l = mt::cuda::elementwise_kernels::elementwise_shape(64);
  MT_LAUNCH(l, stream(), add_kernel<float>)(d, host.data(), d, 64);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "add_kernel<float>: argument 1 = " + hex(host.data()) +
                                               " is pageable host memory"))
      << mt::sim::last_message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "nothing was queued";
}

TEST_F(SimLaunch, BlockOverTheHardwareLimitFailsNamingTheKernelAndTheLimit) {
  float* d = device_floats(std::vector<float>(2048, 1.f));
  const mt::cuda::LaunchShape l{dim3(1), dim3(2048)};
  MT_LAUNCH(l, stream(), add_kernel<float>)(d, d, d, 2048);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_TRUE(has(mt::sim::last_message(), "add_kernel<float>")) << mt::sim::last_message();
  EXPECT_TRUE(has(mt::sim::last_message(), "block.x = 2048, above the limit of 1024"))
      << mt::sim::last_message();
}

}  // namespace
