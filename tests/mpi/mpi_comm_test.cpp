// MpiComm under mpirun (np 2, 3, 4): every collective and dtype against a serial reference computed
// on every rank from the same inputs. Reductions are compared bitwise (tolerance 0): the fixed rank
// order, fp32 accumulation and single rounding are the contract (parallel/mpi_comm.h), and the
// reference is written independently of parallel/host_reduce.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "parallel/mpi_comm.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace mt::parallel {
namespace {

using Bytes = std::vector<uint8_t>;
using testing::mpi_world;
using testing::same_on_all_ranks;

constexpr DType kReducible[] = {DType::f32, DType::bf16, DType::f16, DType::i32};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

Bytes random_values(DType t, size_t count, std::mt19937_64& rng) {
  Bytes out(count * dtype_size(t));
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (size_t i = 0; i < count; i++) {
    uint8_t* p = out.data() + i * dtype_size(t);
    if (t == DType::f32) {
      float v = u(rng);
      std::memcpy(p, &v, 4);
    } else if (t == DType::bf16 || t == DType::f16) {
      uint16_t v = t == DType::bf16 ? f32_to_bf16(u(rng)) : f32_to_f16(u(rng));
      std::memcpy(p, &v, 2);
    } else if (t == DType::i32) {
      int32_t v = int32_t(uint32_t(rng()));
      std::memcpy(p, &v, 4);
    } else {
      uint16_t v = uint16_t(rng());
      std::memcpy(p, &v, 2);
    }
  }
  return out;
}

float load(const Bytes& b, size_t i, DType t) {
  if (t == DType::f32) {
    float v;
    std::memcpy(&v, b.data() + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

void store(Bytes& b, size_t i, float v, DType t) {
  if (t == DType::f32) {
    std::memcpy(b.data() + 4 * i, &v, 4);
  } else {
    uint16_t h = t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
}

// The serial reference: element i = op over ranks 0, 1, ..., N-1 in that order, in fp32 (i32 for
// i32, wrapping), avg = fp32 sum / N, rounded to the dtype once.
Bytes serial_reduce(const std::vector<Bytes>& in, size_t count, DType t, ReduceOp op) {
  Bytes out(count * dtype_size(t));
  for (size_t i = 0; i < count; i++) {
    if (t == DType::i32) {
      int32_t acc;
      std::memcpy(&acc, in[0].data() + 4 * i, 4);
      for (size_t r = 1; r < in.size(); r++) {
        int32_t v;
        std::memcpy(&v, in[r].data() + 4 * i, 4);
        acc = op == ReduceOp::max ? std::max(acc, v) : int32_t(uint32_t(acc) + uint32_t(v));
      }
      std::memcpy(out.data() + 4 * i, &acc, 4);
      continue;
    }
    float acc = load(in[0], i, t);
    for (size_t r = 1; r < in.size(); r++) {
      float v = load(in[r], i, t);
      acc = op == ReduceOp::max ? std::max(acc, v) : acc + v;
    }
    if (op == ReduceOp::avg) acc /= float(in.size());
    store(out, i, acc, t);
  }
  return out;
}

Bytes slice(const Bytes& b, size_t from, size_t count, DType t) {
  size_t e = dtype_size(t);
  return Bytes(b.begin() + long(from * e), b.begin() + long((from + count) * e));
}

std::vector<Bytes> inputs_of_all_ranks(int n, DType t, size_t count, std::mt19937_64& rng) {
  std::vector<Bytes> in;
  for (int r = 0; r < n; r++) in.push_back(random_values(t, count, rng));
  return in;
}

std::string first_mismatch(const Bytes& got, const Bytes& want) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != want[i]) return "first differing byte " + std::to_string(i);
  return "equal";
}

std::string what(DType t, ReduceOp op, size_t count) {
  return std::string(dtype_name(t)) + " " + reduce_op_name(op) + " count " + std::to_string(count) + " rank " +
         std::to_string(mpi_world().rank());
}

TEST(MpiComm, AllReduceEqualsTheSerialRankOrderReductionOnEveryRank) {
  Comm& c = mpi_world().comm();
  std::mt19937_64 rng(testing::shared_seed());
  for (DType t : kReducible) {
    for (ReduceOp op : kOps) {
      if (t == DType::i32 && op == ReduceOp::avg) continue;
      for (size_t count : {size_t(1), size_t(c.size() + 1), size_t(1000 + rng() % 500)}) {
        std::vector<Bytes> in = inputs_of_all_ranks(c.size(), t, count, rng);
        Bytes buf = in[size_t(c.rank())];
        c.all_reduce(buf.data(), count, t, op);
        Bytes want = serial_reduce(in, count, t, op);
        EXPECT_TRUE(buf == want) << what(t, op, count) << ": " << first_mismatch(buf, want);
        EXPECT_TRUE(same_on_all_ranks(c, buf.data(), buf.size())) << what(t, op, count);
      }
    }
  }
}

TEST(MpiComm, ReduceScatterGivesEachRankItsReducedBlockAlsoInPlace) {
  Comm& c = mpi_world().comm();
  const size_t n = size_t(c.size()), r = size_t(c.rank());
  std::mt19937_64 rng(testing::shared_seed() + 1);
  for (DType t : kReducible) {
    for (ReduceOp op : kOps) {
      if (t == DType::i32 && op == ReduceOp::avg) continue;
      for (size_t rc : {size_t(1), size_t(333)}) {
        std::vector<Bytes> in = inputs_of_all_ranks(c.size(), t, n * rc, rng);
        Bytes want = slice(serial_reduce(in, n * rc, t, op), r * rc, rc, t);
        Bytes out(rc * dtype_size(t));
        c.reduce_scatter(in[r].data(), out.data(), rc, t, op);
        EXPECT_TRUE(out == want) << what(t, op, rc) << ": " << first_mismatch(out, want);
        Bytes inplace = in[r];
        uint8_t* mine = inplace.data() + r * rc * dtype_size(t);
        c.reduce_scatter(inplace.data(), mine, rc, t, op);
        EXPECT_TRUE(slice(inplace, r * rc, rc, t) == want) << "in place, " << what(t, op, rc);
      }
    }
  }
}

TEST(MpiComm, AllGatherConcatenatesInRankOrderAlsoInPlace) {
  Comm& c = mpi_world().comm();
  const size_t n = size_t(c.size()), r = size_t(c.rank());
  std::mt19937_64 rng(testing::shared_seed() + 2);
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::u16}) {
    size_t count = 1 + rng() % 100;
    std::vector<Bytes> in = inputs_of_all_ranks(c.size(), t, count, rng);
    Bytes want;
    for (const Bytes& b : in) want.insert(want.end(), b.begin(), b.end());
    Bytes out(n * count * dtype_size(t));
    c.all_gather(in[r].data(), out.data(), count, t);
    EXPECT_TRUE(out == want) << dtype_name(t) << ": " << first_mismatch(out, want);
    Bytes inplace(out.size());
    std::memcpy(inplace.data() + r * count * dtype_size(t), in[r].data(), in[r].size());
    c.all_gather(inplace.data() + r * count * dtype_size(t), inplace.data(), count, t);
    EXPECT_TRUE(inplace == want) << "in place, " << dtype_name(t);
  }
}

TEST(MpiComm, BroadcastCopiesTheRootsBufferFromEveryRoot) {
  Comm& c = mpi_world().comm();
  std::mt19937_64 rng(testing::shared_seed() + 3);
  for (int root = 0; root < c.size(); root++) {
    std::vector<Bytes> in = inputs_of_all_ranks(c.size(), DType::bf16, 77, rng);
    Bytes buf = in[size_t(c.rank())];
    c.broadcast(buf.data(), 77, DType::bf16, root);
    EXPECT_TRUE(buf == in[size_t(root)]) << "root " << root;
  }
}

TEST(MpiComm, AllToAllVMovesUnevenAndEmptyBlocks) {
  Comm& c = mpi_world().comm();
  const int n = c.size(), r = c.rank();
  std::mt19937_64 rng(testing::shared_seed() + 4);
  for (DType t : {DType::f32, DType::bf16, DType::i32}) {
    // counts[i][j]: elements rank i sends to rank j (0 to 5, zeros included); data[i][j] those elements.
    std::vector<std::vector<size_t>> counts(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n)));
    std::vector<std::vector<Bytes>> data(static_cast<size_t>(n), std::vector<Bytes>(static_cast<size_t>(n)));
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        counts[size_t(i)][size_t(j)] = rng() % 6;
        data[size_t(i)][size_t(j)] = random_values(t, counts[size_t(i)][size_t(j)], rng);
      }
    Bytes send, want;
    std::vector<size_t> recv_counts;
    for (int j = 0; j < n; j++) {
      const Bytes& s = data[size_t(r)][size_t(j)];
      send.insert(send.end(), s.begin(), s.end());
      const Bytes& w = data[size_t(j)][size_t(r)];
      want.insert(want.end(), w.begin(), w.end());
      recv_counts.push_back(counts[size_t(j)][size_t(r)]);
    }
    Bytes recv(want.size());
    c.all_to_all_v(send.data(), counts[size_t(r)], recv.data(), recv_counts, t);
    EXPECT_TRUE(recv == want) << dtype_name(t) << " rank " << r << ": " << first_mismatch(recv, want);
  }
}

