// Reductions: the sum of squares (gradient norm, clipping) and the finiteness check (fp16 loss
// scaling). sum_squares and all_finite return their value, so they wait for their stream;
// sum_squares_into leaves the sum in device memory and does not wait.
//
// sum_squares is deterministic by construction: a fixed grid of kSumBlocks x kSumThreads threads
// (independent of the device), thread g adds x[g], x[g + G], x[g + 2G], ... in double; each block
// reduces its threads in a fixed tree; one block then adds the kSumBlocks partials in a fixed tree.
// Squares of floats are exact in double, so the only rounding is in the additions.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce_kernels.cuh"

namespace mt::cuda {

using namespace reduce_kernels;

void sum_squares_into(double* out, const float* x, int64_t N, bool accumulate, const ops::Ctx& ctx) {
  cudaStream_t stream = stream_of(ctx);
  // Stream-ordered scratch: no per-process buffers, and safe when several streams reduce at once.
  // N = 0 runs too: the partials are zeros, and *out is written (or kept) as for any N.
  double* partial = nullptr;
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial), kSumBlocks * sizeof(double), stream));
  const LaunchShape lp = partial_shape(), ls = partials_shape();
  sum_squares_partial_kernel<<<lp.grid, lp.block, lp.smem, stream>>>(partial, x, N);
  MT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<ls.grid, ls.block, ls.smem, stream>>>(out, partial, accumulate);
  MT_CUDA_CHECK_LAUNCH();
  MT_CUDA_CHECK(cudaFreeAsync(partial, stream));
}

double sum_squares(const float* x, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return 0.0;
  cudaStream_t stream = stream_of(ctx);
  double* result = nullptr;
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&result), sizeof(double), stream));
  cuda::sum_squares_into(result, x, N, false, ctx);
  double host = 0.0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaFreeAsync(result, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

bool all_finite(const float* x, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return true;
  cudaStream_t stream = stream_of(ctx);
  int* flag = nullptr;
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&flag), sizeof(int), stream));
  MT_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  const LaunchShape l = all_finite_shape(N);
  all_finite_kernel<<<l.grid, l.block, l.smem, stream>>>(flag, x, N);
  MT_CUDA_CHECK_LAUNCH();
  int any_bad = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&any_bad, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaFreeAsync(flag, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return any_bad == 0;
}

}  // namespace mt::cuda
