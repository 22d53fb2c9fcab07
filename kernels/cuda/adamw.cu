// AdamW (Loshchilov & Hutter 2019, Algorithm 2) with decoupled weight decay and bias correction:
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
//   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)
// One thread per parameter (grid-stride); the bias corrections depend only on t and are computed once
// on the host, in double, as the CPU backend does.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace mt::cuda {
namespace {

struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1, bias_correction2;  // 1 - beta^t
};

__global__ void adamw_kernel(float* params, float* m, float* v, const float* grads, int64_t n, AdamWHyper h) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grads[i];
    const float mi = h.beta1 * m[i] + (1.f - h.beta1) * g;
    const float vi = h.beta2 * v[i] + (1.f - h.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / h.bias_correction1;
    const float v_hat = vi / h.bias_correction2;
    const float p = params[i];
    params[i] = p - h.lr * (m_hat / (sqrtf(v_hat) + h.eps) + h.weight_decay * p);
  }
}

}  // namespace

void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2,
           float eps, float weight_decay, int t, const ops::Ctx& ctx) {
  MT_CHECK(t >= 1, "adamw: step t must be >= 1 for bias correction (got %d)", t);
  if (N <= 0) return;
  AdamWHyper h{lr, beta1, beta2, eps, weight_decay, float(1.0 - std::pow(double(beta1), t)),
               float(1.0 - std::pow(double(beta2), t))};
  adamw_kernel<<<grid_for(N), kBlock, 0, stream_of(ctx)>>>(params, m, v, grads, N, h);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
