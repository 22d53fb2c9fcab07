#ifdef MT_HAVE_MPI
#include "parallel/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <exception>
#include <functional>
#include <vector>

#include "parallel/host_reduce.h"

namespace mt::parallel {

namespace detail {
void throw_mpi(int code, const char* stmt, const char* file, int line) {
  char reason[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, reason, &len) != MPI_SUCCESS) reason[0] = 0;
  throw CommFailure(strfmt("MPI error %d (%s) in `%s` at %s:%d", code, reason, stmt, file, line));
}
}  // namespace detail

namespace {

// Reductions never use these types (host_reduce does the arithmetic); they only move elements.
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

}  // namespace

// One op in flight. Phase 1 is started when the op is created; `after_phase1` runs once its
// requests complete (the local reduction); all_reduce then queues for phase 2 (see the header).
class MpiOp final : public PendingOp {
 public:
  enum class Stage { phase1, queued, phase2, done };

  explicit MpiOp(MpiComm* comm) : comm_(comm) {}
  ~MpiOp() override {
    std::erase(comm_->queue_, this);
    if (scratch) comm_->keep_scratch(std::move(scratch));
  }

  bool test() override {
    if (stage == Stage::phase1) {
      if (!test_requests()) return false;
      finish_phase1();
    }
    if (stage == Stage::queued) {
      comm_->start_queued();
      if (stage == Stage::queued) return false;
    }
    if (stage == Stage::phase2) {
      if (!test_requests()) return false;
      stage = Stage::done;
    }
    return true;
  }

  // Never MPI_Wait: polled under the communicator's wait policy (Comm wraps every op the same way).
  void wait() override { comm_->wait_on_peers([this] { return test(); }, "mpi op", 0); }

  bool test_requests() {
    int flag = 0;
    MT_MPI_CHECK(MPI_Testall(2, req, &flag, MPI_STATUSES_IGNORE));
    return flag != 0;
  }
  void finish_phase1() {
    if (after_phase1) after_phase1();
    stage = start_phase2 ? Stage::queued : Stage::done;
  }
  void begin_phase2() {
    start_phase2(&req[0]);
    stage = Stage::phase2;
  }

  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::vector<int> counts[4];  // counts and displacements MPI reads until the op completes
  Buffer scratch;
  std::function<void()> after_phase1;
  std::function<void(MPI_Request*)> start_phase2;
  Stage stage = Stage::phase1;

 private:
  MpiComm* comm_;
};

static int comm_rank(MPI_Comm c) {
  int r = 0;
  MT_MPI_CHECK(MPI_Comm_rank(c, &r));
  return r;
}

static int comm_size(MPI_Comm c) {
  int n = 0;
  MT_MPI_CHECK(MPI_Comm_size(c, &n));
  return n;
}

MpiComm::MpiComm(MPI_Comm comm, std::string name, Arena* arena)
    : Comm(comm_rank(comm), comm_size(comm), Device::cpu, std::move(name)), arena_(arena) {
  if (!arena_) {
    own_arena_ = std::make_unique<Arena>();
    arena_ = own_arena_.get();
  }
  MT_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MT_MPI_CHECK(MPI_Comm_dup(comm, &comm2_));
  // Errors come back as codes and become exceptions with our context, instead of MPI's own abort.
  MT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MT_MPI_CHECK(MPI_Comm_set_errhandler(comm2_, MPI_ERRORS_RETURN));
}

MpiComm::~MpiComm() {
  // While an exception unwinds, ops may have been abandoned in flight: leave the communicators to
  // the job abort rather than free them under MPI's feet.
  if (std::uncaught_exceptions() > 0 || !queue_.empty()) return;
  MPI_Comm_free(&comm2_);
  MPI_Comm_free(&comm_);
}

Buffer MpiComm::take_scratch(size_t bytes) {
  if (bytes == 0) return {};
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it)
    if (it->bytes() >= bytes && (best == spare_.end() || it->bytes() < best->bytes())) best = it;
  if (best != spare_.end()) {
    Buffer b = std::move(*best);
    spare_.erase(best);
    return b;
  }
  Buffer b = arena_->alloc(MemCategory::comm, bytes);
  scratch_bytes_ += b.bytes();
  return b;
}

