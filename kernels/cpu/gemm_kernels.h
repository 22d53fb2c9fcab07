// Micro-kernels of the built-in GEMM (internal to kernels/cpu). A micro-kernel multiplies an
// MR x kc panel a of op(A) by a packed kc x NR panel b of op(B) in registers and writes one MR x NR
// block of C:  c = (first ? beta c : c) + alpha * (a @ b),  the sum over k running in order.
//
// Element (r, k) of a is a[r * rs + k * ks]: rs = 1, ks = MR is the packed layout (column k of the
// panel = MR consecutive values); other strides read op(A) in place, which pays when C has so few
// columns that packing A would cost as much as the product. b holds kc groups of NR values (row k).
// Both layouts run the same arithmetic in the same order, so they give identical bits.
// The float kernel is chosen once per process from what the CPU supports (AVX-512, AVX2+FMA, or
// portable C++); the choice does not depend on anything else.
#pragma once
#include <cstdint>
#include <vector>

namespace mt::cpu {

template <class T>
struct MicroKernel {
  int mr, nr;
  void (*run)(int kc, const T* a, int64_t rs, int64_t ks, const T* b, T* c, int ldc, T alpha, T beta, bool first);
  const char* name;
};

// The best kernel for this CPU (chosen once), and every kernel this CPU can run (for tests).
const MicroKernel<float>& float_micro_kernel();
const MicroKernel<double>& double_micro_kernel();
std::vector<MicroKernel<float>> runnable_float_micro_kernels();

// The packed, blocked GEMM driver behind gemm_builtin() (same contract as gemm() in gemm.h), with
// an explicit micro-kernel.
template <class T>
void gemm_packed(const MicroKernel<T>& uk, bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A,
                 int lda, const T* B, int ldb, T beta, T* C, int ldc);

}  // namespace mt::cpu
