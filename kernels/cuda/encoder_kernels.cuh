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

// dst[key(r), c] += sum of src[r', c] over rows r' with key(r') == key(r), for r = blockIdx.x, columns
// c = blockIdx.y * blockDim.x + threadIdx.x. key(r) = keys[r], or r % T when keys is null (positions).
// Rows are scanned in chunks of blockDim.x; each chunk's matches are compacted, in row order, into
// shared memory (warp ballots plus a prefix over warps), then summed by every column thread.
template <class D>
__global__ void scatter_rows_kernel(float* dst, const D* src, const int32_t* keys, int rows, int T, int C) {
  MT_SHARED(int[kScatterThreads], matches);
  MT_SHARED(int[kScatterThreads / kWarp], warp_count);
  const int row = int(blockIdx.x);
  const int key = position_of(keys, row, T);
  const int c = int(blockIdx.y) * int(blockDim.x) + int(threadIdx.x);
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int nwarps = int(blockDim.x) / kWarp;
  float acc = 0.f;
  bool seen_any = false;
  for (int base = 0; base < rows; base += int(blockDim.x)) {
    const int r = base + int(threadIdx.x);
    const bool hit = r < rows && position_of(keys, r, T) == key;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, n = 0;
    for (int w = 0; w < nwarps; w++) {
      if (w < warp) offset += warp_count[w];
      n += warp_count[w];
    }
    if (hit) matches[offset + __popc(ballot & ((1u << lane) - 1u))] = r;
    __syncthreads();
    if (n > 0 && !seen_any) {
      seen_any = true;
      if (matches[0] < row) return;  // an earlier row owns this key; uniform across the block
    }
    // No barrier needed before the next chunk: warp_count[] was last read before the barrier above,
    // and matches[] is next written only after the next chunk's first barrier, which every thread
    // reaches only once it is done reading matches[] here.
    if (c < C)
      for (int i = 0; i < n; i++) acc += load(src[int64_t(matches[i]) * C + c]);
  }
  if (c < C) dst[int64_t(key) * C + c] += acc;
}

// encoder_fwd_kernel: a grid-stride loop over the B T C outputs.
inline LaunchShape fwd_shape(int64_t total) { return {dim3(grid_for(total)), dim3(kBlock)}; }
// scatter_rows_kernel: a block per (row, kScatterThreads columns).
inline LaunchShape scatter_shape(int rows, int C) {
  return {dim3(unsigned(rows), ceil_div(C, kScatterThreads)), dim3(kScatterThreads)};
}

}  // namespace mt::cuda::encoder_kernels
