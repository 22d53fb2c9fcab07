// Expert parallelism's token exchange on its own (moe/ep_exchange.h): rows reach their experts' ranks
// expert by expert and come back unchanged, for a random routing, one that keeps every row at home
// and one that sends everything to rank 0; the counters count the all-to-alls' bytes.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "moe/ep_exchange.h"
#include "tests/mpi/mpi_test_util.h"

namespace mt::testing {
namespace {

// The exchange of one routing (token t's experts at expert[t K ...]) of this rank's N tokens.
void check_exchange(const std::vector<int32_t>& expert, int N, int K, int E) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size(), C = 3;
  // The plan, and rows that say where they come from: (source rank, row, expert).
  const moe::DispatchPlan p = moe::plan_dispatch(expert.data(), N, K, E, -1);
  std::vector<float> rows(size_t(p.rows()) * C);
  for (int64_t r = 0; r < p.rows(); r++) {
    rows[size_t(r) * C] = float(world.rank());
    rows[size_t(r) * C + 1] = float(r);
    rows[size_t(r) * C + 2] = float(expert[size_t(p.assignment_of[size_t(r)])]);
  }
  world.reset_counters();
  const moe::ExpertExchange x = moe::exchange_counts(p, world);
  ASSERT_EQ(x.local, 2);
  std::vector<float> mine(size_t(x.rows()) * C), staging(mine.size());
  moe::to_experts(mine.data(), rows.data(), x, C, world, staging.data(), host_memory());
  // Expert by expert; within an expert by source rank, each source's rows in their plan order.
  for (int e = 0; e < x.local; e++) {
    float last_src = -1, last_row = -1;
    for (int64_t r = x.experts.offset[size_t(e)]; r < x.experts.offset[size_t(e) + 1]; r++) {
      const float* v = &mine[size_t(r) * C];
      EXPECT_EQ(v[2], float(world.rank() * x.local + e)) << "row " << r << " is not for local expert " << e;
      EXPECT_TRUE(v[0] > last_src || (v[0] == last_src && v[1] > last_row)) << "row " << r << " out of order";
      last_src = v[0];
      last_row = v[1];
    }
  }
  // Every rank's rows for this rank's experts arrived: the totals match the other ranks' plans.
  int64_t want = 0;
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int e = 0; e < E; e++) all[size_t(e)] = int32_t(p.rows_of(e));
  world.all_reduce(all.data(), all.size(), DType::i32, parallel::ReduceOp::sum);
  for (int e = 0; e < x.local; e++) want += all[size_t(world.rank() * x.local + e)];
  EXPECT_EQ(x.rows(), want);
  std::vector<float> back(rows.size(), -1.f);
  moe::from_experts(back.data(), mine.data(), x, C, world, staging.data(), host_memory());
  EXPECT_EQ(back, rows);
  // Counts (E/W i32 per rank pair), then the rows out and back: what this rank sent to others.
  uint64_t out = 0, in = 0;
  for (int j = 0; j < W; j++)
    if (j != world.rank()) {
      out += x.send_rows[size_t(j)];
      in += x.recv_rows[size_t(j)];
    }
  const parallel::CommOpCount& a = world.counters()[parallel::CommOp::all_to_all];
  EXPECT_EQ(a.calls, 3u);
  EXPECT_EQ(a.sent_bytes, uint64_t(W - 1) * x.local * 4 + (out + in) * C * 4);
}

TEST(ExpertExchange, RowsReachTheirExpertsInOrderAndComeBackUnchanged) {
  const int W = mpi_world().size(), r = mpi_world().rank(), E = 2 * W, K = 2, N = 7 + r;
  // A random routing (distinct experts per token, a different number of tokens per rank).
  std::mt19937 rng(uint32_t(17 + r));
  std::vector<int32_t> expert(size_t(N) * K);
  for (int t = 0; t < N; t++) {
    expert[size_t(t) * K] = int32_t(rng() % uint32_t(E));
    expert[size_t(t) * K + 1] = int32_t((expert[size_t(t) * K] + 1 + rng() % uint32_t(E - 1)) % E);
  }
  check_exchange(expert, N, K, E);
  // Every token to this rank's own two experts: nothing crosses the wire, empty blocks everywhere.
  for (int t = 0; t < N; t++) {
    expert[size_t(t) * K] = int32_t(2 * r);
    expert[size_t(t) * K + 1] = int32_t(2 * r + 1);
  }
  check_exchange(expert, N, K, E);
  // Every token to rank 0's experts: rank 0 receives everything, the others nothing.
  for (int t = 0; t < N; t++) {
    expert[size_t(t) * K] = 0;
    expert[size_t(t) * K + 1] = 1;
  }
  check_exchange(expert, N, K, E);
}

}  // namespace
}  // namespace mt::testing
