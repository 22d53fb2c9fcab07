// Comm: a communicator over a group of ranks, the only way code above kernels/ talks to other ranks.
//
// One interface, three backends:
//   SelfComm  (self_comm.h)  one rank, no MPI: every collective is a copy or a no-op;
//   MpiComm   (mpi_comm.h)   host buffers, nonblocking MPI; the reference backend on CPU nodes;
//   NcclComm  (nccl_comm.h)  device buffers, NCCL on a communication stream.
// Buffers are (pointer, element count, DType) and live where device() says.
//
// Every operation has a blocking form and an `_async` form returning a CommHandle. A buffer handed
// to an async op is "in flight" until the handle completes (wait() returns or test() returns true):
// the caller must not read or write it before then. Every wait on peers runs under the communicator's
// WaitPolicy (below): a deadline (dist.timeout) ending in PeerTimeoutError, a pause instead of a busy
// core, a flight record per op (flight_recorder.h). Collectives must be issued in the same order on
// every rank of a communicator (the MPI and NCCL rule); the backends keep that true internally even
// when handles are completed out of order.
//
// Collective pairs (Megatron-Core's convention; each forward op names its backward twin):
//   all_gather <-> reduce_scatter,   identity <-> all_reduce,   all_to_all_v <-> all_to_all_v
//   (with send and receive counts swapped),   broadcast <-> reduce to root (not needed so far).
//
// Reductions (sum, avg, max) are deterministic and give bitwise-identical results on every rank.
// bf16/f16 values are widened to fp32, reduced in fp32, and rounded to bf16/f16 once at the end
// (host backends; see parallel/host_reduce.h for the exact order). i32 sums wrap modulo 2^32; avg is
// not defined for i32; u16 (token ids) is data-movement only.
//
// Byte counters. For every op kind a Comm counts calls and two byte figures for THIS rank:
//   payload_bytes  the size of the logical tensor handed to the op (below, b = dtype_size);
//   sent_bytes     bytes this rank sends under a bandwidth-optimal (ring/pairwise) algorithm, the
//                  figure that "bytes on the wire per step" and the theoretical minimum are compared in.
// With N ranks, rank r, and chunk(c, N, r) the r-th of N near-equal parts of c elements (the first
// c mod N parts one element longer):
//   op               payload_bytes          sent_bytes
//   all_reduce(c)    c b                    (c - chunk_r + (N-1) chunk_r) b  = 2(N-1)/N c b when N | c
//                                           (reduce-scatter then all-gather, Patarasuk & Yuan 2009)
//   reduce_scatter   N c_out b (input)      (N-1) c_out b
//   all_gather       N c_in b  (output)     (N-1) c_in b
//   all_to_all_v     sum_j send_j b         sum_{j != r} send_j b
//   broadcast(c)     c b                    c b on every rank but the last of the ring that starts
//                                           at root, 0 there (pipelined ring: (N-1) c b in total)
//   send / recv      c b                    send: c b;  recv: 0
//   barrier          0                      0
// These are counted when an op is started, from its arguments alone, so they are identical for every
// backend and can be checked against the formulas in tests.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "runtime/arena.h"
#include "runtime/check.h"
#include "parallel/flight_recorder.h"
#include "runtime/dtype.h"
#include "runtime/exit_status.h"
#include "runtime/tensor.h"
#include "runtime/trace.h"

namespace mt::parallel {

enum class ReduceOp : uint8_t { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

enum class CommOp : uint8_t { all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send, recv, barrier };
constexpr int kNumCommOps = 8;
const char* comm_op_name(CommOp op);

struct CommOpCount {
  uint64_t calls = 0;
  uint64_t payload_bytes = 0;
  uint64_t sent_bytes = 0;
};

struct CommCounters {
  std::array<CommOpCount, kNumCommOps> ops{};
  CommOpCount& operator[](CommOp op) { return ops[size_t(op)]; }
  const CommOpCount& operator[](CommOp op) const { return ops[size_t(op)]; }
  uint64_t total_sent_bytes() const;
  uint64_t total_payload_bytes() const;
  CommCounters& operator+=(const CommCounters& o);  // op by op
};
// {"all_reduce": {"calls": N, "sent_bytes": B}, ...} for every op called: what the planner predicts
// and what a run logs (metrics.jsonl's comm_*), in one form so that the two compare key for key.
nlohmann::json counters_json(const CommCounters& c);

// The i-th of n near-equal parts of `count` elements: the first count % n parts are one longer.
size_t chunk_size(size_t count, int n, int i);
size_t chunk_offset(size_t count, int n, int i);

// The sent_bytes formulas of the table above, for rank `rank` of `n`, elements of `elem_bytes` bytes.
uint64_t all_reduce_sent_bytes(size_t count, size_t elem_bytes, int n, int rank);
uint64_t broadcast_sent_bytes(size_t count, size_t elem_bytes, int n, int rank, int root);

// An error that every rank of a communicator raises at the same point with the same cause (a config
// that differs between ranks, a bad layout): the launcher prints it once, from rank 0, and ends the
// process with `exit_status` (1 unless the cause calls for another, e.g. a diverged run).
class CollectiveError : public Error {
 public:
  explicit CollectiveError(const std::string& what, int exit_status = 1) : Error(what), exit_status_(exit_status) {}
  int exit_status() const { return exit_status_; }

