// Token + position embedding: forward gather and a deterministic backward scatter-add. Embeddings and
// dout are in the storage type S; out = wte + wpe is added in fp32 and rounded once; the gradients
// dwte, dwpe are fp32 and accumulate.
//
// The backward must add the rows of dout that share a token (or a position) into one row of dwte
// (dwpe). Atomics would make the summation order, and so the low bits, vary from run to run. Instead
// the block that owns the FIRST occurrence of a key collects every row with that key, in row order, and
// adds their sum once; blocks owning later occurrences find an earlier match and leave at once.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

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
  __shared__ int matches[kScatterThreads];
  __shared__ int warp_count[kScatterThreads / kWarp];
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
    if (c < C)
      for (int i = 0; i < n; i++) acc += load(src[int64_t(matches[i]) * C + c]);
    __syncthreads();  // matches[] is rewritten by the next chunk
  }
  if (c < C) dst[int64_t(key) * C + c] += acc;
}

}  // namespace

template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T, int C,
                 const ops::Ctx& ctx) {
  const int64_t total = int64_t(B) * T * C;
  if (total == 0) return;
  encoder_fwd_kernel<<<grid_for(total), kBlock, 0, stream_of(ctx)>>>(dev_ptr(out), tokens, pos, dev_ptr(wte),
                                                                   dev_ptr(wpe), T, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void encoder_bwd(float* dwte, float* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B, int T,
                 int C, const ops::Ctx& ctx) {
  const int rows = B * T;
  if (rows == 0 || C == 0) return;
  const dim3 grid(unsigned(rows), ceil_div(C, kScatterThreads));
  if (dwte) {
    scatter_rows_kernel<<<grid, kScatterThreads, 0, stream_of(ctx)>>>(dwte, dev_ptr(dout), tokens, rows, T, C);
    MT_CUDA_CHECK_LAUNCH();
  }
  if (dwpe) {
    scatter_rows_kernel<<<grid, kScatterThreads, 0, stream_of(ctx)>>>(dwpe, dev_ptr(dout), pos, rows, T, C);
    MT_CUDA_CHECK_LAUNCH();
  }
}

#define MT_ENCODER_INSTANTIATE(S)                                                                             \
  template void encoder_fwd<S>(S*, const int32_t*, const int32_t*, const S*, const S*, int, int, int,          \
                               const ops::Ctx&);                                                              \
  template void encoder_bwd<S>(float*, float*, const S*, const int32_t*, const int32_t*, int, int, int,        \
                               const ops::Ctx&);
MT_ENCODER_INSTANTIATE(float)
MT_ENCODER_INSTANTIATE(bf16)
MT_ENCODER_INSTANTIATE(f16)
#undef MT_ENCODER_INSTANTIATE

}  // namespace mt::cuda
