// Causal multi-head self-attention (Vaswani et al. 2017), optionally restricted to packed documents.
// Per (batch b, head h), with Q, K, V the (T, hs) slices of qkv and s = 1/sqrt(hs):
//   forward   S = s Q K^T,  P = softmax_rows(mask(S)),  O = P V
//   backward  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = s dS K,  dK = s dS^T Q
// (the softmax Jacobian applied row by row: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)).
// mask keeps (i, j) iff j <= i and, with doc ids, doc[i] == doc[j]; P is exactly 0 elsewhere, which
// makes dS 0 there too. This is the materialised path (P is saved for backward); flash_attention.cpp
// is the one that keeps no T x T buffer.
//
// Storage: scores, softmax and all products run in A = acc_t<S>. P is stored in att rounded to S,
// and O is computed from the stored P, as the GPU does (probabilities written in S, then P V), then
// rounded once. The backward reads P from att and keeps dS for one block of query rows at a time in
// per-thread memory (the caller's scratch is the GPU's; the CPU does not use it). For float/double the
// products read and write the caller's buffers in place (Q, K, V, dQKV through the row stride 3C, P
// in att); for bf16/f16 each (b, h) pair's slices are loaded into fp32 scratch first and its results
// rounded on the way out, with the same fp32 code in between.
//
// Work split: OpenMP over the B*NH independent (b, h) pairs; each pair runs on one thread and calls
// gemm() from inside the parallel region, where it runs on the calling thread (no nested pools; see
// gemm.cpp). With GPT-2's 48 pairs per batch that keeps every core busy without a fork and join per
// small product, which threading each per-head GEMM would cost. A pair's result does not depend on
// which thread runs it, so the output is the same for any thread count.
//
// Causality halves the work: rows are processed in blocks (kForwardRows, kBackwardRows), and a block
// of query rows only multiplies the key columns up to its last row (the entries beyond are zero in P
// and dS).
//
// The backward runs block by block: a block's dS (kBackwardRows x T) gives its rows of dQ whole and
// adds its share to dK and dV (kBackwardRows-deep products accumulated onto them), so dS never leaves
// the cache. dK and dV therefore sum their query rows in blocks of kBackwardRows, in block order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/check.h"

namespace mt::cpu {

namespace {

// Whole micro-kernel panels (12 rows for AVX-512, 6 for AVX2, 4 portable). The diagonal blocks waste
// work beyond the causal half (at T = 256: 9% with 24 rows, 18% with 48) and smaller blocks mean
// more, smaller products. Measured on the 2-core AVX-512 machine (docs/perf.md, issue 32's fourth
// pass), 24-row blocks made the forward 2-4% faster at T = 256 and 1-3% at T = 1024, while the
// backward, whose five products per block are smaller still, was no faster at T = 256 and up to 8%
// slower at T = 1024. The forward's block size leaves its bits unchanged for finite inputs (each row
// of P is its own, and O's rows only gain or lose exact zero terms at their ends); the backward's sets
// dK and dV's summation order.
constexpr int kForwardRows = 24;
constexpr int kBackwardRows = 48;

// Row i of P from row i of the scores (in place): softmax over the allowed keys, exact zeros elsewhere.
template <class T>
void softmax_row(T* row, int i, int T_, const int32_t* doc) {
  const int n = i + 1;
  T sum;
  if (doc) {
    const int32_t di = doc[i];
    for (int j = 0; j < n; j++) row[j] = doc[j] == di ? row[j] : T(-INFINITY);
    const T m = max_row(row, n);  // finite: j = i is always allowed
    exp_shifted(row, row, m, n);
    for (int j = 0; j < n; j++) row[j] = doc[j] == di ? row[j] : T(0);
    sum = sum_lanes(row, n);
  } else {
    sum = exp_shifted_sum(row, row, max_row(row, n), n);
  }
  scale_row(row, T(1) / sum, n);
  std::fill(row + n, row + T_, T(0));
}

// Asks the L2 cache for the first n values of a row.
template <class S>
void prefetch_row(const S* row, int n) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t o = 0; o < int64_t(n) * int64_t(sizeof(S)); o += 64) __builtin_prefetch(bytes + o, 0, 2);
}

// The (T, hs) slices of one (b, h) pair as A matrices with their row strides: the caller's buffers
// for float/double, loaded copies in `buf` (3 T hs values) for bf16/f16.
template <class S>
struct PairQKV {
  const acc_t<S>*q, *k, *v;
  int ld;
  PairQKV(const S* q_s, int ld_s, int T_, int hs, int C, std::vector<acc_t<S>>& buf) {
    if constexpr (kWide<S>) {
      (void)T_;
      (void)hs;
      (void)buf;
      q = q_s;
      k = q_s + C;
      v = q_s + 2 * C;
      ld = ld_s;
    } else {
      const int64_t n = int64_t(T_) * hs;
      load_rows(buf.data(), q_s, ld_s, T_, hs);
      load_rows(buf.data() + n, q_s + C, ld_s, T_, hs);
      load_rows(buf.data() + 2 * n, q_s + 2 * C, ld_s, T_, hs);
      q = buf.data();
      k = q + n;
      v = q + 2 * n;
      ld = hs;
    }
  }
};

}  // namespace

