// LayerNorm (Ba, Kiros & Hinton 2016) over the last dimension, eps = 1e-5:
//   y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + eps),   var the biased variance.
// Backward, with n = (x - mean) * rstd and g = dy * w (per row, averages over the C channels):
//   dx = rstd * (g - mean(g) - n * mean(g * n)),   dw += sum_rows dy * n,   db += sum_rows dy.
//
// The parameter gradients are sums over rows. Rows are grouped in fixed blocks of kRowBlock; each
// block's partial sums go to its own slot and the slots are added in block order, so the result is
// the same for any number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
constexpr double kEps = 1e-5;
constexpr int kRowBlock = 32;
}  // namespace

template <class T>
void layernorm_fwd(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C) {
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(N) * C))
  for (int i = 0; i < N; i++) {
    const T* x = inp + int64_t(i) * C;
    T* y = out + int64_t(i) * C;
    const T m = sum_lanes(x, C) / T(C);
    // Two passes (centre, then square) rather than E[x^2] - m^2, which cancels badly when |m| >> std.
    for (int c = 0; c < C; c++) y[c] = x[c] - m;
    const T var = dot_lanes(y, y, C) / T(C);
    const T s = T(1) / std::sqrt(var + T(kEps));
    if (bias) {
      for (int c = 0; c < C; c++) y[c] = y[c] * s * weight[c] + bias[c];
    } else {
      for (int c = 0; c < C; c++) y[c] = y[c] * s * weight[c];
    }
    mean[i] = m;
    rstd[i] = s;
  }
}

template <class T>
void layernorm_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                   const T* rstd, int N, int C) {
  const int blocks = (N + kRowBlock - 1) / kRowBlock;
  // partial[b] holds block b's dw (C values) then db (C values).
  std::vector<T> partial(size_t(blocks) * 2 * size_t(C), T(0));
#pragma omp parallel if (parallel_worth(int64_t(N) * C))
  {
    std::vector<T> nrm(static_cast<size_t>(C)), g(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) {
      T* pdw = partial.data() + size_t(b) * 2 * size_t(C);
      T* pdb = pdw + C;
      for (int i = b * kRowBlock; i < std::min(N, (b + 1) * kRowBlock); i++) {
        const T* x = inp + int64_t(i) * C;
        const T* dy = dout + int64_t(i) * C;
        T* dx = dinp + int64_t(i) * C;
        const T m = mean[i], s = rstd[i];
        for (int c = 0; c < C; c++) {
          nrm[size_t(c)] = (x[c] - m) * s;
          g[size_t(c)] = dy[c] * weight[c];
        }
        const T g_mean = sum_lanes(g.data(), C) / T(C);
        const T gn_mean = dot_lanes(g.data(), nrm.data(), C) / T(C);
        // dy is read before dx is written at each index, so dinp may alias dout.
        for (int c = 0; c < C; c++) {
          const T d = dy[c], n = nrm[size_t(c)];
          pdw[c] += d * n;
          pdb[c] += d;
          dx[c] = s * (g[size_t(c)] - g_mean - n * gn_mean);
        }
      }
    }
    // Column-parallel: each column adds the block partials in block order.
#pragma omp for schedule(static)
    for (int c = 0; c < C; c++) {
      T sw = T(0), sb = T(0);
      for (int b = 0; b < blocks; b++) {
        sw += partial[size_t(b) * 2 * size_t(C) + size_t(c)];
        sb += partial[size_t(b) * 2 * size_t(C) + size_t(C) + size_t(c)];
      }
      dweight[c] += sw;
      if (dbias) dbias[c] += sb;
    }
  }
}

template void layernorm_fwd<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_fwd<double>(double*, double*, double*, const double*, const double*, const double*, int, int);
template void layernorm_bwd<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                   const float*, int, int);
template void layernorm_bwd<double>(double*, double*, double*, const double*, const double*, const double*,
                                    const double*, const double*, int, int);

}  // namespace mt::cpu
