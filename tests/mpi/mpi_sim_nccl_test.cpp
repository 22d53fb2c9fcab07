// The simulated NCCL (sim/nccl*.cpp, over MPI, on the simulated device) under mpirun (np 2, 3, 4).
// Every collective, datatype and op against a reference computed on the host from every rank's
// inputs (each rank regenerates them from the shared seed), compared bitwise, and bitwise identical
// on every rank; 16-bit sums rounded after every step; sends and receives in groups and in order; the
// stream order the calls obey; and the failures the stand-in names: host buffers, collectives that
// differ across ranks, sends and collectives nobody matches (bounded by MT_SIM_NCCL_TIMEOUT), receives
// of the wrong size, communicators used after they are destroyed, datatypes and ops not simulated; and
// communicators of one rank inside the job, which meet no one.
// Each test makes its own communicator and aborts it when the test made it fail; the device is reset
// around each test (a failure inside device work is sticky).
// The tests of what it refuses are in mpi_sim_nccl_failures_test.cpp (the same binary).
#include "tests/mpi/sim_nccl_fixture.h"

namespace {

using namespace mt::testing::sim_nccl;

// --- communicators ---

TEST_F(SimNccl, InitGivesEveryRankItsRankAndTheSize) {
  int r = -1, n = -1;
  ASSERT_EQ(ncclCommUserRank(comm_, &r), ncclSuccess);
  ASSERT_EQ(ncclCommCount(comm_, &n), ncclSuccess);
  EXPECT_EQ(r, rank_);
  EXPECT_EQ(n, size_);
  ncclResult_t async = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
}

TEST_F(SimNccl, SplitGroupsByColorOrdersByKeyAndNoColorGetsNoCommunicator) {
  // Colors: even and odd world ranks; keys reverse the order within each.
  ncclComm_t sub = nullptr;
  ASSERT_EQ(ncclCommSplit(comm_, rank_ % 2, -rank_, &sub, nullptr), ncclSuccess) << last_error();
  ASSERT_NE(sub, nullptr);
  std::vector<int> mine;
  for (int r = rank_ % 2; r < size_; r += 2) mine.push_back(r);
  int r = -1, n = -1;
  ASSERT_EQ(ncclCommUserRank(sub, &r), ncclSuccess);
  ASSERT_EQ(ncclCommCount(sub, &n), ncclSuccess);
  EXPECT_EQ(n, int(mine.size()));
  EXPECT_EQ(r, int(mine.end() - std::find(mine.begin(), mine.end(), rank_)) - 1) << "the largest key is rank 0";
  // It communicates among its own members: the sum of their world ranks.
  int32_t* d = reinterpret_cast<int32_t*>(upload(Bytes(4)));
  const int32_t v = rank_;
  ASSERT_EQ(cudaMemcpy(d, &v, 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, sub, nullptr), ncclSuccess) << last_error();
  int32_t got = -1, want = 0;
  for (int m : mine) want += m;
  ASSERT_EQ(cudaMemcpy(&got, d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, want);
  EXPECT_EQ(ncclCommFinalize(sub), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(sub), ncclSuccess);

  // World rank 0 stays out (NCCL_SPLIT_NOCOLOR): it gets no communicator, the rest one without it.
  ncclComm_t rest = reinterpret_cast<ncclComm_t>(&got);  // overwritten either way
  const ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ASSERT_EQ(ncclCommSplit(comm_, rank_ == 0 ? NCCL_SPLIT_NOCOLOR : 0, rank_, &rest, const_cast<ncclConfig_t*>(&config)),
            ncclSuccess)
      << last_error();
  if (rank_ == 0) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_NE(rest, nullptr);
    ASSERT_EQ(ncclCommUserRank(rest, &r), ncclSuccess);
    ASSERT_EQ(ncclCommCount(rest, &n), ncclSuccess);
    EXPECT_EQ(r, rank_ - 1);
    EXPECT_EQ(n, size_ - 1);
    EXPECT_EQ(ncclCommDestroy(rest), ncclSuccess);
  }
}

TEST_F(SimNccl, InitWithARankMissingTimesOutNamingIt) {
  expect_failure("1");
  const int absent = size_ - 1;
  ncclUniqueId id{};
  if (rank_ == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  mpi_world().comm().broadcast(&id, sizeof id / 4, mt::DType::i32, 0);
  if (rank_ == absent) return;
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(&c, size_, id, rank_), ncclSystemError);
  EXPECT_EQ(c, nullptr);
  const std::string why = "timed out after 1 s with " + std::to_string(size_ - 1) + " of " + std::to_string(size_) +
                          " ranks joined: rank " + std::to_string(absent) + " has not called ncclCommInitRank";
  EXPECT_TRUE(has(last_error(), why)) << last_error();
  if (rank_ != 0) {
    EXPECT_TRUE(has(last_error(), "the root (world rank 0) refused")) << last_error();
  }
}

TEST_F(SimNccl, InitWithTwoProcessesAsOneRankFailsNamingBoth) {
  expect_failure("1");
  const int twin = size_ - 1;  // joins as rank 0, as world rank 0 does
  ncclUniqueId id{};
  if (rank_ == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  mpi_world().comm().broadcast(&id, sizeof id / 4, mt::DType::i32, 0);
  ncclComm_t c = nullptr;
  EXPECT_NE(ncclCommInitRank(&c, size_, id, rank_ == twin ? 0 : rank_), ncclSuccess);
  EXPECT_EQ(c, nullptr);
  const std::string why = "world ranks 0 and " + std::to_string(twin) + " both join as rank 0";
  if (rank_ == 0) {
    EXPECT_TRUE(has(last_error(), why)) << last_error();
  }
  if (rank_ == twin) {
    EXPECT_TRUE(has(last_error(), "the root (world rank 0) refused: " + why)) << last_error();
  }
}

// A communicator of one rank (here every rank's own, from its own id) meets no one: no bootstrap, its
// collectives copies, its sends to itself received in the same group; tests/test_sim_nccl_one_rank.cpp
// has the rest, without MPI.
TEST_F(SimNccl, EveryRankMakesACommunicatorOfItsOwnFromItsOwnId) {
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << last_error();
  ncclComm_t alone = nullptr;
  ASSERT_EQ(ncclCommInitRank(&alone, 1, id, 0), ncclSuccess) << last_error();
  int r = -1, n = -1;
  ASSERT_EQ(ncclCommUserRank(alone, &r), ncclSuccess);
  ASSERT_EQ(ncclCommCount(alone, &n), ncclSuccess);
  EXPECT_EQ(r, 0);
  EXPECT_EQ(n, 1);
  const size_t count = 1031;
  const Bytes mine = inputs(rank_, ncclBfloat16, count, 1);
  uint8_t* d = upload(mine);
  uint8_t* out = device(count * 2);
  ASSERT_EQ(ncclAllReduce(d, d, count, ncclBfloat16, ncclAvg, alone, nullptr), ncclSuccess) << last_error();
  EXPECT_EQ(download(d, count * 2), mine);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(d, count, ncclBfloat16, 0, alone, nullptr), ncclSuccess) << last_error();
  ASSERT_EQ(ncclRecv(out, count, ncclBfloat16, 0, alone, nullptr), ncclSuccess) << last_error();
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << last_error();
  EXPECT_EQ(download(out, count * 2), mine);
  // Ungrouped, a send to itself has no receive to meet: it fails at once, naming this process.
  EXPECT_EQ(ncclSend(d, count, ncclBfloat16, 0, alone, nullptr), ncclInvalidUsage);
  EXPECT_TRUE(has(last_error(), "rank 0 (world rank " + std::to_string(rank_) + ") has not received it, and never "
                                "will"))
      << last_error();
  EXPECT_EQ(ncclCommAbort(alone), ncclSuccess);
}

TEST_F(SimNccl, SplitAcceptsOnlyTheDefaultConfigAndNamesTheField) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t sub = nullptr;
  EXPECT_EQ(ncclCommSplit(comm_, 0, rank_, &sub, &config), ncclInvalidArgument);
  EXPECT_TRUE(has(last_error(), "config->blocking = 0")) << last_error();
  EXPECT_EQ(sub, nullptr);
}