 private:
  int exit_status_;
};

// A wait on peers that passed its communicator's timeout (WaitPolicy): a peer is hung, stopped or
// far too slow. Each rank whose wait expires raises its own, naming itself, the group, the op and
// its sequence number; the launcher prints every such line and ends the job with kExitHung (4), which
// a supervisor relaunches from the newest checkpoint (runtime/exit_status.h).
class PeerTimeoutError : public CollectiveError {
 public:
  PeerTimeoutError(const std::string& what, double timeout_s) : CollectiveError(what, kExitHung), timeout_s_(timeout_s) {}
  double timeout_s() const { return timeout_s_; }

 private:
  double timeout_s_;
};

// How a communicator waits on its peers. Every host wait (CommHandle::wait on a host communicator,
// the blocking forms, barrier; a device communicator's host synchronisations) polls the op, first
// busily for kSpinSeconds plus the time its bytes take at kSpinBytesPerSecond (a healthy op usually
// completes in that time, and MPI moves a message only while a rank is inside an MPI call, so a
// large one is polled at full rate for as long as it could still be moving on a loaded host: 100 MB/s
// is a tenth of a CPU node's memory-copy rate), then with a pause that
// grows with the time already waited (a tenth of it, from kMinPause to kMaxPause: completion is
// noticed at most ~10% late, and a rank waiting on a stopped peer wakes ~100 times a second, well
// under 1% of a core). A wait that has not completed after
// `timeout_s` marks its record timed_out, calls `on_timeout` (the trainer writes the flight records
// there and returns where, for the message) and throws PeerTimeoutError.
struct WaitPolicy {
  double timeout_s = 600;  // dist.timeout; as NCCL's watchdog in PyTorch
  std::function<std::string()> on_timeout;
  static constexpr double kSpinSeconds = 1e-3, kSpinBytesPerSecond = 1e8, kMinPause = 50e-6, kMaxPause = 10e-3;
};

// The wait loop of WaitPolicy: polls `done` (busily for the first `spin_s`) until it returns true
// (returns true) or `timeout_s` passes (returns false); *waited_s is the time it took.
bool poll_with_backoff(const std::function<bool()>& done, double timeout_s, double* waited_s,
                       double spin_s = WaitPolicy::kSpinSeconds);

// A communication call that failed (an MPI error: a peer that died, a broken link). Not a verdict on
// the run's options: `minitrain train` exits 1 for it, not kExitRefused, even before the first step,
// so that a supervisor relaunches the job.
class CommFailure : public Error {
 public:
  using Error::Error;
};

// An error whose cause lies on another rank, which reports that cause itself (a save that rank 0
// abandoned because of its own failed write; rank 0 giving up because another rank's write failed).
// The launcher lets the rank that failed end the job and prints this one only if that does not
// happen within a grace period, so that a job shows one error, the true one.
class FollowOnError : public Error {
 public:
  using Error::Error;
};

// A failure that ranks met each on its own in the same phase (a save's write: a full disk fails every
// rank's), agreed by a collective (raise_agreed_failure, launch.h) so that every rank raises it with
// the same text. The launcher prints it once, from reporter() (the lowest rank whose failure was its
// own), with that rank's prefix; the other ranks stay silent.
class AgreedError : public CollectiveError {
 public:
  AgreedError(const std::string& what, int exit_status, int reporter)
      : CollectiveError(what, exit_status), reporter_(reporter) {}
  int reporter() const { return reporter_; }

