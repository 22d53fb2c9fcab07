#include "parallel/mesh.h"

#include <limits>

#include "parallel/nccl_comm.h"  // empty without NCCL
#include "runtime/check.h"

namespace mt::parallel {

const char* mesh_dim_name(MeshDim d) {
  static const char* names[] = {"tp", "cp", "pp", "dp"};
  return names[int(d)];
}

int MeshCoord::operator[](MeshDim d) const {
  switch (d) {
    case MeshDim::tp: return tp;
    case MeshDim::cp: return cp;
    case MeshDim::pp: return pp;
    case MeshDim::dp: return dp;
  }
  return 0;
}

int& MeshCoord::operator[](MeshDim d) {
  switch (d) {
    case MeshDim::cp: return cp;
    case MeshDim::pp: return pp;
    case MeshDim::dp: return dp;
    default: return tp;
  }
}

MeshLayout resolve_layout(MeshLayout l, int world_size) {
  MT_CHECK(world_size >= 1, "world size %d", world_size);
  auto positive = [](const char* flag, int v) {
    if (v < 1) throw CollectiveError(strfmt("%s must be a positive integer (got %d)", flag, v));
  };
  positive("--tp", l.tp);
  positive("--pp", l.pp);
  positive("--cp", l.cp);
  if (l.dp < 0)
    throw CollectiveError(
        strfmt("--dp must be a positive integer, or 0 to infer it from the world size (got %d)", l.dp));
  const long model = long(l.tp) * l.pp * l.cp;
  if (l.dp == 0) {
    if (world_size % model != 0)
      throw CollectiveError(strfmt("--tp %d x --pp %d x --cp %d = %ld does not divide the world size %d, so --dp "
                                   "cannot be inferred",
                                   l.tp, l.pp, l.cp, model, world_size));
    l.dp = int(world_size / model);
  }
  if (l.ep < 1) throw CollectiveError(strfmt("--ep must be a positive integer (got %d)", l.ep));
  if ((long(l.dp) * l.cp) % l.ep != 0)
    throw CollectiveError(strfmt("--ep %d does not divide --dp %d x --cp %d = %ld: expert parallelism is carved from "
                                 "the data-parallel ranks",
                                 l.ep, l.dp, l.cp, long(l.dp) * l.cp));
  const long product = long(l.dp) * model;
  if (product != world_size)
    throw CollectiveError(strfmt("--dp %d x --tp %d x --pp %d x --cp %d = %ld but the world has %d rank%s", l.dp,
                                 l.tp, l.pp, l.cp, product, world_size, world_size == 1 ? "" : "s"));
  return l;
}

Mesh::Mesh(const MeshLayout& layout, int world_size, int rank)
    : layout_(resolve_layout(layout, world_size)), world_size_(world_size), rank_(rank) {
  MT_CHECK(rank >= 0 && rank < world_size, "rank %d is not in a world of %d", rank, world_size);
  coord_ = coord_of(rank);
}

Mesh::Mesh(const MeshLayout& layout, Comm& world, Arena* scratch) : Mesh(layout, world.size(), world.rank()) {
  // One split per dimension: the color names the group (the rank at coordinate 0 along d, unique
  // per group), the key orders it by the coordinate along d. Every rank makes the same calls in
  // the same order, as a collective requires.
  for (int i = 0; i < kNumMeshDims; i++) {
    MeshDim d = MeshDim(i);
    MeshCoord c0 = coord_;
    c0[d] = 0;
    comms_[size_t(i)] = world.split(rank_of(c0), coord_[d], mesh_dim_name(d), scratch);
    MT_CHECK(comms_[size_t(i)]->size() == size(d) && comms_[size_t(i)]->rank() == coord_[d],
             "%s communicator has rank %d of %d, expected %d of %d", mesh_dim_name(d), comms_[size_t(i)]->rank(),
             comms_[size_t(i)]->size(), coord_[d], size(d));
  }
  MeshCoord c0 = coord_;
  c0.cp = 0;
  c0.dp = 0;
  const int i = coord_.dp * layout_.cp + coord_.cp;  // index in the cp x dp group
  cp_dp_comm_ = world.split(rank_of(c0), i, "cp_dp", scratch);
  if (layout_.ep > 1) {
    // Colors within this cp x dp group: its ep blocks, then its expert-data groups (ep ranks).
    ep_comm_ = cp_dp_comm_->split(i / layout_.ep, i % layout_.ep, "ep", scratch);
    expert_data_comm_ = cp_dp_comm_->split(i % layout_.ep, i / layout_.ep, "ep_data", scratch);
  }
}

Mesh::~Mesh() = default;

int Mesh::size(MeshDim d) const {
  switch (d) {
    case MeshDim::tp: return layout_.tp;
    case MeshDim::cp: return layout_.cp;
    case MeshDim::pp: return layout_.pp;
    case MeshDim::dp: return layout_.dp;
  }
  return 1;
}

MeshCoord Mesh::coord_of(int rank) const {
  MT_CHECK(rank >= 0 && rank < world_size_, "rank %d is not in a world of %d", rank, world_size_);
  MeshCoord c;
  c.tp = rank % layout_.tp;
  rank /= layout_.tp;
  c.cp = rank % layout_.cp;
  rank /= layout_.cp;
  c.pp = rank % layout_.pp;
  c.dp = rank / layout_.pp;
  return c;
}

int Mesh::rank_of(const MeshCoord& c) const {
  for (int i = 0; i < kNumMeshDims; i++)
    MT_CHECK(c[MeshDim(i)] >= 0 && c[MeshDim(i)] < size(MeshDim(i)), "%s coordinate %d is not in [0, %d)",
             mesh_dim_name(MeshDim(i)), c[MeshDim(i)], size(MeshDim(i)));
  return c.tp + layout_.tp * (c.cp + layout_.cp * (c.pp + layout_.pp * c.dp));
}

std::vector<int> Mesh::group_ranks(MeshDim d, int rank) const {
  MeshCoord c = coord_of(rank);
  std::vector<int> out;
  for (int i = 0; i < size(d); i++) {
    c[d] = i;
    out.push_back(rank_of(c));
  }
  return out;
}

std::vector<int> Mesh::cp_dp_group_ranks(int rank) const {
  MeshCoord c = coord_of(rank);
  std::vector<int> out;
  for (int dp = 0; dp < layout_.dp; dp++) {
    for (int cp = 0; cp < layout_.cp; cp++) {
      c.dp = dp;
      c.cp = cp;
      out.push_back(rank_of(c));
    }
  }
  return out;
}

Comm& Mesh::comm(MeshDim d) const {
  MT_CHECK(has_comms(), "this Mesh was built without a world communicator; it has no %s communicator",
           mesh_dim_name(d));
  return *comms_[size_t(d)];
}

Comm& Mesh::cp_dp_comm() const {
  MT_CHECK(has_comms(), "this Mesh was built without a world communicator; it has no cp_dp communicator");
  return *cp_dp_comm_;
}

std::vector<int> Mesh::ep_group_ranks() const {
  const std::vector<int> all = cp_dp_group_ranks();
  const int i = coord_.dp * layout_.cp + coord_.cp, first = i - i % layout_.ep;
  return std::vector<int>(all.begin() + first, all.begin() + first + layout_.ep);
}

Comm& Mesh::ep_comm() const {
  MT_CHECK(ep_comm_ != nullptr, "no ep communicator: the layout has ep = %d or the Mesh no world", layout_.ep);
  return *ep_comm_;
}

Comm& Mesh::expert_data_comm() const { return expert_data_comm_ ? *expert_data_comm_ : cp_dp_comm(); }

const char* mesh_group_name(MeshGroup g) {
  static const char* const names[kNumMeshGroups] = {"tp", "cp", "pp", "dp", "cp_dp", "ep", "expert_data"};
  return names[size_t(g)];
}

namespace {

[[maybe_unused]] Comm& host_comm(const Mesh& m, MeshGroup g) {  // used by builds with NCCL
  switch (g) {
    case MeshGroup::tp: return m.tp_comm();
    case MeshGroup::cp: return m.cp_comm();
    case MeshGroup::pp: return m.pp_comm();
    case MeshGroup::dp: return m.dp_comm();
    case MeshGroup::cp_dp: return m.cp_dp_comm();
    case MeshGroup::ep: return m.ep_comm();
    case MeshGroup::expert_data: return m.expert_data_comm();
  }
  return m.dp_comm();
}

}  // namespace

void Mesh::abort_device_comms() {
  for (auto& c : device_comms_)
    if (c) c->abort_in_flight();
}

Comm& Mesh::add_device_comm(MeshGroup g, void* compute_stream, bool wide_sums) {
  const char* name = mesh_group_name(g);
  MT_CHECK(!device_comms_[size_t(g)], "the %s group's device communicator is already built", name);
#ifdef MT_HAVE_NCCL
  device_comms_[size_t(g)] = std::make_unique<NcclComm>(host_comm(*this, g), static_cast<cudaStream_t>(compute_stream),
                                                        strfmt("%s.nccl", name), wide_sums);
  return *device_comms_[size_t(g)];
#else
  (void)compute_stream, (void)wide_sums;
  fail("the %s group's device communicator needs a build with NCCL (this one has none)", name);
#endif
}

Comm* Mesh::device_comm(MeshGroup g) const { return device_comms_[size_t(g)].get(); }

DeviceCommUse device_comm_use(MeshGroup g, int rank, int size) {
  DeviceCommUse u;
  if (size < 2) return u;
  switch (g) {
    case MeshGroup::pp:  // the stages' neighbours (and the first with the last: the tied embedding)
    case MeshGroup::cp:  // ring attention: blocks to rank + 1, from rank - 1
      u.peers.push_back((rank + 1) % size);
      if (size > 2) u.peers.push_back((rank + size - 1) % size);
      break;
    case MeshGroup::ep:
      for (int r = 0; r < size; r++)
        if (r != rank) u.peers.push_back(r);
      break;
    default: u.collectives = true; break;
  }
  return u;
}

int device_comm_size(MeshGroup g, Device device, const MeshLayout& l, int zero, bool experts_apart) {
  if (device != Device::cuda) return 0;
  const int replicas = l.dp * l.cp;
  switch (g) {
    case MeshGroup::tp: return l.tp > 1 ? l.tp : 0;
    case MeshGroup::ep: return l.ep > 1 ? l.ep : 0;
    case MeshGroup::pp: return l.pp > 1 ? l.pp : 0;
    case MeshGroup::cp: return l.cp > 1 ? l.cp : 0;
    // The gradients' group: dp, or cp x dp under context parallelism (its replicas reduce together).
    case MeshGroup::dp: return l.cp == 1 && (l.dp > 1 || zero != 0) ? l.dp : 0;
    case MeshGroup::cp_dp: return l.cp > 1 ? replicas : 0;
    case MeshGroup::expert_data:
      return experts_apart && (replicas / l.ep > 1 || zero != 0) ? replicas / l.ep : 0;
  }
  return 0;
}

std::string Mesh::warm_device_comms() {
  std::string what;
#ifdef MT_HAVE_NCCL
  for (int i = 0; i < kNumMeshGroups; i++) {
    auto* c = dynamic_cast<NcclComm*>(device_comms_[size_t(i)].get());
    if (!c) continue;
    const DeviceCommUse use = device_comm_use(MeshGroup(i), c->rank(), c->size());
    if (!use.collectives && use.peers.empty()) continue;
    c->warm_up(use.collectives, use.peers);
    std::string line = c->name() + ":";
    if (use.collectives) line += " collectives";
    if (!use.peers.empty())
      line += strfmt("%s %zu peer%s", use.collectives ? "," : "", use.peers.size(), use.peers.size() == 1 ? "" : "s");
    what += (what.empty() ? "" : "; ") + line;
  }
#endif
  return what;
}

void Mesh::until(const std::function<bool()>& ready, const char* what) const {
  std::vector<Comm*> device;
  for (const auto& c : device_comms_)
    if (c && c->size() > 1) device.push_back(c.get());
  Comm* lead = device.empty() ? nullptr : device.front();
  for (int i = 0; i < kNumMeshDims && !lead && has_comms(); i++)
    if (comms_[size_t(i)]->size() > 1) lead = comms_[size_t(i)].get();
  if (!lead) {
    double waited = 0;
    poll_with_backoff(ready, std::numeric_limits<double>::infinity(), &waited);
    return;
  }
  try {
    lead->wait_for_device(
        [&] {
          for (Comm* c : device) c->poll_failure();
          return ready();
        },
        what);
  } catch (const PeerTimeoutError&) {
    for (Comm* c : device) c->abort_in_flight();  // the lead's already (Comm::time_out): the rest too
    throw;
  }
}

std::vector<Comm*> Mesh::comms() const {
  std::vector<Comm*> all = {&dp_comm(), &tp_comm(), &pp_comm(), &cp_comm(), &cp_dp_comm()};
  if (ep_comm_) all.push_back(ep_comm_.get());
  if (expert_data_comm_) all.push_back(expert_data_comm_.get());
  for (const auto& c : device_comms_)
    if (c) all.push_back(c.get());
  return all;
}

std::string layout_name(const MeshLayout& l) { return strfmt("TP(%d)-CP(%d)-PP(%d)-DP(%d)", l.tp, l.cp, l.pp, l.dp); }

std::string Mesh::str() const {
  return strfmt("TP(%d)-CP(%d)-PP(%d)-DP(%d)-Rank(%d)", coord_.tp, coord_.cp, coord_.pp, coord_.dp, rank_);
}

std::string Mesh::layout_str() const {
  std::string s = strfmt("dp=%d pp=%d cp=%d tp=%d", layout_.dp, layout_.pp, layout_.cp, layout_.tp);
  if (layout_.ep > 1) s += strfmt(" ep=%d", layout_.ep);
  return s;
}

}  // namespace mt::parallel
