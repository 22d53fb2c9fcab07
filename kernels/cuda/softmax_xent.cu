// Fused softmax + cross-entropy over a padded vocabulary, one block per row. Logits and dlogits are in
// the storage type S, the math in fp32, losses fp32. Two passes over the row: the max and the sum of
// exp(x - max) together (the online normaliser: the running sum is rescaled when the max grows, and
// partial normalisers combine in a fixed order), then the loss and (optionally) the gradient.
// Probabilities are never stored; the gradient is written in the last pass, which is what lets
// dlogits alias logits: every element is read and then overwritten by the same thread, after all
// reductions have finished.
//   loss_i    = log(sum_j exp(x_j - max)) + max - x_target            (-log softmax)
//   dlogits_j = dloss (softmax_j - [j == target]),  0 in padded columns and ignored rows
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/softmax_xent_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {

using namespace softmax_xent_kernels;

template <class S>
void softmax_xent(float* losses, S* dlogits, const S* logits, const int32_t* targets, float dloss, int N, int V,
                  int Vp, const ops::Ctx& ctx) {
  MT_CHECK(V > 0 && V <= Vp, "softmax_xent: need 0 < V <= Vp (V=%d, Vp=%d)", V, Vp);
  if (N == 0) return;
  const LaunchShape l = xent_shape(N);
  MT_LAUNCH(l, stream_of(ctx), softmax_xent_kernel<dev_t<S>>)(
      losses, dev_ptr(dlogits), dev_ptr(logits), targets, dloss, V, Vp);
  MT_CUDA_CHECK_LAUNCH();
}

template void softmax_xent<float>(float*, float*, const float*, const int32_t*, float, int, int, int,
                                  const ops::Ctx&);
template void softmax_xent<bf16>(float*, bf16*, const bf16*, const int32_t*, float, int, int, int, const ops::Ctx&);
template void softmax_xent<f16>(float*, f16*, const f16*, const int32_t*, float, int, int, int, const ops::Ctx&);

}  // namespace mt::cuda
