// Mesh sub-communicators under mpirun: for every layout of the world size, each dimension's
// communicator holds exactly the ranks Mesh::group_ranks names, in that order.
#include <gtest/gtest.h>

#include "parallel/mesh.h"
#include "tests/mpi/mpi_test_util.h"

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

TEST(MpiMesh, PrintedCoordinatesAreDistinctPerRank) {
  const int n = mpi_world().size();
  Mesh mesh(MeshLayout{0, 1, 1, 1}, mpi_world().comm());
  std::string s = mesh.str();
  EXPECT_EQ(s, "TP(0)-CP(0)-PP(0)-DP(" + std::to_string(mesh.rank()) + ")-Rank(" + std::to_string(mesh.rank()) + ")");
  EXPECT_EQ(mesh.dp(), n);
}

}  // namespace
}  // namespace mt::parallel
