// The backend-independent half of Comm: argument checks, byte counters, handles.
#include "parallel/comm.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include <nlohmann/json.hpp>

namespace mt::parallel {

const char* reduce_op_name(ReduceOp op) {
  static const char* names[] = {"sum", "avg", "max"};
  return names[int(op)];
}

const char* comm_op_name(CommOp op) {
  static const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                "broadcast",  "send",           "recv",       "barrier"};
  return names[int(op)];
}

uint64_t CommCounters::total_sent_bytes() const {
  uint64_t s = 0;
  for (const auto& o : ops) s += o.sent_bytes;
  return s;
}

CommCounters& CommCounters::operator+=(const CommCounters& o) {
  for (size_t i = 0; i < ops.size(); i++) {
    ops[i].calls += o.ops[i].calls;
    ops[i].payload_bytes += o.ops[i].payload_bytes;
    ops[i].sent_bytes += o.ops[i].sent_bytes;
  }
  return *this;
}

nlohmann::json counters_json(const CommCounters& c) {
  nlohmann::json j = nlohmann::json::object();
  for (int op = 0; op < kNumCommOps; op++) {
    const CommOpCount& k = c[CommOp(op)];
    if (k.calls || k.sent_bytes) j[comm_op_name(CommOp(op))] = {{"calls", k.calls}, {"sent_bytes", k.sent_bytes}};
  }
  return j;
}

uint64_t CommCounters::total_payload_bytes() const {
  uint64_t s = 0;
  for (const auto& o : ops) s += o.payload_bytes;
  return s;
}

size_t chunk_size(size_t count, int n, int i) {
  size_t un = size_t(n), ui = size_t(i);
  return count / un + (ui < count % un ? 1 : 0);
}

size_t chunk_offset(size_t count, int n, int i) {
  size_t un = size_t(n), ui = size_t(i);
  size_t rem = count % un;
  return ui * (count / un) + (ui < rem ? ui : rem);
}

// Ring all-reduce = reduce-scatter (send every chunk but your own once) + all-gather (send your
// reduced chunk to the N-1 others); Patarasuk & Yuan 2009 show 2(N-1)/N x bytes is the minimum.
uint64_t all_reduce_sent_bytes(size_t count, size_t elem_bytes, int n, int rank) {
  if (n <= 1) return 0;
  uint64_t own = chunk_size(count, n, rank);
  return (uint64_t(count) - own + uint64_t(n - 1) * own) * elem_bytes;
}

uint64_t broadcast_sent_bytes(size_t count, size_t elem_bytes, int n, int rank, int root) {
  int pos = (rank - root + n) % n;  // position in the ring that starts at root
  return pos < n - 1 ? uint64_t(count) * elem_bytes : 0;
}

CommHandle& CommHandle::operator=(CommHandle&& o) {
  if (this != &o) {
    wait();
    op_ = std::move(o.op_);
  }
  return *this;
}

CommHandle::~CommHandle() {
  if (!op_) return;
  if (std::uncaught_exceptions() > 0) {
    // Abandon: the buffers and requests stay alive (leaked) so the backend never touches freed
    // memory; the launcher aborts the job right after unwinding.
    (void)op_.release();
    return;
  }
  try {
    op_->wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: a communication op failed while its handle was dropped: %s\n", e.what());
    std::fflush(stderr);
    std::terminate();
  }
}

void CommHandle::wait() {
  if (!op_) return;
  try {
    op_->wait();
  } catch (...) {
    (void)op_.release();  // abandoned as during unwinding: its op may never complete (a peer timed out)
    throw;
  }
  op_.reset();
}

bool CommHandle::test() {
  if (!op_) return true;
  if (!op_->test()) return false;
  op_.reset();
  return true;
}

Comm::Comm(int rank, int size, Device device, std::string name)
    : rank_(rank), size_(size), device_(device), name_(std::move(name)) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "communicator '%s': rank %d of size %d", name_.c_str(), rank, size);
}

