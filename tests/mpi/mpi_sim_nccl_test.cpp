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
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "sim/sim.h"
#include "tests/mpi/mpi_test_util.h"

namespace {

using Bytes = std::vector<uint8_t>;
using mt::testing::mpi_world;
using mt::testing::same_on_all_ranks;
using Clock = std::chrono::steady_clock;

constexpr ncclDataType_t kTypes[] = {ncclFloat32, ncclBfloat16, ncclFloat16, ncclInt32, ncclUint8};
constexpr ncclRedOp_t kOps[] = {ncclSum, ncclAvg, ncclMax};
constexpr size_t kCounts[] = {1, 7, 1031};  // odd and prime, and one above the eager limit once multiplied

size_t size_of(ncclDataType_t t) { return t == ncclFloat32 || t == ncclInt32 ? 4 : t == ncclUint8 ? 1 : 2; }

const char* name_of(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return "float32";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat16: return "float16";
    case ncclInt32: return "int32";
    default: return "uint8";
  }
}

const char* name_of(ncclRedOp_t op) { return op == ncclSum ? "sum" : op == ncclAvg ? "avg" : "max"; }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string last_error() { return ncclGetLastError(nullptr); }

// --- the reference: rank-order reductions on the host, written from the contract (sim/nccl_run.cpp's
// header), with runtime/dtype.h's conversions ---

float load(const Bytes& b, size_t i, ncclDataType_t t) {
  uint16_t h;
  float f;
  switch (t) {
    case ncclFloat32: std::memcpy(&f, b.data() + 4 * i, 4); return f;
    case ncclBfloat16: std::memcpy(&h, b.data() + 2 * i, 2); return mt::bf16_to_f32(h);
    default: std::memcpy(&h, b.data() + 2 * i, 2); return mt::f16_to_f32(h);
  }
}

void store(Bytes& b, size_t i, float v, ncclDataType_t t) {
  if (t == ncclFloat32) {
    std::memcpy(b.data() + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == ncclBfloat16 ? mt::f32_to_bf16(v) : mt::f32_to_f16(v);
  std::memcpy(b.data() + 2 * i, &h, 2);
}

float round_to(float v, ncclDataType_t t) {
  return t == ncclBfloat16 ? mt::round_bf16(v) : t == ncclFloat16 ? mt::round_f16(v) : v;
}

// The reduction of inputs[0..n) in rank order, element by element.
Bytes reference(const std::vector<Bytes>& inputs, size_t count, ncclDataType_t t, ncclRedOp_t op) {
  const int n = int(inputs.size());
  Bytes out(count * size_of(t));
  for (size_t i = 0; i < count; i++) {
    if (t == ncclInt32) {
      int32_t acc, v;
      std::memcpy(&acc, inputs[0].data() + 4 * i, 4);
      for (int r = 1; r < n; r++) {
        std::memcpy(&v, inputs[size_t(r)].data() + 4 * i, 4);
        acc = op == ncclMax ? std::max(acc, v) : int32_t(uint32_t(acc) + uint32_t(v));
      }
      if (op == ncclAvg) acc /= n;
      std::memcpy(out.data() + 4 * i, &acc, 4);
    } else if (t == ncclUint8) {
      uint8_t acc = inputs[0][i];
      for (int r = 1; r < n; r++)
        acc = op == ncclMax ? std::max(acc, inputs[size_t(r)][i]) : uint8_t(acc + inputs[size_t(r)][i]);
      if (op == ncclAvg) acc = uint8_t(acc / n);
      out[i] = acc;
    } else {
      float acc = load(inputs[0], i, t);
      for (int r = 1; r < n; r++) {
        const float v = load(inputs[size_t(r)], i, t);
        acc = op == ncclMax ? (v > acc ? v : acc) : round_to(acc + v, t);
      }
      if (op == ncclAvg) acc = round_to(acc / float(n), t);
      store(out, i, acc, t);
    }
  }
  return out;
}

Bytes slice(const Bytes& b, size_t from, size_t bytes) {
  return Bytes(b.begin() + std::ptrdiff_t(from), b.begin() + std::ptrdiff_t(from + bytes));
}

// --- the fixture ---

class SimNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
    unsetenv("MT_SIM_NCCL_TIMEOUT");
    rank_ = mpi_world().rank();
    size_ = mpi_world().size();
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
    unsetenv("MT_SIM_NCCL_TIMEOUT");
    cudaDeviceReset();
    mpi_world().comm().barrier();  // the next test starts on every rank together
  }

  // A communicator of every world rank, its id made by world rank 0.
  ncclComm_t make_comm() {
    ncclUniqueId id{};
    if (rank_ == 0) {
      EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    }
    mpi_world().comm().broadcast(&id, sizeof id / 4, mt::DType::i32, 0);
    ncclComm_t c = nullptr;
    EXPECT_EQ(ncclCommInitRank(&c, size_, id, rank_), ncclSuccess) << last_error();
    return c;
  }

  // The test makes the communicator fail: abort it at the end (its peers may have left).
  void expect_failure(const char* timeout_s) {
    abort_ = true;
    setenv("MT_SIM_NCCL_TIMEOUT", timeout_s, 1);
  }

  uint8_t* device(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return static_cast<uint8_t*>(p);
  }
  uint8_t* upload(const Bytes& h) {
    uint8_t* d = device(h.size());
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  Bytes download(const void* d, size_t n) {
    Bytes h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess) << mt::sim::last_message();
    return h;
  }
  cudaStream_t stream() {
    cudaStream_t s = nullptr;
    EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
    return s;
  }

  // Rank r's inputs for draw `k` of this test: every rank can make every rank's.
  Bytes inputs(int r, ncclDataType_t t, size_t count, uint64_t k) {
    std::mt19937_64 rng(mt::testing::shared_seed() ^ (k * 0x9e3779b97f4a7c15ull) ^ (uint64_t(r) << 48));
    std::uniform_real_distribution<float> u(-4.f, 4.f);
    Bytes b(count * size_of(t));
    for (size_t i = 0; i < count; i++) {
      if (t == ncclInt32) {
        const uint32_t v = uint32_t(rng());
        std::memcpy(b.data() + 4 * i, &v, 4);
      } else if (t == ncclUint8) {
        b[i] = uint8_t(rng());
      } else {
        store(b, i, u(rng), t);
      }
    }
    return b;
  }
  std::vector<Bytes> all_inputs(ncclDataType_t t, size_t count, uint64_t k) {
    std::vector<Bytes> all;
    for (int r = 0; r < size_; r++) all.push_back(inputs(r, t, count, k));
    return all;
  }

  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  bool abort_ = false;
};

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
