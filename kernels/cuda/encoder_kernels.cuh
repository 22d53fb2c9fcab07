// The token + position embedding kernels (see encoder.cu) and their launch shapes, in a header so that the
// same source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_ops.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::encoder_kernels {

constexpr int kScatterThreads = 256;

__device__ inline int position_of(const int32_t* pos, int64_t bt, int T) {
  return pos ? pos[bt] : int(bt % T);
}

template <class D>
__global__ void encoder_fwd_kernel(D* out, const int32_t* tokens, const int32_t* pos, const D* wte, const D* wpe,
                                   int T, int C, int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = idx / C;
    const int c = int(idx - bt * C);
    out[idx] = store_as<D>(load(wte[int64_t(tokens[bt]) * C + c]) + load(wpe[int64_t(position_of(pos, bt, T)) * C + c]));
  }
}

// The backward adds the rows of src that share a key (a token, or a position) into one row of dst,
// in row order, with no atomics: the launcher sorts (key, row) pairs by key with a stable sort, so
// each key's rows form one run in ascending row order, and the block at the start of a run adds it.

// keys_out[r] = key(r) - row0 (key(r) = keys[r], or r % T when keys is null: positions) when that lies
// in [0, limit), kNoKey otherwise (a token outside this rank's rows of a vocabulary-parallel table);
// rows_out[r] = r: the pairs the launcher sorts. The whole table: row0 = 0, limit = INT32_MAX.
constexpr uint32_t kNoKey = 0xffffffffu;
MT_KERNEL_INLINE __global__ void sort_pairs_kernel(uint32_t* keys_out, int32_t* rows_out, const int32_t* keys,
                                                   int rows, int T, int row0, int limit) {
  for (int r = int(blockIdx.x * blockDim.x + threadIdx.x); r < rows; r += int(gridDim.x * blockDim.x)) {
    const int64_t k = int64_t(position_of(keys, r, T)) - row0;
    keys_out[r] = k >= 0 && k < limit ? uint32_t(k) : kNoKey;
    rows_out[r] = r;
  }
}

// For sorted position i = blockIdx.x at the start of a run of equal keys: dst[key, c] += the sum of
// src[row, c] over the run's rows, in order, for column c = blockIdx.y * blockDim.x + threadIdx.x.
// Blocks inside a run leave at once, and so does the run of kNoKey (sorted last).
template <class D>
__global__ void sum_runs_kernel(float* dst, const D* src, const uint32_t* sorted_keys, const int32_t* sorted_rows,
                                int rows, int C) {
  const int i = int(blockIdx.x);
  const uint32_t key = sorted_keys[i];
  if (key == kNoKey || (i > 0 && sorted_keys[i - 1] == key)) return;
  const int c = int(blockIdx.y) * int(blockDim.x) + int(threadIdx.x);
  if (c >= C) return;
  float acc = 0.f;
  for (int j = i; j < rows && sorted_keys[j] == key; j++) acc += load(src[int64_t(sorted_rows[j]) * C + c]);
  dst[int64_t(key) * C + c] += acc;
}

// encoder_fwd_kernel: a grid-stride loop over the B T C outputs.
inline LaunchShape fwd_shape(int64_t total) { return {dim3(grid_for(total)), dim3(kBlock)}; }
// sort_pairs_kernel: a grid-stride loop over the rows.
inline LaunchShape pairs_shape(int rows) { return {dim3(grid_for(rows)), dim3(kBlock)}; }
// sum_runs_kernel: a block per (sorted position, kScatterThreads columns).
inline LaunchShape runs_shape(int rows, int C) {
  return {dim3(unsigned(rows), ceil_div(C, kScatterThreads)), dim3(kScatterThreads)};
}

}  // namespace mt::cuda::encoder_kernels
