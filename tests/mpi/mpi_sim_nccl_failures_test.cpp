// The simulated NCCL under mpirun: the failures it names (host buffers, datatypes and ops not simulated,
// a bad timeout, communicators used after destroy or abort, collectives that differ across ranks, sends,
// receives and collectives nobody matches, receives of the wrong size) and NCCL's own error strings.
// Linked into mpi_sim_nccl_test with mpi_sim_nccl_test.cpp.
#include "tests/mpi/sim_nccl_fixture.h"

namespace {

using namespace mt::testing::sim_nccl;


TEST_F(SimNccl, AHostBufferFailsNamingTheCallAndTheArgument) {
  std::vector<float> host(16);
  uint8_t* d = device(64);
  EXPECT_EQ(ncclAllReduce(host.data(), d, 16, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "ncclAllReduce: sendbuff")) << last_error();
  EXPECT_TRUE(has(last_error(), "pageable host memory")) << last_error();
  EXPECT_EQ(ncclAllGather(d, d, 16, ncclFloat32, comm_, nullptr), ncclInvalidArgument) << "recvbuff is too short";
  EXPECT_TRUE(has(last_error(), "ncclAllGather: recvbuff")) << last_error();
  // A failed check runs nothing: the communicator and the device still work.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm_, nullptr), ncclSuccess) << last_error();
  // Inside a group, the call fails at once and so does the group: none of its calls runs.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm_, nullptr), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(host.data(), d, 16, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "so none of the 1 that passed them ran")) << last_error();
  EXPECT_EQ(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm_, nullptr), ncclSuccess) << last_error();
}

TEST_F(SimNccl, DatatypesAndOpsNotSimulatedFailNamingThemselves) {
  uint8_t* d = device(64);
  EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat64, ncclSum, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "datatype ncclFloat64")) << last_error();
  EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclProd, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "op ncclProd")) << last_error();
  EXPECT_EQ(ncclReduceScatter(d, d, 1, ncclInt32, ncclMin, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "op ncclMin")) << last_error();
  EXPECT_EQ(ncclBroadcast(d, d, 8, ncclUint8, size_, comm_, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "root " + std::to_string(size_) + " is not a rank")) << last_error();
}

TEST_F(SimNccl, ABadTimeoutFailsNamingTheVariable) {
  uint8_t* d = device(64);
  for (const char* bad : {"soon", "0", "-1", "5s", ""}) {
    setenv("MT_SIM_NCCL_TIMEOUT", bad, 1);
    EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidArgument) << bad;
    EXPECT_TRUE(has(last_error(), "MT_SIM_NCCL_TIMEOUT='" + std::string(bad) + "'")) << last_error();
  }
  setenv("MT_SIM_NCCL_TIMEOUT", "2.5", 1);
  EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm_, nullptr), ncclSuccess) << last_error();
}

TEST_F(SimNccl, UseAfterDestroyOrAbortFailsNamingTheCommunicator) {
  uint8_t* d = device(64);
  ASSERT_EQ(ncclCommDestroy(comm_), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidUsage);
  char want[64];
  std::snprintf(want, sizeof want, "(%d ranks, rank %d) was destroyed", size_, rank_);
  EXPECT_TRUE(has(last_error(), want)) << last_error();
  EXPECT_EQ(ncclCommDestroy(comm_), ncclInvalidUsage) << "destroyed twice";
  ncclComm_t other = make_comm();
  ASSERT_EQ(ncclCommAbort(other), ncclSuccess);
  EXPECT_EQ(ncclSend(d, 8, ncclFloat32, 0, other, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(has(last_error(), "was aborted")) << last_error();
  comm_ = nullptr;
}

TEST_F(SimNccl, CollectivesWithDifferentCountsFailOnEveryRankNamingBoth) {
  expect_failure("20");
  uint8_t* d = device(4096);
  const size_t count = rank_ == 0 ? 1024 : 512;
  const auto start = Clock::now();
  EXPECT_EQ(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidUsage);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "found by the agreement, not by a timeout";
  const std::string want = size_ == 2 ? "ncclAllReduce count=1024 float32 sum on rank 0, ncclAllReduce count=512 "
                                        "float32 sum on rank 1"
                                      : "ncclAllReduce count=1024 float32 sum on rank 0, ncclAllReduce count=512 "
                                        "float32 sum on ranks 1, ";
  EXPECT_TRUE(has(last_error(), want)) << last_error();
  EXPECT_TRUE(has(last_error(), "collective #1 differs across ranks")) << last_error();
  ncclResult_t async = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
  EXPECT_EQ(async, ncclInvalidUsage);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure) << "the failed work is the device's sticky error";
}

TEST_F(SimNccl, AnAllReduceAgainstAnAllGatherFailsOnEveryRankNamingBoth) {
  expect_failure("20");
  uint8_t* d = device(size_t(size_) * 4096);
  if (rank_ == 0) EXPECT_EQ(ncclAllReduce(d, d, 1024, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidUsage);
  else EXPECT_EQ(ncclAllGather(d, d + size_t(rank_) * 2048, 512, ncclFloat32, comm_, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(has(last_error(), "ncclAllReduce count=1024 float32 sum on rank 0, ncclAllGather count=512 float32 on "
                                "rank"))
      << last_error();
}

TEST_F(SimNccl, ACollectiveARankSkipsTimesOutNamingThatRank) {
  expect_failure("1");
  uint8_t* d = device(64);
  const int absent = size_ - 1;
  if (rank_ != absent) {
    const auto start = Clock::now();
    EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm_, nullptr), ncclSystemError);
    EXPECT_GE(Clock::now() - start, std::chrono::seconds(1));
    const std::string who = "rank " + std::to_string(absent) + " (world rank " + std::to_string(absent) + ")";
    EXPECT_TRUE(has(last_error(), "timed out after 1 s at collective #1: " + who + " has not called it"))
        << last_error();
    EXPECT_TRUE(has(last_error(), "rank " + std::to_string(rank_) + ")")) << "names this rank: " << last_error();
    ncclResult_t async = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSystemError);
    EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm_, nullptr), ncclSystemError)
        << "a failed communicator refuses further calls";
    EXPECT_TRUE(has(last_error(), "failed earlier")) << last_error();
  }
}

