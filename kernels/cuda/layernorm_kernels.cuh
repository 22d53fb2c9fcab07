// The LayerNorm kernels (see layernorm.cu for the formulas) and their launch shapes, in a header so that
// the same source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_ops.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

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

// ---- the forward with 16-byte accesses ----
// Where every row, weight and bias is 16-byte aligned and C is a multiple of kVec<D> = 16 / sizeof(D),
// lane l holds the row's chunks l, l + 32, ... of kVec<D> values in registers (kChunks of them at
// most): one 16-byte load per chunk and the row read from memory once, against three scalar passes.
template <class D>
constexpr int kVec = int(16 / sizeof(D));
constexpr int kMaxChunksPerLane = 8;

// One 16-byte access per chunk; the values move between the uint4 and the D array by memcpy (register
// moves on the device, and no aliasing of one type as another).
template <class D>
__device__ inline void load_chunk(float (&v)[kVec<D>], const D* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  D e[kVec<D>];
  memcpy(static_cast<void*>(e), &raw, sizeof(raw));
#pragma unroll
  for (int i = 0; i < kVec<D>; i++) v[i] = load(e[i]);
}

template <class D>
__device__ inline void store_chunk(D* p, const float (&v)[kVec<D>]) {
  D e[kVec<D>];
#pragma unroll
  for (int i = 0; i < kVec<D>; i++) e[i] = store_as<D>(v[i]);
  uint4 raw;
  memcpy(&raw, e, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}

// Normalises the row held in v (chunk j of lane l is the row's chunk l + 32 j; chunks past the row are
// not used) and writes out, mean and rstd, as normalize_row does.
template <class D, int kChunks>
__device__ void normalize_chunks(D* y, float* mean, float* rstd, const float (&v)[kChunks][kVec<D>], const D* weight,
                                 const D* bias, int row, int C, int lane) {
  const int nchunks = C / kVec<D>;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kChunks; j++)
    if (lane + j * kWarp < nchunks)
#pragma unroll
      for (int i = 0; i < kVec<D>; i++) s += v[j][i];
  const float m = warp_reduce(s, SumOp{}) / float(C);
  float var = 0.f;
#pragma unroll
  for (int j = 0; j < kChunks; j++)
    if (lane + j * kWarp < nchunks)
#pragma unroll
      for (int i = 0; i < kVec<D>; i++) var += (v[j][i] - m) * (v[j][i] - m);
  const float r = 1.f / sqrtf(warp_reduce(var, SumOp{}) / float(C) + kEps);
#pragma unroll
  for (int j = 0; j < kChunks; j++) {
    const int q = lane + j * kWarp;
    if (q >= nchunks) continue;
    float w[kVec<D>], b[kVec<D>], o[kVec<D>];
    load_chunk(w, weight + q * kVec<D>);
    if (bias) load_chunk(b, bias + q * kVec<D>);
#pragma unroll
    for (int i = 0; i < kVec<D>; i++) o[i] = (v[j][i] - m) * r * w[i] + (bias ? b[i] : 0.f);
    store_chunk(y + q * kVec<D>, o);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = r;
  }
}

// The LayerNorm of x = a (b null), or of x = a + b rounded to D and stored to res (the residual form,
// normalised from the rounded values it stores, as residual_layernorm_fwd_kernel). res may alias a or
// b: each lane reads and writes its own chunks only.
template <class D, int kChunks>
__global__ void layernorm_fwd_vec_kernel(D* res, D* out, float* mean, float* rstd, const D* a, const D* b,
                                         const D* weight, const D* bias, int N, int C) {
  const int row = int(blockIdx.x) * kRowsPerBlock + int(threadIdx.x) / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= N) return;
  const int64_t off = int64_t(row) * C;
  const int nchunks = C / kVec<D>;
  float v[kChunks][kVec<D>];
#pragma unroll
  for (int j = 0; j < kChunks; j++) {
    const int q = lane + j * kWarp;
    if (q >= nchunks) continue;
    load_chunk(v[j], a + off + q * kVec<D>);
    if (!b) continue;
    float vb[kVec<D>];
    load_chunk(vb, b + off + q * kVec<D>);
#pragma unroll
    for (int i = 0; i < kVec<D>; i++) v[j][i] = load(store_as<D>(v[j][i] + vb[i]));  // the value res holds
    store_chunk(res + off + q * kVec<D>, v[j]);
  }
  normalize_chunks<D, kChunks>(out + off, mean, rstd, v, weight, bias, row, C, lane);
}

// Calls f(std::integral_constant<int, K>{}) with the smallest K (chunks per lane) that covers C and
// returns true; false when the 16-byte forward does not take C (not a multiple of kVec<D>, or above
// 32 x kMaxChunksPerLane chunks).
template <class D, class F>
bool with_chunks_per_lane(int C, F&& f) {
  if (C <= 0 || C % kVec<D> != 0) return false;
  const int per_lane = int(ceil_div(C / kVec<D>, kWarp));
  switch (per_lane) {
    case 1: return f(std::integral_constant<int, 1>{}), true;
    case 2: return f(std::integral_constant<int, 2>{}), true;
    case 3: return f(std::integral_constant<int, 3>{}), true;
    case 4: return f(std::integral_constant<int, 4>{}), true;
    case 5: return f(std::integral_constant<int, 5>{}), true;
    case 6: return f(std::integral_constant<int, 6>{}), true;
    case 7: return f(std::integral_constant<int, 7>{}), true;
    case 8: return f(std::integral_constant<int, 8>{}), true;
    default: return false;
  }
}

