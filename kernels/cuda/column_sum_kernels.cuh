// Column sums over a row-major (R, C) matrix in two passes: the bias gradient of a linear layer
// (matmul_kernels.cuh) and the weight and bias gradients of LayerNorm (layernorm_kernels.cuh).
//
// One pass with a block per 32 columns gives C/32 blocks: 24 for GPT-2's C = 768, which leaves most
// of a 132-SM GPU idle while it streams 32768 x 768 values. Here the rows are also split:
//   pass 1  a block per (32 columns, one split of the rows) sums its part into partial[k][split][c];
//   pass 2  a thread per column adds the splits in split order to the fp32 gradient (accumulated,
//           like every parameter gradient).
// The split is a function of R alone, and every sum runs in a fixed order (thread rows, then the
// block's 8 partials, then the splits), so the bits depend only on R and C: no atomics, and no
// dependence on the device.
//
// A Term gives the K values one element (r, c) adds to the K sums; the header builds twice (nvcc and the
// warp emulator), like every *_kernels.cuh.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mt::cuda::column_sum_kernels {

constexpr int kThreadRows = 8;        // pass 1: a block of 32 x 8 threads
constexpr int kRowsPerSplit = 256;    // each thread adds 32 rows...
constexpr int kMaxSplits = 1024;      // ...unless R is so large that the split count is capped
constexpr int kFinishThreads = 256;   // pass 2: a thread per column

// How the R rows are split; the same for every launch with this R.
struct ColumnSplit {
  int R = 0, C = 0;
  int splits = 1, rows_per_split = 0;
};

inline ColumnSplit column_split(int R, int C) {
  ColumnSplit s;
  s.R = R, s.C = C;
  s.splits = R <= 0 ? 1 : int(ceil_div(R, kRowsPerSplit));
  if (s.splits > kMaxSplits) s.splits = kMaxSplits;
  s.rows_per_split = R <= 0 ? 0 : int(ceil_div(R, s.splits));
  if (R > 0) s.splits = int(ceil_div(R, s.rows_per_split));  // no empty split at the end
  return s;
}

// Floats of the partial buffer of a K-sum reduction.
inline size_t partial_floats(const ColumnSplit& s, int K) { return size_t(K) * size_t(s.splits) * size_t(s.C); }

// The K output vectors of pass 2; a null one is skipped.
template <int K>
struct ColumnOutputs {
  float* out[K];
};

template <int K, class Term>
__global__ void column_partials_kernel(float* partial, Term term, ColumnSplit s) {
  MT_SHARED(float[K][kThreadRows][kWarp + 1], part);
  const int c = int(blockIdx.x) * kWarp + int(threadIdx.x);
  const int split = int(blockIdx.y);
  const int r_begin = split * s.rows_per_split;
  const int r_end = r_begin + s.rows_per_split < s.R ? r_begin + s.rows_per_split : s.R;
  float acc[K];
  for (int k = 0; k < K; k++) acc[k] = 0.f;
  if (c < s.C) {
    for (int r = r_begin + int(threadIdx.y); r < r_end; r += kThreadRows) {
      float v[K];
      term(r, c, int64_t(r) * s.C + c, v);
      for (int k = 0; k < K; k++) acc[k] += v[k];
    }
  }
  for (int k = 0; k < K; k++) part[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < s.C) {
    for (int k = 0; k < K; k++) {
      float total = 0.f;
      for (int y = 0; y < kThreadRows; y++) total += part[k][y][threadIdx.x];
      partial[(int64_t(k) * s.splits + split) * s.C + c] = total;
    }
  }
}

template <int K>
__global__ void column_finish_kernel(ColumnOutputs<K> outs, const float* partial, ColumnSplit s) {
  const int c = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (c >= s.C) return;
  for (int k = 0; k < K; k++) {
    if (!outs.out[k]) continue;
    float total = 0.f;
    for (int split = 0; split < s.splits; split++) total += partial[(int64_t(k) * s.splits + split) * s.C + c];
    outs.out[k][c] += total;
  }
}

// Pass 1: a block of 32 x 8 threads per (32 columns, split).
inline LaunchShape partials_shape(const ColumnSplit& s) {
  return {dim3(ceil_div(s.C, kWarp), unsigned(s.splits)), dim3(kWarp, kThreadRows)};
}
// Pass 2: a thread per column.
inline LaunchShape finish_shape(const ColumnSplit& s) {
  return {dim3(ceil_div(s.C, kFinishThreads)), dim3(kFinishThreads)};
}

}  // namespace mt::cuda::column_sum_kernels
