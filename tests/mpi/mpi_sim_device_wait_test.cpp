// The host's waits on the device inside a training step, on the simulated device (two ranks):
//   - they wait on the stream that produced what they read, never on the whole device: a step of dp2,
//     tp2 and pp2 makes no cudaDeviceSynchronize, nor a cudaFree that synchronises implicitly (the sim
//     counts them, sim/sim.h device_synchronizations);
//   - they poll under dist.timeout: a collective whose peers never arrive (the NCCL stand-in holds it
//     on the device, sim/nccl_hold.h, as a GPU sees a hung peer: the call returns, its kernel waits)
//     leaves the compute stream waiting behind it, and the host's next wait on that stream ends after
//     the deadline with the hung error (exit status 4), where a blocking wait would hang for ever (the
//     sim fails it at once instead).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/exit_status.h"
#include "sim/nccl_hold.h"
#include "sim/sim.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

namespace nccl = mt::sim::nccl;

config::TrainOptions options(const std::string& data, std::vector<std::string> args) {
  return tiny_on_device(data, std::move(args), 3);
}

TEST(DeviceWaits, StepsOfEveryLayoutWaitOnStreamsNotTheDevice) {
  parallel::Comm& world = mpi_world().comm();
  const std::string data = two_gpu_corpus(world);
  if (data.empty()) GTEST_SKIP() << "needs 2 ranks with a (simulated) GPU each";
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.dp=2", "parallel.zero=1"},
      {"parallel.tp=2", "parallel.dp=1"},
      {"parallel.pp=2", "parallel.dp=1", "grad_accum=2"},
  };
  for (const auto& layout : layouts) {  // each layout's first step (the second runs the same waits)
    SCOPED_TRACE(layout[0]);
    train::Trainer t(options(data, layout), &world, world.rank());
    const uint64_t before = sim::device_synchronizations();
    t.step();
    EXPECT_EQ(sim::device_synchronizations(), before) << "a step synchronised the whole device";
  }
}

// Last in this program: the held collective's communicators are aborted on the way out.
TEST(DeviceWaits, HostWaitBehindAHungCollectiveEndsAtTheDeadline) {
  parallel::Comm& world = mpi_world().comm();
  const std::string data = two_gpu_corpus(world);
  if (data.empty()) GTEST_SKIP() << "needs 2 ranks with a (simulated) GPU each";
  const std::string out = std::filesystem::path(data).parent_path().string() + "/device_wait";
  train::Trainer t(options(data, {"parallel.dp=2", "dist.timeout=1", "out_dir=" + out}), &world, world.rank());
  const uint64_t start = nccl::launches();
  t.step();
  const uint64_t per_step = nccl::launches() - start;
  ASSERT_GT(per_step, 0u) << "a dp2 step on the device launches its gradient reduction over NCCL";
  // The same launch on both ranks: the last of step 2 (the gradients' reduction), which the optimizer's
  // kernels and the host's next wait on the compute stream sit behind.
  nccl::hold_launch(nccl::launches() + per_step);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t.step();
    ADD_FAILURE() << "step 2 returned although its reduction never completed";
  } catch (const parallel::PeerTimeoutError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("hung: ", 0), 0u) << what;
    EXPECT_NE(what.find("dist.timeout=1"), std::string::npos) << what;
    EXPECT_EQ(e.exit_status(), kExitHung);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not the deadline's error: " << e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 1.0);
  EXPECT_LT(waited, 30.0);
  nccl::hold_launch(0);
  // The flight record names the host's wait, timed out, on the communicator whose policy it ran under.
  std::ifstream records(out + "/flight_recorder.rank" + std::to_string(world.rank()) + ".jsonl");
  std::string line, last;
  while (std::getline(records, line))
    if (line.find("\"group\":\"dp.nccl\"") != std::string::npos) last = line;
  EXPECT_NE(last.find("\"op\":\"device sync\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"state\":\"timed_out\""), std::string::npos) << last;
}

}  // namespace
}  // namespace mt::testing
