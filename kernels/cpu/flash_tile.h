// The arithmetic of one tile of flash attention, shared by the whole-sequence kernels
// (flash_attention.cpp) and ring attention's block kernels (flash_attention_block.cpp). The two
// differ in which tiles they visit and in which keys a query may see (`sees(r, c)`: query row r of
// the tile, key column c); what happens inside a tile is the same, so both call these.
#pragma once
#include <algorithm>
#include <cmath>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu::flash {

constexpr int kBr = 64;  // query rows per tile
constexpr int kBc = 64;  // key/value rows per tile

// Forward, one key tile meeting the query tile. On entry P (br x bc, row stride kBc) holds the scaled
// scores s Q K^T. Row by row the online softmax: hidden scores -inf, the row's running max m and sum
// l rescaled to the new max (a row that has seen no key yet keeps m = -inf, l = 0 and adds nothing),
// P = exp(S - m), O = corr O; the caller then adds P V to O (forward_tile below, or a product with V
// packed once for all of a head's tiles).
template <class A, class Sees>
void online_softmax_tile(A* P, int br, int bc, int hs, A* m, A* l, A* O, Sees sees) {
  const A neg_inf = A(-INFINITY);
  for (int r = 0; r < br; r++) {
    A* p = P + size_t(r) * kBc;
    A mx = neg_inf;
    bool hidden[kBc];  // -inf scores: exact zeros after the exp
    for (int c = 0; c < bc; c++) {
      if (!sees(r, c)) p[c] = neg_inf;
      hidden[c] = p[c] == neg_inf;
      mx = std::max(mx, p[c]);
    }
    const A m_new = std::max(m[r], mx);
    if (m_new == neg_inf) {  // nothing visible to this row yet
      std::fill(p, p + bc, A(0));
      continue;
    }
    const A corr = m[r] == neg_inf ? A(0) : exp_fast(A(m[r] - m_new));
    // exp over the row in one vectorised call (exp_fast one element at a time is a chain of library
    // calls on builds without FMA), then the hidden keys back to exact zeros.
    exp_shifted(p, p, m_new, bc);
    A rowsum = A(0);
    for (int c = 0; c < bc; c++) {
      if (hidden[c]) p[c] = A(0);
      rowsum += p[c];
    }
    l[r] = corr * l[r] + rowsum;
    m[r] = m_new;
    A* orow = O + size_t(r) * hs;
    for (int c = 0; c < hs; c++) orow[c] *= corr;
  }
}

// The online softmax, then O += P V with the tile V (bc x hs).
template <class A, class Sees>
void forward_tile(A* P, const A* V, int br, int bc, int hs, A* m, A* l, A* O, Sees sees) {
  online_softmax_tile(P, br, bc, hs, m, l, O, sees);
  gemm<A>(false, false, br, hs, bc, A(1), P, kBc, V, hs, A(1), O, hs);
}

// Backward, one (query tile, key tile) pair, in two elementwise steps around the products. On entry P
// holds the scaled scores; L and D point at the tile's first query row's log-sum-exp and rowsum(dO * O).
//   backward_probs:  P = exp(S - L) where the key is seen (0 elsewhere);
//   then the caller's products dV += P^T dO and dS = dO V^T;
//   backward_ds:     dS = P (dS - D);
//   then dQ += s dS K and dK += s dS^T Q.
// backward_tile runs the whole step on tile buffers (Q, dO: br x hs; K, V: bc x hs); dQ rows have
// stride ldq, dK and dV rows stride ldkv.
template <class A, class Sees>
void backward_probs(A* P, const A* L, int br, int bc, Sees sees) {
  for (int r = 0; r < br; r++) {
    A* p = P + size_t(r) * kBc;
    exp_shifted(p, p, L[r], bc);
    for (int c = 0; c < bc; c++)
      if (!sees(r, c)) p[c] = A(0);
  }
}

template <class A>
void backward_ds(const A* P, A* dS, const A* D, int br, int bc) {
  for (int r = 0; r < br; r++) {
    const A Di = D[r];
    const A* p = P + size_t(r) * kBc;
    A* g = dS + size_t(r) * kBc;
    for (int c = 0; c < bc; c++) g[c] = p[c] * (g[c] - Di);
  }
}

template <class A, class Sees>
void backward_tile(A* P, A* dS, const A* Q, const A* dO, const A* K, const A* V, const A* L, const A* D, int br,
                   int bc, int hs, A scale, A* dQ, int ldq, A* dK, A* dV, int ldkv, Sees sees) {
  backward_probs(P, L, br, bc, sees);
  gemm<A>(true, false, bc, hs, br, A(1), P, kBc, dO, hs, A(1), dV, ldkv);
  gemm<A>(false, true, br, bc, hs, A(1), dO, hs, V, hs, A(0), dS, kBc);
  backward_ds(P, dS, D, br, bc);
  gemm<A>(false, false, br, hs, bc, scale, dS, kBc, K, hs, A(1), dQ, ldq);
  gemm<A>(true, false, bc, hs, br, scale, dS, kBc, Q, hs, A(1), dK, ldkv);
}

}  // namespace mt::cpu::flash
