// MpiComm: Comm over an MPI communicator, on host buffers, built when MT_HAVE_MPI.
//
// Every op is started with a nonblocking MPI call (MPI_Ialltoallv, MPI_Iallgather, MPI_Ibcast,
// MPI_Isend/Irecv, MPI_Ibarrier) and completed by CommHandle::test()/wait(); wait() polls MPI_Testall
// under the communicator's WaitPolicy (comm.h: a deadline, and a pause instead of a busy core), never
// MPI_Wait, so a peer that never arrives is a PeerTimeoutError rather than a hang. Open MPI has no
// progress thread by default: a host collective advances while the caller is inside MPI, so code
// that overlaps communication with compute calls test() between pieces of compute (the bucketed
// gradient reduction does this between layers).
//
// Reductions do not use MPI_Allreduce: its summation order is the library's choice (it changes with
// message size and world size, and bf16 is not an MPI type). Instead:
//   reduce_scatter = MPI_Ialltoall of the N blocks, then reduce_blocks() in rank order;
//   all_reduce     = the same on near-equal chunks (MPI_Ialltoallv), then MPI_Iallgatherv of the
//                    reduced chunks in place.
// Each element is therefore reduced by exactly one rank in a fixed order and then copied to the
// others: bitwise identical on every rank, run to run, and the bytes sent are the ring optimum
// 2(N-1)/N x size. bf16/f16 travel as 16-bit values and are widened only where they are summed.
//
// all_reduce has two phases. MPI requires every rank to start collectives on a communicator in the
// same order, but a phase 2 starts when the caller happens to test or wait. So phase 2 runs on a
// second duplicate of the communicator, and phase 2s are started strictly in the order their
// all_reduces were issued (a FIFO): the order is then the same on every rank whatever the
// test/wait pattern.
//
// Threading: a communicator is driven by one thread at a time (MPI_THREAD_FUNNELED suffices when
// that is the main thread; see launch.h). Scratch buffers come from an Arena under MemCategory::comm,
// so they appear in the memory report.
#pragma once
#ifdef MT_HAVE_MPI

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only; the deprecated C++ bindings need another library
#endif
#include <mpi.h>

#include <deque>
#include <vector>

#include "parallel/comm.h"
#include "runtime/arena.h"

namespace mt::parallel {

namespace detail {
[[noreturn]] void throw_mpi(int code, const char* stmt, const char* file, int line);
}

// Status check for MPI calls: throws mt::Error naming the statement, file, line and MPI's reason.
#define MT_MPI_CHECK(stmt)                                                                  \
  do {                                                                                      \
    int mt_mpi_rc_ = (stmt);                                                                \
    if (mt_mpi_rc_ != MPI_SUCCESS) ::mt::parallel::detail::throw_mpi(mt_mpi_rc_, #stmt, __FILE__, __LINE__); \
  } while (0)

class MpiOp;

class MpiComm final : public Comm {
 public:
  // Duplicates `comm` (the caller keeps and frees its own handle). Scratch memory comes from
  // `arena` when given (it must outlive this object), else from a private arena.
  MpiComm(MPI_Comm comm, std::string name, Arena* arena = nullptr);
  ~MpiComm() override;

  MPI_Comm handle() const { return comm_; }
  // Scratch blocks held by this communicator: those of ops in flight plus up to kSpareScratch
  // completed ones kept for reuse (a training step issues the same sizes every step, and a fresh
  // block costs page faults and zero-filling on every op).
  size_t scratch_bytes() const { return scratch_bytes_; }
  void trim_scratch();  // frees the kept blocks
  static constexpr size_t kSpareScratch = 4;

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

 private:
  friend class MpiOp;
  // Starts queued phase 2s in issue order, as many as have finished phase 1 (never blocks).
  void start_queued();
  int to_int(size_t n, const char* what) const;
  Buffer take_scratch(size_t bytes);  // the smallest kept block that fits, else a new one
  void keep_scratch(Buffer b);


  MPI_Comm comm_ = MPI_COMM_NULL;   // every single-phase op and all_reduce's phase 1
  MPI_Comm comm2_ = MPI_COMM_NULL;  // all_reduce's phase 2 only
  std::unique_ptr<Arena> own_arena_;
  Arena* arena_;
  std::deque<MpiOp*> queue_;  // all_reduces whose phase 2 has not been started, in issue order
  std::vector<Buffer> spare_;
  size_t scratch_bytes_ = 0;
};

}  // namespace mt::parallel

#endif  // MT_HAVE_MPI