TEST(MpiComm, SendRecvAroundARingAndTaggedMessagesMatchByTag) {
  Comm& c = mpi_world().comm();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  // Rank k sends 3 + k values k * 100 + i to its successor.
  auto msg = [](int k) {
    std::vector<int32_t> v(size_t(3 + k));
    std::iota(v.begin(), v.end(), k * 100);
    return v;
  };
  std::vector<int32_t> mine = msg(r), got(size_t(3 + prev));
  c.send_recv(mine.data(), mine.size(), next, got.data(), got.size(), prev, DType::i32, 7);
  EXPECT_EQ(got, msg(prev));

  if (r == 0) {
    float a[2] = {1.f, 2.f}, b[3] = {3.f, 4.f, 5.f};
    CommHandle ha = c.send_async(a, 2, DType::f32, 1, 5);
    CommHandle hb = c.send_async(b, 3, DType::f32, 1, 6);
    hb.wait();
    ha.wait();
  } else if (r == 1) {
    float a[2] = {}, b[3] = {};
    c.recv(b, 3, DType::f32, 0, 6);  // the later message first: matched by its tag
    c.recv(a, 2, DType::f32, 0, 5);
    EXPECT_EQ(a[1], 2.f);
    EXPECT_EQ(b[2], 5.f);
  }
}

