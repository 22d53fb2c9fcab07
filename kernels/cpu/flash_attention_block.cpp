// Flash attention of one query block against one key/value block: the kernel of ring attention
// (parallel/ring_attention.h), where a rank's queries meet, one step of the ring at a time, key/value
// blocks that other ranks hold. flash_attention.cpp assumes one whole sequence (key j visible to query
// i iff j <= i, so every query sees at least itself); here a block's rows carry their own global
// positions and document ids, so the visibility rule is
//     key j visible to query i  iff  k_pos[j] <= q_pos[i]  and  (no doc ids or q_doc[i] == k_doc[j])
// and a query may see no key of the block at all: its output is 0 and its log-sum-exp -inf, never NaN.
//
// The loops are flash_attention.cpp's (FlashAttention-2 order, kBr x kBc tiles, online softmax in A,
// the products' operands packed once per (b, h) pair: flash_tile.h), with two changes. A tile pair is
// skipped when the tiles' position ranges or document ranges make every pair invisible (tile_hidden;
// packed rows, whose document ids rise along the sequence, are where the document test skips whole
// tiles, e.g. a key block of a document that ended earlier). And the
// forward writes its output unrounded in A, normalised by the block's own sum, with that lse:
//     out_blk = sum_j exp(s_ij - lse_blk) v_j,   lse_blk = log sum_j exp(s_ij)   (visible j only),
// so that partial results merge exactly (attention_merge): with L = log(e^lse1 + e^lse2),
//     out = e^(lse1 - L) out1 + e^(lse2 - L) out2.
//
// Backward (FlashAttention-2, Algorithm 2) for one block pair, given the FINAL lse and
// D = rowsum(dO * O) of the merged output (attention_delta): P = exp(s q k^T - lse) is then each
// pair's share of the whole softmax, and
//     dv += P^T dO,  dP = dO v^T,  dS = P (dP - D),  dq += s dS k,  dk += s dS^T q,
// accumulated (+=) in A into dq (B,Tq,C) and dk, dv (rows of stride lddkv), so that a rank sums
// every block's contribution before anything is rounded. OpenMP over (b, h) pairs: a thread writes
// only its pair's columns and rows, so there are no races and the result does not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <unordered_map>
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

// The range of positions and (per batch row) of document ids of a tile of rows.
struct TileRange {
  int32_t pos_lo, pos_hi, doc_lo, doc_hi;
};

TileRange tile_range(const int32_t* pos, const int32_t* doc, int r0, int r1) {
  TileRange t{pos[r0], pos[r0], doc ? doc[r0] : 0, doc ? doc[r0] : 0};
  for (int r = r0; r < r1; r++) {
    t.pos_lo = std::min(t.pos_lo, pos[r]);
    t.pos_hi = std::max(t.pos_hi, pos[r]);
    if (doc) {
      t.doc_lo = std::min(t.doc_lo, doc[r]);
      t.doc_hi = std::max(t.doc_hi, doc[r]);
    }
  }
  return t;
}

// True when no query of tile q can see a key of tile k: every key comes later, or the two tiles'
// document ranges are disjoint (then no id is shared, whatever the order of the ids).
bool tile_hidden(const TileRange& q, const TileRange& k, bool with_doc) {
  if (k.pos_lo > q.pos_hi) return true;
  return with_doc && (k.doc_hi < q.doc_lo || k.doc_lo > q.doc_hi);
}

inline bool visible(int32_t qp, int32_t kp, const int32_t* qd, const int32_t* kd, int i, int j) {
  return kp <= qp && (!qd || qd[i] == kd[j]);
}

}  // namespace

