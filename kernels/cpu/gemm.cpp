// GEMM for the CPU backend: OpenBLAS when available, else a built-in packed, cache-blocked kernel.
//
// Threading. OpenBLAS (pthreads build) keeps its own thread pool next to OpenMP's. On a machine with
// few cores the two pools fight: each spins while the other works, and OpenBLAS called from inside an
// OpenMP region either serialises on its pool or oversubscribes the cores. We therefore run OpenBLAS
// single-threaded (set once, the first time a GEMM is called) and do all the parallelism with OpenMP:
// a large GEMM is cut into one panel of C per thread (rows if M >= N, else columns), each panel a
// single-threaded BLAS call; a GEMM issued from inside a parallel region (per attention head) is just
// a single-threaded call. One pool, no nesting, and the split is fixed by the thread count, so results
// are deterministic for a fixed number of threads.
#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#ifdef MT_HAVE_BLAS
#include <cblas.h>
#endif

namespace mt::cpu {

namespace {

// Register and cache blocking of the built-in kernel. An MR x NR block of C stays in registers while
// k runs over a KC-long slice; a packed MC x KC block of op(A) and KC x NC block of op(B) stay in L2.
template <class T>
struct Blocking;
template <>
struct Blocking<float> {
  static constexpr int MR = 4, NR = 8, MC = 64, NC = 256, KC = 256;
};
template <>
struct Blocking<double> {
  static constexpr int MR = 4, NR = 4, MC = 64, NC = 128, KC = 256;
};

// Packs op(A)[i0:i0+mc, k0:k0+kc] as consecutive MR-row panels, k-major inside a panel, zero-padded
// to a multiple of MR rows so the micro-kernel never needs an edge case.
template <class T>
void pack_a(T* dst, bool trans, const T* A, int lda, int i0, int mc, int k0, int kc) {
  constexpr int MR = Blocking<T>::MR;
  for (int ir = 0; ir < mc; ir += MR) {
    T* p = dst + size_t(ir) * size_t(kc);
    int mr = std::min(MR, mc - ir);
    for (int k = 0; k < kc; k++) {
      for (int r = 0; r < MR; r++) {
        T v = T(0);
        if (r < mr) {
          int i = i0 + ir + r, kk = k0 + k;
          v = trans ? A[size_t(kk) * size_t(lda) + size_t(i)] : A[size_t(i) * size_t(lda) + size_t(kk)];
        }
        p[k * MR + r] = v;
      }
    }
  }
}

// Packs op(B)[k0:k0+kc, j0:j0+nc] as consecutive NR-column panels, k-major, zero-padded.
template <class T>
void pack_b(T* dst, bool trans, const T* B, int ldb, int k0, int kc, int j0, int nc) {
  constexpr int NR = Blocking<T>::NR;
  for (int jr = 0; jr < nc; jr += NR) {
    T* p = dst + size_t(jr) * size_t(kc);
    int nr = std::min(NR, nc - jr);
    for (int k = 0; k < kc; k++) {
      int kk = k0 + k;
      for (int c = 0; c < NR; c++) {
        T v = T(0);
        if (c < nr) {
          int j = j0 + jr + c;
          v = trans ? B[size_t(j) * size_t(ldb) + size_t(kk)] : B[size_t(kk) * size_t(ldb) + size_t(j)];
        }
        p[k * NR + c] = v;
      }
    }
  }
}

// C[0:mr, 0:nr] = (first ? beta C : C) + alpha * (ap @ bp), the sum over k in a fixed order.
template <class T>
void micro_kernel(const T* ap, const T* bp, int kc, T* C, int ldc, int mr, int nr, T alpha, T beta, bool first) {
  constexpr int MR = Blocking<T>::MR, NR = Blocking<T>::NR;
  T acc[MR][NR] = {};
  for (int k = 0; k < kc; k++) {
    const T* a = ap + k * MR;
    const T* b = bp + k * NR;
    for (int r = 0; r < MR; r++)
      for (int c = 0; c < NR; c++) acc[r][c] += a[r] * b[c];
  }
  for (int r = 0; r < mr; r++) {
    T* crow = C + size_t(r) * size_t(ldc);
    for (int c = 0; c < nr; c++) {
      T base = first ? (beta == T(0) ? T(0) : beta * crow[c]) : crow[c];
      crow[c] = base + alpha * acc[r][c];
    }
  }
}

#ifdef MT_HAVE_BLAS
void blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

void blas_call(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
               float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
              B, ldb, beta, C, ldc);
}
void blas_call(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
               int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
              B, ldb, beta, C, ldc);
}
#endif

}  // namespace

