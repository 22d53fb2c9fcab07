// SelfComm: a one-rank communicator on host memory. Builds without MPI give the world this
// backend; a Mesh dimension of size 1 may use it too. Collectives are identities or copies
// (avg of one value is the value itself, even in bf16), so every op completes immediately.
#pragma once
#include "parallel/comm.h"

namespace mt::parallel {

class SelfComm final : public Comm {
 public:
  explicit SelfComm(std::string name = "self");

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
};

}  // namespace mt::parallel
