// main() of the MPI GoogleTest programs: World first, then the tests on every rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {
namespace {

// The one World of the process, owned by main(); tests reach it through mpi_world().
parallel::World* g_world = nullptr;
uint64_t g_seed = 0;

// Prints failed assertions only, prefixed with the rank (ranks other than 0).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

parallel::World& mpi_world() { return *g_world; }
uint64_t shared_seed() { return g_seed; }

bool same_on_all_ranks(parallel::Comm& comm, const void* p, size_t bytes) {
  uint64_t h = parallel::fnv1a64(std::string(static_cast<const char*>(p), bytes));
  std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&h, all.data(), 2, DType::i32);
  for (uint64_t x : all)
    if (x != all[0]) return false;
  return true;
}

}  // namespace mt::testing

int main(int argc, char** argv) {
  mt::parallel::World world(&argc, &argv);
  mt::testing::g_world = &world;
  ::testing::InitGoogleTest(&argc, argv);

  // Rank 0's seed (fresh, or MT_TEST_SEED to replay) is every rank's seed.
  uint64_t seed = world.rank() == 0 ? mt::testing::test_seed() : 0;
  world.comm().broadcast(&seed, 2, mt::DType::i32, 0);
  mt::testing::g_seed = seed;

  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mt::testing::RankFailurePrinter(world.rank()));
  }
  return mt::parallel::run_main(world, [](mt::parallel::World& w) {
    int32_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = failed;
    w.comm().all_reduce(&any, 1, mt::DType::i32, mt::parallel::ReduceOp::max);
    if (any && !failed && w.rank() == 0) std::fprintf(stderr, "FAILED on other ranks (see their [rank N] lines)\n");
    return any;
  });
}
