// LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), eps = 1e-5, one warp per row, on
// storage type S with fp32 statistics.
//
// Forward: mean = sum(x)/C, var = sum((x - mean)^2)/C (two passes, no E[x^2] - mean^2 cancellation),
// rstd = 1/sqrt(var + eps), out = (x - mean) rstd w + b, rounded once to S.
// The fused residual form first stores res = a + b (rounded to S) and normalises that stored value,
// so it gives exactly what add followed by layernorm_fwd gives.
// Backward with n = (x - mean) rstd and g = dout w:
//   dinp = [dinp +] rstd (g - mean(g) - n mean(g n))  (assigned, or added to the residual gradient
//                                                       already in dinp when `accumulate`; one rounding)
//   dweight += sum_rows dout n, dbias += sum_rows dout (fp32 parameter gradients accumulate)
// The column sums run in their own kernel with a fixed reduction order, not atomics. dinp may alias
// dout: each element is read before it is written by the same thread, and the column sums run first.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

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

// A block owns 32 columns; its 32 thread rows stride over the N rows, then row lane 0 adds the 32
// partials in lane order (reproducible bits for a given N and C).
template <class D>
__global__ void layernorm_bwd_params_kernel(float* dweight, float* dbias, const D* dout, const D* inp,
                                            const float* mean, const float* rstd, int N, int C) {
  __shared__ float part_w[kWarp][kWarp + 1];
  __shared__ float part_b[kWarp][kWarp + 1];
  const int c = int(blockIdx.x) * kWarp + int(threadIdx.x);
  float sw = 0.f, sb = 0.f;
  if (c < C) {
    for (int r = int(threadIdx.y); r < N; r += int(blockDim.y)) {
      const int64_t i = int64_t(r) * C + c;
      const float dy = load(dout[i]);
      sw += dy * (load(inp[i]) - mean[r]) * rstd[r];
      sb += dy;
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

template <class S>
void layernorm_fwd(S* out, float* mean, float* rstd, const S* inp, const S* weight, const S* bias, int N, int C,
                   const ops::Ctx& ctx) {
  if (N == 0) return;
  MT_CHECK(C > 0, "layernorm_fwd: C must be positive (got %d)", C);
  layernorm_fwd_kernel<<<ceil_div(N, kRowsPerBlock), kBlock, 0, stream_of(ctx)>>>(
      dev_ptr(out), mean, rstd, dev_ptr(inp), dev_ptr(weight), dev_ptr(bias), N, C);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void residual_layernorm_fwd(S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* weight,
                            const S* bias, int N, int C, const ops::Ctx& ctx) {
  if (N == 0) return;
  MT_CHECK(C > 0, "residual_layernorm_fwd: C must be positive (got %d)", C);
  residual_layernorm_fwd_kernel<<<ceil_div(N, kRowsPerBlock), kBlock, 0, stream_of(ctx)>>>(
      dev_ptr(res), dev_ptr(out), mean, rstd, dev_ptr(a), dev_ptr(b), dev_ptr(weight), dev_ptr(bias), N, C);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void layernorm_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                   const float* mean, const float* rstd, int N, int C, bool accumulate, const ops::Ctx& ctx) {
  if (N == 0 || C == 0) return;
  // Parameter sums first: they read dout, which dinp may alias (as on the CPU backend).
  if (dweight || dbias) {
    layernorm_bwd_params_kernel<<<ceil_div(C, kWarp), dim3(kWarp, kWarp), 0, stream_of(ctx)>>>(
        dweight, dbias, dev_ptr(dout), dev_ptr(inp), mean, rstd, N, C);
    MT_CUDA_CHECK_LAUNCH();
  }
  if (dinp) {
    layernorm_bwd_dinp_kernel<<<ceil_div(N, kRowsPerBlock), kBlock, 0, stream_of(ctx)>>>(
        dev_ptr(dinp), dev_ptr(dout), dev_ptr(inp), dev_ptr(weight), mean, rstd, N, C, accumulate);
    MT_CUDA_CHECK_LAUNCH();
  }
}

#define MT_LAYERNORM_INSTANTIATE(S)                                                                            \
  template void layernorm_fwd<S>(S*, float*, float*, const S*, const S*, const S*, int, int, const ops::Ctx&);  \
  template void residual_layernorm_fwd<S>(S*, S*, float*, float*, const S*, const S*, const S*, const S*, int,  \
                                          int, const ops::Ctx&);                                               \
  template void layernorm_bwd<S>(S*, float*, float*, const S*, const S*, const S*, const float*, const float*,  \
                                 int, int, bool, const ops::Ctx&);
MT_LAYERNORM_INSTANTIATE(float)
MT_LAYERNORM_INSTANTIATE(bf16)
MT_LAYERNORM_INSTANTIATE(f16)
#undef MT_LAYERNORM_INSTANTIATE

}  // namespace mt::cuda
