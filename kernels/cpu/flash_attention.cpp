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
// Measured on a 2-core Zen 4 (2 threads; docs/perf.md, issue 32's eighth pass), B=4 T=256: forward
// 64-66 -> 75 GFLOP/s, backward 72 -> 83-84; B=2 T=1024: forward 74-76 -> 88-89, backward 86-91 ->
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
    // max and sum of each query row; K^T by key tile and V whole come packed (flash_tile.h).
    std::vector<A> Q(size_t(kBr) * hs), buf(flash::load_buffer_size<S, A>(size_t(T_) * hs)), P(size_t(kBr) * kBc),
        O(size_t(kBr) * hs), m(kBr), l(kBr);
    flash::HeadOperand<A> kt(T_), vn(T_);
    GemmScratch<A> ws;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const S* base = qkv + int64_t(b) * T_ * ld + h * hs;
      S* o = out + int64_t(b) * T_ * C + h * hs;
      const int32_t* d = doc ? doc + int64_t(b) * T_ : nullptr;
      kt.reset();
      vn.reset();
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
          gemm_prepacked<A>(false, br, bc, hs, scale, Q.data(), hs, kt.tile_t(base + C, ld, j0, hs, buf), 0, A(0),
                            P.data(), kBc, ws);
          flash::forward_tile(P.data(), vn.whole(base + 2 * C, ld, T_, hs, buf), j0, br, bc, hs, m.data(), l.data(),
                              O.data(), ws, [&](int r, int c) { return allowed(i0 + r, j0 + c, d); });
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
    // A head's Q and dO in A (T x hs each: the query tiles' operands), the key block's dK/dV
    // accumulators, the pair's dQ accumulator, one tile pair's P and dS, and row buffers for D; the
    // products' B operands come packed (flash_tile.h).
    const size_t th = size_t(T_) * size_t(hs);
    std::vector<A> Q(th), dO(th), buf(flash::load_buffer_size<S, A>(th)), dK(size_t(kBc) * hs), dV(size_t(kBc) * hs),
        P(size_t(kBr) * kBc), dS(size_t(kBr) * kBc), dQ(th), row_do(static_cast<size_t>(hs)),
        row_o(static_cast<size_t>(hs));
    flash::BackwardOperands<A> ops(T_, T_);
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
      load_rows(dO.data(), go, C, T_, hs);
      ops.reset();
      std::fill(dQ.begin(), dQ.end(), A(0));
      for (int j0 = 0; j0 < T_; j0 += kBc) {
        const int bc = std::min(kBc, T_ - j0);
        std::fill(dK.begin(), dK.end(), A(0));
        std::fill(dV.begin(), dV.end(), A(0));
        // Causal: query blocks that end before the key block starts see none of it.
        for (int i0 = j0 / kBr * kBr; i0 < T_; i0 += kBr) {
          const int br = std::min(kBr, T_ - i0);
          gemm_prepacked<A>(false, br, bc, hs, scale, Q.data() + size_t(i0) * hs, hs,
                            ops.kt.tile_t(base + C, ld, j0, hs, buf), 0, A(0), P.data(), kBc, ws);
          flash::backward_tile(P.data(), dS.data(), dO.data() + size_t(i0) * hs, i0, j0,
                               ops.vt.tile_t(base + 2 * C, ld, j0, hs, buf), ops.k.whole(base + C, ld, T_, hs, buf),
                               ops.q.whole(Q.data(), hs, T_, hs, buf), ops.dout.whole(dO.data(), hs, T_, hs, buf),
                               L + i0, D + i0, br, bc, hs, scale, dQ.data() + size_t(i0) * hs, hs, dK.data(), dV.data(),
                               hs, ws, [&](int r, int c) { return allowed(i0 + r, j0 + c, d); });
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
