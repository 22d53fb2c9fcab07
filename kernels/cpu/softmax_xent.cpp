// Fused softmax + cross-entropy over a padded vocabulary (columns V..Vp-1 are padding).
// With m = max_j x_j (max-subtraction keeps exp from overflowing) and Z = sum_j exp(x_j - m):
//   loss = log Z - (x_t - m),   dlogits_j = dloss * (exp(x_j - m) / Z - [j == t]).
// A row whose target is negative is ignored: loss 0 and a zero gradient row.
//
// Per row: the max, then exp(x_j - m) written straight into dlogits (so each exp is computed once),
// then the sum and the scaling. x_t is read before the row is overwritten, which is what allows
// dlogits to alias logits. The loss-only path sums the same stored exps in the same order, so both
// paths give identical losses. Losses are in A; a 16-bit gradient is rounded once, at the end.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/check.h"

namespace mt::cpu {

template <class S>
void softmax_xent(acc_t<S>* losses, S* dlogits, const S* logits, const int32_t* targets, acc_t<S> dloss, int N,
                  int V, int Vp) {
  using A = acc_t<S>;
  MT_CHECK(V > 0 && V <= Vp, "softmax_xent: need 0 < V <= Vp, got V = %d, Vp = %d", V, Vp);
  for (int i = 0; i < N; i++)
    MT_CHECK(targets[i] < V, "softmax_xent: target %d of row %d is outside the vocabulary (V = %d)", targets[i], i, V);
#pragma omp parallel if (parallel_worth(int64_t(N) * V))
  {
    // float/double: the exps go to the gradient row, or (loss only) to this thread's scratch row.
    // bf16/f16: the row is loaded into xbuf and the exps always go to the fp32 scratch row, so that
    // the gradient is rounded once, after its scaling.
    std::vector<A> scratch(dlogits && kWide<S> ? 0 : size_t(V)), xbuf(kWide<S> ? 0 : size_t(V));
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const int t = targets[i];
      if (t < 0) {
        losses[i] = A(0);
        if (dlogits) std::fill(dlogits + int64_t(i) * Vp, dlogits + int64_t(i + 1) * Vp, store_as<S>(A(0)));
        continue;
      }
      const A* x = loaded(logits + int64_t(i) * Vp, xbuf.data(), V);
      const A m = max_lanes(x, V);
      const A xt = x[t];
      A* g;
      if constexpr (kWide<S>) {
        g = dlogits ? dlogits + int64_t(i) * Vp : scratch.data();
      } else {
        g = scratch.data();
      }
      exp_shifted(g, x, m, V);
      const A z = sum_lanes(g, V);
      losses[i] = std::log(z) - (xt - m);
      if (dlogits) {
        S* d = dlogits + int64_t(i) * Vp;
        const A s = dloss / z;
        for (int j = 0; j < V; j++) g[j] *= s;
        g[t] -= dloss;
        if constexpr (!kWide<S>) store_n(d, g, V);
        std::fill(d + V, d + Vp, store_as<S>(A(0)));
      }
    }
  }
}

#define MT_SOFTMAX_XENT_INSTANTIATE(S) \
  template void softmax_xent<S>(acc_t<S>*, S*, const S*, const int32_t*, acc_t<S>, int, int, int);
MT_SOFTMAX_XENT_INSTANTIATE(float)
MT_SOFTMAX_XENT_INSTANTIATE(double)
MT_SOFTMAX_XENT_INSTANTIATE(bf16)
MT_SOFTMAX_XENT_INSTANTIATE(f16)
#undef MT_SOFTMAX_XENT_INSTANTIATE

}  // namespace mt::cpu
