// The simulated CUDA runtime (sim/): what it promises the project's host code. Device memory is its
// own kind, checked at every call and out of the host's reach; streams run lazily, in order, and only
// when waited for, so a missing synchronisation reads stale data; events, the stream-ordered allocator,
// launch limits and errors behave as the real runtime's do. This binary links mt_sim_cudart and no
// libcudart: every runtime call below is the sim's.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sim/sim.h"
#include "tests/test_util.h"

namespace {

using bytes = std::vector<unsigned char>;

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)(uintptr_t)p);
  return buf;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class Sim : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
    mt::sim::set_eager(false);
    rng_.seed(mt::testing::test_seed());
  }
  void TearDown() override {
    mt::sim::set_eager(false);
    cudaDeviceReset();
  }
  unsigned char* device(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess);
    return static_cast<unsigned char*>(p);
  }
  unsigned char* pinned(size_t n, unsigned char fill) {
    void* p = nullptr;
    EXPECT_EQ(cudaHostAlloc(&p, n, cudaHostAllocDefault), cudaSuccess);
    std::memset(p, fill, n);
    return static_cast<unsigned char*>(p);
  }
  cudaStream_t stream(unsigned flags = cudaStreamDefault) {
    cudaStream_t s = nullptr;
    EXPECT_EQ(flags == cudaStreamDefault ? cudaStreamCreate(&s) : cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    return s;
  }
  cudaEvent_t event(unsigned flags = cudaEventDefault) {
    cudaEvent_t e = nullptr;
    EXPECT_EQ(flags == cudaEventDefault ? cudaEventCreate(&e) : cudaEventCreateWithFlags(&e, flags), cudaSuccess);
    return e;
  }
  // The device's bytes now, after all the work a blocking copy waits for.
  bytes read(const void* d, size_t n) {
    bytes h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess) << mt::sim::last_message();
    return h;
  }
  size_t random_size() { return std::uniform_int_distribution<size_t>(1, 20000)(rng_); }
  unsigned char random_byte() { return (unsigned char)std::uniform_int_distribution<int>(1, 255)(rng_); }
  std::mt19937_64 rng_;
};

bool all_equal(const unsigned char* p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return false;
  return true;
}

void read_one_byte(const void* p) { (void)*static_cast<const volatile unsigned char*>(p); }
void write_one_byte(void* p) { *static_cast<volatile unsigned char*>(p) = 1; }
// An address no mapping holds (the first page is never mapped), hidden from the compiler's bounds checks.
void* unmapped_address() {
  volatile uintptr_t a = 8;
  return reinterpret_cast<void*>(a);
}

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

// Streams run lazily, in order, when waited for.

TEST_F(Sim, WorkRunsOnlyWhenWaitedFor) {
  const size_t n = random_size();
  const unsigned char old_value = random_byte(), new_value = old_value ^ 0x5a;
  unsigned char* d = device(n);
  unsigned char* h = pinned(n, 0);
  ASSERT_EQ(cudaMemset(d, old_value, n), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t s = stream();
  ASSERT_EQ(cudaMemsetAsync(d, new_value, n, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, 0)) << "the copy into pinned memory has not run: nothing waited";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, new_value));
}

TEST_F(Sim, AStreamRunsItsWorkInIssueOrder) {
  const size_t n = 4096;
  unsigned char* d = device(n);
  cudaStream_t s = stream();
  bytes model(n, 0);
  ASSERT_EQ(cudaMemsetAsync(d, 0, n, s), cudaSuccess);
  for (int i = 0; i < 50; i++) {
    const size_t at = std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
    const size_t len = std::uniform_int_distribution<size_t>(1, n - at)(rng_);
    const unsigned char v = random_byte();
    ASSERT_EQ(cudaMemsetAsync(d + at, v, len, s), cudaSuccess);
    std::memset(model.data() + at, v, len);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(read(d, n), model);
}

TEST_F(Sim, WithoutAnEventAnotherStreamReadsStaleData) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  unsigned char* h = pinned(n, 0);
  ASSERT_EQ(cudaMemset(d, 1, n), cudaSuccess);
  cudaStream_t a = stream(), b = stream();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 7, n, a), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, 1)) << "b's copy ran before a's memset: nothing ordered them";
}

// Work that nothing orders runs in the order it was issued, whatever the streams: the same stale (or
// fresh) data on every run.
TEST_F(Sim, UnorderedWorkRunsInIssueOrder) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < 8; i++) streams.push_back(stream());
  for (int round = 0; round < 5; round++) {
    std::shuffle(streams.begin(), streams.end(), rng_);
    for (size_t i = 0; i < streams.size(); i++)
      ASSERT_EQ(cudaMemsetAsync(d, int(i + 1), n, streams[i]), cudaSuccess);
    ASSERT_TRUE(all_equal(read(d, n).data(), n, (unsigned char)streams.size())) << "the last memset issued wins";
  }
}