// Ops completed in a different order on every rank: the phase-2 FIFO must keep MPI's collective
// order identical across ranks, or this deadlocks (ctest's timeout) or mixes up buffers.
TEST(MpiComm, AsyncOpsMayBeCompletedInAnyOrderOnEachRank) {
  Comm& c = mpi_world().comm();
  const size_t n = size_t(c.size()), r = size_t(c.rank());
  std::mt19937_64 rng(testing::shared_seed() + 5);
  for (int round = 0; round < 3; round++) {
    size_t ca = 100 + rng() % 900, cb = 1 + rng() % 50, cc = 1 + rng() % 2000, cd = 1 + rng() % 40;
    std::vector<Bytes> ia = inputs_of_all_ranks(int(n), DType::f32, ca, rng);
    std::vector<Bytes> ib = inputs_of_all_ranks(int(n), DType::bf16, n * cb, rng);
    std::vector<Bytes> ic = inputs_of_all_ranks(int(n), DType::f16, cc, rng);
    std::vector<Bytes> id = inputs_of_all_ranks(int(n), DType::i32, cd, rng);
    Bytes a = ia[r], b(cb * 2), cbuf = ic[r], d(n * cd * 4), e = ia[r];
    std::vector<CommHandle> h;
    h.push_back(c.all_reduce_async(a.data(), ca, DType::f32, ReduceOp::sum));
    h.push_back(c.reduce_scatter_async(ib[r].data(), b.data(), cb, DType::bf16, ReduceOp::avg));
    h.push_back(c.all_reduce_async(cbuf.data(), cc, DType::f16, ReduceOp::max));
    h.push_back(c.all_gather_async(id[r].data(), d.data(), cd, DType::i32));
    h.push_back(c.all_reduce_async(e.data(), ca, DType::f32, ReduceOp::avg));
    switch ((r + size_t(round)) % 3) {
      case 0:
        for (size_t k = h.size(); k-- > 0;) h[k].wait();
        break;
      case 1: {
        bool all = false;
        while (!all) {
          all = true;
          for (size_t k = h.size(); k-- > 0;) all = h[k].test() && all;
        }
        break;
      }
      default:
        h[2].wait();
        h[4].wait();
        for (auto& x : h) x.wait();
    }
    Bytes gathered;
    for (const Bytes& x : id) gathered.insert(gathered.end(), x.begin(), x.end());
    EXPECT_TRUE(a == serial_reduce(ia, ca, DType::f32, ReduceOp::sum)) << "round " << round;
    EXPECT_TRUE(b == slice(serial_reduce(ib, n * cb, DType::bf16, ReduceOp::avg), r * cb, cb, DType::bf16));
    EXPECT_TRUE(cbuf == serial_reduce(ic, cc, DType::f16, ReduceOp::max)) << "round " << round;
    EXPECT_TRUE(d == gathered) << "round " << round;
    EXPECT_TRUE(e == serial_reduce(ia, ca, DType::f32, ReduceOp::avg)) << "round " << round;
  }
}

