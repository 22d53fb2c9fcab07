// The sum-of-squares and finiteness kernels (see reduce.cu) and their launch shapes, in a header so that
// the same source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_fp32_ops.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::cuda::reduce_kernels {

constexpr int kSumBlocks = 1024;
constexpr int kSumThreads = 256;

MT_KERNEL_INLINE __global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  const int64_t stride = int64_t(kSumBlocks) * kSumThreads;
  double s = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * kSumThreads + threadIdx.x; i < n; i += stride) {
    const double xi = x[i];
    s += xi * xi;
  }
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block of kSumBlocks threads, one partial each; the total is stored, or added to *result.
MT_KERNEL_INLINE __global__ void sum_partials_kernel(double* result, const double* partial, bool accumulate) {
  const double s = block_reduce(partial[threadIdx.x], SumOp{}, 0.0);
  if (threadIdx.x == 0) *result = accumulate ? *result + s : s;
}

MT_KERNEL_INLINE __global__ void all_finite_kernel(int* any_bad, const float* x, int64_t n) {
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(x[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *any_bad = 1;  // every writer writes the same value
}

// The fixed grids of the two sum-of-squares kernels, independent of n and of the device.
inline LaunchShape partial_shape() { return {dim3(kSumBlocks), dim3(kSumThreads)}; }
inline LaunchShape partials_shape() { return {dim3(1), dim3(kSumBlocks)}; }
// all_finite_kernel: a grid-stride loop over the n values.
inline LaunchShape all_finite_shape(int64_t n) { return {dim3(grid_for(n)), dim3(kBlock)}; }

}  // namespace mt::cuda::reduce_kernels