// --- collectives against the reference ---

TEST_F(SimNccl, AllReduceOfEveryTypeAndOpIsTheRankOrderReductionOnEveryRank) {
  uint64_t k = 0;
  for (ncclDataType_t t : kTypes)
    for (ncclRedOp_t op : kOps)
      for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(std::string(name_of(t)) + " " + name_of(op) + " count " + std::to_string(count) +
                       (in_place ? " in place" : ""));
          const std::vector<Bytes> all = all_inputs(t, count, ++k);
          const size_t b = count * size_of(t);
          uint8_t* send = upload(all[size_t(rank_)]);
          uint8_t* recv = in_place ? send : device(b);
          ASSERT_EQ(ncclAllReduce(send, recv, count, t, op, comm_, nullptr), ncclSuccess) << last_error();
          const Bytes got = download(recv, b);
          EXPECT_EQ(got, reference(all, count, t, op));
          EXPECT_TRUE(same_on_all_ranks(mpi_world().comm(), got.data(), got.size()));
        }
}

TEST_F(SimNccl, ReduceScatterGivesRankRTheReductionOfChunkR) {
  uint64_t k = 0;
  for (ncclDataType_t t : kTypes)
    for (ncclRedOp_t op : kOps)
      for (size_t count : kCounts)
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(std::string(name_of(t)) + " " + name_of(op) + " recvcount " + std::to_string(count) +
                       (in_place ? " in place" : ""));
          const size_t b = count * size_of(t);
          std::vector<Bytes> chunks;  // every rank's chunk rank_
          const std::vector<Bytes> all = all_inputs(t, count * size_t(size_), ++k);
          for (const Bytes& x : all) chunks.push_back(slice(x, size_t(rank_) * b, b));
          uint8_t* send = upload(all[size_t(rank_)]);
          uint8_t* recv = in_place ? send + size_t(rank_) * b : device(b);
          ASSERT_EQ(ncclReduceScatter(send, recv, count, t, op, comm_, nullptr), ncclSuccess) << last_error();
          EXPECT_EQ(download(recv, b), reference(chunks, count, t, op));
        }
}

