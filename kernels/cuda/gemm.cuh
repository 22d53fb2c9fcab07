// Column-major GEMM through cuBLASLt, the one entry point the matmul and attention kernels use.
//
// D = alpha op(A) op(B) + beta D, then an optional epilogue, op(A) m x k, op(B) k x n, D m x n, for
// `batch` matrices spaced by the given element strides. Each operand has its own element type: A and
// B share one (f32, bf16 or f16), D is either that type or f32 (bf16/f16 products accumulated into an
// fp32 parameter gradient). Accumulation is always CUBLAS_COMPUTE_32F with fp32 scale: TF32 stays off
// for f32 operands, and 16-bit operands are multiplied exactly and summed in fp32, so results differ
// from the CPU backend only by summation order and by the one rounding on store.
// Row-major callers swap operands: a row-major (r x c) matrix is a column-major (c x r) one.
//
// Epilogues (applied in fp32 before the single rounding to D's type, as cuBLASLt does):
//   bias     D[:, j] += bias            (bias has D's type, length m; batch == 1)
//   gelu     aux = x + bias, D = gelu(x + bias), x the product; aux has D's type and layout (ld = ldd)
//   dgelu    D = gelu'(aux) * x         (aux input: the pre-activation, D's type and layout)
// With beta != 0 the product is x = alpha op(A) op(B) + beta C, C being D's old contents or, when c is
// given, a separate matrix of D's type and layout (a residual added in the same pass: cuBLASLt's
// out-of-place C). The bias epilogue may take beta != 0; gelu and dgelu take beta == 0.
// When cuBLASLt offers no algorithm with the fused epilogue (shape, alignment, an aux leading
// dimension that is not a multiple of 8), the product goes to an fp32 temporary and a small kernel
// applies the same epilogue, rounding once: the results have the same meaning either way.
#pragma once
#include <cstdint>

#include "kernels/ops.h"
#include "runtime/dtype.h"

namespace mt::cuda {

enum class Epilogue { none, gelu, dgelu };

struct Gemm {
  int m = 0, n = 0, k = 0;
  int batch = 1;
  bool trans_a = false, trans_b = false;
  DType ab_type = DType::f32;  // element type of A and B
  const void* a = nullptr;
  int lda = 0;
  int64_t stride_a = 0;
  const void* b = nullptr;
  int ldb = 0;
  int64_t stride_b = 0;
  DType d_type = DType::f32;  // ab_type or f32
  void* d = nullptr;
  int ldd = 0;
  int64_t stride_d = 0;
  float alpha = 1.f, beta = 0.f;
  const void* c = nullptr;  // read when beta != 0 instead of D's old contents; D's type and layout (batch == 1)
  const void* bias = nullptr;  // length m, type d_type, added to every column (batch == 1)
  Epilogue epilogue = Epilogue::none;
  void* aux = nullptr;  // gelu: written (the pre-activation); dgelu: read. Type d_type, ld = ldd.
};

// Each configuration (types, shape, leading dimensions, strides, transposes, epilogue, operand
// alignments) asks cuBLASLt's heuristic once per process and device; later calls reuse its plan.
void gemm(const Gemm& g, const ops::Ctx& ctx);

// Forgets every cached plan, so the next call of each configuration asks the heuristic again: for
// tests that change what the library offers.
void clear_gemm_plans();

}  // namespace mt::cuda