TEST_F(Sim, StreamWaitEventOrdersAcrossStreams) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  unsigned char* h = pinned(n, 0);
  const unsigned char v = random_byte();
  cudaStream_t a = stream(), b = stream(cudaStreamNonBlocking);
  cudaEvent_t e = event(cudaEventDisableTiming);
  ASSERT_EQ(cudaMemsetAsync(d, v, n, a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);  // a is never synchronised: b's wait ran a's work
  EXPECT_TRUE(all_equal(h, n, v));
}

// Legacy default stream semantics: it waits for, and is waited for by, blocking streams only.
TEST_F(Sim, LegacyDefaultStreamSynchronisesWithBlockingStreamsOnly) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  unsigned char* h = pinned(n, 0);
  cudaStream_t blocking = stream(), non_blocking = stream(cudaStreamNonBlocking);

  ASSERT_EQ(cudaMemsetAsync(d, 2, n, blocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(0), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, 2)) << "work on the legacy stream waits for a blocking stream's";

  ASSERT_EQ(cudaMemsetAsync(d, 3, n, non_blocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, cudaStreamLegacy), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, 2)) << "but not for a non-blocking stream's";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  ASSERT_EQ(cudaMemset(d, 4, n), cudaSuccess);  // queued on the legacy stream
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, 4)) << "a blocking stream's work waits for the legacy stream's";

  ASSERT_EQ(cudaMemset(d, 5, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, non_blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(non_blocking), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, 4)) << "a non-blocking stream's does not";
}

TEST_F(Sim, BlockingMemcpyWaitsForBlockingStreamsOnly) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  cudaStream_t blocking = stream(), non_blocking = stream(cudaStreamNonBlocking);
  ASSERT_EQ(cudaMemsetAsync(d, 6, n, blocking), cudaSuccess);
  EXPECT_TRUE(all_equal(read(d, n).data(), n, 6));
  ASSERT_EQ(cudaMemsetAsync(d, 7, n, non_blocking), cudaSuccess);
  EXPECT_TRUE(all_equal(read(d, n).data(), n, 6));
}

TEST_F(Sim, AsyncCopyFromPageableMemoryReadsTheSourceAtTheCall) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  bytes src(n, 9);
  cudaStream_t s = stream();
  ASSERT_EQ(cudaMemcpyAsync(d, src.data(), n, cudaMemcpyHostToDevice, s), cudaSuccess);
  std::fill(src.begin(), src.end(), 10);  // allowed: the runtime staged the pageable source
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(read(d, n).data(), n, 9));
}

