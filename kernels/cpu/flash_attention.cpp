// Flash attention (Dao et al. 2022; the loop order of FlashAttention-2, Dao 2023): the same causal,
// doc-masked attention as attention.cpp without the T x T probability matrix. This file is the
// algorithmic reference for the CUDA kernel, so it is written in the kernel's tiles: a query block of
// kBr rows meets key/value blocks of kBc rows, and everything a tile needs is loaded into A (fp32)
// tile buffers first, as a thread block loads shared memory.
//
// Forward, per query block (one CUDA thread block per (b, h, query block)), with s = 1/sqrt(hs):
//   m = -inf, l = 0, O = 0 for each row i of the block;
//   for each key block j that is not entirely above the diagonal:
//     S_ij = s Q_i K_j^T, masked entries -inf;
//     m' = max(m, rowmax S_ij),  P = exp(S_ij - m'),  l = exp(m - m') l + rowsum P,
//     O = exp(m - m') O + P V_j,  m = m';
//   out_i = O / l (rounded once to S),  lse_i = m + log l.
// Every query attends at least to itself (the diagonal block is always visited), so l > 0 at the
// end; with doc ids a row can find every key of an earlier block masked (its document starts after
// that block), in which case m stays -inf and the block adds nothing.
//
// Backward (FlashAttention-2, Algorithm 2), with D_i = rowsum(dO_i * O_i) precomputed per query
// (= rowsum(P_i * dP_i), since O_i = P_i V) and P recomputed from lse, never stored:
//   for each key block j (one CUDA thread block per (b, h, key block); dK_j, dV_j stay in registers):
//     for each query block i at or below the diagonal:
//       P = exp(s Q_i K_j^T - lse_i) (0 where masked),  dV_j += P^T dO_i,  dP = dO_i V_j^T,
//       dS = P * (dP - D_i),  dQ_i += s dS K_j,  dK_j += s dS^T Q_i.
// dQ, dK and dV accumulate in A and are written, rounded, once. FlashAttention-2 adds dQ_i with
// atomics; here dQ is a per-(b, h) accumulator summed in key-block order (a deterministic GPU kernel
// gets that order from a separate dQ pass: one thread block per query block, looping over key blocks).
//
// Storage: inputs are loaded from S, and every intermediate (S_ij, P, dP, dS, the accumulators)
// stays in A; only out and dqkv are rounded. Unlike the materialised path, P is never stored in S,
// so for bf16/f16 the two paths differ by about one rounding of P (u relative); a tensor-core kernel
// that rounds P or dS to 16 bits for its products differs from this reference by about as much.
//
// Work split: OpenMP over the B*NH (b, h) pairs, one pair per thread, tile GEMMs on the calling
// thread (see attention.cpp); the result does not depend on the thread count. A pair's operands are
// loaded and packed once (gemm_prepacked, whose bits are gemm's for the same operands), not once per
// tile pair: the GPU's thread blocks each load their own tiles, the CPU's one thread per pair need not.
// Measured on a 2-core Zen 4 (2 threads; docs/perf.md, issue 32's eighth pass), B=4 T=256: backward
// 70-71 -> 81-82 GFLOP/s, forward 64-65 -> 64-72; B=2 T=1024: forward 74-76 -> 88-89, backward 86-91 ->
// 107-108. fp32 keeps its bits (gemm() ran the same built-in kernel); fp64, which gemm() hands to
// OpenBLAS, now runs the built-in kernel like the materialized path's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/flash_tile.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/check.h"

