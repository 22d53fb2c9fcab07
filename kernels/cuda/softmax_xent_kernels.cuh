// The fused softmax + cross-entropy kernel (see softmax_xent.cu) and its launch shape, in a header so that
// the same source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_ops.cpp runs it against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::softmax_xent_kernels {

constexpr int kXentThreads = 512;

// No __restrict__: dlogits may alias logits.
template <class D>
__global__ void softmax_xent_kernel(float* losses, D* dlogits, const D* logits, const int32_t* targets, float dloss,
                                    int V, int Vp) {
  const int64_t row = blockIdx.x;
  const D* x = logits + row * Vp;
  D* dx = dlogits ? dlogits + row * Vp : nullptr;
  const int target = targets[row];
  if (target < 0) {  // ignored position: no loss, no gradient
    if (threadIdx.x == 0) losses[row] = 0.f;
    if (dx)
      for (int j = int(threadIdx.x); j < Vp; j += int(blockDim.x)) dx[j] = store_as<D>(0.f);
    return;
  }
  float mx = -INFINITY;
  for (int j = int(threadIdx.x); j < V; j += int(blockDim.x)) mx = fmaxf(mx, load(x[j]));
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  float sum = 0.f;
  for (int j = int(threadIdx.x); j < V; j += int(blockDim.x)) sum += expf(load(x[j]) - mx);
  sum = block_reduce(sum, SumOp{}, 0.f);
  // A target outside the real vocabulary is a data error; NaN makes it visible in the loss (the
  // trainer's finiteness checks report it) instead of reading out of bounds.
  const bool valid = target < V;
  const float x_target = valid ? load(x[target]) : NAN;
  __syncthreads();  // everyone has read x[target] before anyone may overwrite it (in-place backward)
  if (threadIdx.x == 0) losses[row] = valid ? logf(sum) + mx - x_target : NAN;
  if (dx) {
    const float inv = 1.f / sum;
    for (int j = int(threadIdx.x); j < Vp; j += int(blockDim.x)) {
      float g = 0.f;
      if (j < V) g = dloss * (expf(load(x[j]) - mx) * inv - (j == target ? 1.f : 0.f));
      dx[j] = store_as<D>(valid ? g : NAN);
    }
  }
}

// One block of kXentThreads per row.
inline LaunchShape xent_shape(int N) { return {dim3(unsigned(N)), dim3(kXentThreads)}; }

}  // namespace mt::cuda::softmax_xent_kernels
