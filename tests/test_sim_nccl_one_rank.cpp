// The simulated NCCL (sim/nccl*.cpp) with a communicator of one rank in a process that never
// initialises MPI, as real NCCL runs one in a single process (NcclComm over a SelfComm; a one-process
// trainer on a GPU): ids and ncclCommInitRank without MPI; every collective the copy of the rank's own
// data (a reduction of one rank: sum and max the data, avg the data divided by 1 in its element type),
// bitwise, and in its stream's order; sends to itself meeting receives in a group in issue order; splits;
// and what still fails: a host buffer names the call, a send nobody receives fails at once, and a
// communicator of two ranks without MPI names MPI. MPI is checked never to be initialised.
// The stand-in (mt_sim_nccl) is built where MPI is; elsewhere the test skips.
#include <gtest/gtest.h>

#if __has_include(<mpi.h>)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only; the deprecated C++ bindings need another library
#endif
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "tests/sim_test_util.h"

namespace {

using namespace mt::testing::sim;
using Clock = std::chrono::steady_clock;

constexpr ncclDataType_t kTypes[] = {ncclFloat32, ncclBfloat16, ncclFloat16, ncclInt32, ncclUint8};
constexpr ncclRedOp_t kOps[] = {ncclSum, ncclAvg, ncclMax};
constexpr size_t kCounts[] = {1, 7, 1031};

size_t size_of(ncclDataType_t t) { return t == ncclFloat32 || t == ncclInt32 ? 4 : t == ncclUint8 ? 1 : 2; }

std::string last_error() { return ncclGetLastError(nullptr); }

bool mpi_initialized() {
  int on = 0;
  MPI_Initialized(&on);
  return on != 0;
}

class OneRankNccl : public Sim {
 protected:
  void SetUp() override {
    Sim::SetUp();
    unsetenv("MT_SIM_NCCL_TIMEOUT");
    comm_ = make_comm();
    ASSERT_NE(comm_, nullptr) << last_error();
  }
  void TearDown() override {
    if (comm_ && abort_) {
      EXPECT_EQ(ncclCommAbort(comm_), ncclSuccess);
    } else if (comm_) {
      EXPECT_EQ(ncclCommFinalize(comm_), ncclSuccess) << last_error();
      EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess) << last_error();
    }
    EXPECT_FALSE(mpi_initialized()) << "a communicator of one rank needs no MPI";
    Sim::TearDown();
  }

  ncclComm_t make_comm() {
    ncclUniqueId id{};
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << last_error();
    ncclComm_t c = nullptr;
    EXPECT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess) << last_error();
    return c;
  }

  // `count` finite values of type t (floats in [-4, 4) rounded to t; integers of any bits).
  bytes values(ncclDataType_t t, size_t count) {
    std::uniform_real_distribution<float> u(-4.f, 4.f);
    bytes b(count * size_of(t));
    for (size_t i = 0; i < count; i++) {
      if (t == ncclFloat32) {
        const float v = u(rng_);
        std::memcpy(b.data() + 4 * i, &v, 4);
      } else if (t == ncclBfloat16 || t == ncclFloat16) {
        const uint16_t h = t == ncclBfloat16 ? mt::f32_to_bf16(u(rng_)) : mt::f32_to_f16(u(rng_));
        std::memcpy(b.data() + 2 * i, &h, 2);
      } else {
        for (size_t k = 0; k < size_of(t); k++) b[i * size_of(t) + k] = (unsigned char)rng_();
      }
    }
    return b;
  }
  unsigned char* upload(const bytes& h) {
    unsigned char* d = device(h.size());
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }

  ncclComm_t comm_ = nullptr;
  bool abort_ = false;  // the test made the communicator fail
};

TEST_F(OneRankNccl, InitWithoutMpiGivesRankZeroOfOne) {
  int rank = -1, count = -1;
  ncclResult_t async = ncclInternalError;
  ASSERT_EQ(ncclCommUserRank(comm_, &rank), ncclSuccess);
  ASSERT_EQ(ncclCommCount(comm_, &count), ncclSuccess);
  ASSERT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_FALSE(mpi_initialized());
}

TEST_F(OneRankNccl, AllReduceOfEveryTypeAndOpGivesTheDataBack) {
  for (ncclDataType_t t : kTypes)
    for (ncclRedOp_t op : kOps)
      for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "type " << int(t) << " op " << int(op) << " count " << count
                                            << (in_place ? " in place" : ""));
          const bytes x = values(t, count);
          unsigned char* send = upload(x);
          unsigned char* recv = in_place ? send : device(x.size());
          ASSERT_EQ(ncclAllReduce(send, recv, count, t, op, comm_, nullptr), ncclSuccess) << last_error();
          EXPECT_EQ(read(recv, x.size()), x);
        }
}