// Exact: per batch row, some key is visible iff some document has a key no later than its latest query
// (without doc ids: the earliest key no later than the latest query). O(Tq + Tk) per row.
bool attention_block_hidden(const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc,
                            int B, int Tq, int Tk) {
  if (Tq == 0 || Tk == 0) return true;
  if (!q_doc) return *std::min_element(k_pos, k_pos + Tk) > *std::max_element(q_pos, q_pos + Tq);
  std::unordered_map<int32_t, int32_t> latest_query;  // document -> its latest query position
  for (int b = 0; b < B; b++) {
    latest_query.clear();
    const int32_t* qd = q_doc + int64_t(b) * Tq;
    const int32_t* kd = k_doc + int64_t(b) * Tk;
    for (int i = 0; i < Tq; i++) {
      auto [it, fresh] = latest_query.emplace(qd[i], q_pos[i]);
      if (!fresh) it->second = std::max(it->second, q_pos[i]);
    }
    for (int j = 0; j < Tk; j++) {
      auto it = latest_query.find(kd[j]);
      if (it != latest_query.end() && k_pos[j] <= it->second) return false;
    }
  }
  return true;
}

template <class S>
void flash_block_fwd(acc_t<S>* out, acc_t<S>* lse, const S* q, int ldq, const S* k, const S* v, int ldkv,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH) {
  using A = acc_t<S>;
  MT_CHECK(NH > 0 && C % NH == 0, "flash attention: C = %d is not divisible by NH = %d", C, NH);
  MT_CHECK((q_doc == nullptr) == (k_doc == nullptr), "block attention: doc ids for queries and keys, or for neither");
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(A(hs));
  const A neg_inf = A(-INFINITY);
#pragma omp parallel if (parallel_worth(int64_t(B) * NH * Tq * Tk * hs))
  {
    std::vector<A> Q(size_t(kBr) * hs), buf(flash::load_buffer_size<S, A>(size_t(Tk) * hs)), P(size_t(kBr) * kBc),
        O(size_t(kBr) * hs), m(kBr), l(kBr);
    // The pair's K^T per key tile and its V whole, packed when a visible tile first needs them.
    flash::HeadOperand<A> kt(Tk), vn(Tk);
    GemmScratch<A> ws;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const S* qb = q + int64_t(b) * Tq * ldq + h * hs;
      const S* kb = k + int64_t(b) * Tk * ldkv + h * hs;
      const S* vb = v + int64_t(b) * Tk * ldkv + h * hs;
      const int32_t* qd = q_doc ? q_doc + int64_t(b) * Tq : nullptr;
      const int32_t* kd = k_doc ? k_doc + int64_t(b) * Tk : nullptr;
      A* o = out + int64_t(b) * Tq * C + h * hs;
      kt.reset();
      vn.reset();
      for (int i0 = 0; i0 < Tq; i0 += kBr) {
        const int br = std::min(kBr, Tq - i0);
        const TileRange qr = tile_range(q_pos, qd, i0, i0 + br);
        load_rows(Q.data(), qb + int64_t(i0) * ldq, ldq, br, hs);
        std::fill(m.begin(), m.end(), neg_inf);
        std::fill(l.begin(), l.end(), A(0));
        std::fill(O.begin(), O.end(), A(0));
        for (int j0 = 0; j0 < Tk; j0 += kBc) {
          const int bc = std::min(kBc, Tk - j0);
          if (tile_hidden(qr, tile_range(k_pos, kd, j0, j0 + bc), qd != nullptr)) continue;
          gemm_prepacked<A>(false, br, bc, hs, scale, Q.data(), hs, kt.tile_t(kb, ldkv, j0, hs, buf), 0, A(0),
                            P.data(), kBc, ws);
          flash::forward_tile(P.data(), vn.whole(vb, ldkv, Tk, hs, buf), j0, br, bc, hs, m.data(), l.data(), O.data(),
                              ws, [&](int r, int c) {
                                return visible(q_pos[i0 + r], k_pos[j0 + c], qd, kd, i0 + r, j0 + c);
                              });
        }
        for (int r = 0; r < br; r++) {
          A* dst = o + int64_t(i0 + r) * C;
          A* L = lse + int64_t(bh) * Tq + i0 + r;
          if (l[size_t(r)] == A(0)) {  // no visible key in this block
            std::fill(dst, dst + hs, A(0));
            *L = neg_inf;
            continue;
          }
          const A inv = A(1) / l[size_t(r)];
          const A* orow = O.data() + size_t(r) * hs;
          for (int c = 0; c < hs; c++) dst[c] = orow[c] * inv;
          *L = m[size_t(r)] + std::log(l[size_t(r)]);
        }
      }
    }
  }
}