namespace mt::cpu {

namespace {

using flash::kBc;
using flash::kBr;

// May query i see key j?
inline bool allowed(int i, int j, const int32_t* doc) { return j <= i && (!doc || doc[i] == doc[j]); }

}  // namespace

template <class S>
void flash_attention_fwd(S* out, acc_t<S>* lse, const S* qkv, const int32_t* doc, int B, int T_, int C, int NH) {
  using A = acc_t<S>;
  MT_CHECK(NH > 0 && C % NH == 0, "flash attention: C = %d is not divisible by NH = %d", C, NH);
  const int hs = C / NH, ld = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
  const A neg_inf = A(-INFINITY);
#pragma omp parallel if (parallel_worth(int64_t(B) * NH * T_ * T_ * hs))
  {
    // A thread block's working set: the Q tile, the score tile, the output accumulator and the running
    // max and sum of each query row; K and V come as the products' packed operands (below).
    std::vector<A> Q(size_t(kBr) * hs), KV(size_t(T_) * hs), P(size_t(kBr) * kBc), O(size_t(kBr) * hs), m(kBr),
        l(kBr);
    // A head's K^T, one packed operand per key tile, and its V, packed once for every tile's P V (a key
    // tile's rows are a window of it). Packed per (b, h) pair instead of per tile pair: the same values
    // in the same products, loaded once instead of once per query block.
    std::vector<PackedB<A>> kt(size_t((T_ + kBc - 1) / kBc));
    PackedB<A> vn;
    GemmScratch<A> ws;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const S* base = qkv + int64_t(b) * T_ * ld + h * hs;
      S* o = out + int64_t(b) * T_ * C + h * hs;
      const int32_t* d = doc ? doc + int64_t(b) * T_ : nullptr;
      for (int j0 = 0; j0 < T_; j0 += kBc) {
        load_rows(KV.data(), base + int64_t(j0) * ld + C, ld, std::min(kBc, T_ - j0), hs);
        kt[size_t(j0 / kBc)].pack(true, KV.data(), hs, hs, std::min(kBc, T_ - j0));
      }
      load_rows(KV.data(), base + 2 * C, ld, T_, hs);
      vn.pack(false, KV.data(), hs, T_, hs);
      // The query blocks of a pair: on the GPU, one thread block each, all at once.
      for (int i0 = 0; i0 < T_; i0 += kBr) {
        const int br = std::min(kBr, T_ - i0), i1 = i0 + br;
        load_rows(Q.data(), base + int64_t(i0) * ld, ld, br, hs);
        std::fill(m.begin(), m.end(), neg_inf);
        std::fill(l.begin(), l.end(), A(0));
        std::fill(O.begin(), O.end(), A(0));
        // Causal: key blocks starting beyond the last query row are skipped, and keys past it in the
        // diagonal block are not loaded.
        for (int j0 = 0; j0 < i1; j0 += kBc) {
          const int bc = std::min(kBc, i1 - j0);
          gemm_prepacked<A>(false, br, bc, hs, scale, Q.data(), hs, kt[size_t(j0 / kBc)], 0, A(0), P.data(), kBc, ws);
          flash::online_softmax_tile(P.data(), br, bc, hs, m.data(), l.data(), O.data(),
                                     [&](int r, int c) { return allowed(i0 + r, j0 + c, d); });
          gemm_prepacked<A>(false, br, hs, bc, A(1), P.data(), kBc, vn, j0, A(1), O.data(), hs, ws);
        }
        for (int r = 0; r < br; r++) {
          const A inv = A(1) / l[size_t(r)];
          const A* orow = O.data() + size_t(r) * hs;
          S* dst = o + int64_t(i0 + r) * C;
          for (int c = 0; c < hs; c++) dst[c] = store_as<S>(orow[c] * inv);
          lse[int64_t(bh) * T_ + i0 + r] = m[size_t(r)] + std::log(l[size_t(r)]);
        }
      }
    }
  }
}

