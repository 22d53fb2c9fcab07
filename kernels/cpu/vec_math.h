// Small helpers shared by the CPU kernels (internal to kernels/cpu).
//
// The build does not allow the compiler to reassociate floating-point sums (no -ffast-math), so a
// plain `s += x[i]` loop runs one element at a time. The reductions below keep kLanes independent
// partial sums that the compiler maps onto SIMD registers, then combine them in a fixed order: fast,
// and still bitwise deterministic.
//
// exp_shifted computes exp over an array with explicit SIMD (glibc's expf runs one element at a
// time). It is explicit rather than left to the auto-vectoriser on purpose: with a clamp written as
// a comparison, GCC if-converts by evaluating every branch for every lane, and the dead branch fed
// with the clamp constant produces subnormal numbers, whose x86 microcode assists made GELU 5x
// slower. min/max instructions clamp without a branch.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
namespace mt::cpu {

inline constexpr int kLanes = 8;

// Below about this much work (elements touched or multiply-adds) forking and joining a parallel
// region costs more than it saves; ops pass `if (parallel_worth(work))` to their OpenMP pragmas.
// Every op's result is independent of the thread count, so this only changes speed.
inline bool parallel_worth(int64_t work) { return work >= (int64_t(1) << 15); }

template <class T>
inline T sum_lanes(const T* x, int n) {
  T acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; l++) acc[l] += x[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += x[i];
  T s = T(0);
  for (int l = 0; l < kLanes; l++) s += acc[l];
  return s;
}

template <class T>
inline T dot_lanes(const T* a, const T* b, int n) {
  T acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; l++) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
  T s = T(0);
  for (int l = 0; l < kLanes; l++) s += acc[l];
  return s;
}

template <class T>
inline T max_lanes(const T* x, int n) {
  T acc[kLanes];
  for (int l = 0; l < kLanes; l++) acc[l] = -INFINITY;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  for (int l = 0; i < n; i++, l++) acc[l] = x[i] > acc[l] ? x[i] : acc[l];
  T m = acc[0];
  for (int l = 1; l < kLanes; l++) m = acc[l] > m ? acc[l] : m;
  return m;
}

// exp(x) for float: x = n ln2 + r with |r| <= ln2/2 (Cody & Waite's two-constant reduction, exact
// for |n| <= 128), exp(r) by its degree-7 Taylor polynomial (truncation error < 6e-9 relative), and
// 2^n built in the exponent bits. Inputs are clamped to [-87, 88], so the result is never inf or
// subnormal: exp of anything below -87 reads as ~1.6e-38, which every caller treats as zero. NaN
// stays NaN. Every multiply-add is fused (one rounding, std::fma): the SIMD bodies of exp_shifted
// perform exactly these operations with FMA instructions, so all agree bitwise, at about 60% of the
// time the unfused chain took (the polynomial is a chain of dependent steps; docs/perf.md, issue 32's
// seventh pass). Called one element at a time, std::fma is a library call on builds for CPUs without
// FMA: loops call exp_shifted instead.
inline float exp_fast(float x) {
  x = std::max(x, -87.0f);  // (x < -87) ? -87 : x, which keeps NaN, like max_ps(-87, x)
  x = std::min(x, 88.0f);
  // round(x / ln2) by the 1.5 * 2^23 trick: exact round-to-nearest without SSE4.1 rint.
  const float shifter = 12582912.0f;
  const float n = std::fma(x, 1.44269504088896341f, shifter) - shifter;
  float r = std::fma(-n, 0.693359375f, x);  // ln2 split: 0.693359375 has 9 significant bits
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t bits = (int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}
inline double exp_fast(double x) { return std::exp(x); }

// Whether this CPU runs AVX-512F, and AVX2 with FMA (each asked once per process; false off x86-64).
// The kernels' explicit SIMD bodies (here, in the GEMM's micro-kernels and packing, in the norm) take
// them as their conditions.
bool cpu_has_avx512();
bool cpu_has_avx2_fma();
// The vector paths of the kernels that keep one body per instruction set (sum_squares, GELU). Each
// path gives the bits of the portable one; the kernels take the widest this CPU runs, and tests run
// every one it can.
enum class SimdPath { portable, avx2, avx512 };
bool cpu_can_run(SimdPath path);
SimdPath widest_simd_path();

// out[i] = exp(in[i] - shift) for i < n; out may alias in.
void exp_shifted(float* out, const float* in, float shift, int n);
// exp_shifted's AVX2 body alone, on the first n / 8 * 8 elements: how many it did (0 where the CPU
// lacks AVX2 or FMA). For tests on CPUs that take the AVX-512 body.
int exp_shifted_avx2_part(float* out, const float* in, float shift, int n);
void exp_shifted(double* out, const double* in, double shift, int n);

// The softmax's passes over a row, sixteen floats at a time where the CPU has AVX-512, each with the
// bits of the portable helpers above: max_lanes, exp_shifted followed by sum_lanes (the sum's eight
// partial sums take their elements in the same order), x[i] *= s; and for its backward dot_lanes and
// softmax_grad_row_portable.
float max_row(const float* x, int n);
float exp_shifted_sum(float* out, const float* in, float shift, int n);
void scale_row(float* x, float s, int n);
float dot_row(const float* a, const float* b, int n);
void softmax_grad_row(float* g, const float* p, float pg, int n, int m);

// The softmax's backward on one row, in place: g[j] = p[j] (g[j] - pg) for j < n (pg = sum_j p[j]
// g[j]), then exact zeros for n <= j < m.
template <class T>
inline void softmax_grad_row_portable(T* g, const T* p, T pg, int n, int m) {
  for (int j = 0; j < n; j++) g[j] = p[j] * (g[j] - pg);
  std::fill(g + n, g + m, T(0));
}
inline double max_row(const double* x, int n) { return max_lanes(x, n); }
inline double exp_shifted_sum(double* out, const double* in, double shift, int n) {
  exp_shifted(out, in, shift, n);
  return sum_lanes(out, n);
}
inline void scale_row(double* x, double s, int n) {
  for (int i = 0; i < n; i++) x[i] *= s;
}
inline double dot_row(const double* a, const double* b, int n) { return dot_lanes(a, b, n); }
inline void softmax_grad_row(double* g, const double* p, double pg, int n, int m) {
  softmax_grad_row_portable(g, p, pg, n, m);
}

}  // namespace mt::cpu
