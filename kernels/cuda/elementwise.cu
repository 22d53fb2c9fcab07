// Element-wise ops: add, GELU forward/backward and convert on storage types; scale and round_to on fp32.
// All are grid-stride loops over int64 indices, one element per thread per iteration; each loads its
// inputs into fp32, computes, and rounds once on store (storage.cuh).
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// No __restrict__: out may alias a or b (each element is read, then written, by one thread).
template <class D>
__global__ void add_kernel(D* out, const D* a, const D* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = store_as<D>(load(a[i]) + load(b[i]));
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
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

__global__ void round_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = bf16_bits_to_f32(f32_to_bf16_bits(x[i]));
}

__global__ void round_f16_kernel(float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = f16_bits_to_f32(f32_to_f16_bits(x[i]));
}

}  // namespace

template <class S>
void add(S* out, const S* a, const S* b, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  add_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(dev_ptr(out), dev_ptr(a), dev_ptr(b), N);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  gelu_fwd_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(dev_ptr(out), dev_ptr(inp), N);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  gelu_bwd_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(dev_ptr(dinp), dev_ptr(dout), dev_ptr(inp), N);
  MT_CUDA_CHECK_LAUNCH();
}

template <class D, class S>
void convert(D* out, const S* in, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  if constexpr (std::is_same_v<D, S>) {
    if (static_cast<const void*>(out) == static_cast<const void*>(in)) return;
    MT_CUDA_CHECK(cudaMemcpyAsync(out, in, size_t(N) * sizeof(S), cudaMemcpyDeviceToDevice, stream_of(ctx)));
  } else {
    convert_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(dev_ptr(out), dev_ptr(in), N);
    MT_CUDA_CHECK_LAUNCH();
  }
}

void scale(float* x, float s, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  scale_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(x, s, N);
  MT_CUDA_CHECK_LAUNCH();
}

void round_to(float* x, int64_t N, DType t, const ops::Ctx& ctx) {
  MT_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16, "round_to: %s is not a floating-point type",
           dtype_name(t));
  if (N <= 0 || t == DType::f32) return;
  if (t == DType::bf16)
    round_bf16_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(x, N);
  else
    round_f16_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(x, N);
  MT_CUDA_CHECK_LAUNCH();
}

#define MT_ELEMENTWISE_INSTANTIATE(S)                                                \
  template void add<S>(S*, const S*, const S*, int64_t, const ops::Ctx&);            \
  template void gelu_fwd<S>(S*, const S*, int64_t, const ops::Ctx&);                 \
  template void gelu_bwd<S>(S*, const S*, const S*, int64_t, const ops::Ctx&);       \
  template void convert<S, float>(S*, const float*, int64_t, const ops::Ctx&);
MT_ELEMENTWISE_INSTANTIATE(float)
MT_ELEMENTWISE_INSTANTIATE(bf16)
MT_ELEMENTWISE_INSTANTIATE(f16)
#undef MT_ELEMENTWISE_INSTANTIATE
template void convert<float, bf16>(float*, const bf16*, int64_t, const ops::Ctx&);
template void convert<float, f16>(float*, const f16*, int64_t, const ops::Ctx&);

}  // namespace mt::cuda