template <class A>
void attention_merge(A* out, A* lse, const A* part_out, const A* part_lse, int B, int T, int C, int NH) {
  const int hs = C / NH;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        A& L = lse[(int64_t(b) * NH + h) * T + t];
        const A L2 = part_lse[(int64_t(b) * NH + h) * T + t];
        if (L2 == A(-INFINITY)) continue;  // the part saw nothing: out and lse unchanged
        A* o = out + (int64_t(b) * T + t) * C + h * hs;
        const A* o2 = part_out + (int64_t(b) * T + t) * C + h * hs;
        if (L == A(-INFINITY)) {
          std::copy(o2, o2 + hs, o);
          L = L2;
          continue;
        }
        const A mx = std::max(L, L2);
        const A e1 = std::exp(L - mx), e2 = std::exp(L2 - mx);
        const A Lnew = mx + std::log(e1 + e2);
        const A w1 = std::exp(L - Lnew), w2 = std::exp(L2 - Lnew);
        for (int c = 0; c < hs; c++) o[c] = w1 * o[c] + w2 * o2[c];
        L = Lnew;
      }
}

template <class S>
void attention_delta(acc_t<S>* delta, const S* dout, const S* out, int B, int T, int C, int NH) {
  using A = acc_t<S>;
  const int hs = C / NH;
  std::vector<A> a(static_cast<size_t>(hs)), o(static_cast<size_t>(hs));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        load_n(a.data(), dout + (int64_t(b) * T + t) * C + h * hs, hs);
        load_n(o.data(), out + (int64_t(b) * T + t) * C + h * hs, hs);
        delta[(int64_t(b) * NH + h) * T + t] = dot_lanes(a.data(), o.data(), hs);
      }
}

