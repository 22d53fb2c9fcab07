// Mesh sub-communicators under mpirun: for every layout of the world size, each dimension's
// communicator holds exactly the ranks Mesh::group_ranks names, in that order.
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/mesh.h"
#include "runtime/check.h"
#include "tests/mpi/mpi_test_util.h"
#ifdef MT_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace mt::parallel {
namespace {

using testing::mpi_world;

// Every (dp, pp, cp, tp) whose product is n.
std::vector<MeshLayout> all_layouts(int n) {
  std::vector<MeshLayout> out;
  for (int tp = 1; tp <= n; tp++)
    for (int cp = 1; tp * cp <= n; cp++)
      for (int pp = 1; tp * cp * pp <= n; pp++)
        if (n % (tp * cp * pp) == 0) out.push_back(MeshLayout{n / (tp * cp * pp), pp, cp, tp});
  return out;
}

std::vector<int> members(Comm& c) {
  std::vector<int32_t> got(size_t(c.size()));
  int32_t me = mpi_world().rank();
  c.all_gather(&me, got.data(), 1, DType::i32);
  return std::vector<int>(got.begin(), got.end());
}

TEST(MpiMesh, EveryLayoutsCommunicatorsHoldTheirGroupInCoordinateOrder) {
  const int n = mpi_world().size();
  for (const MeshLayout& l : all_layouts(n)) {
    Mesh mesh(l, mpi_world().comm());
    SCOPED_TRACE(mesh.layout_str() + " " + mesh.str());
    for (MeshDim d : {MeshDim::tp, MeshDim::cp, MeshDim::pp, MeshDim::dp}) {
      EXPECT_EQ(members(mesh.comm(d)), mesh.group_ranks(d)) << mesh_dim_name(d);
      EXPECT_EQ(mesh.comm(d).rank(), mesh.coord(d)) << mesh_dim_name(d);
    }
    EXPECT_EQ(members(mesh.cp_dp_comm()), mesh.cp_dp_group_ranks());
  }
}

// Expert parallelism, for every ep dividing dp x cp of every layout: the ep group is ep consecutive
// ranks of the cp x dp group, the expert-data group its ranks with the same ep rank; together an ep
// group and an expert-data group meet in this rank only.
TEST(MpiMesh, ExpertGroupsAreCarvedFromTheCpDpGroup) {
  const int n = mpi_world().size();
  for (MeshLayout l : all_layouts(n))
    for (int ep = 2; ep <= l.dp * l.cp; ep++) {
      if ((l.dp * l.cp) % ep != 0) continue;
      l.ep = ep;
      Mesh mesh(l, mpi_world().comm());
      SCOPED_TRACE(mesh.layout_str() + " " + mesh.str());
      const std::vector<int> all = mesh.cp_dp_group_ranks(), group = members(mesh.ep_comm());
      EXPECT_EQ(group, mesh.ep_group_ranks());
      EXPECT_EQ(mesh.ep_comm().rank(), mesh.ep_rank());
      const std::vector<int> data = members(mesh.expert_data_comm());
      ASSERT_EQ(int(data.size()), l.dp * l.cp / ep);
      for (size_t i = 0; i < data.size(); i++) EXPECT_EQ(data[i], all[i * size_t(ep) + size_t(mesh.ep_rank())]);
      const size_t at = size_t(std::find(all.begin(), all.end(), mesh.rank()) - all.begin());
      EXPECT_EQ(int(at % size_t(ep)), mesh.ep_rank());
      for (size_t i = 0; i < group.size(); i++) EXPECT_EQ(group[i], all[at / size_t(ep) * size_t(ep) + i]);
    }
}

TEST(MpiMesh, ReductionsOverATensorParallelGroupSeeOnlyThatGroup) {
  const int n = mpi_world().size();
  Mesh mesh(MeshLayout{0, 1, 1, n % 2 == 0 ? 2 : 1}, mpi_world().comm());
  float x = float(mesh.rank());
  mesh.tp_comm().all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  float want = 0;
  for (int r : mesh.group_ranks(MeshDim::tp)) want += float(r);
  EXPECT_EQ(x, want);
  EXPECT_EQ(mesh.tp_comm().counters()[CommOp::all_reduce].calls, 1u);
  EXPECT_EQ(mesh.dp_comm().counters()[CommOp::all_reduce].calls, 0u);
}

// The mesh builds each group's device communicator beside its host one, names it after the group,
// hands it out by group and lists it with the host ones (what counters, resets and trace lanes walk).
// Runs where NCCL is built and each rank has a device (a GPU per rank, or the simulated device).
TEST(MpiMesh, DeviceCommunicatorsAreBuiltBesideTheirGroupsAndListedWithThem) {
  const int n = mpi_world().size();
  Mesh mesh(MeshLayout{0, 1, 1, n % 2 == 0 ? 2 : 1}, mpi_world().comm());
#if !defined(MT_HAVE_NCCL)
  EXPECT_THROW(mesh.add_device_comm(MeshGroup::dp, nullptr), Error);
  GTEST_SKIP() << "a build without NCCL: adding a device communicator fails (checked)";
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
#if !defined(MT_CUDA_SIM)
  if (devices < n) GTEST_SKIP() << "needs one GPU per rank";
#endif
  ASSERT_GT(devices, 0);
  ASSERT_EQ(cudaSetDevice(mpi_world().rank() % devices), cudaSuccess);
  const size_t host_count = mesh.comms().size();
  EXPECT_EQ(mesh.device_comm(MeshGroup::dp), nullptr);
  Comm& dp = mesh.add_device_comm(MeshGroup::dp, nullptr);
  Comm& tp = mesh.add_device_comm(MeshGroup::tp, nullptr, /*wide_sums=*/true);
  EXPECT_EQ(mesh.device_comm(MeshGroup::dp), &dp);
  EXPECT_EQ(mesh.device_comm(group_of(MeshDim::tp)), &tp);
  EXPECT_EQ(mesh.device_comm(MeshGroup::pp), nullptr);
  EXPECT_EQ(dp.name(), "dp.nccl");
  EXPECT_EQ(tp.name(), "tp.nccl");
  EXPECT_EQ(dp.size(), mesh.dp_comm().size());
  EXPECT_EQ(tp.rank(), mesh.tp_comm().rank());
  const std::vector<Comm*> all = mesh.comms();
  EXPECT_EQ(all.size(), host_count + 2);
  EXPECT_NE(std::find(all.begin(), all.end(), &dp), all.end());
  EXPECT_NE(std::find(all.begin(), all.end(), &tp), all.end());
  EXPECT_THROW(mesh.add_device_comm(MeshGroup::dp, nullptr), Error) << "a group's communicator built twice";
  // A sum over the tp group's device communicator, on device memory, counted there only.
  float* x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, sizeof(float)), cudaSuccess);
  const float mine = float(mesh.rank());
  ASSERT_EQ(cudaMemcpy(x, &mine, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  tp.all_reduce(x, 1, DType::f32, ReduceOp::sum);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  float got = 0;
  ASSERT_EQ(cudaMemcpy(&got, x, sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(x);
  float want = 0;
  for (int r : mesh.group_ranks(MeshDim::tp)) want += float(r);
  EXPECT_EQ(got, want);
  EXPECT_EQ(tp.counters()[CommOp::all_reduce].calls, 1u);
  EXPECT_EQ(mesh.tp_comm().counters()[CommOp::all_reduce].calls, 0u);
#endif
}

TEST(MpiMesh, PrintedCoordinatesAreDistinctPerRank) {
  const int n = mpi_world().size();
  Mesh mesh(MeshLayout{0, 1, 1, 1}, mpi_world().comm());
  std::string s = mesh.str();
  EXPECT_EQ(s, "TP(0)-CP(0)-PP(0)-DP(" + std::to_string(mesh.rank()) + ")-Rank(" + std::to_string(mesh.rank()) + ")");
  EXPECT_EQ(mesh.dp(), n);
}

}  // namespace
}  // namespace mt::parallel
