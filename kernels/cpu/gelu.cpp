// GELU, tanh approximation (Hendrycks & Gimpel 2016):
//   gelu(x) = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3).
// Using 1 + tanh(u) = 2 sigmoid(2u) = 2 / (1 + exp(-2u)) gives the same function with one exp and
// no cancellation, and lets the loop vectorise (see exp_fast in vec_math.h):
//   gelu(x)  = x s,   s = 1 / (1 + exp(-2u))
//   gelu'(x) = s + 2 x s (1 - s) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// (from d tanh(u) = (1 - tanh^2) du and 1 - tanh^2 = 4 s (1 - s)).
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;
}  // namespace

template <class T>
void gelu_fwd(T* out, const T* inp, int64_t N) {
  const T a = T(kSqrt2OverPi), b = T(kCubic);
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) {
    const T x = inp[i];
    const T u = a * (x + b * x * x * x);
    out[i] = x / (T(1) + exp_fast(T(-2) * u));
  }
}

template <class T>
void gelu_bwd(T* dinp, const T* dout, const T* inp, int64_t N) {
  const T a = T(kSqrt2OverPi), b = T(kCubic);
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) {
    const T x = inp[i];
    const T u = a * (x + b * x * x * x);
    const T s = T(1) / (T(1) + exp_fast(T(-2) * u));
    const T du = a * (T(1) + T(3) * b * x * x);
    dinp[i] = dout[i] * (s + T(2) * x * s * (T(1) - s) * du);
  }
}

template void gelu_fwd<float>(float*, const float*, int64_t);
template void gelu_fwd<double>(double*, const double*, int64_t);
template void gelu_bwd<float>(float*, const float*, const float*, int64_t);
template void gelu_bwd<double>(double*, const double*, const double*, int64_t);

}  // namespace mt::cpu
