// Linear layers (matmul_fwd/bwd) on the cuBLASLt helper (gemm.cuh), for storage types float, bf16, f16.
//
// A row-major (r, c) array is the column-major (c x r) matrix cuBLAS sees. With X = inp^T (IC x N),
// W = weight^T (IC x OC) and G = dout^T (OC x N) in that view:
//   matmul_fwd:  out      D (OC x N)   = W^T X   (+ bias on every column; GELU epilogue with pre_gelu;
//                                                 + residual as C with beta = 1)
//   matmul_bwd:  dinp     D (IC x N)   = W G     (DGELU epilogue with the previous layer's pre_gelu)
//                dweight  D (IC x OC) += X G^T   (S operands, fp32 C = D, beta = 1: parameter gradients
//                                                 accumulate in fp32)
// dbias is a deterministic two-pass column sum in fp32 (column_sum_kernels.cuh, no atomics), accumulated like
// every parameter gradient.
#include <cstdint>

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/matmul_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {

using namespace matmul_kernels;

template <class S>
void matmul_fwd(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, const ops::Ctx& ctx,
                S* pre_gelu, const S* residual) {
  MT_CHECK(N >= 0 && IC > 0 && OC > 0, "matmul_fwd: bad sizes N=%d IC=%d OC=%d", N, IC, OC);
  MT_CHECK(!(pre_gelu && residual), "matmul_fwd: a residual cannot be added after the GELU epilogue");
  gemm(fwd_gemm(out, inp, weight, bias, N, IC, OC, pre_gelu, residual), ctx);
}

template <class S>
void matmul_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight, int N, int IC,
                int OC, const ops::Ctx& ctx, const S* pre_gelu, bool dweight_assign) {
  MT_CHECK(N >= 0 && IC > 0 && OC > 0, "matmul_bwd: bad sizes N=%d IC=%d OC=%d", N, IC, OC);
  if (N == 0) {
    if (dweight && dweight_assign) MT_CUDA_CHECK(cudaMemsetAsync(dweight, 0, size_t(IC) * OC * 4, stream_of(ctx)));
    return;
  }
  if (dbias) {
    column_sums<1>({{dbias}}, BiasGradTerm<dev_t<S>>{dev_ptr(dout)}, N, OC, stream_of(ctx));
  }
  if (dweight) gemm(dweight_gemm(dweight, dout, inp, N, IC, OC, dweight_assign), ctx);
  if (dinp) gemm(dinp_gemm(dinp, dout, weight, N, IC, OC, pre_gelu), ctx);
}

#define MT_MATMUL_INSTANTIATE(S)                                                                           \
  template void matmul_fwd<S>(S*, const S*, const S*, const S*, int, int, int, const ops::Ctx&, S*, const S*); \
  template void matmul_bwd<S>(S*, float*, float*, const S*, const S*, const S*, int, int, int, const ops::Ctx&, \
                              const S*, bool);
MT_MATMUL_INSTANTIATE(float)
MT_MATMUL_INSTANTIATE(bf16)
MT_MATMUL_INSTANTIATE(f16)
#undef MT_MATMUL_INSTANTIATE

}  // namespace mt::cuda
