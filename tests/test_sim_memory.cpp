// The simulated runtime's device memory (sim/): its own kind, checked at every call, named in every
// failure, out of the host's reach outside device work; and the stream-ordered allocator, whose frees
// take effect when their stream reaches them. This binary links mt_sim_cudart and no libcudart: every
// runtime call below is the sim's.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>

#include "sim/sim.h"
#include "tests/sim_test_util.h"

namespace {

using namespace mt::testing::sim;

// An address no mapping holds (the first page is never mapped), hidden from the compiler's bounds checks.
void* unmapped_address() {
  volatile uintptr_t a = 8;
  return reinterpret_cast<void*>(a);
}

// Device memory is its own kind, checked at every call.

TEST_F(Sim, HostPointerGivenAsCopyDestinationFailsNamingTheCall) {
  unsigned char* d = device(64);
  bytes h(64);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cudaMemcpy(h.data(), d, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  const std::string m = mt::sim::last_message();
  EXPECT_TRUE(has(m, "cudaMemcpy(..., cudaMemcpyHostToDevice): dst = " + hex(h.data()) + " is pageable host memory"))
      << m;
  EXPECT_EQ(printed, "simulated device: " + m + "\n") << "one line, printed";
}

TEST_F(Sim, CopyKindMustMatchBothPointers) {
  unsigned char* d = device(64);
  unsigned char* p = pinned(64, 0);
  bytes h(64);
  EXPECT_EQ(cudaMemcpy(d, d, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // src is device memory
  EXPECT_TRUE(has(mt::sim::last_message(), "src = " + hex(d) + " is device memory")) << mt::sim::last_message();
  EXPECT_EQ(cudaMemcpy(d, h.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, p, 64, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);  // pinned is host memory
  EXPECT_TRUE(has(mt::sim::last_message(), "pinned host memory")) << mt::sim::last_message();
  EXPECT_EQ(cudaMemcpy(h.data(), p, 64, cudaMemcpyHostToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 64, cudaMemcpyKind(7)), cudaErrorInvalidMemcpyDirection);
}

TEST_F(Sim, DefaultCopyKindInfersTheDirection) {
  const size_t n = random_size();
  unsigned char* a = device(n);
  unsigned char* b = device(n);
  bytes in(n), out(n);
  for (auto& x : in) x = random_byte();
  ASSERT_EQ(cudaMemcpy(a, in.data(), n, cudaMemcpyDefault), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b, a, n, cudaMemcpyDefault), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), b, n, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(out, in);
}

TEST_F(Sim, RangePastTheEndOfABlockFailsNamingTheBlock) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  bytes h(8);
  EXPECT_EQ(cudaMemcpy(d + n - 4, h.data(), 8, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "runs 4 bytes past the end of the cudaMalloc'd block of " +
                                               std::to_string(n) + " bytes at " + hex(d)))
      << mt::sim::last_message();
  EXPECT_EQ(cudaMemcpy(d + n - 8, h.data(), 8, cudaMemcpyHostToDevice), cudaSuccess);
}

TEST_F(Sim, FreedDeviceMemoryIsNamedAsFreed) {
  unsigned char* d = device(256);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
  bytes h(16);
  EXPECT_EQ(cudaMemcpy(h.data(), d + 16, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "freed device memory (offset 16 in the cudaMalloc'd block of 256 bytes"))
      << mt::sim::last_message();
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue) << "a second free";
  EXPECT_FALSE(mt::sim::is_device(d, 1));
}

TEST_F(Sim, FreeOfAPointerInsideABlockFails) {
  unsigned char* d = device(64);
  EXPECT_EQ(cudaFree(d + 16), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "not the start of a live device block")) << mt::sim::last_message();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST_F(Sim, PinnedMemoryIsHostMemoryTheSimKnows) {
  const size_t n = random_size();
  unsigned char* p = pinned(n, random_byte());
  unsigned char* d = device(n);
  EXPECT_FALSE(mt::sim::is_device(p, 1));
  ASSERT_EQ(cudaMemcpy(d, p, n, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(read(d, n), bytes(p, p + n));
  EXPECT_EQ(cudaMemcpy(p + 1, d, n, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "past the end of the cudaHostAlloc'd block")) << mt::sim::last_message();
  EXPECT_EQ(cudaFreeHost(d), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
}

TEST_F(Sim, RequireDeviceNamesTheCallAndTheArgument) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  bytes h(4);
  EXPECT_TRUE(mt::sim::is_device(d, n));
  EXPECT_TRUE(mt::sim::is_device(d + n - 1, 1));
  EXPECT_FALSE(mt::sim::is_device(d, n + 1));
  EXPECT_FALSE(mt::sim::is_device(h.data(), 1));
  try {
    mt::sim::require_device(h.data(), 4, "layernorm_forward", "weight");
    FAIL() << "a host pointer passed as device memory";
  } catch (const mt::sim::CudaError& e) {
    EXPECT_EQ(e.code(), cudaErrorInvalidValue);
    EXPECT_TRUE(has(e.what(), "layernorm_forward: weight = " + hex(h.data()) + " is pageable host memory")) << e.what();
  }
}

TEST_F(Sim, MemsetSetsEveryByteToTheValuesLowByte) {
  const size_t n = random_size();
  const unsigned char v = random_byte();
  unsigned char* d = device(n);
  ASSERT_EQ(cudaMemset(d, 0x300 | v, n), cudaSuccess);
  const bytes got = read(d, n);
  EXPECT_TRUE(all_equal(got.data(), n, v));
  bytes h(n);
  EXPECT_EQ(cudaMemset(h.data(), 0, n), cudaErrorInvalidValue);
  EXPECT_TRUE(has(mt::sim::last_message(), "cudaMemset: devPtr = " + hex(h.data()))) << mt::sim::last_message();
}

// Device memory is out of the host's reach outside device work.

TEST_F(Sim, HostReadOfDeviceMemoryIsCaught) {
  unsigned char* d = device(64);
  EXPECT_DEATH(read_one_byte(d + 8),
               "simulated device: host code read or wrote device memory at " + hex(d + 8) +
                   " \\(cudaMalloc'd block of 64 bytes\\) outside device work");
}

TEST_F(Sim, HostWriteOfDeviceMemoryIsCaught) {
  void* d = nullptr;
  ASSERT_EQ(cudaMallocAsync(&d, 100, 0), cudaSuccess);
  EXPECT_DEATH(write_one_byte(d), "host code read or wrote device memory at " + hex(d) +
                                      " \\(cudaMallocAsync'd block of 100 bytes\\) outside device work");
}

TEST_F(Sim, DeviceAccessOpensDeviceMemoryForItsScope) {
  unsigned char* d = device(64);
  {
    mt::sim::DeviceAccess open;
    d[3] = 42;
  }
  EXPECT_EQ(read(d, 64)[3], 42);
  EXPECT_DEATH(read_one_byte(d + 3), "outside device work");
}

TEST_F(Sim, QueuedWorkPastTheEndOfABlockIsCaught) {
  unsigned char* d = device(4096);  // a whole page: the next byte is the inaccessible page after it
  cudaStream_t s = stream();
  auto overrun = [&] {
    mt::sim::enqueue(s, "overrun_kernel", [d] { write_one_byte(d + 4096); });
    cudaStreamSynchronize(s);
  };
  EXPECT_DEATH(overrun(),
               "device work 'overrun_kernel' read or wrote " + hex(d + 4096) +
                   ", outside every live allocation \\(0 bytes past the end of the cudaMalloc'd block of 4096 bytes");
}

TEST_F(Sim, OtherFaultsGoToThePreviousHandler) {
  (void)device(64);  // the sim's handler is installed
  EXPECT_EXIT(write_one_byte(unmapped_address()), ::testing::KilledBySignal(SIGSEGV), "^$");
}

// The stream-ordered allocator.

TEST_F(Sim, FreeAsyncFreesInStreamOrder) {
  const size_t n = random_size();
  cudaStream_t s = stream();
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, n, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(p, 1, n, s), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  EXPECT_TRUE(mt::sim::is_device(p, n)) << "the free is queued behind the memset";
  EXPECT_EQ(cudaFreeAsync(p, s), cudaErrorInvalidValue) << "a second free";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_FALSE(mt::sim::is_device(p, 1));
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(free_bytes, total);
}

TEST_F(Sim, WorkQueuedBehindFreeAsyncFailsAtTheSynchronisingCall) {
  cudaStream_t s = stream();
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, 256, s), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(p, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(p, 1, 256, s), cudaSuccess) << "the block is still live at the call";
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
  const std::string m = mt::sim::last_message();
  EXPECT_TRUE(has(m, "queued work 'cudaMemsetAsync(devPtr " + hex(p))) << m;
  EXPECT_TRUE(has(m, "freed device memory (offset 0 in the cudaMallocAsync'd block of 256 bytes")) << m;
  EXPECT_TRUE(has(m, "freed by cudaFreeAsync")) << m;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress) << "sticky";
}

TEST_F(Sim, DefaultPoolTakesTheReleaseThreshold) {
  cudaMemPool_t pool;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  uint64_t threshold = UINT64_MAX;
  EXPECT_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), cudaSuccess);
  EXPECT_EQ(cudaMemPoolTrimTo(pool, 0), cudaSuccess);
  EXPECT_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &threshold), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceGetDefaultMemPool(&pool, 1), cudaErrorInvalidDevice);
}

}  // namespace
