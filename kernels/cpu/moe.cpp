// The mixture-of-experts ops on the host (kernels/ops.h has their semantics, moe/ the layer they
// build): the router's softmax and top-k, its statistics and backward, the dispatch plan, and the
// permute / unpermute / combine moves with their backwards. These are the reference arithmetic: the
// CUDA kernels (kernels/cuda/moe_kernels.cuh) do the same operations in the same order per token,
// assignment or element, so on the warp emulator they agree bit for bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/moe_top_k.h"

namespace mt::cpu {

void moe_route(float* probs, float* lse, double* lse_sq, int32_t* expert, float* gate, const float* logits,
               const float* bias, int N, int E, int K) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; t++) {
    const float* z = logits + int64_t(t) * E;
    float* p = probs + int64_t(t) * E;
    float mx = z[0];
    for (int i = 1; i < E; i++) mx = std::max(mx, z[i]);
    double sum = 0;
    for (int i = 0; i < E; i++) sum += std::exp(double(z[i]) - mx);
    for (int i = 0; i < E; i++) p[i] = float(std::exp(double(z[i]) - mx) / sum);
    const double l = double(mx) + std::log(sum);
    lse[t] = float(l);
    lse_sq[t] = l * l;
    // Top-k by score, best first, ties to the lower index, and the gates (kernels/moe_top_k.h).
    ::mt::ops::choose_top_k(expert + int64_t(t) * K, gate + int64_t(t) * K, p, bias, E, K);
  }
}

void moe_route_stats(double* sums, const float* probs, const double* lse_sq, int N, int E) {
  for (int i = 0; i <= E; i++) sums[i] = 0;
  for (int t = 0; t < N; t++) {
    for (int i = 0; i < E; i++) sums[i] += probs[int64_t(t) * E + i];
    sums[E] += lse_sq[t];
  }
}

void moe_route_bwd(float* dlogits, const float* dgate, const float* probs, const float* lse, const int32_t* expert,
                   const float* gate, const int32_t* load, int N, int E, int K, double aux_weight, double z_weight) {
  if (N == 0) return;
  // dA/dp_{t,i} = E f_i / N with f_i = load_i / (N K); dZ/dz_{t,i} = 2 lse_t p_{t,i} / N.
  std::vector<double> daux(static_cast<size_t>(E));
  for (int i = 0; i < E; i++) daux[size_t(i)] = aux_weight * E * (double(load[i]) / (double(N) * K)) / N;
#pragma omp parallel
  {
    std::vector<double> dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int t = 0; t < N; t++) {
      const float* p = probs + int64_t(t) * E;
      const int32_t* ex = expert + int64_t(t) * K;
      const float* dg = dgate + int64_t(t) * K;
      for (int i = 0; i < E; i++) dp[size_t(i)] = daux[size_t(i)];
      if (K == 1) {
        dp[size_t(ex[0])] += dg[0];
      } else {
        // g_j = p_{e_j} / s with s the sum of the chosen p: dg_j/dp_{e_m} = (delta_jm - g_j) / s.
        double s = 0, dot = 0;
        for (int j = 0; j < K; j++) s += p[ex[j]];
        for (int j = 0; j < K; j++) dot += double(dg[j]) * gate[int64_t(t) * K + j];
        for (int j = 0; j < K; j++) dp[size_t(ex[j])] += (double(dg[j]) - dot) / s;
      }
      // Softmax backward: dz_i = p_i (dp_i - sum_j p_j dp_j), plus the z-loss term.
      double pdp = 0;
      for (int i = 0; i < E; i++) pdp += double(p[i]) * dp[size_t(i)];
      const double zterm = z_weight * 2.0 * lse[t] / N;
      float* dz = dlogits + int64_t(t) * E;
      for (int i = 0; i < E; i++) dz[i] = float(double(p[i]) * (dp[size_t(i)] - pdp + zterm));
    }
  }
}

void moe_plan(int32_t* load, int32_t* offset, int32_t* row_of, int32_t* assignment_of, const int32_t* expert, int N,
              int K, int E, int64_t capacity) {
  const int64_t A = int64_t(N) * K;
  // Counting sort by expert, stable in a: row_of first holds each assignment's position within its
  // expert; the first `capacity` of each expert are kept.
  for (int e = 0; e < E; e++) load[e] = 0;
  for (int64_t a = 0; a < A; a++) row_of[a] = load[expert[a]]++;
  offset[0] = 0;
  for (int e = 0; e < E; e++)
    offset[e + 1] = offset[e] + int32_t(capacity < 0 ? load[e] : std::min<int64_t>(load[e], capacity));
  for (int64_t a = 0; a < A; a++) {
    const int32_t pos = row_of[a];
    if (capacity >= 0 && pos >= capacity) {
      row_of[a] = -1;
      continue;
    }
    row_of[a] = offset[expert[a]] + pos;
    assignment_of[row_of[a]] = int32_t(a);
  }
}