void MpiComm::keep_scratch(Buffer b) {
  spare_.push_back(std::move(b));
  if (spare_.size() <= kSpareScratch) return;
  auto smallest = std::min_element(spare_.begin(), spare_.end(),
                                   [](const Buffer& x, const Buffer& y) { return x.bytes() < y.bytes(); });
  scratch_bytes_ -= smallest->bytes();
  spare_.erase(smallest);
}

void MpiComm::trim_scratch() {
  for (const Buffer& b : spare_) scratch_bytes_ -= b.bytes();
  spare_.clear();
}

int MpiComm::to_int(size_t n, const char* what) const {
  MT_CHECK(n <= size_t(INT_MAX), "%s on '%s': %zu elements exceed MPI's int count limit; split the buffer", what,
           name().c_str(), n);
  return int(n);
}

void MpiComm::start_queued() {
  while (!queue_.empty()) {
    MpiOp* op = queue_.front();
    if (op->stage == MpiOp::Stage::phase1) {
      if (!op->test_requests()) return;
      op->finish_phase1();
    }
    queue_.pop_front();
    op->begin_phase2();
  }
}

CommHandle MpiComm::do_all_reduce(void* buf, size_t count, DType t, ReduceOp rop) {
  const int n = size(), r = rank();
  if (n == 1) return {};
  const size_t b = dtype_size(t), own = chunk_size(count, n, r);
  to_int(count, "all_reduce");
  auto op = std::make_unique<MpiOp>(this);
  MpiOp* raw = op.get();
  for (auto& v : op->counts) v.resize(size_t(n));
  auto &send_counts = op->counts[0], &send_displs = op->counts[1];
  auto &recv_counts = op->counts[2], &recv_displs = op->counts[3];
  for (int j = 0; j < n; j++) {
    send_counts[size_t(j)] = int(chunk_size(count, n, j));
    send_displs[size_t(j)] = int(chunk_offset(count, n, j));
    recv_counts[size_t(j)] = int(own);
    recv_displs[size_t(j)] = int(size_t(j) * own);
  }
  op->scratch = take_scratch(size_t(n) * own * b);
  const MPI_Datatype mt = mpi_type(t);
  // Phase 1: every rank receives every rank's copy of its own chunk (a reduce-scatter's traffic).
  MT_MPI_CHECK(MPI_Ialltoallv(buf, send_counts.data(), send_displs.data(), mt, op->scratch.data(),
                              recv_counts.data(), recv_displs.data(), mt, comm_, &op->req[0]));
  char* own_chunk = static_cast<char*>(buf) + chunk_offset(count, n, r) * b;
  op->after_phase1 = [raw, own_chunk, n, own, t, rop] {
    if (own > 0) reduce_blocks(own_chunk, raw->scratch.data(), n, own, t, rop);
  };
  // Phase 2: the reduced chunks are gathered in place, each rank contributing its own.
  op->start_phase2 = [this, raw, buf, mt](MPI_Request* req) {
    MT_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, raw->counts[0].data(),
                                 raw->counts[1].data(), mt, comm2_, req));
  };
  queue_.push_back(raw);
  return CommHandle(std::move(op));
}

CommHandle MpiComm::do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp rop) {
  const int n = size();
  const size_t b = dtype_size(t);
  if (n == 1) {
    if (send != recv) std::copy_n(static_cast<const char*>(send), recv_count * b, static_cast<char*>(recv));
    return {};
  }
  to_int(recv_count * size_t(n), "reduce_scatter");
  auto op = std::make_unique<MpiOp>(this);
  MpiOp* raw = op.get();
  op->scratch = take_scratch(size_t(n) * recv_count * b);
  const MPI_Datatype mt = mpi_type(t);
  int c = int(recv_count);
  MT_MPI_CHECK(MPI_Ialltoall(send, c, mt, op->scratch.data(), c, mt, comm_, &op->req[0]));
  op->after_phase1 = [raw, recv, n, recv_count, t, rop] {
    reduce_blocks(recv, raw->scratch.data(), n, recv_count, t, rop);
  };
  return CommHandle(std::move(op));
}

