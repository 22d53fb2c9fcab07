// The vocabulary-parallel ops (kernels/ops.h): an embedding table split by rows, and softmax
// cross-entropy over logits split by columns, as tensor parallelism holds them.
//
// Cross-entropy over P column slices, each rank holding one: every slice reduces its row to three
// numbers (m_r = its max over real columns, s_r = sum exp(x - m_r), and the target's logit if the
// target lies in the slice), the ranks all-gather them, and each rank merges them in rank order as
// log-sum-exp partials: m = max m_r, Z = sum_r s_r exp(m_r - m). Then loss = log Z - (x_t - m) and
// dlogits_j = dloss (exp(x_j - m) / Z - [j == t]) for the slice's own columns. Every rank computes the
// same losses from the same gathered numbers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/check.h"

namespace mt::cpu {

template <class S>
void embedding_fwd(S* out, const int32_t* ids, const S* table, int row0, int rows, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(N) * C))
  for (int64_t n = 0; n < N; n++) {
    const int64_t r = int64_t(ids[n]) - row0;
    S* o = out + n * C;
    if (r < 0 || r >= rows) {
      std::fill(o, o + C, store_as<S>(acc_t<S>(0)));
      continue;
    }
    std::copy(table + r * C, table + (r + 1) * C, o);
  }
}

template <class S>
void embedding_bwd(acc_t<S>* dtable, const S* dout, const int32_t* ids, int row0, int rows, int N, int C) {
  // Each thread owns a strip of channels and walks the rows in order (as encoder_bwd): no races, the
  // same sums whatever the thread count.
  constexpr int kStrip = 64;
  const int strips = (C + kStrip - 1) / kStrip;
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(N) * C))
  for (int cb = 0; cb < strips; cb++) {
    const int c0 = cb * kStrip, c1 = std::min(C, c0 + kStrip);
    for (int64_t n = 0; n < N; n++) {
      const int64_t r = int64_t(ids[n]) - row0;
      if (r < 0 || r >= rows) continue;
      const S* d = dout + n * C;
      acc_t<S>* t = dtable + r * C;
      for (int c = c0; c < c1; c++) t[c] += load(d[c]);
    }
  }
}

// Real columns of the slice [col0, col0 + Vl) of a vocabulary of V real columns.
inline int real_columns(int col0, int V, int Vl) { return std::clamp(V - col0, 0, Vl); }

template <class S>
void xent_slice_stats(acc_t<S>* stats, const S* logits, const int32_t* targets, int col0, int N, int V, int Vl) {
  using A = acc_t<S>;
  const int real = real_columns(col0, V, Vl);
#pragma omp parallel if (parallel_worth(int64_t(N) * Vl))
  {
    std::vector<A> xbuf(kWide<S> ? 0 : size_t(real)), e(static_cast<size_t>(real));
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      A* st = stats + int64_t(i) * 3;
      const int t = targets[i];
      if (real == 0 || t < 0) {
        st[0] = -std::numeric_limits<A>::infinity();
        st[1] = st[2] = A(0);
        continue;
      }
      const A* x = loaded(logits + int64_t(i) * Vl, xbuf.data(), real);
      const A m = max_lanes(x, real);
      exp_shifted(e.data(), x, m, real);
      st[0] = m;
      st[1] = sum_lanes(e.data(), real);
      st[2] = t >= col0 && t < col0 + real ? x[t - col0] : A(0);
    }
  }
}

template <class S>
void xent_slice_finish(acc_t<S>* losses, S* dlogits, const S* logits, const acc_t<S>* stats, int P,
                       const int32_t* targets, acc_t<S> dloss, int col0, int N, int V, int Vl) {
  using A = acc_t<S>;
  const int real = real_columns(col0, V, Vl);
  for (int i = 0; i < N; i++)
    MT_CHECK(targets[i] < V, "xent_slice_finish: target %d of row %d is outside the vocabulary (V = %d)", targets[i],
             i, V);
#pragma omp parallel if (parallel_worth(int64_t(N) * Vl))
  {
    std::vector<A> xbuf(kWide<S> ? 0 : size_t(real)), g(static_cast<size_t>(real));
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const int t = targets[i];
      S* d = dlogits ? dlogits + int64_t(i) * Vl : nullptr;
      if (t < 0) {
        losses[i] = A(0);
        if (d) std::fill(d, d + Vl, store_as<S>(A(0)));
        continue;
      }
      // Merge the slices' partials in rank order.
      A m = -std::numeric_limits<A>::infinity(), xt = A(0);
      for (int r = 0; r < P; r++) m = std::max(m, stats[(int64_t(r) * N + i) * 3]);
      A z = A(0);
      for (int r = 0; r < P; r++) {
        const A* st = stats + (int64_t(r) * N + i) * 3;
        if (st[1] > A(0)) z += st[1] * std::exp(st[0] - m);
        xt += st[2];
      }
      losses[i] = std::log(z) - (xt - m);
      if (!d) continue;
      const A* x = loaded(logits + int64_t(i) * Vl, xbuf.data(), real);
      exp_shifted(g.data(), x, m, real);
      const A s = dloss / z;
      for (int j = 0; j < real; j++) g[size_t(j)] *= s;
      if (t >= col0 && t < col0 + real) g[size_t(t - col0)] -= dloss;
      store_n(d, g.data(), real);
      std::fill(d + real, d + Vl, store_as<S>(A(0)));
    }
  }
}

#define MT_VOCAB_PARALLEL_INSTANTIATE(S)                                                                       \
  template void embedding_fwd<S>(S*, const int32_t*, const S*, int, int, int, int);                           \
  template void embedding_bwd<S>(acc_t<S>*, const S*, const int32_t*, int, int, int, int);                    \
  template void xent_slice_stats<S>(acc_t<S>*, const S*, const int32_t*, int, int, int, int);                 \
  template void xent_slice_finish<S>(acc_t<S>*, S*, const S*, const acc_t<S>*, int, const int32_t*, acc_t<S>, \
                                     int, int, int, int);
MT_VOCAB_PARALLEL_INSTANTIATE(float)
MT_VOCAB_PARALLEL_INSTANTIATE(double)
MT_VOCAB_PARALLEL_INSTANTIATE(bf16)
MT_VOCAB_PARALLEL_INSTANTIATE(f16)
#undef MT_VOCAB_PARALLEL_INSTANTIATE

}  // namespace mt::cpu