// An op in flight as Comm hands it out: its flight record, its host wait under the wait policy, and
// its span (issue -> completion seen by the caller) on the trace when the trace recorded its issue.
class WatchedOp : public PendingOp {
 public:
  WatchedOp(Comm* comm, CommHandle inner, uint64_t seq, const char* what, uint64_t bytes)
      : comm_(comm), inner_(std::move(inner)), seq_(seq), what_(what), bytes_(bytes) {
    if (comm->trace_ && comm->trace_->recording()) traced_ = true, issued_ = comm->issued_;
  }
  bool test() override {
    if (!inner_.test()) return false;
    finish();
    return true;
  }
  void wait() override {
    if (comm_->device() == Device::cpu)
      comm_->wait_on_peers([this] { return inner_.test(); }, what_, seq_, bytes_);
    else
      inner_.wait();  // a device op: the compute stream is ordered after it, the host does not wait
    finish();
  }

 private:
  void finish() {
    if (finished_) return;
    finished_ = true;
    comm_->recorder_.end(seq_, OpState::completed);
    if (traced_)
      comm_->trace_->add(what_, "comm", comm_->trace_lane_, issued_, Trace::Clock::now(),
                         "{\"bytes\": " + std::to_string(bytes_) + "}");
  }
  Comm* comm_;
  CommHandle inner_;
  uint64_t seq_;
  const char* what_;
  uint64_t bytes_;
  bool traced_ = false, finished_ = false;
  Trace::Clock::time_point issued_{};
};

void Comm::set_trace(Trace* trace) {
  trace_ = trace;
  if (trace_) trace_lane_ = trace_->lane("comm " + name_);
}

CommHandle Comm::watched(const char* what, uint64_t bytes, int dst, int src, CommHandle h) {
  if (h.done()) return h;  // complete already (a one-rank group): no peers to wait for
  const uint64_t seq = recorder_.issue(what, bytes, dst, src);
  return CommHandle(std::make_unique<WatchedOp>(this, std::move(h), seq, what, bytes));
}

bool poll_with_backoff(const std::function<bool()>& done, double timeout_s, double* waited_s, double spin_s) {
  *waited_s = 0;
  if (done()) return true;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (;;) {
    const bool ok = done();
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    *waited_s = waited;
    if (ok) return true;
    if (waited >= timeout_s) return false;
    if (waited > spin_s)
      std::this_thread::sleep_for(
          std::chrono::duration<double>(std::clamp(waited / 10, WaitPolicy::kMinPause, WaitPolicy::kMaxPause)));
  }
}

void Comm::wait_on_peers(const std::function<bool()>& done, const char* what, uint64_t seq, uint64_t bytes) {
  double waited = 0;
  const double spin = WaitPolicy::kSpinSeconds + double(bytes) / WaitPolicy::kSpinBytesPerSecond;
  if (!poll_with_backoff(done, policy_.timeout_s, &waited, spin)) time_out(what, seq, waited);
  blocked_s_ += waited;
}

void Comm::wait_for_device(const std::function<bool()>& ready, const char* what) {
  const uint64_t seq = record_issue(what, 0);
  wait_on_peers(
      [&] {
        poll_failure();
        return ready();
      },
      what, seq);
  record_end(seq);
}

void Comm::time_out(const char* what, uint64_t seq, double waited) {
  std::string peers;
  for (const CommRecord& r : recorder_.records())
    if (r.seq == seq) {
      if (r.dst >= 0) peers += strfmt(" to rank %d", r.dst);
      if (r.src >= 0) peers += strfmt("%s from rank %d", r.dst >= 0 ? " and" : "", r.src);
    }
  if (seq) recorder_.end(seq, OpState::timed_out);
  abandon();
  std::string records;
  if (policy_.on_timeout) {
    try {
      records = "; " + policy_.on_timeout();
    } catch (const std::exception& e) {
      records = strfmt("; the flight records could not be written: %s", e.what());
    }
  }
  throw PeerTimeoutError(strfmt("hung: %s #%llu%s on group '%s' (rank %d of %d there) waited %.1f s for its peers "
                                "(dist.timeout=%g)%s",
                                what, (unsigned long long)seq, peers.c_str(), name_.c_str(), rank_, size_, waited,
                                policy_.timeout_s, records.c_str()),
                         policy_.timeout_s);
}

