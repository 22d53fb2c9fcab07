// The NCCL stand-in's API: NCCL's calls, extern "C" with nccl.h's signatures, over MPI, on the
// simulated device. Built as mt_sim_nccl (with MPI only); a program links it in place of libnccl. A
// communicator of one rank needs no MPI: a program that never initialises it runs one as real NCCL
// does in a single process (its collectives are copies, its sends go to itself).
//
// Each call first checks what NCCL leaves unchecked: buffers are live device memory over their whole
// extent, the stream is live, datatype and op are simulated (float32, bfloat16, float16, int32, uint8;
// sum, avg, max), ranks are in range, in-place buffers sit where NCCL expects them. A failed check
// returns NCCL's code at once and prints one line; nothing runs.
//
// When the work runs: at issue, in its stream's order (sim::run_now). The device's streams are lazy
// (work runs when something waits), but a peer process cannot wait for this host to come back later,
// so each call (each group, at the outermost ncclGroupEnd) runs its stream up to itself and then
// communicates, before it returns. The data it reads is what the work ordered before it produced, so a
// missing cudaStreamWaitEvent still reads stale data. The price: a host that issues a send blocks
// until the peer issues the receive, stricter than the hardware, where only the stream waits.
//
// A failure inside that work (a timeout, collectives that differ across ranks, a receive of the wrong
// size) prints one line, returns NCCL's code, sets the communicator's async error, and fails the
// device's work, so the device's error is sticky too (until cudaDeviceReset), as after a fault.
#include <algorithm>
#include <cstring>
#include <optional>

#include "sim/nccl_hold.h"
#include "sim/nccl_state.h"
#include "sim/sim.h"

