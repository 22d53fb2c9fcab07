// Shared pieces of the CUDA kernels: the stream of a Ctx, launch sizing for grid-stride loops, launch
// shapes and the launch helper (launch.cuh), warp/block reductions, and the spellings that differ
// between the device build and the host build against the emulator.
//
// Every reduction here is a fixed tree (xor shuffles within a warp, then the warp partials in warp
// order), so a kernel built on them gives the same bits on every run for the same launch shape. No
// kernel in this backend uses floating-point atomics for that reason.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/launch.cuh"
#include "kernels/ops.h"

// The kernel headers (*_kernels.cuh) build twice: by nvcc for the device, and by the host compiler
// against the emulator (warp_emulation.h) in the unit tests. Three spellings differ between the builds:
//   MT_SHARED(float[kWarp], partial) declares static shared memory, `__shared__ float partial[kWarp]`
//     for the device; on the host it binds the name to the block's one copy of the array, found by
//     the address of a static tag that is unique to the declaration (and to the template instance;
//     writable, so that no constant merging can give two tags one address).
//   MT_KERNEL_INLINE marks a non-template kernel defined in a header: `inline` for the host build,
//     nothing for nvcc, which ignores inline on a __global__ function (with a warning); each kernel
//     header is compiled into one .cu.
//   MT_DYNAMIC_SHARED(T, name) names the block's dynamic shared memory (the launch's smem bytes) as
//     an array of T: `extern __shared__ T name[]` for the device, the block's buffer on the host.
#if defined(__CUDACC__)
#define MT_SHARED(T, name) __shared__ ::std::type_identity_t<T> name
#define MT_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#define MT_KERNEL_INLINE
#else
#include "kernels/cuda/warp_emulation.h"
#define MT_SHARED(T, name)     \
  static char name##_shared_tag; \
  ::std::type_identity_t<T>& name = ::mt::cuda::emu::static_shared<::std::type_identity_t<T>>(&name##_shared_tag)
#define MT_DYNAMIC_SHARED(T, name) T* name = ::mt::cuda::emu::dynamic_shared<T>()
#define MT_KERNEL_INLINE inline
#endif

namespace mt::cuda {

inline cudaStream_t stream_of(const ops::Ctx& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

constexpr int kWarp = 32;
constexpr int kBlock = 256;  // default threads per block for element-wise kernels

// Blocks for a grid-stride loop over n elements: one element per thread up to a cap; beyond it each
// thread loops (the cap keeps the grid far below the launch limit for any tensor we hold).
inline unsigned grid_for(int64_t n, int block = kBlock) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;
  int64_t blocks = (n + block - 1) / block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return unsigned(blocks);
}

inline unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

// True when every pointer is 16-byte aligned (null counts as aligned): what kernels with 16-byte
// accesses (cp.async, uint4 loads) ask of their tensors.
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly reduction: every lane ends with the same value, reduced in the same order.
template <class T, class Op>
__device__ inline T warp_reduce(T v, Op op) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduction over the whole block (blockDim.x a multiple of 32, at most 1024); every thread receives
// the result. Safe to call several times in a row: the leading barrier protects the partials of the
// previous call.
template <class T, class Op>
__device__ inline T block_reduce(T v, Op op, T identity) {
  MT_SHARED(T[kWarp], partial);
  const int lane = int(threadIdx.x) % kWarp;
  const int warp = int(threadIdx.x) / kWarp;
  const int nwarps = int(blockDim.x) / kWarp;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : identity;
  return warp_reduce(v, op);
}

}  // namespace mt::cuda