// dinp of one row (the calling warp's), given the row's mean(g) and mean(g n): the second pass of the
// backward, shared by both backward kernels.
template <class D>
__device__ inline void store_dinp_row(D* dx, const D* x, const D* dy, const D* weight, float m, float r, float mean_g,
                                      float mean_gn, int C, int lane, bool accumulate) {
  for (int c = lane; c < C; c += kWarp) {
    const float n = (load(x[c]) - m) * r;
    const float d = r * (load(dy[c]) * load(weight[c]) - mean_g - n * mean_gn);
    dx[c] = store_as<D>(accumulate ? load(dx[c]) + d : d);
  }
}

// dinp only, one warp per row (no parameter gradients, or C above the fused kernel's limit).
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
  store_dinp_row(dinp + int64_t(row) * C, x, dy, weight, m, r, mean_g, mean_gn, C, lane, accumulate);
}

// dinp and the parameter gradients in one pass over dout and inp. Each warp takes rows warp, warp +
// 8 G, ... of its block's share (G = gridDim.x blocks, a function of N alone) and keeps, per lane, the
// dweight and dbias terms of its columns c = lane + 32 j (j < kCols, kCols >= C / 32) summed over its
// rows; the block adds its 8 warps' sums in warp order into partial[0][block][c] (dweight) and
// partial[1][block][c] (dbias), which column_finish_kernel (column_sum_kernels.cuh) adds up in block
// order. No atomics: the bits depend only on N and C.
template <class D, int kCols>
__global__ void layernorm_bwd_kernel(D* dinp, float* partial, const D* dout, const D* inp, const D* weight,
                                     const float* mean, const float* rstd, int N, int C, bool accumulate) {
  MT_SHARED(float[kRowsPerBlock][kWarp + 1], part_w);
  MT_SHARED(float[kRowsPerBlock][kWarp + 1], part_b);
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  float acc_w[kCols], acc_b[kCols];
#pragma unroll
  for (int j = 0; j < kCols; j++) acc_w[j] = acc_b[j] = 0.f;
  for (int row = int(blockIdx.x) * kRowsPerBlock + warp; row < N; row += int(gridDim.x) * kRowsPerBlock) {
    const D* x = inp + int64_t(row) * C;
    const D* dy = dout + int64_t(row) * C;
    const float m = mean[row], r = rstd[row];
    float sum_g = 0.f, sum_gn = 0.f;
#pragma unroll
    for (int j = 0; j < kCols; j++) {
      const int c = lane + j * kWarp;
      if (c < C) {
        const float dyv = load(dy[c]), n = (load(x[c]) - m) * r, g = dyv * load(weight[c]);
        sum_g += g;
        sum_gn += g * n;
        acc_w[j] += dyv * n;
        acc_b[j] += dyv;
      }
    }
    const float mean_g = warp_reduce(sum_g, SumOp{}) / float(C);
    const float mean_gn = warp_reduce(sum_gn, SumOp{}) / float(C);
    store_dinp_row(dinp + int64_t(row) * C, x, dy, weight, m, r, mean_g, mean_gn, C, lane, accumulate);
  }
  const int64_t split = int64_t(blockIdx.x), splits = int64_t(gridDim.x);
#pragma unroll
  for (int j = 0; j < kCols; j++) {
    part_w[warp][lane] = acc_w[j];
    part_b[warp][lane] = acc_b[j];
    __syncthreads();
    const int c = lane + j * kWarp;
    if (warp == 0 && c < C) {
      float tw = 0.f, tb = 0.f;
      for (int w = 0; w < kRowsPerBlock; w++) {
        tw += part_w[w][lane];
        tb += part_b[w][lane];
      }
      partial[split * C + c] = tw;
      partial[(splits + split) * C + c] = tb;
    }
    __syncthreads();  // part_* are rewritten for the next j
  }
}

// The two terms of the parameter gradients at (r, c), dout n for dweight and dout for dbias, for the
// two-pass column sum (column_sum_kernels.cuh) where the fused kernel does not take C.
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

// layernorm_bwd_kernel: about 4 rows per warp, at most 2048 blocks; the parameter partials are summed by
// column_finish_kernel over this split (one per block).
constexpr int kFusedMaxBlocks = 2048;
inline column_sum_kernels::ColumnSplit fused_split(int N, int C) {
  column_sum_kernels::ColumnSplit s;
  s.R = N, s.C = C;
  s.splits = N <= 0 ? 1 : int(ceil_div(N, 4 * kRowsPerBlock));
  if (s.splits > kFusedMaxBlocks) s.splits = kFusedMaxBlocks;
  return s;
}
inline LaunchShape fused_shape(int N, int C) { return {dim3(unsigned(fused_split(N, C).splits)), dim3(kBlock)}; }

// The widest row the fused backward takes (64 columns per lane).
constexpr int kFusedMaxC = 64 * kWarp;

// Calls f(std::integral_constant<int, K>{}) with the smallest instantiated columns-per-lane K that
// covers C (K >= C / 32) and returns true; false when C is above kFusedMaxC (the unfused path).
template <class F>
bool with_cols_per_lane(int C, F&& f) {
  const int need = int(ceil_div(C, kWarp));
  if (need <= 4) return f(std::integral_constant<int, 4>{}), true;
  if (need <= 8) return f(std::integral_constant<int, 8>{}), true;
  if (need <= 16) return f(std::integral_constant<int, 16>{}), true;
  if (need <= 24) return f(std::integral_constant<int, 24>{}), true;
  if (need <= 32) return f(std::integral_constant<int, 32>{}), true;
  if (need <= 48) return f(std::integral_constant<int, 48>{}), true;
  if (need <= 64) return f(std::integral_constant<int, 64>{}), true;
  return false;
}

}  // namespace mt::cuda::layernorm_kernels