namespace mt::sim::nccl {
namespace {

// Runs a stand-in's body; a Failure it throws is reported and becomes the return code.
template <class F>
ncclResult_t guarded(F&& body) {
  try {
    return body();
  } catch (const Failure& f) {
    return report(f);
  } catch (const std::bad_alloc&) {
    return report(Failure(ncclSystemError, "host memory exhausted"));
  }
}

// The record behind a handle this process made (destroyed or not).
ncclComm& known(const ncclComm* comm, const char* call) {
  if (!comm) throw Failure(ncclInvalidArgument, format("%s: comm is null", call));
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.comms.find(comm);
  if (it == s.comms.end())
    throw Failure(ncclInvalidArgument,
                  format("%s: comm %p was not made by ncclCommInitRank or ncclCommSplit", call, (const void*)comm));
  return *it->second;
}

// A communicator not destroyed nor aborted.
ncclComm& existing(const ncclComm* comm, const char* call) {
  ncclComm& c = known(comm, call);
  if (c.life == ncclComm::Life::destroyed)
    throw Failure(ncclInvalidUsage, format("%s: %s was destroyed (ncclCommDestroy)", call, c.name.c_str()));
  if (c.life == ncclComm::Life::aborted)
    throw Failure(ncclInvalidUsage, format("%s: %s was aborted (ncclCommAbort)", call, c.name.c_str()));
  return c;
}

// A communicator that can communicate: not finalized, and no failure so far.
ncclComm& usable(const ncclComm* comm, const char* call) {
  ncclComm& c = existing(comm, call);
  if (c.life == ncclComm::Life::finalized)
    throw Failure(ncclInvalidUsage,
                  format("%s: %s was finalized (ncclCommFinalize): only ncclCommDestroy may follow", call, c.name.c_str()));
  if (c.async != ncclSuccess)
    throw Failure(c.async, format("%s: %s failed earlier (%s); abort it (ncclCommAbort)", call, c.name.c_str(),
                                  c.failure.c_str()));
  return c;
}

bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return na && nb && x < y + nb && y < x + na;
}

void require_buffer(const void* p, size_t bytes, const char* call, const char* what) {
  if (bytes == 0) return;
  try {
    require_device(p, bytes, call, what);
  } catch (const CudaError& e) {
    throw Failure(ncclInvalidArgument, e.what());
  }
}

// Checks that the stream is live and the device has not failed.
void require_stream(cudaStream_t s, const char* call) {
  try {
    run_now(s, call, nullptr);
  } catch (const CudaError& e) {
    throw Failure(e.code() == cudaErrorInvalidResourceHandle ? ncclInvalidArgument : ncclUnhandledCudaError, e.what());
  }
}

// The checks of one call at issue (NCCL's and those NCCL lacks).
void check(const Call& c) {
  const char* name = call_name(c.kind);
  const ncclComm& comm = *c.comm;
  const size_t size = type_size(c.type);
  if (size == 0)
    throw Failure(ncclInvalidArgument, format("%s: datatype %s is not simulated (float32, bfloat16, float16, int32 "
                                              "and uint8 are)",
                                              name, type_name(c.type).c_str()));
  const bool reduces = c.kind == Kind::all_reduce || c.kind == Kind::reduce_scatter;
  if (reduces && c.op != ncclSum && c.op != ncclAvg && c.op != ncclMax)
    throw Failure(ncclInvalidArgument,
                  format("%s: op %s is not simulated (sum, avg and max are)", name, op_name(c.op).c_str()));
  if ((c.kind == Kind::broadcast || c.kind == Kind::send || c.kind == Kind::recv) &&
      (c.root < 0 || c.root >= comm.size))
    throw Failure(ncclInvalidArgument, format("%s: %s %d is not a rank of %s", name,
                                              c.kind == Kind::broadcast ? "root" : "peer", c.root, comm.name.c_str()));
  const size_t b = c.count * size, n = size_t(comm.size);
  if (c.count > size_t(INT32_MAX) / size || (c.kind == Kind::reduce_scatter && b > size_t(INT32_MAX) / n))
    throw Failure(ncclInvalidArgument,
                  format("%s: count=%zu %s is more than the simulated NCCL moves in one MPI message (2^31-1 bytes)",
                         name, c.count, type_name(c.type).c_str()));
  const size_t rank_off = size_t(comm.rank) * b;
  switch (c.kind) {
    case Kind::all_reduce:
      require_buffer(c.send, b, name, "sendbuff");
      require_buffer(c.recv, b, name, "recvbuff");
      if (c.send != c.recv && overlap(c.send, b, c.recv, b))
        throw Failure(ncclInvalidArgument, format("%s: sendbuff and recvbuff overlap without being equal (in place "
                                                  "needs sendbuff == recvbuff)",
                                                  name));
      break;
    case Kind::reduce_scatter:
      require_buffer(c.send, n * b, name, "sendbuff");
      require_buffer(c.recv, b, name, "recvbuff");
      if (c.recv != static_cast<const char*>(c.send) + rank_off && overlap(c.send, n * b, c.recv, b))
        throw Failure(ncclInvalidArgument, format("%s: recvbuff overlaps sendbuff but is not rank %d's chunk (in place "
                                                  "needs recvbuff == sendbuff + %d * recvcount)",
                                                  name, comm.rank, comm.rank));
      break;
    case Kind::all_gather:
      require_buffer(c.send, b, name, "sendbuff");
      require_buffer(c.recv, n * b, name, "recvbuff");
      if (c.send != static_cast<const char*>(c.recv) + rank_off && overlap(c.send, b, c.recv, n * b))
        throw Failure(ncclInvalidArgument, format("%s: sendbuff overlaps recvbuff but is not rank %d's slot (in place "
                                                  "needs sendbuff == recvbuff + %d * sendcount)",
                                                  name, comm.rank, comm.rank));
      break;
    case Kind::broadcast:
      if (comm.rank == c.root) require_buffer(c.send, b, name, "sendbuff");  // read on the root only
      require_buffer(c.recv, b, name, "recvbuff");
      if (comm.rank == c.root && c.send != c.recv && overlap(c.send, b, c.recv, b))
        throw Failure(ncclInvalidArgument, format("%s: sendbuff and recvbuff overlap without being equal", name));
      break;
    case Kind::send: require_buffer(c.send, b, name, "sendbuff"); break;
    case Kind::recv: require_buffer(c.recv, b, name, "recvbuff"); break;
    case Kind::split: break;
  }
  require_stream(c.stream, name);
}

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "an unknown ncclResult_t";
  }
}

// True when this launch is the one a test holds (hold_launch); counts it either way.
bool held_launch() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return ++s.launches == s.hold;
}

