// exp over arrays (see vec_math.h): an AVX-512 body, sixteen floats at a time with one masked step
// for the last n % 16, where the CPU has it; elsewhere an AVX2 body, eight at a time, where the CPU
// has AVX2 and FMA, and exp_fast for the rest. Each performs exactly the operations of exp_fast (the
// same fused multiply-adds, 2^n applied by an exact scaling), so every element has the same bits
// whichever body computed it. The softmax's other passes over a row (its maximum, the sum of its
// exps, the scaling) get AVX-512 bodies too, each with the bits of the portable loop in vec_math.h.
#include "kernels/cpu/vec_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MT_VEC_X86 1
#endif

namespace mt::cpu {

namespace {

#ifdef MT_VEC_X86
// GCC 12's AVX-512 intrinsics start several results from _mm512_undefined_ps(), which it then flags
// as maybe uninitialised (as in gemm_pack.cpp's transposes).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The bodies below take any n: the last n % 16 elements go through one masked step, whose inactive
// lanes are neither read nor written (and add exact zeros to a sum), so a row's tail costs one vector
// step instead of SSE and scalar passes; softmax rows of causal attention (i + 1 long) all have one.

// Lanes 0..n-i-1 of a 16-lane step at i (all of them when 16 or more remain).
__attribute__((target("avx512f"))) inline __mmask16 lanes_left(int i, int n) {
  return n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
}

// exp_fast on x[0..n). With kSum, also adds the results into the eight partial sums acc in
// sum_lanes' order (element i to lane i % 8, in increasing i), in the same loop so that the
// additions' latency hides behind the next exps.
template <bool kSum>
__attribute__((target("avx512f"))) inline void exp_avx512_body(float* out, const float* in, float shift, int n,
                                                               float* acc) {
  const __m512 vshift = _mm512_set1_ps(shift), lo = _mm512_set1_ps(-87.0f), hi = _mm512_set1_ps(88.0f);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), shifter = _mm512_set1_ps(12582912.0f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __m512 c7 = _mm512_set1_ps(1.0f / 5040.0f), c6 = _mm512_set1_ps(1.0f / 720.0f);
  const __m512 c5 = _mm512_set1_ps(1.0f / 120.0f), c4 = _mm512_set1_ps(1.0f / 24.0f);
  const __m512 c3 = _mm512_set1_ps(1.0f / 6.0f), c2 = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  __m256 sum = kSum ? _mm256_loadu_ps(acc) : _mm256_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_left(i, n);
    __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, in + i), vshift);
    x = _mm512_max_ps(lo, x);  // as max_ps below: NaN in x survives
    x = _mm512_min_ps(hi, x);
    const __m512 nf = _mm512_sub_ps(_mm512_fmadd_ps(x, log2e, shifter), shifter);
    __m512 r = _mm512_fnmadd_ps(nf, ln2_hi, x);  // x - nf ln2_hi, one rounding: fma(-nf, ln2_hi, x)
    r = _mm512_fnmadd_ps(nf, ln2_lo, r);
    __m512 p = c7;
    p = _mm512_fmadd_ps(p, r, c6);
    p = _mm512_fmadd_ps(p, r, c5);
    p = _mm512_fmadd_ps(p, r, c4);
    p = _mm512_fmadd_ps(p, r, c3);
    p = _mm512_fmadd_ps(p, r, c2);
    p = _mm512_fmadd_ps(p, r, one);
    p = _mm512_fmadd_ps(p, r, one);
    // p 2^nf: nf is an integer in [-126, 127], so this is the product by an exact power of two that
    // exp_fast builds in the exponent bits, rounded once (inactive lanes zero, for the sum).
    const __m512 y = _mm512_maskz_scalef_ps(m, p, nf);
    _mm512_mask_storeu_ps(out + i, m, y);
    if (kSum) {
      sum = _mm256_add_ps(sum, _mm512_castps512_ps256(y));
      sum = _mm256_add_ps(sum, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
    }
  }
  if (kSum) _mm256_storeu_ps(acc, sum);
}

__attribute__((target("avx512f"))) void exp_shifted_avx512(float* out, const float* in, float shift, int n) {
  exp_avx512_body<false>(out, in, shift, n, nullptr);
}

__attribute__((target("avx512f"))) void exp_sum_avx512(float* out, const float* in, float shift, int n, float* acc) {
  exp_avx512_body<true>(out, in, shift, n, acc);
}

// exp_fast on the first n / 8 * 8 elements, eight at a time; returns how many it did.
__attribute__((target("avx2,fma"))) int exp_shifted_avx2(float* out, const float* in, float shift, int n) {
  const __m256 vshift = _mm256_set1_ps(shift), lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), shifter = _mm256_set1_ps(12582912.0f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 c7 = _mm256_set1_ps(1.0f / 5040.0f), c6 = _mm256_set1_ps(1.0f / 720.0f);
  const __m256 c5 = _mm256_set1_ps(1.0f / 120.0f), c4 = _mm256_set1_ps(1.0f / 24.0f);
  const __m256 c3 = _mm256_set1_ps(1.0f / 6.0f), c2 = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256i bias = _mm256_set1_epi32(127);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_sub_ps(_mm256_loadu_ps(in + i), vshift);
    x = _mm256_max_ps(lo, x);  // max_ps returns its second operand when either is NaN: NaN survives
    x = _mm256_min_ps(hi, x);
    const __m256 nf = _mm256_sub_ps(_mm256_fmadd_ps(x, log2e, shifter), shifter);
    __m256 r = _mm256_fnmadd_ps(nf, ln2_hi, x);
    r = _mm256_fnmadd_ps(nf, ln2_lo, r);
    __m256 p = c7;
    p = _mm256_fmadd_ps(p, r, c6);
    p = _mm256_fmadd_ps(p, r, c5);
    p = _mm256_fmadd_ps(p, r, c4);
    p = _mm256_fmadd_ps(p, r, c3);
    p = _mm256_fmadd_ps(p, r, c2);
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(nf), bias), 23);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }
  return i;
}