template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
                  T beta, T* C, int ldc) {
  using Bl = Blocking<T>;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // op(A) @ op(B) is empty: C = beta C
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        T& c = C[size_t(i) * size_t(ldc) + size_t(j)];
        c = beta == T(0) ? T(0) : beta * c;
      }
    return;
  }
  const int tiles_m = (M + Bl::MC - 1) / Bl::MC, tiles_n = (N + Bl::NC - 1) / Bl::NC;
  // Each output tile is owned by one thread and sums k in the same order whoever runs it, so the
  // result does not depend on the number of threads.
#pragma omp parallel if (!omp_in_parallel() && tiles_m * tiles_n > 1 && 2.0 * M * N * K >= 4e6)
  {
    std::vector<T> ap(size_t(Bl::MC) * Bl::KC), bp(size_t(Bl::NC) * Bl::KC);
#pragma omp for collapse(2) schedule(static)
    for (int tm = 0; tm < tiles_m; tm++) {
      for (int tn = 0; tn < tiles_n; tn++) {
        int i0 = tm * Bl::MC, j0 = tn * Bl::NC;
        int mc = std::min(Bl::MC, M - i0), nc = std::min(Bl::NC, N - j0);
        for (int k0 = 0; k0 < K; k0 += Bl::KC) {
          int kc = std::min(Bl::KC, K - k0);
          pack_a(ap.data(), trans_a, A, lda, i0, mc, k0, kc);
          pack_b(bp.data(), trans_b, B, ldb, k0, kc, j0, nc);
          for (int jr = 0; jr < nc; jr += Bl::NR) {
            for (int ir = 0; ir < mc; ir += Bl::MR) {
              T* c = C + size_t(i0 + ir) * size_t(ldc) + size_t(j0 + jr);
              micro_kernel(ap.data() + size_t(ir) * size_t(kc), bp.data() + size_t(jr) * size_t(kc), kc, c, ldc,
                           std::min(Bl::MR, mc - ir), std::min(Bl::NR, nc - jr), alpha, beta, k0 == 0);
            }
          }
        }
      }
    }
  }
}

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
          T* C, int ldc) {
#ifdef MT_HAVE_BLAS
  if (M <= 0 || N <= 0) return;
  blas_single_threaded();
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Below ~4 MFLOP a second thread costs more to wake than it saves.
  if (nt == 1 || 2.0 * M * N * K < 4e6) {
    blas_call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = M >= N;
  const int extent = split_rows ? M : N;
  // Panel boundaries on multiples of 16 keep every panel but the last on BLAS's full-width kernels.
  const int chunk = ((extent + nt - 1) / nt + 15) / 16 * 16;
  const int panels = (extent + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nt) schedule(static, 1)
  for (int p = 0; p < panels; p++) {
    int s = p * chunk, n = std::min(chunk, extent - s);
    if (split_rows) {
      const T* a = trans_a ? A + s : A + size_t(s) * size_t(lda);
      blas_call(trans_a, trans_b, n, N, K, alpha, a, lda, B, ldb, beta, C + size_t(s) * size_t(ldc), ldc);
    } else {
      const T* b = trans_b ? B + size_t(s) * size_t(ldb) : B + s;
      blas_call(trans_a, trans_b, M, n, K, alpha, A, lda, b, ldb, beta, C + s, ldc);
    }
  }
#else
  gemm_builtin(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

bool have_blas() {
#ifdef MT_HAVE_BLAS
  return true;
#else
  return false;
#endif
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int);
template void gemm<double>(bool, bool, int, int, int, double, const double*, int, const double*, int, double, double*,
                           int);
template void gemm_builtin<float>(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                                  float*, int);
template void gemm_builtin<double>(bool, bool, int, int, int, double, const double*, int, const double*, int, double,
                                   double*, int);

}  // namespace mt::cpu
