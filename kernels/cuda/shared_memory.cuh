// Dynamic shared memory beyond the default 48 KiB per block must be opted in to, kernel by kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.cuh"

namespace mt::cuda {

// Opts `kernel` in to `bytes` of dynamic shared memory, first checking that the device allows that
// much per block (the error names `op`).
template <class Kernel>
void opt_in_shared_memory(Kernel kernel, size_t bytes, const char* op) {
  if (bytes <= 48 * 1024) return;
  int dev = 0, optin = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  MT_CHECK(bytes <= size_t(optin), "%s: needs %zu bytes of shared memory per block, the device allows %d", op,
           bytes, optin);
  // The runtime's C entry point (the templated overload exists for nvcc only), so the host build of the
  // simulated device compiles the same call.
  MT_CUDA_CHECK(
      cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace mt::cuda
