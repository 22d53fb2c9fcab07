// The rank grid as pure arithmetic (no MPI): rank order, coordinates, groups, printing, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "parallel/mesh.h"
#include "parallel/self_comm.h"
#include "tests/test_util.h"

namespace mt::parallel {
namespace {

constexpr MeshDim kDims[] = {MeshDim::tp, MeshDim::cp, MeshDim::pp, MeshDim::dp};

// A random layout with every dimension in 1..3 (so every dimension is sometimes > 1).
MeshLayout random_layout(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(1, 3);
  return MeshLayout{d(rng), d(rng), d(rng), d(rng)};
}

int world_of(const MeshLayout& l) { return l.dp * l.pp * l.cp * l.tp; }

TEST(Mesh, RankIsTpFastestThenCpThenPpThenDp) {
  std::mt19937_64 rng(testing::test_seed());
  for (int trial = 0; trial < 20; trial++) {
    MeshLayout l = random_layout(rng);
    int world = world_of(l);
    for (int r = 0; r < world; r++) {
      Mesh m(l, world, r);
      const MeshCoord& c = m.coord();
      EXPECT_EQ(r, c.tp + l.tp * (c.cp + l.cp * (c.pp + l.pp * c.dp)));
      EXPECT_EQ(m.rank_of(c), r);
      EXPECT_EQ(m.coord_of(r), c);
      for (MeshDim d : kDims) EXPECT_TRUE(c[d] >= 0 && c[d] < m.size(d));
    }
  }
}

TEST(Mesh, KnownCoordinatesAndGroupsOfA2x2x2x2Grid) {
  Mesh m(MeshLayout{2, 2, 2, 2}, 16, 5);  // 5 = tp 1 + 2 * (cp 0 + 2 * (pp 1 + 2 * dp 0))
  EXPECT_EQ(m.coord(), (MeshCoord{1, 0, 1, 0}));
  EXPECT_EQ(m.group_ranks(MeshDim::tp), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group_ranks(MeshDim::cp), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group_ranks(MeshDim::pp), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group_ranks(MeshDim::dp), (std::vector<int>{5, 13}));
  EXPECT_EQ(m.cp_dp_group_ranks(), (std::vector<int>{5, 7, 13, 15}));
  EXPECT_EQ(m.str(), "TP(1)-CP(0)-PP(1)-DP(0)-Rank(5)");
  EXPECT_FALSE(m.first_stage());
  EXPECT_TRUE(m.last_stage());
}

TEST(Mesh, TensorParallelGroupsAreAdjacentRanks) {
  Mesh m(MeshLayout{0, 1, 1, 4}, 8, 6);
  EXPECT_EQ(m.dp(), 2);
  EXPECT_EQ(m.group_ranks(MeshDim::tp), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group_ranks(MeshDim::dp), (std::vector<int>{2, 6}));
}

// For every dimension: the groups partition the world, members differ only along that dimension,
// are ordered by it, and a rank's index in its group is its coordinate.
TEST(Mesh, GroupsOfEveryDimensionPartitionTheWorld) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  for (int trial = 0; trial < 20; trial++) {
    MeshLayout l = random_layout(rng);
    int world = world_of(l);
    for (MeshDim d : kDims) {
      std::set<int> seen;
      std::set<std::vector<int>> groups;
      for (int r = 0; r < world; r++) {
        Mesh m(l, world, r);
        std::vector<int> g = m.group_ranks(d);
        ASSERT_EQ(int(g.size()), m.size(d)) << mesh_dim_name(d);
        EXPECT_EQ(g[size_t(m.coord(d))], r) << mesh_dim_name(d);
        for (size_t i = 0; i < g.size(); i++) {
          MeshCoord c = m.coord_of(g[i]);
          EXPECT_EQ(c[d], int(i));
          for (MeshDim other : kDims) {
            if (other != d) {
              EXPECT_EQ(c[other], m.coord(other));
            }
          }
        }
        groups.insert(g);
      }
      for (const auto& g : groups) {
        for (int r : g) EXPECT_TRUE(seen.insert(r).second) << "rank " << r << " in two " << mesh_dim_name(d) << " groups";
      }
      EXPECT_EQ(int(seen.size()), world);
      EXPECT_EQ(int(groups.size()), world / Mesh(l, world, 0).size(d));
    }
  }
}

TEST(Mesh, CpDpGroupsShareTpAndPpAndOrderCpFastest) {
  MeshLayout l{3, 2, 2, 2};
  int world = world_of(l);
  for (int r = 0; r < world; r++) {
    Mesh m(l, world, r);
    std::vector<int> g = m.cp_dp_group_ranks();
    ASSERT_EQ(int(g.size()), l.cp * l.dp);
    for (size_t i = 0; i < g.size(); i++) {
      MeshCoord c = m.coord_of(g[i]);
      EXPECT_EQ(c.tp, m.coord().tp);
      EXPECT_EQ(c.pp, m.coord().pp);
      EXPECT_EQ(int(i), c.dp * l.cp + c.cp);
    }
  }
}

TEST(Mesh, DpIsInferredFromTheWorldSizeWhenZero) {
  MeshLayout l = resolve_layout(MeshLayout{0, 2, 1, 2}, 12);
  EXPECT_EQ(l.dp, 3);
  EXPECT_EQ(Mesh(MeshLayout{}, 5, 4).dp(), 5);
}

std::string error_of(const MeshLayout& l, int world) {
  try {
    resolve_layout(l, world);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Mesh, BadLayoutsFailWithOneLineNamingTheFlags) {
  EXPECT_EQ(error_of(MeshLayout{2, 1, 1, 2}, 8), "--dp 2 x --tp 2 x --pp 1 x --cp 1 = 4 but the world has 8 ranks");
  EXPECT_EQ(error_of(MeshLayout{1, 1, 1, 2}, 1), "--dp 1 x --tp 2 x --pp 1 x --cp 1 = 2 but the world has 1 rank");
  EXPECT_EQ(error_of(MeshLayout{0, 1, 3, 2}, 8),
            "--tp 2 x --pp 1 x --cp 3 = 6 does not divide the world size 8, so --dp cannot be inferred");
  EXPECT_EQ(error_of(MeshLayout{1, 1, 1, 0}, 1), "--tp must be a positive integer (got 0)");
  EXPECT_EQ(error_of(MeshLayout{1, -1, 1, 1}, 1), "--pp must be a positive integer (got -1)");
  EXPECT_EQ(error_of(MeshLayout{1, 1, 0, 1}, 1), "--cp must be a positive integer (got 0)");
  EXPECT_EQ(error_of(MeshLayout{-2, 1, 1, 1}, 2),
            "--dp must be a positive integer, or 0 to infer it from the world size (got -2)");
}

TEST(Mesh, ArithmeticOnlyMeshHasNoCommunicators) {
  Mesh m(MeshLayout{2, 1, 1, 1}, 2, 1);
  EXPECT_FALSE(m.has_comms());
  EXPECT_THROW(m.dp_comm(), Error);
  EXPECT_THROW(m.coord_of(2), Error);
  EXPECT_THROW(m.rank_of(MeshCoord{0, 0, 0, 2}), Error);
}

TEST(Mesh, OneRankWorldGetsOneRankCommunicatorsForEveryDimension) {
  SelfComm world("world");
  Mesh m(MeshLayout{}, world);
  ASSERT_TRUE(m.has_comms());
  EXPECT_EQ(m.str(), "TP(0)-CP(0)-PP(0)-DP(0)-Rank(0)");
  for (MeshDim d : kDims) {
    EXPECT_EQ(m.comm(d).size(), 1);
    EXPECT_EQ(m.comm(d).name(), mesh_dim_name(d));
  }
  EXPECT_EQ(m.cp_dp_comm().size(), 1);
}

}  // namespace
}  // namespace mt::parallel
