// The kernels, launch shapes and GEMM descriptors of the materialised attention (see attention.cu), in a
// header so that the same source builds twice: by nvcc for the GPU, and by the host compiler against the
// warp emulator (warp_emulation.h), on which tests/test_emu_gemm.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/storage.cuh"
#include "runtime/dtype.h"

namespace mt::cuda::attention_kernels {

constexpr int kRowsPerBlock = kBlock / kWarp;

// One warp per row (b, h, i): token i sees j <= i in its own document. The masked entries become exact
// zeros, so the P V product and the backward need no mask of their own. No __restrict__: for float
// storage att and scores are the same buffer (each lane reads and writes only its own columns j).
template <class D>
__global__ void masked_softmax_kernel(D* att, const float* scores, const int32_t* doc, int B, int NH, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= int64_t(B) * NH * T) return;
  const int i = int(row % T);
  const int b = int(row / (int64_t(NH) * T));
  const int32_t* d = doc ? doc + int64_t(b) * T : nullptr;
  const float* s = scores + row * T;
  D* p = att + row * T;
  auto visible = [&](int j) { return j <= i && (d == nullptr || d[j] == d[i]); };
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += kWarp)
    if (visible(j)) mx = fmaxf(mx, s[j]);
  mx = warp_reduce(mx, MaxOp{});
  float sum = 0.f;
  for (int j = lane; j <= i; j += kWarp)
    if (visible(j)) sum += expf(s[j] - mx);
  const float inv = 1.f / warp_reduce(sum, SumOp{});
  for (int j = lane; j < T; j += kWarp) p[j] = store_as<D>(visible(j) ? expf(s[j] - mx) * inv : 0.f);
}

// dS = P * (dP - sum_j P dP) per row, in place over dP. P is zero wherever a token may not look, so the
// product is zero there too; the causal half is written explicitly.
template <class D>
__global__ void softmax_bwd_kernel(float* dp, const D* att, int64_t rows, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= rows) return;
  const int i = int(row % T);
  const D* p = att + row * T;
  float* g = dp + row * T;
  float dot = 0.f;
  for (int j = lane; j <= i; j += kWarp) dot += load(p[j]) * g[j];
  dot = warp_reduce(dot, SumOp{});
  for (int j = lane; j < T; j += kWarp) g[j] = j <= i ? load(p[j]) * (g[j] - dot) : 0.f;
}

// dqkv[r, c] = dqk[r, c] rounded, for the q and k columns c < 2C of every row r (row stride 3C).
template <class D>
__global__ void store_qk_kernel(D* dqkv, const float* dqk, int64_t rows, int C) {
  const int64_t total = rows * 2 * C;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / (2 * C);
    const int64_t at = r * 3 * C + (idx - r * 2 * C);
    dqkv[at] = store_as<D>(dqk[at]);
  }
}

// ---- the batched GEMMs, as the descriptors attention.cu hands to gemm() (gemm.cuh) ----
// (The emulator tests run the same descriptors through gemm()'s SIMT fallback kernel.)

struct Dims {
  int B, T, C, NH, hs;
  int64_t tt() const { return int64_t(T) * T; }
  int64_t qkv_row(int b) const { return int64_t(b) * T * 3 * C; }
  float scale() const { return 1.f / std::sqrt(float(hs)); }
};

// A per-head GEMM batched over the NH heads of one batch element.
inline Gemm head_gemm(const Dims& s, int m, int n, int k, DType ab, DType d) {
  Gemm g;
  g.m = m, g.n = n, g.k = k;
  g.batch = s.NH;
  g.ab_type = ab, g.d_type = d;
  return g;
}

// S^T (T x T) = K^T Q / sqrt(hs) of batch element b, into fp32 scores (B, NH, T, T).
template <class S>
Gemm scores_gemm(const Dims& s, float* scores, const S* qkv, int b) {
  const S* q = qkv + s.qkv_row(b);
  Gemm g = head_gemm(s, s.T, s.T, s.hs, dtype_of<S>(), DType::f32);
  g.trans_a = true, g.a = q + s.C, g.lda = 3 * s.C, g.stride_a = s.hs;
  g.b = q, g.ldb = 3 * s.C, g.stride_b = s.hs;
  g.d = scores + int64_t(b) * s.NH * s.tt(), g.ldd = s.T, g.stride_d = s.tt();
  g.alpha = s.scale();
  return g;
}

