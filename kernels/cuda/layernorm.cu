// LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), eps = 1e-5, one warp per row.
//
// Forward: mean = sum(x)/C, var = sum((x - mean)^2)/C (two passes, no E[x^2] - mean^2 cancellation),
// rstd = 1/sqrt(var + eps), out = (x - mean) rstd w + b.
// Backward with n = (x - mean) rstd and g = dout w:
//   dinp = rstd (g - mean(g) - n mean(g n))           (assigned: an activation gradient)
//   dweight += sum_rows dout n, dbias += sum_rows dout (parameter gradients accumulate)
// The column sums run in their own kernel with a fixed reduction order, not atomics. dinp may alias
// dout: each element is read before it is written by the same thread, and the column sums run first.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace mt::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = kBlock / kWarp;

__global__ void layernorm_fwd_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                     const float* bias, int N, int C) {
  const int row = int(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= N) return;
  const float* x = inp + int64_t(row) * C;
  float s = 0.f;
  for (int c = lane; c < C; c += kWarp) s += x[c];
  const float m = warp_reduce(s, SumOp{}) / float(C);
  float v = 0.f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float r = 1.f / sqrtf(warp_reduce(v, SumOp{}) / float(C) + kEps);
  float* y = out + int64_t(row) * C;
  for (int c = lane; c < C; c += kWarp) {
    const float n = (x[c] - m) * r;
    y[c] = n * weight[c] + (bias ? bias[c] : 0.f);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

__global__ void layernorm_bwd_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                          const float* mean, const float* rstd, int N, int C) {
  const int row = int(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= N) return;
  const float* x = inp + int64_t(row) * C;
  const float* dy = dout + int64_t(row) * C;
  const float m = mean[row], r = rstd[row];
  float sum_g = 0.f, sum_gn = 0.f;
  for (int c = lane; c < C; c += kWarp) {
    const float g = dy[c] * weight[c];
    sum_g += g;
    sum_gn += g * (x[c] - m) * r;
  }
  const float mean_g = warp_reduce(sum_g, SumOp{}) / float(C);
  const float mean_gn = warp_reduce(sum_gn, SumOp{}) / float(C);
  float* dx = dinp + int64_t(row) * C;
  for (int c = lane; c < C; c += kWarp) {
    const float n = (x[c] - m) * r;
    dx[c] = r * (dy[c] * weight[c] - mean_g - n * mean_gn);
  }
}

// A block owns 32 columns; its 32 thread rows stride over the N rows, then row lane 0 adds the 32
// partials in lane order (reproducible bits for a given N and C).
__global__ void layernorm_bwd_params_kernel(float* dweight, float* dbias, const float* dout, const float* inp,
                                            const float* mean, const float* rstd, int N, int C) {
  __shared__ float part_w[kWarp][kWarp + 1];
  __shared__ float part_b[kWarp][kWarp + 1];
  const int c = int(blockIdx.x) * kWarp + int(threadIdx.x);
  float sw = 0.f, sb = 0.f;
  if (c < C) {
    for (int r = int(threadIdx.y); r < N; r += int(blockDim.y)) {
      const int64_t i = int64_t(r) * C + c;
      sw += dout[i] * (inp[i] - mean[r]) * rstd[r];
      sb += dout[i];
    }
  }
  part_w[threadIdx.y][threadIdx.x] = sw;
  part_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.f, tb = 0.f;
    for (int y = 0; y < int(blockDim.y); y++) {
      tw += part_w[y][threadIdx.x];
      tb += part_b[y][threadIdx.x];
    }
    if (dweight) dweight[c] += tw;
    if (dbias) dbias[c] += tb;
  }
}

}  // namespace

void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                   int N, int C, const ops::Ctx& ctx) {
  if (N == 0) return;
  MT_CHECK(C > 0, "layernorm_fwd: C must be positive (got %d)", C);
  layernorm_fwd_kernel<<<ceil_div(N, kRowsPerBlock), kBlock, 0, stream_of(ctx)>>>(out, mean, rstd, inp, weight,
                                                                                  bias, N, C);
  MT_CUDA_CHECK_LAUNCH();
}

void layernorm_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, const float* mean, const float* rstd, int N, int C, const ops::Ctx& ctx) {
  if (N == 0 || C == 0) return;
  // Parameter sums first: they read dout, which dinp may alias (as on the CPU backend).
  if (dweight || dbias) {
    layernorm_bwd_params_kernel<<<ceil_div(C, kWarp), dim3(kWarp, kWarp), 0, stream_of(ctx)>>>(
        dweight, dbias, dout, inp, mean, rstd, N, C);
    MT_CUDA_CHECK_LAUNCH();
  }
  if (dinp) {
    layernorm_bwd_dinp_kernel<<<ceil_div(N, kRowsPerBlock), kBlock, 0, stream_of(ctx)>>>(dinp, dout, inp, weight,
                                                                                         mean, rstd, N, C);
    MT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mt::cuda
