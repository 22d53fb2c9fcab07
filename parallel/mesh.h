// Mesh: the rank grid of 4D parallelism, built once from the world size, this rank and the layout.
//
// Rank order (picotron's grid, and Megatron's "tp fastest" convention):
//     rank = tp + TP * (cp + CP * (pp + PP * dp))
// tp varies fastest, so a tensor-parallel group is TP adjacent ranks (on one node, where its
// per-layer all-reduces need the fast links); then cp, then pp; dp varies slowest.
// Printed as picotron does: TP(tp)-CP(cp)-PP(pp)-DP(dp)-Rank(rank), with this rank's coordinates.
//
// A group along dimension d is the set of ranks that share every coordinate except d, ordered by
// their coordinate along d (so a rank's index in its tp group is its tp coordinate). The cp x dp
// group (the ranks that hold replicas of the same parameters when context parallelism shards the
// sequence, and so average gradients together) is offered too, and expert parallelism is carved
// from it: with ep = E' the cp x dp group (index i = dp cp_size + cp) splits into consecutive blocks of
// E' ranks, the ep groups (ep rank i mod E'), each holding every expert once between them, and the
// ranks with the same ep rank form the expert-data group (the ranks that compute the same experts).
//
// The arithmetic needs no communication (and is unit-tested without MPI); constructing a Mesh from a
// world Comm also splits it into one sub-communicator per dimension.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "runtime/device_wait.h"

namespace mt::parallel {

enum class MeshDim : uint8_t { tp, cp, pp, dp };  // fastest-varying first
// The groups a rank communicates in: the four dimensions, cp x dp (the replicas of one tp x pp
// position), and under expert parallelism the ep group and the expert-data group.
enum class MeshGroup : uint8_t { tp, cp, pp, dp, cp_dp, ep, expert_data };
constexpr int kNumMeshGroups = 7;
const char* mesh_group_name(MeshGroup g);  // "tp", "cp", "pp", "dp", "cp_dp", "ep", "expert_data"
// The group along one dimension (the first four groups are the dimensions, in order).
constexpr MeshGroup group_of(MeshDim d) { return MeshGroup(uint8_t(d)); }
static_assert(group_of(MeshDim::dp) == MeshGroup::dp && group_of(MeshDim::tp) == MeshGroup::tp);
constexpr int kNumMeshDims = 4;
const char* mesh_dim_name(MeshDim d);  // "tp", "cp", "pp", "dp"

// What a training step uses of a group's device (NCCL) communicator, which NCCL connects lazily on
// first use (its buffers then allocated outside the memory pool): collectives (ring and tree
// connections, set up by the first collective) and point-to-point connections, one per peer (set up
// by the first send or receive to that peer). tp, dp and expert_data run all-reduce, reduce-scatter
// and all-gather; pp only exchanges with its neighbours, stage 0 with the last (the tied embedding),
// so its peers are the ring neighbours (rank +-1 mod size), and so are cp's (ring attention sends to
// rank + 1 and receives from rank - 1); ep's all-to-all reaches every other rank.
// `rank` and `peers` are ranks of the group. A group of one rank uses nothing (NCCL connects no one).
struct DeviceCommUse {
  bool collectives = false;
  std::vector<int> peers;
};
DeviceCommUse device_comm_use(MeshGroup g, int rank, int size);

struct MeshLayout;

// Which groups a rank gives a device (NCCL) communicator: the one rule the trainer builds them by and
// the planner counts their connections by (plan/memory.cpp plan_nccl_connections). Only on a GPU
// (`device` cuda): tp, ep, pp and cp when they have more than one rank; the gradients' group, dp
// without context parallelism when it has more than one rank or under ZeRO (`zero` != 0: the sharded
// optimizer's collectives run on it even for one rank), cp x dp (cp_dp) with it; expert_data on a rank
// whose stage holds experts apart (`experts_apart`: ep > 1 and mixture layers on this stage), when it
// has more than one rank or under ZeRO. Returns the communicator's size (its group's), 0 for none.
// `l`: resolved (dp filled in).
int device_comm_size(MeshGroup g, Device device, const MeshLayout& l, int zero, bool experts_apart);

// The --dp --pp --cp --tp flags. dp = 0 means "infer from the world size".
struct MeshLayout {
  int dp = 0;
  int pp = 1;
  int cp = 1;
  int tp = 1;
  int ep = 1;  // expert parallelism: carved from dp x cp, must divide it
  int world() const { return dp * pp * cp * tp; }  // once dp is resolved
};

// "TP(2)-CP(1)-PP(2)-DP(4)": a layout by its sizes, outermost dimension last.
std::string layout_name(const MeshLayout& l);

// Validates `layout` against `world_size` and returns it with dp filled in. Throws a CollectiveError
// (every rank sees the same flags) naming the flags, e.g.
//   "--dp 2 x --pp 1 x --cp 1 x --tp 2 = 4 but the world has 8 ranks".
MeshLayout resolve_layout(MeshLayout layout, int world_size);

struct MeshCoord {
  int tp = 0, cp = 0, pp = 0, dp = 0;
  int operator[](MeshDim d) const;
  int& operator[](MeshDim d);
  bool operator==(const MeshCoord&) const = default;
};

// The Mesh is also how the host waits for this rank's device work (runtime/device_wait.h): the compute
// stream may sit behind any of its device communicators' kernels.
class Mesh : public DeviceWait {
 public:
  // Arithmetic only: no sub-communicators (comm() throws).
  Mesh(const MeshLayout& layout, int world_size, int rank);
  // Also splits `world` into the tp, cp, pp, dp and cp x dp communicators (collective on world).
  // Sub-communicators are named "tp", "cp", ... and count their own bytes.
  // `scratch`: the arena the sub-communicators take their staging buffers from (see Comm::split).
  Mesh(const MeshLayout& layout, Comm& world, Arena* scratch = nullptr);

