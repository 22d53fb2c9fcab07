// How communicators come to be: ncclGetUniqueId's id, ncclCommInitRank's bootstrap over
// MPI_COMM_WORLD, ncclCommSplit.
//
// A communicator of one rank has no one to meet: ncclCommInitRank makes it at once, with neither the
// id's root nor MPI (a process that never initialised MPI makes ids as world rank 0 of 1); splitting it
// gives one of one rank again, or none (its links, SelfLinks in sim/nccl_common.cpp).
//
// The bootstrap involves only the processes that hold the id. Each member sends (its world rank, its
// rank, nranks, its next communicator number) to the id's root (the process that made the id) on
// MPI_COMM_WORLD with tags of the stand-in's own; the root checks that ranks 0..nranks-1 each came
// once and answers every member point to point with the world ranks in rank order (or the reason it
// failed); then the members, and only they, make their MPI communicator with MPI_Comm_create_group.
// Unlike NCCL's, the root must be a member: there is no background thread to answer for it.
//
// Communicator numbers (comm#<number> in messages) are agreed: the largest of the members' next
// numbers, so a communicator has the same number on every member and no process has two with one.
//
// Then the connections NCCL makes lazily, on a communicator's first collective and first exchange
// with each peer (sim/nccl_connections.h): recorded by connect(), counted by connections().
#include <algorithm>
#include <cstring>

#include "sim/nccl_connections.h"
#include "sim/nccl_state.h"

namespace mt::sim::nccl {

namespace {

constexpr uint64_t kIdMagic = 0x6e63636c2d73696dull;  // "nccl-sim"

struct IdBody {
  uint64_t magic;
  uint64_t serial;     // the root's ncclGetUniqueId calls, this one included
  int32_t root;        // the world rank that made it
  int32_t world_size;  // of the job that made it
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES);

// MPI guarantees tags up to 32767. The stand-in's own bootstrap tags (MPI_COMM_WORLD only):
// request, answer and MPI_Comm_create_group's, per id, cycling every kTagIds ids of one root.
constexpr int kTagBase = 16384, kTagIds = 5000;
int tag_of(uint64_t serial, int which) { return kTagBase + 3 * int(serial % kTagIds) + which; }

// A member's request to the root.
struct Request {
  int64_t serial, world_rank, rank, nranks, next_number;
};

// The root's answer: this header, then the world ranks (ok) or the reason (failed).
struct Answer {
  int64_t serial, code, number, nranks;
};

int next_number() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.next_number;
}

void numbers_used_up_to(int last) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.next_number = std::max(s.next_number, last + 1);
}

// Sends small bootstrap messages and waits for them within the deadline; a send still pending then is
// left to finish on its own (its buffer is kept alive).
void send_all(const std::vector<std::pair<int, std::vector<unsigned char>>>& messages, int tag, const Deadline& deadline,
              const std::string& ctx) {
  auto held = std::make_shared<std::vector<std::pair<int, std::vector<unsigned char>>>>(messages);
  std::vector<MPI_Request> r(held->size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < held->size(); i++) {
    auto& [dest, bytes] = (*held)[i];
    MT_SIM_MPI(ctx, MPI_Isend(bytes.data(), int(bytes.size()), MPI_BYTE, dest, tag, MPI_COMM_WORLD, &r[i]));
  }
  if (poll(r, deadline, ctx)) return;
  for (MPI_Request& q : r)
    if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
  new std::shared_ptr<void>(held);  // deliberately never freed: MPI may still read it
}

template <class T>
std::vector<unsigned char> bytes_of(const T& v) {
  std::vector<unsigned char> b(sizeof v);
  std::memcpy(b.data(), &v, sizeof v);
  return b;
}