// max_lanes' value over x[0..n): lane l of a 16-wide maximum holds the elements lanes l and l + 8
// of max_lanes hold, and a maximum does not depend on the order it takes its elements in.
__attribute__((target("avx512f"))) float max_avx512(const float* x, int n) {
  const __m512 none = _mm512_set1_ps(-INFINITY);
  __m512 m = none;
  for (int i = 0; i < n; i += 16)
    m = _mm512_max_ps(_mm512_mask_loadu_ps(none, lanes_left(i, n), x + i), m);  // x > m ? x : m
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float r = lanes[0];
  for (int l = 1; l < 16; l++) r = lanes[l] > r ? lanes[l] : r;
  return r;
}

__attribute__((target("avx512f"))) void scale_avx512(float* x, float s, int n) {
  const __m512 v = _mm512_set1_ps(s);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_left(i, n);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), v));
  }
}

// dot_lanes' value: the products (not fused with the additions) go to eight partial sums in its
// order, element i to lane i % 8 in increasing i, which are then added in lane order.
__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_left(i, n);
    const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(p));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = 0.0f;
  for (int l = 0; l < 8; l++) s += lanes[l];
  return s;
}

__attribute__((target("avx512f"))) void softmax_grad_avx512(float* g, const float* p, float pg, int n, int m) {
  const __m512 vpg = _mm512_set1_ps(pg);
  for (int j = 0; j < n; j += 16) {
    const __mmask16 k = lanes_left(j, n);
    const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, g + j), vpg);
    _mm512_mask_storeu_ps(g + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), d));
  }
  const __m512 zero = _mm512_setzero_ps();
  for (int j = n; j < m; j += 16) _mm512_mask_storeu_ps(g + j, lanes_left(j, m), zero);
}

#pragma GCC diagnostic pop
#endif

}  // namespace

bool cpu_has_avx512() {
#ifdef MT_VEC_X86
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
#else
  return false;
#endif
}

bool cpu_has_avx2_fma() {
#ifdef MT_VEC_X86
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

bool cpu_can_run(SimdPath path) {
  switch (path) {
    case SimdPath::portable:
      return true;
    case SimdPath::avx2:
      return cpu_has_avx2_fma();
    case SimdPath::avx512:
      return cpu_has_avx512();
  }
  return false;
}

SimdPath widest_simd_path() {
  return cpu_has_avx512() ? SimdPath::avx512 : cpu_has_avx2_fma() ? SimdPath::avx2 : SimdPath::portable;
}

void exp_shifted(float* out, const float* in, float shift, int n) {
  int i = 0;
#ifdef MT_VEC_X86
  if (cpu_has_avx512()) {
    exp_shifted_avx512(out, in, shift, n);
    return;
  }
  if (cpu_has_avx2_fma()) i = exp_shifted_avx2(out, in, shift, n);
#endif
  for (; i < n; i++) out[i] = exp_fast(in[i] - shift);
}

int exp_shifted_avx2_part(float* out, const float* in, float shift, int n) {
#ifdef MT_VEC_X86
  if (cpu_has_avx2_fma()) return exp_shifted_avx2(out, in, shift, n);
#endif
  (void)out, (void)in, (void)shift, (void)n;
  return 0;
}

void exp_shifted(double* out, const double* in, double shift, int n) {
  for (int i = 0; i < n; i++) out[i] = std::exp(in[i] - shift);
}

float max_row(const float* x, int n) {
#ifdef MT_VEC_X86
  if (cpu_has_avx512() && n > 0) return max_avx512(x, n);
#endif
  return max_lanes(x, n);
}

float exp_shifted_sum(float* out, const float* in, float shift, int n) {
  float acc[kLanes] = {};
  int i = 0;
#ifdef MT_VEC_X86
  static_assert(kLanes == 8, "exp_sum_avx512 keeps eight partial sums");
  if (cpu_has_avx512()) {
    exp_sum_avx512(out, in, shift, n, acc);
    i = n;
  }
#endif
  exp_shifted(out + i, in + i, shift, n - i);
  for (; i < n; i++) acc[i % kLanes] += out[i];
  float s = 0.0f;
  for (int l = 0; l < kLanes; l++) s += acc[l];
  return s;
}

void scale_row(float* x, float s, int n) {
  int i = 0;
#ifdef MT_VEC_X86
  if (cpu_has_avx512()) {
    scale_avx512(x, s, n);
    i = n;
  }
#endif
  for (; i < n; i++) x[i] *= s;
}

float dot_row(const float* a, const float* b, int n) {
#ifdef MT_VEC_X86
  static_assert(kLanes == 8, "dot_avx512 keeps eight partial sums");
  if (cpu_has_avx512()) return dot_avx512(a, b, n);
#endif
  return dot_lanes(a, b, n);
}

void softmax_grad_row(float* g, const float* p, float pg, int n, int m) {
#ifdef MT_VEC_X86
  if (cpu_has_avx512()) {
    softmax_grad_avx512(g, p, pg, n, m);
    return;
  }
#endif
  softmax_grad_row_portable(g, p, pg, n, m);
}

}  // namespace mt::cpu
