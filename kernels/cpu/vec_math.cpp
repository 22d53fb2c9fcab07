// exp over arrays (see vec_math.h): an SSE2 body, four floats at a time, performing exactly the
// operations of exp_fast, and exp_fast for the tail.
#include "kernels/cpu/vec_math.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace mt::cpu {

void exp_shifted(float* out, const float* in, float shift, int n) {
  int i = 0;
#if defined(__SSE2__)
  const __m128 vshift = _mm_set1_ps(shift), lo = _mm_set1_ps(-87.0f), hi = _mm_set1_ps(88.0f);
  const __m128 log2e = _mm_set1_ps(1.44269504088896341f), shifter = _mm_set1_ps(12582912.0f);
  const __m128 ln2_hi = _mm_set1_ps(0.693359375f), ln2_lo = _mm_set1_ps(-2.12194440e-4f);
  const __m128 c7 = _mm_set1_ps(1.0f / 5040.0f), c6 = _mm_set1_ps(1.0f / 720.0f), c5 = _mm_set1_ps(1.0f / 120.0f);
  const __m128 c4 = _mm_set1_ps(1.0f / 24.0f), c3 = _mm_set1_ps(1.0f / 6.0f), c2 = _mm_set1_ps(0.5f);
  const __m128 one = _mm_set1_ps(1.0f);
  const __m128i bias = _mm_set1_epi32(127);
  for (; i + 4 <= n; i += 4) {
    __m128 x = _mm_sub_ps(_mm_loadu_ps(in + i), vshift);
    x = _mm_max_ps(lo, x);  // max_ps returns its second operand when either is NaN: NaN survives
    x = _mm_min_ps(hi, x);
    const __m128 nf = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, log2e), shifter), shifter);
    __m128 r = _mm_sub_ps(x, _mm_mul_ps(nf, ln2_hi));
    r = _mm_sub_ps(r, _mm_mul_ps(nf, ln2_lo));
    __m128 p = c7;
    p = _mm_add_ps(_mm_mul_ps(p, r), c6);
    p = _mm_add_ps(_mm_mul_ps(p, r), c5);
    p = _mm_add_ps(_mm_mul_ps(p, r), c4);
    p = _mm_add_ps(_mm_mul_ps(p, r), c3);
    p = _mm_add_ps(_mm_mul_ps(p, r), c2);
    p = _mm_add_ps(_mm_mul_ps(p, r), one);
    p = _mm_add_ps(_mm_mul_ps(p, r), one);
    const __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(nf), bias), 23);
    _mm_storeu_ps(out + i, _mm_mul_ps(p, _mm_castsi128_ps(e)));
  }
#endif
  for (; i < n; i++) out[i] = exp_fast(in[i] - shift);
}

void exp_shifted(double* out, const double* in, double shift, int n) {
  for (int i = 0; i < n; i++) out[i] = std::exp(in[i] - shift);
}

}  // namespace mt::cpu