// Runs calls (one, or a group's) at once, in their streams' order: every stream the calls use runs up
// to now, then the last one runs the calls as its work. A held launch communicates nothing and queues
// work that stays held until one of its communicators is aborted.
ncclResult_t run(const std::vector<Call>& calls) {
  const double timeout = timeout_seconds();
  std::vector<cudaStream_t> streams;
  for (const Call& c : calls)
    if (std::find(streams.begin(), streams.end(), c.stream) == streams.end()) streams.push_back(c.stream);
  const std::string what = calls.size() == 1 ? context(calls[0]) : format("ncclGroupEnd (%zu calls)", calls.size());
  if (held_launch()) {
    auto released = std::make_shared<std::atomic<bool>>(false);
    for (const Call& c : calls) c.comm->held.push_back(released);
    try {
      enqueue_held(streams.back(), what + " (held: its peers never arrive)", [released] { return released->load(); });
    } catch (const CudaError& e) {
      throw Failure(ncclUnhandledCudaError, what + ": the simulated device failed: " + e.what());
    }
    return ncclSuccess;
  }
  std::optional<ncclResult_t> failed;
  try {
    for (size_t i = 0; i + 1 < streams.size(); i++) run_now(streams[i], what + ": the group's other streams", [] {});
    run_now(streams.back(), what, [&] {
      try {
        run_calls(calls, timeout);
      } catch (const Failure& f) {
        failed = report(f);
        throw CudaError(cudaErrorLaunchFailure, format("the NCCL call failed with %s", result_name(f.code())));
      }
    });
  } catch (const CudaError& e) {
    if (failed) return *failed;  // reported inside the work
    throw Failure(ncclUnhandledCudaError, what + ": the simulated device failed: " + e.what());
  }
  return ncclSuccess;
}

// A collective, send or receive: checked now, run now or at the outermost ncclGroupEnd.
ncclResult_t issue(Call c) {
  ThreadState& t = this_thread();
  const ncclResult_t rc = guarded([&] {
    c.comm = &usable(c.comm, call_name(c.kind));
    c.comm->links->require(call_name(c.kind));
    check(c);
    connect(*c.comm, c);
    if (t.group_depth > 0) {
      t.group.push_back(c);
      return ncclSuccess;
    }
    return run({c});
  });
  if (rc != ncclSuccess && t.group_depth > 0 && t.group_error == ncclSuccess) t.group_error = rc;
  return rc;
}

// ncclCommSplit's config: only NCCL_CONFIG_INITIALIZER's values are simulated.
void check_config(const ncclConfig_t* config) {
  if (!config) return;
  const ncclConfig_t d = NCCL_CONFIG_INITIALIZER;
  auto field = [](const char* name, long long got, long long want) {
    if (got == want) return;
    const std::string w = want == NCCL_CONFIG_UNDEF_INT ? "NCCL_CONFIG_UNDEF_INT" : std::to_string(want);
    throw Failure(ncclInvalidArgument,
                  format("ncclCommSplit: config->%s = %lld is not simulated (only NCCL_CONFIG_INITIALIZER's value, "
                         "%s, is)",
                         name, got, w.c_str()));
  };
  field("size", (long long)config->size, (long long)d.size);
  field("magic", config->magic, d.magic);
  field("version", config->version, d.version);
  field("blocking", config->blocking, d.blocking);
  field("cgaClusterSize", config->cgaClusterSize, d.cgaClusterSize);
  field("minCTAs", config->minCTAs, d.minCTAs);
  field("maxCTAs", config->maxCTAs, d.maxCTAs);
  if (config->netName) throw Failure(ncclInvalidArgument, "ncclCommSplit: config->netName is set; not simulated");
  field("splitShare", config->splitShare, d.splitShare);
  field("trafficClass", config->trafficClass, d.trafficClass);
  if (config->commName) throw Failure(ncclInvalidArgument, "ncclCommSplit: config->commName is set; not simulated");
  field("collnetEnable", config->collnetEnable, d.collnetEnable);
  field("CTAPolicy", config->CTAPolicy, d.CTAPolicy);
  field("shrinkShare", config->shrinkShare, d.shrinkShare);
  field("nvlsCTAs", config->nvlsCTAs, d.nvlsCTAs);
  field("nChannelsPerNetPeer", config->nChannelsPerNetPeer, d.nChannelsPerNetPeer);
  field("nvlinkCentricSched", config->nvlinkCentricSched, d.nvlinkCentricSched);
}

}  // namespace
}  // namespace mt::sim::nccl

using namespace mt::sim::nccl;

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guarded([&] {
    if (!uniqueId) throw Failure(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
    get_unique_id(uniqueId);
    return ncclSuccess;
  });
}

