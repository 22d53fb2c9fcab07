// The NCCL stand-in's shared pieces: its state, names and messages, the timeout, MPI status checks,
// and communicators' links (MpiLinks, SelfLinks, and the one place that picks between them) with the
// making of a communicator's record.
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include "sim/nccl_state.h"

namespace mt::sim::nccl {

State& state() {
  static State* s = new State;  // never destroyed: a static destructor may still call NCCL
  return *s;
}

ThreadState& this_thread() {
  static thread_local ThreadState t;
  return t;
}

const char* call_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    case Kind::broadcast: return "ncclBroadcast";
    case Kind::send: return "ncclSend";
    case Kind::recv: return "ncclRecv";
    case Kind::split: return "ncclCommSplit";
  }
  return "?";
}

std::string type_name(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return "float32";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat16: return "float16";
    case ncclInt32: return "int32";
    case ncclUint8: return "uint8";
    case ncclInt8: return "ncclInt8";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat64: return "ncclFloat64";
    case ncclFloat8e4m3: return "ncclFloat8e4m3";
    case ncclFloat8e5m2: return "ncclFloat8e5m2";
    default: return format("datatype %d", int(t));
  }
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32:
    case ncclInt32: return 4;
    case ncclBfloat16:
    case ncclFloat16: return 2;
    case ncclUint8: return 1;
    default: return 0;
  }
}

std::string op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclAvg: return "avg";
    case ncclMax: return "max";
    case ncclProd: return "ncclProd";
    case ncclMin: return "ncclMin";
    default: return format("op %d", int(op));
  }
}

std::string describe(const Call& c) {
  std::string s = format("%s count=%zu %s", call_name(c.kind), c.count, type_name(c.type).c_str());
  switch (c.kind) {
    case Kind::all_reduce:
    case Kind::reduce_scatter: return s + " " + op_name(c.op);
    case Kind::broadcast: return s + format(" root=%d", c.root);
    case Kind::send: return s + format(" to rank %d", c.root);
    case Kind::recv: return s + format(" from rank %d", c.root);
    case Kind::split: return call_name(c.kind);
    case Kind::all_gather: break;
  }
  return s;
}

std::string context(const Call& c) { return describe(c) + " on " + (c.comm ? c.comm->name : "a null comm"); }

std::string ranks_text(const ncclComm& c, const std::vector<int>& ranks) {
  std::string r, w;
  for (size_t i = 0; i < ranks.size(); i++) {
    const int world = ranks[i] >= 0 && ranks[i] < int(c.world_ranks.size()) ? c.world_ranks[size_t(ranks[i])] : -1;
    if (i) {
      r += ", ";
      w += ", ";
    }
    r += std::to_string(ranks[i]);
    w += std::to_string(world);
  }
  const char* s = ranks.size() == 1 ? "" : "s";
  return format("rank%s %s (world rank%s %s)", s, r.c_str(), s, w.c_str());
}

ncclResult_t report(const Failure& f) {
  this_thread().last_error = f.what();
  std::fprintf(stderr, "minitrain-sim: %s\n", f.what());
  return f.code();
}

double timeout_seconds() {
  const char* v = std::getenv("MT_SIM_NCCL_TIMEOUT");
  if (!v) return 60;
  char* end = nullptr;
  errno = 0;
  const double t = std::strtod(v, &end);
  if (*v == '\0' || *v == ' ' || *v == '\t' || *end != '\0' || errno != 0 || !std::isfinite(t) || t <= 0)
    throw Failure(ncclInvalidArgument,
                  format("MT_SIM_NCCL_TIMEOUT='%s' is not a number of seconds > 0 (it bounds every wait of the "
                         "simulated NCCL; unset, 60)",
                         v));
  return t;
}

Deadline::Deadline(double seconds)
    : seconds_(seconds),
      end_(std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds))) {}

bool Deadline::passed() const { return std::chrono::steady_clock::now() >= end_; }

void pause_between_polls() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

void check_mpi(int rc, const std::string& ctx, const char* stmt) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, text, &n) != MPI_SUCCESS) n = std::snprintf(text, sizeof text, "MPI error %d", rc);
  throw Failure(ncclSystemError, format("%s: %s failed: %.*s", ctx.c_str(), stmt, n, text));
}

