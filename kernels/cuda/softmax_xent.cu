// Fused softmax + cross-entropy over a padded vocabulary, one block per row. Logits and dlogits are in
// the storage type S, the math in fp32, losses fp32. Three passes over the row: max, sum of
// exp(x - max), then the loss and (optionally) the gradient. Probabilities are never stored; the
// gradient is written in the last pass, which is what lets dlogits alias logits: every element is
// read and then overwritten by the same thread, after all reductions have finished.
//   loss_i    = log(sum_j exp(x_j - max)) + max - x_target            (-log softmax)
//   dlogits_j = dloss (softmax_j - [j == target]),  0 in padded columns and ignored rows
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

constexpr int kXentThreads = 512;

// No __restrict__: dlogits may alias logits.
template <class D>
__global__ void softmax_xent_kernel(float* losses, D* dlogits, const D* logits, const int32_t* targets, float dloss,
                                    int V, int Vp) {
  const int64_t row = blockIdx.x;
  const D* x = logits + row * Vp;
  D* dx = dlogits ? dlogits + row * Vp : nullptr;
  const int target = targets[row];
  if (target < 0) {  // ignored position: no loss, no gradient
    if (threadIdx.x == 0) losses[row] = 0.f;
    if (dx)
      for (int j = int(threadIdx.x); j < Vp; j += int(blockDim.x)) dx[j] = store_as<D>(0.f);
    return;
  }
  float mx = -INFINITY;
  for (int j = int(threadIdx.x); j < V; j += int(blockDim.x)) mx = fmaxf(mx, load(x[j]));
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  float sum = 0.f;
  for (int j = int(threadIdx.x); j < V; j += int(blockDim.x)) sum += expf(load(x[j]) - mx);
  sum = block_reduce(sum, SumOp{}, 0.f);
  // A target outside the real vocabulary is a data error; NaN makes it visible in the loss (the
  // trainer's finiteness checks report it) instead of reading out of bounds.
  const bool valid = target < V;
  const float x_target = valid ? load(x[target]) : NAN;
  __syncthreads();  // everyone has read x[target] before anyone may overwrite it (in-place backward)
  if (threadIdx.x == 0) losses[row] = valid ? logf(sum) + mx - x_target : NAN;
  if (dx) {
    const float inv = 1.f / sum;
    for (int j = int(threadIdx.x); j < Vp; j += int(blockDim.x)) {
      float g = 0.f;
      if (j < V) g = dloss * (expf(load(x[j]) - mx) * inv - (j == target ? 1.f : 0.f));
      dx[j] = store_as<D>(valid ? g : NAN);
    }
  }
}

}  // namespace

template <class S>
void softmax_xent(float* losses, S* dlogits, const S* logits, const int32_t* targets, float dloss, int N, int V,
                  int Vp, const ops::Ctx& ctx) {
  MT_CHECK(V > 0 && V <= Vp, "softmax_xent: need 0 < V <= Vp (V=%d, Vp=%d)", V, Vp);
  if (N == 0) return;
  softmax_xent_kernel<<<unsigned(N), kXentThreads, 0, stream_of(ctx)>>>(losses, dev_ptr(dlogits), dev_ptr(logits),
                                                                         targets, dloss, V, Vp);
  MT_CUDA_CHECK_LAUNCH();
}

template void softmax_xent<float>(float*, float*, const float*, const int32_t*, float, int, int, int,
                                  const ops::Ctx&);
template void softmax_xent<bf16>(float*, bf16*, const bf16*, const int32_t*, float, int, int, int, const ops::Ctx&);
template void softmax_xent<f16>(float*, f16*, const f16*, const int32_t*, float, int, int, int, const ops::Ctx&);

}  // namespace mt::cuda
