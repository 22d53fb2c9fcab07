// The planner's estimate of NCCL's connection buffers (plan/memory.h plan_nccl_bytes): which
// connections a device run's step uses (parallel/mesh.h device_comm_use), 32 channels x 4 MiB each,
// shown as its own line and added to the total; nothing on the CPU. (tests/mpi/mpi_sim_nccl_warmup_test.cpp
// holds the same connections against the ones the trainer makes on the simulated NCCL.)
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "plan/memory.h"
#include "plan/plan.h"

namespace mt::plan {
namespace {

using parallel::MeshGroup;

constexpr uint64_t kConnection = uint64_t(32) * (uint64_t(4) << 20);  // 128 MiB

TEST(NcclEstimate, EachGroupUsesWhatItsStepUses) {
  using V = std::vector<int>;
  EXPECT_EQ(parallel::device_comm_use(MeshGroup::pp, 0, 2).peers, V({1}));
  EXPECT_EQ(parallel::device_comm_use(MeshGroup::pp, 0, 4).peers, V({1, 3}));  // the last stage: tied wte
  EXPECT_EQ(parallel::device_comm_use(MeshGroup::pp, 2, 4).peers, V({3, 1}));
  EXPECT_FALSE(parallel::device_comm_use(MeshGroup::pp, 0, 4).collectives);
  EXPECT_EQ(parallel::device_comm_use(MeshGroup::ep, 1, 3).peers, V({0, 2}));
  EXPECT_FALSE(parallel::device_comm_use(MeshGroup::ep, 1, 3).collectives);
  for (MeshGroup g : {MeshGroup::tp, MeshGroup::dp, MeshGroup::expert_data}) {
    EXPECT_TRUE(parallel::device_comm_use(g, 0, 2).collectives) << parallel::mesh_group_name(g);
    EXPECT_TRUE(parallel::device_comm_use(g, 0, 2).peers.empty()) << parallel::mesh_group_name(g);
  }
  for (int g = 0; g < parallel::kNumMeshGroups; g++) {  // one rank: NCCL connects no one
    EXPECT_FALSE(parallel::device_comm_use(MeshGroup(g), 0, 1).collectives);
    EXPECT_TRUE(parallel::device_comm_use(MeshGroup(g), 0, 1).peers.empty());
  }
}

PlanResult planned(const std::vector<std::string>& args) {
  const PlanRequest r = parse_plan_request(args);
  return evaluate_plan(r.options, r.layout, r.hw);
}

TEST(NcclEstimate, CountsEachConnectionOfADeviceRunAndNothingOnTheCpu) {
  // tp 4 x pp 2 x dp 8 on H200s: the tp and dp rings and one pp peer.
  const PlanResult big = planned({"model=gpt2", "hw=h200", "gpus=64", "tp=4", "pp=2", "precision=bf16"});
  EXPECT_EQ(big.memory.nccl, 3 * kConnection);
  EXPECT_EQ(big.memory.total(),
            std::accumulate(big.memory.bytes.begin(), big.memory.bytes.end(), uint64_t(0)) + big.memory.nccl);
  // pp 4: two peers per stage (neighbours; the first and last stage each other's).
  EXPECT_EQ(planned({"model=gpt2", "hw=h200", "gpus=4", "pp=4"}).memory.nccl, 2 * kConnection);
  // One GPU, or ZeRO over one rank: no connection.
  EXPECT_EQ(planned({"model=gpt2", "hw=h200", "gpus=1"}).memory.nccl, 0u);
  EXPECT_EQ(planned({"model=gpt2", "hw=h200", "gpus=1", "zero=1"}).memory.nccl, 0u);
  // dp 4 x ep 4 with experts: dp's ring and three ep peers (the expert-data groups have one rank).
  EXPECT_EQ(planned({"model=tiny-moe", "hw=h200", "gpus=4", "ep=4"}).memory.nccl, 4 * kConnection);
  // The same layouts on the CPU: no NCCL.
  EXPECT_EQ(planned({"model=gpt2", "hw=cpu", "gpus=64", "tp=4", "pp=2"}).memory.nccl, 0u);
  EXPECT_EQ(planned({"model=gpt2", "hw=h200", "gpus=8", "device=cpu"}).memory.nccl, 0u);
}

TEST(NcclEstimate, TheReportShowsItOnALineOfItsOwn) {
  const std::string gpu = plan_report({"model=gpt2", "hw=h200", "gpus=16", "tp=4", "precision=bf16"});
  EXPECT_NE(gpu.find("  nccl            268435456 B  256.0 MiB  (estimate: 2 collective and 0 point-to-point "
                     "connections x 32 channels x 4.0 MiB NCCL_BUFFSIZE"),
            std::string::npos)
      << gpu;
  EXPECT_EQ(plan_report({"model=gpt2", "hw=cpu", "gpus=16", "tp=4"}).find("  nccl "), std::string::npos);
}

}  // namespace
}  // namespace mt::plan
