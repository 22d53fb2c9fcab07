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

// A running softmax normaliser: the largest value m seen and the sum s of exp(x - m) over the values.
struct MaxSum {
  float m, s;
};

// The normaliser of the union of two sets of values. Symmetric bit for bit (fmaxf, products and one
// commutative addition), so both lanes of a butterfly step agree.
__device__ inline MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};  // neither has seen a value
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// The normaliser over the whole block (blockDim.x a multiple of 32): a butterfly within each warp,
// then every warp combines the warp partials in warp order. Every thread receives the result.
__device__ inline MaxSum block_max_sum(MaxSum v) {
  MT_SHARED(float[kWarp], part_m);
  MT_SHARED(float[kWarp], part_s);
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int nwarps = int(blockDim.x) / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = combine(v, MaxSum{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)});
  if (lane == 0) part_m[warp] = v.m, part_s[warp] = v.s;
  __syncthreads();
  v = lane < nwarps ? MaxSum{part_m[lane], part_s[lane]} : MaxSum{-INFINITY, 0.f};
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = combine(v, MaxSum{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)});
  return v;
}

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
  // One pass for the max and the sum (the online softmax normaliser), one for the gradient.
  MaxSum ms{-INFINITY, 0.f};
  for (int j = int(threadIdx.x); j < V; j += int(blockDim.x)) {
    const float v = load(x[j]);
    if (v > ms.m) {
      ms.s = ms.s * expf(ms.m - v) + 1.f;  // exp(-inf) = 0 for the first value
      ms.m = v;
    } else {
      ms.s += expf(v - ms.m);
    }
  }
  ms = block_max_sum(ms);
  const float mx = ms.m, sum = ms.s;
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