 private:
  int reporter_;
};

// One operation in flight, implemented by a backend.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual bool test() = 0;  // drives progress; true once complete
  virtual void wait() = 0;  // returns once complete
};

// The handle of an async op. Completion means: host backends, the result is in the buffer; device
// backends, the caller's compute stream is ordered after the op (no host synchronisation).
// The Comm must outlive the handles it returns. A handle that goes out of scope still pending waits
// for its op, because its buffers are in flight; during exception unwinding it abandons the op
// instead (the rank is about to abort, and waiting could hang on peers that will never arrive); a
// wait() that throws (a PeerTimeoutError) abandons its op the same way and leaves the handle done.
class CommHandle {
 public:
  CommHandle() = default;  // an already-complete handle
  explicit CommHandle(std::unique_ptr<PendingOp> op) : op_(std::move(op)) {}
  CommHandle(CommHandle&& o) noexcept = default;
  CommHandle& operator=(CommHandle&& o);  // completes the op this handle held first
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle();

  void wait();
  bool test();
  bool done() const { return op_ == nullptr; }

 private:
  std::unique_ptr<PendingOp> op_;
};

class Comm {
 public:
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  virtual ~Comm() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Device device() const { return device_; }  // where buffers must live
  const std::string& name() const { return name_; }  // "world", "tp", "dp", ... (for reports)

  const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = CommCounters{}; }

  // Waiting on peers (WaitPolicy above). Communicators split from this one, and device ones it
  // bootstraps, start with its policy.
  void set_wait_policy(WaitPolicy p) { policy_ = std::move(p); }
  const WaitPolicy& wait_policy() const { return policy_; }
  // Ends this communicator's work in flight that may wait forever for peers (NCCL: ncclCommAbort),
  // for a rank unwinding on an error before it joins threads that wait on the device. The
  // communicator is unusable afterwards. A host communicator has nothing of the kind.
  void abort_in_flight() { abandon(); }
  // Seconds this rank has spent blocked in waits on this communicator's peers, since it was built:
  // a step's time less these is its busy time (the straggler check, train/stragglers.h).
  double blocked_seconds() const { return blocked_s_; }
  const FlightRecorder& flight_recorder() const { return recorder_; }
  // A host wait for device work that may sit behind this communicator's kernels (a stream ordered
  // after one of its ops; parallel/mesh.h Mesh::until): polls `ready` and poll_failure under the wait
  // policy, recorded as op `what` (a string literal) in the flight record; on expiry as any wait on
  // peers: abandon (NCCL: ncclCommAbort), on_timeout, PeerTimeoutError naming `what`.
  void wait_for_device(const std::function<bool()>& ready, const char* what);
  // Throws when the backend knows that a peer failed (NCCL's async error). Host communicators find
  // failures inside their own waits: nothing to poll.
  virtual void poll_failure() {}

  // In place: buf (count) = op over ranks of buf.
  void all_reduce(void* buf, size_t count, DType t, ReduceOp op);
  CommHandle all_reduce_async(void* buf, size_t count, DType t, ReduceOp op);

