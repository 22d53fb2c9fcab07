// Element-wise ops: add, scale, GELU forward/backward, and rounding to bf16/fp16 in fp32 storage.
// All are grid-stride loops over int64 indices, one element per thread per iteration.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace mt::cuda {
namespace {

__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= s;
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. for GPT-2):
// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;

__global__ void gelu_fwd_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    out[i] = 0.5f * x * (1.f + tanhf(u));
  }
}

// d gelu/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// dinp is an activation gradient: assigned, not accumulated.
__global__ void gelu_bwd_kernel(float* dinp, const float* dout, const float* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float th = tanhf(u);
    const float du = kGeluScale * (1.f + 3.f * kGeluCube * x * x);
    dinp[i] = dout[i] * (0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * du);
  }
}

// Bit-exact twins of f32_to_bf16 / f32_to_f16 / f16_to_f32 in runtime/dtype.h (round to nearest, ties to
// even; NaN stays a quiet NaN; fp16 overflow becomes inf; fp16 subnormals rounded on the 2^-24 grid), so
// both backends round every value to the same bits.
__device__ inline float round_bf16_dev(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((u >> 16) | 0x40u) << 16);
  u += 0x7fffu + ((u >> 16) & 1u);
  return __uint_as_float((u >> 16) << 16);
}

__device__ inline uint32_t f32_to_f16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    // Subnormal or zero: the value times 2^24 (exact, a power-of-two scale) rounded to an integer.
    const float scaled = __uint_as_float(a) * 16777216.0f;
    uint32_t q = uint32_t(scaled);
    const float rem = scaled - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
    return sign | q;
  }
  a += 0xfffu + ((a >> 13) & 1u);
  a -= (112u << 23);
  return sign | (a >> 13);
}

__device__ inline float f16_bits_to_f32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = float(man) / 16777216.0f;
    return sign ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = round_bf16_dev(x[i]);
}

__global__ void round_f16_kernel(float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = f16_bits_to_f32(f32_to_f16_bits(x[i]));
}

}  // namespace

void add(float* out, const float* a, const float* b, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  add_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(out, a, b, N);
  MT_CUDA_CHECK_LAUNCH();
}

void scale(float* x, float s, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  scale_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(x, s, N);
  MT_CUDA_CHECK_LAUNCH();
}

void gelu_fwd(float* out, const float* inp, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  gelu_fwd_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(out, inp, N);
  MT_CUDA_CHECK_LAUNCH();
}

void gelu_bwd(float* dinp, const float* dout, const float* inp, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  gelu_bwd_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(dinp, dout, inp, N);
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

}  // namespace mt::cuda
