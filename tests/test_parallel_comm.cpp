// The backend-independent Comm contract, checked on the one-rank backend (no MPI needed): chunking,
// the byte-counter formulas, argument checks, handles. Multi-rank behaviour is in tests/mpi/.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "parallel/self_comm.h"
#include "tests/test_util.h"

namespace mt::parallel {
namespace {

TEST(Comm, ChunksPartitionTheCountWithTheLongerChunksFirst) {
  std::mt19937_64 rng(testing::test_seed());
  for (int trial = 0; trial < 50; trial++) {
    int n = int(rng() % 16) + 1;
    size_t count = rng() % 100;
    size_t next = 0;
    for (int i = 0; i < n; i++) {
      EXPECT_EQ(chunk_offset(count, n, i), next);
      size_t c = chunk_size(count, n, i);
      EXPECT_TRUE(c == count / size_t(n) || c == count / size_t(n) + 1);
      if (i > 0) {
        EXPECT_LE(c, chunk_size(count, n, i - 1));
      }
      next += c;
    }
    EXPECT_EQ(next, count);
  }
}

// Ring all-reduce sends 2(N-1)/N of the buffer per rank (Patarasuk & Yuan 2009): exactly when N
// divides the count, and 2(N-1) x bytes summed over ranks always.
TEST(Comm, AllReduceSentBytesFollowTheRingFormula) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  for (int trial = 0; trial < 50; trial++) {
    int n = int(rng() % 16) + 1;
    size_t elem = (rng() % 2) ? 4 : 2;
    size_t count = rng() % 1000;
    uint64_t total = 0;
    for (int r = 0; r < n; r++) total += all_reduce_sent_bytes(count, elem, n, r);
    EXPECT_EQ(total, uint64_t(2) * uint64_t(n - 1) * count * elem);
    size_t divisible = count / size_t(n) * size_t(n);
    for (int r = 0; r < n; r++)
      EXPECT_EQ(all_reduce_sent_bytes(divisible, elem, n, r), uint64_t(2) * uint64_t(n - 1) * divisible * elem / uint64_t(n));
  }
}

TEST(Comm, BroadcastSentBytesAreOneCopyPerRankButTheRingsLast) {
  for (int n = 1; n <= 6; n++)
    for (int root = 0; root < n; root++) {
      uint64_t total = 0;
      for (int r = 0; r < n; r++) total += broadcast_sent_bytes(10, 4, n, r, root);
      EXPECT_EQ(total, uint64_t(n - 1) * 40);
      EXPECT_EQ(broadcast_sent_bytes(10, 4, n, root, root), n > 1 ? 40u : 0u);
      EXPECT_EQ(broadcast_sent_bytes(10, 4, n, (root + n - 1) % n, root), 0u);
    }
}

TEST(SelfComm, CollectivesAreIdentitiesOrCopies) {
  std::mt19937_64 rng(testing::test_seed() + 2);
  SelfComm c("solo");
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> x = testing::random_floats(37, rng), x0 = x, y(37);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) c.all_reduce(x.data(), x.size(), DType::f32, op);
  EXPECT_EQ(x, x0);
  c.reduce_scatter(x.data(), y.data(), y.size(), DType::f32, ReduceOp::sum);
  EXPECT_EQ(y, x0);
  std::fill(y.begin(), y.end(), 0.f);
  c.all_gather(x.data(), y.data(), y.size(), DType::f32);
  EXPECT_EQ(y, x0);
  std::fill(y.begin(), y.end(), 0.f);
  size_t counts[1] = {37};
  c.all_to_all_v(x.data(), counts, y.data(), counts, DType::f32);
  EXPECT_EQ(y, x0);
  c.broadcast(x.data(), x.size(), DType::f32, 0);
  EXPECT_EQ(x, x0);
  std::fill(y.begin(), y.end(), 0.f);
  c.send_recv(x.data(), x.size(), 0, y.data(), y.size(), 0, DType::f32);
  EXPECT_EQ(y, x0);
  c.barrier();
  auto split = c.split(3, 0, "sub");
  EXPECT_EQ(split->size(), 1);
  EXPECT_EQ(split->name(), "sub");
}

TEST(SelfComm, CountersRecordPayloadAndNothingSent) {
  SelfComm c;
  std::vector<uint16_t> buf(100);
  c.all_reduce(buf.data(), 100, DType::bf16, ReduceOp::sum);
  c.all_reduce(buf.data(), 50, DType::bf16, ReduceOp::avg);
  c.all_gather(buf.data(), buf.data(), 10, DType::u16);
  const CommCounters& k = c.counters();
  EXPECT_EQ(k[CommOp::all_reduce].calls, 2u);
  EXPECT_EQ(k[CommOp::all_reduce].payload_bytes, 300u);
  EXPECT_EQ(k[CommOp::all_gather].payload_bytes, 20u);
  EXPECT_EQ(k.total_sent_bytes(), 0u);
  EXPECT_EQ(k.total_payload_bytes(), 320u);
  c.reset_counters();
  EXPECT_EQ(c.counters().total_payload_bytes(), 0u);
}

TEST(SelfComm, AsyncHandlesCompleteAtOnce) {
  SelfComm c;
  float x[4] = {1, 2, 3, 4};
  CommHandle h = c.all_reduce_async(x, 4, DType::f32, ReduceOp::sum);
  EXPECT_TRUE(h.done());
  EXPECT_TRUE(h.test());
  h.wait();
}

TEST(SelfComm, MisuseFailsWithAMessageNamingTheCommunicator) {
  SelfComm c("tp");
  uint16_t u[4] = {};
  int32_t i[4] = {};
  float f[4] = {};
  EXPECT_THROW(c.all_reduce(u, 4, DType::u16, ReduceOp::sum), Error);
  EXPECT_THROW(c.all_reduce(i, 4, DType::i32, ReduceOp::avg), Error);
  EXPECT_THROW(c.broadcast(f, 4, DType::f32, 1), Error);
  EXPECT_THROW(c.send(f, 4, DType::f32, 0), Error);  // a lone send to itself could never complete
  EXPECT_THROW(c.send(f, 4, DType::f32, 0, -1), Error);
  size_t two[2] = {1, 1};
  EXPECT_THROW(c.all_to_all_v(f, two, f, two, DType::f32), Error);
  try {
    c.recv(f, 4, DType::f32, 2);
    FAIL() << "recv from rank 2 of 1 succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'tp'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::parallel
