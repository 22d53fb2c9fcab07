// Fused softmax + cross-entropy over a padded vocabulary (columns V..Vp-1 are padding).
// With m = max_j x_j (max-subtraction keeps exp from overflowing) and Z = sum_j exp(x_j - m):
//   loss = log Z - (x_t - m),   dlogits_j = dloss * (exp(x_j - m) / Z - [j == t]).
// A row whose target is negative is ignored: loss 0 and a zero gradient row.
//
// Per row: the max, then exp(x_j - m) written straight into dlogits (so each exp is computed once),
// then the sum and the scaling. x_t is read before the row is overwritten, which is what allows
// dlogits to alias logits. The loss-only path sums the same stored exps in the same order, so both
// paths give identical losses.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"
#include "runtime/check.h"

namespace mt::cpu {

template <class T>
void softmax_xent(T* losses, T* dlogits, const T* logits, const int32_t* targets, T dloss, int N, int V, int Vp) {
  MT_CHECK(V > 0 && V <= Vp, "softmax_xent: need 0 < V <= Vp, got V = %d, Vp = %d", V, Vp);
  for (int i = 0; i < N; i++)
    MT_CHECK(targets[i] < V, "softmax_xent: target %d of row %d is outside the vocabulary (V = %d)", targets[i], i, V);
#pragma omp parallel if (parallel_worth(int64_t(N) * V))
  {
    std::vector<T> scratch(dlogits ? 0 : size_t(V));
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const T* x = logits + int64_t(i) * Vp;
      const int t = targets[i];
      if (t < 0) {
        losses[i] = T(0);
        if (dlogits) std::fill(dlogits + int64_t(i) * Vp, dlogits + int64_t(i + 1) * Vp, T(0));
        continue;
      }
      const T m = max_lanes(x, V);
      const T xt = x[t];
      // The exps go to the gradient row, or (loss only) to this thread's scratch row.
      T* g = dlogits ? dlogits + int64_t(i) * Vp : scratch.data();
      exp_shifted(g, x, m, V);
      const T z = sum_lanes(g, V);
      losses[i] = std::log(z) - (xt - m);
      if (dlogits) {
        const T s = dloss / z;
        for (int j = 0; j < V; j++) g[j] *= s;
        g[t] -= dloss;
        std::fill(g + V, g + Vp, T(0));
      }
    }
  }
}

template void softmax_xent<float>(float*, float*, const float*, const int32_t*, float, int, int, int);
template void softmax_xent<double>(double*, double*, const double*, const int32_t*, double, int, int, int);

}  // namespace mt::cpu
