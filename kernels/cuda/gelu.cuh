// GELU, tanh approximation (Hendrycks & Gimpel 2016; the form GPT-2 uses), in fp32 on the device:
//   gelu(x) = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3).
// Evaluated as the CPU backend does, through 1 + tanh(u) = 2 sigmoid(2u), which has no cancellation
// for negative x:
//   gelu(x)  = x s,   s = 1 / (1 + exp(-2u))
//   gelu'(x) = s + 2 x s (1 - s) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// The exponent is clamped to [-80, 80] like the CPU's (beyond it both values are 0 or x, 1 or 0).
#pragma once
#include <cuda_runtime.h>

namespace mt::cuda {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;

__device__ inline float gelu_sigmoid(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  const float t = fminf(fmaxf(-2.f * u, -80.f), 80.f);
  return 1.f / (1.f + expf(t));
}

__device__ inline float gelu(float x) { return x * gelu_sigmoid(x); }

__device__ inline float gelu_grad(float x) {
  const float s = gelu_sigmoid(x);
  const float du = kGeluScale * (1.f + 3.f * kGeluCube * x * x);
  return s + 2.f * x * s * (1.f - s) * du;
}

}  // namespace mt::cuda
