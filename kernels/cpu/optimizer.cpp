// Optimizer-side ops on flat parameter/gradient buffers: AdamW, the sum of squares behind the global
// gradient norm, scaling (clipping, loss-scale removal), rounding to the compute precision, and the
// finiteness check of fp16 loss scaling.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/check.h"
#include "runtime/dtype.h"

namespace mt::cpu {

namespace {
// sum_squares works in blocks of this many elements, each summed alone, then added in block order:
// the split does not depend on the thread count, so neither does the result.
constexpr int64_t kSumBlock = 4096;
}  // namespace

// AdamW (Loshchilov & Hutter 2019, Algorithm 2), with the decay scaled by lr as torch.optim.AdamW does:
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2,
//   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p).
template <class T>
void adamw(T* params, T* m, T* v, const T* grads, int64_t N, T lr, T beta1, T beta2, T eps, T weight_decay, int t,
           const T* grad_scale) {
  MT_CHECK(t >= 1, "adamw: step t = %d, but bias correction needs t >= 1", t);
  const T bc1 = T(1.0 - std::pow(double(beta1), t));
  const T bc2 = T(1.0 - std::pow(double(beta2), t));
  const T one_b1 = T(1) - beta1, one_b2 = T(1) - beta2;
  const T s = grad_scale ? *grad_scale : T(1);  // g * 1 is g, bit for bit
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) {
    const T g = grads[i] * s;
    const T mi = beta1 * m[i] + one_b1 * g;
    const T vi = beta2 * v[i] + one_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const T mhat = mi / bc1, vhat = vi / bc2;
    params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * params[i]);
  }
}

namespace {

// The sums of squares of `kBlocks` blocks of n values, kSumBlock apart, read side by side, each in
// its own eight double lanes (value i into lane i % 8, the lanes then added in order): every block's
// sum has the bits of summing it alone, whatever the number of blocks read together. A core reading
// one stream of cold memory mostly waited on it; several streams keep more lines in flight.
// (A float squared in double is exact, so the order of a lane's adds is all that fixes the bits.)
constexpr int kStreams = 4;
// One block's end: the squares of its ragged tail (n_tail < 8 values, a lone last block's) into
// lanes 0.., then the lanes added in order.
template <class T>
double finish_lanes(double (&lanes)[8], const T* tail, int64_t n_tail) {
  for (int l = 0; l < int(std::min<int64_t>(n_tail, 8)); l++) {
    const double e = double(tail[l]);
    lanes[l] += e * e;
  }
  double t = 0.0;
  for (int l = 0; l < 8; l++) t += lanes[l];
  return t;
}

template <int kBlocks, class T>
void block_sums_portable(const T* x, int64_t n, double* out) {
  double acc[kBlocks][8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int s = 0; s < kBlocks; s++)
      for (int l = 0; l < 8; l++) {
        const double e = double(x[s * kSumBlock + i + l]);
        acc[s][l] += e * e;
      }
  for (int s = 0; s < kBlocks; s++) out[s] = finish_lanes(acc[s], x + s * kSumBlock + i, n - i);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same lanes in one AVX-512 register per block. GCC's vectoriser turned the portable loop into
// single-float loads and inserts (about 17 GB/s on two cores, hot or cold: bound by the shuffles, not
// by memory); explicit 8-float loads widened to double run at the memory's pace.
// GCC 12 reports the conversion intrinsic's undefined upper half as uninitialised: a false alarm.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
template <int kBlocks>
__attribute__((target("avx512f"))) void block_sums_avx512(const float* x, int64_t n, double* out) {
  __m512d acc[kBlocks];
  for (int s = 0; s < kBlocks; s++) acc[s] = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int s = 0; s < kBlocks; s++) {
      const __m512d e = _mm512_cvtps_pd(_mm256_loadu_ps(x + s * kSumBlock + i));
      acc[s] = _mm512_add_pd(acc[s], _mm512_mul_pd(e, e));
    }
  for (int s = 0; s < kBlocks; s++) {
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, acc[s]);
    out[s] = finish_lanes(lanes, x + s * kSumBlock + i, n - i);
  }
}

