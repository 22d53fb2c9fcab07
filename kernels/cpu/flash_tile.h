// The arithmetic of one tile pair of flash attention, shared by the whole-sequence kernels
// (flash_attention.cpp) and ring attention's block kernels (flash_attention_block.cpp). The two
// differ in which tiles they visit and in which keys a query may see (`sees(r, c)`: query row r of
// the tile, key column c); what happens inside a tile pair is the same, so both call these. The
// products take their B operands packed once per (b, h) pair (HeadOperand), not once per tile pair:
// the GPU's thread blocks each load their own tiles, while the CPU's one thread per pair need not
// load or pack anything twice. gemm_prepacked gives gemm()'s bits for the same operands.
#pragma once
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu::flash {

constexpr int kBr = 64;  // query rows per tile
constexpr int kBc = 64;  // key/value rows per tile

// The values HeadOperand's `buf` needs for a matrix of n values stored in S: none where S is A (the
// matrix is packed in place).
template <class S, class A>
constexpr size_t load_buffer_size(size_t n) {
  return std::is_same_v<S, A> ? 0 : n;
}

// One (b, h) pair's B operand for the tile products, packed when a tile pair first asks for it (a
// block pair may hide most of its tiles) and then reused by every tile pair: the transposes of a
// matrix's tiles of kBc rows (tile_t), or the matrix whole (whole; a tile's rows are then a window of
// it, rows k0.. of gemm_prepacked). The matrix is read from S, through `buf` (rows x cols values)
// where S is not A. reset() before the next pair.
template <class A>
class HeadOperand {
 public:
  explicit HeadOperand(int rows) : rows_(rows), tiles_(size_t((rows + kBc - 1) / kBc)), ready_(tiles_.size()) {}
  void reset() {
    std::fill(ready_.begin(), ready_.end(), char(0));
    whole_ready_ = false;
  }
  // The key tile starting at row j0 of x (row stride ld, cols columns; all of the tile's rows, whatever
  // part of it a product uses), transposed.
  template <class S>
  const PackedB<A>& tile_t(const S* x, int ld, int j0, int cols, std::vector<A>& buf) {
    const size_t t = size_t(j0 / kBc);
    if (!ready_[t]) {
      const int rows = std::min(kBc, rows_ - j0);
      const auto [src, lds] = as_a(x + int64_t(j0) * ld, ld, rows, cols, buf);
      tiles_[t].pack(true, src, lds, cols, rows);
      ready_[t] = 1;
    }
    return tiles_[t];
  }
  // x whole (rows x cols, row stride ld).
  template <class S>
  const PackedB<A>& whole(const S* x, int ld, int rows, int cols, std::vector<A>& buf) {
    if (!whole_ready_) {
      const auto [src, lds] = as_a(x, ld, rows, cols, buf);
      whole_.pack(false, src, lds, rows, cols);
      whole_ready_ = true;
    }
    return whole_;
  }

 private:
  // The rows as A values: in place where S is A, else loaded into buf.
  template <class S>
  static std::pair<const A*, int> as_a(const S* x, int ld, int rows, int cols, std::vector<A>& buf) {
    if constexpr (std::is_same_v<S, A>) {
      (void)rows;
      (void)cols;
      (void)buf;
      return {x, ld};
    } else {
      load_rows(buf.data(), x, ld, rows, cols);
      return {buf.data(), cols};
    }
  }
  int rows_;
  std::vector<PackedB<A>> tiles_;
  std::vector<char> ready_;
  PackedB<A> whole_;
  bool whole_ready_ = false;
};

// Forward, one key tile meeting the query tile. On entry P (br x bc, row stride kBc) holds the scaled
// scores s Q K^T. Row by row the online softmax: hidden scores -inf, the row's running max m and sum
// l rescaled to the new max (a row that has seen no key yet keeps m = -inf, l = 0 and adds nothing),
// P = exp(S - m), then O = corr O + P V with the key tile's rows j0.. of V (whole V packed).
template <class A, class Sees>
void forward_tile(A* P, const PackedB<A>& v, int j0, int br, int bc, int hs, A* m, A* l, A* O, GemmScratch<A>& ws,
                  Sees sees) {
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
  gemm_prepacked<A>(false, br, hs, bc, A(1), P, kBc, v, j0, A(1), O, hs, ws);
}

// The B operands of the backward's products for one (b, h) pair: K^T and V^T by key tile, K, Q and
// dO whole.
template <class A>
struct BackwardOperands {
  HeadOperand<A> kt, vt, k, q, dout;
  BackwardOperands(int Tq, int Tk) : kt(Tk), vt(Tk), k(Tk), q(Tq), dout(Tq) {}
  void reset() {
    for (HeadOperand<A>* o : {&kt, &vt, &k, &q, &dout}) o->reset();
  }
};

// Backward, one (query tile i0, key tile j0) pair. On entry P holds the scaled scores s Q_i K_j^T; L
// and D point at the tile's first query row's log-sum-exp and rowsum(dO * O); dOi is the query tile
// of dO (br x hs). P = exp(S - L) where the key is seen (0 elsewhere), dV += P^T dO,
// dS = P (dO V^T - D), dQ += s dS K, dK += s dS^T Q. The B operands are the pair's packed V^T of key
// tile j0, and K, Q and dO whole (the tile's rows start at j0, i0 and i0); dQ rows have stride ldq, dK
// and dV rows stride ldkv.
template <class A, class Sees>
void backward_tile(A* P, A* dS, const A* dOi, int i0, int j0, const PackedB<A>& vt, const PackedB<A>& k,
                   const PackedB<A>& q, const PackedB<A>& dout, const A* L, const A* D, int br, int bc, int hs,
                   A scale, A* dQ, int ldq, A* dK, A* dV, int ldkv, GemmScratch<A>& ws, Sees sees) {
  for (int r = 0; r < br; r++) {
    A* p = P + size_t(r) * kBc;
    exp_shifted(p, p, L[r], bc);
    for (int c = 0; c < bc; c++)
      if (!sees(r, c)) p[c] = A(0);
  }
  gemm_prepacked<A>(true, bc, hs, br, A(1), P, kBc, dout, i0, A(1), dV, ldkv, ws);
  gemm_prepacked<A>(false, br, bc, hs, A(1), dOi, hs, vt, 0, A(0), dS, kBc, ws);
  for (int r = 0; r < br; r++) {
    const A Di = D[r];
    const A* p = P + size_t(r) * kBc;
    A* g = dS + size_t(r) * kBc;
    for (int c = 0; c < bc; c++) g[c] = p[c] * (g[c] - Di);
  }
  gemm_prepacked<A>(false, br, hs, bc, scale, dS, kBc, k, j0, A(1), dQ, ldq, ws);
  gemm_prepacked<A>(true, bc, hs, br, scale, dS, kBc, q, i0, A(1), dK, ldkv, ws);
}

}  // namespace mt::cpu::flash
