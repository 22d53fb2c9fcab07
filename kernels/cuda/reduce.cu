// Reductions whose result the host needs: the sum of squares (gradient norm, clipping) and the
// finiteness check (fp16 loss scaling). Both wait for their stream, since they return a value.
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

namespace mt::cuda {
namespace {

constexpr int kSumBlocks = 1024;
constexpr int kSumThreads = 256;

__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  const int64_t stride = int64_t(kSumBlocks) * kSumThreads;
  double s = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * kSumThreads + threadIdx.x; i < n; i += stride) {
    const double xi = x[i];
    s += xi * xi;
  }
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block of kSumBlocks threads, one partial each.
__global__ void sum_partials_kernel(double* result, const double* partial) {
  const double s = block_reduce(partial[threadIdx.x], SumOp{}, 0.0);
  if (threadIdx.x == 0) *result = s;
}

__global__ void all_finite_kernel(int* any_bad, const float* x, int64_t n) {
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(x[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *any_bad = 1;  // every writer writes the same value
}

}  // namespace

double sum_squares(const float* x, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return 0.0;
  cudaStream_t stream = stream_of(ctx);
  // Stream-ordered scratch: no per-process buffers, and safe when several streams reduce at once.
  double* scratch = nullptr;
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), (kSumBlocks + 1) * sizeof(double), stream));
  sum_squares_partial_kernel<<<kSumBlocks, kSumThreads, 0, stream>>>(scratch + 1, x, N);
  MT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kSumBlocks, 0, stream>>>(scratch, scratch + 1);
  MT_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&result, scratch, sizeof(double), cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaFreeAsync(scratch, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

bool all_finite(const float* x, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return true;
  cudaStream_t stream = stream_of(ctx);
  int* flag = nullptr;
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&flag), sizeof(int), stream));
  MT_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  all_finite_kernel<<<grid_for(N), kBlock, 0, stream>>>(flag, x, N);
  MT_CUDA_CHECK_LAUNCH();
  int any_bad = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&any_bad, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaFreeAsync(flag, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return any_bad == 0;
}

}  // namespace mt::cuda