TEST_F(OneRankNccl, ReduceScatterAllGatherAndBroadcastAreCopies) {
  for (ncclDataType_t t : kTypes)
    for (size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << "type " << int(t) << " count " << count);
      const bytes x = values(t, count);
      unsigned char* send = upload(x);
      unsigned char* out = device(x.size());
      ASSERT_EQ(ncclReduceScatter(send, out, count, t, ncclAvg, comm_, nullptr), ncclSuccess) << last_error();
      EXPECT_EQ(read(out, x.size()), x);
      out = device(x.size());
      ASSERT_EQ(ncclAllGather(send, out, count, t, comm_, nullptr), ncclSuccess) << last_error();
      EXPECT_EQ(read(out, x.size()), x);
      out = device(x.size());
      ASSERT_EQ(ncclBroadcast(send, out, count, t, 0, comm_, nullptr), ncclSuccess) << last_error();
      EXPECT_EQ(read(out, x.size()), x);
      // In place (rank 0's chunk and slot are the buffer's start): the data stays as it is.
      ASSERT_EQ(ncclReduceScatter(send, send, count, t, ncclSum, comm_, nullptr), ncclSuccess) << last_error();
      ASSERT_EQ(ncclAllGather(send, send, count, t, comm_, nullptr), ncclSuccess) << last_error();
      ASSERT_EQ(ncclBroadcast(send, send, count, t, 0, comm_, nullptr), ncclSuccess) << last_error();
      EXPECT_EQ(read(send, x.size()), x);
    }
}

