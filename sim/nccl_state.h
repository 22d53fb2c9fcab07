// The NCCL stand-in's state and the pieces its files share; for sim/nccl*.cpp only.
//
// The stand-in runs NCCL's calls on the simulated device, through sim/sim.h alone (run_now,
// require_device): it needs no more of the device than any other library would. Its communicators
// reach each other over MPI, except one of one rank, which reaches no one and needs no MPI (Links).
//
// Who holds what:
//   State        what a vendor library holds process-wide: the unique-id counter, the lower bound of
//                the next communicator number, and every communicator ever made (never freed, so a
//                use after ncclCommDestroy is recognised and named). One object, reached through
//                state(), behind one lock.
//   ThreadState  what NCCL holds per host thread: the group being collected between ncclGroupStart
//                and ncclGroupEnd, and the last failure line (ncclGetLastError).
//   ncclComm     per communicator: its links, its number and name for messages, its members' world
//                ranks, its collective and point-to-point counters, its lazy connections, its
//                async error.
//   Links        per communicator: how its ranks reach each other (MPI, or nothing for one rank).
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only; the deprecated C++ bindings need another library
#endif
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/sim.h"

struct ncclComm;  // the handle type nccl.h declares without a body; defined below

namespace mt::sim::nccl {

// What the stand-in's checks throw: NCCL's code and the one line that names the call and the cause.
class Failure : public std::runtime_error {
 public:
  Failure(ncclResult_t code, const std::string& line) : std::runtime_error(line), code_(code) {}
  ncclResult_t code() const { return code_; }

 private:
  ncclResult_t code_;
};

using mt::sim::format;  // sim/sim.h

// Deadlines of every wait: now + MT_SIM_NCCL_TIMEOUT seconds (default 60), read when a call (a group,
// at its end) starts running.
// Throws Failure (ncclInvalidArgument, naming the variable) unless it is a number of seconds > 0.
double timeout_seconds();
class Deadline {
 public:
  explicit Deadline(double seconds);
  bool passed() const;
  double seconds() const { return seconds_; }

 private:
  double seconds_;
  std::chrono::steady_clock::time_point end_;
};

// One call as the API received it, run at once or at the outermost ncclGroupEnd.
enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, split };
struct Call {
  Kind kind = Kind::all_reduce;
  const void* send = nullptr;  // sendbuff
  void* recv = nullptr;        // recvbuff
  size_t count = 0;            // NCCL's count argument (reduce-scatter: recvcount; all-gather: sendcount)
  ncclDataType_t type = ncclUint8;
  ncclRedOp_t op = ncclSum;
  int root = 0;                // broadcast: the root; send/recv: the peer
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
};

// Host copies of device bytes; shared, so that a request a timeout abandons keeps its buffer.
using Buffer = std::shared_ptr<std::vector<unsigned char>>;

// The agreement before a collective (sim/nccl_run.cpp): every rank's descriptor of the call, compared.
// Fields past `root` travel along without being compared (a split's color and key, and each rank's
// next communicator number).
struct Descriptor {
  uint64_t magic = 0;
  uint64_t number = 0;  // this collective's number on its communicator: 1 for the first
  uint64_t count = 0;
  int32_t kind = 0, type = 0, op = 0, root = 0;
  int64_t color = 0, key = 0, next_number = 0;
};

// One send or receive of a call or group, on its way.
struct Message {
  const Call* call = nullptr;
  size_t bytes = 0;
  uint64_t number = 0;  // the communicator's messages so far, this one included
  Buffer data;          // a send: what it sends; a receive: what arrived
  MPI_Request request = MPI_REQUEST_NULL;
  bool matched = false;  // a receive: its message has been found and is arriving
  int arrived = 0;       // a receive: the bytes the sender sent
  bool done = false;
};

// A collective's data movement, `bytes` per rank (Links::move):
//   gather     out = every rank's `in`, in rank order (n * bytes)
//   exchange   out = chunk <this rank> of every rank's `in` (n chunks of `bytes`), in rank order
//   broadcast  `in` (bytes) becomes the root's, in place; out is unused
enum class Move { gather, exchange, broadcast };
// Where a call's or group's sends and receives stand: all done, some to wait for, or some that
// cannot complete whatever the wait (nothing outside this call or group can take part in them).
enum class Progress { done, waiting, never };

struct Members;