// Collective over the id's holders (none but this one for one rank); runs at once, inside a group too
// (one device per process here).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return guarded([&] {
    if (!comm) throw Failure(ncclInvalidArgument, "ncclCommInitRank: comm is null");
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks)
      throw Failure(ncclInvalidArgument, format("ncclCommInitRank: rank %d of nranks %d", rank, nranks));
    *comm = init_rank(nranks, commId, rank);
    return ncclSuccess;
  });
}

// Collective over the parent, agreed like a collective (a split against another call fails); runs at once.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  return guarded([&] {
    if (!newcomm) throw Failure(ncclInvalidArgument, "ncclCommSplit: newcomm is null");
    *newcomm = nullptr;
    ncclComm& parent = usable(comm, "ncclCommSplit");
    parent.links->require("ncclCommSplit");
    check_config(config);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      throw Failure(ncclInvalidArgument,
                    format("ncclCommSplit: color %d (a color is >= 0, or NCCL_SPLIT_NOCOLOR)", color));
    timeout_seconds();  // a bad value fails here, before the parent takes part
    try {
      *newcomm = split(parent, color, key);
    } catch (const Failure& f) {
      parent.async = f.code();  // the ranks are out of step now
      parent.failure = f.what();
      throw;
    }
    return ncclSuccess;
  });
}

// Releases nothing collectively, so it returns at once whatever the peers do; the links (MPI
// communicators) are left allocated.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  return guarded([&] {
    ncclComm& c = existing(comm, "ncclCommAbort");
    c.life = ncclComm::Life::aborted;
    for (const auto& h : c.held) h->store(true);  // NCCL's abort ends the kernels that wait for peers
    return ncclSuccess;
  });
}

// Every call completed at issue, so there is nothing left to flush.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guarded([&] {
    ncclComm& c = usable(comm, "ncclCommFinalize");
    c.life = ncclComm::Life::finalized;
    return ncclSuccess;
  });
}

// Frees the links (MPI communicators; those of one rank hold none), unless a failure left requests on
// them (those are left as they are).
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  return guarded([&] {
    ncclComm& c = existing(comm, "ncclCommDestroy");
    c.links->release(c, "ncclCommDestroy on " + c.name);
    c.life = ncclComm::Life::destroyed;
    return ncclSuccess;
  });
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded([&] {
    const ncclComm& c = existing(comm, "ncclCommUserRank");
    if (!rank) throw Failure(ncclInvalidArgument, "ncclCommUserRank: rank is null");
    *rank = c.rank;
    return ncclSuccess;
  });
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return guarded([&] {
    const ncclComm& c = existing(comm, "ncclCommCount");
    if (!count) throw Failure(ncclInvalidArgument, "ncclCommCount: count is null");
    *count = c.size;
    return ncclSuccess;
  });
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guarded([&] {
    const ncclComm& c = existing(comm, "ncclCommGetAsyncError");
    if (!asyncError) throw Failure(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is null");
    *asyncError = c.async;
    return ncclSuccess;
  });
}

// NCCL's own strings.
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// The calling thread's last failure line ("" if none), whatever the communicator.
const char* ncclGetLastError(ncclComm_t) { return this_thread().last_error.c_str(); }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue({Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return issue({Kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue({Kind::all_gather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue({Kind::broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream});
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue({Kind::send, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue({Kind::recv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclGroupStart() {
  this_thread().group_depth++;
  return ncclSuccess;
}

// The outermost one runs the group's calls together: sends and receives all posted, collectives in
// issue order. If a call of the group failed its checks, none runs (peers waiting for them time out).
ncclResult_t ncclGroupEnd() {
  ThreadState& t = this_thread();
  return guarded([&] {
    if (t.group_depth == 0) throw Failure(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t.group_depth > 0) return ncclSuccess;
    std::vector<Call> calls = std::move(t.group);
    t.group.clear();
    const ncclResult_t earlier = t.group_error;
    t.group_error = ncclSuccess;
    if (earlier != ncclSuccess)
      throw Failure(earlier, format("ncclGroupEnd: a call of the group failed its checks (%s), so none of the %zu "
                                    "that passed them ran",
                                    result_name(earlier), calls.size()));
    if (calls.empty()) return ncclSuccess;
    for (Call& c : calls) usable(c.comm, "ncclGroupEnd").links->require("ncclGroupEnd");  // none gone meanwhile
    return run(calls);
  });
}

namespace mt::sim::nccl {

uint64_t launches() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.launches;
}

void hold_launch(uint64_t number) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.hold = number;
}

}  // namespace mt::sim::nccl
