// Linear layers (matmul_fwd/bwd) on the cuBLASLt helper (gemm.cuh), for storage types float, bf16, f16.
//
// A row-major (r, c) array is the column-major (c x r) matrix cuBLAS sees. With X = inp^T (IC x N),
// W = weight^T (IC x OC) and G = dout^T (OC x N) in that view:
//   matmul_fwd:  out      D (OC x N)   = W^T X   (+ bias on every column; GELU epilogue with pre_gelu)
//   matmul_bwd:  dinp     D (IC x N)   = W G     (DGELU epilogue with the previous layer's pre_gelu)
//                dweight  D (IC x OC) += X G^T   (S operands, fp32 C = D, beta = 1: parameter gradients
//                                                 accumulate in fp32)
// dbias is a deterministic column sum in fp32 (no atomics), accumulated like every parameter gradient.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

// dbias[c] += sum_r x[r, c] over a row-major (R, C) matrix. A block owns 32 columns; its 32 rows of
// threads stride over R and their partials are added in row-lane order, so the sum is reproducible.
template <class D>
__global__ void column_sum_kernel(float* dbias, const D* x, int R, int C) {
  __shared__ float part[kWarp][kWarp + 1];
  const int c = int(blockIdx.x) * kWarp + int(threadIdx.x);
  float s = 0.f;
  if (c < C)
    for (int r = int(threadIdx.y); r < R; r += int(blockDim.y)) s += load(x[int64_t(r) * C + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.f;
    for (int y = 0; y < int(blockDim.y); y++) total += part[y][threadIdx.x];
    dbias[c] += total;
  }
}

}  // namespace

template <class S>
void matmul_fwd(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, const ops::Ctx& ctx,
                S* pre_gelu) {
  MT_CHECK(N >= 0 && IC > 0 && OC > 0, "matmul_fwd: bad sizes N=%d IC=%d OC=%d", N, IC, OC);
  Gemm g;
  g.m = OC, g.n = N, g.k = IC;
  g.ab_type = g.d_type = dtype_of<S>();
  g.trans_a = true, g.a = weight, g.lda = IC;
  g.b = inp, g.ldb = IC;
  g.d = out, g.ldd = OC;
  g.bias = bias;
  if (pre_gelu) g.epilogue = Epilogue::gelu, g.aux = pre_gelu;
  gemm(g, ctx);
}

template <class S>
void matmul_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight, int N, int IC,
                int OC, const ops::Ctx& ctx, const S* pre_gelu) {
  MT_CHECK(N >= 0 && IC > 0 && OC > 0, "matmul_bwd: bad sizes N=%d IC=%d OC=%d", N, IC, OC);
  if (N == 0) return;
  if (dbias) {
    column_sum_kernel<<<ceil_div(OC, kWarp), dim3(kWarp, kWarp), 0, stream_of(ctx)>>>(dbias, dev_ptr(dout), N, OC);
    MT_CUDA_CHECK_LAUNCH();
  }
  if (dweight) {
    Gemm g;
    g.m = IC, g.n = OC, g.k = N;
    g.ab_type = dtype_of<S>(), g.d_type = DType::f32;
    g.a = inp, g.lda = IC;
    g.trans_b = true, g.b = dout, g.ldb = OC;
    g.d = dweight, g.ldd = IC;
    g.beta = 1.f;  // parameter gradients accumulate
    gemm(g, ctx);
  }
  if (dinp) {
    Gemm g;
    g.m = IC, g.n = N, g.k = OC;
    g.ab_type = g.d_type = dtype_of<S>();
    g.a = weight, g.lda = IC;
    g.b = dout, g.ldb = OC;
    g.d = dinp, g.ldd = IC;
    // The epilogue only reads pre_gelu; the GEMM descriptor takes a non-const pointer for both uses.
    if (pre_gelu) g.epilogue = Epilogue::dgelu, g.aux = const_cast<S*>(pre_gelu);
    gemm(g, ctx);
  }
}

#define MT_MATMUL_INSTANTIATE(S)                                                                           \
  template void matmul_fwd<S>(S*, const S*, const S*, const S*, int, int, int, const ops::Ctx&, S*);       \
  template void matmul_bwd<S>(S*, float*, float*, const S*, const S*, const S*, int, int, int, const ops::Ctx&, \
                              const S*);
MT_MATMUL_INSTANTIATE(float)
MT_MATMUL_INSTANTIATE(bf16)
MT_MATMUL_INSTANTIATE(f16)
#undef MT_MATMUL_INSTANTIATE

}  // namespace mt::cuda
