// Shared pieces of the CUDA kernels: the stream of a Ctx, launch sizing for grid-stride loops, and
// warp/block reductions.
//
// Every reduction here is a fixed tree (xor shuffles within a warp, then the warp partials in warp
// order), so a kernel built on them gives the same bits on every run for the same launch shape. No
// kernel in this backend uses floating-point atomics for that reason.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

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
  __shared__ T partial[kWarp];
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
