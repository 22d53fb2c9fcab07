// Copies and memsets. The call checks each pointer against its kind (a device side must lie inside one
// live device block, a host side must not be device memory, a pinned side must not run past its
// block); the queued work checks the device sides again when it runs, since a stream-ordered free may
// have come first (then it is an illegal address, as on the hardware).
//
// When the host waits, following the CUDA Runtime API's "API synchronization behavior":
//   cudaMemcpy               on the legacy default stream; returns after the copy unless both sides
//                            are device memory (device to device does not block the host);
//   cudaMemcpyAsync          from pageable host memory: the source is read at the call (staged),
//                            the copy itself stays queued; to pageable host memory, or host to host:
//                            returns after the copy; otherwise queued, nothing waits;
//   cudaMemset(Async)        queued (cudaMemset on the legacy default stream).
#include <cinttypes>
#include <cstring>

#include "sim/state.h"

namespace mt::sim::detail {
namespace {

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
  }
  return "an unknown kind";
}

// Device memory, or an address in the device range (a freed block: the check then says so).
bool in_device_range(const void* p) {
  const Device& d = device();
  const Block* b = live_block(p);
  if (b) return b->kind == Kind::device;
  return uintptr_t(p) >= d.region && uintptr_t(p) < d.region_end;
}

bool pageable(const void* p) { return !live_block(p) && !in_device_range(p); }

struct Sides {
  bool dst_device, src_device;
};

// Throws unless dst and src are what `kind` says (cudaMemcpyDefault: whatever they are).
Sides check_copy(const char* call, void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  Sides s{};
  switch (kind) {
    case cudaMemcpyHostToHost: s = {false, false}; break;
    case cudaMemcpyHostToDevice: s = {true, false}; break;
    case cudaMemcpyDeviceToHost: s = {false, true}; break;
    case cudaMemcpyDeviceToDevice: s = {true, true}; break;
    case cudaMemcpyDefault: s = {in_device_range(dst), in_device_range(src)}; break;
    default:
      throw CudaError(cudaErrorInvalidMemcpyDirection, format("%s: kind %d is not a copy direction", call, int(kind)));
  }
  const std::string label = format("%s(..., %s)", call, kind_name(kind));
  if (s.dst_device) check_device_range(dst, n, label.c_str(), "dst");
  else check_host_range(dst, n, label.c_str(), "dst");
  if (s.src_device) check_device_range(src, n, label.c_str(), "src");
  else check_host_range(src, n, label.c_str(), "src");
  return s;
}

// The queued copy. `staged`: the source's bytes taken at the call (pageable host memory).
Op copy_op(Device& d, const char* call, void* dst, const void* src, size_t n, cudaMemcpyKind kind, Sides s,
           std::vector<char> staged) {
  Op op;
  op.seq = next_seq(d);
  op.what = format("%s(dst %p, src %p, %zu bytes, %s)", call, dst, src, n, kind_name(kind));
  op.run = [call, dst, src, n, s, staged = std::move(staged)] {
    if (s.dst_device) check_device_range(dst, n, call, "dst");
    if (s.src_device) check_device_range(src, n, call, "src");
    std::memmove(dst, staged.empty() ? src : staged.data(), n);
  };
  return op;
}

cudaError_t memset_on(const char* call, void* p, int value, size_t count, cudaStream_t stream) {
  return api([&](Device& d) {
    auto s = stream_of(d, stream, call);
    if (count == 0) return cudaSuccess;
    check_device_range(p, count, call, "devPtr");
    Op op;
    op.seq = next_seq(d);
    op.what = format("%s(devPtr %p, 0x%02x, %zu bytes)", call, p, unsigned(value) & 0xffu, count);
    op.run = [call, p, value, count] {
      check_device_range(p, count, call, "devPtr");
      std::memset(p, value, count);
    };
    push(d, s, std::move(op));
    return d.sticky;
  });
}

}  // namespace
}  // namespace mt::sim::detail

using namespace mt::sim;
using namespace mt::sim::detail;

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return api([&](Device& d) {
    if (count == 0) return cudaSuccess;
    const Sides s = check_copy("cudaMemcpy", dst, src, count, kind);
    Op op = copy_op(d, "cudaMemcpy", dst, src, count, kind, s, {});
    const uint64_t seq = op.seq;
    push(d, d.legacy, std::move(op));
    if (!s.dst_device || !s.src_device) require_reached(d, run_until(d, d.legacy, seq), "cudaMemcpy");
    return d.sticky;
  });
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return api([&](Device& d) {
    auto st = stream_of(d, stream, "cudaMemcpyAsync");
    if (count == 0) return cudaSuccess;
    const Sides s = check_copy("cudaMemcpyAsync", dst, src, count, kind);
    std::vector<char> staged;
    if (pageable(src)) {
      const auto* b = static_cast<const char*>(src);
      staged.assign(b, b + count);
    }
    Op op = copy_op(d, "cudaMemcpyAsync", dst, src, count, kind, s, std::move(staged));
    const uint64_t seq = op.seq;
    push(d, st, std::move(op));
    if (pageable(dst) || (!s.dst_device && !s.src_device))
      require_reached(d, run_until(d, st, seq), "cudaMemcpyAsync");
    return d.sticky;
  });
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return memset_on("cudaMemset", devPtr, value, count, cudaStreamLegacy);
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return memset_on("cudaMemsetAsync", devPtr, value, count, stream);
}