TEST_F(OneRankNccl, ACollectiveReadsWhatItsStreamOrderedBeforeItAndNothingElse) {
  const size_t count = 1031;
  const bytes old_values = values(ncclFloat32, count), new_values = values(ncclFloat32, count);
  unsigned char* d = upload(old_values);
  unsigned char* out = device(count * 4);
  cudaStream_t writer = stream(), comm_stream = stream();
  auto write = [d, new_values] { std::memcpy(d, new_values.data(), new_values.size()); };

  mt::sim::enqueue(writer, "test write", write);
  ASSERT_EQ(ncclAllReduce(d, out, count, ncclFloat32, ncclSum, comm_, comm_stream), ncclSuccess) << last_error();
  EXPECT_EQ(read(out, count * 4), old_values) << "no event ordered the write before it: it reads the old values";

  ASSERT_EQ(cudaMemcpy(d, old_values.data(), old_values.size(), cudaMemcpyHostToDevice), cudaSuccess);
  mt::sim::enqueue(comm_stream, "test write", write);
  ASSERT_EQ(ncclAllGather(d, out, count, ncclFloat32, comm_, comm_stream), ncclSuccess) << last_error();
  EXPECT_EQ(read(out, count * 4), new_values) << "the write queued before it on its stream";

  ASSERT_EQ(cudaMemcpy(d, old_values.data(), old_values.size(), cudaMemcpyHostToDevice), cudaSuccess);
  mt::sim::enqueue(writer, "test write", write);
  cudaEvent_t written = event();
  ASSERT_EQ(cudaEventRecord(written, writer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(comm_stream, written, 0), cudaSuccess);
  ASSERT_EQ(ncclBroadcast(d, out, count, ncclFloat32, 0, comm_, comm_stream), ncclSuccess) << last_error();
  EXPECT_EQ(read(out, count * 4), new_values) << "the write an event ordered before it";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(OneRankNccl, SendsToItselfMeetReceivesInAGroupInIssueOrder) {
  const size_t count = 301;
  const bytes a = values(ncclInt32, count), b = values(ncclInt32, count);
  unsigned char *x = upload(a), *y = upload(b);
  unsigned char *first = device(count * 4), *second = device(count * 4);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  // A receive issued before its send: NCCL matches the k-th send with the k-th receive, whatever the
  // order of the two kinds within the group.
  ASSERT_EQ(ncclRecv(first, count, ncclInt32, 0, comm_, nullptr), ncclSuccess) << last_error();
  ASSERT_EQ(ncclSend(x, count, ncclInt32, 0, comm_, nullptr), ncclSuccess) << last_error();
  ASSERT_EQ(ncclSend(y, count, ncclInt32, 0, comm_, nullptr), ncclSuccess) << last_error();
  ASSERT_EQ(ncclRecv(second, count, ncclInt32, 0, comm_, nullptr), ncclSuccess) << last_error();
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << last_error();
  EXPECT_EQ(read(first, count * 4), a);
  EXPECT_EQ(read(second, count * 4), b);
}

TEST_F(OneRankNccl, ASendToItselfOutsideAGroupFailsAtOnceNamingTheMessage) {
  abort_ = true;
  setenv("MT_SIM_NCCL_TIMEOUT", "30", 1);
  unsigned char* d = device(64);
  const auto start = Clock::now();
  EXPECT_EQ(ncclSend(d, 4, ncclFloat32, 0, comm_, nullptr), ncclInvalidUsage);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "no other rank can receive it: no wait";
  EXPECT_TRUE(has(last_error(), "ncclSend count=4 float32 to rank 0 on comm#")) << last_error();
  EXPECT_TRUE(has(last_error(), "(1 rank, rank 0)")) << last_error();
  EXPECT_TRUE(has(last_error(), "message #1: rank 0 (world rank 0) has not received it, and never will"))
      << last_error();
  ncclResult_t async = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
  EXPECT_EQ(async, ncclInvalidUsage);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure) << "the failed work is the device's sticky error";
}

TEST_F(OneRankNccl, AReceiveOfTheWrongSizeFromItselfFailsNamingBothSizes) {
  abort_ = true;
  unsigned char* d = device(400);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(d, 100, ncclFloat32, 0, comm_, nullptr), ncclSuccess);
  ASSERT_EQ(ncclRecv(d, 50, ncclFloat32, 0, comm_, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_TRUE(has(last_error(), "rank 0 (world rank 0) sent 400 bytes, rank 0 posted a receive of 200 bytes"))
      << last_error();
}

TEST_F(OneRankNccl, SplitGivesACommunicatorOfOneRankOrNoneForNoColor) {
  ncclComm_t sub = nullptr;
  ASSERT_EQ(ncclCommSplit(comm_, 3, 7, &sub, nullptr), ncclSuccess) << last_error();
  ASSERT_NE(sub, nullptr);
  ASSERT_NE(sub, comm_);
  int rank = -1, count = -1;
  ASSERT_EQ(ncclCommUserRank(sub, &rank), ncclSuccess);
  ASSERT_EQ(ncclCommCount(sub, &count), ncclSuccess);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(count, 1);
  const bytes x = values(ncclBfloat16, 7);
  unsigned char* d = upload(x);
  ASSERT_EQ(ncclAllReduce(d, d, 7, ncclBfloat16, ncclAvg, sub, nullptr), ncclSuccess) << last_error();
  EXPECT_EQ(read(d, x.size()), x);
  EXPECT_EQ(ncclCommFinalize(sub), ncclSuccess) << last_error();
  EXPECT_EQ(ncclCommDestroy(sub), ncclSuccess) << last_error();

  ncclComm_t none = comm_;  // overwritten
  ASSERT_EQ(ncclCommSplit(comm_, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr), ncclSuccess) << last_error();
  EXPECT_EQ(none, nullptr);
  ASSERT_EQ(ncclAllReduce(d, d, 7, ncclBfloat16, ncclSum, comm_, nullptr), ncclSuccess) << "the parent still works";
}

TEST_F(OneRankNccl, AHostBufferFailsNamingTheCallAndTheArgument) {
  std::vector<float> host(16);
  unsigned char* d = device(64);
  EXPECT_EQ(ncclAllReduce(host.data(), d, 16, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "ncclAllReduce: sendbuff")) << last_error();
  EXPECT_TRUE(has(last_error(), "pageable host memory")) << last_error();
  EXPECT_EQ(ncclRecv(host.data(), 16, ncclFloat32, 0, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "ncclRecv: recvbuff")) << last_error();
  EXPECT_EQ(ncclSend(d, 8, ncclFloat32, 1, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "peer 1 is not a rank of comm#")) << last_error();
  // A failed check runs nothing: the communicator and the device still work.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm_, nullptr), ncclSuccess) << last_error();
}

TEST_F(OneRankNccl, UseAfterDestroyFailsNamingTheCommunicator) {
  unsigned char* d = device(64);
  ASSERT_EQ(ncclCommDestroy(comm_), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(has(last_error(), "(1 rank, rank 0) was destroyed")) << last_error();
  comm_ = nullptr;
}

TEST_F(OneRankNccl, TwoRanksWithoutMpiFailNamingMpi) {
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c = reinterpret_cast<ncclComm_t>(&id);  // overwritten
  EXPECT_EQ(ncclCommInitRank(&c, 2, id, 0), ncclInvalidUsage);
  EXPECT_EQ(c, nullptr);
  EXPECT_TRUE(has(last_error(), "ncclCommInitRank (rank 0 of 2")) << last_error();
  EXPECT_TRUE(has(last_error(), "MPI is not initialised")) << last_error();
}

}  // namespace

#else
TEST(OneRankNccl, NeedsTheStandIn) { GTEST_SKIP() << "built without MPI, so without the simulated NCCL"; }
#endif
