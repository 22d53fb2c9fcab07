// The factor every gradient is multiplied by before the optimizer: the inverse of fp16's loss scale,
// and clipping by global norm (Pascanu et al. 2013) when the unscaled norm exceeds max_norm. One
// definition for the CPU backend, the CUDA kernel that computes it on the device (so that the host
// need not wait for the norm inside a step), and the trainer's host path.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt::ops {

// sum_sq: the sum of squares of the (loss-scaled) gradients; max_norm <= 0 turns clipping off.
MT_HOST_DEVICE inline float clip_coefficient(double sum_sq, double inv_scale, double max_norm) {
  double coef = inv_scale;
  const double norm = sqrt(sum_sq) * inv_scale;
  if (max_norm > 0 && norm > max_norm) coef *= max_norm / norm;
  return float(coef);
}

}  // namespace mt::ops
