#ifdef MT_HAVE_NCCL
#include "parallel/nccl_comm.h"

#include <exception>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace mt::parallel {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::u16: break;  // data movement only: moved as bytes
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;  // NCCL >= 2.10: divides by the rank count after summing
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

// One op on the comm stream, complete when `done` has fired.
class NcclOp final : public PendingOp {
 public:
  NcclOp(ncclComm_t comm, cudaStream_t compute, cudaEvent_t done) : comm_(comm), compute_(compute), done_(done) {}
  ~NcclOp() override { cudaEventDestroy(done_); }  // safe while pending: released when it fires

  bool test() override {
    cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) {
      // "Not ready" is no failure, but the runtime may still record it as the thread's last error,
      // which the next launch check (cudaGetLastError) would then report against an unrelated
      // kernel: clear it. (Every launch is checked at once, so no real error is pending here.)
      (void)cudaGetLastError();
      // A peer that died leaves NCCL waiting forever; the async error turns that into an exception.
      ncclResult_t async = ncclSuccess;
      MT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      MT_NCCL_CHECK(async);
      return false;
    }
    MT_CUDA_CHECK(e);
    wait();
    return true;
  }

  void wait() override { MT_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0)); }

 private:
  ncclComm_t comm_;
  cudaStream_t compute_;
  cudaEvent_t done_;
};

int nccl_rank(ncclComm_t c) {
  int r = 0;
  MT_NCCL_CHECK(ncclCommUserRank(c, &r));
  return r;
}

int nccl_size(ncclComm_t c) {
  int n = 0;
  MT_NCCL_CHECK(ncclCommCount(c, &n));
  return n;
}

}  // namespace

NcclComm::NcclComm(Comm& bootstrap, cudaStream_t compute_stream, std::string name, bool wide_sums)
    : Comm(bootstrap.rank(), bootstrap.size(), Device::cuda, std::move(name)),
      compute_(compute_stream),
      wide_sums_(wide_sums) {
  MT_CHECK(bootstrap.device() == Device::cpu, "NcclComm '%s' needs a host communicator to exchange its id",
           this->name().c_str());
  ncclUniqueId id{};
  static_assert(sizeof(id) % 4 == 0, "the NCCL id is broadcast as 32-bit words");
  set_wait_policy(bootstrap.wait_policy());
  if (bootstrap.rank() == 0) MT_NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.broadcast(&id, sizeof(id) / 4, DType::i32, 0);
  MT_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
  init_streams();
}

NcclComm::NcclComm(ncclComm_t comm, int rank, int size, cudaStream_t compute_stream, std::string name)
    : Comm(rank, size, Device::cuda, std::move(name)), comm_(comm), compute_(compute_stream) {
  init_streams();
}

void NcclComm::init_streams() {
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&idle_, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(int)));
  MT_CUDA_CHECK(cudaMemsetAsync(barrier_word_, 0, sizeof(int), stream_));  // in the order the barrier runs
}

NcclComm::~NcclComm() {
  if (comm_) {
    // The stream's last work is waited for under the wait policy (never cudaStreamSynchronize, which
    // a peer that never arrives would block forever); peers that may never arrive (an exception is
    // unwinding), an NCCL error or the deadline: abort instead of finalising.
    bool idle = false;
    if (std::uncaught_exceptions() == 0) {
      try {
        double waited = 0;
        MT_CUDA_CHECK(cudaEventRecord(idle_, stream_));
        idle = poll_with_backoff([this] { return fired(idle_); }, wait_policy().timeout_s, &waited);
      } catch (const std::exception&) {
        idle = false;
      }
    }
    if (idle) {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (barrier_word_) cudaFree(barrier_word_);
  if (idle_) cudaEventDestroy(idle_);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclComm::begin() {
  MT_CUDA_CHECK(cudaEventRecord(ready_, compute_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
}

CommHandle NcclComm::end() {
  cudaEvent_t done = nullptr;
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  cudaError_t e = cudaEventRecord(done, stream_);
  if (e != cudaSuccess) cudaEventDestroy(done);
  MT_CUDA_CHECK(e);
  return CommHandle(std::make_unique<NcclOp>(comm_, compute_, done));
}

CommHandle NcclComm::wide_reduce(const void* send, void* recv, size_t out, DType t, ReduceOp op, bool scatter) {
  const size_t in = scatter ? out * size_t(size()) : out;
  const ops::Ctx on_comm{Device::cuda, stream_};
  begin();
  float* wide = nullptr;  // stream-ordered: freed after the work queued before it
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&wide), in * sizeof(float), stream_));
  if (t == DType::bf16) cuda::convert(wide, static_cast<const bf16*>(send), int64_t(in), on_comm);
  else cuda::convert(wide, static_cast<const f16*>(send), int64_t(in), on_comm);
  float* sum = scatter ? wide + size_t(rank()) * out : wide;  // NCCL's in-place reduce-scatter slot
  if (scatter) MT_NCCL_CHECK(ncclReduceScatter(wide, sum, out, ncclFloat32, nccl_op(op), comm_, stream_));
  else MT_NCCL_CHECK(ncclAllReduce(wide, wide, out, ncclFloat32, nccl_op(op), comm_, stream_));
  if (t == DType::bf16) cuda::convert(static_cast<bf16*>(recv), sum, int64_t(out), on_comm);
  else cuda::convert(static_cast<f16*>(recv), sum, int64_t(out), on_comm);
  MT_CUDA_CHECK(cudaFreeAsync(wide, stream_));
  return end();
}

CommHandle NcclComm::do_all_reduce(void* buf, size_t count, DType t, ReduceOp op) {
  if (wide_sums_ && op != ReduceOp::max && (t == DType::bf16 || t == DType::f16))
    return wide_reduce(buf, buf, count, t, op, false);
  begin();
  MT_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), comm_, stream_));
  return end();
}