bool poll(std::vector<MPI_Request>& requests, const Deadline& deadline, const std::string& ctx) {
  for (;;) {
    bool all = true;
    for (MPI_Request& r : requests) {
      if (r == MPI_REQUEST_NULL) continue;
      int done = 0;
      MT_SIM_MPI(ctx, MPI_Test(&r, &done, MPI_STATUS_IGNORE));
      if (!done) all = false;
    }
    if (all) return true;
    if (deadline.passed()) return false;
    pause_between_polls();
  }
}

bool receive_any_size(int source, int tag, MPI_Comm comm, std::vector<unsigned char>& bytes, int* from,
                      const Deadline& deadline, const std::string& ctx) {
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  for (;;) {
    int found = 0;
    MT_SIM_MPI(ctx, MPI_Improbe(source, tag, comm, &found, &message, &status));
    if (found) break;
    if (deadline.passed()) return false;
    pause_between_polls();
  }
  int n = 0;
  MT_SIM_MPI(ctx, MPI_Get_count(&status, MPI_BYTE, &n));
  bytes.assign(size_t(n), 0);
  *from = status.MPI_SOURCE;
  // Matched: its sender has sent it and is polling, so the rest of it comes without waiting on anyone.
  MT_SIM_MPI(ctx, MPI_Mrecv(bytes.data(), n, MPI_BYTE, &message, MPI_STATUS_IGNORE));
  return true;
}


bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);  // both may be called before MPI_Init and after MPI_Finalize
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void require_mpi(const std::string& what) {
  if (mpi_running()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  throw Failure(ncclInvalidUsage,
                format("%s: MPI is %s; the simulated NCCL runs communicators of more than one rank over MPI, which "
                       "the program initialises (World) before its first NCCL call and finalises after its last (a "
                       "communicator of one rank needs none)",
                       what.c_str(), finalized ? "already finalised" : "not initialised"));
}

int world_rank() {
  int r = 0;
  if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  if (mpi_running()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

namespace {

// --- MpiLinks: two or more ranks, over MPI ---------------------------------------------------------

// How a request that a timeout interrupted is left: a receive not yet matched is cancelled; a send or
// a matched receive is freed (MPI finishes it on its own); a collective's cannot be freed and is kept.
// Their buffers live on with the communicator, since MPI may still use them.
enum class Leave { cancel, free, keep };

void abandon_request(ncclComm& c, MPI_Request& r, Leave how, std::vector<std::shared_ptr<void>> buffers) {
  if (r != MPI_REQUEST_NULL && how == Leave::cancel) {
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  } else if (r != MPI_REQUEST_NULL && how == Leave::free) {
    MPI_Request_free(&r);
  }
  r = MPI_REQUEST_NULL;
  for (auto& b : buffers) c.abandoned.push_back(std::move(b));
}

class MpiLinks final : public Links {
 public:
  // Takes over `data` (its error handler already returns codes) and duplicates it twice.
  MpiLinks(MPI_Comm data, const std::string& ctx) : data_(data) {
    MT_SIM_MPI(ctx, MPI_Comm_dup(data, &p2p_));
    MT_SIM_MPI(ctx, MPI_Comm_dup(data, &agree_));
  }

  void require(const char* call) const override { require_mpi(call); }

  std::vector<Descriptor> descriptors(ncclComm& c, const Descriptor& mine, const std::string& ctx,
                                      const Deadline& deadline) override {
    auto all = std::make_shared<std::vector<Descriptor>>(size_t(c.size));
    auto out = std::make_shared<Descriptor>(mine);
    (*all)[size_t(c.rank)] = mine;
    // Receives first (cancellable on a timeout), then sends: one of each per peer.
    std::vector<MPI_Request> r;
    std::vector<int> from;
    for (int p = 0; p < c.size; p++) {
      if (p == c.rank) continue;
      r.push_back(MPI_REQUEST_NULL);
      from.push_back(p);
      MT_SIM_MPI(ctx, MPI_Irecv(&(*all)[size_t(p)], int(sizeof(Descriptor)), MPI_BYTE, p, 0, agree_, &r.back()));
    }
    const size_t receives = r.size();
    for (int p = 0; p < c.size; p++) {
      if (p == c.rank) continue;
      r.push_back(MPI_REQUEST_NULL);
      MT_SIM_MPI(ctx, MPI_Isend(out.get(), int(sizeof(Descriptor)), MPI_BYTE, p, 0, agree_, &r.back()));
    }
    if (poll(r, deadline, ctx)) return *all;
    std::vector<int> missing;
    for (size_t i = 0; i < receives; i++)
      if (r[i] != MPI_REQUEST_NULL) missing.push_back(from[i]);
    for (size_t i = 0; i < r.size(); i++) abandon_request(c, r[i], i < receives ? Leave::cancel : Leave::free, {});
    c.abandoned.push_back(all);
    c.abandoned.push_back(out);
    if (missing.empty())
      throw Failure(ncclSystemError, format("%s: timed out after %g s at collective #%llu: every rank's descriptor "
                                            "arrived, but this rank's has not been taken by every peer",
                                            ctx.c_str(), deadline.seconds(), (unsigned long long)mine.number));
    throw Failure(ncclSystemError,
                  format("%s: timed out after %g s at collective #%llu: %s %s not called it", ctx.c_str(),
                         deadline.seconds(), (unsigned long long)mine.number, ranks_text(c, missing).c_str(),
                         missing.size() == 1 ? "has" : "have"));
  }

  void move(ncclComm& c, Move how, const Buffer& in, const Buffer& out, size_t bytes, int root, uint64_t number,
            const Deadline& deadline, const std::string& ctx) override {
    const int b = int(bytes);
    MPI_Request r = MPI_REQUEST_NULL;
    switch (how) {
      case Move::gather:
        MT_SIM_MPI(ctx, MPI_Iallgather(in->data(), b, MPI_BYTE, out->data(), b, MPI_BYTE, data_, &r));
        break;
      case Move::exchange:
        MT_SIM_MPI(ctx, MPI_Ialltoall(in->data(), b, MPI_BYTE, out->data(), b, MPI_BYTE, data_, &r));
        break;
      case Move::broadcast: MT_SIM_MPI(ctx, MPI_Ibcast(in->data(), b, MPI_BYTE, root, data_, &r)); break;
    }
    // Every rank agreed to the collective, so only a rank that stopped since delays its data.
    std::vector<MPI_Request> one{r};
    if (poll(one, deadline, ctx)) return;
    abandon_request(c, one[0], Leave::keep, {in, out});
    throw Failure(ncclSystemError, format("%s: timed out after %g s in the data of collective #%llu: every rank "
                                          "agreed to it, but not every rank delivered its data",
                                          ctx.c_str(), deadline.seconds(), (unsigned long long)number));
  }

  // Sends are synchronous: complete only once the receive has matched them, as NCCL's.
  void post(const std::vector<Message*>& mine) override {
    for (Message* m : mine)
      if (m->call->kind == Kind::send)
        MT_SIM_MPI(context(*m->call), MPI_Issend(m->data->data(), int(m->bytes), MPI_BYTE, m->call->root, 0, p2p_, &m->request));
  }

  // One step: receives probe for their message (in issue order per peer: messages between two ranks
  // match in the order they were sent, MPI's non-overtaking rule), every request is tested.
  Progress progress(const std::vector<Message*>& mine, const std::string& ctx) override {
    std::set<int> waiting;  // peers with an earlier receive unmatched
    bool all = true;
    for (Message* m : mine) {
      if (m->done) continue;
      const int peer = m->call->root;
      if (m->call->kind == Kind::recv && !m->matched) {
        if (!waiting.count(peer)) {
          int found = 0;
          MPI_Message probe = MPI_MESSAGE_NULL;
          MPI_Status status;
          MT_SIM_MPI(ctx, MPI_Improbe(peer, 0, p2p_, &found, &probe, &status));
          if (found) {
            MT_SIM_MPI(ctx, MPI_Get_count(&status, MPI_BYTE, &m->arrived));
            m->data = std::make_shared<std::vector<unsigned char>>(size_t(m->arrived));
            MT_SIM_MPI(ctx, MPI_Imrecv(m->data->data(), m->arrived, MPI_BYTE, &probe, &m->request));
            m->matched = true;
          }
        }
        if (!m->matched) {
          waiting.insert(peer);
          all = false;
          continue;
        }
      }
      int done = 0;
      MT_SIM_MPI(ctx, MPI_Test(&m->request, &done, MPI_STATUS_IGNORE));
      m->done = done != 0;
      if (!m->done) all = false;
    }
    return all ? Progress::done : Progress::waiting;
  }

  void abandon(ncclComm& c, Message& m) override { abandon_request(c, m.request, Leave::free, {m.data}); }

  std::optional<Members> split(int color, int key, const std::string& ctx) override {
    MPI_Comm data = MPI_COMM_NULL;
    MT_SIM_MPI(ctx, MPI_Comm_split(data_, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &data));
    if (data == MPI_COMM_NULL) return std::nullopt;
    return members(data, ctx);
  }

  void release(const ncclComm& c, const std::string& ctx) override {
    if (c.async != ncclSuccess || !mpi_running()) return;
    for (MPI_Comm* m : {&data_, &p2p_, &agree_})
      if (*m != MPI_COMM_NULL) MT_SIM_MPI(ctx, MPI_Comm_free(m));
  }

 private:
  MPI_Comm data_ = MPI_COMM_NULL;   // the collectives' data; ncclCommSplit splits it
  MPI_Comm p2p_ = MPI_COMM_NULL;    // ncclSend/ncclRecv
  MPI_Comm agree_ = MPI_COMM_NULL;  // the descriptors compared before each collective
};

// --- SelfLinks: one rank, within the process -------------------------------------------------------

class SelfLinks final : public Links {
 public:
  void require(const char*) const override {}

  std::vector<Descriptor> descriptors(ncclComm&, const Descriptor& mine, const std::string&,
                                      const Deadline&) override {
    return {mine};
  }

  // The one rank's data is all there is: a gather or an exchange is a copy, a broadcast from itself
  // leaves it as it is.
  void move(ncclComm&, Move how, const Buffer& in, const Buffer& out, size_t bytes, int, uint64_t, const Deadline&,
            const std::string&) override {
    if (how != Move::broadcast) std::memcpy(out->data(), in->data(), bytes);
  }

  // The k-th send (to rank 0, itself) meets the k-th receive (from rank 0), as NCCL matches a peer's
  // messages in issue order. What is left unmatched has no other call to meet: Progress::never.
  void post(const std::vector<Message*>& mine) override {
    std::vector<Message*> sends, receives;
    for (Message* m : mine) (m->call->kind == Kind::send ? sends : receives).push_back(m);
    for (size_t k = 0; k < sends.size() && k < receives.size(); k++) {
      Message &s = *sends[k], &r = *receives[k];
      r.data = s.data;
      r.arrived = int(s.bytes);
      r.matched = r.done = s.done = true;
    }
  }

  Progress progress(const std::vector<Message*>& mine, const std::string&) override {
    for (const Message* m : mine)
      if (!m->done) return Progress::never;
    return Progress::done;
  }

  void abandon(ncclComm&, Message&) override {}

  std::optional<Members> split(int color, int, const std::string&) override {
    if (color == NCCL_SPLIT_NOCOLOR) return std::nullopt;
    return alone();
  }

  void release(const ncclComm&, const std::string&) override {}
};

}  // namespace

Members alone() {
  Members m;
  m.world_ranks = {world_rank()};
  m.links = std::make_unique<SelfLinks>();
  return m;
}

Members members(MPI_Comm data, const std::string& ctx) {
  // Failures come back as codes, to be reported as NCCL's; the duplicates inherit the handler.
  MT_SIM_MPI(ctx, MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  MT_SIM_MPI(ctx, MPI_Comm_rank(data, &rank));
  MT_SIM_MPI(ctx, MPI_Comm_size(data, &size));
  if (size == 1) {
    MT_SIM_MPI(ctx, MPI_Comm_free(&data));
    return alone();
  }
  Members m;
  m.rank = rank;
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MT_SIM_MPI(ctx, MPI_Comm_group(data, &mine));
  MT_SIM_MPI(ctx, MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; r++) ranks[size_t(r)] = r;
  m.world_ranks.resize(size_t(size));
  MT_SIM_MPI(ctx, MPI_Group_translate_ranks(mine, size, ranks.data(), world, m.world_ranks.data()));
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  m.links = std::make_unique<MpiLinks>(data, ctx);
  return m;
}

ncclComm* make_comm(Members m, int number) {
  auto c = std::make_unique<ncclComm>();
  c->number = number;
  c->rank = m.rank;
  c->size = int(m.world_ranks.size());
  c->world_ranks = std::move(m.world_ranks);
  c->links = std::move(m.links);
  c->name = format("comm#%d (%d rank%s, rank %d)", number, c->size, c->size == 1 ? "" : "s", c->rank);
  State& s = state();
  std::lock_guard lock(s.mutex);
  ncclComm* p = c.get();
  s.comms[p] = std::move(c);
  return p;
}

}  // namespace mt::sim::nccl
