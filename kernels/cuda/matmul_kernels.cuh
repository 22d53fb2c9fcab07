// The GEMM descriptors and the bias-gradient kernel of the linear layers (see matmul.cu), in a header so
// that the same source builds twice: by nvcc for the GPU, and by the host compiler against the warp
// emulator (warp_emulation.h), on which tests/test_emu_gemm.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/column_sum_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/storage.cuh"
#include "runtime/dtype.h"

namespace mt::cuda::matmul_kernels {

// ---- the GEMMs, as the descriptors matmul.cu hands to gemm() (gemm.cuh) ----
// (The emulator tests run the same descriptors through gemm()'s SIMT fallback kernel.)

// out (OC x N) = weight^T-view inp (+ bias; GELU epilogue, pre-activation into pre_gelu, when given;
// + residual, as the GEMM's C with beta = 1, when given).
template <class S>
Gemm fwd_gemm(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, S* pre_gelu,
              const S* residual = nullptr) {
  Gemm g;
  g.m = OC, g.n = N, g.k = IC;
  g.ab_type = g.d_type = dtype_of<S>();
  g.trans_a = true, g.a = weight, g.lda = IC;
  g.b = inp, g.ldb = IC;
  g.d = out, g.ldd = OC;
  g.bias = bias;
  if (pre_gelu) g.epilogue = Epilogue::gelu, g.aux = pre_gelu;
  if (residual) g.c = residual, g.beta = 1.f;
  return g;
}

// dweight (IC x OC, fp32) += inp dout^T (= with assign: the old contents are not read).
template <class S>
Gemm dweight_gemm(float* dweight, const S* dout, const S* inp, int N, int IC, int OC, bool assign = false) {
  Gemm g;
  g.m = IC, g.n = OC, g.k = N;
  g.ab_type = dtype_of<S>(), g.d_type = DType::f32;
  g.a = inp, g.lda = IC;
  g.trans_b = true, g.b = dout, g.ldb = OC;
  g.d = dweight, g.ldd = IC;
  g.beta = assign ? 0.f : 1.f;  // parameter gradients accumulate
  return g;
}

// dinp (IC x N) = weight dout (DGELU epilogue with the previous layer's pre_gelu, when given).
template <class S>
Gemm dinp_gemm(S* dinp, const S* dout, const S* weight, int N, int IC, int OC, const S* pre_gelu) {
  Gemm g;
  g.m = IC, g.n = N, g.k = OC;
  g.ab_type = g.d_type = dtype_of<S>();
  g.a = weight, g.lda = IC;
  g.b = dout, g.ldb = OC;
  g.d = dinp, g.ldd = IC;
  // The epilogue only reads pre_gelu; the GEMM descriptor takes a non-const pointer for both uses.
  if (pre_gelu) g.epilogue = Epilogue::dgelu, g.aux = const_cast<S*>(pre_gelu);
  return g;
}

// ---- the bias gradient ----

// dbias[c] += sum_r x[r, c] over a row-major (R, C) matrix: the one term of a two-pass column sum
// (column_sum_kernels.cuh).
template <class D>
struct BiasGradTerm {
  const D* x;
  __device__ void operator()(int /*r*/, int /*c*/, int64_t i, float (&v)[1]) const { v[0] = load(x[i]); }
};

}  // namespace mt::cuda::matmul_kernels