TEST_F(Sim, AsyncCopyToPageableMemoryReturnsAfterTheCopy) {
  const size_t n = random_size();
  unsigned char* d = device(n);
  bytes dst(n, 0);
  cudaStream_t s = stream(cudaStreamNonBlocking);
  ASSERT_EQ(cudaMemsetAsync(d, 11, n, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dst.data(), d, n, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_TRUE(all_equal(dst.data(), n, 11));
}

TEST_F(Sim, AsyncHostToHostCopyReturnsAfterTheCopy) {
  const size_t n = random_size();
  unsigned char* a = pinned(n, 21);
  unsigned char* b = pinned(n, 0);
  ASSERT_EQ(cudaMemcpyAsync(b, a, n, cudaMemcpyHostToHost, stream()), cudaSuccess);
  EXPECT_TRUE(all_equal(b, n, 21));
}

TEST_F(Sim, DestroyedStreamStillRunsItsWork) {
  unsigned char* d = device(64);
  cudaStream_t s = stream(cudaStreamNonBlocking);
  ASSERT_EQ(cudaMemsetAsync(d, 12, 64, s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(d, 13, 64, s), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(all_equal(read(d, 64).data(), 64, 12));
}

TEST_F(Sim, QueuedWorkRunsWithDeviceMemoryOpen) {
  const size_t n = random_size();
  const unsigned char v = random_byte();
  unsigned char* d = device(n);
  mt::sim::enqueue(cudaStreamPerThread, "fill_kernel", [=] { std::memset(d, v, n); });
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  EXPECT_TRUE(all_equal(read(d, n).data(), n, v));
}

TEST_F(Sim, FailureInQueuedWorkIsStickyAtTheSynchronisingCall) {
  cudaStream_t s = stream();
  mt::sim::enqueue(s, "softmax_kernel", [] { throw std::runtime_error("row 3 has no finite value"); });
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "nothing has run yet";
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
  EXPECT_TRUE(has(mt::sim::last_message(), "queued work 'softmax_kernel' failed: row 3 has no finite value"))
      << mt::sim::last_message();
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure) << "sticky: the context is lost";
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "reading a sticky error does not clear it";
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 16), cudaSuccess);
}

TEST_F(Sim, EagerModeRunsEveryCallAtOnce) {
  const size_t n = random_size();
  const unsigned char v = random_byte();
  unsigned char* d = device(n);
  unsigned char* h = pinned(n, 0);
  cudaStream_t s = stream();
  ASSERT_EQ(cudaMemsetAsync(d, v, n, s), cudaSuccess);
  mt::sim::set_eager(true);  // runs what is queued
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_TRUE(all_equal(h, n, v)) << "no synchronisation needed";
}

// Exit status 0 when a copy into pinned memory has run without anything waiting for it.
int copy_ran_at_once() {
  void* d = nullptr;
  void* h = nullptr;
  if (cudaMalloc(&d, 64) != cudaSuccess || cudaHostAlloc(&h, 64, cudaHostAllocDefault) != cudaSuccess) return 2;
  std::memset(h, 0, 64);
  cudaMemsetAsync(d, 1, 64, 0);
  cudaMemcpyAsync(h, d, 64, cudaMemcpyDeviceToHost, 0);
  return mt::sim::eager() && static_cast<unsigned char*>(h)[63] == 1 ? 0 : 1;
}

// No fixture: the child process's first runtime call creates the device, which reads MT_SIM_EAGER.
TEST(SimEnvironment, EagerModeCanBeTurnedOnFromTheEnvironment) {
  const std::string style = GTEST_FLAG_GET(death_test_style);
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process
  setenv("MT_SIM_EAGER", "1", 1);
  EXPECT_EXIT(std::exit(copy_ran_at_once()), ::testing::ExitedWithCode(0),
              "simulated device: eager mode \\(MT_SIM_EAGER=1\\)");
  unsetenv("MT_SIM_EAGER");
  GTEST_FLAG_SET(death_test_style, style);
}

// Events.

TEST_F(Sim, EventQueryRunsTheWorkInFrontOfTheEventOnly) {
  const size_t n = random_size();
  const unsigned char v = random_byte();
  unsigned char* d = device(n);
  unsigned char* behind = pinned(n, 0);
  unsigned char* probe = pinned(n, 0);
  cudaStream_t s = stream(), other = stream(cudaStreamNonBlocking);
  cudaEvent_t e = event();
  ASSERT_EQ(cudaMemsetAsync(d, v, n, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(behind, d, n, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  EXPECT_TRUE(all_equal(behind, n, 0)) << "the copy behind the event has not run";
  ASSERT_EQ(cudaMemcpyAsync(probe, d, n, cudaMemcpyDeviceToHost, other), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_TRUE(all_equal(probe, n, v)) << "the memset in front of the event has";
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_TRUE(all_equal(behind, n, 0));
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(all_equal(behind, n, v));
}

TEST_F(Sim, ElapsedTimeIsNonNegativeAndAdds) {
  unsigned char* d = device(64);
  cudaStream_t s = stream();
  cudaEvent_t e[3] = {event(), event(), event()};
  const int k1 = std::uniform_int_distribution<int>(0, 5)(rng_), k2 = std::uniform_int_distribution<int>(1, 5)(rng_);
  ASSERT_EQ(cudaEventRecord(e[0], s), cudaSuccess);
  for (int i = 0; i < k1; i++) ASSERT_EQ(cudaMemsetAsync(d, i, 64, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e[1], s), cudaSuccess);
  for (int i = 0; i < k2; i++) ASSERT_EQ(cudaMemsetAsync(d, i, 64, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e[2], s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e[2]), cudaSuccess);
  float t01 = -1, t12 = -1, t02 = -1;
  ASSERT_EQ(cudaEventElapsedTime(&t01, e[0], e[1]), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&t12, e[1], e[2]), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&t02, e[0], e[2]), cudaSuccess);
  EXPECT_GE(t01, 0.f);
  EXPECT_GT(t12, 0.f) << "work between two records takes time";
  EXPECT_NEAR(t01 + t12, t02, 1e-6f);
}

TEST_F(Sim, ElapsedTimeNeedsTimingEventsThatHaveCompleted) {
  cudaStream_t s = stream();
  cudaEvent_t timed = event(), untimed = event(cudaEventDisableTiming), never = event();
  unsigned char* d = device(64);
  ASSERT_EQ(cudaMemsetAsync(d, 1, 64, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(timed, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s), cudaSuccess);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, timed), cudaErrorNotReady) << "nothing waited for the record";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not ready is an answer, not an error";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, timed), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_TRUE(has(mt::sim::last_message(), "cudaEventDisableTiming")) << mt::sim::last_message();
  EXPECT_EQ(cudaEventElapsedTime(&ms, never, timed), cudaErrorInvalidResourceHandle);
}

TEST_F(Sim, DestroyingAnEventWithItsRecordQueuedIsSafe) {
  cudaStream_t s = stream();
  cudaEvent_t e = event(cudaEventDisableTiming);
  unsigned char* d = device(64);
  ASSERT_EQ(cudaMemsetAsync(d, 1, 64, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
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
