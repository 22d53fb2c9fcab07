// The fallback kernels of the GEMM helper (see gemm.cu) and their launch shapes, in a header so that the
// same source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_gemm.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::gemm_kernels {

// The last resort when cuBLASLt offers no algorithm at all (e.g. 16-bit operands only 2-byte aligned,
// as attention's per-head views of qkv are for odd head sizes): one thread per element of D, an fp32
// dot product in k order. Slow, but it gives the meaning of the call for any alignment.
template <class AB, class D>
__global__ void simple_gemm_kernel(D* d, int ldd, int64_t stride_d, float beta, const AB* a, int lda, int64_t stride_a,
                                   bool trans_a, const AB* b, int ldb, int64_t stride_b, bool trans_b, float alpha,
                                   int m, int n, int k, int batch) {
  const int64_t total = int64_t(m) * n * batch;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t mn = int64_t(m) * n;
    const int64_t p = idx / mn;
    const int64_t rest = idx - p * mn;
    const int64_t j = rest / m;
    const int64_t i = rest - j * m;
    const AB* ap = a + p * stride_a;
    const AB* bp = b + p * stride_b;
    float acc = 0.f;
    for (int64_t kk = 0; kk < k; kk++) {
      const float x = load(trans_a ? ap[i * lda + kk] : ap[kk * lda + i]);  // op(A)[i, kk]
      const float y = load(trans_b ? bp[kk * ldb + j] : bp[j * ldb + kk]);  // op(B)[kk, j]
      acc += x * y;
    }
    D* out = d + p * stride_d + j * ldd + i;
    *out = store_as<D>(beta == 0.f ? alpha * acc : alpha * acc + beta * load(*out));
  }
}

// The unfused epilogue: x (m x n, column-major, ld m, fp32) is the product; adds beta C, then the bias,
// in cuBLASLt's order (C may be D itself: each element is read before it is written, by the same
// thread); writes D (and aux for gelu) with one rounding per stored value, exactly what the fused
// epilogue means.
template <class D>
__global__ void epilogue_kernel(D* d, int ldd, const float* x, const D* bias, const D* c, float beta, D* aux,
                                Epilogue kind, int m, int n) {
  const int64_t total = int64_t(m) * n;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx / m;
    const int i = int(idx - j * m);
    const int64_t at = j * ldd + i;
    float v = x[idx];  // cuBLASLt's order: (product + beta C) + bias, then the activation
    if (beta != 0.f) v += beta * load(c[at]);
    if (bias) v += load(bias[i]);
    if (kind == Epilogue::gelu) {
      aux[at] = store_as<D>(v);
      d[at] = store_as<D>(gelu(v));
    } else if (kind == Epilogue::dgelu) {
      d[at] = store_as<D>(gelu_grad(load(aux[at])) * v);
    } else {
      d[at] = store_as<D>(v);
    }
  }
}

// Both kernels: a grid-stride loop over the m n (times batch) elements of D.
inline LaunchShape simple_gemm_shape(int m, int n, int batch) {
  return {dim3(grid_for(int64_t(m) * n * batch)), dim3(kBlock)};
}
inline LaunchShape epilogue_shape(int m, int n) { return {dim3(grid_for(int64_t(m) * n)), dim3(kBlock)}; }

}  // namespace mt::cuda::gemm_kernels