void Comm::tally(CommOp op, uint64_t payload, uint64_t sent) {
  if (trace_ && trace_->recording()) issued_ = Trace::Clock::now();  // the op's span starts here
  CommOpCount& c = counters_[op];
  c.calls++;
  c.payload_bytes += payload;
  c.sent_bytes += sent;
}

void Comm::check_reduce(DType t, ReduceOp op, const char* what) const {
  MT_CHECK(t != DType::u16, "%s on communicator '%s': u16 is data-movement only, it cannot be reduced", what,
           name_.c_str());
  MT_CHECK(!(t == DType::i32 && op == ReduceOp::avg), "%s on communicator '%s': avg is not defined for i32", what,
           name_.c_str());
}

void Comm::check_peer(int peer, const char* what) const {
  MT_CHECK(peer >= 0 && peer < size_, "%s on communicator '%s': rank %d is not in [0, %d)", what, name_.c_str(), peer,
           size_);
}

void Comm::all_reduce(void* buf, size_t count, DType t, ReduceOp op) { all_reduce_async(buf, count, t, op).wait(); }

CommHandle Comm::all_reduce_async(void* buf, size_t count, DType t, ReduceOp op) {
  check_reduce(t, op, "all_reduce");
  MT_CHECK(buf || count == 0, "all_reduce on '%s': null buffer", name_.c_str());
  size_t b = dtype_size(t);
  tally(CommOp::all_reduce, uint64_t(count) * b, all_reduce_sent_bytes(count, b, size_, rank_));
  if (count == 0) return {};
  return watched("all_reduce", uint64_t(count) * b, -1, -1, do_all_reduce(buf, count, t, op));
}

void Comm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) {
  reduce_scatter_async(send, recv, recv_count, t, op).wait();
}

CommHandle Comm::reduce_scatter_async(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) {
  check_reduce(t, op, "reduce_scatter");
  MT_CHECK((send && recv) || recv_count == 0, "reduce_scatter on '%s': null buffer", name_.c_str());
  uint64_t b = dtype_size(t);
  tally(CommOp::reduce_scatter, uint64_t(size_) * recv_count * b, uint64_t(size_ - 1) * recv_count * b);
  if (recv_count == 0) return {};
  return watched("reduce_scatter", uint64_t(size_) * recv_count * b, -1, -1, do_reduce_scatter(send, recv, recv_count, t, op));
}

void Comm::all_gather(const void* send, void* recv, size_t send_count, DType t) {
  all_gather_async(send, recv, send_count, t).wait();
}

CommHandle Comm::all_gather_async(const void* send, void* recv, size_t send_count, DType t) {
  MT_CHECK((send && recv) || send_count == 0, "all_gather on '%s': null buffer", name_.c_str());
  uint64_t b = dtype_size(t);
  tally(CommOp::all_gather, uint64_t(size_) * send_count * b, uint64_t(size_ - 1) * send_count * b);
  if (send_count == 0) return {};
  return watched("all_gather", uint64_t(size_) * send_count * b, -1, -1, do_all_gather(send, recv, send_count, t));
}

void Comm::all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                        std::span<const size_t> recv_counts, DType t) {
  all_to_all_v_async(send, send_counts, recv, recv_counts, t).wait();
}