TEST_F(SimNccl, ASendWithoutAReceiveTimesOutNamingThePeer) {
  expect_failure("1");
  uint8_t* d = device(64);
  if (rank_ == 0) {
    EXPECT_EQ(ncclSend(d, 4, ncclFloat32, 1, comm_, nullptr), ncclSystemError) << "NCCL's sends complete only when "
                                                                                  "received, however small";
    EXPECT_TRUE(has(last_error(), "ncclSend count=4 float32 to rank 1 on comm#")) << last_error();
    EXPECT_TRUE(has(last_error(), "timed out after 1 s: message #1")) << last_error();
    EXPECT_TRUE(has(last_error(), "rank 1 (world rank 1) has not received it")) << last_error();
  }
}

TEST_F(SimNccl, ATimeoutInAGroupNamesEveryMessageStillInFlight) {
  expect_failure("1");
  uint8_t* d = device(64);
  if (rank_ == 0) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(d, 4, ncclInt32, 1, comm_, nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(d + 16, 4, ncclInt32, 1, comm_, nullptr), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSystemError);
    EXPECT_TRUE(has(last_error(), "ncclGroupEnd (2 calls): timed out after 1 s: message #1 (ncclSend count=4 int32 to "
                                  "rank 1 on comm#"))
        << last_error();
    EXPECT_TRUE(has(last_error(), "rank 1 (world rank 1) has not received it; message #2 (ncclRecv count=4 int32 "
                                  "from rank 1 on comm#"))
        << last_error();
    EXPECT_TRUE(has(last_error(), "nothing has arrived from rank 1 (world rank 1)")) << last_error();
  }
}

TEST_F(SimNccl, ASplitAgainstAnAllReduceFailsOnEveryRankNamingBoth) {
  expect_failure("20");
  uint8_t* d = device(64);
  ncclComm_t sub = nullptr;
  if (rank_ == 0) {
    EXPECT_EQ(ncclCommSplit(comm_, 0, 0, &sub, nullptr), ncclInvalidUsage);
    EXPECT_EQ(sub, nullptr);
  } else {
    EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm_, nullptr), ncclInvalidUsage);
  }
  EXPECT_TRUE(has(last_error(), "collective #1 differs across ranks: ncclCommSplit on rank 0, ncclAllReduce count=8 "
                                "float32 sum on rank"))
      << last_error();
}

TEST_F(SimNccl, AReceiveWithoutASendTimesOutNamingThePeer) {
  expect_failure("1");
  uint8_t* d = device(64);
  if (rank_ == 1) {
    EXPECT_EQ(ncclRecv(d, 4, ncclFloat32, 0, comm_, nullptr), ncclSystemError);
    EXPECT_TRUE(has(last_error(), "nothing has arrived from rank 0 (world rank 0)")) << last_error();
  }
}

TEST_F(SimNccl, AReceiveOfTheWrongSizeFailsNamingBothCounts) {
  expect_failure("20");
  uint8_t* d = device(400);
  if (rank_ == 0) {
    EXPECT_EQ(ncclSend(d, 100, ncclFloat32, 1, comm_, nullptr), ncclSuccess) << "the message was received";
  } else if (rank_ == 1) {
    EXPECT_EQ(ncclRecv(d, 50, ncclFloat32, 0, comm_, nullptr), ncclInvalidUsage);
    EXPECT_TRUE(has(last_error(), "rank 0 (world rank 0) sent 400 bytes, rank 1 posted a receive of 200 bytes"))
        << last_error();
  }
}

TEST_F(SimNccl, ErrorStringsAreNcclsOwn) {
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_STREQ(ncclGetErrorString(ncclSystemError), "unhandled system error (run with NCCL_DEBUG=INFO for details)");
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)");
  EXPECT_STREQ(ncclGetErrorString(ncclResult_t(99)), "unknown result code");
}

}  // namespace