template <class S>
void flash_block_bwd(acc_t<S>* dq, acc_t<S>* dk, acc_t<S>* dv, int lddkv, const S* dout, const S* q, int ldq,
                     const S* k, const S* v, int ldkv, const acc_t<S>* lse, const acc_t<S>* delta,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH) {
  using A = acc_t<S>;
  MT_CHECK(NH > 0 && C % NH == 0, "flash attention: C = %d is not divisible by NH = %d", C, NH);
  MT_CHECK((q_doc == nullptr) == (k_doc == nullptr), "block attention: doc ids for queries and keys, or for neither");
  const int hs = C / NH;
  const A scale = A(1) / std::sqrt(A(hs));
#pragma omp parallel if (parallel_worth(int64_t(B) * NH * Tq * Tk * hs))
  {
    // The pair's Q and dO in A, loaded once (when its first visible tile pair needs them): the A
    // operands of every query tile's products and the source of their packed forms.
    std::vector<A> Q(size_t(Tq) * hs), dO(size_t(Tq) * hs), P(size_t(kBr) * kBc), dS(size_t(kBr) * kBc),
        buf(flash::load_buffer_size<S, A>(size_t(std::max(Tq, Tk)) * hs));
    flash::BackwardOperands<A> ops(Tq, Tk);  // each packed once per pair, when first needed
    GemmScratch<A> ws;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const S* qb = q + int64_t(b) * Tq * ldq + h * hs;
      const S* kb = k + int64_t(b) * Tk * ldkv + h * hs;
      const S* vb = v + int64_t(b) * Tk * ldkv + h * hs;
      const S* go = dout + int64_t(b) * Tq * C + h * hs;
      const int32_t* qd = q_doc ? q_doc + int64_t(b) * Tq : nullptr;
      const int32_t* kd = k_doc ? k_doc + int64_t(b) * Tk : nullptr;
      const A* L = lse + int64_t(bh) * Tq;
      const A* D = delta + int64_t(bh) * Tq;
      A* dqb = dq + int64_t(b) * Tq * C + h * hs;
      A* dkb = dk + int64_t(b) * Tk * lddkv + h * hs;
      A* dvb = dv + int64_t(b) * Tk * lddkv + h * hs;
      ops.reset();
      bool loaded = false;
      for (int j0 = 0; j0 < Tk; j0 += kBc) {
        const int bc = std::min(kBc, Tk - j0);
        const TileRange kr = tile_range(k_pos, kd, j0, j0 + bc);
        for (int i0 = 0; i0 < Tq; i0 += kBr) {
          const int br = std::min(kBr, Tq - i0);
          if (tile_hidden(tile_range(q_pos, qd, i0, i0 + br), kr, qd != nullptr)) continue;
          if (!loaded) {
            load_rows(Q.data(), qb, ldq, Tq, hs);
            load_rows(dO.data(), go, C, Tq, hs);
            loaded = true;
          }
          gemm_prepacked<A>(false, br, bc, hs, scale, Q.data() + size_t(i0) * hs, hs,
                            ops.kt.tile_t(kb, ldkv, j0, hs, buf), 0, A(0), P.data(), kBc, ws);
          // A query that sees no key anywhere has lse -inf and no gradient.
          flash::backward_tile(P.data(), dS.data(), dO.data() + size_t(i0) * hs, i0, j0,
                               ops.vt.tile_t(vb, ldkv, j0, hs, buf), ops.k.whole(kb, ldkv, Tk, hs, buf),
                               ops.q.whole(Q.data(), hs, Tq, hs, buf), ops.dout.whole(dO.data(), hs, Tq, hs, buf),
                               L + i0, D + i0, br, bc, hs, scale,
                               dqb + int64_t(i0) * C, C, dkb + int64_t(j0) * lddkv, dvb + int64_t(j0) * lddkv, lddkv,
                               ws, [&](int r, int c) {
                                 return visible(q_pos[i0 + r], k_pos[j0 + c], qd, kd, i0 + r, j0 + c) &&
                                        L[i0 + r] != A(-INFINITY);
                               });
        }
      }
    }
  }
}

template <class T>
void copy_columns(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) std::copy_n(src + r * ld_src, cols, dst + r * ld_dst);
}

#define MT_FLASH_BLOCK_INSTANTIATE(S)                                                                          \
  template void flash_block_fwd<S>(acc_t<S>*, acc_t<S>*, const S*, int, const S*, const S*, int, const int32_t*, \
                                   const int32_t*, const int32_t*, const int32_t*, int, int, int, int, int);     \
  template void flash_block_bwd<S>(acc_t<S>*, acc_t<S>*, acc_t<S>*, int, const S*, const S*, int, const S*,      \
                                   const S*, int, const acc_t<S>*, const acc_t<S>*, const int32_t*,              \
                                   const int32_t*, const int32_t*, const int32_t*, int, int, int, int, int);     \
  template void attention_delta<S>(acc_t<S>*, const S*, const S*, int, int, int, int);                         \
  template void copy_columns<S>(S*, int64_t, const S*, int64_t, int64_t, int64_t);
MT_FLASH_BLOCK_INSTANTIATE(float)
MT_FLASH_BLOCK_INSTANTIATE(double)
MT_FLASH_BLOCK_INSTANTIATE(bf16)
MT_FLASH_BLOCK_INSTANTIATE(f16)
#undef MT_FLASH_BLOCK_INSTANTIATE
template void attention_merge<float>(float*, float*, const float*, const float*, int, int, int, int);
template void attention_merge<double>(double*, double*, const double*, const double*, int, int, int, int);

}  // namespace mt::cpu