CommHandle Comm::all_to_all_v_async(const void* send, std::span<const size_t> send_counts, void* recv,
                                    std::span<const size_t> recv_counts, DType t) {
  MT_CHECK(send_counts.size() == size_t(size_) && recv_counts.size() == size_t(size_),
           "all_to_all_v on '%s': %zu send and %zu receive counts for %d ranks", name_.c_str(), send_counts.size(),
           recv_counts.size(), size_);
  uint64_t b = dtype_size(t), total = 0, others = 0;
  for (int j = 0; j < size_; j++) {
    total += send_counts[size_t(j)];
    if (j != rank_) others += send_counts[size_t(j)];
  }
  tally(CommOp::all_to_all, total * b, others * b);
  // Never skipped when this rank moves nothing: the peers may still send to or expect from it.
  return watched("all_to_all_v", total * b, -1, -1, do_all_to_all_v(send, send_counts, recv, recv_counts, t));
}

void Comm::broadcast(void* buf, size_t count, DType t, int root) { broadcast_async(buf, count, t, root).wait(); }

CommHandle Comm::broadcast_async(void* buf, size_t count, DType t, int root) {
  check_peer(root, "broadcast root");
  MT_CHECK(buf || count == 0, "broadcast on '%s': null buffer", name_.c_str());
  size_t b = dtype_size(t);
  tally(CommOp::broadcast, uint64_t(count) * b, broadcast_sent_bytes(count, b, size_, rank_, root));
  if (count == 0) return {};
  return watched("broadcast", uint64_t(count) * b, -1, -1, do_broadcast(buf, count, t, root));
}

void Comm::send(const void* buf, size_t count, DType t, int peer, int tag) {
  send_async(buf, count, t, peer, tag).wait();
}

CommHandle Comm::send_async(const void* buf, size_t count, DType t, int peer, int tag) {
  return send_recv_async(buf, count, peer, nullptr, 0, -1, t, tag);
}

void Comm::recv(void* buf, size_t count, DType t, int peer, int tag) { recv_async(buf, count, t, peer, tag).wait(); }

CommHandle Comm::recv_async(void* buf, size_t count, DType t, int peer, int tag) {
  return send_recv_async(nullptr, 0, -1, buf, count, peer, t, tag);
}

void Comm::send_recv(const void* send_buf, size_t send_count, int dst, void* recv_buf, size_t recv_count, int src,
                     DType t, int tag) {
  send_recv_async(send_buf, send_count, dst, recv_buf, recv_count, src, t, tag).wait();
}

CommHandle Comm::send_recv_async(const void* send_buf, size_t send_count, int dst, void* recv_buf, size_t recv_count,
                                 int src, DType t, int tag) {
  MT_CHECK(tag >= 0, "point-to-point on '%s': tag %d is negative", name_.c_str(), tag);
  uint64_t b = dtype_size(t);
  if (dst >= 0) {
    check_peer(dst, "send");
    MT_CHECK(send_buf || send_count == 0, "send on '%s': null buffer", name_.c_str());
    tally(CommOp::send, send_count * b, send_count * b);
  }
  if (src >= 0) {
    check_peer(src, "recv");
    MT_CHECK(recv_buf || recv_count == 0, "recv on '%s': null buffer", name_.c_str());
    tally(CommOp::recv, recv_count * b, 0);
  }
  if (dst < 0 && src < 0) return {};
  const char* what = dst >= 0 && src >= 0 ? "send_recv" : dst >= 0 ? "send" : "recv";
  return watched(what, (send_count + recv_count) * b, dst, src, do_send_recv(send_buf, send_count, dst, recv_buf, recv_count, src, t, tag));
}

void Comm::barrier() {
  tally(CommOp::barrier, 0, 0);
  watched("barrier", 0, -1, -1, do_barrier()).wait();
}

std::unique_ptr<Comm> Comm::split(int color, int key, const std::string& name, Arena* scratch) {
  MT_CHECK(color >= 0, "split of '%s' into '%s': color %d is negative", name_.c_str(), name.c_str(), color);
  std::unique_ptr<Comm> child = do_split(color, key, name, scratch);
  child->policy_ = policy_;
  return child;
}

}  // namespace mt::parallel