template <class S>
void attention_fwd(S* out, S* att, const S* qkv, const int32_t* doc, int B, int T_, int C, int NH) {
  using A = acc_t<S>;
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C = %d is not divisible by NH = %d", C, NH);
  const int hs = C / NH, ld = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
#pragma omp parallel if (parallel_worth(int64_t(B) * NH * T_ * T_ * hs))
  {
    // bf16/f16 scratch: Q, K, V of the pair, one row block of P and of O.
    const size_t narrow = kWide<S> ? 0 : 1;
    std::vector<A> qkv_buf(narrow * 3 * size_t(T_) * size_t(hs));
    std::vector<A> p_buf(narrow * size_t(kForwardRows) * size_t(T_)),
        o_buf(narrow * size_t(kForwardRows) * size_t(hs));
    PackedB<A> kt, vn;  // K^T (hs x T) and V (T x hs), packed once per pair
    GemmScratch<A> ws;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const PairQKV<S> in(qkv + int64_t(b) * T_ * ld + h * hs, ld, T_, hs, C, qkv_buf);
      S* P = att + int64_t(bh) * T_ * T_;
      S* o = out + int64_t(b) * T_ * C + h * hs;
      const int32_t* d = doc ? doc + int64_t(b) * T_ : nullptr;
      kt.pack(true, in.k, in.ld, hs, T_);
      vn.pack(false, in.v, in.ld, T_, hs);
      for (int i0 = 0; i0 < T_; i0 += kForwardRows) {
        const int i1 = std::min(T_, i0 + kForwardRows);
        A* Pb;
        A* ob;
        int ldo;
        if constexpr (kWide<S>) {
          Pb = P + int64_t(i0) * T_;
          ob = o + int64_t(i0) * C;
          ldo = C;
        } else {
          Pb = p_buf.data();
          ob = o_buf.data();
          ldo = hs;
        }
        gemm_prepacked<A>(false, i1 - i0, i1, hs, scale, in.q + int64_t(i0) * in.ld, in.ld, kt, 0, A(0), Pb, T_, ws);
        for (int i = i0; i < i1; i++) softmax_row(Pb + int64_t(i - i0) * T_, i, T_, d);
        if constexpr (!kWide<S>) {
          // P is stored rounded, and O is computed from P as stored.
          for (int64_t e = 0; e < int64_t(i1 - i0) * T_; e++) {
            const S p = store_as<S>(Pb[e]);
            P[int64_t(i0) * T_ + e] = p;
            Pb[e] = load(p);
          }
        }
        gemm_prepacked<A>(false, i1 - i0, hs, i1, A(1), Pb, T_, vn, 0, A(0), ob, ldo, ws);
        if constexpr (!kWide<S>) store_rows(o + int64_t(i0) * C, C, ob, i1 - i0, hs);
      }
    }
  }
}

