// The LayerNorm kernels (see layernorm.cu for the formulas) and their launch shapes, in a header so that
// the same source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_ops.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/column_sum_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::layernorm_kernels {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = kBlock / kWarp;

// Normalises row x (already in S) of one warp and writes out, mean and rstd.
template <class D>
__device__ void normalize_row(D* y, float* mean, float* rstd, const D* x, const D* weight, const D* bias, int row,
                              int C, int lane) {
  float s = 0.f;
  for (int c = lane; c < C; c += kWarp) s += load(x[c]);
  const float m = warp_reduce(s, SumOp{}) / float(C);
  float v = 0.f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = load(x[c]) - m;
    v += d * d;
  }
  const float r = 1.f / sqrtf(warp_reduce(v, SumOp{}) / float(C) + kEps);
  for (int c = lane; c < C; c += kWarp) {
    const float n = (load(x[c]) - m) * r;
    y[c] = store_as<D>(n * load(weight[c]) + (bias ? load(bias[c]) : 0.f));
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

template <class D>
__global__ void layernorm_fwd_kernel(D* out, float* mean, float* rstd, const D* inp, const D* weight, const D* bias,
                                     int N, int C) {
  const int row = int(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarp;
  if (row >= N) return;
  const int64_t off = int64_t(row) * C;
  normalize_row(out + off, mean, rstd, inp + off, weight, bias, row, C, int(threadIdx.x) % kWarp);
}

// No __restrict__: res may alias a or b. Lane l writes res[c] for its own columns c only and later
// reads back exactly those, so the normalisation sees the rounded sum it stored.
template <class D>
__global__ void residual_layernorm_fwd_kernel(D* res, D* out, float* mean, float* rstd, const D* a, const D* b,
                                              const D* weight, const D* bias, int N, int C) {
  const int row = int(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= N) return;
  const int64_t off = int64_t(row) * C;
  for (int c = lane; c < C; c += kWarp) res[off + c] = store_as<D>(load(a[off + c]) + load(b[off + c]));
  normalize_row(out + off, mean, rstd, res + off, weight, bias, row, C, lane);
}

template <class D>
__global__ void layernorm_bwd_dinp_kernel(D* dinp, const D* dout, const D* inp, const D* weight, const float* mean,
                                          const float* rstd, int N, int C, bool accumulate) {
  const int row = int(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= N) return;
  const D* x = inp + int64_t(row) * C;
  const D* dy = dout + int64_t(row) * C;
  const float m = mean[row], r = rstd[row];
  float sum_g = 0.f, sum_gn = 0.f;
  for (int c = lane; c < C; c += kWarp) {
    const float g = load(dy[c]) * load(weight[c]);
    sum_g += g;
    sum_gn += g * (load(x[c]) - m) * r;
  }
  const float mean_g = warp_reduce(sum_g, SumOp{}) / float(C);
  const float mean_gn = warp_reduce(sum_gn, SumOp{}) / float(C);
  D* dx = dinp + int64_t(row) * C;
  for (int c = lane; c < C; c += kWarp) {
    const float n = (load(x[c]) - m) * r;
    const float d = r * (load(dy[c]) * load(weight[c]) - mean_g - n * mean_gn);
    dx[c] = store_as<D>(accumulate ? load(dx[c]) + d : d);
  }
}

// The two terms of the parameter gradients at (r, c): dout n for dweight, dout for dbias; summed over
// the rows by the two-pass column sum (column_sum_kernels.cuh).
template <class D>
struct ParamGradTerms {
  const D* dout;
  const D* inp;
  const float* mean;
  const float* rstd;
  __device__ void operator()(int r, int /*c*/, int64_t i, float (&v)[2]) const {
    const float dy = load(dout[i]);
    v[0] = dy * (load(inp[i]) - mean[r]) * rstd[r];
    v[1] = dy;
  }
};

// One warp per row: layernorm_fwd_kernel, residual_layernorm_fwd_kernel, layernorm_bwd_dinp_kernel.
inline LaunchShape rows_shape(int N) { return {dim3(ceil_div(N, kRowsPerBlock)), dim3(kBlock)}; }

}  // namespace mt::cuda::layernorm_kernels