CommHandle MpiComm::do_all_gather(const void* send, void* recv, size_t send_count, DType t) {
  const size_t b = dtype_size(t);
  to_int(send_count * size_t(size()), "all_gather");
  const bool in_place = static_cast<const char*>(send) == static_cast<char*>(recv) + size_t(rank()) * send_count * b;
  auto op = std::make_unique<MpiOp>(this);
  const MPI_Datatype mt = mpi_type(t);
  int c = int(send_count);
  MT_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, c, mt, recv, c, mt, comm_, &op->req[0]));
  return CommHandle(std::move(op));
}

CommHandle MpiComm::do_all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                                    std::span<const size_t> recv_counts, DType t) {
  const int n = size();
  auto op = std::make_unique<MpiOp>(this);
  for (auto& v : op->counts) v.resize(size_t(n));
  size_t send_total = 0, recv_total = 0;
  for (size_t j = 0; j < size_t(n); j++) {
    op->counts[0][j] = to_int(send_counts[j], "all_to_all_v");
    op->counts[1][j] = to_int(send_total, "all_to_all_v");
    op->counts[2][j] = to_int(recv_counts[j], "all_to_all_v");
    op->counts[3][j] = to_int(recv_total, "all_to_all_v");
    send_total += send_counts[j];
    recv_total += recv_counts[j];
  }
  const MPI_Datatype mt = mpi_type(t);
  MT_MPI_CHECK(MPI_Ialltoallv(send, op->counts[0].data(), op->counts[1].data(), mt, recv, op->counts[2].data(),
                              op->counts[3].data(), mt, comm_, &op->req[0]));
  return CommHandle(std::move(op));
}

CommHandle MpiComm::do_broadcast(void* buf, size_t count, DType t, int root) {
  if (size() == 1) return {};
  auto op = std::make_unique<MpiOp>(this);
  MT_MPI_CHECK(MPI_Ibcast(buf, to_int(count, "broadcast"), mpi_type(t), root, comm_, &op->req[0]));
  return CommHandle(std::move(op));
}

CommHandle MpiComm::do_send_recv(const void* send_buf, size_t send_count, int dst, void* recv_buf,
                                 size_t recv_count, int src, DType t, int tag) {
  auto op = std::make_unique<MpiOp>(this);
  const MPI_Datatype mt = mpi_type(t);
  if (dst >= 0)
    MT_MPI_CHECK(MPI_Isend(send_buf, to_int(send_count, "send"), mt, dst, tag, comm_, &op->req[0]));
  if (src >= 0)
    MT_MPI_CHECK(MPI_Irecv(recv_buf, to_int(recv_count, "recv"), mt, src, tag, comm_, &op->req[1]));
  return CommHandle(std::move(op));
}

CommHandle MpiComm::do_barrier() {
  auto op = std::make_unique<MpiOp>(this);
  MT_MPI_CHECK(MPI_Ibarrier(comm_, &op->req[0]));
  return CommHandle(std::move(op));
}

std::unique_ptr<Comm> MpiComm::do_split(int color, int key, const std::string& name, Arena* scratch) {
  // MPI_Comm_split (and the MPI_Comm_dups of the new communicator) have no nonblocking form: a
  // barrier under the wait policy first, so that a rank that never arrives is a timeout, not a hang.
  MPI_Request arrived = MPI_REQUEST_NULL;
  MT_MPI_CHECK(MPI_Ibarrier(comm_, &arrived));
  const uint64_t seq = record_issue("split", 0);
  wait_on_peers([&] {
    int flag = 0;
    MT_MPI_CHECK(MPI_Test(&arrived, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }, "split", seq);
  record_end(seq);
  MPI_Comm sub = MPI_COMM_NULL;
  MT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  // A child outlives nothing of ours except a caller-owned arena.
  auto child = std::make_unique<MpiComm>(sub, name, scratch ? scratch : (own_arena_ ? nullptr : arena_));
  MT_MPI_CHECK(MPI_Comm_free(&sub));
  return child;
}

}  // namespace mt::parallel
#endif  // MT_HAVE_MPI