template <class S>
void attention_bwd(S* dqkv, acc_t<S>* scratch, const S* dout, const S* qkv, const S* att, const int32_t* doc, int B,
                   int T_, int C, int NH) {
  using A = acc_t<S>;
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C = %d is not divisible by NH = %d", C, NH);
  (void)doc;      // the mask is already in att: P is zero wherever a token may not attend
  (void)scratch;  // dS lives one row block at a time in per-thread memory (see below)
  const int hs = C / NH, ld = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
#pragma omp parallel if (parallel_worth(int64_t(B) * NH * T_ * T_ * hs))
  {
    // dS of one row block (kBackwardRows x T), kept in cache: the block's dQ rows and its share of dK and
    // dV are taken from it before the next block overwrites it. A whole pair's dS (T x T, 4 MiB at
    // T = 1024) written out and read back twice made the backward wait on memory.
    const size_t narrow = kWide<S> ? 0 : 1, th = size_t(T_) * size_t(hs);
    std::vector<A> ds_buf(size_t(kBackwardRows) * size_t(T_));
    // bf16/f16 scratch: Q, K, V, dO and dQ, dK, dV of the pair (T hs each), one row block of P.
    std::vector<A> qkv_buf(narrow * 3 * th), do_buf(narrow * th), dqkv_buf(narrow * 3 * th);
    std::vector<A> p_buf(narrow * size_t(kBackwardRows) * size_t(T_));
    PackedB<A> vt, kn, qn, don;  // V^T (hs x T); K, Q and dO (T x hs): packed once per pair
    GemmScratch<A> ws;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const int64_t qoff = int64_t(b) * T_ * ld + h * hs;
      const PairQKV<S> in(qkv + qoff, ld, T_, hs, C, qkv_buf);
      const int64_t ooff = int64_t(b) * T_ * C + h * hs;
      const S* P_s = att + int64_t(bh) * T_ * T_;
      const A* dO;
      A *dq, *dk, *dv;
      int ldo, ldd;
      if constexpr (kWide<S>) {
        dO = dout + ooff;
        ldo = C;
        dq = dqkv + qoff;
        dk = dq + C;
        dv = dq + 2 * C;
        ldd = ld;
      } else {
        load_rows(do_buf.data(), dout + ooff, C, T_, hs);
        dO = do_buf.data();
        ldo = hs;
        dq = dqkv_buf.data();
        dk = dq + th;
        dv = dq + 2 * th;
        ldd = hs;
      }
      vt.pack(true, in.v, in.ld, hs, T_);
      kn.pack(false, in.k, in.ld, T_, hs);
      qn.pack(false, in.q, in.ld, T_, hs);
      don.pack(false, dO, ldo, T_, hs);
      A* dS = ds_buf.data();
      for (int i0 = 0; i0 < T_; i0 += kBackwardRows) {
        const int i1 = std::min(T_, i0 + kBackwardRows), rows = i1 - i0;
        // Query rows i0..i1 see key columns 0..i1 (P and dS are zero beyond the diagonal).
        const A* P;
        if constexpr (kWide<S>) {
          P = P_s + int64_t(i0) * T_;
        } else {
          for (int r = 0; r < rows; r++) load_n(p_buf.data() + int64_t(r) * T_, P_s + int64_t(i0 + r) * T_, i1);
          P = p_buf.data();
        }
        // dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) in place; the entries right of the
        // diagonal up to column i1 are zeroed because the products below read them.
        gemm_prepacked<A>(false, rows, i1, hs, A(1), dO + int64_t(i0) * ldo, ldo, vt, 0, A(0), dS, T_, ws);
        // Each row also asks for one row of the next block's P (columns up to that block's end): P
        // comes from memory, and its rows were otherwise first touched by this loop, which then
        // waited on every line.
        const int next_end = std::min(T_, i1 + kBackwardRows);
        for (int r = 0; r < rows; r++) {
          const int i = i0 + r;
          const A* p = P + int64_t(r) * T_;
          A* g = dS + int64_t(r) * T_;
          softmax_grad_row(g, p, dot_row(p, g, i + 1), i + 1, i1);
          if (i1 + r < next_end) prefetch_row(P_s + int64_t(i1 + r) * T_, next_end);
        }
        // dQ[i0..i1] = s dS K[0..i1];  dK[0..i1] += s dS^T Q[i0..i1];  dV[0..i1] += P^T dO[i0..i1].
        gemm_prepacked<A>(false, rows, hs, i1, scale, dS, T_, kn, 0, A(0), dq + int64_t(i0) * ldd, ldd, ws);
        // dK and dV gather over the blocks of query rows: rows 0..i0 add this block's share to what
        // earlier blocks left; rows i0..i1 get their first share here (beta = 0: no zeroing pass).
        gemm_prepacked<A>(true, i0, hs, rows, scale, dS, T_, qn, i0, A(1), dk, ldd, ws);
        gemm_prepacked<A>(true, rows, hs, rows, scale, dS + i0, T_, qn, i0, A(0), dk + int64_t(i0) * ldd, ldd, ws);
        gemm_prepacked<A>(true, i0, hs, rows, A(1), P, T_, don, i0, A(1), dv, ldd, ws);
        gemm_prepacked<A>(true, rows, hs, rows, A(1), P + i0, T_, don, i0, A(0), dv + int64_t(i0) * ldd, ldd, ws);
      }
      if constexpr (!kWide<S>) {
        S* dst = dqkv + qoff;
        store_rows(dst, ld, dq, T_, hs);
        store_rows(dst + C, ld, dk, T_, hs);
        store_rows(dst + 2 * C, ld, dv, T_, hs);
      }
    }
  }
}

#define MT_ATTENTION_INSTANTIATE(S)                                                                             \
  template void attention_fwd<S>(S*, S*, const S*, const int32_t*, int, int, int, int);                         \
  template void attention_bwd<S>(S*, acc_t<S>*, const S*, const S*, const S*, const int32_t*, int, int, int, int);
MT_ATTENTION_INSTANTIATE(float)
MT_ATTENTION_INSTANTIATE(double)
MT_ATTENTION_INSTANTIATE(bf16)
MT_ATTENTION_INSTANTIATE(f16)
#undef MT_ATTENTION_INSTANTIATE

}  // namespace mt::cpu
