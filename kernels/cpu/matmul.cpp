// Linear layer, weight stored (OC, IC) as in torch.nn.Linear:
//   forward   out = inp @ W^T + b
//   backward  dinp = dout @ W,   dW += dout^T @ inp,   db += colsum(dout)
// All three products are one GEMM each (kernels/cpu/gemm.h); no transposed copies are made.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
constexpr int kColBlock = 64;
}  // namespace

template <class T>
void matmul_fwd(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC) {
  if (bias) {
    // Seed out with the bias and let the GEMM accumulate onto it (beta = 1): one pass over out
    // instead of a second one after the product.
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(N) * OC))
    for (int i = 0; i < N; i++) std::copy(bias, bias + OC, out + int64_t(i) * OC);
  }
  gemm<T>(false, true, N, OC, IC, T(1), inp, IC, weight, IC, bias ? T(1) : T(0), out, OC);
}

template <class T>
void matmul_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N, int IC, int OC) {
  if (dinp) gemm<T>(false, false, N, IC, OC, T(1), dout, OC, weight, IC, T(0), dinp, IC);
  gemm<T>(true, false, OC, IC, N, T(1), dout, OC, inp, IC, T(1), dweight, IC);
  if (dbias) {
    // Column blocks, rows summed in order: the same result for any thread count.
    const int blocks = (OC + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(N) * OC))
    for (int cb = 0; cb < blocks; cb++) {
      const int c0 = cb * kColBlock, c1 = std::min(OC, c0 + kColBlock);
      T acc[kColBlock] = {};
      for (int i = 0; i < N; i++) {
        const T* d = dout + int64_t(i) * OC;
        for (int c = c0; c < c1; c++) acc[c - c0] += d[c];
      }
      for (int c = c0; c < c1; c++) dbias[c] += acc[c - c0];
    }
  }
}

template void matmul_fwd<float>(float*, const float*, const float*, const float*, int, int, int);
template void matmul_fwd<double>(double*, const double*, const double*, const double*, int, int, int);
template void matmul_bwd<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int);
template void matmul_bwd<double>(double*, double*, double*, const double*, const double*, const double*, int, int, int);

}  // namespace mt::cpu