// Compute runs while the reduction is in flight, polling test() between pieces (the host MPI
// progress model); both the compute and the reduction come out as if run alone.
TEST(MpiComm, AsyncAllReduceOverlapsWithCompute) {
  Comm& c = mpi_world().comm();
  std::mt19937_64 rng(testing::shared_seed() + 6);
  const size_t count = size_t(1) << 18;
  std::vector<Bytes> in = inputs_of_all_ranks(c.size(), DType::f32, count, rng);
  Bytes buf = in[size_t(c.rank())];
  auto compute = [](std::vector<float>& x, size_t piece) {
    for (size_t i = piece * 4096; i < (piece + 1) * 4096; i++) x[i] = std::sin(x[i]) * 0.5f + 0.25f * x[i];
  };
  std::vector<float> work(64 * 4096, 0.5f), alone = work;
  for (size_t p = 0; p < 64; p++) compute(alone, p);

  CommHandle h = c.all_reduce_async(buf.data(), count, DType::f32, ReduceOp::sum);
  size_t pieces_while_in_flight = 0;
  for (size_t p = 0; p < 64; p++) {
    compute(work, p);
    if (!h.done() && !h.test()) pieces_while_in_flight++;
  }
  h.wait();
  EXPECT_TRUE(work == alone);
  EXPECT_TRUE(buf == serial_reduce(in, count, DType::f32, ReduceOp::sum));
  if (c.rank() == 0) std::printf("compute pieces run while the all-reduce was in flight: %zu of 64\n", pieces_while_in_flight);
}