// How a communicator's ranks reach each other. Everything a communicator sends or receives goes
// through its links; what is sent, and what is done with what arrives (agreement, reductions,
// matching, checks, messages), is one code path whatever the links (sim/nccl_run.cpp). Two kinds,
// chosen once, where a communicator is made (members() and alone(), sim/nccl_common.cpp):
//   MpiLinks   two or more ranks: three MPI communicators of the members, so that traffic of one kind
//              never matches another's (collective data, sends and receives, the agreement's
//              descriptors). Needs MPI initialised.
//   SelfLinks  one rank, as real NCCL runs one in a single process: nothing leaves the process, and MPI
//              need not be initialised. The collectives' data is its own; a send to itself meets a
//              receive from itself of the same call or group (the k-th send the k-th receive).
class Links {
 public:
  virtual ~Links() = default;
  // Throws Failure (ncclInvalidUsage) naming `call` unless the links can carry it now (MpiLinks: MPI
  // is initialised and not finalised).
  virtual void require(const char* call) const = 0;
  // The agreement's exchange: every rank's descriptor in rank order, `mine` at c.rank. A timeout
  // throws Failure naming the ranks that have not called the collective.
  virtual std::vector<Descriptor> descriptors(ncclComm& c, const Descriptor& mine, const std::string& ctx,
                                              const Deadline& deadline) = 0;
  // A collective's data (Move), waited for; a timeout throws Failure naming collective #number.
  virtual void move(ncclComm& c, Move how, const Buffer& in, const Buffer& out, size_t bytes, int root,
                    uint64_t number, const Deadline& deadline, const std::string& ctx) = 0;
  // This communicator's sends and receives of one call or group, in issue order: post starts them (a
  // send's bytes are in its data); progress advances them (a receive's message arrives in its data,
  // `arrived` bytes); abandon leaves an unfinished one after a failure, its buffer kept alive by c.
  virtual void post(const std::vector<Message*>& mine) = 0;
  virtual Progress progress(const std::vector<Message*>& mine, const std::string& ctx) = 0;
  virtual void abandon(ncclComm& c, Message& m) = 0;
  // ncclCommSplit after the agreement: this member's part of the communicator of its color, or none
  // for NCCL_SPLIT_NOCOLOR. Collective over the parent.
  virtual std::optional<Members> split(int color, int key, const std::string& ctx) = 0;
  // ncclCommDestroy: frees what the links hold, unless a failure (c.async) left requests on them.
  virtual void release(const ncclComm& c, const std::string& ctx) = 0;
};

// A new communicator from one member's view: its rank, every member's world rank, and its links.
struct Members {
  int rank = 0;
  std::vector<int> world_ranks;  // MPI_COMM_WORLD rank of each rank (0 in a process without MPI)
  std::unique_ptr<Links> links;
};

}  // namespace mt::sim::nccl

struct ncclComm {
  int number = 0;                  // comm#<number>: the same on every member
  int rank = 0, size = 0;
  std::string name;                // "comm#3 (4 ranks, rank 1)"
  std::vector<int> world_ranks;    // MPI_COMM_WORLD rank of each rank
  std::unique_ptr<mt::sim::nccl::Links> links;
  uint64_t collectives = 0;        // collectives (and splits) run so far: the next one's number - 1
  uint64_t messages = 0;           // sends and receives run so far
  // NCCL's lazy connections (sim/nccl_connections.h), recorded by connect(): the collectives' ring,
  // and the peers (ranks here) of its point-to-point connections.
  bool ring = false;
  std::set<int> peers;
  enum class Life { live, finalized, destroyed, aborted } life = Life::live;
  ncclResult_t async = ncclSuccess;  // a failure inside device work; sticks (ncclCommGetAsyncError)
  std::string failure;               // its line
  // Buffers of MPI requests abandoned by a timeout: MPI may still write or read them, so they live as
  // long as the communicator's record does (for ever).
  std::vector<std::shared_ptr<void>> abandoned;
  // Its launches held on the device (sim/nccl_hold.h): each released by ncclCommAbort.
  std::vector<std::shared_ptr<std::atomic<bool>>> held;
};