TEST_F(SimNccl, AllGatherConcatenatesEveryRanksDataByRank) {
  uint64_t k = 0;
  for (ncclDataType_t t : kTypes)
    for (size_t count : kCounts)
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(name_of(t)) + " sendcount " + std::to_string(count) + (in_place ? " in place" : ""));
        const size_t b = count * size_of(t);
        const std::vector<Bytes> all = all_inputs(t, count, ++k);
        Bytes want;
        for (const Bytes& x : all) want.insert(want.end(), x.begin(), x.end());
        uint8_t* recv = device(size_t(size_) * b);
        uint8_t* send = in_place ? recv + size_t(rank_) * b : device(b);
        ASSERT_EQ(cudaMemcpy(send, all[size_t(rank_)].data(), b, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(ncclAllGather(send, recv, count, t, comm_, nullptr), ncclSuccess) << last_error();
        EXPECT_EQ(download(recv, size_t(size_) * b), want);
      }
}

TEST_F(SimNccl, BroadcastCopiesTheRootsDataToEveryRank) {
  uint64_t k = 0;
  for (int root = 0; root < size_; root++)
    for (ncclDataType_t t : kTypes)
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(name_of(t)) + " root " + std::to_string(root) + (in_place ? " in place" : ""));
        const size_t count = kCounts[size_t(root) % 3], b = count * size_of(t);
        const std::vector<Bytes> all = all_inputs(t, count, ++k);
        uint8_t* send = upload(all[size_t(rank_)]);
        uint8_t* recv = in_place ? send : device(b);
        ASSERT_EQ(ncclBroadcast(send, recv, count, t, root, comm_, nullptr), ncclSuccess) << last_error();
        EXPECT_EQ(download(recv, b), all[size_t(root)]);
      }
}

