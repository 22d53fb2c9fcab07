// NCCL's connections made before step 1, on the simulated device: NCCL connects a communicator's
// collectives and each point-to-point peer on first use, with buffers outside the memory pool, so a
// connection first made inside a step (after the pool holds the activation peak) can find the device
// full. The trainer warms every device communicator at start-up (parallel/mesh.h warm_device_comms);
// the NCCL stand-in records the connections NCCL would make (sim/nccl_connections.h). After the
// trainer is built, every connection the steps use exists already, and they are the ones the
// planner counts (plan/memory.h plan_nccl_bytes): running a step makes none.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/memory.h"
#include "sim/nccl_connections.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

namespace nccl = mt::sim::nccl;

std::string str(const nccl::Connections& c) {
  return strfmt("%d rings, %d peers, %llu bytes", c.rings, c.peers, (unsigned long long)c.bytes);
}

void expect_warm(const config::TrainOptions& o, parallel::Comm& world, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(nccl::connections(), nccl::Connections{}) << "a communicator of an earlier trainer is still live";
  train::Trainer t(o, &world, world.rank());
  const nccl::Connections built = nccl::connections();
  // The planner's figure for this rank's stage, from the same connections.
  const int pp_rank = t.mesh().coord(parallel::MeshDim::pp);
  const plan::NcclConnections want = plan::plan_nccl_connections(o, t.mesh().layout(), pp_rank);
  EXPECT_EQ(built.rings, want.rings) << str(built);
  EXPECT_EQ(built.peers, want.peers) << str(built);
  EXPECT_EQ(built.bytes, plan::plan_nccl_bytes(o, t.mesh().layout(), pp_rank));
  EXPECT_GT(built.bytes, 0u);
  t.step();  // step 1 runs every exchange of a step (no eval, no save here): the lazy ones among them
  EXPECT_EQ(nccl::connections(), built) << "step 1 connected more: " << str(nccl::connections()) << " after "
                                        << str(built) << " at start-up";
}

config::TrainOptions options(const std::string& data, std::vector<std::string> args) {
  return tiny_on_device(data, std::move(args), 2);
}

// pp 2: the stages' exchanges and the tied embedding's between the first and the last stage.
TEST(NcclWarmUp, PipelineStagesConnectAtStartUp) {
  parallel::Comm& world = mpi_world().comm();
  const std::string data = two_gpu_corpus(world);
  if (data.empty()) GTEST_SKIP() << "needs 2 ranks with a (simulated) GPU each";
  expect_warm(options(data, {"model=tiny", "parallel.pp=2", "parallel.dp=1", "grad_accum=2"}), world, "pp 2");
}

// dp 2 with ep 2: dp's all-reduce (ZeRO-1: reduce-scatter and all-gather too), ep's all-to-all.
TEST(NcclWarmUp, DataAndExpertParallelConnectAtStartUp) {
  parallel::Comm& world = mpi_world().comm();
  const std::string data = two_gpu_corpus(world);
  if (data.empty()) GTEST_SKIP() << "needs 2 ranks with a (simulated) GPU each";
  expect_warm(options(data, {"model=tiny-moe", "moe.every=1", "parallel.dp=2", "parallel.ep=2", "parallel.zero=1"}),
              world, "dp 2 ep 2 zero 1");
}

}  // namespace
}  // namespace mt::testing