template <class S>
void moe_permute(S* out, const S* x, const int32_t* assignment_of, int64_t M, int K, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; r++) {
    const S* src = x + int64_t(assignment_of[r] / K) * C;
    S* dst = out + r * C;
    for (int c = 0; c < C; c++) dst[c] = src[c];
  }
}

template <class S>
void moe_unpermute(S* out, const S* rows, const int32_t* row_of, int64_t A, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t a = 0; a < A; a++) {
    S* dst = out + a * C;
    const int32_t r = row_of[a];
    for (int c = 0; c < C; c++) dst[c] = r < 0 ? store_as<S>(0) : rows[int64_t(r) * C + c];
  }
}

template <class S>
void moe_permute_bwd(S* dx, const S* drows, const float* extra, const int32_t* row_of, int N, int K, int C) {
#pragma omp parallel
  {
    std::vector<acc_t<S>> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int t = 0; t < N; t++) {
      for (int c = 0; c < C; c++) acc[size_t(c)] = extra ? extra[int64_t(t) * C + c] : 0.f;
      for (int j = 0; j < K; j++) {
        const int32_t r = row_of[int64_t(t) * K + j];
        if (r < 0) continue;
        const S* src = drows + int64_t(r) * C;
        for (int c = 0; c < C; c++) acc[size_t(c)] += load(src[c]);
      }
      S* dst = dx + int64_t(t) * C;
      for (int c = 0; c < C; c++) dst[c] = store_as<S>(acc[size_t(c)]);
    }
  }
}

template <class S>
void moe_combine(S* y, const S* rows, const float* gate, const S* base, const int32_t* row_of, int N, int K, int C) {
#pragma omp parallel
  {
    std::vector<acc_t<S>> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int t = 0; t < N; t++) {
      for (int c = 0; c < C; c++) acc[size_t(c)] = base ? load(base[int64_t(t) * C + c]) : acc_t<S>(0);
      for (int j = 0; j < K; j++) {
        const int64_t a = int64_t(t) * K + j;
        const int32_t r = row_of[a];
        if (r < 0) continue;
        const acc_t<S> g = gate[a];
        const S* src = rows + int64_t(r) * C;
        for (int c = 0; c < C; c++) acc[size_t(c)] += g * load(src[c]);
      }
      S* dst = y + int64_t(t) * C;
      for (int c = 0; c < C; c++) dst[c] = store_as<S>(acc[size_t(c)]);
    }
  }
}

template <class S>
void moe_combine_bwd(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const int32_t* row_of,
                     int N, int K, int C) {
  const int64_t A = int64_t(N) * K;
#pragma omp parallel for schedule(static)
  for (int64_t a = 0; a < A; a++) {
    const int32_t r = row_of[a];
    if (r < 0) {
      dgate[a] = 0.f;
      continue;
    }
    const S* d = dy + (a / K) * C;
    const S* src = rows + int64_t(r) * C;
    S* dst = drows + int64_t(r) * C;
    const acc_t<S> g = gate[a];
    double dot = 0;
    for (int c = 0; c < C; c++) {
      const acc_t<S> dv = load(d[c]);
      dot += double(dv) * double(load(src[c]));
      dst[c] = store_as<S>(g * dv);
    }
    dgate[a] = float(dot);
  }
}

#define MT_CPU_MOE(S)                                                                                          \
  template void moe_permute<S>(S*, const S*, const int32_t*, int64_t, int, int);                               \
  template void moe_unpermute<S>(S*, const S*, const int32_t*, int64_t, int);                                  \
  template void moe_permute_bwd<S>(S*, const S*, const float*, const int32_t*, int, int, int);                 \
  template void moe_combine<S>(S*, const S*, const float*, const S*, const int32_t*, int, int, int);           \
  template void moe_combine_bwd<S>(S*, float*, const S*, const S*, const float*, const int32_t*, int, int, int);
MT_CPU_MOE(float)
MT_CPU_MOE(double)
MT_CPU_MOE(bf16)
MT_CPU_MOE(f16)
#undef MT_CPU_MOE

}  // namespace mt::cpu
