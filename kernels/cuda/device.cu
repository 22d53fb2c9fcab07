// Device management: discovery, selection, allocation and copies for tests, the CLI and the trainer
// (whose arena allocates through device_memory()).
#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/upload_staging.h"
#include "runtime/check.h"

namespace mt::cuda {

// "No GPU here" is an answer, not an error: a machine without a driver or a device reports 0 so the
// GPU tests skip and the CLI can say so. A driver that is present but broken still throws, so a
// damaged GPU node never silently looks like a CPU node.
int device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorStubLibrary) {
    (void)cudaGetLastError();  // clear the error so later calls start clean
    return 0;
  }
  if (err != cudaSuccess)
    detail::throw_status("CUDA", "cudaGetDeviceCount(&n)", __FILE__, __LINE__, long(err), cudaGetErrorString(err));
  return n;
}

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  cudaError_t cuda_malloc_status = cudaMalloc(&p, bytes);
  if (cuda_malloc_status == cudaErrorMemoryAllocation) {
    // The stream-ordered pool keeps what it frees (set_device sets its release threshold to "never"):
    // give its unused blocks back to the driver and try once more.
    (void)cudaGetLastError();
    int dev = 0;
    cudaMemPool_t pool;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
    cuda_malloc_status = cudaMalloc(&p, bytes);
  }
  MT_CUDA_CHECK(cuda_malloc_status);
  return p;
}

void device_free(void* p) {
  if (p) MT_CUDA_CHECK(cudaFree(p));
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) MT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) MT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void synchronize() { MT_CUDA_CHECK(cudaDeviceSynchronize()); }

void wait_for_event(void* event, const DeviceWait* wait, const char* what) {
  const auto done = static_cast<cudaEvent_t>(event);
  if (!wait) {
    MT_CUDA_CHECK(cudaEventSynchronize(done));
    return;
  }
  wait->until(
      [done] {
        const cudaError_t e = cudaEventQuery(done);
        if (e == cudaErrorNotReady) {
          (void)cudaGetLastError();  // an answer, not a failure: it must not surface at the next launch check
          return false;
        }
        MT_CUDA_CHECK(e);
        return true;
      },
      what);
}

void wait_for_stream(void* stream, const DeviceWait* wait, const char* what) {
  cudaEvent_t done = nullptr;
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  // Destroying an event whose record is still queued is allowed: it is released when it fires.
  struct Destroy {
    cudaEvent_t e;
    ~Destroy() { (void)cudaEventDestroy(e); }
  } const destroy{done};
  MT_CUDA_CHECK(cudaEventRecord(done, static_cast<cudaStream_t>(stream)));
  wait_for_event(done, wait, what);
}

int current_device() {
  int d = 0;
  MT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void use_device(int index) { MT_CUDA_CHECK(cudaSetDevice(index)); }

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes) MT_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}

void pinned_free(void* p) {
  if (p) (void)cudaFreeHost(p);
}

DeviceMemoryInfo device_memory_info() {
  size_t free_bytes = 0, total = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return {total - free_bytes, total};
}

void device_memset_zero(void* p, size_t bytes) {
  if (bytes) MT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

void set_device(int index) {
  const int n = device_count();
  MT_CHECK(index >= 0 && index < n, "CUDA device %d requested but %d found", index, n);
  MT_CUDA_CHECK(cudaSetDevice(index));
  // Release threshold "never": freed blocks stay in the pool instead of going back to the driver at
  // every synchronisation, so per-micro-batch activations cost no cudaMalloc after the first step.
  cudaMemPool_t pool;
  MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
  uint64_t threshold = UINT64_MAX;
  MT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

std::string device_name() {
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p;
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

namespace {

// Stream-ordered on the default stream, like every op launched with a null ctx.stream: a block freed
// after the ops that read it is only reused by work queued after them.
// The same without the zero fill (MemOps::alloc_uninit): activations are written before they are read.
void* pool_alloc_uninit(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, bytes, 0);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (err != cudaSuccess)
    detail::throw_status("CUDA", "cudaMallocAsync(&p, bytes, 0)", __FILE__, __LINE__, long(err),
                         cudaGetErrorString(err));
  return p;
}

void* pool_alloc(size_t bytes) {
  void* p = pool_alloc_uninit(bytes);
  if (p) device_memset_zero(p, bytes);
  return p;
}

// Runs in destructors, so it must not throw: a failing free means the context is already broken, and
// the next checked call reports it.
void pool_free(void* p) {
  if (p) (void)cudaFreeAsync(p, 0);
}

void mem_copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device: copy_to_device(dst, src, bytes); break;
    case CopyKind::device_to_host: copy_to_host(dst, src, bytes); break;
    case CopyKind::device_to_device: copy_on_device(dst, src, bytes); break;
  }
}

void mem_narrow(void* dst, const float* src, int64_t n, DType t) {
  const ops::Ctx ctx{Device::cuda, nullptr};
  switch (t) {
    case DType::f32: copy_on_device(dst, src, size_t(n) * 4); break;
    case DType::bf16: cuda::convert(static_cast<bf16*>(dst), src, n, ctx); break;
    case DType::f16: cuda::convert(static_cast<f16*>(dst), src, n, ctx); break;
    default: fail("narrow: no conversion from f32 to %s", dtype_name(t));
  }
}

// The memory's work (copies, zeroing, frees, and the ops of a null ctx.stream) is on the default stream.
void wait_idle(const DeviceWait* wait) { wait_for_stream(nullptr, wait, "device sync"); }

constexpr MemOps kDevice{Device::cuda, pool_alloc,  pool_free,         device_memset_zero, mem_copy,
                         mem_narrow,   wait_idle,   pool_alloc_uninit, make_pinned_uploads};

}  // namespace

const MemOps& device_memory() { return kDevice; }

}  // namespace mt::cuda
