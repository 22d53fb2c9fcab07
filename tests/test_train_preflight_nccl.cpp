// The trainer's preflight compares the planner's peak with the device's capacity: on a device run with
// NCCL communicators that peak includes NCCL's connection buffers (plan/memory.h plan_nccl_bytes),
// which live outside the memory pool from start-up; a CPU run has none.
#include <gtest/gtest.h>

#include <numeric>

#include "plan/memory.h"
#include "train/preflight.h"

namespace mt::train {
namespace {

TEST(Preflight, TheDevicePeakCountsNcclsBuffers) {
  config::TrainOptions o = config::parse_train_options({"model=tiny", "batch_size=4", "parallel.pp=2"});
  o.device = Device::cuda;
  const parallel::MeshLayout l = parallel::resolve_layout({.dp = 0, .pp = 2}, 4);  // pp 2 x dp 2
  const plan::MemoryPlan worst = plan::plan_memory_worst(o, l);
  const uint64_t arena = std::accumulate(worst.bytes.begin(), worst.bytes.end(), uint64_t(0));
  // dp's ring and the one pp peer, 32 channels x 4 MiB each.
  EXPECT_EQ(worst.nccl, 2 * (uint64_t(32) << 22));
  EXPECT_EQ(planned_peak(o, 4), arena + worst.nccl);
  o.device = Device::cpu;
  EXPECT_EQ(plan::plan_memory_worst(o, l).nccl, 0u);
}

}  // namespace
}  // namespace mt::train