// The same lanes in two AVX2 registers per block (lanes 0-3 and 4-7), for CPUs without AVX-512.
template <int kBlocks>
__attribute__((target("avx2"))) void block_sums_avx2(const float* x, int64_t n, double* out) {
  __m256d lo[kBlocks], hi[kBlocks];
  for (int s = 0; s < kBlocks; s++) lo[s] = hi[s] = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int s = 0; s < kBlocks; s++) {
      const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + s * kSumBlock + i));
      const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(x + s * kSumBlock + i + 4));
      lo[s] = _mm256_add_pd(lo[s], _mm256_mul_pd(a, a));
      hi[s] = _mm256_add_pd(hi[s], _mm256_mul_pd(b, b));
    }
  for (int s = 0; s < kBlocks; s++) {
    alignas(32) double lanes[8];
    _mm256_store_pd(lanes, lo[s]);
    _mm256_store_pd(lanes + 4, hi[s]);
    out[s] = finish_lanes(lanes, x + s * kSumBlock + i, n - i);
  }
}
#pragma GCC diagnostic pop
#endif

template <int kBlocks, class T>
void block_sums(const T* x, int64_t n, double* out, SimdPath path) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<T, float>) {
    if (path == SimdPath::avx512) return block_sums_avx512<kBlocks>(x, n, out);
    if (path == SimdPath::avx2) return block_sums_avx2<kBlocks>(x, n, out);
  }
#endif
  (void)path;
  block_sums_portable<kBlocks>(x, n, out);
}

template <class T>
double sum_squares_on(const T* x, int64_t N, SimdPath path) {
  const int64_t blocks = (N + kSumBlock - 1) / kSumBlock, groups = (blocks + kStreams - 1) / kStreams;
  std::vector<double> partial(size_t(blocks), 0.0);
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t g = 0; g < groups; g++) {
    const int64_t b0 = g * kStreams;
    if ((b0 + kStreams) * kSumBlock <= N) {
      block_sums<kStreams>(x + b0 * kSumBlock, kSumBlock, &partial[size_t(b0)], path);
      continue;
    }
    for (int64_t b = b0; b < std::min(blocks, b0 + kStreams); b++) {  // the ragged end, a block at a time
      const int64_t i0 = b * kSumBlock;
      block_sums<1>(x + i0, std::min(kSumBlock, N - i0), &partial[size_t(b)], path);
    }
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double sum_squares_via(SimdPath path, const float* x, int64_t N) {
  MT_CHECK(cpu_can_run(path), "sum_squares_via: this CPU cannot run the requested vector path");
  return sum_squares_on(x, N, path);
}

template <class T>
double sum_squares(const T* x, int64_t N) {
  return sum_squares_on(x, N, widest_simd_path());
}

template <class T>
void scale(T* x, T s, int64_t N) {
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) x[i] *= s;
}

void round_to(float* x, int64_t N, int dtype) {
  switch (DType(dtype)) {
    case DType::f32:
      return;
    case DType::bf16:
#pragma omp parallel for schedule(static) if (parallel_worth(N))
      for (int64_t i = 0; i < N; i++) x[i] = round_bf16(x[i]);
      return;
    case DType::f16:
#pragma omp parallel for schedule(static) if (parallel_worth(N))
      for (int64_t i = 0; i < N; i++) x[i] = round_f16(x[i]);
      return;
    default:
      break;
  }
  mt::fail("round_to: cannot round float values to %s (expected f32, bf16 or f16)", dtype_name(DType(dtype)));
}

bool all_finite(const float* x, int64_t N) {
  // Exponent bits all ones <=> inf or NaN; a branch-free OR keeps the loop vectorised.
  uint32_t bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) {
    uint32_t u;
    std::memcpy(&u, &x[i], sizeof u);
    bad |= uint32_t((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

template void adamw<float>(float*, float*, float*, const float*, int64_t, float, float, float, float, float, int,
                           const float*);
template void adamw<double>(double*, double*, double*, const double*, int64_t, double, double, double, double, double,
                            int, const double*);
template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);
template void scale<float>(float*, float, int64_t);
template void scale<double>(double*, double, int64_t);

}  // namespace mt::cpu