  // recv (recv_count) = op over ranks of send[rank * recv_count, (rank+1) * recv_count);
  // send holds size() * recv_count elements. In place when recv == send + rank * recv_count
  // elements; otherwise the two must not overlap.
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op);
  CommHandle reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op);

  // recv (size() * send_count) = concatenation over ranks of send (send_count). In place when
  // send == recv + rank * send_count elements (the ZeRO case); otherwise the two must not overlap.
  void all_gather(const void* send, void* recv, size_t send_count, DType t);
  CommHandle all_gather_async(const void* send, void* recv, size_t send_count, DType t);

  // Packed all-to-all: send holds send_counts[0] elements for rank 0, then send_counts[1] for rank 1,
  // ...; recv receives recv_counts[j] elements from rank j in rank order. Both spans have size()
  // entries, and recv_counts[j] must equal rank j's send_counts[rank] (the caller exchanges counts
  // first, e.g. with an all_to_all_v of one i32 per rank). send and recv must not overlap.
  void all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                    std::span<const size_t> recv_counts, DType t);
  CommHandle all_to_all_v_async(const void* send, std::span<const size_t> send_counts, void* recv,
                                std::span<const size_t> recv_counts, DType t);

  // buf (count) on every rank = buf on root.
  void broadcast(void* buf, size_t count, DType t, int root);
  CommHandle broadcast_async(void* buf, size_t count, DType t, int root);

  // Point to point. Messages between a pair of ranks on one communicator match in issue order per
  // tag (NCCL has no tags: there the order alone matches them). A rank that both sends and
  // receives in the same step (pipeline steady state, ring attention) should use send_recv, which
  // cannot deadlock however the peers order their calls.
  void send(const void* buf, size_t count, DType t, int peer, int tag = 0);
  CommHandle send_async(const void* buf, size_t count, DType t, int peer, int tag = 0);
  void recv(void* buf, size_t count, DType t, int peer, int tag = 0);
  CommHandle recv_async(void* buf, size_t count, DType t, int peer, int tag = 0);
  void send_recv(const void* send_buf, size_t send_count, int dst, void* recv_buf, size_t recv_count, int src,
                 DType t, int tag = 0);
  CommHandle send_recv_async(const void* send_buf, size_t send_count, int dst, void* recv_buf, size_t recv_count,
                             int src, DType t, int tag = 0);

  void barrier();

  // Collective: the ranks passing the same color form a new communicator, ranked by key (ties by
  // this communicator's rank). color >= 0. The new communicator starts with zero counters.
  // `scratch`: the arena the new communicator takes its staging buffers from (counted under
  // MemCategory::comm; it must outlive the communicator); nullptr: as this communicator does.
  std::unique_ptr<Comm> split(int color, int key, const std::string& name, Arena* scratch = nullptr);

  // Every op from now on is a span on the trace's lane "comm <name>" while it records (nullptr: none).
  // Not inherited by split communicators.
  void set_trace(Trace* trace);

 protected:
  Comm(int rank, int size, Device device, std::string name);

  // Backend hooks, called after the arguments are validated and counted. For do_send_recv, a side
  // with peer < 0 is absent (a plain send or a plain recv).
  virtual CommHandle do_all_reduce(void* buf, size_t count, DType t, ReduceOp op) = 0;
  virtual CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) = 0;
  virtual CommHandle do_all_gather(const void* send, void* recv, size_t send_count, DType t) = 0;
  virtual CommHandle do_all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                                     std::span<const size_t> recv_counts, DType t) = 0;
  virtual CommHandle do_broadcast(void* buf, size_t count, DType t, int root) = 0;
  virtual CommHandle do_send_recv(const void* send_buf, size_t send_count, int dst, void* recv_buf,
                                  size_t recv_count, int src, DType t, int tag) = 0;
  virtual CommHandle do_barrier() = 0;
  virtual std::unique_ptr<Comm> do_split(int color, int key, const std::string& name, Arena* scratch) = 0;

  // Polls `done` until it returns true, under the wait policy: on expiry marks record `seq` (0: none)
  // timed out, calls abandon(), then the policy's on_timeout, and throws PeerTimeoutError naming the
  // op `what` ("all_reduce", "barrier", ...) and `seq`. The time spent counts as blocked. `bytes`:
  // the op's payload, which lengthens the busy polling (WaitPolicy).
  void wait_on_peers(const std::function<bool()>& done, const char* what, uint64_t seq, uint64_t bytes = 0);
  // A backend's cleanup before a timeout is thrown (NCCL: ncclCommAbort, so no kernel waits forever).
  virtual void abandon() {}
  // Records an op issued outside the public calls (a backend's own host wait, e.g. NCCL's barrier).
  uint64_t record_issue(const char* what, uint64_t bytes) { return recorder_.issue(what, bytes, -1, -1); }
  void record_end(uint64_t seq) { recorder_.end(seq, OpState::completed); }

 private:
  friend class WatchedOp;
  void tally(CommOp op, uint64_t payload, uint64_t sent);
  [[noreturn]] void time_out(const char* what, uint64_t seq, double waited);
  // Wraps an op in flight: recorded, its host wait under the policy, traced while the trace records.
  CommHandle watched(const char* what, uint64_t bytes, int dst, int src, CommHandle h);
  void check_reduce(DType t, ReduceOp op, const char* what) const;
  void check_peer(int peer, const char* what) const;

  int rank_;
  int size_;
  Device device_;
  std::string name_;
  CommCounters counters_;
  WaitPolicy policy_;
  FlightRecorder recorder_;
  double blocked_s_ = 0;
  Trace* trace_ = nullptr;
  int trace_lane_ = 0;
  Trace::Clock::time_point issued_{};
};

}  // namespace mt::parallel
