// The simulated runtime's streams and events (sim/): work runs lazily, in issue order, and only when
// something waits for it, so a missing synchronisation reads stale data, the same on every run; order
// across streams comes only from events and the legacy default stream, as on the hardware.
// This binary links mt_sim_cudart and no libcudart: every runtime call below is the sim's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/sim.h"
#include "tests/sim_test_util.h"

namespace {

using namespace mt::testing::sim;

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

// Held work (sim.h enqueue_held): device work waiting for something that may never come, as a
// collective whose peers hang. Only a polled query gets past it; a blocking wait fails naming it
// instead of hanging; work behind it, on its stream and across an event, waits too.
TEST_F(Sim, HeldWorkIsNotReadyAndBlockingWaitsBehindItFailNamingIt) {
  const size_t n = random_size();
  const unsigned char value = random_byte() | 1;
  cudaStream_t s = stream(), other = stream();
  cudaEvent_t after = event(cudaEventDisableTiming), behind = event(cudaEventDisableTiming);
  unsigned char* d = device(n);
  unsigned char* h = pinned(n, 0);
  bool released = false;
  mt::sim::enqueue_held(s, "a collective whose peers hang", [&] { return released; });
  ASSERT_EQ(cudaMemsetAsync(d, value, n, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(after, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(other, after, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, other), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(behind, other), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(behind), cudaErrorNotReady) << "ordered after the held work by an event";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not ready is an answer, not an error";
  EXPECT_TRUE(all_equal(h, n, 0));
  EXPECT_EQ(cudaStreamSynchronize(other), cudaErrorLaunchTimeout);
  EXPECT_TRUE(has(mt::sim::last_message(), "cudaStreamSynchronize")) << mt::sim::last_message();
  EXPECT_TRUE(has(mt::sim::last_message(), "a collective whose peers hang")) << mt::sim::last_message();
  const uint64_t syncs = mt::sim::device_synchronizations();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchTimeout);
  EXPECT_EQ(mt::sim::device_synchronizations(), syncs + 1) << "every call counted";
  EXPECT_EQ(cudaEventSynchronize(behind), cudaErrorLaunchTimeout);
  std::vector<unsigned char> pageable(n);
  EXPECT_EQ(cudaMemcpy(pageable.data(), d, n, cudaMemcpyDeviceToHost), cudaErrorLaunchTimeout)
      << "a blocking copy on the legacy stream waits for the blocking stream s";
  (void)cudaGetLastError();
  released = true;
  EXPECT_EQ(cudaEventQuery(behind), cudaSuccess) << "released: everything behind it runs";
  EXPECT_TRUE(all_equal(h, n, value));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the blocking copy left queued runs now, into `pageable`";
  EXPECT_TRUE(all_equal(pageable.data(), n, value));
}

}  // namespace