template <class S>
void flash_attention_bwd(S* dqkv, acc_t<S>* scratch, const S* dout, const S* qkv, const S* out,
                         const acc_t<S>* lse, const int32_t* doc, int B, int T_, int C, int NH) {
  using A = acc_t<S>;
  MT_CHECK(NH > 0 && C % NH == 0, "flash attention: C = %d is not divisible by NH = %d", C, NH);
  const int hs = C / NH, ld = 3 * C;
  const A scale = A(1) / std::sqrt(A(hs));
#pragma omp parallel if (parallel_worth(int64_t(B) * NH * T_ * T_ * hs))
  {
    // A head's Q, dO, K and V in A (T x hs each), the key block's dK/dV accumulators, the pair's dQ
    // accumulator, one tile pair's P and dS, and row buffers for D.
    const size_t th = size_t(T_) * size_t(hs);
    std::vector<A> Q(th), dO(th), K(th), V(th), dK(size_t(kBc) * hs), dV(size_t(kBc) * hs), P(size_t(kBr) * kBc),
        dS(size_t(kBr) * kBc), dQ(th), row_do(static_cast<size_t>(hs)), row_o(static_cast<size_t>(hs));
    // The products' B operands, packed once per pair: K^T and V^T one key tile each, and K, Q and dO
    // whole (a tile's rows are a window of them).
    const size_t tiles = size_t((T_ + kBc - 1) / kBc);
    std::vector<PackedB<A>> kt(tiles), vt(tiles);
    PackedB<A> kn, qn, don;
    GemmScratch<A> ws;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const int64_t qoff = int64_t(b) * T_ * ld + h * hs, ooff = int64_t(b) * T_ * C + h * hs;
      const S* base = qkv + qoff;
      const S* go = dout + ooff;
      const int32_t* d = doc ? doc + int64_t(b) * T_ : nullptr;
      const A* L = lse + int64_t(bh) * T_;
      // D_i = rowsum(dO_i * O_i), from the output as stored (FlashAttention-2's preprocessing pass).
      A* D = scratch + int64_t(bh) * T_;
      for (int i = 0; i < T_; i++) {
        load_n(row_do.data(), go + int64_t(i) * C, hs);
        load_n(row_o.data(), out + ooff + int64_t(i) * C, hs);
        D[i] = dot_lanes(row_do.data(), row_o.data(), hs);
      }
      load_rows(Q.data(), base, ld, T_, hs);
      load_rows(K.data(), base + C, ld, T_, hs);
      load_rows(V.data(), base + 2 * C, ld, T_, hs);
      load_rows(dO.data(), go, C, T_, hs);
      for (int j0 = 0; j0 < T_; j0 += kBc) {
        const int bc = std::min(kBc, T_ - j0);
        kt[size_t(j0 / kBc)].pack(true, K.data() + size_t(j0) * hs, hs, hs, bc);
        vt[size_t(j0 / kBc)].pack(true, V.data() + size_t(j0) * hs, hs, hs, bc);
      }
      kn.pack(false, K.data(), hs, T_, hs);
      qn.pack(false, Q.data(), hs, T_, hs);
      don.pack(false, dO.data(), hs, T_, hs);
      std::fill(dQ.begin(), dQ.end(), A(0));
      for (int j0 = 0; j0 < T_; j0 += kBc) {
        const int bc = std::min(kBc, T_ - j0);
        std::fill(dK.begin(), dK.end(), A(0));
        std::fill(dV.begin(), dV.end(), A(0));
        // Causal: query blocks that end before the key block starts see none of it.
        for (int i0 = j0 / kBr * kBr; i0 < T_; i0 += kBr) {
          const int br = std::min(kBr, T_ - i0);
          const A* Qi = Q.data() + size_t(i0) * hs;
          const A* dOi = dO.data() + size_t(i0) * hs;
          gemm_prepacked<A>(false, br, bc, hs, scale, Qi, hs, kt[size_t(j0 / kBc)], 0, A(0), P.data(), kBc, ws);
          flash::backward_probs(P.data(), L + i0, br, bc, [&](int r, int c) { return allowed(i0 + r, j0 + c, d); });
          gemm_prepacked<A>(true, bc, hs, br, A(1), P.data(), kBc, don, i0, A(1), dV.data(), hs, ws);
          gemm_prepacked<A>(false, br, bc, hs, A(1), dOi, hs, vt[size_t(j0 / kBc)], 0, A(0), dS.data(), kBc, ws);
          flash::backward_ds(P.data(), dS.data(), D + i0, br, bc);
          gemm_prepacked<A>(false, br, hs, bc, scale, dS.data(), kBc, kn, j0, A(1), dQ.data() + size_t(i0) * hs, hs,
                            ws);
          gemm_prepacked<A>(true, bc, hs, br, scale, dS.data(), kBc, qn, i0, A(1), dK.data(), hs, ws);
        }
        S* dst = dqkv + qoff + int64_t(j0) * ld;
        store_rows(dst + C, ld, dK.data(), bc, hs);
        store_rows(dst + 2 * C, ld, dV.data(), bc, hs);
      }
      store_rows(dqkv + qoff, ld, dQ.data(), T_, hs);
    }
  }
}

#define MT_FLASH_INSTANTIATE(S)                                                                               \
  template void flash_attention_fwd<S>(S*, acc_t<S>*, const S*, const int32_t*, int, int, int, int);          \
  template void flash_attention_bwd<S>(S*, acc_t<S>*, const S*, const S*, const S*, const acc_t<S>*,          \
                                       const int32_t*, int, int, int, int);
MT_FLASH_INSTANTIATE(float)
MT_FLASH_INSTANTIATE(double)
MT_FLASH_INSTANTIATE(bf16)
MT_FLASH_INSTANTIATE(f16)
#undef MT_FLASH_INSTANTIATE

}  // namespace mt::cpu
