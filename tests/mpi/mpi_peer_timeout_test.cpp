// Waits on peers under a deadline, on MPI (np 2): rank 1 stops taking part in an op on a communicator
// of its own, and rank 0's wait ends with a PeerTimeoutError naming the group, the op and its sequence
// number, its flight record marked timed out, instead of blocking forever. Afterwards rank 1 joins the
// abandoned op, so that no request is left pending at MPI_Finalize.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "parallel/mpi_comm.h"
#include "tests/mpi/mpi_test_util.h"

namespace mt::parallel {
namespace {

using testing::mpi_world;

constexpr double kTimeout = 0.3;

// A communicator of the world's ranks with a short deadline; `timeouts` counts its on_timeout calls.
std::unique_ptr<Comm> short_fuse(const std::string& name, int* timeouts) {
  std::unique_ptr<Comm> c = mpi_world().comm().split(0, mpi_world().rank(), name);
  c->set_wait_policy({kTimeout, [timeouts] {
                        ++*timeouts;
                        return std::string("records kept");
                      }});
  return c;
}

// Runs `op` on rank 0, which must time out with a message containing `expect`; then, after the world
// meets, `join` on rank 1 completes the op rank 0 abandoned.
void expect_timeout(Comm& c, int* timeouts, const std::function<void()>& op, const std::function<void()>& join,
                    const std::string& expect) {
  Comm& world = mpi_world().comm();
  if (world.rank() == 0) {
    try {
      op();
      ADD_FAILURE() << "rank 0's wait on a peer that never came returned";
    } catch (const PeerTimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("; records kept"), std::string::npos) << e.what();
      EXPECT_EQ(e.exit_status(), kExitHung);
    }
    EXPECT_EQ(*timeouts, 1);
    const std::string jsonl = flight_records_jsonl(c);
    EXPECT_NE(jsonl.find(R"("state":"timed_out")"), std::string::npos) << jsonl;
  }
  world.barrier();
  if (world.rank() == 1) join();
  world.barrier();
}

TEST(MpiPeerTimeout, ARecvFromAPeerThatNeverSendsTimesOut) {
  ASSERT_EQ(mpi_world().size(), 2);
  int timeouts = 0;
  auto c = short_fuse("hang_p2p", &timeouts);
  static int32_t v = 7;  // static: rank 0's abandoned receive may fill it after the test returns
  expect_timeout(
      *c, &timeouts, [&] { c->recv(&v, 1, DType::i32, 1, 5); }, [&] { c->send(&v, 1, DType::i32, 0, 5); },
      "hung: recv #1 from rank 1 on group 'hang_p2p' (rank 0 of 2 there)");
}

TEST(MpiPeerTimeout, ACollectiveAPeerSkipsTimesOut) {
  int timeouts = 0;
  auto c = short_fuse("hang_coll", &timeouts);
  static float x = 1, all[2];  // static: buffers of an abandoned op stay valid
  c->broadcast(&x, 1, DType::f32, 0);  // #1: healthy
  expect_timeout(
      *c, &timeouts, [&] { c->all_gather(&x, all, 1, DType::f32); }, [&] { c->all_gather(&x, all, 1, DType::f32); },
      "hung: all_gather #2 on group 'hang_coll'");
}

TEST(MpiPeerTimeout, ASplitAPeerNeverJoinsTimesOut) {
  // MPI_Comm_split has no nonblocking form: the split waits for every rank under the deadline first.
  int timeouts = 0;
  auto c = short_fuse("hang_split", &timeouts);
  expect_timeout(
      *c, &timeouts, [&] { c->split(0, 0, "child"); }, [&] { c->barrier(); },
      "hung: split #1 on group 'hang_split'");
}

}  // namespace
}  // namespace mt::parallel
