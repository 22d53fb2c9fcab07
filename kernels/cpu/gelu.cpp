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
#include "runtime/check.h"

namespace mt::cpu {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;
constexpr int kBlock = 256;  // elements per exp_shifted call, kept on the stack

// The bodies of one block, inlined into one function per vector path below: the vectoriser widens
// the same elementwise IEEE operations (no contraction into FMAs: the build disables it), and exp is
// exp_shifted's, so every path gives the portable loops' bits. On two Zen 4 cores the AVX-512 path
// runs a 1024 x 3072 block in 0.86 ms forward and 1.00 backward, against 1.55 and 1.76 for the
// baseline build's 4-wide loops (docs/perf.md, issue 32's tenth pass).

// Inlined into its callers, each s is a stack array whose first n values the first loop below writes
// before exp_shifted reads them; GCC 12 cannot see that and flags the call.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// s[j] = 1 / (1 + exp(-2u)) for x[0..n). The exponent is clamped to [-80, 80]: s >= e^-80 = 2e-35
// stays a normal float (subnormal arithmetic is very slow on x86); |2u| = 80 needs |x| > 9, and
// beyond that gelu and its derivative are below 1e-25 in magnitude up to |x| = 1000, i.e. zero.
template <class T>
[[gnu::always_inline]] inline void sigmoid_2u(T* s, const T* x, int n) {
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

template <class S>
[[gnu::always_inline]] inline void fwd_block(S* out, const S* inp, int n) {
  using A = acc_t<S>;
  A xs[kBlock], s[kBlock];
  const A* x = loaded(inp, xs, n);
  sigmoid_2u(s, x, n);
  for (int j = 0; j < n; j++) out[j] = store_as<S>(x[j] * s[j]);
}

template <class S>
[[gnu::always_inline]] inline void bwd_block(S* dinp, const S* dout, const S* inp, int n) {
  using A = acc_t<S>;
  const A a = A(kSqrt2OverPi), b = A(kCubic);
  A xs[kBlock], s[kBlock];
  const A* xb = loaded(inp, xs, n);
  sigmoid_2u(s, xb, n);
  for (int j = 0; j < n; j++) {
    const A x = xb[j];
    const A du = a * (A(1) + A(3) * b * x * x);
    dinp[j] = store_as<S>(load(dout[j]) * (s[j] + A(2) * x * s[j] * (A(1) - s[j]) * du));
  }
}

// One function per vector path around the same bodies (off x86 the "vector" ones are portable
// builds that cpu_can_run never picks).
#if defined(__x86_64__) && defined(__GNUC__)
#define MT_GELU_TARGET(isa) [[gnu::target(isa)]]
#else
#define MT_GELU_TARGET(isa)
#endif
template <class S>
void fwd_portable(S* out, const S* inp, int n) {
  fwd_block(out, inp, n);
}
template <class S>
MT_GELU_TARGET("avx2") void fwd_avx2(S* out, const S* inp, int n) {
  fwd_block(out, inp, n);
}
template <class S>
MT_GELU_TARGET("avx512f") void fwd_avx512(S* out, const S* inp, int n) {
  fwd_block(out, inp, n);
}
template <class S>
void bwd_portable(S* dinp, const S* dout, const S* inp, int n) {
  bwd_block(dinp, dout, inp, n);
}
template <class S>
MT_GELU_TARGET("avx2") void bwd_avx2(S* dinp, const S* dout, const S* inp, int n) {
  bwd_block(dinp, dout, inp, n);
}
template <class S>
MT_GELU_TARGET("avx512f") void bwd_avx512(S* dinp, const S* dout, const S* inp, int n) {
  bwd_block(dinp, dout, inp, n);
}
#undef MT_GELU_TARGET

template <class F>
F on_path(SimdPath path, F portable, F avx2, F avx512) {
  MT_CHECK(cpu_can_run(path), "gelu: this CPU cannot run the requested vector path");
  return path == SimdPath::avx512 ? avx512 : path == SimdPath::avx2 ? avx2 : portable;
}
#pragma GCC diagnostic pop
}  // namespace

template <class S>
void gelu_fwd_via(SimdPath path, S* out, const S* inp, int64_t N) {
  const auto block = on_path(path, &fwd_portable<S>, &fwd_avx2<S>, &fwd_avx512<S>);
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i0 = 0; i0 < N; i0 += kBlock) block(out + i0, inp + i0, int(std::min<int64_t>(kBlock, N - i0)));
}

template <class S>
void gelu_bwd_via(SimdPath path, S* dinp, const S* dout, const S* inp, int64_t N) {
  const auto block = on_path(path, &bwd_portable<S>, &bwd_avx2<S>, &bwd_avx512<S>);
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i0 = 0; i0 < N; i0 += kBlock)
    block(dinp + i0, dout + i0, inp + i0, int(std::min<int64_t>(kBlock, N - i0)));
}

template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N) {
  gelu_fwd_via(widest_simd_path(), out, inp, N);
}

template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N) {
  gelu_bwd_via(widest_simd_path(), dinp, dout, inp, N);
}

#define MT_GELU_INSTANTIATE(S)                                                   \
  template void gelu_fwd<S>(S*, const S*, int64_t);                              \
  template void gelu_bwd<S>(S*, const S*, const S*, int64_t);                    \
  template void gelu_fwd_via<S>(SimdPath, S*, const S*, int64_t);                \
  template void gelu_bwd_via<S>(SimdPath, S*, const S*, const S*, int64_t);
MT_GELU_INSTANTIATE(float)
MT_GELU_INSTANTIATE(double)
MT_GELU_INSTANTIATE(bf16)
MT_GELU_INSTANTIATE(f16)
#undef MT_GELU_INSTANTIATE

}  // namespace mt::cpu