// O (hs x T) = V (hs x T) P^T-as-stored (T x T), into out (B, T, C).
template <class S>
Gemm out_gemm(const Dims& s, S* out, const S* qkv, const S* att, int b) {
  Gemm g = head_gemm(s, s.hs, s.T, s.T, dtype_of<S>(), dtype_of<S>());
  g.a = qkv + s.qkv_row(b) + 2 * s.C, g.lda = 3 * s.C, g.stride_a = s.hs;
  g.b = att + int64_t(b) * s.NH * s.tt(), g.ldb = s.T, g.stride_b = s.tt();
  g.d = out + int64_t(b) * s.T * s.C, g.ldd = s.C, g.stride_d = s.hs;
  return g;
}

// dP^T (T x T) = V^T dO, into the fp32 scratch (B, NH, T, T).
template <class S>
Gemm dp_gemm(const Dims& s, float* scratch, const S* dout, const S* qkv, int b) {
  Gemm g = head_gemm(s, s.T, s.T, s.hs, dtype_of<S>(), DType::f32);
  g.trans_a = true, g.a = qkv + s.qkv_row(b) + 2 * s.C, g.lda = 3 * s.C, g.stride_a = s.hs;
  g.b = dout + int64_t(b) * s.T * s.C, g.ldb = s.C, g.stride_b = s.hs;
  g.d = scratch + int64_t(b) * s.NH * s.tt(), g.ldd = s.T, g.stride_d = s.tt();
  return g;
}

// dQ (hs x T) = K dS^T-as-stored / sqrt(hs), fp32 (qkv32 and dqk32 have qkv's layout).
inline Gemm dq_gemm(const Dims& s, float* dqk32, const float* qkv32, const float* ds_all, int b) {
  const int64_t row0 = s.qkv_row(b);
  Gemm g = head_gemm(s, s.hs, s.T, s.T, DType::f32, DType::f32);
  g.a = qkv32 + row0 + s.C, g.lda = 3 * s.C, g.stride_a = s.hs;
  g.b = ds_all + int64_t(b) * s.NH * s.tt(), g.ldb = s.T, g.stride_b = s.tt();
  g.d = dqk32 + row0, g.ldd = 3 * s.C, g.stride_d = s.hs;
  g.alpha = s.scale();
  return g;
}

// dK (hs x T) = Q (dS^T-as-stored)^T / sqrt(hs), fp32.
inline Gemm dk_gemm(const Dims& s, float* dqk32, const float* qkv32, const float* ds_all, int b) {
  const int64_t row0 = s.qkv_row(b);
  Gemm g = head_gemm(s, s.hs, s.T, s.T, DType::f32, DType::f32);
  g.a = qkv32 + row0, g.lda = 3 * s.C, g.stride_a = s.hs;
  g.trans_b = true, g.b = ds_all + int64_t(b) * s.NH * s.tt(), g.ldb = s.T, g.stride_b = s.tt();
  g.d = dqk32 + row0 + s.C, g.ldd = 3 * s.C, g.stride_d = s.hs;
  g.alpha = s.scale();
  return g;
}

// dV (hs x T) = dO (P^T-as-stored)^T, into dqkv.
template <class S>
Gemm dv_gemm(const Dims& s, S* dqkv, const S* dout, const S* att, int b) {
  Gemm g = head_gemm(s, s.hs, s.T, s.T, dtype_of<S>(), dtype_of<S>());
  g.a = dout + int64_t(b) * s.T * s.C, g.lda = s.C, g.stride_a = s.hs;
  g.trans_b = true, g.b = att + int64_t(b) * s.NH * s.tt(), g.ldb = s.T, g.stride_b = s.tt();
  g.d = dqkv + s.qkv_row(b) + 2 * s.C, g.ldd = 3 * s.C, g.stride_d = s.hs;
  return g;
}

// ---- launch shapes ----

// masked_softmax_kernel, softmax_bwd_kernel: one warp per row of the (B, NH, T, T) scores.
inline LaunchShape rows_shape(int64_t rows) { return {dim3(ceil_div(rows, kRowsPerBlock)), dim3(kBlock)}; }
// store_qk_kernel: a grid-stride loop over the q and k columns of the rows.
inline LaunchShape store_qk_shape(int64_t rows, int C) { return {dim3(grid_for(rows * 2 * C)), dim3(kBlock)}; }


}  // namespace mt::cuda::attention_kernels