CommHandle NcclComm::do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) {
  if (wide_sums_ && op != ReduceOp::max && (t == DType::bf16 || t == DType::f16))
    return wide_reduce(send, recv, recv_count, t, op, true);
  begin();
  MT_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op(op), comm_, stream_));
  return end();
}

CommHandle NcclComm::do_all_gather(const void* send, void* recv, size_t send_count, DType t) {
  const size_t b = dtype_size(t);
  begin();
  // Moved as bytes: no arithmetic, and u16 has no NCCL type. In place when send is this rank's slot.
  MT_NCCL_CHECK(ncclAllGather(send, recv, send_count * b, ncclUint8, comm_, stream_));
  return end();
}

CommHandle NcclComm::do_all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                                     std::span<const size_t> recv_counts, DType t) {
  const size_t b = dtype_size(t);
  const auto* s = static_cast<const char*>(send);
  auto* r = static_cast<char*>(recv);
  size_t send_off = 0, recv_off = 0, self_send = 0, self_recv = 0;
  const size_t own = send_counts[size_t(rank())] * b;
  MT_CHECK(own == recv_counts[size_t(rank())] * b, "all_to_all_v on '%s': sends %zu elements to itself but expects %zu",
           name().c_str(), send_counts[size_t(rank())], recv_counts[size_t(rank())]);
  begin();
  MT_NCCL_CHECK(ncclGroupStart());
  for (int j = 0; j < size(); j++) {
    const size_t sc = send_counts[size_t(j)] * b, rc = recv_counts[size_t(j)] * b;
    if (j == rank()) {
      self_send = send_off;
      self_recv = recv_off;
    } else {
      if (sc) MT_NCCL_CHECK(ncclSend(s + send_off, sc, ncclUint8, j, comm_, stream_));
      if (rc) MT_NCCL_CHECK(ncclRecv(r + recv_off, rc, ncclUint8, j, comm_, stream_));
    }
    send_off += sc;
    recv_off += rc;
  }
  MT_NCCL_CHECK(ncclGroupEnd());
  if (own) MT_CUDA_CHECK(cudaMemcpyAsync(r + self_recv, s + self_send, own, cudaMemcpyDeviceToDevice, stream_));
  return end();
}

CommHandle NcclComm::do_broadcast(void* buf, size_t count, DType t, int root) {
  begin();
  MT_NCCL_CHECK(ncclBroadcast(buf, buf, count * dtype_size(t), ncclUint8, root, comm_, stream_));
  return end();
}

