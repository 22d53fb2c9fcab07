#include "parallel/self_comm.h"

#include <cstring>

namespace mt::parallel {
namespace {

void copy(void* dst, const void* src, size_t count, DType t) {
  if (dst != src) std::memmove(dst, src, count * dtype_size(t));
}

}  // namespace

SelfComm::SelfComm(std::string name) : Comm(0, 1, Device::cpu, std::move(name)) {}

CommHandle SelfComm::do_all_reduce(void*, size_t, DType, ReduceOp) { return {}; }

CommHandle SelfComm::do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp) {
  copy(recv, send, recv_count, t);
  return {};
}

CommHandle SelfComm::do_all_gather(const void* send, void* recv, size_t send_count, DType t) {
  copy(recv, send, send_count, t);
  return {};
}

CommHandle SelfComm::do_all_to_all_v(const void* send, std::span<const size_t> send_counts, void* recv,
                                     std::span<const size_t> recv_counts, DType t) {
  MT_CHECK(send_counts[0] == recv_counts[0], "all_to_all_v on '%s': sends %zu elements to itself but expects %zu",
           name().c_str(), send_counts[0], recv_counts[0]);
  copy(recv, send, send_counts[0], t);
  return {};
}

CommHandle SelfComm::do_broadcast(void*, size_t, DType, int) { return {}; }

// A one-rank communicator can only exchange with itself, and only when both sides are in one call:
// a lone send would have no receive to complete it.
CommHandle SelfComm::do_send_recv(const void* send_buf, size_t send_count, int dst, void* recv_buf,
                                  size_t recv_count, int src, DType t, int) {
  MT_CHECK(dst == 0 && src == 0, "point-to-point on one-rank communicator '%s': a send to itself needs the "
           "matching receive in the same send_recv call", name().c_str());
  MT_CHECK(send_count == recv_count, "send_recv on '%s': sends %zu elements to itself but expects %zu",
           name().c_str(), send_count, recv_count);
  copy(recv_buf, send_buf, send_count, t);
  return {};
}

CommHandle SelfComm::do_barrier() { return {}; }

std::unique_ptr<Comm> SelfComm::do_split(int, int, const std::string& name, Arena*) {
  return std::make_unique<SelfComm>(name);
}

}  // namespace mt::parallel