  Mesh(Mesh&&) noexcept = default;
  Mesh& operator=(Mesh&&) noexcept = default;
  ~Mesh();

  const MeshLayout& layout() const { return layout_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int size(MeshDim d) const;
  int tp() const { return layout_.tp; }
  int cp() const { return layout_.cp; }
  int pp() const { return layout_.pp; }
  int dp() const { return layout_.dp; }

  const MeshCoord& coord() const { return coord_; }
  int coord(MeshDim d) const { return coord_[d]; }
  MeshCoord coord_of(int rank) const;
  int rank_of(const MeshCoord& c) const;

  // World ranks of the group of `rank` (default: this rank) along d, ordered by coordinate along d.
  std::vector<int> group_ranks(MeshDim d) const { return group_ranks(d, rank_); }
  std::vector<int> group_ranks(MeshDim d, int rank) const;
  // World ranks sharing tp and pp with `rank`, ordered by (dp, cp) with cp fastest.
  std::vector<int> cp_dp_group_ranks() const { return cp_dp_group_ranks(rank_); }
  std::vector<int> cp_dp_group_ranks(int rank) const;

  bool first_stage() const { return coord_.pp == 0; }
  bool last_stage() const { return coord_.pp == layout_.pp - 1; }

  bool has_comms() const { return comms_[0] != nullptr; }
  Comm& comm(MeshDim d) const;
  Comm& tp_comm() const { return comm(MeshDim::tp); }
  Comm& cp_comm() const { return comm(MeshDim::cp); }
  Comm& pp_comm() const { return comm(MeshDim::pp); }
  Comm& dp_comm() const { return comm(MeshDim::dp); }
  Comm& cp_dp_comm() const;
  // Expert parallelism (layout().ep > 1): this rank's index in the cp x dp group modulo ep, the ep
  // group (E' consecutive ranks of the cp x dp group) and the expert-data group (the ranks of the cp x
  // dp group with the same ep rank). Without ep, ep_comm() fails and expert_data_comm() is the cp x dp
  // group.
  int ep() const { return layout_.ep; }
  int ep_rank() const { return (coord_.dp * layout_.cp + coord_.cp) % layout_.ep; }
  std::vector<int> ep_group_ranks() const;
  Comm& ep_comm() const;
  Comm& expert_data_comm() const;

  // Device communicators (NCCL), each built beside a group's host communicator, which bootstraps it,
  // and owned here with the host ones. add_device_comm is collective over the group; the communicator
  // runs on its own stream, ordered after `compute_stream` (a cudaStream_t), and is named
  // "<group>.nccl". wide_sums: 16-bit sums reduced in fp32 (parallel/nccl_comm.h). Fails in a build
  // without NCCL, and for a group built twice. device_comm is null for a group without one.
  Comm& add_device_comm(MeshGroup g, void* compute_stream, bool wide_sums = false);
  Comm* device_comm(MeshGroup g) const;
  // Comm::abort_in_flight on every device communicator (a rank unwinding on an error).
  void abort_device_comms();
  // Before the first step: runs on every device communicator what the step will use of it
  // (device_comm_use: a one-element all-reduce, reduce-scatter and all-gather; one grouped send and
  // receive with each peer), so that NCCL allocates its connection buffers now, while the memory pool
  // is small, and not after the pool holds step 1's activation peak. Collective over every group with
  // a device communicator (each waited for in turn, in group order, the same on every rank); the host
  // waits under the wait policy. Returns what it warmed ("pp.nccl: 1 peer; dp.nccl: collectives"), ""
  // when nothing.
  std::string warm_device_comms();
  // DeviceWait: a host wait on this rank's device work, which may sit behind any device communicator's
  // kernels. Polled under the wait policy of the first device communicator with peers, each one's
  // async error polled too; past the deadline every device communicator is aborted (their waiting
  // kernels end) and the PeerTimeoutError (exit status 4) naming `what` goes up. Without a device
  // communicator with peers, under the first host one with peers; with no peers, without a deadline.
  void until(const std::function<bool()>& ready, const char* what) const override;
  // Every communicator this rank holds: the host ones of each group, then the device ones built:
  // the one list walked for counters, their resets and trace lanes.
  std::vector<Comm*> comms() const;

  // "TP(2)-CP(1)-PP(2)-DP(4)-Rank(3)": this rank's coordinates, then its world rank.
  std::string str() const;
  // "dp=4 pp=2 cp=1 tp=2" (the resolved layout, for logs).
  std::string layout_str() const;

 private:
  MeshLayout layout_;
  int world_size_;
  int rank_;
  MeshCoord coord_;
  std::array<std::unique_ptr<Comm>, kNumMeshDims> comms_;
  std::unique_ptr<Comm> cp_dp_comm_;
  std::unique_ptr<Comm> ep_comm_, expert_data_comm_;  // ep > 1 only
  // Declared last: destroyed first, before the host communicators that bootstrapped them.
  std::array<std::unique_ptr<Comm>, kNumMeshGroups> device_comms_;
};

}  // namespace mt::parallel
