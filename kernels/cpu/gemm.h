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
#include <cstddef>
#include <cstdlib>
#include <memory>

namespace mt::cpu {

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
          T* C, int ldc);

// The built-in GEMM: packed, cache-blocked, SIMD micro-kernel, OpenMP over the row blocks of C.
// What gemm() runs on most x86 CPUs; exposed so that tests can run it where gemm() takes BLAS.
template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
                  T beta, T* C, int ldc);

// 64-byte aligned storage for packed operands (micro-kernel loads never split a cache line).
template <class T>
class AlignedBuffer {
 public:
  // Holds at least n values afterwards; the contents are not kept when it grows.
  T* reserve(size_t n);
  T* get() const { return p_.get(); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> p_;
  size_t n_ = 0;
};

// A B operand packed once for many products. Attention multiplies each head's K, V, Q and dO by
// every block of query rows; packing them once per head instead of once per block removes most of
// the small products' overhead. op(B) (K rows, N columns) is B itself or, with trans, the
// transpose of an (N, K) matrix, laid out as the built-in kernel's NR-wide panels, each holding
// all K rows.
template <class T>
class PackedB {
 public:
  void pack(bool trans, const T* B, int ldb, int K, int N);
  int rows() const { return K_; }
  int cols() const { return N_; }
  // Row k of panel jp (NR values).
  const T* at(int jp, int k) const { return buf_.get() + (size_t(jp) * size_t(K_) + size_t(k)) * size_t(nr_); }

 private:
  AlignedBuffer<T> buf_;
  int K_ = 0, N_ = 0, nr_ = 0;
};

// The per-thread workspace of gemm_prepacked (A's packed panels, one ragged-edge block), kept
// across calls so that a run of small products allocates nothing.
template <class T>
struct GemmScratch {
  AlignedBuffer<T> apack, edge;
};

// C (M,N) = alpha * op(A) (M,K) @ op(B)[k0:k0+K, 0:N] + beta * C with op(B) from PackedB, on the
// calling thread, through the built-in micro-kernel even where gemm() would call OpenBLAS (double, or
// a CPU without a SIMD kernel). For the same operands the bits are gemm_builtin's with B's rows k0..
// as its B: the same kernel, the same k slices (tests/test_kernels_gemm.cpp).
template <class T>
void gemm_prepacked(bool trans_a, int M, int N, int K, T alpha, const T* A, int lda, const PackedB<T>& B, int k0,
                    T beta, T* C, int ldc, GemmScratch<T>& scratch);

// True when the build links OpenBLAS.
bool have_blas();
// What gemm() runs for float (or double): "OpenBLAS", or the built-in micro-kernel's name
// ("avx512", "avx2", "portable"). For logs and benchmark labels.
const char* gemm_backend(bool for_double = false);

}  // namespace mt::cpu
