// Asynchronous copies from global to shared memory (cp.async, sm_80 and later), for kernels that load
// the next tile while they compute on the current one.
//
// A thread issues 16-byte copies, closes them into a group (commit), and later waits until at most N
// of its most recent groups are still in flight (wait<N>); the copies of the older groups have landed
// in shared memory by then. Each thread waits for its own copies only: a __syncthreads after the
// wait makes every thread's copies visible to the block. A copy whose source row lies outside the
// tensor (valid = false) reads nothing and fills its 16 bytes with zeros.
//
// The host build runs them on the warp emulator, which carries a copy out only when a wait covers its
// group: a kernel that reads a tile before waiting for it reads stale data there and fails its test.
#pragma once
#if !defined(__CUDACC__)
#include "kernels/cuda/warp_emulation.h"  // host build: emulated copies
#endif
#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda::async_copy {

// 16 bytes from src (global) to dst (shared), both 16-byte aligned; zeros when !valid (src unread).
__device__ inline void copy16(void* dst, const void* src, bool valid) {
#if !defined(__CUDACC__)
  emu::cp_async_16(dst, src, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#else
  __trap();  // the launchers never run these kernels below compute capability 8.0
#endif
}

// Closes the copies issued since the last commit into a group (possibly an empty one).
__device__ inline void commit() {
#if !defined(__CUDACC__)
  emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Returns when at most N of this thread's most recently committed groups are still in flight.
template <int N>
__device__ inline void wait() {
#if !defined(__CUDACC__)
  emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace mt::cuda::async_copy
