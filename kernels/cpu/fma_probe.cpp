// The FMA probe (fma_probe.h). Each thread keeps kChains independent accumulators, a <- a * b + c,
// enough chains to cover the FMA latency on every pipe (4-5 cycles on two pipes in current x86
// cores), so the loop runs at the FMA units' throughput. The values stay near their start (b is
// 1 + 1e-7 and each repetition starts again), never denormal or infinite, and the sums are kept so
// the compiler cannot drop the work.
#include "kernels/cpu/fma_probe.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "kernels/cpu/vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MT_FMA_X86 1
#endif

namespace mt::cpu {

namespace {

constexpr long kIterations = 1 << 21;  // per thread and repetition: about 10 ms on one AVX-512 core

#ifdef MT_FMA_X86
// 12 chains of 16 floats: 12 x 16 x 2 FLOPs an iteration.
__attribute__((target("avx512f"))) float chains_avx512(long n) {
  constexpr int kChains = 12;
  __m512 a[kChains];
  const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < kChains; i++) a[i] = _mm512_set1_ps(float(i + 1));
  for (long it = 0; it < n; it++) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < kChains; i++) s = _mm512_add_ps(s, a[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float t = 0;
  for (float x : lanes) t += x;
  return t;
}

// 10 chains of 8 floats (16 registers: the chains, b and c).
__attribute__((target("avx2,fma"))) float chains_avx2(long n) {
  constexpr int kChains = 10;
  __m256 a[kChains];
  const __m256 b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < kChains; i++) a[i] = _mm256_set1_ps(float(i + 1));
  for (long it = 0; it < n; it++) {
#pragma GCC unroll 10
    for (int i = 0; i < kChains; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < kChains; i++) s = _mm256_add_ps(s, a[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float t = 0;
  for (float x : lanes) t += x;
  return t;
}
#endif

// 64 chains of one float, a multiply then an add (the build does not contract them).
float chains_portable(long n) {
  constexpr int kChains = 64;
  float a[kChains];
  for (int i = 0; i < kChains; i++) a[i] = float(i + 1);
  for (long it = 0; it < n; it++)
    for (int i = 0; i < kChains; i++) a[i] = a[i] * 1.0000001f + 1e-7f;
  float t = 0;
  for (float x : a) t += x;
  return t;
}

}  // namespace

FmaPeak measure_fma_peak(int threads, double min_seconds) {
  struct Probe {
    float (*chains)(long);
    double flops_per_iteration;
    const char* unit;
  };
  Probe probe{chains_portable, 64 * 2, "portable"};
#ifdef MT_FMA_X86
  switch (widest_simd_path()) {
    case SimdPath::avx512:
      probe = {chains_avx512, 12 * 16 * 2, "AVX-512"};
      break;
    case SimdPath::avx2:
      probe = {chains_avx2, 10 * 8 * 2, "AVX2"};
      break;
    case SimdPath::portable:
      break;
  }
#endif
  threads = std::max(threads, 1);
  double best = 1e30, spent = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 4 || spent < min_seconds; rep++) {
    const auto t0 = std::chrono::steady_clock::now();
    float sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    sum += probe.chains(kIterations);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + sum;
    best = std::min(best, t);
    spent += t;
    if (rep > 1000) break;
  }
  return FmaPeak{probe.flops_per_iteration * double(kIterations) * threads / best, probe.unit};
}

}  // namespace mt::cpu