// A bf16/f16 sum rounds after every addition, as NCCL's ring does: rank 0 holds 1 and every other rank
// half an ulp of 1, so every step is a tie that rounds back to 1 (to even); one rounding of the exact
// sum would give more than 1 from three ranks on.
TEST_F(SimNccl, SixteenBitSumsRoundToTheElementTypeAfterEveryStep) {
  for (ncclDataType_t t : {ncclBfloat16, ncclFloat16}) {
    SCOPED_TRACE(name_of(t));
    const float half_ulp = t == ncclBfloat16 ? std::ldexp(1.f, -8) : std::ldexp(1.f, -11);
    const float v = rank_ == 0 ? 1.f : half_ulp;
    const uint16_t h = t == ncclBfloat16 ? mt::f32_to_bf16(v) : mt::f32_to_f16(v);
    const Bytes mine{uint8_t(h & 0xff), uint8_t(h >> 8)};
    uint8_t* d = upload(mine);
    uint8_t* avg = upload(mine);
    ASSERT_EQ(ncclAllReduce(d, d, 1, t, ncclSum, comm_, nullptr), ncclSuccess) << last_error();
    ASSERT_EQ(ncclAllReduce(avg, avg, 1, t, ncclAvg, comm_, nullptr), ncclSuccess) << last_error();
    EXPECT_EQ(load(download(d, 2), 0, t), 1.f);
    EXPECT_EQ(load(download(avg, 2), 0, t), round_to(1.f / float(size_), t));
    if (size_ >= 3) {
      EXPECT_NE(round_to(1.f + float(size_ - 1) * half_ulp, t), 1.f) << "the test could not fail";
    }
  }
}

