// Device management: discovery, allocation and host<->device copies for tests and the CLI.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

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
  MT_CUDA_CHECK(cudaMalloc(&p, bytes));
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

}  // namespace mt::cuda
