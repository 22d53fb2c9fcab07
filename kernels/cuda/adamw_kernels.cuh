// The AdamW kernel (see adamw.cu for the update) and its launch shape, in a header so that the same source
// builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_fp32_ops.cpp runs it against the CPU twin.
#pragma once
#include <math.h>

#include <cmath>
#include <cstdint>

#include "kernels/clip_coefficient.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda::adamw_kernels {

struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1, bias_correction2;  // 1 - beta^t
};

// The kernel's arguments for step t: the bias corrections in double, as the CPU backend computes them.
inline AdamWHyper make_hyper(float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
  return AdamWHyper{lr, beta1, beta2, eps, weight_decay, float(1.0 - std::pow(double(beta1), t)),
                    float(1.0 - std::pow(double(beta2), t))};
}

// grad_scale: null, or the factor every gradient is multiplied by first (as ops::adamw says).
MT_KERNEL_INLINE __global__ void adamw_kernel(float* params, float* m, float* v, const float* grads, int64_t n,
                                              AdamWHyper h, const float* grad_scale) {
  const float s = grad_scale ? *grad_scale : 1.f;  // g * 1 is g, bit for bit
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = grads[i] * s;
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

// One thread: *coef from *sum_sq (kernels/clip_coefficient.h), so that the host never reads the norm
// inside a step.
MT_KERNEL_INLINE __global__ void clip_coefficient_kernel(float* coef, const double* sum_sq, double inv_scale,
                                                         double max_norm) {
  *coef = ops::clip_coefficient(*sum_sq, inv_scale, max_norm);
}

// A grid-stride loop over the n parameters.
inline LaunchShape adamw_shape(int64_t n) { return {dim3(grid_for(n)), dim3(kBlock)}; }

}  // namespace mt::cuda::adamw_kernels
