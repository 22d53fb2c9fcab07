// Row-major GEMM used by every CPU op that multiplies matrices:
//
//   C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C
//
// op(A) = A (row stride lda) or, with trans_a, the transpose of a (K,M) matrix A; likewise op(B).
// beta == 0 overwrites C without reading it (so C may hold garbage or NaN).
//
// gemm() runs gemm_builtin() when that has a SIMD micro-kernel for this CPU (AVX-512 or AVX2+FMA),
// and OpenBLAS otherwise when the build has it (see gemm.cpp for the measurements behind this).
// Called outside an OpenMP parallel region, both split the output over the OpenMP threads; called
// inside one (e.g. per attention head), both run on the calling thread. Results are bitwise
// deterministic for a fixed thread count; gemm_builtin's are also independent of the thread count.
#pragma once

namespace mt::cpu {

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
          T* C, int ldc);

// The built-in GEMM: packed, cache-blocked, SIMD micro-kernel, OpenMP over the row blocks of C.
// What gemm() runs on most x86 CPUs; exposed so that tests can run it where gemm() takes BLAS.
template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
                  T beta, T* C, int ldc);

// True when the build links OpenBLAS.
bool have_blas();
// What gemm() runs for float (or double): "OpenBLAS", or the built-in micro-kernel's name
// ("avx512", "avx2", "portable"). For logs and benchmark labels.
const char* gemm_backend(bool for_double = false);

}  // namespace mt::cpu
