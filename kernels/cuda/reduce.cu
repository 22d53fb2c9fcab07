// Reductions: the sum of squares (gradient norm, clipping) and the finiteness check (fp16 loss
// scaling). sum_squares and all_finite return their value, so they wait for their stream (under
// ctx.wait, kernels/cuda/cuda_ops.h wait_for_stream);
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
#include "kernels/cuda/stream_temp.cuh"

namespace mt::cuda {

using namespace reduce_kernels;

void sum_squares_into(double* out, const float* x, int64_t N, bool accumulate, const ops::Ctx& ctx) {
  cudaStream_t stream = stream_of(ctx);
  // N = 0 runs too: the partials are zeros, and *out is written (or kept) as for any N.
  const StreamTemp<double> partial(kSumBlocks, stream);
  const LaunchShape lp = partial_shape(), ls = partials_shape();
  MT_LAUNCH(lp, stream, sum_squares_partial_kernel)(partial.get(), x, N);
  MT_CUDA_CHECK_LAUNCH();
  MT_LAUNCH(ls, stream, sum_partials_kernel)(out, partial.get(), accumulate);
  MT_CUDA_CHECK_LAUNCH();
}

double sum_squares(const float* x, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return 0.0;
  cudaStream_t stream = stream_of(ctx);
  double host = 0.0;
  {
    const StreamTemp<double> result(1, stream);
    cuda::sum_squares_into(result.get(), x, N, false, ctx);
    // A copy into pageable memory returns once done, so it would block the host until the stream
    // reaches it: wait (under ctx.wait) first, then it finds the stream idle.
    wait_for_stream(stream, ctx.wait, "sum_squares");
    MT_CUDA_CHECK(cudaMemcpyAsync(&host, result.get(), sizeof(double), cudaMemcpyDeviceToHost, stream));
  }
  return host;
}

bool all_finite(const float* x, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return true;
  cudaStream_t stream = stream_of(ctx);
  int any_bad = 0;
  {
    const StreamTemp<int> flag(1, stream);
    MT_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int), stream));
    const LaunchShape l = all_finite_shape(N);
    MT_LAUNCH(l, stream, all_finite_kernel)(flag.get(), x, N);
    MT_CUDA_CHECK_LAUNCH();
    wait_for_stream(stream, ctx.wait, "all_finite");  // as in sum_squares
    MT_CUDA_CHECK(cudaMemcpyAsync(&any_bad, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  }
  return any_bad == 0;
}

}  // namespace mt::cuda
