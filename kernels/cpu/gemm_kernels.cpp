// Register-blocked micro-kernels for the built-in GEMM; see gemm_kernels.h for the contract.
//
// Sizes follow the register files: AVX-512 has 32 vector registers, so a 12 x 32 block of C is 24
// accumulators plus two registers for the row of b (the a values are broadcast from memory); AVX2
// has 16, so 6 x 16 is 12 accumulators, two b registers and one broadcast. Each k step does one
// fused multiply-add per accumulator (explicit FMA intrinsics: the build disables implicit
// contraction, and these kernels opt in deliberately). The portable kernel is plain C++ that the
// compiler vectorises for whatever the build targets.
#include "kernels/cpu/gemm_kernels.h"

#include "kernels/cpu/vec_math.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MT_GEMM_X86 1
#endif

namespace mt::cpu {

namespace {

// Element (r, k) of the a panel: packed (MR values per k) or read in place from op(A) with strides.
template <bool kPacked, int MR, class T>
inline T a_at(const T* a, int64_t rs, int64_t ks, int r, int k) {
  return kPacked ? a[k * MR + r] : a[r * rs + k * ks];
}

template <class T, int MR, int NR, bool kPacked>
void portable_body(int kc, const T* a, int64_t rs, int64_t ks, const T* b, T* c, int ldc, T alpha, T beta, bool first) {
  T acc[MR][NR] = {};
  for (int k = 0; k < kc; k++) {
    for (int r = 0; r < MR; r++)
      for (int j = 0; j < NR; j++) acc[r][j] += a_at<kPacked, MR>(a, rs, ks, r, k) * b[j];
    b += NR;
  }
  for (int r = 0; r < MR; r++) {
    T* cr = c + r * ldc;
    for (int j = 0; j < NR; j++) {
      const T base = first ? (beta == T(0) ? T(0) : beta * cr[j]) : cr[j];
      cr[j] = base + alpha * acc[r][j];
    }
  }
}

template <class T, int MR, int NR>
void run_portable(int kc, const T* a, int64_t rs, int64_t ks, const T* b, T* c, int ldc, T alpha, T beta, bool first) {
  if (rs == 1 && ks == MR)
    portable_body<T, MR, NR, true>(kc, a, rs, ks, b, c, ldc, alpha, beta, first);
  else
    portable_body<T, MR, NR, false>(kc, a, rs, ks, b, c, ldc, alpha, beta, first);
}

#ifdef MT_GEMM_X86
template <bool kPacked>
__attribute__((target("avx512f"))) inline void avx512_body(int kc, const float* a, int64_t rs, int64_t ks,
                                                           const float* b, float* c, int ldc, float alpha, float beta,
                                                           bool first) {
  constexpr int MR = 12;
  // C is touched only after the k loop; fetching its lines now hides the miss behind the FMAs.
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
  }
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int k = 0; k < kc; k++) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
      const __m512 ar = _mm512_set1_ps(a_at<kPacked, MR>(a, rs, ks, r, k));
      acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
    }
    b += 32;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int r = 0; r < MR; r++) {
    float* cr = c + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, acc0[r]), x1 = _mm512_mul_ps(va, acc1[r]);
    if (!first) {
      x0 = _mm512_add_ps(_mm512_loadu_ps(cr), x0);
      x1 = _mm512_add_ps(_mm512_loadu_ps(cr + 16), x1);
    } else if (beta != 0.f) {
      x0 = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_loadu_ps(cr)), x0);
      x1 = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_loadu_ps(cr + 16)), x1);
    }
    _mm512_storeu_ps(cr, x0);
    _mm512_storeu_ps(cr + 16, x1);
  }
}

__attribute__((target("avx512f"))) void run_avx512(int kc, const float* a, int64_t rs, int64_t ks, const float* b,
                                                   float* c, int ldc, float alpha, float beta, bool first) {
  if (rs == 1 && ks == 12)
    avx512_body<true>(kc, a, rs, ks, b, c, ldc, alpha, beta, first);
  else
    avx512_body<false>(kc, a, rs, ks, b, c, ldc, alpha, beta, first);
}

template <bool kPacked>
__attribute__((target("avx2,fma"))) inline void avx2_body(int kc, const float* a, int64_t rs, int64_t ks,
                                                          const float* b, float* c, int ldc, float alpha, float beta,
                                                          bool first) {
  constexpr int MR = 6;
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
  __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int k = 0; k < kc; k++) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
      const __m256 ar = _mm256_set1_ps(a_at<kPacked, MR>(a, rs, ks, r, k));
      acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
    }
    b += 16;
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++) {
    float* cr = c + r * ldc;
    __m256 x0 = _mm256_mul_ps(va, acc0[r]), x1 = _mm256_mul_ps(va, acc1[r]);
    if (!first) {
      x0 = _mm256_add_ps(_mm256_loadu_ps(cr), x0);
      x1 = _mm256_add_ps(_mm256_loadu_ps(cr + 8), x1);
    } else if (beta != 0.f) {
      x0 = _mm256_add_ps(_mm256_mul_ps(vb, _mm256_loadu_ps(cr)), x0);
      x1 = _mm256_add_ps(_mm256_mul_ps(vb, _mm256_loadu_ps(cr + 8)), x1);
    }
    _mm256_storeu_ps(cr, x0);
    _mm256_storeu_ps(cr + 8, x1);
  }
}

__attribute__((target("avx2,fma"))) void run_avx2(int kc, const float* a, int64_t rs, int64_t ks, const float* b,
                                                  float* c, int ldc, float alpha, float beta, bool first) {
  if (rs == 1 && ks == 6)
    avx2_body<true>(kc, a, rs, ks, b, c, ldc, alpha, beta, first);
  else
    avx2_body<false>(kc, a, rs, ks, b, c, ldc, alpha, beta, first);
}
#endif

}  // namespace

std::vector<MicroKernel<float>> runnable_float_micro_kernels() {
  std::vector<MicroKernel<float>> ks;
#ifdef MT_GEMM_X86
  if (cpu_has_avx512()) ks.push_back({12, 32, run_avx512, "avx512"});
  if (cpu_has_avx2_fma()) ks.push_back({6, 16, run_avx2, "avx2"});
#endif
  ks.push_back({4, 8, run_portable<float, 4, 8>, "portable"});
  return ks;
}

const MicroKernel<float>& float_micro_kernel() {
  static const MicroKernel<float> k = runnable_float_micro_kernels().front();
  return k;
}

const MicroKernel<double>& double_micro_kernel() {
  static const MicroKernel<double> k{4, 4, run_portable<double, 4, 4>, "portable"};
  return k;
}

}  // namespace mt::cpu