namespace mt::sim::nccl {

struct State {
  std::mutex mutex;
  uint64_t ids = 0;      // ncclGetUniqueId calls so far
  int next_number = 0;   // no communicator this process joins later has a smaller number
  std::map<const ncclComm*, std::unique_ptr<ncclComm>> comms;
  uint64_t launches = 0;  // ungrouped calls and outermost groups run so far (sim/nccl_hold.h)
  uint64_t hold = 0;      // the launch to hold (0: none)
};
State& state();  // the one State, never destroyed

const char* call_name(Kind k);  // "ncclAllReduce"
std::string type_name(ncclDataType_t t);  // "float32", or the enum's name for those not simulated
size_t type_size(ncclDataType_t t);       // 0 for those not simulated
std::string op_name(ncclRedOp_t op);      // "sum", or the enum's name for those not simulated
// "ncclAllReduce count=1024 float32 sum", "ncclSend count=7 int32 to rank 1".
std::string describe(const Call& c);
// "ncclAllReduce count=1024 float32 sum on comm#3 (2 ranks, rank 0)": a call's prefix in messages.
std::string context(const Call& c);

struct ThreadState {
  int group_depth = 0;
  std::vector<Call> group;                 // collected since the outermost ncclGroupStart
  ncclResult_t group_error = ncclSuccess;  // a collected call failed its checks: the group fails
  std::string last_error;                  // ncclGetLastError
};
ThreadState& this_thread();

// Records a failure as the thread's last error and prints its line ("minitrain-sim: ..."); returns
// its code: how a stand-in fails.
ncclResult_t report(const Failure& f);

// A short sleep between polls, so that ranks sharing a core can run.
void pause_between_polls();

// Tests every request until all are complete (true; each is then MPI_REQUEST_NULL) or the deadline
// passes (false; the incomplete ones are left as they are).
bool poll(std::vector<MPI_Request>& requests, const Deadline& deadline, const std::string& ctx);
// Receives the next message from `source` (or MPI_ANY_SOURCE) with `tag` on `comm`, whatever its
// size, into `bytes`, and says who sent it; false if none arrived before the deadline.
bool receive_any_size(int source, int tag, MPI_Comm comm, std::vector<unsigned char>& bytes, int* from,
                      const Deadline& deadline, const std::string& ctx);

// Throws Failure (ncclSystemError) "<ctx>: <stmt> failed: <MPI's reason>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const std::string& ctx, const char* stmt);
#define MT_SIM_MPI(ctx, stmt) ::mt::sim::nccl::check_mpi((stmt), (ctx), #stmt)

// Whether MPI is initialised and not yet finalised.
bool mpi_running();
// Throws Failure (ncclInvalidUsage), its line starting with `what`, unless mpi_running().
void require_mpi(const std::string& what);
// This process in MPI_COMM_WORLD: its rank and the job's size; 0 and 1 unless mpi_running().
int world_rank();
int world_size();

// The two kinds of Links, and the one place that picks them: alone() is a communicator of one rank
// (SelfLinks); members() takes over `data`, an MPI communicator just made, and gives the members of
// two or more ranks MpiLinks, one rank alone() (freeing `data`: a one-rank communicator is the same
// whether MPI made it or not).
Members alone();
Members members(MPI_Comm data, const std::string& ctx);
// Registers comm#<number> of these members and returns it.
ncclComm* make_comm(Members m, int number);

// The bootstrap (sim/nccl_bootstrap.cpp).
void get_unique_id(ncclUniqueId* id);
ncclComm* init_rank(int nranks, const ncclUniqueId& id, int rank);
ncclComm* split(ncclComm& parent, int color, int key);
// Records the connection a call (checked, about to run) makes on first use: its communicator's ring
// for a collective, its peer for a send or receive (sim/nccl_connections.h).
void connect(ncclComm& c, const Call& call);

// Runs calls (one, or a group's; inside device work, sim/nccl_run.cpp): posts the sends, runs each
// collective (agreement, then data) in issue order, then waits for the sends and receives and checks
// the receives' sizes. Throws Failure, after setting the async error of every communicator the calls
// use (their ranks are out of step now).
void run_calls(const std::vector<Call>& calls, double timeout);

// The agreement before a collective (sim/nccl_run.cpp): every rank's descriptor, through the links,
// compared; throws Failure naming each rank's call if they differ. Returns every rank's descriptor.
std::vector<Descriptor> agree(ncclComm& c, const Descriptor& mine, const std::string& ctx, const Deadline& deadline);
Descriptor descriptor_of(const Call& c);  // its number is left to the caller

// rank(s) in messages: "rank 1 (world rank 3)".
std::string ranks_text(const ncclComm& c, const std::vector<int>& ranks);

}  // namespace mt::sim::nccl