CommHandle NcclComm::do_send_recv(const void* send_buf, size_t send_count, int dst, void* recv_buf,
                                  size_t recv_count, int src, DType t, int) {
  const size_t b = dtype_size(t);
  if (dst == rank() || src == rank()) {
    // With itself a rank exchanges only inside one call (as on SelfComm): a device copy.
    MT_CHECK(dst == rank() && src == rank() && send_count == recv_count,
             "send_recv on '%s': an exchange with itself needs both sides, of equal size, in one call", name().c_str());
    begin();
    MT_CUDA_CHECK(cudaMemcpyAsync(recv_buf, send_buf, send_count * b, cudaMemcpyDeviceToDevice, stream_));
    return end();
  }
  begin();
  MT_NCCL_CHECK(ncclGroupStart());
  if (dst >= 0 && send_count) MT_NCCL_CHECK(ncclSend(send_buf, send_count * b, ncclUint8, dst, comm_, stream_));
  if (src >= 0 && recv_count) MT_NCCL_CHECK(ncclRecv(recv_buf, recv_count * b, ncclUint8, src, comm_, stream_));
  MT_NCCL_CHECK(ncclGroupEnd());
  return end();
}

void NcclComm::warm_up(bool collectives, std::span<const int> peers) {
  if (size() < 2 || (!collectives && peers.empty())) return;
  const size_t n = size_t(size());
  float* buf = nullptr;  // n slots for the collectives, n for the receives (one per peer rank)
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buf), 2 * n * sizeof(float), stream_));
  MT_CUDA_CHECK(cudaMemsetAsync(buf, 0, 2 * n * sizeof(float), stream_));
  float* mine = buf + rank();
  if (collectives) {
    MT_NCCL_CHECK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm_, stream_));
    MT_NCCL_CHECK(ncclReduceScatter(buf, mine, 1, ncclFloat32, ncclSum, comm_, stream_));  // in place
    MT_NCCL_CHECK(ncclAllGather(mine, buf, 1, ncclFloat32, comm_, stream_));               // in place
  }
  if (!peers.empty()) {
    MT_NCCL_CHECK(ncclGroupStart());
    for (const int p : peers) {
      MT_CHECK(p >= 0 && p < size() && p != rank(), "warm_up on '%s': peer %d of %d ranks (this one is %d)",
               name().c_str(), p, size(), rank());
      MT_NCCL_CHECK(ncclSend(mine, 1, ncclFloat32, p, comm_, stream_));
      MT_NCCL_CHECK(ncclRecv(buf + n + size_t(p), 1, ncclFloat32, p, comm_, stream_));
    }
    MT_NCCL_CHECK(ncclGroupEnd());
  }
  MT_CUDA_CHECK(cudaFreeAsync(buf, stream_));
  MT_CUDA_CHECK(cudaEventRecord(idle_, stream_));
  const uint64_t seq = record_issue("warm_up", 0);
  wait_on_peers([this] { return fired(idle_); }, "warm_up", seq);
  record_end(seq);
}

bool NcclComm::fired(cudaEvent_t event) {
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) MT_CUDA_CHECK(e);
  (void)cudaGetLastError();  // "not ready" is no failure (see NcclOp::test)
  // The pattern NCCL documents for fault tolerance: poll the work and the communicator's async
  // error; the caller aborts the communicator when its deadline passes.
  poll_failure();
  return false;
}

void NcclComm::poll_failure() {
  if (!comm_) return;  // aborted: nothing in flight any more
  ncclResult_t async = ncclSuccess;
  MT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  MT_NCCL_CHECK(async);
}

void NcclComm::abandon() {
  if (!comm_) return;
  ncclCommAbort(comm_);  // the kernels waiting for a peer that never comes are ended
  comm_ = nullptr;
}

CommHandle NcclComm::do_barrier() {
  MT_NCCL_CHECK(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_));
  // The host waits here, so under the wait policy: a deadline, then ncclCommAbort (abandon()).
  MT_CUDA_CHECK(cudaEventRecord(idle_, stream_));
  const uint64_t seq = record_issue("barrier", 0);
  wait_on_peers([this] { return fired(idle_); }, "barrier", seq);
  record_end(seq);
  return {};
}

std::unique_ptr<Comm> NcclComm::do_split(int color, int key, const std::string& name, Arena*) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  ncclComm_t sub = nullptr;
  MT_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr));
  auto child = std::unique_ptr<NcclComm>(new NcclComm(sub, nccl_rank(sub), nccl_size(sub), compute_, name));
  child->wide_sums_ = wide_sums_;
  return child;
#else
  (void)color;
  (void)key;
  mt::fail("splitting NcclComm '%s' into '%s' needs NCCL >= 2.18; build the sub-communicator from a host "
           "communicator instead",
           this->name().c_str(), name.c_str());
#endif
}

}  // namespace mt::parallel
#endif  // MT_HAVE_NCCL
