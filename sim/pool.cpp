// The stream-ordered allocator. cudaMallocAsync hands out a fresh device block at the call;
// cudaFreeAsync queues the free, so the block lives until its stream reaches that point, and work
// that runs afterwards (queued behind the free, or on another stream and run later for want of an
// event ordering it first) finds an illegal address. The default pool's attributes are kept but
// change nothing: the sim holds no freed memory in reserve and never hands an address out twice.
#include "sim/state.h"

using namespace mt::sim;
using namespace mt::sim::detail;

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  return api([&](Device& d) {
    stream_of(d, hStream, "cudaMallocAsync");
    if (!devPtr) throw CudaError(cudaErrorInvalidValue, "cudaMallocAsync: devPtr is null");
    *devPtr = size ? allocate(d, size, Kind::device, "cudaMallocAsync") : nullptr;
    return cudaSuccess;
  });
}

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  return api([&](Device& d) {
    auto s = stream_of(d, hStream, "cudaFreeAsync");
    if (!devPtr) return cudaSuccess;
    const auto base = uintptr_t(devPtr);
    auto it = d.blocks.find(base);
    if (it == d.blocks.end() || it->second.kind != Kind::device)
      throw CudaError(cudaErrorInvalidValue,
                      format("cudaFreeAsync: devPtr = %p is %s, not the start of a live device block", devPtr,
                             describe(devPtr).c_str()));
    if (it->second.free_queued)
      throw CudaError(cudaErrorInvalidValue,
                      format("cudaFreeAsync: devPtr = %p (%s'd block of %zu bytes) is already queued to be freed",
                             devPtr, it->second.call, it->second.bytes));
    it->second.free_queued = true;
    Op op;
    op.seq = next_seq(d);
    op.what = format("cudaFreeAsync(devPtr %p)", devPtr);
    op.run = [&d, base] { release(d, base, "cudaFreeAsync"); };
    push(d, s, std::move(op));
    return d.sticky;
  });
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  return api([&](Device& d) {
    if (!memPool) throw CudaError(cudaErrorInvalidValue, "cudaDeviceGetDefaultMemPool: memPool is null");
    if (device != 0)
      throw CudaError(cudaErrorInvalidDevice,
                      format("cudaDeviceGetDefaultMemPool: device %d (the simulated machine has device 0 only)",
                             device));
    *memPool = &d.pool;
    return cudaSuccess;
  });
}

namespace {

void check_pool(Device& d, cudaMemPool_t pool, const char* call) {
  if (pool != &d.pool)
    throw CudaError(cudaErrorInvalidValue,
                    format("%s: pool %p is not the default pool (the only one the sim has)", call, (void*)pool));
}

}  // namespace

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  return api([&](Device& d) {
    check_pool(d, memPool, "cudaMemPoolSetAttribute");
    if (!value) throw CudaError(cudaErrorInvalidValue, "cudaMemPoolSetAttribute: value is null");
    switch (attr) {
      case cudaMemPoolAttrReleaseThreshold: d.pool.release_threshold = *static_cast<uint64_t*>(value); break;
      case cudaMemPoolReuseFollowEventDependencies:
      case cudaMemPoolReuseAllowOpportunistic:
      case cudaMemPoolReuseAllowInternalDependencies: break;  // the sim reuses nothing
      default:
        throw CudaError(cudaErrorInvalidValue,
                        format("cudaMemPoolSetAttribute: attribute %d is not simulated", int(attr)));
    }
    return cudaSuccess;
  });
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  (void)minBytesToKeep;  // nothing is kept in reserve to trim
  return api([&](Device& d) {
    check_pool(d, memPool, "cudaMemPoolTrimTo");
    return cudaSuccess;
  });
}
