// Column-major GEMM through cuBLASLt, the one entry point the matmul and attention kernels use.
//
// D = alpha op(A) op(B) + beta D (+ bias broadcast over columns), op(A) m x k, op(B) k x n, D m x n,
// for `batch` matrices spaced by the given element strides. fp32 storage and CUBLAS_COMPUTE_32F
// accumulation: TF32 stays off, so results differ from the CPU backend only by summation order.
// Row-major callers swap operands: a row-major (r x c) matrix is a column-major (c x r) one.
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace mt::cuda {

struct Gemm {
  int m = 0, n = 0, k = 0;
  int batch = 1;
  bool trans_a = false, trans_b = false;
  const float* a = nullptr;
  int lda = 0;
  int64_t stride_a = 0;
  const float* b = nullptr;
  int ldb = 0;
  int64_t stride_b = 0;
  float* d = nullptr;
  int ldd = 0;
  int64_t stride_d = 0;
  float alpha = 1.f, beta = 0.f;
  const float* bias = nullptr;  // length m, added to every column of D (batch == 1 only)
};

void gemm(const Gemm& g, const ops::Ctx& ctx);

}  // namespace mt::cuda