// The root: collects every other member's request, checks them, answers all. Returns the world ranks in
// rank order and the communicator's number.
std::vector<int> gather_members(const IdBody& id, int nranks, int rank, int* number, const Deadline& deadline,
                                const std::string& ctx) {
  const int me = world_rank();
  std::vector<int> world_of(size_t(nranks), -1);
  world_of[size_t(rank)] = me;
  *number = next_number();
  std::vector<int> arrived;  // world ranks, to answer
  std::string problem;
  ncclResult_t code = ncclInvalidUsage;
  for (int joined = 1; joined < nranks && problem.empty();) {
    std::vector<unsigned char> bytes;
    int from = -1;
    if (!receive_any_size(MPI_ANY_SOURCE, tag_of(id.serial, 0), MPI_COMM_WORLD, bytes, &from, deadline, ctx)) {
      std::string missing;
      int count = 0;
      for (int r = 0; r < nranks; r++)
        if (world_of[size_t(r)] < 0) missing += format("%s%d", count++ ? ", " : "", r);
      problem = format("timed out after %g s with %d of %d ranks joined: rank%s %s %s not called ncclCommInitRank "
                       "with this id",
                       deadline.seconds(), joined, nranks, count == 1 ? "" : "s", missing.c_str(),
                       count == 1 ? "has" : "have");
      code = ncclSystemError;
      break;
    }
    Request q{};
    if (bytes.size() != sizeof q) {
      arrived.push_back(from);
      problem = format("world rank %d sent a malformed request (%zu bytes)", from, bytes.size());
      break;
    }
    std::memcpy(&q, bytes.data(), sizeof q);
    // A request for an earlier id of this root whose tag this one reuses: its bootstrap failed and its
    // sender gave up long ago. Dropped.
    if (q.serial != int64_t(id.serial)) continue;
    arrived.push_back(from);
    if (q.nranks != nranks) {
      problem = format("world rank %d joins with nranks=%lld, the root (world rank %d) with nranks=%d", from,
                       (long long)q.nranks, me, nranks);
    } else if (q.rank < 0 || q.rank >= nranks) {
      problem = format("world rank %d joins as rank %lld of %d", from, (long long)q.rank, nranks);
    } else if (world_of[size_t(q.rank)] >= 0) {
      problem = format("world ranks %d and %d both join as rank %lld", world_of[size_t(q.rank)], from,
                       (long long)q.rank);
    } else {
      world_of[size_t(q.rank)] = from;
      *number = std::max(*number, int(q.next_number));
      joined++;
    }
  }
  Answer a{int64_t(id.serial), problem.empty() ? ncclSuccess : code, *number, nranks};
  std::vector<unsigned char> answer = bytes_of(a);
  if (problem.empty()) {
    for (int w : world_of) {
      const int64_t v = w;
      answer.insert(answer.end(), reinterpret_cast<const unsigned char*>(&v),
                    reinterpret_cast<const unsigned char*>(&v) + sizeof v);
    }
  } else {
    answer.insert(answer.end(), problem.begin(), problem.end());
  }
  std::vector<std::pair<int, std::vector<unsigned char>>> answers;
  for (int w : arrived) answers.emplace_back(w, answer);
  send_all(answers, tag_of(id.serial, 1), deadline, ctx);
  if (!problem.empty()) throw Failure(code, ctx + ": " + problem);
  return world_of;
}

// A member other than the root: asks it, and waits for its answer, twice as long as the root waits for
// the members, so that it hears the root's reason rather than its own timeout.
std::vector<int> join_root(const IdBody& id, int nranks, int rank, int* number, double timeout,
                           const std::string& ctx) {
  const Deadline deadline(2 * timeout);
  const Request q{int64_t(id.serial), world_rank(), rank, nranks, next_number()};
  send_all({{id.root, bytes_of(q)}}, tag_of(id.serial, 0), deadline, ctx);
  std::vector<unsigned char> bytes;
  int from = -1;
  if (!receive_any_size(id.root, tag_of(id.serial, 1), MPI_COMM_WORLD, bytes, &from, deadline, ctx))
    throw Failure(ncclSystemError,
                  format("%s: timed out after %g s: the id's root, world rank %d, has not answered (it must call "
                         "ncclCommInitRank with this id too)",
                         ctx.c_str(), deadline.seconds(), id.root));
  Answer a{};
  if (bytes.size() < sizeof a) throw Failure(ncclInternalError, ctx + ": a malformed answer from the root");
  std::memcpy(&a, bytes.data(), sizeof a);
  if (a.code != ncclSuccess)
    throw Failure(ncclResult_t(a.code),
                  ctx + ": the root (world rank " + std::to_string(id.root) +
                      ") refused: " + std::string(bytes.begin() + sizeof a, bytes.end()));
  if (a.serial != int64_t(id.serial) || a.nranks != nranks || bytes.size() != sizeof a + size_t(nranks) * 8)
    throw Failure(ncclInternalError, ctx + ": a malformed answer from the root");
  std::vector<int> world_of(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; r++) {
    int64_t v = 0;
    std::memcpy(&v, bytes.data() + sizeof a + size_t(r) * 8, 8);
    world_of[size_t(r)] = int(v);
  }
  *number = int(a.number);
  return world_of;
}

}  // namespace