TEST(MpiComm, ByteCountersEqualTheDocumentedFormulas) {
  std::unique_ptr<Comm> sub = mpi_world().comm().split(0, mpi_world().rank(), "counted");
  Comm& c = *sub;
  const uint64_t n = uint64_t(c.size()), r = uint64_t(c.rank());
  std::vector<uint8_t> buf(1 << 16);
  std::vector<uint8_t> out(1 << 16);

  c.all_reduce(buf.data(), 12 * n, DType::f32, ReduceOp::sum);       // N | count: 2(N-1)/N x bytes
  c.all_reduce(buf.data(), 12 * n + 1, DType::bf16, ReduceOp::sum);  // rank 0's chunk is 13, others 12
  uint64_t own = r == 0 ? 13 : 12;
  EXPECT_EQ(c.counters()[CommOp::all_reduce].calls, 2u);
  EXPECT_EQ(c.counters()[CommOp::all_reduce].payload_bytes, 12 * n * 4 + (12 * n + 1) * 2);
  EXPECT_EQ(c.counters()[CommOp::all_reduce].sent_bytes, 2 * (n - 1) * 12 * 4 + (12 * n + 1 - own + (n - 1) * own) * 2);

  c.reduce_scatter(buf.data(), out.data(), 5, DType::f16, ReduceOp::sum);
  EXPECT_EQ(c.counters()[CommOp::reduce_scatter].payload_bytes, n * 5 * 2);
  EXPECT_EQ(c.counters()[CommOp::reduce_scatter].sent_bytes, (n - 1) * 5 * 2);

  c.all_gather(buf.data(), out.data(), 7, DType::i32);
  EXPECT_EQ(c.counters()[CommOp::all_gather].payload_bytes, n * 7 * 4);
  EXPECT_EQ(c.counters()[CommOp::all_gather].sent_bytes, (n - 1) * 7 * 4);

  // Rank r sends r + 1 elements to every rank, so it receives j + 1 from rank j.
  std::vector<size_t> send_counts(n, r + 1), recv_counts(n);
  std::iota(recv_counts.begin(), recv_counts.end(), size_t(1));
  c.all_to_all_v(buf.data(), send_counts, out.data(), recv_counts, DType::f32);
  EXPECT_EQ(c.counters()[CommOp::all_to_all].payload_bytes, n * (r + 1) * 4);
  EXPECT_EQ(c.counters()[CommOp::all_to_all].sent_bytes, (n - 1) * (r + 1) * 4);

  c.broadcast(buf.data(), 10, DType::f32, int(n - 1));
  EXPECT_EQ(c.counters()[CommOp::broadcast].sent_bytes, r == n - 2 || n == 1 ? 0u : 40u);  // ring from n-1: n-2 is last

  c.send_recv(buf.data(), 3, int((r + 1) % n), out.data(), 3, int((r + n - 1) % n), DType::f32);
  EXPECT_EQ(c.counters()[CommOp::send].sent_bytes, 12u);
  EXPECT_EQ(c.counters()[CommOp::recv].payload_bytes, 12u);
  EXPECT_EQ(c.counters()[CommOp::recv].sent_bytes, 0u);

  c.barrier();
  EXPECT_EQ(c.counters()[CommOp::barrier].calls, 1u);

  // Summed over ranks, the all-reduce of a divisible count sends 2(N-1) x its bytes.
  int32_t sent = int32_t(all_reduce_sent_bytes(12 * n, 4, int(n), int(r)));
  c.all_reduce(&sent, 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(uint64_t(sent), 2 * (n - 1) * 12 * n * 4);
}

TEST(MpiComm, SplitGroupsByColorOrdersByKeyAndCountsSeparately) {
  Comm& world = mpi_world().comm();
  const int r = world.rank(), n = world.size();
  uint64_t world_calls = world.counters()[CommOp::all_gather].calls;
  std::unique_ptr<Comm> sub = world.split(r % 2, -r, "parity");
  std::vector<int> expect;  // same parity, in decreasing world rank (key = -rank)
  for (int k = n - 1; k >= 0; k--)
    if (k % 2 == r % 2) expect.push_back(k);
  std::vector<int32_t> got(size_t(sub->size()));
  int32_t me = r;
  sub->all_gather(&me, got.data(), 1, DType::i32);
  EXPECT_EQ(std::vector<int>(got.begin(), got.end()), expect);
  EXPECT_EQ(sub->counters()[CommOp::all_gather].calls, 1u);
  EXPECT_EQ(world.counters()[CommOp::all_gather].calls, world_calls);
}

// Why reductions do not rely on MPI_Allreduce: measured here, not assumed. Open MPI's default
// all-reduce does give every rank the same bits for a fixed world size.
TEST(MpiComm, OpenMpiNativeAllreduceGivesTheSameBitsOnEveryRank) {
  Comm& c = mpi_world().comm();
  std::mt19937_64 rng(testing::shared_seed() + 7 + uint64_t(c.rank()));
  for (size_t count : {1, 7, 1000, 10007, 100003}) {
    std::vector<float> x = testing::random_floats(count, rng, -1.f, 1.f), y(count);
    MT_MPI_CHECK(MPI_Allreduce(x.data(), y.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    EXPECT_TRUE(same_on_all_ranks(c, y.data(), y.size() * 4)) << "count " << count;
  }
}

TEST(MpiComm, ScratchBlocksAreReusedAcrossStepsAndBounded) {
  std::unique_ptr<Comm> sub = mpi_world().comm().split(0, mpi_world().rank(), "scratch");
  auto* mpi = dynamic_cast<MpiComm*>(sub.get());
  ASSERT_NE(mpi, nullptr);
  const bool multi = sub->size() > 1;
  std::vector<float> x(4096, 1.f), y(4096, 1.f);
  sub->all_reduce(x.data(), x.size(), DType::f32, ReduceOp::sum);
  const size_t one = mpi->scratch_bytes();
  EXPECT_EQ(one > 0, multi);
  for (int step = 0; step < 3; step++) sub->all_reduce(x.data(), x.size(), DType::f32, ReduceOp::sum);
  EXPECT_EQ(mpi->scratch_bytes(), one) << "the same size again reuses the kept block";
  CommHandle a = sub->all_reduce_async(x.data(), x.size(), DType::f32, ReduceOp::sum);
  CommHandle b = sub->all_reduce_async(y.data(), y.size(), DType::f32, ReduceOp::sum);
  EXPECT_EQ(mpi->scratch_bytes(), 2 * one) << "two ops in flight need two blocks";
  a.wait();
  b.wait();
  for (int k = 0; k < 8; k++) {  // more concurrent ops than blocks kept
    std::vector<CommHandle> h;
    for (int i = 0; i < 6; i++) h.push_back(sub->all_reduce_async(x.data(), 64, DType::f32, ReduceOp::max));
  }
  EXPECT_LE(mpi->scratch_bytes(), MpiComm::kSpareScratch * one);
  mpi->trim_scratch();
  EXPECT_EQ(mpi->scratch_bytes(), 0u);
  float n = float(sub->size());
  EXPECT_EQ(x[4095], n * n * n * n * n);
  EXPECT_EQ(y[0], n);
}

// MT_MPI_CHECK turns an MPI error code into an exception naming MPI's reason, the statement and
// the place (an invalid peer: a local error that leaves the communicator usable).
TEST(MpiComm, MpiErrorsBecomeExceptionsNamingReasonStatementAndLine) {
  auto* mpi = dynamic_cast<MpiComm*>(&mpi_world().comm());
  ASSERT_NE(mpi, nullptr);
  float x = 0;
  try {
    MT_MPI_CHECK(MPI_Send(&x, 1, MPI_FLOAT, 1 << 20, 0, mpi->handle()));
    ADD_FAILURE() << "a send to rank 2^20 succeeded";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("MPI error"), std::string::npos) << m;
    EXPECT_NE(m.find("rank"), std::string::npos) << m;
    EXPECT_NE(m.find("`MPI_Send(&x, 1, MPI_FLOAT, 1 << 20, 0, mpi->handle())`"), std::string::npos) << m;
    EXPECT_NE(m.find("mpi_comm_test.cpp:"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace mt::parallel
