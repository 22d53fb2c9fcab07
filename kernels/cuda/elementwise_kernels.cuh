// The element-wise kernels (see elementwise.cu) and their launch shape, in a header so that the same
// source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_ops.cpp and tests/test_emu_fp32_ops.cpp run them against the
// CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::elementwise_kernels {

__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// No __restrict__: out may alias a or b (each element is read, then written, by one thread).
template <class D>
__global__ void add_kernel(D* out, const D* a, const D* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = store_as<D>(load(a[i]) + load(b[i]));
}

MT_KERNEL_INLINE __global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= s;
}

template <class D>
__global__ void gelu_fwd_kernel(D* out, const D* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = store_as<D>(gelu(load(inp[i])));
}

// dinp is an activation gradient: assigned, not accumulated.
template <class D>
__global__ void gelu_bwd_kernel(D* dinp, const D* dout, const D* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dinp[i] = store_as<D>(load(dout[i]) * gelu_grad(load(inp[i])));
}

template <class To, class From>
__global__ void convert_kernel(To* out, const From* in, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = store_as<To>(load(in[i]));
}

MT_KERNEL_INLINE __global__ void round_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = bf16_bits_to_f32(f32_to_bf16_bits(x[i]));
}

MT_KERNEL_INLINE __global__ void round_f16_kernel(float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = f16_bits_to_f32(f32_to_f16_bits(x[i]));
}

// Every kernel here: a grid-stride loop over the n elements.
inline LaunchShape elementwise_shape(int64_t n) { return {dim3(grid_for(n)), dim3(kBlock)}; }

}  // namespace mt::cuda::elementwise_kernels
