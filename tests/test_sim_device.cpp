// The simulated runtime's device (sim/): an H200's properties, its launch limits (named by kernel), and
// the runtime's own error strings. This binary links mt_sim_cudart and no libcudart: every runtime call
// below is the sim's.
#include <gtest/gtest.h>

#include <string>

#include "sim/sim.h"
#include "tests/sim_test_util.h"

namespace {

using namespace mt::testing::sim;

// The device: one H200.

TEST_F(Sim, DeviceReportsAnH200) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 1);
  cudaDeviceProp p;
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_STREQ(p.name, "NVIDIA H200 (simulated)");
  EXPECT_EQ(p.multiProcessorCount, 132);
  EXPECT_EQ(p.major * 10 + p.minor, 90);
  EXPECT_EQ(p.totalGlobalMem, size_t(143771287552));
  EXPECT_EQ(p.sharedMemPerBlock, size_t(49152));
  EXPECT_EQ(p.sharedMemPerBlockOptin, size_t(232448));
  EXPECT_EQ(p.maxThreadsPerBlock, 1024);
  EXPECT_EQ(p.warpSize, 32);
  int optin = 0, major = 0, sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(optin, 232448);
  EXPECT_EQ(major, 9);
  EXPECT_EQ(sms, 132);
}

TEST_F(Sim, OnlyDeviceZeroExists) {
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  int d = -1;
  ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
  EXPECT_EQ(d, 0);
}

TEST_F(Sim, AttributeTheSimDoesNotAnswerFailsNamingItself) {
  int v = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrHostNativeAtomicSupported, 0), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "cudaDeviceGetAttribute: attribute")) << mt::sim::last_message();
}

TEST_F(Sim, MemGetInfoFreeFollowsLiveAllocations) {
  size_t free0 = 0, total = 0, free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  EXPECT_EQ(total, size_t(143771287552));
  EXPECT_EQ(free0, total);
  const size_t a = random_size(), b = random_size();
  unsigned char* pa = device(a);
  unsigned char* pb = device(b);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free0 - free1, a + b);
  ASSERT_EQ(cudaFree(pa), cudaSuccess);
  ASSERT_EQ(cudaFree(pb), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free1, free0);
}

TEST_F(Sim, AllocationBeyondTheDeviceIsOutOfMemory) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, size_t(143771287552) + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "reading the last error clears it";
}
// Launch limits.

void some_kernel() {}
void other_kernel() {}

TEST_F(Sim, LaunchOverTheBlockLimitFailsNamingTheKernel) {
  EXPECT_EQ(mt::sim::check_launch("softmax_forward_kernel", dim3(8), dim3(32, 33), 0, (const void*)some_kernel),
            cudaErrorInvalidConfiguration);
  EXPECT_TRUE(has(mt::sim::last_message(),
                  "launch of softmax_forward_kernel<<<(8, 1, 1), (32, 33, 1), 0>>>: 1056 threads per block, above "
                  "the limit of 1024"))
      << mt::sim::last_message();
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << "the launch error stays until read";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const unsigned x = std::uniform_int_distribution<unsigned>(1, 1024)(rng_);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(7), dim3(x, 1024 / x), 0, (const void*)some_kernel), cudaSuccess);
}

TEST_F(Sim, GridAndBlockDimensionsHaveTheHardwaresLimits) {
  const void* f = (const void*)some_kernel;
  EXPECT_EQ(mt::sim::check_launch("k", dim3(2147483647u, 65535, 65535), dim3(1, 1, 64), 0, f), cudaSuccess);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(1, 65536), dim3(32), 0, f), cudaErrorInvalidConfiguration);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(1, 1, 65536), dim3(32), 0, f), cudaErrorInvalidConfiguration);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(2147483648u), dim3(32), 0, f), cudaErrorInvalidConfiguration);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(1), dim3(1, 1, 65), 0, f), cudaErrorInvalidConfiguration);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(1), dim3(1025), 0, f), cudaErrorInvalidConfiguration);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(0), dim3(32), 0, f), cudaErrorInvalidConfiguration);
  EXPECT_EQ(mt::sim::check_launch("k", dim3(1), dim3(1, 1024), 0, f), cudaSuccess);
}

TEST_F(Sim, DynamicSharedMemoryAboveDefaultNeedsTheAttribute) {
  const void* f = (const void*)some_kernel;
  EXPECT_EQ(mt::sim::check_launch("flash_kernel", dim3(1), dim3(128), 49152, f), cudaSuccess);
  EXPECT_EQ(mt::sim::check_launch("flash_kernel", dim3(1), dim3(128), 49153, f), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "flash_kernel")) << mt::sim::last_message();
  EXPECT_TRUE(has(mt::sim::last_message(), "cudaFuncAttributeMaxDynamicSharedMemorySize")) << mt::sim::last_message();
  const int raised = std::uniform_int_distribution<int>(49153, 232448)(rng_);
  ASSERT_EQ(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, raised), cudaSuccess);
  EXPECT_EQ(mt::sim::check_launch("flash_kernel", dim3(1), dim3(128), size_t(raised), f), cudaSuccess);
  EXPECT_EQ(mt::sim::check_launch("flash_kernel", dim3(1), dim3(128), size_t(raised) + 1, f), cudaErrorInvalidValue);
  EXPECT_EQ(mt::sim::check_launch("other", dim3(1), dim3(128), size_t(raised), (const void*)other_kernel),
            cudaErrorInvalidValue)
      << "the attribute is per kernel";
  EXPECT_EQ(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 232449), cudaErrorInvalidValue);
}

// Errors.

TEST_F(Sim, ErrorStringsAreTheRuntimesOwn) {
  EXPECT_STREQ(cudaGetErrorString(cudaSuccess), "no error");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidResourceHandle), "invalid resource handle");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorNotReady), "device not ready");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorIllegalAddress), "an illegal memory access was encountered");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorLaunchFailure), "unspecified launch failure");
  EXPECT_STREQ(cudaGetErrorString(cudaError_t(12345)), "unrecognized error code");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidDevice), "cudaErrorInvalidDevice");
}

}  // namespace
