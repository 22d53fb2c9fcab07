// NcclComm: Comm over NCCL, on device buffers, built when MT_HAVE_NCCL (CUDA builds with NCCL).
//
// Streams. Collectives run on the communicator's own stream (comm_stream), so they overlap the
// compute stream's kernels. Each op first makes the comm stream wait for an event recorded on the
// compute stream (the buffer's producer has finished), and records a completion event after the
// NCCL call. CommHandle::wait() makes the compute stream wait for that event: ordering on the
// device, never a host synchronisation (STYLE rule 7). test() asks whether the event has fired. To
// read a result on the host, synchronise the compute stream after wait().
//
// Numerics. NCCL reduces bf16/f16 in the element type: partial sums travel between ranks as
// bf16/f16, so they are rounded at every step of the ring or tree (up to N-1 times), not once as
// on the host backends. Training keeps gradients in fp32 (runtime/param_store.h), where that does
// not arise. A communicator built with `wide_sums` (tensor parallelism's, whose sums are 16-bit
// activations) instead widens a 16-bit sum or average to fp32 on its stream, reduces in fp32 and
// rounds once, as the host backends do: twice the bytes on the wire (the counters keep the
// logical 16-bit figures, the same on every backend). NCCL's results are identical on every rank (each reduced chunk is computed once and
// then copied) and deterministic for a fixed world size, GPU topology, NCCL version and
// NCCL_ALGO/NCCL_PROTO choice; they need not match the host backends' rank-order sum bitwise.
//
// Point to point: NCCL has no tags; messages between two ranks match in issue order. send_recv
// groups its two halves (ncclGroupStart/End), so a ring exchange cannot deadlock.
// barrier() all-reduces one value and waits on the host for the comm stream: it is the only op that
// blocks the host, and it waits under the WaitPolicy (comm.h): cudaEventQuery and
// ncclCommGetAsyncError polled with a pause, and past dist.timeout ncclCommAbort and a
// PeerTimeoutError (NCCL's documented fault-tolerance pattern); the destructor waits the same way and
// aborts instead of finalising when the deadline passes. A device op's wait() orders the compute
// stream and does not block the host; test() reports NCCL's async error. A host wait on the compute
// stream outside parallel/ (the trainer's syncs and downloads, which may sit behind these kernels)
// polls the same way through Comm::wait_for_device (parallel/mesh.h Mesh::until).
#pragma once
#ifdef MT_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include "parallel/comm.h"

namespace mt::parallel {

// Status check for NCCL calls (the CUDA runtime's is MT_CUDA_CHECK in kernels/cuda/cuda_check.cuh):
// throws mt::Error naming the statement, file, line and NCCL's reason.
#define MT_NCCL_CHECK(stmt)                                                                         \
  do {                                                                                              \
    ncclResult_t mt_nccl_rc_ = (stmt);                                                              \
    if (mt_nccl_rc_ != ncclSuccess)                                                                 \
      ::mt::detail::throw_status("NCCL", #stmt, __FILE__, __LINE__, long(mt_nccl_rc_), ncclGetErrorString(mt_nccl_rc_)); \
  } while (0)

class NcclComm final : public Comm {
 public:
  // Collective over `bootstrap`, a host communicator of the same ranks (e.g. the world MpiComm or a
  // Mesh sub-communicator): its rank 0 creates the NCCL id and broadcasts it. Uses the calling
  // thread's current CUDA device (select it first, e.g. from World::local_rank()).
  NcclComm(Comm& bootstrap, cudaStream_t compute_stream, std::string name, bool wide_sums = false);
  ~NcclComm() override;

  ncclComm_t handle() const { return comm_; }
  // Makes NCCL connect now what a step will use (Mesh::warm_device_comms): with `collectives` a
  // one-element all-reduce, reduce-scatter and all-gather; then one grouped send and receive of one
  // element with each of `peers` (ranks of this communicator, the same relation on every rank: if a
  // lists b, b lists a). Collective over the communicator; the host waits for it under the wait
  // policy. Counts no traffic (the counters keep the step's).
  void warm_up(bool collectives, std::span<const int> peers);
  cudaStream_t comm_stream() const { return stream_; }
  cudaStream_t compute_stream() const { return compute_; }
  // Throws NCCL's async error (a peer failed): ncclCommGetAsyncError.
  void poll_failure() override;

 protected:
  CommHandle do_all_reduce(void* buf, size_t count, DType t, ReduceOp op) override;
  CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) override;
  CommHandle do_all_gather(const void* send, void* recv, size_t send_count, DType t) override;
  CommHandle do_all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                             std::span<const size_t> recv_counts, DType t) override;
  CommHandle do_broadcast(void* buf, size_t count, DType t, int root) override;
  CommHandle do_send_recv(const void* send_buf, size_t send_count, int dst, void* recv_buf, size_t recv_count,
                          int src, DType t, int tag) override;
  CommHandle do_barrier() override;
  std::unique_ptr<Comm> do_split(int color, int key, const std::string& name, Arena* scratch) override;
  void abandon() override;

 private:
  // True once `event` has fired; throws NCCL's async error (a peer failed) while it has not.
  bool fired(cudaEvent_t event);
  // Takes ownership of an initialised NCCL communicator (from ncclCommSplit).
  NcclComm(ncclComm_t comm, int rank, int size, cudaStream_t compute_stream, std::string name);
  void init_streams();
  // A 16-bit all-reduce (scatter false: send == recv, `out` elements) or reduce-scatter (`out`
  // elements per rank) reduced in fp32 (wide_sums).
  CommHandle wide_reduce(const void* send, void* recv, size_t out, DType t, ReduceOp op, bool scatter);
  void begin();       // the comm stream waits for the compute stream's work so far
  CommHandle end();   // a handle on the comm stream's work so far

  ncclComm_t comm_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // re-recorded by every begin()
  cudaEvent_t idle_ = nullptr;   // recorded where the host waits for the comm stream (barrier, teardown)
  int* barrier_word_ = nullptr;  // one device int for barrier()
  bool wide_sums_ = false;
};

}  // namespace mt::parallel

#endif  // MT_HAVE_NCCL