TEST_F(SimNccl, CollectivesInsideAGroupRunInIssueOrder) {
  // Two all-reduces of one buffer: the second sums the first's result.
  int32_t* d = reinterpret_cast<int32_t*>(device(4));
  uint8_t* gathered = device(size_t(size_) * 4);
  const int32_t v = rank_ + 1;
  ASSERT_EQ(cudaMemcpy(d, &v, 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);  // nested: only the outermost end runs
  ASSERT_EQ(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm_, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm_, nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllGather(d, gathered, 1, ncclInt32, comm_, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << last_error();
  const int32_t once = size_ * (size_ + 1) / 2;
  std::vector<int32_t> got(static_cast<size_t>(size_));
  ASSERT_EQ(cudaMemcpy(got.data(), gathered, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int32_t x : got) EXPECT_EQ(x, once * size_);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage) << "an end without a start";
}

TEST_F(SimNccl, AGroupOnTwoStreamsSeesTheWorkQueuedBeforeItOnBoth) {
  const size_t count = 7;
  const Bytes a = inputs(rank_, ncclFloat32, count, 1), b = inputs(rank_, ncclFloat32, count, 2);
  uint8_t *da = device(count * 4), *db = device(count * 4);
  cudaStream_t sa = stream(), sb = stream();
  mt::sim::enqueue(sa, "test write a", [da, a] { std::memcpy(da, a.data(), a.size()); });
  mt::sim::enqueue(sb, "test write b", [db, b] { std::memcpy(db, b.data(), b.size()); });
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(da, da, count, ncclFloat32, ncclMax, comm_, sa), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(db, db, count, ncclFloat32, ncclMax, comm_, sb), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << last_error();
  EXPECT_EQ(download(da, count * 4), reference(all_inputs(ncclFloat32, count, 1), count, ncclFloat32, ncclMax));
  EXPECT_EQ(download(db, count * 4), reference(all_inputs(ncclFloat32, count, 2), count, ncclFloat32, ncclMax));
}

// --- sends and receives ---

TEST_F(SimNccl, ARingOfSendsAndReceivesInAGroupDoesNotDeadlock) {
  const size_t count = 25013;  // 100 KB: past MPI's eager limit, so an ungrouped ring would hang
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  const Bytes mine = inputs(rank_, ncclFloat32, count, 1);
  uint8_t* send = upload(mine);
  uint8_t* recv = device(count * 4);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(send, count, ncclFloat32, next, comm_, nullptr), ncclSuccess);
  ASSERT_EQ(ncclRecv(recv, count, ncclFloat32, prev, comm_, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << last_error();
  EXPECT_EQ(download(recv, count * 4), inputs(prev, ncclFloat32, count, 1));
}

TEST_F(SimNccl, TwoMessagesToOnePeerMatchInIssueOrder) {
  const size_t count = 301;
  for (bool grouped : {true, false}) {
    SCOPED_TRACE(grouped ? "grouped" : "one call at a time");
    const Bytes a = inputs(0, ncclInt32, count, grouped ? 1 : 3), b = inputs(0, ncclInt32, count, grouped ? 2 : 4);
    if (grouped) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    }
    if (rank_ == 0) {
      uint8_t *x = upload(a), *y = upload(b);
      ASSERT_EQ(ncclSend(x, count, ncclInt32, 1, comm_, nullptr), ncclSuccess) << last_error();
      ASSERT_EQ(ncclSend(y, count, ncclInt32, 1, comm_, nullptr), ncclSuccess) << last_error();
    }
    uint8_t *first = device(count * 4), *second = device(count * 4);
    if (rank_ == 1) {
      ASSERT_EQ(ncclRecv(first, count, ncclInt32, 0, comm_, nullptr), ncclSuccess) << last_error();
      ASSERT_EQ(ncclRecv(second, count, ncclInt32, 0, comm_, nullptr), ncclSuccess) << last_error();
    }
    if (grouped) {
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << last_error();
    }
    if (rank_ == 1) {
      EXPECT_EQ(download(first, count * 4), a);
      EXPECT_EQ(download(second, count * 4), b);
    }
  }
}

// --- stream order ---

TEST_F(SimNccl, ACollectiveSeesTheWorkQueuedBeforeItOnItsStream) {
  const size_t count = 7;
  const Bytes mine = inputs(rank_, ncclFloat32, count, 1);
  uint8_t* d = upload(Bytes(count * 4, 0));
  cudaStream_t s = stream();
  mt::sim::enqueue(s, "test write", [d, mine] { std::memcpy(d, mine.data(), mine.size()); });
  ASSERT_EQ(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, comm_, s), ncclSuccess) << last_error();
  EXPECT_EQ(download(d, count * 4), reference(all_inputs(ncclFloat32, count, 1), count, ncclFloat32, ncclSum));
}

TEST_F(SimNccl, WorkOnAnotherStreamIsSeenOnlyAfterAnEvent) {
  const size_t count = 7;
  const Bytes old_values = inputs(rank_, ncclFloat32, count, 1), new_values = inputs(rank_, ncclFloat32, count, 2);
  uint8_t* d = upload(old_values);
  uint8_t* out = device(count * 4);
  cudaStream_t writer = stream(), comm_stream = stream();
  auto write = [d, new_values] { std::memcpy(d, new_values.data(), new_values.size()); };
  mt::sim::enqueue(writer, "test write", write);
  ASSERT_EQ(ncclAllReduce(d, out, count, ncclFloat32, ncclSum, comm_, comm_stream), ncclSuccess) << last_error();
  EXPECT_EQ(download(out, count * 4), reference(all_inputs(ncclFloat32, count, 1), count, ncclFloat32, ncclSum))
      << "no event ordered the write before the all-reduce: it reads the old values";

  mt::sim::enqueue(writer, "test write", write);
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaEventCreate(&written), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written, writer), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(comm_stream, written, 0), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(d, out, count, ncclFloat32, ncclSum, comm_, comm_stream), ncclSuccess) << last_error();
  EXPECT_EQ(download(out, count * 4), reference(all_inputs(ncclFloat32, count, 2), count, ncclFloat32, ncclSum));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// --- what the stand-in names ---

}  // namespace