void get_unique_id(ncclUniqueId* id) {
  IdBody body{kIdMagic, 0, world_rank(), world_size()};
  {
    State& s = state();
    std::lock_guard lock(s.mutex);
    body.serial = ++s.ids;
  }
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, &body, sizeof body);
}

ncclComm* init_rank(int nranks, const ncclUniqueId& id, int rank) {
  IdBody body{};
  std::memcpy(&body, id.internal, sizeof body);
  if (body.magic != kIdMagic)
    throw Failure(ncclInvalidArgument,
                  "ncclCommInitRank: commId was not made by ncclGetUniqueId (uninitialised, or overwritten)");
  if (nranks == 1) {  // no one to meet, so neither the id's root nor MPI takes part
    const int number = next_number();
    numbers_used_up_to(number);
    return make_comm(alone(), number);
  }
  const std::string ctx = format("ncclCommInitRank (rank %d of %d, id #%llu of world rank %d)", rank, nranks,
                                 (unsigned long long)body.serial, body.root);
  require_mpi(ctx);
  const int size = world_size();
  if (body.world_size != size || body.root < 0 || body.root >= size)
    throw Failure(ncclInvalidArgument,
                  format("ncclCommInitRank: commId names root world rank %d of %d, but this job has %d ranks", body.root,
                         body.world_size, size));
  const double timeout = timeout_seconds();
  int number = 0;
  const std::vector<int> world_of = world_rank() == body.root
                                        ? gather_members(body, nranks, rank, &number, Deadline(timeout), ctx)
                                        : join_root(body, nranks, rank, &number, timeout, ctx);
  if (world_rank() != body.root && world_of[size_t(rank)] != world_rank())
    throw Failure(ncclInternalError, ctx + ": the root placed this process elsewhere");
  // Every member has its answer, so all of them make the communicator now: collective over them only.
  MPI_Group world = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MT_SIM_MPI(ctx, MPI_Comm_group(MPI_COMM_WORLD, &world));
  MT_SIM_MPI(ctx, MPI_Group_incl(world, nranks, world_of.data(), &group));
  MPI_Comm data = MPI_COMM_NULL;
  MT_SIM_MPI(ctx, MPI_Comm_create_group(MPI_COMM_WORLD, group, tag_of(body.serial, 2), &data));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  Members m = members(data, ctx);
  numbers_used_up_to(number);
  return make_comm(std::move(m), number);
}

ncclComm* split(ncclComm& parent, int color, int key) {
  const std::string ctx = "ncclCommSplit on " + parent.name;
  const Deadline deadline(timeout_seconds());
  Descriptor mine{};
  mine.kind = int32_t(Kind::split);
  mine.number = ++parent.collectives;
  mine.color = color;
  mine.key = key;
  mine.next_number = next_number();
  const std::vector<Descriptor> all = agree(parent, mine, ctx, deadline);
  // The new communicators are numbered from the members' largest next number, one per color in
  // increasing order: every member of one gets the same number.
  int64_t base = 0;
  std::vector<int64_t> colors;
  for (const Descriptor& d : all) {
    base = std::max(base, d.next_number);
    if (d.color != NCCL_SPLIT_NOCOLOR) colors.push_back(d.color);
  }
  std::sort(colors.begin(), colors.end());
  colors.erase(std::unique(colors.begin(), colors.end()), colors.end());
  numbers_used_up_to(int(base + int64_t(colors.size())) - 1);
  std::optional<Members> m = parent.links->split(color, key, ctx);
  if (!m) return nullptr;
  const int64_t index = std::lower_bound(colors.begin(), colors.end(), int64_t(color)) - colors.begin();
  return make_comm(std::move(*m), int(base + index));
}

void connect(ncclComm& c, const Call& call) {
  if (c.size < 2) return;  // NCCL connects no one in a communicator of one rank
  switch (call.kind) {
    case Kind::send:
    case Kind::recv:
      if (call.root != c.rank) c.peers.insert(call.root);
      break;
    case Kind::split: break;
    default: c.ring = true; break;
  }
}

Connections connections() {
  Connections n;
  State& s = state();
  std::lock_guard lock(s.mutex);
  for (const auto& [handle, c] : s.comms) {
    if (c->life == ncclComm::Life::destroyed || c->life == ncclComm::Life::aborted) continue;
    n.rings += c->ring ? 1 : 0;
    n.peers += int(c->peers.size());
  }
  n.bytes = uint64_t(n.rings + n.peers) * uint64_t(kNcclChannels) * kNcclBuffSize;
  return n;
}

}  // namespace mt::sim::nccl
