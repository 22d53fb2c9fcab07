// GELU, tanh approximation (Hendrycks & Gimpel 2016):
//   gelu(x) = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3).
// Using 1 + tanh(u) = 2 sigmoid(2u) = 2 / (1 + exp(-2u)) gives the same function with one exp and
// no cancellation, and an exp that vectorises (exp_shifted in vec_math.h):
//   gelu(x)  = x s,   s = 1 / (1 + exp(-2u))
//   gelu'(x) = s + 2 x s (1 - s) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// (from d tanh(u) = (1 - tanh^2) du and 1 - tanh^2 = 4 s (1 - s)).
// Computed in A = acc_t<S> from the loaded input, rounded once on store.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;
constexpr int kBlock = 256;  // elements per exp_shifted call, kept on the stack

// s[j] = 1 / (1 + exp(-2u)) for x[0..n). The exponent is clamped to [-80, 80]: s >= e^-80 = 2e-35
// stays a normal float (subnormal arithmetic is very slow on x86); |2u| = 80 needs |x| > 9, and
// beyond that gelu and its derivative are below 1e-25 in magnitude up to |x| = 1000, i.e. zero.
template <class T>
void sigmoid_2u(T* s, const T* x, int n) {
  const T a = T(kSqrt2OverPi), b = T(kCubic);
  for (int j = 0; j < n; j++) {
    const T u = a * (x[j] + b * x[j] * x[j] * x[j]);
    T t = T(-2) * u;
    t = t < T(-80) ? T(-80) : t;
    s[j] = t > T(80) ? T(80) : t;
  }
  exp_shifted(s, s, T(0), n);
  for (int j = 0; j < n; j++) s[j] = T(1) / (T(1) + s[j]);
}
}  // namespace

template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N) {
  using A = acc_t<S>;
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i0 = 0; i0 < N; i0 += kBlock) {
    const int n = int(std::min<int64_t>(kBlock, N - i0));
    A xs[kBlock], s[kBlock];
    const A* x = loaded(inp + i0, xs, n);
    sigmoid_2u(s, x, n);
    for (int j = 0; j < n; j++) out[i0 + j] = store_as<S>(x[j] * s[j]);
  }
}

template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N) {
  using A = acc_t<S>;
  const A a = A(kSqrt2OverPi), b = A(kCubic);
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i0 = 0; i0 < N; i0 += kBlock) {
    const int n = int(std::min<int64_t>(kBlock, N - i0));
    A xs[kBlock], s[kBlock];
    const A* xb = loaded(inp + i0, xs, n);
    sigmoid_2u(s, xb, n);
    for (int j = 0; j < n; j++) {
      const A x = xb[j];
      const A du = a * (A(1) + A(3) * b * x * x);
      dinp[i0 + j] = store_as<S>(load(dout[i0 + j]) * (s[j] + A(2) * x * s[j] * (A(1) - s[j]) * du));
    }
  }
}

#define MT_GELU_INSTANTIATE(S)                                  \
  template void gelu_fwd<S>(S*, const S*, int64_t);             \
  template void gelu_bwd<S>(S*, const S*, const S*, int64_t);
MT_GELU_INSTANTIATE(float)
MT_GELU_INSTANTIATE(double)
MT_GELU_INSTANTIATE(bf16)
MT_GELU_INSTANTIATE(f16)
#undef MT_GELU_INSTANTIATE

}  // namespace mt::cpu
