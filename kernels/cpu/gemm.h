// Row-major GEMM used by every CPU op that multiplies matrices:
//
//   C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C
//
// op(A) = A (row stride lda) or, with trans_a, the transpose of a (K,M) matrix A; likewise op(B).
// beta == 0 overwrites C without reading it (so C may hold garbage or NaN).
//
// gemm() goes to OpenBLAS when the build has it and to gemm_builtin() otherwise. Called outside an
// OpenMP parallel region, both split the output over the OpenMP threads; called inside one (e.g. per
// attention head), both run on the calling thread. Results are bitwise deterministic for a fixed
// thread count; gemm_builtin's are also independent of the thread count.
#pragma once

namespace mt::cpu {

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
          T* C, int ldc);

// The portable fallback: cache-blocked, packed, OpenMP over output tiles. Exposed so that tests can
// check it against the BLAS path.
template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
                  T beta, T* C, int ldc);

// True when gemm() uses OpenBLAS.
bool have_blas();

}  // namespace mt::cpu
