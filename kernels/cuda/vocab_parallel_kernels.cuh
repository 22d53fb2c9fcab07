// The vocabulary-parallel kernels (see vocab_parallel.cu) and their launch shapes, in a header so that
// the same source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_vocab_parallel.cpp runs them against the CPU twins
// (kernels/cpu/vocab_parallel.cpp).
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax_xent_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::vocab_parallel_kernels {

using softmax_xent_kernels::block_max_sum;
using softmax_xent_kernels::kXentThreads;
using softmax_xent_kernels::MaxSum;

// out[n, :] = table[ids[n] - row0, :] when that row is one of this rank's `rows`, zero otherwise.
template <class D>
__global__ void embedding_fwd_kernel(D* out, const int32_t* ids, const D* table, int row0, int rows, int C,
                                     int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = idx / C;
    const int c = int(idx - n * C);
    const int64_t r = int64_t(ids[n]) - row0;
    out[idx] = r >= 0 && r < rows ? table[r * C + c] : store_as<D>(0.f);
  }
}

// Real (unpadded) columns of the slice [col0, col0 + Vl) of a vocabulary of V real columns.
__device__ inline int real_columns(int col0, int V, int Vl) {
  const int r = V - col0;
  return r < 0 ? 0 : (r > Vl ? Vl : r);
}

// Per row of this rank's slice of the logits, three numbers: the max over the slice's real columns,
// the sum of exp(x - max) over them, and the target's logit when the target lies in the slice (else
// 0). Rows with an ignored target, or a slice with no real columns: (-inf, 0, 0).
template <class D>
__global__ void xent_slice_stats_kernel(float* stats, const D* logits, const int32_t* targets, int col0, int V,
                                        int Vl) {
  const int64_t row = blockIdx.x;
  const D* x = logits + row * Vl;
  float* st = stats + row * 3;
  const int t = targets[row], real = real_columns(col0, V, Vl);
  if (real == 0 || t < 0) {
    if (threadIdx.x == 0) st[0] = -INFINITY, st[1] = 0.f, st[2] = 0.f;
    return;
  }
  MaxSum ms{-INFINITY, 0.f};
  for (int j = int(threadIdx.x); j < real; j += int(blockDim.x)) {
    const float v = load(x[j]);
    if (v > ms.m) {
      ms.s = ms.s * expf(ms.m - v) + 1.f;
      ms.m = v;
    } else {
      ms.s += expf(v - ms.m);
    }
  }
  ms = block_max_sum(ms);
  if (threadIdx.x == 0) {
    st[0] = ms.m;
    st[1] = ms.s;
    st[2] = t >= col0 && t < col0 + real ? load(x[t - col0]) : 0.f;
  }
}

// The loss of each row from the P ranks' gathered statistics (stats_all: rank r's N rows of three at
// r N 3), merged in rank order as every rank does, and the gradient of this rank's slice:
// dlogits_j = dloss (exp(x_j - m) / Z - [j == target]), 0 in padded columns and ignored rows. A
// target past the vocabulary gives NaN (as softmax_xent_kernel). dlogits may alias logits: each
// element is read and written by the same thread.
template <class D>
__global__ void xent_slice_finish_kernel(float* losses, D* dlogits, const D* logits, const float* stats_all, int P,
                                         const int32_t* targets, float dloss, int col0, int N, int V, int Vl) {
  const int64_t row = blockIdx.x;
  const int t = targets[row], real = real_columns(col0, V, Vl);
  D* dx = dlogits ? dlogits + row * Vl : nullptr;
  if (t < 0) {
    if (threadIdx.x == 0) losses[row] = 0.f;
    if (dx)
      for (int j = int(threadIdx.x); j < Vl; j += int(blockDim.x)) dx[j] = store_as<D>(0.f);
    return;
  }
  // Every thread merges the P partials itself (P is the tp size: a few values), in rank order.
  float m = -INFINITY, xt = 0.f, z = 0.f;
  for (int r = 0; r < P; r++) m = fmaxf(m, stats_all[(int64_t(r) * N + row) * 3]);
  for (int r = 0; r < P; r++) {
    const float* st = stats_all + (int64_t(r) * N + row) * 3;
    if (st[1] > 0.f) z += st[1] * expf(st[0] - m);
    xt += st[2];
  }
  const bool valid = t < V;
  if (threadIdx.x == 0) losses[row] = valid ? logf(z) - (xt - m) : NAN;
  if (!dx) return;
  const float s = dloss / z;
  const D* x = logits + row * Vl;
  for (int j = int(threadIdx.x); j < Vl; j += int(blockDim.x)) {
    float g = 0.f;
    if (j < real) g = expf(load(x[j]) - m) * s - (j == t - col0 ? dloss : 0.f);
    dx[j] = store_as<D>(valid ? g : NAN);
  }
}

// embedding_fwd_kernel: a grid-stride loop over the N C outputs.
inline LaunchShape embedding_shape(int64_t total) { return {dim3(grid_for(total)), dim3(kBlock)}; }
// The statistics and finish kernels: one block of kXentThreads per row.
inline LaunchShape slice_shape(int N) { return {dim3(unsigned(N)), dim3(kXentThreads)}; }

}  // namespace mt::cuda::vocab_parallel_kernels
