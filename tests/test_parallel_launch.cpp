// Process start and end in a one-rank world (MPI singleton init, or no MPI at all), and the
// difference report of the config-consistency check. Multi-rank behaviour is in tests/mpi/.
#include <gtest/gtest.h>

#include <exception>

#include "parallel/launch.h"
#include "parallel/mesh.h"
#include "parallel/self_comm.h"

namespace mt::parallel {
namespace {

// Published FNV-1a 64 test vectors.
TEST(Launch, Fnv1a64MatchesTheReferenceVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Launch, JsonDifferencesNameTheKeyAndBothValues) {
  std::string a = R"({"model": {"n_layer": 12, "d_model": 768}, "train": {"lr": 0.001}})";
  std::string b = R"({"model": {"n_layer": 6, "d_model": 768}, "train": {"lr": 0.001}})";
  EXPECT_EQ(describe_difference(a, 0, b, 3), "/model/n_layer: 12 on rank 0, 6 on rank 3");
}

TEST(Launch, JsonDifferencesReportMissingKeysAndCapTheList) {
  std::string a = R"({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5})";
  std::string b = R"({"a": 9, "b": 9, "c": 9, "d": 9, "f": true})";
  std::string d = describe_difference(a, 0, b, 1);
  EXPECT_EQ(d, "/a: 1 on rank 0, 9 on rank 1; /b: 2 on rank 0, 9 on rank 1; /c: 3 on rank 0, 9 on rank 1; and 3 more");
  EXPECT_EQ(describe_difference(R"({"x": 1})", 0, R"({"y": "z"})", 2),
            "/x: 1 on rank 0, absent on rank 2; /y: absent on rank 0, \"z\" on rank 2");
}

TEST(Launch, NonJsonDifferencesGiveTheFirstDifferingByte) {
  std::string d = describe_difference("seed=1\nlr=0.1", 0, "seed=1\nlr=0.2", 1);
  EXPECT_EQ(d, "first difference at byte 12: \"seed=1\\nlr=0.1\" on rank 0, \"seed=1\\nlr=0.2\" on rank 1");
}

// One World per process (MPI can be initialised once), so everything that needs it is one test.
TEST(Launch, OneRankWorldRunsTheBodyAndTurnsErrorsIntoExitCodes) {
  World world(nullptr, nullptr);
  EXPECT_EQ(world.rank(), 0);
  EXPECT_EQ(world.size(), 1);
  EXPECT_EQ(world.local_rank(), 0);
  EXPECT_EQ(world.local_size(), 1);
  EXPECT_EQ(world.comm().name(), "world");

  EXPECT_EQ(run_main(world, [](World&) { return 7; }), 7);

  ::testing::internal::CaptureStderr();
  int rc = run_main(world, [](World&) -> int { fail("--lr must be positive (got %g)", -1.0); });
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(err, "minitrain: error: --lr must be positive (got -1)\n");

  check_same_across_ranks(world.comm(), R"({"a": 1})", "the resolved config");

  Mesh mesh(MeshLayout{}, world.comm());
  EXPECT_EQ(mesh.dp_comm().size(), 1);
  float x = 2.5f;
  mesh.tp_comm().all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  EXPECT_EQ(x, 2.5f);
}

// On one rank the agreed failure is that rank's own, with its text and exit status; none: no throw.
TEST(Launch, OneRankAgreesOnItsOwnFailure) {
  SelfComm self;
  EXPECT_NO_THROW(raise_agreed_failure(self, nullptr));
  try {
    raise_agreed_failure(self, std::make_exception_ptr(PeerTimeoutError("hung: rank 1 never wrote its file", 2.0)));
    ADD_FAILURE() << "a failure was agreed away";
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "hung: rank 1 never wrote its file");
    EXPECT_EQ(e.exit_status(), kExitHung);
    EXPECT_EQ(e.reporter(), 0);
  }
  try {
    raise_agreed_failure(self, std::make_exception_ptr(Error("No space left on device")));
    ADD_FAILURE() << "a failure was agreed away";
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "No space left on device");
    EXPECT_EQ(e.exit_status(), 1);
  }
}

}  // namespace
}  // namespace mt::parallel
