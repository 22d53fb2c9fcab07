// LayerNorm (Ba, Kiros & Hinton 2016) over the last dimension, eps = 1e-5:
//   y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + eps),   var the biased variance.
// Backward, with n = (x - mean) * rstd and g = dy * w (per row, averages over the C channels):
//   dx = rstd * (g - mean(g) - n * mean(g * n)),   dw += sum_rows dy * n,   db += sum_rows dy.
// Statistics, dw and db are in A = acc_t<S>; y and dx are rounded to S once, on store.
//
// The parameter gradients are sums over rows. Rows are grouped in fixed blocks of kRowBlock; each
// block's partial sums go to its own slot and the slots are added in block order, so the result is
// the same for any number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
constexpr double kEps = 1e-5;
constexpr int kRowBlock = 32;

// One row: y = layernorm(x). x holds the row in A (the caller's buffer for float/double, a loaded
// copy otherwise); yc is A scratch of C values for the centred row, which for float/double is the
// output row itself (in place, as this kernel always worked).
template <class S>
void layernorm_row(S* y, acc_t<S>* yc, acc_t<S>& mean, acc_t<S>& rstd, const acc_t<S>* x, const S* weight,
                   const S* bias, int C) {
  using A = acc_t<S>;
  const A m = sum_lanes(x, C) / A(C);
  // Two passes (centre, then square) rather than E[x^2] - m^2, which cancels badly when |m| >> std.
  for (int c = 0; c < C; c++) yc[c] = x[c] - m;
  const A var = dot_lanes(yc, yc, C) / A(C);
  const A s = A(1) / std::sqrt(var + A(kEps));
  if (bias) {
    for (int c = 0; c < C; c++) y[c] = store_as<S>(yc[c] * s * load(weight[c]) + load(bias[c]));
  } else {
    for (int c = 0; c < C; c++) y[c] = store_as<S>(yc[c] * s * load(weight[c]));
  }
  mean = m;
  rstd = s;
}

// The A scratch a row needs: none for float/double (the output row is used), C values otherwise.
template <class S>
size_t row_scratch(int C) {
  return kWide<S> ? 0 : size_t(C);
}

}  // namespace

template <class S>
void layernorm_fwd(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, const S* weight, const S* bias, int N,
                   int C) {
  using A = acc_t<S>;
#pragma omp parallel if (parallel_worth(int64_t(N) * C))
  {
    std::vector<A> xbuf(row_scratch<S>(C)), ybuf(row_scratch<S>(C));
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      S* y = out + int64_t(i) * C;
      const A* x = loaded(inp + int64_t(i) * C, xbuf.data(), C);
      A* yc;
      if constexpr (kWide<S>) {
        yc = y;
      } else {
        yc = ybuf.data();
      }
      layernorm_row(y, yc, mean[i], rstd[i], x, weight, bias, C);
    }
  }
}

// Per row: res = round(a + b) is written first, then the LayerNorm reads the row back as stored,
// so the result is bitwise that of add followed by layernorm_fwd (which reads res from memory).
template <class S>
void residual_layernorm_fwd(S* res, S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* a, const S* b,
                            const S* weight, const S* bias, int N, int C) {
  using A = acc_t<S>;
#pragma omp parallel if (parallel_worth(int64_t(N) * C))
  {
    std::vector<A> xbuf(row_scratch<S>(C)), ybuf(row_scratch<S>(C));
#pragma omp for schedule(static)
    for (int i = 0; i < N; i++) {
      const int64_t off = int64_t(i) * C;
      S* r = res + off;
      S* y = out + off;
      // Elementwise, read before written: res may alias a or b.
      for (int c = 0; c < C; c++) r[c] = store_as<S>(load(a[off + c]) + load(b[off + c]));
      const A* x = loaded(static_cast<const S*>(r), xbuf.data(), C);
      A* yc;
      if constexpr (kWide<S>) {
        yc = y;
      } else {
        yc = ybuf.data();
      }
      layernorm_row(y, yc, mean[i], rstd[i], x, weight, bias, C);
    }
  }
}

template <class S>
void layernorm_bwd(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                   const acc_t<S>* mean, const acc_t<S>* rstd, int N, int C, bool accumulate) {
  using A = acc_t<S>;
  const int blocks = (N + kRowBlock - 1) / kRowBlock;
  // partial[b] holds block b's dw (C values) then db (C values).
  std::vector<A> partial(size_t(blocks) * 2 * size_t(C), A(0));
#pragma omp parallel if (parallel_worth(int64_t(N) * C))
  {
    std::vector<A> nrm(static_cast<size_t>(C)), g(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) {
      A* pdw = partial.data() + size_t(b) * 2 * size_t(C);
      A* pdb = pdw + C;
      for (int i = b * kRowBlock; i < std::min(N, (b + 1) * kRowBlock); i++) {
        const S* x = inp + int64_t(i) * C;
        const S* dy = dout + int64_t(i) * C;
        S* dx = dinp + int64_t(i) * C;
        const A m = mean[i], s = rstd[i];
        for (int c = 0; c < C; c++) {
          nrm[size_t(c)] = (load(x[c]) - m) * s;
          g[size_t(c)] = load(dy[c]) * load(weight[c]);
        }
        const A g_mean = sum_lanes(g.data(), C) / A(C);
        const A gn_mean = dot_lanes(g.data(), nrm.data(), C) / A(C);
        // dy is read before dx is written at each index, so dinp may alias dout. With accumulate,
        // dx = dx + dLN is rounded once: for float/double that is bitwise add(dx, dLN) after an
        // unfused backward.
        if (accumulate) {
          for (int c = 0; c < C; c++) {
            const A d = load(dy[c]), n = nrm[size_t(c)];
            pdw[c] += d * n;
            pdb[c] += d;
            dx[c] = store_as<S>(load(dx[c]) + s * (g[size_t(c)] - g_mean - n * gn_mean));
          }
        } else {
          for (int c = 0; c < C; c++) {
            const A d = load(dy[c]), n = nrm[size_t(c)];
            pdw[c] += d * n;
            pdb[c] += d;
            dx[c] = store_as<S>(s * (g[size_t(c)] - g_mean - n * gn_mean));
          }
        }
      }
    }
    // Column-parallel: each column adds the block partials in block order.
#pragma omp for schedule(static)
    for (int c = 0; c < C; c++) {
      A sw = A(0), sb = A(0);
      for (int b = 0; b < blocks; b++) {
        sw += partial[size_t(b) * 2 * size_t(C) + size_t(c)];
        sb += partial[size_t(b) * 2 * size_t(C) + size_t(C) + size_t(c)];
      }
      dweight[c] += sw;
      if (dbias) dbias[c] += sb;
    }
  }
}

#define MT_LAYERNORM_INSTANTIATE(S)                                                                               \
  template void layernorm_fwd<S>(S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, int, int);               \
  template void residual_layernorm_fwd<S>(S*, S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, const S*,   \
                                          int, int);                                                              \
  template void layernorm_bwd<S>(S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, const acc_t<S>*,         \
                                 const acc_t<S>*, int, int, bool);
MT_LAYERNORM_INSTANTIATE(float)
MT_LAYERNORM_INSTANTIATE(double)
MT_LAYERNORM_INSTANTIATE(bf16)
MT_LAYERNORM_INSTANTIATE(f16)
#undef MT_LAYERNORM_INSTANTIATE

}  // namespace mt::cpu
