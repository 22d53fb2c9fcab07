// AdamW (Loshchilov & Hutter 2019, Algorithm 2) with decoupled weight decay and bias correction:
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
//   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)
// One thread per parameter (grid-stride); the bias corrections depend only on t and are computed once
// on the host, in double, as the CPU backend does.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace mt::cuda {

using namespace adamw_kernels;

void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2,
           float eps, float weight_decay, int t, const ops::Ctx& ctx, const float* grad_scale) {
  MT_CHECK(t >= 1, "adamw: step t must be >= 1 for bias correction (got %d)", t);
  if (N <= 0) return;
  const AdamWHyper h = make_hyper(lr, beta1, beta2, eps, weight_decay, t);
  const LaunchShape l = adamw_shape(N);
  MT_LAUNCH(l, stream_of(ctx), adamw_kernel)(params, m, v, grads, N, h, grad_scale);
  MT_CUDA_CHECK_LAUNCH();
}

void clip_coefficient(float* coef, const double* sum_sq, double inv_scale, double max_norm, const ops::Ctx& ctx) {
  const LaunchShape one_thread{dim3(1), dim3(1)};
  MT_LAUNCH(one_thread, stream_of(ctx), clip_coefficient_kernel)(coef, sum_sq, inv_scale, max_norm);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
