// Causal multi-head self-attention (Vaswani et al. 2017), optionally restricted to packed documents.
// Per (batch b, head h), with Q, K, V the (T, hs) slices of qkv and s = 1/sqrt(hs):
//   forward   S = s Q K^T,  P = softmax_rows(mask(S)),  O = P V
//   backward  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = s dS K,  dK = s dS^T Q
// (the softmax Jacobian applied row by row: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)).
// mask keeps (i, j) iff j <= i and, with doc ids, doc[i] == doc[j]; P is exactly 0 elsewhere, which
// makes dS 0 there too.
//
// Work split: OpenMP over the B*NH independent (b, h) pairs; each pair runs on one thread and calls
// gemm() from inside the parallel region, where it runs on the calling thread (no nested pools; see
// gemm.cpp). With GPT-2's 48 pairs per batch that keeps every core busy without a fork and join per
// small product, which threading each per-head GEMM would cost. The per-pair products read
// Q, K, V and write dQKV in place through the row stride 3C, so nothing is copied. A pair's result
// does not depend on which thread runs it, so the output is the same for any thread count.
//
// Causality halves the work: rows are processed in blocks of kRowBlock, and a block of query rows
// only multiplies the key columns up to its last row (the entries beyond are zero in P and dS).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/check.h"

namespace mt::cpu {

namespace {

constexpr int kRowBlock = 64;

// Row i of P from row i of the scores (in place): softmax over the allowed keys, exact zeros elsewhere.
template <class T>
void softmax_row(T* row, int i, int T_, const int32_t* doc) {
  const int n = i + 1;
  if (doc) {
    const int32_t di = doc[i];
    for (int j = 0; j < n; j++) row[j] = doc[j] == di ? row[j] : T(-INFINITY);
  }
  const T m = max_lanes(row, n);  // finite: j = i is always allowed
  exp_shifted(row, row, m, n);
  if (doc) {
    const int32_t di = doc[i];
    for (int j = 0; j < n; j++) row[j] = doc[j] == di ? row[j] : T(0);
  }
  const T inv = T(1) / sum_lanes(row, n);
  for (int j = 0; j < n; j++) row[j] *= inv;
  std::fill(row + n, row + T_, T(0));
}

}  // namespace

template <class T>
void attention_fwd(T* out, T* att, const T* qkv, const int32_t* doc, int B, int T_, int C, int NH) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C = %d is not divisible by NH = %d", C, NH);
  const int hs = C / NH, ld = 3 * C;
  const T scale = T(1) / std::sqrt(T(hs));
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(B) * NH * T_ * T_ * hs))
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const T* q = qkv + int64_t(b) * T_ * ld + h * hs;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* P = att + int64_t(bh) * T_ * T_;
    T* o = out + int64_t(b) * T_ * C + h * hs;
    const int32_t* d = doc ? doc + int64_t(b) * T_ : nullptr;
    for (int i0 = 0; i0 < T_; i0 += kRowBlock) {
      const int i1 = std::min(T_, i0 + kRowBlock);
      T* Pb = P + int64_t(i0) * T_;
      gemm<T>(false, true, i1 - i0, i1, hs, scale, q + int64_t(i0) * ld, ld, k, ld, T(0), Pb, T_);
      for (int i = i0; i < i1; i++) softmax_row(P + int64_t(i) * T_, i, T_, d);
      gemm<T>(false, false, i1 - i0, hs, i1, T(1), Pb, T_, v, ld, T(0), o + int64_t(i0) * C, C);
    }
  }
}

template <class T>
void attention_bwd(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, const int32_t* doc, int B, int T_,
                   int C, int NH) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C = %d is not divisible by NH = %d", C, NH);
  (void)doc;  // the mask is already in att: P is zero wherever a token may not attend
  const int hs = C / NH, ld = 3 * C;
  const T scale = T(1) / std::sqrt(T(hs));
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(B) * NH * T_ * T_ * hs))
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const int64_t qoff = int64_t(b) * T_ * ld + h * hs;
    const T* q = qkv + qoff;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* dq = dqkv + qoff;
    T* dk = dq + C;
    T* dv = dq + 2 * C;
    const T* P = att + int64_t(bh) * T_ * T_;
    T* dS = scratch + int64_t(bh) * T_ * T_;
    const T* dO = dout + int64_t(b) * T_ * C + h * hs;
    // dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) in place; entries right of the diagonal are
    // zeroed because the block products below read them.
    for (int i0 = 0; i0 < T_; i0 += kRowBlock) {
      const int i1 = std::min(T_, i0 + kRowBlock);
      gemm<T>(false, true, i1 - i0, i1, hs, T(1), dO + int64_t(i0) * C, C, v, ld, T(0), dS + int64_t(i0) * T_, T_);
      for (int i = i0; i < i1; i++) {
        const T* p = P + int64_t(i) * T_;
        T* g = dS + int64_t(i) * T_;
        const T pg = dot_lanes(p, g, i + 1);
        for (int j = 0; j <= i; j++) g[j] = p[j] * (g[j] - pg);
        std::fill(g + i + 1, g + T_, T(0));
      }
    }
    for (int i0 = 0; i0 < T_; i0 += kRowBlock) {
      const int i1 = std::min(T_, i0 + kRowBlock);
      // dQ rows i0..i1 need dS columns 0..i1.
      gemm<T>(false, false, i1 - i0, hs, i1, scale, dS + int64_t(i0) * T_, T_, k, ld, T(0), dq + int64_t(i0) * ld, ld);
      // dK and dV rows j0..j1 (= i0..i1) need query rows j0..T: the transposed column strip of dS / P.
      const int64_t strip = int64_t(i0) * T_ + i0;
      gemm<T>(true, false, i1 - i0, hs, T_ - i0, scale, dS + strip, T_, q + int64_t(i0) * ld, ld, T(0),
              dk + int64_t(i0) * ld, ld);
      gemm<T>(true, false, i1 - i0, hs, T_ - i0, T(1), P + strip, T_, dO + int64_t(i0) * C, C, T(0),
              dv + int64_t(i0) * ld, ld);
    }
  }
}

template void attention_fwd<float>(float*, float*, const float*, const int32_t*, int, int, int, int);
template void attention_fwd<double>(double*, double*, const double*, const int32_t*, int, int, int, int);
template void attention_bwd<float>(float*, float*, const float*, const float*, const float*, const int32_t*, int, int,
                                   int, int);
template void attention_bwd<double>(double*, double*, const double*, const double*, const double*, const int32_t*, int,
                                    int, int, int);

}  // namespace mt::cpu
